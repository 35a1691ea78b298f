// Eager scalar semantics of each row of the scalar-op table. Arithmetic happens in
// compute_t<T> (float for bf16/f16). Float ops propagate NaN like XLA (max/min included).
#pragma once
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "core/array/visit_dtype.h"
#include "core/backend/scalar_ops.h"
#include "core/lax/special_fns.h"

namespace cjax {
// Whether dtype T is in an op's domain (the table's domain column).
template <class T>
constexpr bool scalar_domain_accepts(ScalarDomain d) {
  constexpr bool fl = is_float_like_v<T>, b = std::is_same_v<T, bool>, in = !fl && !b;
  switch (d) {
    case ScalarDomain::Float:
    case ScalarDomain::Pred: return fl;
    case ScalarDomain::Int: return in;
    case ScalarDomain::Num: return fl || in;
    case ScalarDomain::Logic: return b || in;
    case ScalarDomain::Any:
    case ScalarDomain::Cmp: return true;
  }
  return false;
}
}  // namespace cjax

namespace cjax::scalar {

template <ScalarOp op>
struct Fn;

#define CJAX_UNARY(E, EXPR)         \
  template <>                       \
  struct Fn<ScalarOp::E> {          \
    template <class T>              \
    static inline auto apply(T x) { \
      return EXPR;                  \
    }                               \
  };
#define CJAX_BINARY(E, EXPR)             \
  template <>                            \
  struct Fn<ScalarOp::E> {               \
    template <class T>                   \
    static inline auto apply(T x, T y) { \
      return EXPR;                       \
    }                                    \
  };

// Integer arithmetic wraps (two's complement), as in XLA: it is done in an unsigned type at least
// as wide as `unsigned int`, so narrow types don't promote to a signed int that could overflow.
template <class T>
struct wrap_type {
  using type = decltype(std::make_unsigned_t<T>() + 0u);
};
template <class T>
inline T wrap_add(T x, T y) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    using W = typename wrap_type<T>::type;
    return T(W(x) + W(y));
  } else {
    return T(x + y);
  }
}
template <class T>
inline T wrap_sub(T x, T y) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    using W = typename wrap_type<T>::type;
    return T(W(x) - W(y));
  } else {
    return T(x - y);
  }
}

// a op b for a reduction over devices: bool reduces as or (Sum, Max) and and (Prod, Min); integer
// sums and products wrap; Max and Min return a NaN operand as it is, as XLA does.
template <class T>
inline T reduce_combine(T a, T b, ReduceOp op) {
  if constexpr (std::is_same_v<T, bool>) {
    return op == ReduceOp::Prod || op == ReduceOp::Min ? (a && b) : (a || b);
  } else if constexpr (std::is_integral_v<T>) {
    using W = typename wrap_type<T>::type;
    if (op == ReduceOp::Sum) return T(W(a) + W(b));
    if (op == ReduceOp::Prod) return T(W(a) * W(b));
    return op == ReduceOp::Max ? std::max(a, b) : std::min(a, b);
  } else {
    using C = compute_t<T>;
    C x = C(a), y = C(b);
    if (op == ReduceOp::Sum) return T(x + y);
    if (op == ReduceOp::Prod) return T(x * y);
    if (x != x) return a;
    if (y != y) return b;
    return op == ReduceOp::Max ? (x < y ? b : a) : (y < x ? b : a);
  }
}
template <class T>
inline T wrap_mul(T x, T y) {
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    using W = typename wrap_type<T>::type;
    return T(W(x) * W(y));
  } else {
    return T(x * y);
  }
}
template <class T>
inline T neg_(T x) {
  if constexpr (std::is_same_v<T, bool>)
    return x;
  else
    return wrap_sub(T(0), x);
}
template <class T>
inline T sign_(T x) {
  if constexpr (std::is_floating_point_v<T>)
    return std::isnan(x) ? x : T((x > 0) - (x < 0));
  else if constexpr (std::is_unsigned_v<T>)
    return T(x > 0);
  else
    return T((x > 0) - (x < 0));
}
template <class T>
inline T abs_(T x) {
  if constexpr (std::is_unsigned_v<T>)
    return x;
  else if constexpr (std::is_floating_point_v<T>)
    return std::fabs(x);
  else
    return x < 0 ? wrap_sub(T(0), x) : x;  // abs(INT_MIN) wraps to INT_MIN, as in XLA
}
template <class T>
inline T div_(T x, T y) {
  if constexpr (std::is_floating_point_v<T>)
    return x / y;
  else {
    // Integer division by zero: XLA defines it as -1 (all ones); we match, and INT_MIN / -1 = INT_MIN.
    if (y == 0) return T(-1);
    if constexpr (std::is_signed_v<T>)
      if (x == std::numeric_limits<T>::min() && y == T(-1)) return x;
    return T(x / y);
  }
}
template <class T>
inline T rem_(T x, T y) {
  if constexpr (std::is_floating_point_v<T>)
    return std::fmod(x, y);
  else {
    if (y == 0) return x;  // XLA: x rem 0 = x
    if constexpr (std::is_signed_v<T>)
      if (y == T(-1)) return T(0);
    return T(x % y);
  }
}
template <class T>
inline T max_(T x, T y) {
  if constexpr (std::is_floating_point_v<T>)
    return std::isnan(x) ? x : std::isnan(y) ? y : (x > y ? x : y);
  else
    return x > y ? x : y;
}
template <class T>
inline T min_(T x, T y) {
  if constexpr (std::is_floating_point_v<T>)
    return std::isnan(x) ? x : std::isnan(y) ? y : (x < y ? x : y);
  else
    return x < y ? x : y;
}
template <class T>
inline T not_(T x) {
  if constexpr (std::is_same_v<T, bool>)
    return !x;
  else
    return T(~x);
}
template <class T>
inline T shl_(T x, T y) {
  using U = std::make_unsigned_t<T>;
  return (y < 0 || y >= T(sizeof(T) * 8)) ? T(0) : T(U(x) << U(y));
}
template <class T>
inline T shr_logical_(T x, T y) {
  using U = std::make_unsigned_t<T>;
  return (y < 0 || y >= T(sizeof(T) * 8)) ? T(0) : T(U(x) >> U(y));
}
template <class T>
inline T shr_arith_(T x, T y) {
  using S = std::make_signed_t<T>;
  const T bits = T(sizeof(T) * 8);
  if (y < 0 || y >= bits) return S(x) < 0 ? T(-1) : T(0);
  return T(S(x) >> S(y));
}
template <class T>
inline T round_even_(T x) {
  return std::nearbyint(x);
}  // default FE mode: half to even

