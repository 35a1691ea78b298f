#include "autodiff/rule_helpers.h"

#include <fmt/format.h>

#include <numeric>

#include "core/lax/rule_support.h"

namespace cjax::rule_helpers {

Array broadcast_to_aval(const Array& t, const AbstractValue& aval) {
  if (t.shape() == aval.shape) return t;
  if (t.ndim() != 0)
    throw Error(fmt::format("internal: cannot broadcast tangent {} to {}", t.aval().str(), aval.str()));
  return lax::broadcast_in_dim(t, aval.shape, {});
}

Array unbroadcast(const Array& ct, const AbstractValue& aval) {
  Array out = ct;
  if (ct.shape() != aval.shape) {
    if (!aval.shape.empty())
      throw Error(fmt::format("internal: cannot unbroadcast cotangent {} to {}", ct.aval().str(), aval.str()));
    std::vector<int64_t> axes(size_t(ct.ndim()));
    std::iota(axes.begin(), axes.end(), 0);
    out = lax::reduce_sum(ct, axes);
  }
  if (out.dtype() != aval.dtype) out = lax::convert_element_type(out, aval.dtype);
  return out;
}

void def_unary_jvp(std::string_view name, UnaryDeriv deriv) {
  const PrimitiveDef* def = find_primitive(name);
  if (!def) throw Error(fmt::format("internal: rules for unknown primitive '{}'", name));
  define_rules(name).jvp = [def, deriv = std::move(deriv)](std::span<const Array> p, std::span<const Array> t,
                                                           const Params& params) {
    Array out = bind1(*def, p, params);
    return JvpOut{{out}, {t[0].defined() ? deriv(p[0], t[0], out) : Array()}};
  };
}

BatchOut batch_elementwise(const PrimitiveDef& def, std::span<const Array> args, std::span<const int> bdims,
                           const BatchAxis& axis, const Params& params) {
  // The unbatched output rank is the largest unbatched operand rank.
  int rank = 0;
  Shape shape;
  for (size_t i = 0; i < args.size(); ++i) {
    int r = args[i].ndim() - (bdims[i] == kNotMapped ? 0 : 1);
    if (r > rank) {
      rank = r;
      shape = args[i].shape();
      if (bdims[i] != kNotMapped) shape.erase(shape.begin() + bdims[i]);
    }
  }
  Shape full = shape;
  full.insert(full.begin(), axis.size);
  std::vector<int64_t> all(size_t(rank) + 1);
  std::iota(all.begin(), all.end(), 0);
  std::vector<Array> moved;
  for (size_t i = 0; i < args.size(); ++i) {
    const Array& x = args[i];
    if (bdims[i] == kNotMapped) {
      moved.push_back(x.ndim() == 0 ? x : move_bdim(x, kNotMapped, 0, axis.size));
    } else {
      Array m = move_bdim(x, bdims[i], 0, axis.size);
      if (m.ndim() == 1 && rank > 0) m = lax::broadcast_in_dim(m, full, {0});
      moved.push_back(m);
    }
  }
  std::vector<Array> outs = cjax::bind(def, moved, params);
  std::vector<int> out_bdims(outs.size(), 0);
  return BatchOut{std::move(outs), std::move(out_bdims)};
}

}  // namespace cjax::rule_helpers
