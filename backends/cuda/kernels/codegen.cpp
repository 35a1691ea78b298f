#include "backends/cuda/kernels/codegen.h"

#include <fmt/format.h>

#include "backends/cuda/cuda_device.h"

namespace cjax::cuda {

// Self-contained: NVRTC compiles it without toolkit headers. Half types are stored as 16-bit
// integers and converted with PTX cvt (round to nearest even).
const char* const kPrelude = R"(
__device__ __forceinline__ float cj_from_bf16(unsigned short h) { return __uint_as_float(((unsigned)h) << 16); }
__device__ __forceinline__ unsigned short cj_to_bf16(float f) {
  unsigned short h; asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
__device__ __forceinline__ float cj_from_f16(unsigned short h) {
  float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h)); return f; }
__device__ __forceinline__ unsigned short cj_to_f16(float f) {
  unsigned short h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f)); return h; }
template <class T> __device__ __forceinline__ T cj_fmax(T x, T y) { return x != x ? x : y != y ? y : (x > y ? x : y); }
template <class T> __device__ __forceinline__ T cj_fmin(T x, T y) { return x != x ? x : y != y ? y : (x < y ? x : y); }
template <class T> __device__ __forceinline__ T cj_max(T x, T y) { return x > y ? x : y; }
template <class T> __device__ __forceinline__ T cj_min(T x, T y) { return x < y ? x : y; }
)";

bool is_half(DType d) { return d == DType::bfloat16 || d == DType::float16; }
bool is_float(DType d) { return is_half(d) || d == DType::float32 || d == DType::float64; }
bool is_signed_int(DType d) { return d == DType::int8 || d == DType::int16 || d == DType::int32 || d == DType::int64; }

// The CUDA type an element is stored as.
std::string storage_type(DType d) {
  switch (d) {
    case DType::bool_: return "bool";
    case DType::int8: return "signed char";
    case DType::int16: return "short";
    case DType::int32: return "int";
    case DType::int64: return "long long";
    case DType::uint8: return "unsigned char";
    case DType::uint32: return "unsigned int";
    case DType::bfloat16:
    case DType::float16: return "unsigned short";
    case DType::float32: return "float";
    case DType::float64: return "double";
  }
  return "void";
}
// The type arithmetic happens in (f32 for the half types, as on the CPU).
std::string compute_type(DType d) { return is_half(d) ? "float" : storage_type(d); }

const char* bits_type(size_t itemsize) {
  return itemsize == 1   ? "unsigned char"
         : itemsize == 2 ? "unsigned short"
         : itemsize == 4 ? "unsigned int"
                         : "unsigned long long";
}

std::string load(DType d, const std::string& v) {
  if (d == DType::bfloat16) return "cj_from_bf16(" + v + ")";
  if (d == DType::float16) return "cj_from_f16(" + v + ")";
  return v;
}
std::string store(DType d, const std::string& v) {
  if (d == DType::bfloat16) return "cj_to_bf16(" + v + ")";
  if (d == DType::float16) return "cj_to_f16(" + v + ")";
  return "(" + storage_type(d) + ")(" + v + ")";
}

// The CPU's conversions (backends/cpu/llvm_scalar.cpp): float -> integer truncates, saturating,
// NaN -> 0; -> bool is != 0; integer -> integer wraps (C casts).
std::string convert_expr(DType from, DType to, const std::string& v) {
  std::string ct = compute_type(to);
  if (to == DType::bool_) return fmt::format("({} != 0)", v);
  if (is_float(from) && !is_float(to) && to != DType::bool_) {
    std::string lo = lowest_literal(to), hi = highest_literal(to);
    return fmt::format(
        "({0} != {0} ? ({1})0 : (double){0} <= (double){2} ? ({1}){2} : (double){0} >= (double){3} ? "
        "({1}){3} : ({1}){0})",
        v, ct, lo, hi);
  }
  return fmt::format("(({}){})", ct, v);
}

