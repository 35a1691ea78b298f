// Element types, half-precision storage types and JAX's type-promotion lattice.
#pragma once
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace cjax {

enum class DType : uint8_t { bool_, int8, int16, int32, int64, uint8, uint32, bfloat16, float16, float32, float64 };
inline constexpr int kNumDTypes = 11;

inline constexpr DType bool_ = DType::bool_, i8 = DType::int8, i16 = DType::int16, i32 = DType::int32,
                       i64 = DType::int64, u8 = DType::uint8, u32 = DType::uint32, bf16 = DType::bfloat16,
                       f16 = DType::float16, f32 = DType::float32, f64 = DType::float64;

std::string_view dtype_name(DType);                      // numpy name: "float32", "bfloat16", "bool"
std::string_view dtype_short_name(DType);                // jaxpr name: "f32", "bf16", "bool", "u8"
std::optional<DType> dtype_from_name(std::string_view);  // accepts both forms
size_t itemsize(DType);
bool is_floating(DType);
bool is_integer(DType);  // signed or unsigned, not bool
bool is_signed_integer(DType);
bool is_unsigned_integer(DType);
int mantissa_bits(DType);  // f32 23, f64 52, f16 10, bf16 7; 0 for non-floats

// JAX's promotion lattice. A weakly typed value (a C++ scalar, or a result computed only from
// them) yields to the other operand's dtype: f16_array * 2.0 -> f16, f64_array * 0.1 -> f64
// (the scalar is held exactly as a weak f64). A weak result takes JAX's default dtype of its kind:
// i32_array * 0.5 -> weak f32, like JAX's default (32-bit) mode; only all-weak inputs of one
// dtype keep it (Array(1.5) * Array(2.0) -> weak f64). Integer -> inexact conversions needed by
// an op (true division, sqrt, mean of ints) produce float32.
struct TypeInfo {
  DType dtype;
  bool weak = false;
  bool operator==(const TypeInfo&) const = default;
};
TypeInfo result_type(std::span<const TypeInfo> inputs);
DType promote_types(DType a, DType b);  // both strongly typed

// bfloat16 / float16 are stored natively (2 bytes) and computed in float32.
struct bfloat16_t {
  uint16_t bits = 0;
  bfloat16_t() = default;
  explicit bfloat16_t(float f) : bits(from_float(f)) {}
  operator float() const {
    uint32_t u = uint32_t(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  static uint16_t from_float(float f) {  // round to nearest even, NaN stays NaN
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return uint16_t(u >> 16);
  }
};

struct float16_t {
  uint16_t bits = 0;
  float16_t() = default;
  explicit float16_t(float f) : bits(from_float(f)) {}
  operator float() const { return to_float(bits); }
  static uint16_t from_float(float f);
  // Inline so loops over f16 data vectorize.
  static float to_float(uint16_t h) {
    uint32_t sign = uint32_t(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
      if (mant == 0) {
        bits = sign;
      } else {  // subnormal: renormalise
        int e = -1;
        do {
          ++e;
          mant <<= 1;
        } while ((mant & 0x400u) == 0);
        bits = sign | uint32_t(112 - e) << 23 | (mant & 0x3ffu) << 13;
      }
    } else if (exp == 31) {
      bits = sign | 0x7f800000u | (mant << 13);
    } else {
      bits = sign | ((exp + 112) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
};

// Maps C++ element types to DTypes.
template <class T>
struct dtype_of;
template <>
struct dtype_of<bool> {
  static constexpr DType value = DType::bool_;
};
template <>
struct dtype_of<int8_t> {
  static constexpr DType value = DType::int8;
};
template <>
struct dtype_of<int16_t> {
  static constexpr DType value = DType::int16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::int32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::int64;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::uint8;
};
template <>
struct dtype_of<uint32_t> {
  static constexpr DType value = DType::uint32;
};
template <>
struct dtype_of<bfloat16_t> {
  static constexpr DType value = DType::bfloat16;
};
template <>
struct dtype_of<float16_t> {
  static constexpr DType value = DType::float16;
};
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::float32;
};
template <>
struct dtype_of<double> {
  static constexpr DType value = DType::float64;
};
template <class T>
inline constexpr DType dtype_v = dtype_of<T>::value;

}  // namespace cjax
