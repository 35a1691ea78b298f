// CUDA C++ for the elementwise primitives, generated from the scalar-op table (core/backend/scalar_ops.h)
// with the eager CPU semantics of core/lax/scalar_fns.h: integer arithmetic wraps, integer division
// by zero gives -1, float max/min propagate NaN, bf16/f16 compute in f32 and round to nearest even.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "cjax/dtype.h"
#include "core/backend/scalar_ops.h"

namespace cjax::cuda {

inline constexpr const char* kElementwiseKernelName = "cj_elementwise";
inline constexpr int kElementwiseThreads = 256;  // threads per block
inline constexpr int kElementwisePerThread = 4;  // elements per thread, strided by the block

// The kernel `out[i] = op(in_0[i or 0], ...)` for i < n (an operand marked scalar is read at 0),
// or nullopt when the op/dtype pair has no GPU expression yet (the primitive then falls back to
// the host, counted). Signature: (const In* in_0, ..., Out* out, long long n).
std::optional<std::string> elementwise_source(ScalarOp op, DType in, DType out, const std::vector<bool>& scalar);
// select_n(which, case_0, ...) with a bool or int32 selector (clamped to the cases).
std::string select_n_source(DType which, DType t, size_t ncases, bool scalar_which);
// integer_pow(x, y): exponentiation by squaring in the compute type, as the CPU kernel.
std::optional<std::string> integer_pow_source(DType d);
// threefry2x32(k0, k1, x0, x1) -> (y0, y1), bit-exact with the CPU (operands marked scalar read at 0).
std::string threefry_source(const std::vector<bool>& scalar);
// convert_element_type between float dtypes, and from integers and bool to floats.
std::optional<std::string> convert_source(DType in, DType out);

}  // namespace cjax::cuda