namespace {
// Unsigned type of at least `unsigned int`'s width that integer arithmetic wraps in.
std::string wrap_type(DType d) { return d == DType::int64 ? "unsigned long long" : "unsigned int"; }
// The integer type of d's width with the given signedness.
std::string same_width(DType d, bool is_signed) {
  const char* base = itemsize(d) == 1 ? "char" : itemsize(d) == 2 ? "short" : itemsize(d) == 8 ? "long long" : "int";
  return std::string(is_signed ? (itemsize(d) == 1 ? "signed " : "") : "unsigned ") + base;
}
int bits(DType d) { return int(itemsize(d)) * 8; }
std::string int_min(DType d) {
  switch (d) {
    case DType::int8: return "(-128)";
    case DType::int16: return "(-32768)";
    case DType::int32: return "(-2147483647 - 1)";
    default: return "(-9223372036854775807LL - 1)";
  }
}

// The op on compute-typed x, y, z; nullopt when this dtype has no expression here.
std::optional<std::string> float_expr(ScalarOp op, DType d) {
  const bool f64 = d == DType::float64;
  const std::string T = compute_type(d);
  auto fn = [&](const char* name) { return fmt::format("{}{}(x)", name, f64 ? "" : "f"); };
  auto fn2 = [&](const char* name) { return fmt::format("{}{}(x, y)", name, f64 ? "" : "f"); };
  switch (op) {
    case ScalarOp::Neg: return "(-x)";
    case ScalarOp::Sign: return fmt::format("(x != x ? x : ({})((x > 0) - (x < 0)))", T);
    case ScalarOp::Abs: return fn("fabs");
    case ScalarOp::Floor: return fn("floor");
    case ScalarOp::Ceil: return fn("ceil");
    case ScalarOp::Round: return fn("rint");  // half to even, as std::nearbyint on the CPU
    case ScalarOp::IsFinite: return "(x - x == 0)";
    case ScalarOp::Exp: return fn("exp");
    case ScalarOp::Exp2: return fn("exp2");
    case ScalarOp::Log: return fn("log");
    case ScalarOp::Log1p: return fn("log1p");
    case ScalarOp::Expm1: return fn("expm1");
    case ScalarOp::Tanh: return fn("tanh");
    case ScalarOp::Logistic: return fmt::format("(({0})1 / (({0})1 + {1}))", T, f64 ? "exp(-x)" : "expf(-x)");
    case ScalarOp::Sin: return fn("sin");
    case ScalarOp::Cos: return fn("cos");
    case ScalarOp::Tan: return fn("tan");
    case ScalarOp::Asin: return fn("asin");
    case ScalarOp::Acos: return fn("acos");
    case ScalarOp::Atan: return fn("atan");
    case ScalarOp::Sinh: return fn("sinh");
    case ScalarOp::Cosh: return fn("cosh");
    case ScalarOp::Asinh: return fn("asinh");
    case ScalarOp::Acosh: return fn("acosh");
    case ScalarOp::Atanh: return fn("atanh");
    case ScalarOp::Sqrt: return fn("sqrt");
    case ScalarOp::Rsqrt: return fmt::format("(({})1 / {})", T, fn("sqrt"));
    case ScalarOp::Cbrt: return fn("cbrt");
    case ScalarOp::Erf: return fn("erf");
    case ScalarOp::Erfc: return fn("erfc");
    case ScalarOp::ErfInv: return fn("erfinv");
    case ScalarOp::Lgamma: return fn("lgamma");
    case ScalarOp::Square: return "(x * x)";
    case ScalarOp::Add: return "(x + y)";
    case ScalarOp::Sub: return "(x - y)";
    case ScalarOp::Mul: return "(x * y)";
    case ScalarOp::Div: return "(x / y)";
    case ScalarOp::Rem: return fn2("fmod");
    case ScalarOp::Pow: return fn2("pow");
    case ScalarOp::Max: return "cj_fmax(x, y)";
    case ScalarOp::Min: return "cj_fmin(x, y)";
    case ScalarOp::Atan2: return fn2("atan2");
    case ScalarOp::Nextafter: return fn2("nextafter");
    case ScalarOp::Clamp: return "cj_fmin(cj_fmax(y, x), z)";
    default: return std::nullopt;
  }
}

std::optional<std::string> int_expr(ScalarOp op, DType d) {
  const std::string T = storage_type(d), W = wrap_type(d), U = same_width(d, false), S = same_width(d, true);
  const bool is_signed = is_signed_int(d);
  auto wrap = [&](const char* o) { return fmt::format("(({})(({})x {} ({})y))", T, W, o, W); };
  std::string shift_oob = fmt::format("(y < 0 || y >= ({}){})", T, bits(d));
  switch (op) {
    case ScalarOp::Neg: return fmt::format("(({})(({})0 - ({})x))", T, W, W);
    case ScalarOp::Sign:
      return is_signed ? fmt::format("(({})((x > 0) - (x < 0)))", T) : fmt::format("(({})(x > 0))", T);
    case ScalarOp::Abs: return is_signed ? fmt::format("(x < 0 ? ({})(({})0 - ({})x) : x)", T, W, W) : "x";
    case ScalarOp::Not: return fmt::format("(({})(~x))", T);
    case ScalarOp::Square: return fmt::format("(({})(({})x * ({})x))", T, W, W);
    case ScalarOp::Add: return wrap("+");
    case ScalarOp::Sub: return wrap("-");
    case ScalarOp::Mul: return wrap("*");
    case ScalarOp::Div:
      return is_signed ? fmt::format("(y == 0 ? ({0})-1 : (x == {1} && y == -1) ? x : ({0})(x / y))", T, int_min(d))
                       : fmt::format("(y == 0 ? ({0})-1 : ({0})(x / y))", T);
    case ScalarOp::Rem:
      return is_signed ? fmt::format("(y == 0 ? x : y == -1 ? ({0})0 : ({0})(x % y))", T)
                       : fmt::format("(y == 0 ? x : ({0})(x % y))", T);
    case ScalarOp::Max: return "cj_max(x, y)";
    case ScalarOp::Min: return "cj_min(x, y)";
    case ScalarOp::And: return fmt::format("(({})(x & y))", T);
    case ScalarOp::Or: return fmt::format("(({})(x | y))", T);
    case ScalarOp::Xor: return fmt::format("(({})(x ^ y))", T);
    case ScalarOp::ShiftLeft: return fmt::format("({} ? ({})0 : ({})(({})x << ({})y))", shift_oob, T, T, U, U);
    case ScalarOp::ShiftRightLogical: return fmt::format("({} ? ({})0 : ({})(({})x >> ({})y))", shift_oob, T, T, U, U);
    case ScalarOp::ShiftRightArithmetic:
      return fmt::format("({0} ? (({1})x < 0 ? ({2})-1 : ({2})0) : ({2})(({1})x >> ({1})y))", shift_oob, S, T);
    case ScalarOp::Clamp: return "cj_min(cj_max(y, x), z)";
    default: return std::nullopt;
  }
}

std::optional<std::string> bool_expr(ScalarOp op) {
  switch (op) {
    case ScalarOp::Not: return "(!x)";
    case ScalarOp::And: return "(x && y)";
    case ScalarOp::Or: return "(x || y)";
    case ScalarOp::Xor: return "(x != y)";
    case ScalarOp::Max: return "(x || y)";
    case ScalarOp::Min: return "(x && y)";
    case ScalarOp::Eq: return "(x == y)";
    case ScalarOp::Ne: return "(x != y)";
    case ScalarOp::Lt: return "(!x && y)";
    case ScalarOp::Le: return "(!x || y)";
    case ScalarOp::Gt: return "(x && !y)";
    case ScalarOp::Ge: return "(x || !y)";
    default: return std::nullopt;
  }
}

// Comparisons read the same for floats and integers (NaN compares unequal, as on the CPU).
std::optional<std::string> comparison_expr(ScalarOp op) {
  switch (op) {
    case ScalarOp::Eq: return "(x == y)";
    case ScalarOp::Ne: return "(x != y)";
    case ScalarOp::Lt: return "(x < y)";
    case ScalarOp::Le: return "(x <= y)";
    case ScalarOp::Gt: return "(x > y)";
    case ScalarOp::Ge: return "(x >= y)";
    default: return std::nullopt;
  }
}
}  // namespace

