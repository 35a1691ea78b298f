#include "backends/cpu/kernels/gemm_xsmm.h"

#include <libxsmm.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <type_traits>

#include "backends/cpu/kernels/scratch.h"
#include "core/array/util.h"
#include "core/backend/parallel.h"

namespace cjax {
namespace {
using cpu::ScratchArray;

constexpr int64_t kTile = 64;  // rows and columns of C per kernel call
// A tile's products over a long K (a weight gradient's 2048 tokens) run in slices of kKSlice, the
// later ones accumulating (beta = 1): a slice's operands stay in the L2 cache. LIBXSMM's AVX2
// kernels streamed a whole 2048 x 64 panel of each operand per tile and ran the sample's weight
// gradients at 91-96 GFLOP/s on a 2-core Zen 4; in slices, 121-141 (the AVX-512 kernels: the
// same speed either way).
constexpr int64_t kKSlice = 256;
// Multiply-adds per pool task (~40 us of work): waking a pool thread costs more than a smaller
// share would save (an MLP step with batch 32 ran 1.3x slower with one task per tile).
constexpr int64_t kTaskWork = int64_t(1) << 23;
// The least work worth a share of its own on another thread (~10 us): a batch of small products
// below kTaskWork in all (attention's 64 heads of 64x64x16) otherwise ran on one thread.
constexpr int64_t kMinShareWork = int64_t(1) << 20;

template <class T>
using Kernel = std::conditional_t<std::is_same_v<T, float>, libxsmm_smmfunction, libxsmm_dmmfunction>;

// LIBXSMM is column major: a tile C (tm x tn, row major, ld ldc) is C^T (tn x tm, column major)
// = op(B)^T (tn x K) * op(A)^T (K x tm). op(B) row major [K, N] is op(B)^T column major with the
// same leading dimension; A row major [M, K] likewise; a transposed A ([K, M] in memory) is
// LIBXSMM's transposed second operand.
template <class T>
Kernel<T> dispatch(int64_t tm, int64_t tn, int64_t K, int64_t ldb, int64_t lda, bool a_trans, int64_t ldc, T beta) {
  libxsmm_blasint m = tn, n = tm, k = K, la = ldb, lb = lda, lc = ldc;
  T alpha = 1;
  int flags = a_trans ? LIBXSMM_GEMM_FLAG_TRANS_B : LIBXSMM_GEMM_FLAG_NONE;
  if constexpr (std::is_same_v<T, float>)
    return libxsmm_smmdispatch(m, n, k, &la, &lb, &lc, &alpha, &beta, &flags, nullptr);
  else
    return libxsmm_dmmdispatch(m, n, k, &la, &lb, &lc, &alpha, &beta, &flags, nullptr);
}

// LIBXSMM's initialization sets OMP_PROC_BIND=TRUE in the environment (putenv) when none of
// GOMP_CPU_AFFINITY, KMP_AFFINITY and OMP_PROC_BIND is set. putenv while another thread reads the
// environment can crash the reader (it may reallocate environ): with the initialization on the
// preparation job's thread, the compile's getenv beside it crashed about 1 run in 20 of the
// sharded transformer sample. The same value is set here, when the library is loaded and before
// any thread of ours exists, so LIBXSMM finds it set and leaves the environment alone.
bool unset_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return !v || !*v;
}
const bool g_affinity_env_set_at_load = [] {
  if (unset_or_empty("GOMP_CPU_AFFINITY") && unset_or_empty("KMP_AFFINITY") && unset_or_empty("OMP_PROC_BIND"))
    setenv("OMP_PROC_BIND", "TRUE", 1);
  return true;
}();

std::atomic<bool> g_initialized{false};
bool g_avx2_kernels = false;  // LIBXSMM generates AVX2 (not AVX-512) kernels: set once, before g_initialized
void init_once() {
  static const bool done = [] {
    if (requested_cpu_isa() == CpuIsa::Avx2) libxsmm_set_target_arch("hsw");  // LIBXSMM's AVX2 kernels
    libxsmm_init();
    g_avx2_kernels = libxsmm_get_target_archid() < LIBXSMM_X86_AVX512;
    g_initialized.store(true, std::memory_order_release);
    return true;
  }();
  (void)done;
}

// alpha * op(X)[b] (rows x cols) copied to a contiguous row-major [batch, rows, cols] buffer.
// Transposed copies use LIBXSMM's transpose kernels (a scalar transposing loop cost more than
// the GEMM itself for an MLP's 32-row products).
template <class T>
ScratchArray<T> pack(int64_t batch, int64_t rows, int64_t cols, const GemmOperand& X, T alpha) {
  ScratchArray<T> out(batch * rows * cols);
  const T* src = static_cast<const T*>(X.ptr);
  int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / (rows * cols));  // >= 64K elements per task
  kernel_parallel_for(batch, grain, [&](int64_t s, int64_t e) {
    for (int64_t b = s; b < e; ++b) {
      const T* sb = src + X.batch_offset(b);
      T* ob = out.data() + b * rows * cols;
      if (X.trans) {
        // X[b] is row major [cols, rows] (ld X.ld): column major rows x cols, transposed.
        libxsmm_otrans(ob, sb, sizeof(T), libxsmm_blasint(rows), libxsmm_blasint(cols), libxsmm_blasint(X.ld),
                       libxsmm_blasint(cols));
        if (alpha != T(1))
          for (int64_t i = 0; i < rows * cols; ++i) ob[i] *= alpha;
      } else {
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = 0; c < cols; ++c) ob[r * cols + c] = alpha * sb[r * X.ld + c];
      }
    }
  });
  return out;
}

