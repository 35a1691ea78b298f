// dot_general's CPU kernel and the GEMM driver behind it (and conv's, backends/cpu/kernels/gemm.h).
//
// The kernel maps any dot_general onto a batched GEMM [B, M, K] x [B, K, N] -> [B, M, N]:
// batch dims collapse to B, lhs free dims to M, rhs free dims to N, contracting dims to K. An
// operand whose dims already form a strided row-major matrix in either orientation is handed to
// the GEMM as is (transpose flag + leading dimension); only operands whose dim groups interleave in
// memory are copied into canonical order first. f32/f64 GEMMs try LIBXSMM (gemm_xsmm.h), then
// OpenBLAS.
#include "core/lax/linalg.h"

#include <absl/hash/hash.h>
#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "backends/cpu/kernels/gemm.h"
#include "backends/cpu/kernels/gemm_choice.h"
#include "backends/cpu/kernels/gemm_xsmm.h"
#include "backends/cpu/kernels/scratch.h"
#include "backends/cpu/kernels/strided_copy.h"
#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/array/primitive.h"
#include "core/array/spmd.h"
#include "core/array/visit_dtype.h"
#include "core/backend/backend.h"
#include "core/backend/parallel.h"
#include "core/lax/scalar_fns.h"
#include "core/lax/shape.h"

namespace cjax::cpu {
namespace {

// Copies the strided view op(X)[b] (rows x cols) of element type S into a contiguous [batch, rows,
// cols] array of D.
template <class S, class D>
void gather_convert(const S* src, const GemmOperand& op, int64_t batch, int64_t rows, int64_t cols, D* dst) {
  int64_t nrows = batch * rows;
  int64_t grain = std::max<int64_t>(1, kCopyGrain / std::max<int64_t>(cols, 1));
  parallel_for(nrows, grain, [&](int64_t b0, int64_t e0) {
    for (int64_t br = b0; br < e0; ++br) {
      int64_t b = br / rows, r = br % rows;
      const S* base = src + op.batch_offset(b);
      D* out = dst + br * cols;
      if (!op.trans) {
        const S* row = base + r * op.ld;
        for (int64_t c = 0; c < cols; ++c) out[c] = D(compute_t<S>(row[c]));
      } else {
        const S* col = base + r;
        for (int64_t c = 0; c < cols; ++c) out[c] = D(compute_t<S>(col[c * op.ld]));
      }
    }
  });
}

template <class T>
void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb,
               T* C, T alpha, T beta, int64_t ldc = 0) {
  auto fa = ta ? CblasTrans : CblasNoTrans, fb = tb ? CblasTrans : CblasNoTrans;
  const blasint ld = blasint(ldc > 0 ? ldc : N);
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, fa, fb, blasint(M), blasint(N), blasint(K), alpha, A, blasint(lda), B, blasint(ldb),
                beta, C, ld);
  else
    cblas_dgemm(CblasRowMajor, fa, fb, blasint(M), blasint(N), blasint(K), alpha, A, blasint(lda), B, blasint(ldb),
                beta, C, ld);
}

// OpenBLAS runs on one thread, always: cjax's pool spreads its calls (row panels of one large
// GEMM, or the entries of a batch). OpenBLAS's own threads spin for a long time after each call
// (2^28 cycles by default), and on a small machine they took the cores from the pool's next
// kernels: a transformer step ran 1.4x slower with multi-threaded OpenBLAS on its large
// projections than with LIBXSMM, although OpenBLAS was faster on those GEMMs alone. With several
// CPU devices, concurrent multi-threaded calls also spun against each other in sched_yield.
//
// The pin happens when libcjax loads, and the worker threads that OpenBLAS started at its own load
// are stopped: they spin in sched_yield for those 2^28 cycles before any call, which on a 2-core
// host took one core from the first compile of every process (a fresh process's first jit
// compile ran 1.5x slower than the same compile later). blas_thread_shutdown_ is OpenBLAS's own
// fork handler (exported by its pthread and OpenMP builds; weak here, so another BLAS links too);
// a later multi-threaded call, e.g. after a program raises openblas_set_num_threads, restarts the
// threads. The setting is process-wide: a program calling OpenBLAS itself gets one thread unless
// it asks for more.
extern "C" int blas_thread_shutdown_(void) __attribute__((weak));
void pin_blas_to_one_thread() {
  static const bool pinned = [] {
    openblas_set_num_threads(1);
    if (blas_thread_shutdown_) blas_thread_shutdown_();
    return true;
  }();
  (void)pinned;
}
const bool g_blas_pinned_at_load = (pin_blas_to_one_thread(), true);

