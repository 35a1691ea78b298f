// Elementwise primitives and their eager CPU kernels, generated from the scalar-op table.
// Operands have equal shapes, or are rank-0 and broadcast (as lax allows); dtypes are equal.
#include "core/lax/elementwise.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "cjax/lax.h"
#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/array/visit_dtype.h"
#include "core/backend/backend.h"
#include "core/lax/scalar_fns.h"

namespace cjax {
namespace {

bool dtype_in_domain(DType d, ScalarDomain dom) {
  return visit_dtype(d, [&](auto tag) { return scalar_domain_accepts<typename decltype(tag)::type>(dom); });
}
std::string_view domain_desc(ScalarDomain d) {
  switch (d) {
    case ScalarDomain::Float:
    case ScalarDomain::Pred: return "floating-point";
    case ScalarDomain::Int: return "integer";
    case ScalarDomain::Num: return "numeric (integer or floating-point)";
    case ScalarDomain::Logic: return "bool or integer";
    default: return "any";
  }
}

// Shape/dtype rule shared by every elementwise primitive: equal dtypes; equal shapes or rank-0.
AbstractValue elementwise_out(std::string_view name, std::span<const Array> in, size_t first = 0) {
  const Array* big = nullptr;
  bool all_weak = true;
  for (size_t i = first; i < in.size(); ++i) {
    const Array& a = in[i];
    if (a.dtype() != in[first].dtype())
      throw DTypeError(
          fmt::format("{} requires arguments to have the same dtypes, got {} and {} "
                      "(use jnp functions for automatic promotion, or astype)",
                      name, dtype_name(in[first].dtype()), dtype_name(a.dtype())));
    all_weak &= a.weak_type();
    if (a.ndim() == 0) continue;
    if (big && big->shape() != a.shape())
      throw ShapeError(
          fmt::format("{} got incompatible shapes for broadcasting: {} and {} "
                      "(lax ops need equal shapes; jnp functions broadcast)",
                      name, shape_str(big->shape()), shape_str(a.shape())));
    if (!big) big = &a;
  }
  return AbstractValue{big ? big->shape() : Shape{}, in[first].dtype(), all_weak, {}};
}

template <ScalarOp op, int arity>
PrimitiveDef make_elementwise_def() {
  const ScalarOpInfo& info = scalar_op_info(op);
  PrimitiveDef def;
  def.name = std::string(info.name);
  def.kind = PrimKind::Elementwise;
  def.scalar_op = op;
  def.arity = Arity::exactly(size_t(arity));
  def.abstract_eval = [](std::span<const Array> in, const Params&) -> std::vector<AbstractValue> {
    const ScalarOpInfo& info = scalar_op_info(op);
    AbstractValue out = elementwise_out(info.name, in);
    if (!dtype_in_domain(out.dtype, info.domain))
      throw DTypeError(fmt::format("{} does not accept dtype {}: it needs a {} dtype", info.name, dtype_name(out.dtype),
                                   domain_desc(info.domain)));
    if (info.domain == ScalarDomain::Cmp || info.domain == ScalarDomain::Pred) {
      out.dtype = DType::bool_;
      out.weak_type = false;
    }
    return {out};
  };
  return def;
}

const PrimitiveDef* g_table[] = {
#define CJAX_X(e, n, a, d) &register_primitive(make_elementwise_def<ScalarOp::e, a>()),
    CJAX_SCALAR_OPS(CJAX_X)
#undef CJAX_X
};

// ---- convert_element_type ----
const PrimitiveDef& g_convert = register_primitive([] {
  PrimitiveDef def;
  def.name = "convert_element_type";
  def.kind = PrimKind::Elementwise;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    return {AbstractValue{in[0].shape(), p.get<DType>("new_dtype"), p.get<bool>("weak_type"), {}}};
  };
  return def;
}());

const PrimitiveDef& g_bitcast = register_primitive([] {
  PrimitiveDef def;
  def.name = "bitcast_convert_type";
  def.kind = PrimKind::Elementwise;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    DType to = p.get<DType>("new_dtype");
    if (itemsize(to) != itemsize(in[0].dtype()))
      throw DTypeError(
          fmt::format("bitcast_convert_type from {} to {}: item sizes differ ({} vs {} bytes); "
                      "cjax only bitcasts between types of equal width",
                      dtype_name(in[0].dtype()), dtype_name(to), itemsize(in[0].dtype()), itemsize(to)));
    return {AbstractValue{in[0].shape(), to, false, {}}};
  };
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params&) {
    return std::vector<Array>{make_view(in[0], out_avals[0])};
  };
  return def;
}());

