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
// Every value is computed in f32 (logits, probabilities, sums) and rounded once to the inputs'
// dtype (float16, bfloat16 or float32). The CPU kernels are in backends/cpu/kernels/attention.cpp;
// other platforms run the unfused composite below (the primitives' `impl`).
#pragma once
#include <vector>

#include "core/array/primitive.h"

namespace cjax::prims {
const PrimitiveDef& flash_attention();
const PrimitiveDef& flash_attention_tangent();
const PrimitiveDef& flash_attention_backward();
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

// Binds the primitives.
std::vector<Array> forward(const Array& q, const Array& k, const Array& v, const Options& o);  // {o, lse}
Array tangent(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse, const Array& dq,
              const Array& dk, const Array& dv, const Options& o);
std::vector<Array> backward(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                            const Array& dout, const Options& o);  // {dq, dk, dv}

// The same three functions as unfused lax programs (the materialized [B, N, T, S] logits): the
// primitives' implementation on platforms without a fused kernel, their higher-order derivatives,
// and the tests' reference. An undefined dq, dk or dv is a zero tangent.
std::vector<Array> composite_forward(const Array& q, const Array& k, const Array& v, const Options& o);
Array composite_tangent(const Array& q, const Array& k, const Array& v, const Array& out, const Array& lse,
                        const Array& dq, const Array& dk, const Array& dv, const Options& o);
std::vector<Array> composite_backward(const Array& q, const Array& k, const Array& v, const Array& out,
                                      const Array& lse, const Array& dout, const Options& o);

}  // namespace cjax::attention
