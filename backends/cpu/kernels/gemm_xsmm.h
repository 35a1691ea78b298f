// f32/f64 GEMMs on LIBXSMM's JIT-generated kernels (the host's widest vectors: AVX-512 here),
// tiled and run on the runtime's thread pool. cpu_gemm (gemm.h) runs it where it is measured to
// beat OpenBLAS for the shape class on this host (gemm_choice.h), and OpenBLAS for what it declines.
//
// Why not OpenBLAS for everything: its per-call overhead dominates the many small GEMMs of
// attention (64x64x16: ~1.5 us per call, 90 GFLOP/s per core, against ~225 with LIBXSMM), and
// OpenBLAS picks its kernels by OPENBLAS_CORETYPE, which some machines pin to an older core
// (this one: Haswell's AVX2 kernels, half the AVX-512 rate). LIBXSMM generates kernels for the
// CPU it runs on.
//
// The tiling: C (M x N, row major) is cut into tiles of up to 64 x 64; one LIBXSMM kernel
// computes a tile over the whole K, reading A and B in place (no packing) except a transposed B,
// which is first copied to row major [K, N], and an alpha != 1, folded into a scaled copy of
// the smaller operand (LIBXSMM's kernels have alpha = 1, beta = 0 or 1). Work items are (batch, tile) pairs, spread
// over the pool (inside a parallel region, e.g. one SPMD device's task, they run serially). Each tile's sum runs in a
// fixed order, so results do not depend on the thread count.
#pragma once
#include <cstdint>

#include "core/lax/linalg.h"

namespace cjax {

// C[b] (M x N, row major, contiguous) = alpha * op(A)[b] op(B)[b] + beta * C[b] for b < batch.
// Returns false, doing nothing, when the case is not handled here: beta not 0 or 1, or no kernel
// for the shape (the caller then calls BLAS).
template <class T>
bool xsmm_gemm(int64_t batch, int64_t M, int64_t N, int64_t K, const GemmOperand& A, const GemmOperand& B, T* C,
               T alpha, T beta);

// LIBXSMM's one-time initialization (its code registry and CPU dispatch: ~7 ms on a Zen 5), which
// the first GEMM otherwise pays. Thread safe: a GEMM that starts meanwhile waits for it.
void prepare_xsmm();
// Whether prepare_xsmm (or a GEMM) has initialized LIBXSMM already.
bool xsmm_prepared();

}  // namespace cjax