CJAX_UNARY(Neg, neg_(x))
CJAX_UNARY(Sign, sign_(x))
CJAX_UNARY(Abs, abs_(x))
CJAX_UNARY(Floor, std::floor(x))
CJAX_UNARY(Ceil, std::ceil(x))
CJAX_UNARY(Round, round_even_(x))
CJAX_UNARY(IsFinite, bool(std::isfinite(x)))
CJAX_UNARY(Exp, std::exp(x))
CJAX_UNARY(Exp2, std::exp2(x))
CJAX_UNARY(Log, std::log(x))
CJAX_UNARY(Log1p, std::log1p(x))
CJAX_UNARY(Expm1, std::expm1(x))
CJAX_UNARY(Tanh, std::tanh(x))
CJAX_UNARY(Logistic, T(1) / (T(1) + std::exp(-x)))
CJAX_UNARY(Sin, std::sin(x))
CJAX_UNARY(Cos, std::cos(x))
CJAX_UNARY(Tan, std::tan(x))
CJAX_UNARY(Asin, std::asin(x))
CJAX_UNARY(Acos, std::acos(x))
CJAX_UNARY(Atan, std::atan(x))
CJAX_UNARY(Sinh, std::sinh(x))
CJAX_UNARY(Cosh, std::cosh(x))
CJAX_UNARY(Asinh, std::asinh(x))
CJAX_UNARY(Acosh, std::acosh(x))
CJAX_UNARY(Atanh, std::atanh(x))
CJAX_UNARY(Sqrt, std::sqrt(x))
CJAX_UNARY(Rsqrt, T(1) / std::sqrt(x))
CJAX_UNARY(Cbrt, std::cbrt(x))
CJAX_UNARY(Erf, std::erf(x))
CJAX_UNARY(Erfc, std::erfc(x))
CJAX_UNARY(ErfInv, special::erf_inv(x))
CJAX_UNARY(Lgamma, std::lgamma(x))
CJAX_UNARY(Not, not_(x))
CJAX_UNARY(Square, wrap_mul(x, x))
CJAX_BINARY(Add, wrap_add(x, y))
CJAX_BINARY(Sub, wrap_sub(x, y))
CJAX_BINARY(Mul, wrap_mul(x, y))
CJAX_BINARY(Div, div_(x, y))
CJAX_BINARY(Rem, rem_(x, y))
CJAX_BINARY(Pow, std::pow(x, y))
CJAX_BINARY(Max, max_(x, y))
CJAX_BINARY(Min, min_(x, y))
CJAX_BINARY(Atan2, std::atan2(x, y))
CJAX_BINARY(Nextafter, std::nextafter(x, y))
CJAX_BINARY(And, T(x& y))
CJAX_BINARY(Or, T(x | y))
CJAX_BINARY(Xor, T(x ^ y))
CJAX_BINARY(ShiftLeft, shl_(x, y))
CJAX_BINARY(ShiftRightLogical, shr_logical_(x, y))
CJAX_BINARY(ShiftRightArithmetic, shr_arith_(x, y))
CJAX_BINARY(Eq, bool(x == y))
CJAX_BINARY(Ne, bool(x != y))
CJAX_BINARY(Lt, bool(x < y))
CJAX_BINARY(Le, bool(x <= y))
CJAX_BINARY(Gt, bool(x > y))
CJAX_BINARY(Ge, bool(x >= y))

// clamp(lo, x, hi) as lax.clamp: min(max(x, lo), hi).
template <>
struct Fn<ScalarOp::Clamp> {
  template <class T>
  static inline T apply(T lo, T x, T hi) {
    return min_(max_(x, lo), hi);
  }
};

#undef CJAX_UNARY
#undef CJAX_BINARY

}  // namespace cjax::scalar
