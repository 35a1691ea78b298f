// Fused dot-product attention: three primitives that nn::dot_product_attention binds instead of
// its unfused jaxpr (logits, mask, softmax and two products) when the fused schedule applies
// (docs/design.md, "Fused attention"). Shapes: q [B, T, N, H], k and v [B, S, K, H] with N a
// multiple of K (grouped-query attention); G = N / K query heads share one key/value head.
//
//   flash_attention          (q, k, v)                         -> (o [B,T,N,H], lse [B,N,T] f32)
//   flash_attention_tangent  (q, k, v, o, lse, dq, dk, dv)     -> do     (linear in dq, dk, dv)
//   flash_attention_backward (q, k, v, o, lse, do)             -> (dq, dk, dv)
//   params: scale (double), is_causal (bool: key s is kept for query t when s <= t)
//
// lse[b, n, t] is the log of the softmax's denominator (logsumexp of the scaled, masked logits):
// the backward pass recomputes the probabilities from it instead of storing them. jvp of
// flash_attention emits flash_attention_tangent, whose transpose is flash_attention_backward, so
// grad runs the fused backward kernel and forward-mode works as well.
//
// Two more, made only by jit's pack_attention pass (jit/passes/passes.h), never by user code:
//
//   flash_attention_packed          (x)                 -> (o [B,T,N,H], lse [B,N,T] f32)
//   flash_attention_backward_packed (x, o, lse, do)     -> dx (x's shape)
//   params: scale, is_causal, and the packing: axis, starts and limits (of q, k, v along axis),
//           q_shape [B,T,N,H], kv_shape [B,T,K,H]
//
// where q, k and v are three slices of one value x along `axis` (a fused q/k/v projection's
// result), reshaped: x's axes before `axis` are the B x T rows, so each of q, k and v is a range of
// columns of x's rows. The CPU kernels read those rows in place, and the backward writes dq, dk
// and dv into one dx (its three ranges tile `axis`), instead of three sliced copies before the
// forward and a concatenate of the gradients after the backward. Their impl (other platforms)
// slices x and binds the primitives above.
//
// Every value is computed in f32 (logits, probabilities, sums) and rounded once to the inputs'
// dtype (float16, bfloat16 or float32). The CPU kernels are in backends/cpu/kernels/attention.cpp;
// other platforms run the unfused composite below (the primitives' `impl`).
#pragma once
#include <array>
#include <vector>

#include "core/array/primitive.h"

namespace cjax::prims {
const PrimitiveDef& flash_attention();
const PrimitiveDef& flash_attention_tangent();
const PrimitiveDef& flash_attention_backward();
const PrimitiveDef& flash_attention_packed();
const PrimitiveDef& flash_attention_backward_packed();
}  // namespace cjax::prims

namespace cjax::attention {

struct Options {
  double scale = 1.0;
  bool is_causal = false;
};
Params params_of(const Options& o);
Options options_of(const Params& p);

// Whether the fused primitives take inputs of this dtype (f16, bf16, f32; f64 stays unfused).
bool fused_dtype(DType d);

// Where q, k and v sit in the packed operand x (the packed primitives' params).
struct Packing {
  int64_t axis = 0;
  std::vector<int64_t> starts, limits;  // q, k, v: [starts[i], limits[i]) along axis
  Shape q_shape, kv_shape;              // [B, T, N, H], [B, T, K, H]
  // A row of x: row_width elements; q, k and v start at columns offsets[0..2].
  int64_t row_width(const Shape& x) const;
  int64_t offset(const Shape& x, size_t i) const;
  // 0 (q), 1 (k), 2 (v) in the order of their ranges along `axis` (dx's pieces, concatenated).
  std::array<size_t, 3> axis_order() const;
};
Params packed_params_of(const Options& o, const Packing& k);
Packing packing_of(const Params& p);
// Raises ShapeError unless `k` describes three slices of an x of this shape as the packed
// primitives need them (`tiled`: their ranges also cover `axis` exactly, for the backward).
void check_packing(std::string_view prim, const Shape& x, const Packing& k, bool tiled);
// q, k and v sliced out of x.
std::vector<Array> unpack(const Array& x, const Packing& k);
// The packed primitives written out: q, k and v sliced from x, the primitives above (the packed
// ones' impl, and their JVPs).
std::vector<Array> expand_forward_packed(const Array& x, const Options& o, const Packing& k);
Array expand_backward_packed(const Array& x, const Array& out, const Array& lse, const Array& dout, const Options& o,
                             const Packing& k);

// Binds the primitives.
std::vector<Array> forward(const Array& q, const Array& k, const Array& v, const Options& o);  // {o, lse}
Array tangent(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse, const Array& dq,
              const Array& dk, const Array& dv, const Options& o);
std::vector<Array> backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                            const Array& dout, const Options& o);  // {dq, dk, dv}

std::vector<Array> forward_packed(const Array& x, const Options& o, const Packing& k);  // {o, lse}
Array backward_packed(const Array& x, const Array& out, const Array& lse, const Array& dout, const Options& o,
                      const Packing& k);  // dx

// The same three functions as unfused lax programs (the materialized [B, N, T, S] logits): the
// primitives' implementation on platforms without a fused kernel, their higher-order derivatives,
// and the tests' reference. An undefined dq, dk or dv is a zero tangent.
std::vector<Array> composite_forward(const Array& q, const Array& k, const Array& v, const Options& o);
Array composite_tangent(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                        const Array& dq, const Array& dk, const Array& dv, const Options& o);
std::vector<Array> composite_backward(const Array& q, const Array& k, const Array& v, const Array& out,
                                      const Array& lse, const Array& dout, const Options& o);

}  // namespace cjax::attention