// ---- select_n ----
const PrimitiveDef& g_select_n = register_primitive([] {
  PrimitiveDef def;
  def.name = "select_n";
  def.kind = PrimKind::Elementwise;
  def.arity = Arity::at_least(2);  // a predicate and at least one case
  def.abstract_eval = [](std::span<const Array> in, const Params&) -> std::vector<AbstractValue> {
    const Array& which = in[0];
    if (which.dtype() != DType::bool_ && which.dtype() != DType::int32)
      throw DTypeError(fmt::format("select_n predicate must be bool or int32, got {}", dtype_name(which.dtype())));
    if (which.dtype() == DType::bool_ && in.size() > 3)
      throw ValueError("select_n with a bool predicate takes at most two cases");
    AbstractValue out = elementwise_out("select_n", in, 1);
    for (size_t i = 1; i < in.size(); ++i)
      if (in[i].ndim() == 0 && out.ndim() != 0)
        throw ShapeError(fmt::format("select_n cases must all have shape {}, got a scalar case; broadcast it first",
                                     shape_str(out.shape)));
    if (which.ndim() != 0 && which.shape() != out.shape)
      throw ShapeError(fmt::format("select_n predicate shape {} must be scalar or equal to the case shape {}",
                                   shape_str(which.shape()), shape_str(out.shape)));
    return {out};
  };
  return def;
}());

// ---- integer_pow ----
const PrimitiveDef& g_integer_pow = register_primitive([] {
  PrimitiveDef def;
  def.name = "integer_pow";
  def.kind = PrimKind::Elementwise;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    DType d = in[0].dtype();
    if (d == DType::bool_) throw DTypeError("integer_pow does not accept bool; cast to an integer or float first");
    if (is_integer(d) && p.i("y") < 0)
      throw ValueError(
          fmt::format("integer_pow of an {} array with negative exponent {}: integers have no "
                      "reciprocal; cast to float first",
                      dtype_name(d), p.i("y")));
    return {AbstractValue{in[0].shape(), d, in[0].weak_type(), {}}};
  };
  return def;
}());

// ---- threefry2x32 (docs/prng.md §1): Random123 Threefry-2x32 with 20 rounds ----
const PrimitiveDef& g_threefry = register_primitive([] {
  PrimitiveDef def;
  def.name = "threefry2x32";
  def.kind = PrimKind::Elementwise;
  def.arity = Arity::exactly(4);  // k0, k1, x0, x1
  def.abstract_eval = [](std::span<const Array> in, const Params&) -> std::vector<AbstractValue> {
    for (auto& a : in)
      if (a.dtype() != DType::uint32)
        throw DTypeError(fmt::format("threefry2x32 operands must be uint32, got {}", dtype_name(a.dtype())));
    AbstractValue out = elementwise_out("threefry2x32", in);
    out.weak_type = false;
    return {out, out};
  };
  return def;
}());

}  // namespace

namespace prims {
const PrimitiveDef& elementwise(ScalarOp op) { return *g_table[size_t(op)]; }
const PrimitiveDef& convert_element_type() { return g_convert; }
const PrimitiveDef& bitcast_convert_type() { return g_bitcast; }
const PrimitiveDef& select_n() { return g_select_n; }
const PrimitiveDef& integer_pow() { return g_integer_pow; }
const PrimitiveDef& threefry2x32() { return g_threefry; }
}  // namespace prims

Array convert_concrete(const Array& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  AbstractValue aval{x.shape(), dtype, false, {}};
  Params params{{"new_dtype", dtype}, {"weak_type", false}};
  const PrimitiveKernel& kernel = implementation_for(g_convert, concrete(x)->device().platform());
  return kernel(std::span<const Array>(&x, 1), std::span<const AbstractValue>(&aval, 1), params)[0];
}

