// The CPU's batched GEMM driver (linalg.cpp), shared by the dot_general and conv kernels.
#pragma once
#include <cstdint>

#include "core/lax/linalg.h"

namespace cjax::cpu {

// C[b] (M x N, row major, contiguous) = op(A)[b] (M x K) * op(B)[b] (K x N) for b < batch.
// `in` is the dtype of A and B, `out` the dtype of C. f32/f64 run through LIBXSMM or OpenBLAS;
// bf16/f16 are widened to f32 (f64 where `out` is f64); integers accumulate in `out`
// (wrapping); bool is or-of-ands. Parallelises over the batch for small GEMMs.
void cpu_gemm(DType in, DType out, int64_t batch, int64_t M, int64_t N, int64_t K, const GemmOperand& A,
              const GemmOperand& B, void* C);

}  // namespace cjax::cpu