// Batched OpenBLAS GEMM in T (float or double) on operands already of type T, spread over the
// pool: by batch entry, or for one product by panels of C's rows or columns (each a
// single-threaded call over all of K). For one thread count the bits are the same from run to
// run; across thread counts they can differ in the last place, where OpenBLAS's kernels round a
// panel's elements differently from a larger call's (its Haswell kernels do).
template <class T>
void blas_batched(int64_t batch, int64_t M, int64_t N, int64_t K, const GemmOperand& A, const GemmOperand& B, T* C,
                  T alpha, T beta) {
  pin_blas_to_one_thread();
  const T* a = static_cast<const T*>(A.ptr);
  const T* b = static_cast<const T*>(B.ptr);
  double work = double(M) * double(N) * double(K);
  if (batch > 1) {
    int64_t grain = std::max<int64_t>(1, int64_t(65536.0 / std::max(work, 1.0)));
    kernel_parallel_for(batch, grain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i)
        blas_gemm<T>(A.trans, B.trans, M, N, K, a + A.batch_offset(i), A.ld, b + B.batch_offset(i), B.ld, C + i * M * N,
                     alpha, beta);
    });
    return;
  }
  // Panels of ~2^21 multiply-adds or more, at most one per thread: of C's rows (at least 16), or
  // where C has fewer rows than columns, of its columns (at least 64). Each call packs all of the
  // other operand: two 16-row panels of an MLP layer's 32 x 1024 x 1024 product packed its 4 MB
  // weight twice and ran at 1.4x the time of OpenBLAS's own threads (AVX2, Zen 4).
  // Lines per panel of `extent` lines of `per_line` multiply-adds each, at least `least`.
  auto panel = [](int64_t extent, int64_t per_line, int64_t least) {
    return std::max<int64_t>(
        {least, (int64_t(1) << 21) / std::max<int64_t>(1, per_line), (extent + num_threads() - 1) / num_threads()});
  };
  if (M < N) {
    kernel_parallel_for(N, panel(N, M * K, 64), [&](int64_t s, int64_t e) {
      blas_gemm<T>(A.trans, B.trans, M, e - s, K, a, A.ld, b + (B.trans ? s * B.ld : s), B.ld, C + s, alpha, beta, N);
    });
    return;
  }
  kernel_parallel_for(M, panel(M, N * K, 16), [&](int64_t s, int64_t e) {
    blas_gemm<T>(A.trans, B.trans, e - s, N, K, a + (A.trans ? s : s * A.ld), A.ld, b, B.ld, C + s * N, alpha, beta);
  });
}

// Batched GEMM in T (float or double) on operands already of type T, on the library measured to
// be faster for its shape class on this host (gemm_choice.h).
template <class T>
void float_gemm(int64_t batch, int64_t M, int64_t N, int64_t K, const GemmOperand& A, const GemmOperand& B, T* C,
                T alpha = T(1), T beta = T(0)) {
  if (beta == T(0) || beta == T(1)) {  // LIBXSMM's kernels have beta 0 or 1
    ScratchBuffer scratch;             // for measuring the two libraries (gemm_choice.h)
    auto run_once = [&](GemmEngine e) {
      if (!scratch) scratch.reserve(size_t(batch * M * N) * sizeof(T));
      T* out = reinterpret_cast<T*>(scratch.data());
      if (e == GemmEngine::blas || !xsmm_gemm<T>(batch, M, N, K, A, B, out, alpha, T(0)))
        blas_batched<T>(batch, M, N, K, A, B, out, alpha, T(0));
    };
    GemmClass cls =
        gemm_class(std::is_same_v<T, float> ? DType::float32 : DType::float64, batch, M, N, K, A.trans, B.trans);
    if (choose_gemm_engine(cls, run_once) == GemmEngine::xsmm && xsmm_gemm<T>(batch, M, N, K, A, B, C, alpha, beta))
      return;
  }
  blas_batched<T>(batch, M, N, K, A, B, C, alpha, beta);
}

