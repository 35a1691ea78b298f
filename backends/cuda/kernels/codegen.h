// Pieces shared by the cuda kernel generators: CUDA C++ types of cjax dtypes, the self-contained
// prelude (no toolkit headers: NVRTC compiles it on any machine), the scalar-op expressions with
// the CPU's semantics (core/lax/scalar_fns.h), and kernel launches.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "cjax/array.h"
#include "cjax/dtype.h"
#include "core/backend/scalar_ops.h"

namespace cjax::cuda {

extern const char* const kPrelude;

bool is_half(DType d);
bool is_float(DType d);
bool is_signed_int(DType d);
std::string storage_type(DType d);                 // the CUDA type an element is stored as ("unsigned short" for bf16)
std::string compute_type(DType d);                 // the type arithmetic happens in (float for bf16/f16)
const char* bits_type(size_t itemsize);            // an unsigned type of that size: copies move raw bits
std::string load(DType d, const std::string& v);   // storage -> compute
std::string store(DType d, const std::string& v);  // compute -> storage (round to nearest even)
// A compute-typed value of `from` as `to`'s compute type, with the CPU's conversion semantics.
std::string convert_expr(DType from, DType to, const std::string& v);
// `op` applied to compute-typed x (and y, z) of dtype d; nullopt where the dtype has no expression.
std::optional<std::string> scalar_expression(ScalarOp op, DType d);
// The lowest and highest values of d's compute type, as CUDA literals (-inf/inf for floats).
std::string lowest_literal(DType d);
std::string highest_literal(DType d);

// The generated library kernels (exposed for the offline NVRTC test): the strided copy of the
// shape primitives (backends/cuda/kernels/shape.cpp) and the reductions (reduce.cpp).
std::string strided_copy_source(size_t itemsize, int rank);
// Block b reduces chunk b % chunks of output b / chunks, reading `in`, writing `out` (the same
// compute type: partial results of bf16 are f32).
std::optional<std::string> reduce_source(const std::string& primitive, DType in, DType out, int kept_rank,
                                         int reduced_rank);

// gather for the leading-batch layout (backends/cuda/kernels/gather.cpp).
std::string gather_source(size_t itemsize, DType index_dtype, int K, int window_rank, bool fill_mode);

// flash_attention's kernels (backends/cuda/kernels/attention.cpp) for one dtype, head width and
// mask: `<prefix>_forward`, `<prefix>_backward_dq` and `<prefix>_backward_dkdv`, 64 threads a
// block, attention_blocks(T) (forward, dq) or attention_blocks(S) (dkdv) blocks per (batch, head).
constexpr int64_t kMaxAttentionHead = 32;
std::string attention_source(DType dtype, int64_t head, bool causal, const std::string& prefix);
// One of them ("forward", "backward_dq", "backward_dkdv") as a whole NVRTC program (prelude
// included), kernel `cj_attention_<kernel>`: the GPU compiles the three side by side.
std::string attention_program(DType dtype, int64_t head, bool causal, const std::string& kernel);
int64_t attention_blocks(int64_t rows);

// Launches kernel `name` of `source` on d's GPU: `args` are pointers to the kernel's arguments.
void launch(const Device& d, const std::string& source, const char* name, unsigned grid, unsigned block,
            std::vector<void*> args);

}  // namespace cjax::cuda
