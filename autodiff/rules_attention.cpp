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
using Composite = std::function<std::vector<Array>(const std::vector<Array>&, const attention::Options&)>;
JvpRule composite_jvp(Composite f) {
  return [f = std::move(f)](Args p, Args t, const Params& params) {
    attention::Options o = attention::options_of(params);
    auto [outs, touts] = ad_detail::jvp([&](const std::vector<Array>& x) { return f(x, o); },
                                        std::vector<Array>(p.begin(), p.end()), std::vector<Array>(t.begin(), t.end()));
    return JvpOut{outs, touts};
  };
}

// Every operand's batch dimension moves to 0 (unbatched ones are broadcast) and merges with B;
// outputs split it off again.
BatchOut batch_into_b(const PrimitiveDef& def, Args a, std::span<const int> d, const BatchAxis& axis,
                      const Params& params) {
  std::vector<Array> args;
  for (size_t i = 0; i < a.size(); ++i) {
    Array x = move_bdim(a[i], d[i], 0, axis.size);
    Shape s(x.shape().begin() + 1, x.shape().end());
    s[0] *= axis.size;
    args.push_back(lax::reshape(x, s));
  }
  std::vector<Array> outs = cjax::bind(def, args, params);
  for (Array& y : outs) {
    Shape s = y.shape();
    s[0] /= axis.size;
    s.insert(s.begin(), axis.size);
    y = lax::reshape(y, s);
  }
  return {outs, std::vector<int>(outs.size(), 0)};
}

const bool registered = add_rule_initializer([] {
  define_rules("flash_attention").jvp = forward_jvp;
  define_rules("flash_attention_tangent").transpose = tangent_transpose;
  define_rules("flash_attention_tangent").jvp =
      composite_jvp([](const std::vector<Array>& x, const attention::Options& o) {
        return std::vector<Array>{attention::composite_tangent(x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7], o)};
      });
  define_rules("flash_attention_backward").jvp =
      composite_jvp([](const std::vector<Array>& x, const attention::Options& o) {
        return attention::composite_backward(x[0], x[1], x[2], x[3], x[4], x[5], o);
      });
  for (const PrimitiveDef* def :
       {&prims::flash_attention(), &prims::flash_attention_tangent(), &prims::flash_attention_backward()})
    define_rules(def->name).batch = [def](Args a, std::span<const int> d, const BatchAxis& axis, const Params& p) {
      return batch_into_b(*def, a, d, axis, p);
    };
});

}  // namespace
}  // namespace cjax
