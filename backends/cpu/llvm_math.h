// Vectorizable inline approximations of the transcendental scalar ops for the LLVM CPU backend.
//
// A call to libm inside a kernel loop stops LLVM's loop vectorizer, so the kernel generator asks
// emit_math_approx for an inline version first. The emitted code is straight-line IR: arithmetic,
// integer ops on the bit patterns, selects, and intrinsics with vector forms (llvm.fma, llvm.fabs,
// llvm.rint, llvm.trunc, llvm.floor, llvm.sqrt, llvm.copysign). It has no branches, no calls and no
// memory accesses, so a scalar loop around it vectorizes (<16 x float> / <8 x double> on AVX-512).
//
// Inline versions (f32 and f64 unless noted):
//   exp exp2 log log1p expm1 tanh logistic erf erfc sin* cos* tan* asin acos atan atan2 sinh cosh
//   asinh acosh atanh cbrt pow            (* f32 only: f64 sin/cos/tan return nullptr)
// f32 erf, erfc, sin, cos, tan, sinh, cosh, asinh, acosh, atanh, cbrt and pow are computed in double
// and rounded once (about 0.5 ulp, at half the vector width); the others use float arithmetic.
//
// Accuracy: max error in ulp measured by tests/test_llvm_math.cpp (f32 unary ops: all 2^32 inputs;
// f32 pow/atan2: 4M structured random pairs; f64: 20M random and structured inputs per op). The test
// asserts bounds a little above these.
//          exp   exp2  log   log1p expm1 tanh  logistic erf   erfc  asin  acos  atan  atan2
//   f32    1.19  0.79  0.86  1.42  1.40  1.50  2.40     0.52  0.57  2.32  1.08  2.13  2.46
//   f64    0.79  0.89  0.84  1.35  1.34  1.50  2.18     1.40  3.33  2.13  1.12  2.12  2.50
//   f32 sin cos tan sinh cosh asinh acosh atanh cbrt pow: 0.50 (computed in double, rounded once);
//   f64 sinh 1.69, cosh 1.25, asinh 1.68, acosh 1.99, atanh 1.72, cbrt 0.50, pow 1.89.
// Denormal results are rounded once (no flush to zero); denormal inputs are handled exactly.
//
// Special values follow C/IEEE libm: NaN in -> NaN out (a quiet NaN; payloads are not preserved),
// signed zeros (f(-0) = -0 for the odd functions, expm1, log1p), overflow to +-inf, underflow to 0
// or a correctly rounded denormal, log(0) = -inf, log(x < 0) = NaN, log1p(-1) = -inf, tanh(+-inf) =
// +-1, logistic(x) = 1 / (1 + exp(-x)) without NaN for large |x|, erf(+-inf) = +-1, erfc(-inf) = 2,
// asin/acos outside [-1, 1] = NaN, atanh(+-1) = +-inf, acosh(x < 1) = NaN, sin/cos/tan(+-inf) =
// NaN, atan2 with the C99 signed-zero and infinity cases. pow(x, y) is exactly C's pow: pow(x, +-0)
// = 1 and pow(1, y) = 1 even for NaN, pow(-1, +-inf) = 1, a negative finite base with a non-integral
// finite exponent gives NaN, a negative base with an integral exponent gives the sign (-1)^y, and
// pow(+-0, y) / pow(+-inf, y) follow C99 F.9.4.4 (e.g. pow(-0, -3) = -inf, pow(-inf, 3) = -inf).
// f32 sin/cos/tan reduce exactly for every float (Payne-Hanek), so huge arguments are accurate.
#pragma once
#include <llvm/IR/IRBuilder.h>

#include "core/backend/scalar_ops.h"  // enum class ScalarOp (Exp, Log, Tanh, Logistic, ...)

namespace cjax::cpu {

// Emits `op(args...)` as inline IR (no calls, only instructions and intrinsics that have vector
// forms: llvm.fma, llvm.fabs, llvm.floor/llvm.rint/llvm.trunc, llvm.copysign, llvm.minnum/maxnum,
// llvm.sqrt, bitcasts, integer vector ops, selects), for `float` or `double` values (scalars, and
// also fixed vectors of them). Returns nullptr when `op` has no inline version for that type; the
// caller then calls libm per element.
//
// All args must have the same type (float, double, or a fixed vector of one of them; otherwise
// nullptr); the result has that type. The builder's insertion point must be inside a function of a
// module (intrinsic declarations are added to it); only instructions are appended there, no blocks.
// The builder's fast-math flags are ignored while emitting (the code relies on exact IEEE
// arithmetic: nnan/ninf/reassoc would break the special cases and the error-free transformations)
// and restored on return.
llvm::Value* emit_math_approx(llvm::IRBuilder<>& b, ScalarOp op, llvm::ArrayRef<llvm::Value*> args);

// True when emit_math_approx has an inline version of `op` for element type `element` (float or
// double); lets the kernel generator decide without emitting anything.
bool has_math_approx(ScalarOp op, llvm::Type* element);

}  // namespace cjax::cpu
