// The scalar semantics of kernel nodes as LLVM IR: the ops of core/lax/scalar_fns.h (NaN-propagating
// max/min, XLA's integer division and shift rules, saturating float-to-int conversions), storage
// <-> compute conversions (bf16/f16 computed in f32 and rounded after every op), and the libm
// fallback for transcendentals without an inline approximation (llvm_math.h). Every function
// works on scalars and on fixed vectors alike, keeping its operands' shape.
#pragma once
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>

#include <cstdint>
#include <initializer_list>
#include <string_view>
#include <vector>

#include "cjax/dtype.h"
#include "core/backend/scalar_ops.h"

namespace cjax::cpu {

inline bool is_float_like(DType d) { return is_floating(d); }
inline bool is_unsigned_like(DType d) { return d == DType::bool_ || is_unsigned_integer(d); }

class ScalarCodegen {
 public:
  explicit ScalarCodegen(llvm::Module& m) : ctx_(m.getContext()), m_(m), b_(ctx_) {}

 protected:
  using Type = llvm::Type;
  using Value = llvm::Value;
  llvm::LLVMContext& ctx_;
  llvm::Module& m_;
  llvm::IRBuilder<> b_;

  // storage_type/compute_type are element types (GEPs index by them).
  Type* storage_type(DType d);
  Type* compute_type(DType d);
  // Conversions between storage and compute values; they keep v's shape (scalar or vector).
  Value* from_storage(Value* v, DType d);
  Value* to_storage(Value* v, DType d);
  // bf16/f16 results are rounded after every op, as the eager kernels do.
  Value* round_to(Value* v, DType d);

  Value* intrinsic(llvm::Intrinsic::ID id, std::initializer_list<Value*> args);
  Value* libm(std::string_view base, llvm::ArrayRef<Value*> args);
  Value* fconst(Type* t, double v) { return llvm::ConstantFP::get(t, v); }
  Value* iconst(Type* t, int64_t v) { return llvm::ConstantInt::get(t, uint64_t(v), true); }

  // ---- scalar ops (semantics of core/lax/scalar_fns.h) ----
  Value* fmax(Value* x, Value* y) { return intrinsic(llvm::Intrinsic::maximum, {x, y}); }
  Value* fmin(Value* x, Value* y) { return intrinsic(llvm::Intrinsic::minimum, {x, y}); }
  Value* max_of(Value* x, Value* y, DType d);
  Value* min_of(Value* x, Value* y, DType d);

  // The libm function (float: with an f suffix) computing `op` where it has no inline version.
  static const char* libm_name(ScalarOp op);
  // True when `op` on `dtype` values is a libm call per element (no inline version).
  bool calls_libm(ScalarOp op, DType dtype);

  Value* transcendental(ScalarOp op, std::vector<Value*> a);

  Value* scalar(ScalarOp op, DType d, std::vector<Value*> a);

  Value* convert(Value* v, DType from, DType to);

  Value* integer_pow(Value* x, int64_t y, DType d);
};

}  // namespace cjax::cpu
