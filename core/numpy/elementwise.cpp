// The numpy elementwise layer (jnp.add, jnp.where, ...): numpy broadcasting and JAX type
// promotion on top of the lax elementwise primitives. Each function follows the lax composition
// JAX uses (jax/_src/numpy/ufuncs.py), so eager values, jaxprs and gradients agree with JAX.
//
// Conventions:
//  * promotion: cjax::result_type over (dtype, weak) pairs; "numeric" promotion turns bool into
//    int32, "inexact" promotion turns bool/integers into float32 (JAX's default mode); weak_type
//    is kept as JAX keeps it.
//  * broadcasting: numpy rules; rank-0 operands are not broadcast for lax elementwise ops (lax
//    accepts rank-0 operands of equal dtype, as JAX prints `mul a 2.0:f32[]`).
//  * a concrete weakly typed scalar (a C++ literal) converted to another dtype becomes a literal
//    of that dtype directly (no convert_element_type), as JAX does with Python scalars; an integer
//    literal that does not fit the target integer dtype raises ValueError (JAX's OverflowError).
#include "core/lax/elementwise.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "cjax/lax.h"
#include "cjax/numpy.h"
#include "core/array/array_impl.h"
#include "core/array/util.h"
#include "core/array/visit_dtype.h"

namespace cjax {
namespace {

enum class Promo { Plain, Numeric, Inexact };

// A literal of dtype `d` from an exact host value (int64 or double).
template <class V>
Array literal(V v, DType d, bool weak) {
  Array a = make_uninitialized(AbstractValue{{}, d, weak, {}}, host_device());
  visit_dtype(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (is_half_v<T>)
      *data_ptr<T>(a) = T(float(v));
    else if constexpr (std::is_same_v<T, bool>)
      *data_ptr<T>(a) = v != V(0);
    else
      *data_ptr<T>(a) = T(v);
  });
  return a;
}

bool int_fits(int64_t v, DType d) {
  switch (d) {
    case DType::int8: return v >= INT8_MIN && v <= INT8_MAX;
    case DType::int16: return v >= INT16_MIN && v <= INT16_MAX;
    case DType::int32: return v >= INT32_MIN && v <= INT32_MAX;
    case DType::int64: return true;
    case DType::uint8: return v >= 0 && v <= UINT8_MAX;
    case DType::uint32: return v >= 0 && v <= int64_t(UINT32_MAX);
    default: return true;
  }
}

// The value of a concrete weak integer scalar (a C++ int literal).
std::optional<int64_t> weak_int_literal(const Array& a) {
  const AbstractValue& av = a.aval();
  if (!av.weak_type || !av.shape.empty() || !is_integer(av.dtype)) return std::nullopt;
  if (!concrete(a)) return std::nullopt;
  return a.item<int64_t>();
}

// The scalar type a promotion kind turns `t` into.
TypeInfo adjust(TypeInfo t, Promo k) {
  if (k == Promo::Numeric && t.dtype == DType::bool_) t.dtype = DType::int32;
  if (k == Promo::Inexact && !is_floating(t.dtype)) t.dtype = DType::float32;
  return t;
}

TypeInfo result_of(std::string_view fn, std::span<const TypeInfo> in) {
  try {
    return result_type(in);
  } catch (const DTypeError& e) {
    throw DTypeError(fmt::format("{}: {}", fn, e.what()));
  }
}

// Converts one operand to the promoted type, checking integer literals for overflow.
Array to_type(std::string_view fn, const Array& a, TypeInfo t) {
  const AbstractValue& av = a.aval();
  if (av.dtype == t.dtype && av.weak_type == t.weak) return a;
  if (is_integer(t.dtype))
    if (auto v = weak_int_literal(a); v && !int_fits(*v, t.dtype))
      throw ValueError(
          fmt::format("{}: the integer scalar {} does not fit in {}; cast the array to a wider "
                      "dtype first (astype) or pass a value in range",
                      fn, *v, dtype_name(t.dtype)));
  return convert_to(a, t.dtype, t.weak);
}

Array promote1(std::string_view fn, const Array& x, Promo k) {
  TypeInfo t = adjust(TypeInfo{x.dtype(), x.weak_type()}, k);
  return to_type(fn, x, t);
}

// Promotes two operands (JAX promote_args / promote_args_numeric / promote_args_inexact).
void promote2(std::string_view fn, Array& x, Array& y, Promo k) {
  const AbstractValue &ax = x.aval(), &ay = y.aval();
  TypeInfo t;
  if (ax.dtype == ay.dtype) {
    t = TypeInfo{ax.dtype, ax.weak_type && ay.weak_type};
    // Same dtype: lax gives the right weak_type itself; only a kind change needs a conversion.
    TypeInfo adj = adjust(t, k);
    if (adj.dtype == t.dtype) return;
    t = adj;
  } else {
    TypeInfo in[2] = {{ax.dtype, ax.weak_type}, {ay.dtype, ay.weak_type}};
    t = adjust(result_of(fn, in), k);
  }
  x = to_type(fn, x, t);
  y = to_type(fn, y, t);
}

// numpy broadcast shape of the given shapes; ShapeError naming fn and the shapes.
Shape broadcast_shape_of(std::string_view fn, std::span<const Shape* const> shapes) {
  size_t rank = 0;
  for (auto* s : shapes) rank = std::max(rank, s->size());
  Shape out(rank, 1);
  for (auto* s : shapes) {
    size_t off = rank - s->size();
    for (size_t i = 0; i < s->size(); ++i) {
      int64_t d = (*s)[i];
      int64_t& o = out[off + i];
      if (d == o || d == 1) continue;
      if (o == 1) {
        o = d;
        continue;
      }
      std::string all;
      for (size_t j = 0; j < shapes.size(); ++j) all += (j ? " and " : "") + shape_str(*shapes[j]);
      throw ShapeError(
          fmt::format("{}: operands could not be broadcast together with shapes {}: dimension {} of "
                      "the result would need sizes {} and {} (numpy broadcasting aligns shapes at the "
                      "end and needs equal sizes or 1). Reshape or expand_dims an operand so the "
                      "shapes line up",
                      fn, all, off + i, o, d));
    }
  }
  return out;
}

Array broadcast_to_shape(const Array& a, const Shape& shape) {
  if (a.shape() == shape) return a;
  std::vector<int64_t> dims(a.shape().size());
  int64_t off = int64_t(shape.size() - a.shape().size());
  for (size_t i = 0; i < dims.size(); ++i) dims[i] = off + int64_t(i);
  return lax::broadcast_in_dim(a, shape, dims);
}

// Broadcasts for a lax elementwise op: equal shapes, rank-0 operands left as they are.
void broadcast2(std::string_view fn, Array& x, Array& y) {
  const Shape &sx = x.shape(), &sy = y.shape();
  if (sx == sy || sx.empty() || sy.empty()) return;
  const Shape* shapes[2] = {&sx, &sy};
  Shape out = broadcast_shape_of(fn, shapes);
  x = broadcast_to_shape(x, out);
  y = broadcast_to_shape(y, out);
}

inline bool fast_ok(const Array& x, const Array& y) {
  const AbstractValue &ax = x.aval(), &ay = y.aval();
  return ax.dtype == ay.dtype && (ax.shape == ay.shape || ax.shape.empty() || ay.shape.empty());
}

// Promoted and broadcast operands for a lax binary op.
inline void prep2(std::string_view fn, Array& x, Array& y, Promo k) {
  promote2(fn, x, y, k);
  broadcast2(fn, x, y);
}

// A strong constant of x's dtype (weak if x is weak, so weak results stay weak).
Array cst(double v, const Array& like) { return literal(v, like.dtype(), like.weak_type()); }

// Full-shaped select (select_n needs equal case shapes; a rank-0 predicate is allowed).
Array select_full(const Array& pred, const Array& on_true, const Array& on_false) {
  const Shape* shapes[3] = {&pred.shape(), &on_true.shape(), &on_false.shape()};
  Shape out = broadcast_shape_of("where", shapes);
  Array p = pred.ndim() == 0 ? pred : broadcast_to_shape(pred, out);
  return lax::select_n(p, {broadcast_to_shape(on_false, out), broadcast_to_shape(on_true, out)});
}

[[noreturn]] void bad_dtype(std::string_view fn, DType d, std::string_view needs) {
  throw DTypeError(fmt::format("{} does not accept dtype {}: it needs {}", fn, dtype_name(d), needs));
}
void require_numeric(std::string_view fn, const Array& x) {
  if (x.dtype() == DType::bool_)
    bad_dtype(fn, x.dtype(), "a numeric (integer or floating-point) dtype; cast bools with astype(int32) first");
}
void require_int_or_bool(std::string_view fn, const Array& x) {
  if (is_floating(x.dtype()))
    bad_dtype(fn, x.dtype(), "a bool or integer dtype (bitwise operations are undefined on floating point)");
}
void require_int(std::string_view fn, const Array& x) {
  if (!is_integer(x.dtype())) bad_dtype(fn, x.dtype(), "an integer dtype (shifts are undefined on floating point)");
}

using Unary = Array (*)(const Array&);
using Binary = Array (*)(const Array&, const Array&);

Array inexact_unary(std::string_view fn, const Array& x, Unary f) {
  if (is_floating(x.dtype())) return f(x);
  return f(promote1(fn, x, Promo::Inexact));
}

Array plain_binary(std::string_view fn, const Array& x, const Array& y, Binary f) {
  if (fast_ok(x, y)) return f(x, y);
  Array a = x, b = y;
  prep2(fn, a, b, Promo::Plain);
  return f(a, b);
}

// Returns an all-`v` bool array of x's shape (isnan of integers and the like).
Array bool_like(const Array& x, bool v) { return numpy::full(x.shape(), Array(v), DType::bool_); }

Array to_bool(const Array& x) {
  if (x.dtype() == DType::bool_) return x;
  return lax::ne(x, cst(0, x));
}

// Integer x ** y by binary exponentiation (JAX's _power), x and y of one integer dtype.
Array int_power_loop(Array x, Array y) {
  Array zero = cst(0, y), one = cst(1, y);
  Array acc = select_full(lax::bitwise_and(lax::eq(x, cst(0, x)), lax::ne(y, zero)), cst(0, x), cst(1, x));
  for (int i = 0; i < 6; ++i) {
    acc = select_full(lax::ne(lax::bitwise_and(y, one), zero), lax::mul(acc, x), acc);
    x = lax::mul(x, x);
    y = lax::shift_right_logical(y, one);
  }
  return acc;
}

double finfo_max(DType d) {
  switch (d) {
    case DType::bfloat16: return 3.3895313892515355e38;
    case DType::float16: return 65504.0;
    case DType::float32: return double(std::numeric_limits<float>::max());
    default: return std::numeric_limits<double>::max();
  }
}

}  // namespace