// B[b] (K x N, row major, ld B.ld, not transposed) cut into column panels of width tn (the last
// one narrower), each contiguous [K, width]: a tile's kernel then reads its panel row after row,
// instead of one short run per 4 KiB page (ld 1024 floats), which left LIBXSMM at half speed or
// worse on large products wherever the pages' cache placement was unlucky.
template <class T>
ScratchArray<T> pack_panels(int64_t batch, int64_t K, int64_t N, int64_t tn, const GemmOperand& B) {
  ScratchArray<T> out(batch * K * N);
  const T* src = static_cast<const T*>(B.ptr);
  int64_t panels = (N + tn - 1) / tn;
  kernel_parallel_for(batch * panels, 1, [&](int64_t s, int64_t e) {
    for (int64_t w = s; w < e; ++w) {
      int64_t bi = w / panels, j0 = (w % panels) * tn, width = std::min(tn, N - j0);
      const T* sb = src + B.batch_offset(bi) + j0;
      T* ob = out.data() + bi * K * N + j0 * K;
      for (int64_t k = 0; k < K; ++k) std::memcpy(ob + k * width, sb + k * B.ld, size_t(width) * sizeof(T));
    }
  });
  return out;
}

}  // namespace

template <class T>
bool xsmm_gemm(int64_t batch, int64_t M, int64_t N, int64_t K, const GemmOperand& A, const GemmOperand& B, T* C,
               T alpha, T beta) {
  if (beta != T(0) && beta != T(1)) return false;
  if (batch <= 0 || M <= 0 || N <= 0 || K <= 0) return false;
  init_once();
  // The kernels take A as it is (transposed or not) and B row major. A transposed B, or an
  // alpha != 1, is first copied (scaled by alpha: into the smaller operand).
  ScratchArray<T> packed_a, packed_b;
  bool scale_a = alpha != T(1) && M <= N && !B.trans;
  if (scale_a) packed_a = pack<T>(batch, M, K, A, alpha);
  if (B.trans || (alpha != T(1) && !scale_a)) packed_b = pack<T>(batch, K, N, B, scale_a ? T(1) : alpha);
  bool a_trans = A.trans && !packed_a;
  // Edge tiles are smaller: at most four kernel shapes per call (LIBXSMM caches them).
  int64_t tm = std::min(M, kTile), tn = std::min(N, kTile), rm = M % tm, rn = N % tn;
  int64_t tiles_m = (M + tm - 1) / tm, tiles_n = (N + tn - 1) / tn, per_batch = tiles_m * tiles_n;
  // Panels pay off where several row tiles read each one and a panel outgrows the L1 cache; and
  // where B's rows are a multiple of 4 KiB apart (ld 1024 floats), which maps a panel's rows onto a
  // few cache sets: LIBXSMM's AVX2 kernels ran at 0.55-0.6x their speed there (2-core Zen 4:
  // 2048x1024x256 8.4 -> 4.9 ms, 32x1024x1024 576 -> 365 us with panels), its AVX-512 ones at the
  // same speed. A single row tile (M <= 64) reads each panel once: copying B then costs the
  // AVX-512 kernels more than it saves (307 -> 351 us), so only the AVX2 ones get panels there.
  // Rows 2 KiB apart (ld 512 floats) halve the sets a panel spreads over: where B is cold (a
  // training step's weights, read once per step), the AVX2 kernels ran the transformer sample's
  // MLP-in product (2048x512x128) 8-13% faster from panels (in the step, three A/B pairs; with B in
  // cache, the same speed either way). Only with a short K, where the copy is small beside the
  // product.
  ScratchArray<T> panels;
  const int64_t row_bytes = B.ld * int64_t(sizeof(T));
  const bool aliased = row_bytes % 4096 == 0 && K >= 64 && N > tn;
  const bool aliased_2k = g_avx2_kernels && row_bytes % 2048 == 0 && K >= 64 && K <= 256 && N > tn;
  if (!packed_b && ((tiles_m >= 2 && (aliased || aliased_2k || K * tn * int64_t(sizeof(T)) > (int64_t(64) << 10))) ||
                    (aliased && g_avx2_kernels)))
    panels = pack_panels<T>(batch, K, N, tn, B);
  int64_t lda = packed_a ? K : A.ld, ldb = packed_b ? N : B.ld;
  int64_t ldb_full = panels ? tn : ldb, ldb_edge = panels ? rn : ldb;
  // The kernels of a K slice of `kk` (full tiles, then the right, bottom and corner edges).
  using TileKernels = std::array<Kernel<T>, 4>;
  auto kernels_for = [&](int64_t kk, T slice_beta) {
    Kernel<T> full = dispatch<T>(tm, tn, kk, ldb_full, lda, a_trans, N, slice_beta);
    return TileKernels{full, rn ? dispatch<T>(tm, rn, kk, ldb_edge, lda, a_trans, N, slice_beta) : full,
                       rm ? dispatch<T>(rm, tn, kk, ldb_full, lda, a_trans, N, slice_beta) : full,
                       rm && rn ? dispatch<T>(rm, rn, kk, ldb_edge, lda, a_trans, N, slice_beta) : full};
  };
  const int64_t slice = K > 2 * kKSlice ? kKSlice : K, last_slice = K - (K - 1) / slice * slice;
  // The first slice (beta as asked), the later whole ones, and the last (shorter) one.
  const TileKernels first = kernels_for(slice, beta);
  const TileKernels middle = slice < K ? kernels_for(slice, T(1)) : first;
  const TileKernels last = slice < K && last_slice != slice ? kernels_for(last_slice, T(1)) : middle;
  for (const TileKernels* ks : {&first, &middle, &last})
    for (Kernel<T> k : *ks)
      if (!k) return false;
  auto a_of = [&](int64_t bi) {
    return packed_a ? packed_a.data() + bi * M * K : static_cast<const T*>(A.ptr) + A.batch_offset(bi);
  };
  // The first element of B's columns from j0 for batch entry bi.
  auto b_at = [&](int64_t bi, int64_t j0) {
    if (panels) return static_cast<const T*>(panels.data() + bi * K * N + j0 * K);
    return (packed_b ? packed_b.data() + bi * K * N : static_cast<const T*>(B.ptr) + B.batch_offset(bi)) + j0;
  };
  // Tasks of ~kTaskWork, but every thread gets a share once each share is worth waking it for.
  int64_t items = batch * per_batch, grain = std::max<int64_t>(1, kTaskWork / (tm * tn * K));
  if (double(items) * double(tm * tn * K) >= double(kMinShareWork) * num_threads())
    grain = std::min(grain, (items + num_threads() - 1) / num_threads());
  kernel_parallel_for(items, grain, [&](int64_t s, int64_t e) {
    for (int64_t w = s; w < e; ++w) {
      int64_t bi = w / per_batch, t = w % per_batch, i0 = (t / tiles_n) * tm, j0 = (t % tiles_n) * tn;
      bool last_m = rm && i0 + tm > M, last_n = rn && j0 + tn > N;
      const size_t which = last_m ? (last_n ? 3 : 2) : (last_n ? 1 : 0);
      // A slice's B rows are k0 on: in a panel (rows of its width) or in B (rows of ldb).
      const int64_t b_row = panels ? (last_n ? rn : tn) : ldb;
      for (int64_t k0 = 0; k0 < K; k0 += slice) {
        const TileKernels& ks = k0 == 0 ? first : k0 + slice < K ? middle : last;
        ks[which](b_at(bi, j0) + k0 * b_row, a_of(bi) + (a_trans ? i0 + k0 * lda : i0 * lda + k0),
                  C + bi * M * N + i0 * N + j0);
      }
    }
  });
  return true;
}

void prepare_xsmm() { init_once(); }
bool xsmm_prepared() { return g_initialized.load(std::memory_order_acquire); }

template bool xsmm_gemm<float>(int64_t, int64_t, int64_t, int64_t, const GemmOperand&, const GemmOperand&, float*,
                               float, float);
template bool xsmm_gemm<double>(int64_t, int64_t, int64_t, int64_t, const GemmOperand&, const GemmOperand&, double*,
                                double, double);

}  // namespace cjax