std::optional<std::string> scalar_expression(ScalarOp op, DType d) {
  if (d != DType::bool_)
    if (std::optional<std::string> c = comparison_expr(op)) return c;
  return d == DType::bool_ ? bool_expr(op) : is_float(d) ? float_expr(op, d) : int_expr(op, d);
}

std::string lowest_literal(DType d) {
  switch (d) {
    case DType::bool_: return "false";
    case DType::int8: return "(-128)";
    case DType::int16: return "(-32768)";
    case DType::int32: return "(-2147483647 - 1)";
    case DType::int64: return "(-9223372036854775807LL - 1)";
    case DType::uint8:
    case DType::uint32: return "0u";
    case DType::float64: return "(-__longlong_as_double(0x7ff0000000000000LL))";
    default: return "(-__int_as_float(0x7f800000))";
  }
}
std::string highest_literal(DType d) {
  switch (d) {
    case DType::bool_: return "true";
    case DType::int8: return "127";
    case DType::int16: return "32767";
    case DType::int32: return "2147483647";
    case DType::int64: return "9223372036854775807LL";
    case DType::uint8: return "255u";
    case DType::uint32: return "4294967295u";
    case DType::float64: return "__longlong_as_double(0x7ff0000000000000LL)";
    default: return "__int_as_float(0x7f800000)";
  }
}

void launch(const Device& d, const std::string& source, const char* name, unsigned grid, unsigned block,
            std::vector<void*> args) {
  launch(d, load_kernel(d, source, name), name, grid, block, std::move(args));
}

void launch(const Device& d, CUfunction fn, const char* name, unsigned grid, unsigned block, std::vector<void*> args) {
  if (grid == 0) return;
  const Driver& api = activate(d);
  check(api.cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, compute_stream(d), args.data(), nullptr), name);
}

}  // namespace cjax::cuda
