// Calls f(Tag<T>{}) with the C++ element type of a dtype: the one switch every typed kernel uses.
#pragma once
#include "cjax/dtype.h"
#include "cjax/errors.h"

namespace cjax {

template <class T>
struct Tag {
  using type = T;
};

template <class F>
decltype(auto) visit_dtype(DType d, F&& f) {
  switch (d) {
    case DType::bool_: return f(Tag<bool>{});
    case DType::int8: return f(Tag<int8_t>{});
    case DType::int16: return f(Tag<int16_t>{});
    case DType::int32: return f(Tag<int32_t>{});
    case DType::int64: return f(Tag<int64_t>{});
    case DType::uint8: return f(Tag<uint8_t>{});
    case DType::uint32: return f(Tag<uint32_t>{});
    case DType::bfloat16: return f(Tag<bfloat16_t>{});
    case DType::float16: return f(Tag<float16_t>{});
    case DType::float32: return f(Tag<float>{});
    case DType::float64: return f(Tag<double>{});
  }
  // Not an enumerator (DType(99)): dtype_name raises the DTypeError naming the value (core/array/dtype.cpp).
  (void)dtype_name(d);
  throw DTypeError("invalid dtype value " + std::to_string(int(d)));
}

// The type arithmetic is done in: float for the half types, the type itself otherwise.
template <class T>
struct compute_type {
  using type = T;
};
template <>
struct compute_type<bfloat16_t> {
  using type = float;
};
template <>
struct compute_type<float16_t> {
  using type = float;
};
template <class T>
using compute_t = typename compute_type<T>::type;

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, bfloat16_t> || std::is_same_v<T, float16_t>;
template <class T>
inline constexpr bool is_float_like_v = is_half_v<T> || std::is_floating_point_v<T>;

}  // namespace cjax
