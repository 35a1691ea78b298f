#include "core/lax/rule_support.h"

#include <fmt/format.h>

#include "cjax/lax.h"
#include "core/array/array_impl.h"
#include "core/lax/elementwise.h"

namespace cjax {
namespace {

// add_any (JAX's add_jaxvals_p): the sum of two tangents of one type, used to accumulate
// tangents and cotangents; no broadcasting or promotion.
const PrimitiveDef& g_add_any = register_primitive([] {
  PrimitiveDef def;
  def.name = "add_any";
  def.kind = PrimKind::Elementwise;
  def.arity = Arity::exactly(2);
  def.abstract_eval = [](std::span<const Array> in, const Params&) -> std::vector<AbstractValue> {
    if (in[0].shape() != in[1].shape() || in[0].dtype() != in[1].dtype())
      throw Error(fmt::format("internal: add_any of {} and {}", in[0].aval().str(), in[1].aval().str()));
    AbstractValue out = in[0].aval();
    out.weak_type = in[0].aval().weak_type && in[1].aval().weak_type;
    return {out};
  };
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params&) {
    Array sum = bind1(prims::elementwise(ScalarOp::Add), {in[0], in[1]});
    if (sum.aval() == out_avals[0]) return std::vector<Array>{sum};
    return std::vector<Array>{make_view(sum, out_avals[0])};
  };
  return def;
}());

}  // namespace

Array zeros_like_aval(const AbstractValue& aval) {
  Array zero = make_scalar(0.0, aval.dtype, aval.weak_type);
  return lax::broadcast_in_dim(zero, aval.shape, {});
}
Array instantiate_zero(const Array& t, const AbstractValue& aval) { return t.defined() ? t : zeros_like_aval(aval); }

Array add_tangents(const Array& a, const Array& b) {
  if (!a.defined()) return b;
  if (!b.defined()) return a;
  return bind1(g_add_any, {a, b});
}
bool any_defined(std::span<const Array> xs) {
  for (const Array& x : xs)
    if (x.defined()) return true;
  return false;
}

Array move_bdim(const Array& x, int from, int to, int64_t size) {
  if (from == kNotMapped) {
    Shape shape = x.shape();
    shape.insert(shape.begin() + to, size);
    std::vector<int64_t> dims;
    for (int i = 0; i < x.ndim(); ++i) dims.push_back(i < to ? i : i + 1);
    return lax::broadcast_in_dim(x, shape, dims);
  }
  if (from == to) return x;
  std::vector<int64_t> perm;
  for (int i = 0; i < x.ndim(); ++i)
    if (i != from) perm.push_back(i);
  perm.insert(perm.begin() + to, from);
  return lax::transpose(x, perm);
}

AbstractValue batched_aval(const AbstractValue& aval, int bdim, int64_t size) {
  AbstractValue out = aval;
  out.shape.insert(out.shape.begin() + bdim, size);
  return out;
}

namespace {
// add_any's own rules: linear in both operands.
const bool g_add_any_rules = add_rule_initializer([] {
  PrimitiveRules& r = define_rules("add_any");
  r.jvp = [](std::span<const Array> p, std::span<const Array> t, const Params&) {
    return JvpOut{{bind1(g_add_any, {p[0], p[1]})}, {add_tangents(t[0], t[1])}};
  };
  r.transpose = [](std::span<const Array> cts, std::span<const Array> args, const Params&) {
    return std::vector<Array>{is_undefined_primal(args[0]) ? cts[0] : Array(),
                              is_undefined_primal(args[1]) ? cts[0] : Array()};
  };
  r.batch = [](std::span<const Array> a, std::span<const int> d, const BatchAxis& axis, const Params&) {
    return BatchOut{{bind1(g_add_any, {move_bdim(a[0], d[0], 0, axis.size), move_bdim(a[1], d[1], 0, axis.size)})},
                    {0}};
  };
});
}  // namespace

}  // namespace cjax
