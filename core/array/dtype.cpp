#include "cjax/dtype.h"

#include <array>
#include <bit>
#include <cmath>
#include <string>

#include "cjax/errors.h"

namespace cjax {
namespace {
struct DTypeRow {
  DType d;
  std::string_view name, short_name;
  size_t size;
  int mantissa;
};
constexpr std::array<DTypeRow, kNumDTypes> kRows{{
    {DType::bool_, "bool", "bool", 1, 0},
    {DType::int8, "int8", "i8", 1, 0},
    {DType::int16, "int16", "i16", 2, 0},
    {DType::int32, "int32", "i32", 4, 0},
    {DType::int64, "int64", "i64", 8, 0},
    {DType::uint8, "uint8", "u8", 1, 0},
    {DType::uint32, "uint32", "u32", 4, 0},
    {DType::bfloat16, "bfloat16", "bf16", 2, 7},
    {DType::float16, "float16", "f16", 2, 10},
    {DType::float32, "float32", "f32", 4, 23},
    {DType::float64, "float64", "f64", 8, 52},
}};
// Every lookup of a dtype's properties (name, itemsize, kind, mantissa) goes through row(), so a
// value outside the enum (DType(99), a corrupted byte) is a DTypeError naming it at the first public
// entry that looks at it, instead of an out-of-bounds read (which used to surface as a garbage
// itemsize: "out of host memory").
[[noreturn]] void invalid_dtype(DType d) {
  std::string valid;
  for (const auto& r : kRows) valid += (valid.empty() ? "" : ", ") + std::string(r.name);
  throw DTypeError("invalid dtype value " + std::to_string(int(d)) + " (a DType is one of " + valid + ", values 0.." +
                   std::to_string(kNumDTypes - 1) + ")");
}
const DTypeRow& row(DType d) {
  if (size_t(d) >= kRows.size()) [[unlikely]]
    invalid_dtype(d);
  return kRows[size_t(d)];
}

// JAX's lattice (jax/_src/dtypes.py), without complex types. Nodes beyond our dtypes (u16, u64)
// are kept so least upper bounds come out as in JAX.
enum Node : int { B, U8, U16, U32, U64, IW, I8, I16, I32, I64, FW, BF16, F16, F32, F64, kNodes };
constexpr uint32_t bit(int n) { return 1u << n; }
struct Lattice {
  std::array<uint32_t, kNodes> up{};  // reflexive-transitive upper sets
  constexpr Lattice() {
    std::array<uint32_t, kNodes> edges{};
    edges[B] = bit(IW);
    edges[IW] = bit(U8) | bit(I8);
    edges[U8] = bit(I16) | bit(U16);
    edges[U16] = bit(I32) | bit(U32);
    edges[U32] = bit(I64) | bit(U64);
    edges[U64] = bit(FW);
    edges[I8] = bit(I16);
    edges[I16] = bit(I32);
    edges[I32] = bit(I64);
    edges[I64] = bit(FW);
    edges[FW] = bit(BF16) | bit(F16);
    edges[BF16] = bit(F32);
    edges[F16] = bit(F32);
    edges[F32] = bit(F64);
    for (int n = 0; n < kNodes; ++n) up[n] = bit(n) | edges[n];
    for (int iter = 0; iter < kNodes; ++iter)
      for (int n = 0; n < kNodes; ++n)
        for (int m = 0; m < kNodes; ++m)
          if (up[n] & bit(m)) up[n] |= up[m];
  }
};
constexpr Lattice kLattice;

int node_of(TypeInfo t) {
  (void)row(t.dtype);  // validates
  switch (t.dtype) {
    case DType::bool_: return B;
    case DType::int8: return t.weak ? IW : I8;
    case DType::int16: return t.weak ? IW : I16;
    case DType::int32: return t.weak ? IW : I32;
    case DType::int64: return t.weak ? IW : I64;
    case DType::uint8: return t.weak ? IW : U8;
    case DType::uint32: return t.weak ? IW : U32;
    case DType::bfloat16: return t.weak ? FW : BF16;
    case DType::float16: return t.weak ? FW : F16;
    case DType::float32: return t.weak ? FW : F32;
    case DType::float64: return t.weak ? FW : F64;
  }
  return B;
}
}  // namespace

std::string_view dtype_name(DType d) { return row(d).name; }
std::string_view dtype_short_name(DType d) { return row(d).short_name; }
std::optional<DType> dtype_from_name(std::string_view s) {
  for (auto& r : kRows)
    if (r.name == s || r.short_name == s) return r.d;
  if (s == "bool_") return DType::bool_;
  return std::nullopt;
}
size_t itemsize(DType d) { return row(d).size; }
bool is_floating(DType d) { return row(d).mantissa > 0; }
bool is_integer(DType d) { return d != DType::bool_ && !is_floating(d); }
bool is_signed_integer(DType d) {
  (void)row(d);  // validates
  return d == DType::int8 || d == DType::int16 || d == DType::int32 || d == DType::int64;
}
bool is_unsigned_integer(DType d) { return (void)row(d), d == DType::uint8 || d == DType::uint32; }
int mantissa_bits(DType d) { return row(d).mantissa; }

TypeInfo result_type(std::span<const TypeInfo> inputs) {
  if (inputs.empty()) throw ValueError("result_type needs at least one input");
  uint32_t common = ~0u;
  for (auto& t : inputs) common &= kLattice.up[node_of(t)];
  int lub = -1;
  for (int n = 0; n < kNodes; ++n)
    if ((common & bit(n)) && kLattice.up[n] == common) lub = n;
  if (lub < 0) throw DTypeError("no common dtype for the given inputs");
  static constexpr DType strong[kNodes] = {DType::bool_,   DType::uint8,   DType::uint32,  DType::uint32,
                                           DType::float64, DType::int32,   DType::int8,    DType::int16,
                                           DType::int32,   DType::int64,   DType::float32, DType::bfloat16,
                                           DType::float16, DType::float32, DType::float64};
  if (lub == U16 || lub == U64) {
    throw DTypeError(
        "type promotion reached an unsigned type cjax does not have (uint16/uint64); "
        "cast the operands explicitly with astype");
  }
  if (lub == IW || lub == FW) {
    // A weak result takes the default dtype of its kind (int32 / float32), as in JAX, except when
    // every input is weak with the same dtype (scalar arithmetic keeps an exact f64/i64 scalar).
    bool all_same_weak = true;
    for (auto& t : inputs) all_same_weak &= t.weak && t.dtype == inputs[0].dtype;
    if (all_same_weak) return {inputs[0].dtype, true};
    return {lub == IW ? DType::int32 : DType::float32, true};
  }
  return {strong[lub], false};
}

DType promote_types(DType a, DType b) {
  TypeInfo in[2] = {{a, false}, {b, false}};
  return result_type(in).dtype;
}

uint16_t float16_t::from_float(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) return uint16_t(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  if (absx >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: overflow to inf
  if (absx < 0x38800000u) {                                  // subnormal half (or zero)
    float a = std::bit_cast<float>(absx);
    // Adding 0.5 scales the value so that the FPU's round-to-nearest-even produces the
    // half subnormal mantissa in the low bits.
    uint32_t r = std::bit_cast<uint32_t>(a + 0.5f) - 0x3f000000u;
    return uint16_t(sign | r);
  }
  uint32_t mant_odd = (absx >> 13) & 1u;
  absx += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return uint16_t(sign | (absx >> 13));
}

}  // namespace cjax