// ---- util.h ----
std::vector<Array> promote_dtypes(std::string_view fn, const std::vector<Array>& args) {
  if (args.size() < 2) return args;
  std::vector<TypeInfo> in;
  in.reserve(args.size());
  bool same = true;
  for (const Array& a : args) {
    in.push_back(TypeInfo{a.dtype(), a.weak_type()});
    same &= in.back() == in.front();
  }
  if (same) return args;
  TypeInfo t = result_of(fn, in);
  std::vector<Array> out;
  out.reserve(args.size());
  for (const Array& a : args) out.push_back(to_type(fn, a, t));
  return out;
}

std::vector<Array> broadcast_all(std::string_view fn, const std::vector<Array>& args) {
  std::vector<const Shape*> shapes;
  shapes.reserve(args.size());
  bool same = true;
  for (const Array& a : args) {
    shapes.push_back(&a.shape());
    same &= *shapes.back() == *shapes.front();
  }
  if (same) return args;
  Shape out = broadcast_shape_of(fn, shapes);
  std::vector<Array> res;
  res.reserve(args.size());
  for (const Array& a : args) res.push_back(broadcast_to_shape(a, out));
  return res;
}

Array convert_to(const Array& x, DType d, bool weak) {
  const AbstractValue& av = x.aval();
  if (av.dtype == d && av.weak_type == weak) return x;
  // A C++ literal (concrete weak scalar) becomes a literal of the target dtype directly.
  if (av.weak_type && av.shape.empty() && av.dtype != d && concrete(x)) {
    if (is_integer(av.dtype)) return literal(x.item<int64_t>(), d, weak);
    if (is_floating(av.dtype) && is_floating(d)) return literal(x.item<double>(), d, weak);
  }
  return bind1(prims::convert_element_type(), {x}, Params{{"new_dtype", d}, {"weak_type", weak}});
}