// Wrapping integer arithmetic type: unsigned, at least 32 bits (no promotion to signed int).
template <class T>
using wrap_t = typename scalar::wrap_type<T>::type;  // integer products wrap

// Integer / bool GEMM on canonical contiguous operands A [batch, M, K] and B [batch, K, N] of the
// accumulation type T. Rows of C in parallel, k-blocked so a block of B rows stays in cache.
template <class T>
void int_gemm(int64_t batch, int64_t M, int64_t N, int64_t K, const T* A, const T* B, T* C) {
  int64_t grain = std::max<int64_t>(1, kCopyGrain / std::max<int64_t>(1, N * K / 8));
  constexpr int64_t kb = 256;
  parallel_for(batch * M, grain, [&](int64_t s, int64_t e) {
    for (int64_t row = s; row < e; ++row) {
      int64_t b = row / M;
      const T* arow = A + row * K;
      const T* bmat = B + b * K * N;
      T* crow = C + row * N;
      if constexpr (std::is_same_v<T, bool>) {
        uint8_t* c = reinterpret_cast<uint8_t*>(crow);
        std::memset(c, 0, size_t(N));
        for (int64_t k = 0; k < K; ++k) {
          if (!arow[k]) continue;
          const uint8_t* brow = reinterpret_cast<const uint8_t*>(bmat + k * N);
          for (int64_t j = 0; j < N; ++j) c[j] |= brow[j];
        }
      } else {
        using W = wrap_t<T>;
        for (int64_t j = 0; j < N; ++j) crow[j] = T(0);
        for (int64_t k0 = 0; k0 < K; k0 += kb) {
          int64_t k1 = std::min(K, k0 + kb);
          for (int64_t k = k0; k < k1; ++k) {
            W a = W(arow[k]);
            if (a == 0) continue;
            const T* brow = bmat + k * N;
            for (int64_t j = 0; j < N; ++j) crow[j] = T(W(W(crow[j]) + W(a * W(brow[j]))));
          }
        }
      }
    }
  });
}

bool is_canonical(const GemmOperand& op, int64_t batch, int64_t rows, int64_t cols) {
  return !op.trans && (rows <= 1 || op.ld == cols) &&
         (batch <= 1 || (op.batch_dims.empty() && op.batch_stride == rows * cols));
}

template <class T>
void store_convert(const T* src, void* dst, DType out, int64_t n) {
  visit_dtype(out, [&](auto tag) {
    using O = typename decltype(tag)::type;
    O* d = static_cast<O*>(dst);
    parallel_for(n, kCopyGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        if constexpr (is_half_v<O>)
          d[i] = O(float(src[i]));
        else
          d[i] = O(src[i]);
      }
    });
  });
}

// Copies x (element size es) permuted by perm into dst (contiguous): the shared strided copy,
// which merges runs and cache-blocks transposes.
void permute_copy(const void* src, const Shape& shape, const std::vector<int64_t>& perm, size_t es, void* dst) {
  Shape oshape(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) oshape[i] = shape[size_t(perm[i])];
  strided_copy(dst, row_major_strides(oshape), src, transpose_source_strides(shape, perm), oshape, es);
}

