// See llvm_scalar.h.
#include "backends/cpu/llvm_scalar.h"

#include <fmt/format.h>
#include <llvm/IR/Intrinsics.h>

#include <cmath>

#include "backends/cpu/llvm_math.h"
#include "cjax/errors.h"
#include "core/backend/kernel_spec.h"

namespace cjax::cpu {

using llvm::Type;
using llvm::Value;

Type* ScalarCodegen::storage_type(DType d) {
  switch (d) {
    case DType::bool_:
    case DType::int8:
    case DType::uint8: return b_.getInt8Ty();
    case DType::int16:
    case DType::bfloat16:
    case DType::float16: return b_.getInt16Ty();
    case DType::int32:
    case DType::uint32: return b_.getInt32Ty();
    case DType::int64: return b_.getInt64Ty();
    case DType::float32: return b_.getFloatTy();
    case DType::float64: return b_.getDoubleTy();
  }
  return nullptr;
}

Type* ScalarCodegen::compute_type(DType d) {
  if (d == DType::bool_) return b_.getInt1Ty();
  if (d == DType::bfloat16 || d == DType::float16) return b_.getFloatTy();
  return storage_type(d);
}

Value* ScalarCodegen::from_storage(Value* v, DType d) {
  Type* t = v->getType();
  switch (d) {
    case DType::bool_: return b_.CreateICmpNE(v, iconst(t, 0));
    case DType::bfloat16:
      return b_.CreateBitCast(b_.CreateShl(b_.CreateZExt(v, t->getWithNewType(b_.getInt32Ty())), 16),
                              t->getWithNewType(b_.getFloatTy()));
    case DType::float16:
      return b_.CreateFPExt(b_.CreateBitCast(v, t->getWithNewType(b_.getHalfTy())), t->getWithNewType(b_.getFloatTy()));
    default: return v;
  }
}

Value* ScalarCodegen::to_storage(Value* v, DType d) {
  Type* t = v->getType();
  switch (d) {
    case DType::bool_: return b_.CreateZExt(v, t->getWithNewType(b_.getInt8Ty()));
    case DType::bfloat16: {  // round to nearest even; NaN stays a quiet NaN (bfloat16_t::from_float)
      Type* i32 = t->getWithNewType(b_.getInt32Ty());
      Value* u = b_.CreateBitCast(v, i32);
      Value* lsb = b_.CreateAnd(b_.CreateLShr(u, 16), iconst(i32, 1));
      Value* rounded = b_.CreateLShr(b_.CreateAdd(u, b_.CreateAdd(iconst(i32, 0x7fff), lsb)), 16);
      Value* nan = b_.CreateOr(b_.CreateLShr(u, 16), iconst(i32, 0x40));
      Value* is_nan = b_.CreateICmpUGT(b_.CreateAnd(u, iconst(i32, 0x7fffffff)), iconst(i32, 0x7f800000));
      return b_.CreateTrunc(b_.CreateSelect(is_nan, nan, rounded), t->getWithNewType(b_.getInt16Ty()));
    }
    case DType::float16:
      return b_.CreateBitCast(b_.CreateFPTrunc(v, t->getWithNewType(b_.getHalfTy())),
                              t->getWithNewType(b_.getInt16Ty()));
    default: return v;
  }
}

Value* ScalarCodegen::round_to(Value* v, DType d) {
  if (d != DType::bfloat16 && d != DType::float16) return v;
  return from_storage(to_storage(v, d), d);
}

Value* ScalarCodegen::intrinsic(llvm::Intrinsic::ID id, std::initializer_list<Value*> args) {
  return b_.CreateIntrinsic(id, {(*args.begin())->getType()}, llvm::ArrayRef<Value*>(args.begin(), args.size()));
}

Value* ScalarCodegen::libm(std::string_view base, llvm::ArrayRef<Value*> args) {
  Type* t = args[0]->getType();
  std::string name(base);
  if (t->isFloatTy()) name += 'f';
  std::vector<Type*> params(args.size(), t);
  llvm::FunctionCallee f = m_.getOrInsertFunction(name, llvm::FunctionType::get(t, params, false));
  return b_.CreateCall(f, args);
}

Value* ScalarCodegen::max_of(Value* x, Value* y, DType d) {
  if (is_float_like(d)) return fmax(x, y);
  if (d == DType::bool_) return b_.CreateOr(x, y);
  return intrinsic(is_unsigned_like(d) ? llvm::Intrinsic::umax : llvm::Intrinsic::smax, {x, y});
}

Value* ScalarCodegen::min_of(Value* x, Value* y, DType d) {
  if (is_float_like(d)) return fmin(x, y);
  if (d == DType::bool_) return b_.CreateAnd(x, y);
  return intrinsic(is_unsigned_like(d) ? llvm::Intrinsic::umin : llvm::Intrinsic::smin, {x, y});
}

const char* ScalarCodegen::libm_name(ScalarOp op) {
  switch (op) {
    case ScalarOp::Logistic: return "exp";  // 1 / (1 + exp(-x))
    case ScalarOp::Exp: return "exp";
    case ScalarOp::Exp2: return "exp2";
    case ScalarOp::Log: return "log";
    case ScalarOp::Log1p: return "log1p";
    case ScalarOp::Expm1: return "expm1";
    case ScalarOp::Tanh: return "tanh";
    case ScalarOp::Sin: return "sin";
    case ScalarOp::Cos: return "cos";
    case ScalarOp::Tan: return "tan";
    case ScalarOp::Asin: return "asin";
    case ScalarOp::Acos: return "acos";
    case ScalarOp::Atan: return "atan";
    case ScalarOp::Sinh: return "sinh";
    case ScalarOp::Cosh: return "cosh";
    case ScalarOp::Asinh: return "asinh";
    case ScalarOp::Acosh: return "acosh";
    case ScalarOp::Atanh: return "atanh";
    case ScalarOp::Cbrt: return "cbrt";
    case ScalarOp::Erf: return "erf";
    case ScalarOp::Erfc: return "erfc";
    case ScalarOp::Pow: return "pow";
    case ScalarOp::Atan2: return "atan2";
    case ScalarOp::Nextafter: return "nextafter";
    default: return nullptr;
  }
}

bool ScalarCodegen::calls_libm(ScalarOp op, DType dtype) {
  return libm_name(op) && !cpu::has_math_approx(op, compute_type(compute_dtype(dtype)));
}

Value* ScalarCodegen::transcendental(ScalarOp op, std::vector<Value*> a) {
  if (Value* v = cpu::emit_math_approx(b_, op, a)) return v;
  const char* name = libm_name(op);
  if (!name) throw Error(fmt::format("internal: no code generation for {}", scalar_op_info(op).name));
  if (a[0]->getType()->isVectorTy()) throw Error("internal: a libm call in a streaming kernel pass");
  if (op == ScalarOp::Logistic) {
    Value* one = fconst(a[0]->getType(), 1.0);
    return b_.CreateFDiv(one, b_.CreateFAdd(one, libm(name, {b_.CreateFNeg(a[0])})));
  }
  return libm(name, a);
}

Value* ScalarCodegen::scalar(ScalarOp op, DType d, std::vector<Value*> a) {
  Type* t = a[0]->getType();
  bool fl = is_float_like(d), un = is_unsigned_like(d), bl = d == DType::bool_;
  Value* x = a[0];
  Value* y = a.size() > 1 ? a[1] : nullptr;
  Value* zero = fl ? fconst(t, 0) : iconst(t, 0);
  switch (op) {
    case ScalarOp::Neg: return bl ? x : fl ? b_.CreateFNeg(x) : b_.CreateSub(zero, x);
    case ScalarOp::Sign: {
      if (bl) return x;
      if (fl) {
        Value* s = b_.CreateSelect(b_.CreateFCmpOGT(x, zero), fconst(t, 1),
                                   b_.CreateSelect(b_.CreateFCmpOLT(x, zero), fconst(t, -1), zero));
        return b_.CreateSelect(b_.CreateFCmpUNO(x, x), x, s);
      }
      if (un) return b_.CreateZExt(b_.CreateICmpUGT(x, zero), t);
      return b_.CreateSelect(b_.CreateICmpSGT(x, zero), iconst(t, 1),
                             b_.CreateSelect(b_.CreateICmpSLT(x, zero), iconst(t, -1), zero));
    }
    case ScalarOp::Abs:
      if (fl) return intrinsic(llvm::Intrinsic::fabs, {x});
      if (un) return x;
      return b_.CreateIntrinsic(llvm::Intrinsic::abs, {t}, {x, b_.getFalse()});
    case ScalarOp::Floor: return intrinsic(llvm::Intrinsic::floor, {x});
    case ScalarOp::Ceil: return intrinsic(llvm::Intrinsic::ceil, {x});
    case ScalarOp::Round: return intrinsic(llvm::Intrinsic::roundeven, {x});
    case ScalarOp::IsFinite: return b_.CreateFCmpOLT(intrinsic(llvm::Intrinsic::fabs, {x}), fconst(t, HUGE_VAL));
    case ScalarOp::Sqrt: return intrinsic(llvm::Intrinsic::sqrt, {x});
    case ScalarOp::Rsqrt: return b_.CreateFDiv(fconst(t, 1), intrinsic(llvm::Intrinsic::sqrt, {x}));
    case ScalarOp::Not: return b_.CreateNot(x);
    case ScalarOp::Square: return fl ? b_.CreateFMul(x, x) : b_.CreateMul(x, x);
    case ScalarOp::Add: return fl ? b_.CreateFAdd(x, y) : bl ? b_.CreateOr(x, y) : b_.CreateAdd(x, y);
    case ScalarOp::Sub: return fl ? b_.CreateFSub(x, y) : bl ? b_.CreateXor(x, y) : b_.CreateSub(x, y);
    case ScalarOp::Mul: return fl ? b_.CreateFMul(x, y) : bl ? b_.CreateAnd(x, y) : b_.CreateMul(x, y);
    case ScalarOp::Div: {
      if (fl) return b_.CreateFDiv(x, y);
      // XLA: x / 0 = -1 (all ones); INT_MIN / -1 = INT_MIN.
      Value* by_zero = b_.CreateICmpEQ(y, zero);
      if (un)
        return b_.CreateSelect(by_zero, iconst(t, -1), b_.CreateUDiv(x, b_.CreateSelect(by_zero, iconst(t, 1), y)));
      Value* ovf = b_.CreateAnd(b_.CreateICmpEQ(x, llvm::ConstantInt::get(t, llvm::APInt::getSignedMinValue(
                                                                                 t->getScalarSizeInBits()))),
                                b_.CreateICmpEQ(y, iconst(t, -1)));
      Value* safe = b_.CreateSelect(b_.CreateOr(by_zero, ovf), iconst(t, 1), y);
      return b_.CreateSelect(by_zero, iconst(t, -1), b_.CreateSelect(ovf, x, b_.CreateSDiv(x, safe)));
    }
    case ScalarOp::Rem: {
      if (fl) return b_.CreateFRem(x, y);
      Value* by_zero = b_.CreateICmpEQ(y, zero);
      if (un) return b_.CreateSelect(by_zero, x, b_.CreateURem(x, b_.CreateSelect(by_zero, iconst(t, 1), y)));
      Value* m1 = b_.CreateICmpEQ(y, iconst(t, -1));
      Value* safe = b_.CreateSelect(b_.CreateOr(by_zero, m1), iconst(t, 1), y);
      return b_.CreateSelect(by_zero, x, b_.CreateSelect(m1, zero, b_.CreateSRem(x, safe)));
    }
    case ScalarOp::Max: return max_of(x, y, d);
    case ScalarOp::Min: return min_of(x, y, d);
    case ScalarOp::And: return b_.CreateAnd(x, y);
    case ScalarOp::Or: return b_.CreateOr(x, y);
    case ScalarOp::Xor: return b_.CreateXor(x, y);
    case ScalarOp::ShiftLeft:
    case ScalarOp::ShiftRightLogical:
    case ScalarOp::ShiftRightArithmetic: {
      unsigned bits = t->getScalarSizeInBits();
      Value* out_of_range = b_.CreateICmpUGE(y, iconst(t, bits));  // negative counts are huge unsigned
      if (op == ScalarOp::ShiftLeft) return b_.CreateSelect(out_of_range, zero, b_.CreateShl(x, y));
      if (op == ScalarOp::ShiftRightLogical) return b_.CreateSelect(out_of_range, zero, b_.CreateLShr(x, y));
      return b_.CreateSelect(out_of_range, b_.CreateAShr(x, iconst(t, bits - 1)), b_.CreateAShr(x, y));
    }
    case ScalarOp::Eq: return fl ? b_.CreateFCmpOEQ(x, y) : b_.CreateICmpEQ(x, y);
    case ScalarOp::Ne: return fl ? b_.CreateFCmpUNE(x, y) : b_.CreateICmpNE(x, y);
    case ScalarOp::Lt: return fl ? b_.CreateFCmpOLT(x, y) : un ? b_.CreateICmpULT(x, y) : b_.CreateICmpSLT(x, y);
    case ScalarOp::Le: return fl ? b_.CreateFCmpOLE(x, y) : un ? b_.CreateICmpULE(x, y) : b_.CreateICmpSLE(x, y);
    case ScalarOp::Gt: return fl ? b_.CreateFCmpOGT(x, y) : un ? b_.CreateICmpUGT(x, y) : b_.CreateICmpSGT(x, y);
    case ScalarOp::Ge: return fl ? b_.CreateFCmpOGE(x, y) : un ? b_.CreateICmpUGE(x, y) : b_.CreateICmpSGE(x, y);
    case ScalarOp::Clamp: return min_of(max_of(a[1], a[0], d), a[2], d);  // clamp(lo, x, hi)
    default: return transcendental(op, std::move(a));
  }
}

Value* ScalarCodegen::convert(Value* v, DType from, DType to) {
  Type* dst = v->getType()->getWithNewType(compute_type(to));
  Type* src = v->getType();
  if (src == dst) return v;
  bool ffrom = is_float_like(from), fto = is_float_like(to);
  if (ffrom && fto)
    return src->getPrimitiveSizeInBits() < dst->getPrimitiveSizeInBits() ? b_.CreateFPExt(v, dst)
                                                                         : b_.CreateFPTrunc(v, dst);
  if (to == DType::bool_) return ffrom ? b_.CreateFCmpUNE(v, fconst(src, 0)) : b_.CreateICmpNE(v, iconst(src, 0));
  if (ffrom)  // NaN -> 0, saturating (XLA's CPU semantics, as the eager kernel)
    return b_.CreateIntrinsic(is_unsigned_integer(to) ? llvm::Intrinsic::fptoui_sat : llvm::Intrinsic::fptosi_sat,
                              {dst, src}, {v});
  if (fto) return is_unsigned_like(from) ? b_.CreateUIToFP(v, dst) : b_.CreateSIToFP(v, dst);
  return b_.CreateIntCast(v, dst, !is_unsigned_like(from));
}

Value* ScalarCodegen::integer_pow(Value* x, int64_t y, DType d) {
  bool fl = is_float_like(d);
  Type* t = x->getType();
  uint64_t e = uint64_t(y < 0 ? -y : y);
  Value* acc = nullptr;
  Value* base = x;
  while (e) {
    if (e & 1) acc = acc ? (fl ? b_.CreateFMul(acc, base) : b_.CreateMul(acc, base)) : base;
    e >>= 1;
    if (e) base = fl ? b_.CreateFMul(base, base) : b_.CreateMul(base, base);
  }
  if (!acc) acc = fl ? fconst(t, 1) : iconst(t, 1);
  if (y < 0 && fl) acc = b_.CreateFDiv(fconst(t, 1), acc);
  return acc;
}

}  // namespace cjax::cpu