namespace numpy {

TypeInfo result_type(const std::vector<Array>& arrays) {
  if (arrays.empty()) throw ValueError("result_type: at least one array is required");
  std::vector<TypeInfo> in;
  in.reserve(arrays.size());
  for (const Array& a : arrays) in.push_back(TypeInfo{a.dtype(), a.weak_type()});
  return result_of("result_type", in);
}

// ---- arithmetic ----
Array add(const Array& x, const Array& y) {
  if (fast_ok(x, y) && x.dtype() != DType::bool_) return lax::add(x, y);
  Array a = x, b = y;
  prep2("add", a, b, Promo::Plain);
  return a.dtype() == DType::bool_ ? lax::bitwise_or(a, b) : lax::add(a, b);
}
Array subtract(const Array& x, const Array& y) {
  Array a = x, b = y;
  if (!fast_ok(x, y)) prep2("subtract", a, b, Promo::Plain);
  if (a.dtype() == DType::bool_)
    bad_dtype("subtract", a.dtype(), "a numeric dtype (numpy boolean subtract is not supported; use logical_xor)");
  return lax::sub(a, b);
}
Array multiply(const Array& x, const Array& y) {
  if (fast_ok(x, y) && x.dtype() != DType::bool_) return lax::mul(x, y);
  Array a = x, b = y;
  prep2("multiply", a, b, Promo::Plain);
  return a.dtype() == DType::bool_ ? lax::bitwise_and(a, b) : lax::mul(a, b);
}
Array divide(const Array& x, const Array& y) {
  if (fast_ok(x, y) && is_floating(x.dtype())) return lax::div(x, y);
  Array a = x, b = y;
  prep2("divide", a, b, Promo::Inexact);
  return lax::div(a, b);
}
Array true_divide(const Array& x, const Array& y) { return divide(x, y); }

Array floor_divide(const Array& x, const Array& y) {
  Array a = x, b = y;
  prep2("floor_divide", a, b, Promo::Numeric);
  DType d = a.dtype();
  if (is_unsigned_integer(d)) return lax::div(a, b);
  if (is_integer(d)) {
    Array q = lax::div(a, b);
    Array fix = lax::bitwise_and(lax::ne(lax::sign(a), lax::sign(b)), lax::ne(lax::rem(a, b), cst(0, a)));
    return select_full(fix, lax::sub(q, cst(1, q)), q);
  }
  // Floats: CPython's float_divmod, as JAX's _float_divmod.
  Array mod = lax::rem(a, b);
  Array div = lax::div(select_full(lax::eq(b, cst(0, b)), a, lax::sub(a, mod)), b);  // x // 0.0 = +-inf
  Array ind = lax::bitwise_and(lax::ne(mod, cst(0, mod)), lax::ne(lax::sign(b), lax::sign(mod)));
  div = select_full(ind, lax::sub(div, cst(1, div)), div);
  return lax::round(div);
}

Array remainder(const Array& x, const Array& y) {
  Array a = x, b = y;
  prep2("remainder", a, b, Promo::Numeric);
  if (is_integer(b.dtype())) b = select_full(lax::eq(b, cst(0, b)), cst(1, b), b);  // x % 0 = 0 (JAX)
  Array zero = cst(0, a);
  Array t = lax::rem(a, b);
  Array plus = lax::bitwise_and(lax::ne(lax::lt(t, zero), lax::lt(b, zero)), lax::ne(t, zero));
  return select_full(plus, lax::add(t, b), t);
}
Array mod(const Array& x, const Array& y) { return remainder(x, y); }
Array fmod(const Array& x, const Array& y) {
  Array a = x, b = y;
  prep2("fmod", a, b, Promo::Numeric);
  if (is_integer(b.dtype())) b = select_full(lax::eq(b, cst(0, b)), cst(1, b), b);
  return lax::rem(a, b);
}

Array power(const Array& x, const Array& y) {
  // A concrete integer scalar exponent: exact binary exponentiation with integer_pow (JAX's
  // special case for `x ** 2`); the base's dtype is kept (numeric promotion only).
  const AbstractValue& ay = y.aval();
  if (ay.shape.empty() && (is_integer(ay.dtype) || ay.dtype == DType::bool_) && concrete(y)) {
    int64_t e = y.item<int64_t>();
    Array b = promote1("power", x, Promo::Numeric);
    if (is_integer(b.dtype()) && e < 0)
      throw ValueError(
          fmt::format("power: integers to negative integer powers are not allowed (base dtype {}, "
                      "exponent {}); cast the base to a float dtype first",
                      dtype_name(b.dtype()), e));
    if (e > std::numeric_limits<int>::max() || e < std::numeric_limits<int>::min())
      throw ValueError(fmt::format("power: exponent {} is out of the supported range of integer_pow", e));
    return lax::integer_pow(b, int(e));
  }
  Array a = x, b = y;
  prep2("power", a, b, Promo::Numeric);
  if (is_floating(a.dtype())) return lax::pow(a, b);
  if (auto* c = concrete(b); c && is_signed_integer(b.dtype())) {
    for (int64_t v : b.to_vector<int64_t>())
      if (v < 0)
        throw ValueError(
            fmt::format("power: integers to negative integer powers are not allowed (exponent array "
                        "of dtype {} holds {}); cast the base to a float dtype first",
                        dtype_name(b.dtype()), v));
  }
  return int_power_loop(a, b);
}

Array negative(const Array& x) {
  require_numeric("negative", x);
  return lax::neg(x);
}
Array positive(const Array& x) {
  require_numeric("positive", x);
  return x;
}
Array abs(const Array& x) {
  if (x.dtype() == DType::bool_ || is_unsigned_integer(x.dtype())) return x;
  return lax::abs(x);
}
Array absolute(const Array& x) { return abs(x); }
Array sign(const Array& x) {
  require_numeric("sign", x);
  return lax::sign(x);
}
Array reciprocal(const Array& x) { return lax::integer_pow(promote1("reciprocal", x, Promo::Inexact), -1); }

// ---- transcendental (integers and bools are converted to float32 first) ----
#define CJAX_INEXACT_UNARY(name, laxfn) \
  Array name(const Array& x) { return inexact_unary(#name, x, &lax::laxfn); }
CJAX_INEXACT_UNARY(exp, exp)
CJAX_INEXACT_UNARY(exp2, exp2)
CJAX_INEXACT_UNARY(expm1, expm1)
CJAX_INEXACT_UNARY(log, log)
CJAX_INEXACT_UNARY(log1p, log1p)
CJAX_INEXACT_UNARY(sqrt, sqrt)
CJAX_INEXACT_UNARY(rsqrt, rsqrt)
CJAX_INEXACT_UNARY(cbrt, cbrt)
CJAX_INEXACT_UNARY(sin, sin)
CJAX_INEXACT_UNARY(cos, cos)
CJAX_INEXACT_UNARY(tan, tan)
CJAX_INEXACT_UNARY(arcsin, asin)
CJAX_INEXACT_UNARY(arccos, acos)
CJAX_INEXACT_UNARY(arctan, atan)
CJAX_INEXACT_UNARY(sinh, sinh)
CJAX_INEXACT_UNARY(cosh, cosh)
CJAX_INEXACT_UNARY(tanh, tanh)
CJAX_INEXACT_UNARY(arcsinh, asinh)
CJAX_INEXACT_UNARY(arccosh, acosh)
CJAX_INEXACT_UNARY(arctanh, atanh)
#undef CJAX_INEXACT_UNARY

Array log2(const Array& x) {
  Array f = promote1("log2", x, Promo::Inexact);
  return lax::div(lax::log(f), lax::log(cst(2, f)));
}
Array log10(const Array& x) {
  Array f = promote1("log10", x, Promo::Inexact);
  return lax::div(lax::log(f), lax::log(cst(10, f)));
}
Array square(const Array& x) { return lax::square(promote1("square", x, Promo::Numeric)); }
Array arctan2(const Array& x, const Array& y) {
  Array a = x, b = y;
  prep2("arctan2", a, b, Promo::Inexact);
  return lax::atan2(a, b);
}

// ---- rounding ----
Array floor(const Array& x) { return is_floating(x.dtype()) ? lax::floor(x) : x; }
Array ceil(const Array& x) { return is_floating(x.dtype()) ? lax::ceil(x) : x; }
Array trunc(const Array& x) {
  if (!is_floating(x.dtype())) return x;
  return select_full(lax::lt(x, cst(0, x)), lax::ceil(x), lax::floor(x));
}
Array rint(const Array& x) {
  if (!is_floating(x.dtype())) return lax::convert_element_type(x, DType::float32);
  return lax::round(x);
}
Array round(const Array& x, int decimals) {
  DType d = x.dtype();
  if (d == DType::bool_) return x;
  if (is_integer(d)) {
    if (decimals >= 0) return x;
    // Round half to even at 10^-decimals, in the integer dtype (numpy's result for integers).
    double fd = std::pow(10.0, -decimals);
    double hi =
        visit_dtype(d, [](auto tag) { return double(std::numeric_limits<typename decltype(tag)::type>::max()); });
    if (fd > hi) return zeros_like(x);
    Array f = cst(fd, x);
    Array q = floor_divide(x, f);
    Array r = lax::sub(x, lax::mul(q, f));
    Array rest = lax::sub(f, r);
    Array up = lax::bitwise_or(lax::gt(r, rest),
                               lax::bitwise_and(lax::eq(r, rest), lax::ne(lax::bitwise_and(q, cst(1, q)), cst(0, q))));
    return lax::mul(lax::add(q, lax::convert_element_type(up, d)), f);
  }
  if (decimals == 0) return lax::round(x);
  // Rescale (float16 in float32, as JAX does).
  Array v = d == DType::float16 ? lax::convert_element_type(x, DType::float32) : x;
  Array f = cst(std::pow(10.0, decimals), v);
  Array out = lax::div(lax::round(lax::mul(v, f)), f);
  return d == DType::float16 ? convert_to(out, d, x.weak_type()) : out;
}

Array clip(const Array& x, std::optional<Array> min, std::optional<Array> max) {
  Array out = x;
  if (min) out = maximum(*min, out);
  if (max) out = minimum(*max, out);
  return out;
}

// ---- min / max ----
Array maximum(const Array& x, const Array& y) { return plain_binary("maximum", x, y, &lax::max); }
Array minimum(const Array& x, const Array& y) { return plain_binary("minimum", x, y, &lax::min); }
Array fmax(const Array& x, const Array& y) {
  Array a = x, b = y;
  prep2("fmax", a, b, Promo::Plain);
  return select_full(lax::bitwise_or(lax::lt(a, b), isnan(a)), b, a);
}
Array fmin(const Array& x, const Array& y) {
  Array a = x, b = y;
  prep2("fmin", a, b, Promo::Plain);
  return select_full(lax::bitwise_or(lax::gt(a, b), isnan(a)), b, a);
}

Array where(const Array& condition, const Array& x, const Array& y) {
  Array c = to_bool(condition);
  Array a = x, b = y;
  promote2("where", a, b, Promo::Plain);
  const Shape* shapes[3] = {&c.shape(), &a.shape(), &b.shape()};
  Shape out = broadcast_shape_of("where", shapes);
  Array p = c.ndim() == 0 ? c : broadcast_to_shape(c, out);
  return lax::select_n(p, {broadcast_to_shape(b, out), broadcast_to_shape(a, out)});
}

// ---- floating-point classification ----
Array isnan(const Array& x) { return is_floating(x.dtype()) ? lax::ne(x, x) : bool_like(x, false); }
Array isinf(const Array& x) {
  return is_floating(x.dtype()) ? lax::eq(lax::abs(x), cst(INFINITY, x)) : bool_like(x, false);
}
Array isfinite(const Array& x) { return is_floating(x.dtype()) ? lax::is_finite(x) : bool_like(x, true); }
Array isposinf(const Array& x) { return is_floating(x.dtype()) ? lax::eq(x, cst(INFINITY, x)) : bool_like(x, false); }
Array isneginf(const Array& x) { return is_floating(x.dtype()) ? lax::eq(x, cst(-INFINITY, x)) : bool_like(x, false); }
Array nan_to_num(const Array& x, double nan, std::optional<double> posinf, std::optional<double> neginf) {
  DType d = x.dtype();
  if (!is_floating(d)) return x;
  double big = finfo_max(d);
  Array out = select_full(isnan(x), cst(nan, x), x);
  out = select_full(isposinf(out), cst(posinf.value_or(big), x), out);
  return select_full(isneginf(out), cst(neginf.value_or(-big), x), out);
}

// ---- logical / bitwise ----
Array logical_and(const Array& x, const Array& y) {
  Array a = to_bool(x), b = to_bool(y);
  broadcast2("logical_and", a, b);
  return lax::bitwise_and(a, b);
}
Array logical_or(const Array& x, const Array& y) {
  Array a = to_bool(x), b = to_bool(y);
  broadcast2("logical_or", a, b);
  return lax::bitwise_or(a, b);
}
Array logical_xor(const Array& x, const Array& y) {
  Array a = to_bool(x), b = to_bool(y);
  broadcast2("logical_xor", a, b);
  return lax::bitwise_xor(a, b);
}
Array logical_not(const Array& x) { return lax::bitwise_not(to_bool(x)); }

#define CJAX_BITWISE(name, laxfn)                         \
  Array name(const Array& x, const Array& y) {            \
    Array a = x, b = y;                                   \
    if (!fast_ok(x, y)) prep2(#name, a, b, Promo::Plain); \
    require_int_or_bool(#name, a);                        \
    return lax::laxfn(a, b);                              \
  }
CJAX_BITWISE(bitwise_and, bitwise_and)
CJAX_BITWISE(bitwise_or, bitwise_or)
CJAX_BITWISE(bitwise_xor, bitwise_xor)
#undef CJAX_BITWISE
Array bitwise_not(const Array& x) {
  require_int_or_bool("bitwise_not", x);
  return lax::bitwise_not(x);
}
Array invert(const Array& x) {
  require_int_or_bool("invert", x);
  return lax::bitwise_not(x);
}
Array left_shift(const Array& x, const Array& y) {
  Array a = x, b = y;
  prep2("left_shift", a, b, Promo::Numeric);
  require_int("left_shift", a);
  return lax::shift_left(a, b);
}
Array right_shift(const Array& x, const Array& y) {
  Array a = x, b = y;
  prep2("right_shift", a, b, Promo::Numeric);
  require_int("right_shift", a);
  return is_unsigned_integer(a.dtype()) ? lax::shift_right_logical(a, b) : lax::shift_right_arithmetic(a, b);
}

// ---- comparisons ----
Array equal(const Array& x, const Array& y) { return plain_binary("equal", x, y, &lax::eq); }
Array not_equal(const Array& x, const Array& y) { return plain_binary("not_equal", x, y, &lax::ne); }
Array less(const Array& x, const Array& y) { return plain_binary("less", x, y, &lax::lt); }
Array less_equal(const Array& x, const Array& y) { return plain_binary("less_equal", x, y, &lax::le); }
Array greater(const Array& x, const Array& y) { return plain_binary("greater", x, y, &lax::gt); }
Array greater_equal(const Array& x, const Array& y) { return plain_binary("greater_equal", x, y, &lax::ge); }

Array isclose(const Array& x, const Array& y, double rtol, double atol, bool equal_nan) {
  Array a = x, b = y;
  prep2("isclose", a, b, Promo::Plain);
  if (!is_floating(a.dtype())) return lax::eq(a, b);
  Array out = lax::le(lax::abs(lax::sub(a, b)), lax::add(cst(atol, a), lax::mul(cst(rtol, a), lax::abs(b))));
  Array a_inf = isinf(a), b_inf = isinf(b);
  out = lax::bitwise_and(out, lax::bitwise_not(lax::bitwise_or(a_inf, b_inf)));
  out = lax::bitwise_or(out, lax::bitwise_and(lax::bitwise_and(a_inf, b_inf), lax::eq(a, b)));
  Array a_nan = isnan(a), b_nan = isnan(b);
  out = lax::bitwise_and(out, lax::bitwise_not(lax::bitwise_or(a_nan, b_nan)));
  if (equal_nan) out = lax::bitwise_or(out, lax::bitwise_and(a_nan, b_nan));
  return out;
}

namespace {
bool all_true(const Array& m, std::string_view fn) {
  require_concrete(m, fn);
  for (bool v : m.to_vector<bool>())
    if (!v) return false;
  return true;
}
}  // namespace

bool allclose(const Array& x, const Array& y, double rtol, double atol, bool equal_nan) {
  return all_true(isclose(x, y, rtol, atol, equal_nan), "allclose (it returns a C++ bool)");
}
bool array_equal(const Array& x, const Array& y) {
  if (x.shape() != y.shape()) return false;
  return all_true(equal(x, y), "array_equal (it returns a C++ bool)");
}

Array heaviside(const Array& x, const Array& y) {
  Array a = x, b = y;
  prep2("heaviside", a, b, Promo::Inexact);
  Array zero = cst(0, a);
  return select_full(lax::lt(a, zero), zero, select_full(lax::gt(a, zero), cst(1, a), b));
}

Array hypot(const Array& x, const Array& y) {
  Array a = x, b = y;
  prep2("hypot", a, b, Promo::Inexact);
  a = lax::abs(a);
  b = lax::abs(b);
  Array inf = lax::bitwise_or(isposinf(a), isposinf(b));
  Array hi = lax::max(a, b), lo = lax::min(a, b);
  Array hi_zero = lax::eq(hi, cst(0, hi));
  Array safe = select_full(hi_zero, cst(1, hi), hi);
  Array r = lax::mul(hi, lax::sqrt(lax::add(cst(1, hi), lax::square(lax::div(lo, safe)))));
  r = select_full(hi_zero, hi, r);
  return select_full(inf, cst(INFINITY, r), r);
}

Array logaddexp(const Array& x, const Array& y) {
  Array a = x, b = y;
  prep2("logaddexp", a, b, Promo::Inexact);
  Array amax = lax::max(a, b);
  Array delta = lax::sub(a, b);
  Array stable = lax::add(amax, lax::log1p(lax::exp(lax::neg(lax::abs(delta)))));
  return select_full(lax::ne(delta, delta), lax::add(a, b), stable);
}

}  // namespace numpy
}  // namespace cjax
