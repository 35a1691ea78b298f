// JVP, transpose and batching rules of the fused attention primitives (core/lax/attention.h).
//
//  * flash_attention's JVP binds it for the primal outputs and flash_attention_tangent for the
//    output's tangent. lse is a residual that only the attention primitives read, and they never
//    differentiate through it (the composites recompute the probabilities from q and k), so its
//    tangent is left zero.
//  * flash_attention_tangent is linear in its last three operands; its transpose is
//    flash_attention_backward (the fused backward kernel), which is what grad runs.
//  * The tangent and backward primitives' own JVPs (second-order derivatives) differentiate their
//    unfused composites.
//  * Batching folds the vmapped dimension into the leading batch dimension B.
//  * The packed forms (jit's, found only in optimized jaxprs) differentiate as their expansion:
//    q, k and v sliced from x, then the primitives above; batching puts the vmapped dimension in
//    front of x, one more row dimension (B grows by the batch size).
#include "autodiff/rule_helpers.h"
#include "cjax/autodiff.h"
#include "core/lax/attention.h"
#include "core/lax/rule_support.h"

namespace cjax {
namespace {

using Args = std::span<const Array>;

JvpOut forward_jvp(Args p, Args t, const Params& params) {
  attention::Options o = attention::options_of(params);
  std::vector<Array> outs = attention::forward(p[0], p[1], p[2], o);
  if (!any_defined(t)) return JvpOut{outs, {Array(), Array()}};
  std::vector<Array> z;
  for (size_t i = 0; i < 3; ++i) z.push_back(instantiate_zero(t[i], p[i].aval()));
  Array dout = attention::tangent(p[0], p[1], p[2], outs[0], outs[1], z[0], z[1], z[2], o);
  return JvpOut{outs, {dout, Array()}};
}

std::vector<Array> tangent_transpose(Args cts, Args args, const Params& params) {
  std::vector<Array> out(args.size());
  if (!cts[0].defined()) return out;
  std::vector<Array> grads =
      attention::backward(args[0], args[1], args[2], args[3], args[4], cts[0], attention::options_of(params));
  for (size_t i = 0; i < 3; ++i)
    if (is_undefined_primal(args[5 + i])) out[5 + i] = grads[i];
  return out;
}

// The JVP of a primitive through its composite: jvp of the unfused program.
using Composite = std::function<std::vector<Array>(const std::vector<Array>&, const Params&)>;
JvpRule composite_jvp(Composite f) {
  return [f = std::move(f)](Args p, Args t, const Params& params) {
    auto [outs, touts] = ad_detail::jvp([&](const std::vector<Array>& x) { return f(x, params); },
                                        std::vector<Array>(p.begin(), p.end()), std::vector<Array>(t.begin(), t.end()));
    return JvpOut{outs, touts};
  };
}

// [V, B, ...] batched at d -> [V B, ...], and back.
Array fold_into_b(const Array& a, int d, int64_t size) {
  Array x = move_bdim(a, d, 0, size);
  Shape s(x.shape().begin() + 1, x.shape().end());
  s[0] *= size;
  return lax::reshape(x, s);
}
Array split_b(const Array& y, int64_t size) {
  Shape s = y.shape();
  s[0] /= size;
  s.insert(s.begin(), size);
  return lax::reshape(y, s);
}

// Every operand's batch dimension moves to 0 (unbatched ones are broadcast) and merges with B;
// outputs split it off again.
BatchOut batch_into_b(const PrimitiveDef& def, Args a, std::span<const int> d, const BatchAxis& axis,
                      const Params& params) {
  std::vector<Array> args;
  for (size_t i = 0; i < a.size(); ++i) args.push_back(fold_into_b(a[i], d[i], axis.size));
  std::vector<Array> outs = cjax::bind(def, args, params);
  for (Array& y : outs) y = split_b(y, axis.size);
  return {outs, std::vector<int>(outs.size(), 0)};
}

// The packed primitives' operands batched at 0: x's rows gain the batch dimension in front
// (`axis` moves by one), o, lse and do fold it into B; the forward's o and lse are split again
// (the backward's dx has it in front already).
BatchOut packed_batch(const PrimitiveDef& def, Args a, std::span<const int> d, const BatchAxis& axis,
                      const Params& params) {
  attention::Packing k = attention::packing_of(params);
  std::vector<Array> args{move_bdim(a[0], d[0], 0, axis.size)};
  for (size_t i = 1; i < a.size(); ++i) args.push_back(fold_into_b(a[i], d[i], axis.size));
  k.axis += 1;
  k.q_shape[0] *= axis.size;
  k.kv_shape[0] *= axis.size;
  std::vector<Array> outs = cjax::bind(def, args, attention::packed_params_of(attention::options_of(params), k));
  if (outs.size() == 2)
    for (Array& y : outs) y = split_b(y, axis.size);
  return {outs, std::vector<int>(outs.size(), 0)};
}

const bool registered = add_rule_initializer([] {
  define_rules("flash_attention").jvp = forward_jvp;
  define_rules("flash_attention_tangent").transpose = tangent_transpose;
  define_rules("flash_attention_tangent").jvp = composite_jvp([](const std::vector<Array>& x, const Params& p) {
    return std::vector<Array>{
        attention::composite_tangent(x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], attention::options_of(p))};
  });
  define_rules("flash_attention_backward").jvp = composite_jvp([](const std::vector<Array>& x, const Params& p) {
    return attention::composite_backward(x[0], x[1], x[2], x[3], x[4], x[5], attention::options_of(p));
  });
  define_rules("flash_attention_packed").jvp = composite_jvp([](const std::vector<Array>& x, const Params& p) {
    return attention::expand_forward_packed(x[0], attention::options_of(p), attention::packing_of(p));
  });
  define_rules("flash_attention_backward_packed").jvp = composite_jvp([](const std::vector<Array>& x, const Params& p) {
    return std::vector<Array>{
        attention::expand_backward_packed(x[0], x[1], x[2], x[3], attention::options_of(p), attention::packing_of(p))};
  });
  for (const PrimitiveDef* def :
       {&prims::flash_attention(), &prims::flash_attention_tangent(), &prims::flash_attention_backward()})
    define_rules(def->name).batch = [def](Args a, std::span<const int> d, const BatchAxis& axis, const Params& p) {
      return batch_into_b(*def, a, d, axis, p);
    };
  for (const PrimitiveDef* def : {&prims::flash_attention_packed(), &prims::flash_attention_backward_packed()})
    define_rules(def->name).batch = [def](Args a, std::span<const int> d, const BatchAxis& axis, const Params& p) {
      return packed_batch(*def, a, d, axis, p);
    };
});

}  // namespace
}  // namespace cjax