// dot_general's operands as a batched GEMM [B, M, K] x [B, K, N], viewed in place where their
// dims allow (a transpose flag and leading dimension), else copied into canonical order.
struct GemmProblem {
  int64_t B = 1, M = 1, N = 1, K = 1;
  GemmOperand A, Bop;
  ScratchBuffer la, rb;
};
GemmProblem gemm_problem(const Array& lhs, const Array& rhs, const DotDimsParam& dn) {
  const Shape &ls = lhs.shape(), &rs = rhs.shape();
  GemmDims d = gemm_dims(ls, rs, dn);
  GemmProblem g;
  g.B = d.B, g.M = d.M, g.N = d.N, g.K = d.K;
  g.A = GemmOperand{raw_ptr(lhs)};
  g.Bop = GemmOperand{raw_ptr(rhs)};
  if (g.K == 0) return g;
  size_t es = itemsize(lhs.dtype());
  // An operand as [B, rows, cols], viewed in place (gemm_operand_view), else copied into
  // (batch, rows, cols) order.
  auto view = [&](const Array& x, const std::vector<int64_t>& batch, const std::vector<int64_t>& rows,
                  const std::vector<int64_t>& cols, int64_t nrows, int64_t ncols, GemmOperand& op,
                  ScratchBuffer& scratch) {
    if (std::optional<GemmOperand> v = gemm_operand_view(x.shape(), batch, rows, cols)) {
      op = *v;
      op.ptr = raw_ptr(x);
      return;
    }
    std::vector<int64_t> order = batch;
    order.insert(order.end(), rows.begin(), rows.end());
    order.insert(order.end(), cols.begin(), cols.end());
    scratch.reserve(size_t(x.size()) * es);
    permute_copy(raw_ptr(x), x.shape(), order, es, scratch.data());
    op = GemmOperand{scratch.data(), false, std::max<int64_t>(ncols, 1), nrows * ncols, {}};
  };
  view(lhs, dn.lhs_batch, d.lhs_free, dn.lhs_contracting, g.M, g.K, g.A, g.la);    // lhs as [B, M, K]
  view(rhs, dn.rhs_batch, dn.rhs_contracting, d.rhs_free, g.K, g.N, g.Bop, g.rb);  // rhs as [B, K, N]
  return g;
}

std::vector<Array> dot_general_impl(std::span<const Array> in, std::span<const AbstractValue> out_avals,
                                    const Params& p) {
  const Array &lhs = in[0], &rhs = in[1];
  Array out = make_uninitialized(out_avals[0], concrete(lhs)->device());
  if (out.size() == 0) return {out};
  GemmProblem g = gemm_problem(lhs, rhs, *p.object<DotDimsParam>("dimension_numbers"));
  cpu_gemm(lhs.dtype(), out.dtype(), g.B, g.M, g.N, g.K, g.A, g.Bop, raw_ptr(out));
  return {out};
}

void accumulate_into(const Array& lhs, const Array& rhs, const DotDimsParam& dn, double alpha, const Array& acc) {
  DType dt = acc.dtype();
  if ((dt != DType::float32 && dt != DType::float64) || lhs.dtype() != dt || rhs.dtype() != dt)
    throw Error(fmt::format("internal: dot_general_accumulate on {} x {} into {}; only f32 and f64 GEMMs accumulate",
                            dtype_name(lhs.dtype()), dtype_name(rhs.dtype()), dtype_name(dt)));
  if (acc.size() == 0) return;
  GemmProblem g = gemm_problem(lhs, rhs, dn);
  if (g.K == 0) return;  // acc + alpha * 0
  if (dt == DType::float32)
    float_gemm<float>(g.B, g.M, g.N, g.K, g.A, g.Bop, static_cast<float*>(raw_ptr(acc)), float(alpha), 1.0f);
  else
    float_gemm<double>(g.B, g.M, g.N, g.K, g.A, g.Bop, static_cast<double*>(raw_ptr(acc)), alpha, 1.0);
}

// dot_general_accumulate: acc + alpha * lhs.rhs, into a copy of acc, or into acc's own buffer
// when jit says nothing else holds it (param accumulate_in_place; jit/passes.h fuse_gemm_updates).
std::vector<Array> dot_general_accumulate_kernel(std::span<const Array> in, std::span<const AbstractValue> out_avals,
                                                 const Params& p) {
  const auto& dn = *p.object<DotDimsParam>("dimension_numbers");
  if (p.has("accumulate_in_place")) {
    accumulate_into(in[0], in[1], dn, p.get<double>("alpha"), in[2]);
    return {Array(std::make_shared<ConcreteArray>(out_avals[0], concrete(in[2])->buffer()))};
  }
  Array out = make_uninitialized(out_avals[0], concrete(in[2])->device());
  std::memcpy(raw_ptr(out), raw_ptr(in[2]), size_t(in[2].size()) * itemsize(in[2].dtype()));
  accumulate_into(in[0], in[1], dn, p.get<double>("alpha"), out);
  return {out};
}

}  // namespace