// ---- lax wrappers ----
namespace lax {
#define CJAX_LAX_UNARY(fn, E) \
  Array fn(const Array& x) { return bind1(prims::elementwise(ScalarOp::E), {x}); }
#define CJAX_LAX_BINARY(fn, E) \
  Array fn(const Array& x, const Array& y) { return bind1(prims::elementwise(ScalarOp::E), {x, y}); }
CJAX_LAX_UNARY(neg, Neg)
CJAX_LAX_UNARY(sign, Sign)
CJAX_LAX_UNARY(abs, Abs)
CJAX_LAX_UNARY(floor, Floor)
CJAX_LAX_UNARY(ceil, Ceil)
CJAX_LAX_UNARY(round, Round)
CJAX_LAX_UNARY(is_finite, IsFinite)
CJAX_LAX_UNARY(exp, Exp)
CJAX_LAX_UNARY(exp2, Exp2)
CJAX_LAX_UNARY(log, Log)
CJAX_LAX_UNARY(log1p, Log1p)
CJAX_LAX_UNARY(expm1, Expm1)
CJAX_LAX_UNARY(tanh, Tanh)
CJAX_LAX_UNARY(logistic, Logistic)
CJAX_LAX_UNARY(sin, Sin)
CJAX_LAX_UNARY(cos, Cos)
CJAX_LAX_UNARY(tan, Tan)
CJAX_LAX_UNARY(asin, Asin)
CJAX_LAX_UNARY(acos, Acos)
CJAX_LAX_UNARY(atan, Atan)
CJAX_LAX_UNARY(sinh, Sinh)
CJAX_LAX_UNARY(cosh, Cosh)
CJAX_LAX_UNARY(asinh, Asinh)
CJAX_LAX_UNARY(acosh, Acosh)
CJAX_LAX_UNARY(atanh, Atanh)
CJAX_LAX_UNARY(sqrt, Sqrt)
CJAX_LAX_UNARY(rsqrt, Rsqrt)
CJAX_LAX_UNARY(cbrt, Cbrt)
CJAX_LAX_UNARY(erf, Erf)
CJAX_LAX_UNARY(erfc, Erfc)
CJAX_LAX_UNARY(erf_inv, ErfInv)
CJAX_LAX_UNARY(lgamma, Lgamma)
CJAX_LAX_UNARY(bitwise_not, Not)
CJAX_LAX_UNARY(square, Square)
CJAX_LAX_BINARY(add, Add)
CJAX_LAX_BINARY(sub, Sub)
CJAX_LAX_BINARY(mul, Mul)
CJAX_LAX_BINARY(div, Div)
CJAX_LAX_BINARY(rem, Rem)
CJAX_LAX_BINARY(pow, Pow)
CJAX_LAX_BINARY(max, Max)
CJAX_LAX_BINARY(min, Min)
CJAX_LAX_BINARY(atan2, Atan2)
CJAX_LAX_BINARY(nextafter, Nextafter)
CJAX_LAX_BINARY(bitwise_and, And)
CJAX_LAX_BINARY(bitwise_or, Or)
CJAX_LAX_BINARY(bitwise_xor, Xor)
CJAX_LAX_BINARY(shift_left, ShiftLeft)
CJAX_LAX_BINARY(shift_right_logical, ShiftRightLogical)
CJAX_LAX_BINARY(shift_right_arithmetic, ShiftRightArithmetic)
CJAX_LAX_BINARY(eq, Eq)
CJAX_LAX_BINARY(ne, Ne)
CJAX_LAX_BINARY(lt, Lt)
CJAX_LAX_BINARY(le, Le)
CJAX_LAX_BINARY(gt, Gt)
CJAX_LAX_BINARY(ge, Ge)
#undef CJAX_LAX_UNARY
#undef CJAX_LAX_BINARY

Array clamp(const Array& lo, const Array& x, const Array& hi) {
  return bind1(prims::elementwise(ScalarOp::Clamp), {lo, x, hi});
}
Array integer_pow(const Array& x, int y) { return bind1(prims::integer_pow(), {x}, Params{{"y", int64_t(y)}}); }
// The lax entries that put a DType into a primitive's params validate it (DTypeError "invalid dtype
// value N" from core/array/dtype.cpp) before a tracer could carry it into a jaxpr.
Array convert_element_type(const Array& x, DType d) {
  (void)itemsize(d);  // validates
  if (x.dtype() == d && !x.weak_type()) return x;
  return bind1(prims::convert_element_type(), {x}, Params{{"new_dtype", d}, {"weak_type", false}});
}
Array bitcast_convert_type(const Array& x, DType d) {
  (void)itemsize(d);  // validates
  return bind1(prims::bitcast_convert_type(), {x}, Params{{"new_dtype", d}});
}
Array select_n(const Array& which, const std::vector<Array>& cases) {
  std::vector<Array> in;
  in.reserve(cases.size() + 1);
  in.push_back(which);
  in.insert(in.end(), cases.begin(), cases.end());
  return bind1(prims::select_n(), in);
}
Array select(const Array& pred, const Array& on_true, const Array& on_false) {
  return select_n(pred, {on_false, on_true});
}
std::pair<Array, Array> threefry2x32(const Array& k0, const Array& k1, const Array& x0, const Array& x1) {
  auto outs = bind(prims::threefry2x32(), {k0, k1, x0, x1});
  return {outs[0], outs[1]};
}
}  // namespace lax

}  // namespace cjax

namespace cjax {
namespace {
// stop_gradient: the identity on values; its JVP rule (autodiff/) gives a zero tangent.
const PrimitiveDef& g_stop_gradient = register_primitive([] {
  PrimitiveDef def;
  def.name = "stop_gradient";
  def.kind = PrimKind::Elementwise;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params&) -> std::vector<AbstractValue> {
    return {in[0].aval()};
  };
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue>, const Params&) {
    return std::vector<Array>{in[0]};
  };
  return def;
}());
}  // namespace
namespace prims {
const PrimitiveDef& stop_gradient() { return g_stop_gradient; }
}  // namespace prims
namespace lax {
// As JAX: only floating values are bound (integers have no gradient to stop).
Array stop_gradient(const Array& x) {
  if (!is_floating(x.dtype())) return x;
  return bind1(g_stop_gradient, {x});
}
}  // namespace lax
}  // namespace cjax