void cpu_gemm(DType in, DType out, int64_t batch, int64_t M, int64_t N, int64_t K, const GemmOperand& A,
              const GemmOperand& B, void* C) {
  int64_t csize = batch * M * N;
  if (csize == 0) return;
  if (K == 0) {  // an empty sum: zeros (all-zero bits are zero in every dtype)
    std::memset(C, 0, size_t(csize) * itemsize(out));
    return;
  }
  constexpr int64_t kMaxBlas = std::numeric_limits<blasint>::max();
  bool floating = is_floating(in) || is_floating(out);
  if (floating) {
    if (M > kMaxBlas || N > kMaxBlas || K > kMaxBlas || A.ld > kMaxBlas || B.ld > kMaxBlas)
      throw ValueError(fmt::format("dot_general: a GEMM of size {}x{}x{} exceeds the BLAS index range", M, K, N));
    bool dbl = in == DType::float64 || out == DType::float64;
    auto run = [&](auto ctag) {
      using CT = typename decltype(ctag)::type;
      DType ct = dtype_v<CT>;
      ScratchBuffer sa, sb, sc;
      GemmOperand a = A, b = B;
      if (in != ct) {  // widen (bf16/f16 -> f32, f32 -> f64, ints -> float) into canonical layout
        sa.reserve(size_t(batch * M * K) * sizeof(CT));
        sb.reserve(size_t(batch * K * N) * sizeof(CT));
        visit_dtype(in, [&](auto stag) {
          using S = typename decltype(stag)::type;
          gather_convert(static_cast<const S*>(A.ptr), A, batch, M, K, reinterpret_cast<CT*>(sa.data()));
          gather_convert(static_cast<const S*>(B.ptr), B, batch, K, N, reinterpret_cast<CT*>(sb.data()));
        });
        a = GemmOperand{sa.data(), false, K, M * K, {}};
        b = GemmOperand{sb.data(), false, N, K * N, {}};
      }
      CT* c = static_cast<CT*>(C);
      if (out != ct) {
        sc.reserve(size_t(csize) * sizeof(CT));
        c = reinterpret_cast<CT*>(sc.data());
      }
      float_gemm<CT>(batch, M, N, K, a, b, c);
      if (out != ct) store_convert<CT>(c, C, out, csize);
    };
    if (dbl)
      run(Tag<double>{});
    else
      run(Tag<float>{});
    return;
  }
  // Integers and bool: accumulate in the output type.
  visit_dtype(out, [&](auto otag) {
    using T = typename decltype(otag)::type;
    if constexpr (!is_float_like_v<T>) {
      ScratchBuffer sa, sb;
      const T* a = static_cast<const T*>(A.ptr);
      const T* b = static_cast<const T*>(B.ptr);
      if (in != out || !is_canonical(A, batch, M, K)) {
        sa.reserve(size_t(batch * M * K) * sizeof(T));
        visit_dtype(in, [&](auto stag) {
          using S = typename decltype(stag)::type;
          if constexpr (!is_float_like_v<S>)
            gather_convert(static_cast<const S*>(A.ptr), A, batch, M, K, reinterpret_cast<T*>(sa.data()));
        });
        a = reinterpret_cast<const T*>(sa.data());
      }
      if (in != out || !is_canonical(B, batch, K, N)) {
        sb.reserve(size_t(batch * K * N) * sizeof(T));
        visit_dtype(in, [&](auto stag) {
          using S = typename decltype(stag)::type;
          if constexpr (!is_float_like_v<S>)
            gather_convert(static_cast<const S*>(B.ptr), B, batch, K, N, reinterpret_cast<T*>(sb.data()));
        });
        b = reinterpret_cast<const T*>(sb.data());
      }
      int_gemm<T>(batch, M, N, K, a, b, static_cast<T*>(C));
    }
  });
}

namespace {

const bool g_registered = [] {
  register_kernel("dot_general", Platform::cpu, dot_general_impl);
  register_kernel("dot_general_accumulate", Platform::cpu, dot_general_accumulate_kernel);
  return true;
}();

}  // namespace
}  // namespace cjax::cpu
