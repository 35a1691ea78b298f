// dot_general: JAX's general tensor contraction, and the CPU GEMM driver behind it (and conv).
//
// The eager kernel maps any dot_general onto a batched GEMM [B, M, K] x [B, K, N] -> [B, M, N]:
// batch dims collapse to B, lhs free dims to M, rhs free dims to N, contracting dims to K. An
// operand whose dims already form a strided row-major matrix in either orientation is handed to
// BLAS as is (transpose flag + leading dimension); only operands whose dim groups interleave in
// memory are copied into canonical order first.
#include "core/linalg.h"

#include <absl/hash/hash.h>
#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "cjax/lax.h"
#include "core/array_impl.h"
#include "core/gemm_xsmm.h"
#include "core/scalar_fns.h"
#include "core/spmd.h"
#include "core/parallel.h"
#include "core/visit_dtype.h"

namespace cjax {

// ---- parameter objects ----
namespace {
std::string list_str(const std::vector<int64_t>& v) { return fmt::format("[{}]", fmt::join(v, ", ")); }
}  // namespace

std::string DotDimsParam::str() const {
  return fmt::format("(({}, {}), ({}, {}))", list_str(lhs_contracting), list_str(rhs_contracting),
                     list_str(lhs_batch), list_str(rhs_batch));
}
size_t DotDimsParam::hash() const { return absl::HashOf(lhs_contracting, rhs_contracting, lhs_batch, rhs_batch); }
bool DotDimsParam::equals(const ParamObject& other) const {
  auto* o = dynamic_cast<const DotDimsParam*>(&other);
  return o && o->lhs_contracting == lhs_contracting && o->rhs_contracting == rhs_contracting &&
         o->lhs_batch == lhs_batch && o->rhs_batch == rhs_batch;
}

namespace {

constexpr int64_t kCopyGrain = 1 << 15;

// Scratch memory, 64-byte aligned (BLAS likes aligned panels).
struct Scratch {
  explicit Scratch(size_t nbytes) : p(static_cast<std::byte*>(::operator new(std::max<size_t>(nbytes, 64), std::align_val_t(64)))) {}
  ~Scratch() { ::operator delete(p, std::align_val_t(64)); }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  std::byte* p;
};

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

template <class T> void blas_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, const T* A, int64_t lda,
                                  const T* B, int64_t ldb, T* C, T alpha, T beta) {
  auto fa = ta ? CblasTrans : CblasNoTrans, fb = tb ? CblasTrans : CblasNoTrans;
  if constexpr (std::is_same_v<T, float>)
    cblas_sgemm(CblasRowMajor, fa, fb, blasint(M), blasint(N), blasint(K), alpha, A, blasint(lda), B, blasint(ldb),
                beta, C, blasint(N));
  else
    cblas_dgemm(CblasRowMajor, fa, fb, blasint(M), blasint(N), blasint(K), alpha, A, blasint(lda), B, blasint(ldb),
                beta, C, blasint(N));
}

// With several CPU devices, every device's worker thread calls BLAS concurrently. OpenBLAS's thread
// pool is process-wide: concurrent multi-threaded calls spin against each other in sched_yield (a
// 2-core machine training on 8 virtual devices spent ~45% of its time there, at half the speed of
// single-threaded BLAS), and the save/restore of BlasSingleThreadScope races between workers. The
// devices are the parallelism then, so OpenBLAS is pinned to one thread for the whole process as
// soon as more than one CPU device exists. One device keeps OpenBLAS's threads for large GEMMs.
void pin_blas_if_multi_device() {
  static const bool pinned = [] {
    if (device_count() <= 1) return false;
    openblas_set_num_threads(1);
    return true;
  }();
  (void)pinned;
}

// Batched BLAS GEMM in T (float or double) on operands already of type T.
template <class T>
void run_blas(int64_t batch, int64_t M, int64_t N, int64_t K, const GemmOperand& A, const GemmOperand& B, T* C,
              T alpha = T(1), T beta = T(0)) {
  pin_blas_if_multi_device();
  if (xsmm_gemm<T>(batch, M, N, K, A, B, C, alpha, beta)) return;
  const T* a = static_cast<const T*>(A.ptr);
  const T* b = static_cast<const T*>(B.ptr);
  auto one = [&](int64_t i) {
    blas_gemm<T>(A.trans, B.trans, M, N, K, a + A.batch_offset(i), A.ld, b + B.batch_offset(i), B.ld, C + i * M * N,
                 alpha, beta);
  };
  double work = double(M) * double(N) * double(K);
  constexpr double kSmall = 128.0 * 128.0 * 128.0;
  if (batch > 1 && work < kSmall && num_threads() > 1 && !in_parallel_region()) {
    // Many small GEMMs: our threads over the batch, each running single-threaded BLAS.
    BlasSingleThreadScope single;
    int64_t grain = std::max<int64_t>(1, int64_t(65536.0 / std::max(work, 1.0)));
    parallel_for(batch, grain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) one(i);
    });
  } else if (in_parallel_region()) {
    BlasSingleThreadScope single;
    for (int64_t i = 0; i < batch; ++i) one(i);
  } else {
    for (int64_t i = 0; i < batch; ++i) one(i);  // large GEMMs: OpenBLAS threads each one
  }
}

// Wrapping integer arithmetic type: unsigned, at least 32 bits (no promotion to signed int).
template <class T> using wrap_t = typename scalar::wrap_type<T>::type;  // integer products wrap

// Integer / bool GEMM on canonical contiguous operands A [batch, M, K] and B [batch, K, N] of the
// accumulation type T. Rows of C in parallel, k-blocked so a block of B rows stays in cache.
template <class T> void int_gemm(int64_t batch, int64_t M, int64_t N, int64_t K, const T* A, const T* B, T* C) {
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

template <class T> void store_convert(const T* src, void* dst, DType out, int64_t n) {
  visit_dtype(out, [&](auto tag) {
    using O = typename decltype(tag)::type;
    O* d = static_cast<O*>(dst);
    parallel_for(n, kCopyGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) {
        if constexpr (is_half_v<O>) d[i] = O(float(src[i]));
        else d[i] = O(src[i]);
      }
    });
  });
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
      std::unique_ptr<Scratch> sa, sb, sc;
      GemmOperand a = A, b = B;
      if (in != ct) {  // widen (bf16/f16 -> f32, f32 -> f64, ints -> float) into canonical layout
        sa = std::make_unique<Scratch>(size_t(batch * M * K) * sizeof(CT));
        sb = std::make_unique<Scratch>(size_t(batch * K * N) * sizeof(CT));
        visit_dtype(in, [&](auto stag) {
          using S = typename decltype(stag)::type;
          gather_convert(static_cast<const S*>(A.ptr), A, batch, M, K, reinterpret_cast<CT*>(sa->p));
          gather_convert(static_cast<const S*>(B.ptr), B, batch, K, N, reinterpret_cast<CT*>(sb->p));
        });
        a = GemmOperand{sa->p, false, K, M * K, {}};
        b = GemmOperand{sb->p, false, N, K * N, {}};
      }
      CT* c = static_cast<CT*>(C);
      if (out != ct) {
        sc = std::make_unique<Scratch>(size_t(csize) * sizeof(CT));
        c = reinterpret_cast<CT*>(sc->p);
      }
      run_blas<CT>(batch, M, N, K, a, b, c);
      if (out != ct) store_convert<CT>(c, C, out, csize);
    };
    if (dbl) run(Tag<double>{});
    else run(Tag<float>{});
    return;
  }
  // Integers and bool: accumulate in the output type.
  visit_dtype(out, [&](auto otag) {
    using T = typename decltype(otag)::type;
    if constexpr (!is_float_like_v<T>) {
      std::unique_ptr<Scratch> sa, sb;
      const T* a = static_cast<const T*>(A.ptr);
      const T* b = static_cast<const T*>(B.ptr);
      if (in != out || !is_canonical(A, batch, M, K)) {
        sa = std::make_unique<Scratch>(size_t(batch * M * K) * sizeof(T));
        visit_dtype(in, [&](auto stag) {
          using S = typename decltype(stag)::type;
          if constexpr (!is_float_like_v<S>)
            gather_convert(static_cast<const S*>(A.ptr), A, batch, M, K, reinterpret_cast<T*>(sa->p));
        });
        a = reinterpret_cast<const T*>(sa->p);
      }
      if (in != out || !is_canonical(B, batch, K, N)) {
        sb = std::make_unique<Scratch>(size_t(batch * K * N) * sizeof(T));
        visit_dtype(in, [&](auto stag) {
          using S = typename decltype(stag)::type;
          if constexpr (!is_float_like_v<S>)
            gather_convert(static_cast<const S*>(B.ptr), B, batch, K, N, reinterpret_cast<T*>(sb->p));
        });
        b = reinterpret_cast<const T*>(sb->p);
      }
      int_gemm<T>(batch, M, N, K, a, b, static_cast<T*>(C));
    }
  });
}

namespace {

// ---- strided layout analysis ----

// Collapses `dims` (in this logical order) of a row-major array into one strided dim. Size-1
// dims are ignored. Returns false when the dims do not form one arithmetic progression in
// memory; `stride` is 0 when the group has size 1.
bool collapse(const Shape& shape, const std::vector<int64_t>& strides, const std::vector<int64_t>& dims,
              int64_t& stride) {
  stride = 0;
  int64_t expect = -1;
  for (size_t i = dims.size(); i-- > 0;) {
    int64_t d = dims[i];
    if (shape[size_t(d)] == 1) continue;
    if (expect < 0) {
      stride = strides[size_t(d)];
    } else if (strides[size_t(d)] != expect) {
      return false;
    }
    expect = strides[size_t(d)] * shape[size_t(d)];
  }
  return true;
}

int64_t group_size(const Shape& shape, const std::vector<int64_t>& dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= shape[size_t(d)];
  return n;
}

// Tries to view an operand as a batch of matrices whose rows are `outer` dims and columns `inner`
// dims (stored orientation). On success fills ld and batch_stride.
bool try_view(const Shape& shape, const std::vector<int64_t>& batch, const std::vector<int64_t>& outer,
              const std::vector<int64_t>& inner, GemmOperand& op) {
  auto strides = row_major_strides(shape);
  int64_t si, so, sb;
  if (!collapse(shape, strides, inner, si) || !collapse(shape, strides, outer, so)) return false;
  int64_t ninner = group_size(shape, inner);
  if (si != 0 && si != 1) return false;
  int64_t ld = so == 0 ? std::max<int64_t>(1, ninner) : so;
  if (ld < std::max<int64_t>(1, ninner)) return false;
  op.ld = ld;
  op.batch_dims.clear();
  if (collapse(shape, strides, batch, sb)) {
    op.batch_stride = sb;
  } else {  // batch dims interleaved with the matrix dims: one (extent, stride) per batch dim
    op.batch_stride = 0;
    for (int64_t d : batch) op.batch_dims.emplace_back(shape[size_t(d)], strides[size_t(d)]);
  }
  return true;
}

// Copies x (element size es) permuted by perm into dst (contiguous).
template <size_t ES> void permute_copy_t(const std::byte* src, const Shape& shape, const std::vector<int64_t>& perm,
                                         std::byte* dst) {
  size_t nd = perm.size();
  auto sstr = row_major_strides(shape);
  Shape oshape(nd);
  std::vector<int64_t> pstr(nd);
  for (size_t i = 0; i < nd; ++i) {
    oshape[i] = shape[size_t(perm[i])];
    pstr[i] = sstr[size_t(perm[i])];
  }
  int64_t total = shape_size(oshape);
  if (total == 0) return;
  if (nd == 0) {
    std::memcpy(dst, src, ES);
    return;
  }
  int64_t inner = oshape[nd - 1], istr = pstr[nd - 1];
  int64_t nrows = total / inner;
  int64_t grain = std::max<int64_t>(1, kCopyGrain / inner);
  parallel_for(nrows, grain, [&](int64_t s, int64_t e) {
    std::vector<int64_t> idx(nd, 0);
    int64_t rem = s, off = 0;
    for (size_t i = nd - 1; i-- > 0;) {
      idx[i] = rem % oshape[i];
      rem /= oshape[i];
      off += idx[i] * pstr[i];
    }
    for (int64_t r = s; r < e; ++r) {
      std::byte* o = dst + size_t(r * inner) * ES;
      const std::byte* in = src + size_t(off) * ES;
      for (int64_t j = 0; j < inner; ++j) std::memcpy(o + size_t(j) * ES, in + size_t(j * istr) * ES, ES);
      for (size_t i = nd - 1; i-- > 0;) {  // odometer over the outer dims
        off += pstr[i];
        if (++idx[i] < oshape[i]) break;
        off -= pstr[i] * oshape[i];
        idx[i] = 0;
      }
    }
  });
}
void permute_copy(const void* src, const Shape& shape, const std::vector<int64_t>& perm, size_t es, void* dst) {
  auto s = static_cast<const std::byte*>(src);
  auto d = static_cast<std::byte*>(dst);
  switch (es) {
    case 1: return permute_copy_t<1>(s, shape, perm, d);
    case 2: return permute_copy_t<2>(s, shape, perm, d);
    case 4: return permute_copy_t<4>(s, shape, perm, d);
    case 8: return permute_copy_t<8>(s, shape, perm, d);
  }
  throw Error(fmt::format("internal: permute_copy of element size {}", es));
}

std::vector<int64_t> concat(std::initializer_list<const std::vector<int64_t>*> parts) {
  std::vector<int64_t> out;
  for (auto* p : parts) out.insert(out.end(), p->begin(), p->end());
  return out;
}

std::vector<int64_t> free_dims(int64_t ndim, const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  std::vector<int64_t> out;
  for (int64_t d = 0; d < ndim; ++d)
    if (std::find(a.begin(), a.end(), d) == a.end() && std::find(b.begin(), b.end(), d) == b.end()) out.push_back(d);
  return out;
}

Shape take(const Shape& s, const std::vector<int64_t>& dims) {
  Shape out;
  for (int64_t d : dims) out.push_back(s[size_t(d)]);
  return out;
}

void check_dims(const char* which, const char* kind, const std::vector<int64_t>& dims, int64_t ndim) {
  for (int64_t d : dims)
    if (d < 0 || d >= ndim)
      throw ValueError(fmt::format("dot_general: {} {} dimension {} is out of range for an operand of rank {} "
                                   "(dimension numbers must be in 0..{}; lax does not accept negative dims)",
                                   which, kind, d, ndim, ndim - 1));
}

void check_distinct(const char* which, const std::vector<int64_t>& c, const std::vector<int64_t>& b) {
  std::vector<int64_t> all = c;
  all.insert(all.end(), b.begin(), b.end());
  std::sort(all.begin(), all.end());
  if (std::adjacent_find(all.begin(), all.end()) != all.end())
    throw ValueError(fmt::format("dot_general: {} contracting dimensions {} and batch dimensions {} must be "
                                 "distinct (no dimension listed twice)",
                                 which, list_str(c), list_str(b)));
}

std::vector<AbstractValue> dot_general_abstract_eval(std::span<const Array> in, const Params& p) {
  const Array &lhs = in[0], &rhs = in[1];
  auto dn = p.object<DotDimsParam>("dimension_numbers");
  if (lhs.dtype() != rhs.dtype())
    throw DTypeError(fmt::format("dot_general requires lhs and rhs to have the same dtype, got {} and {} "
                                 "(convert one with lax::convert_element_type, or use jnp.matmul / jnp.dot, which "
                                 "promote)",
                                 dtype_name(lhs.dtype()), dtype_name(rhs.dtype())));
  check_dims("lhs", "contracting", dn->lhs_contracting, lhs.ndim());
  check_dims("rhs", "contracting", dn->rhs_contracting, rhs.ndim());
  check_dims("lhs", "batch", dn->lhs_batch, lhs.ndim());
  check_dims("rhs", "batch", dn->rhs_batch, rhs.ndim());
  check_distinct("lhs", dn->lhs_contracting, dn->lhs_batch);
  check_distinct("rhs", dn->rhs_contracting, dn->rhs_batch);
  if (dn->lhs_batch.size() != dn->rhs_batch.size())
    throw ShapeError(fmt::format("dot_general requires equal numbers of lhs and rhs batch dimensions, got lhs batch "
                                 "{} and rhs batch {}",
                                 list_str(dn->lhs_batch), list_str(dn->rhs_batch)));
  if (dn->lhs_contracting.size() != dn->rhs_contracting.size())
    throw ShapeError(fmt::format("dot_general requires equal numbers of lhs and rhs contracting dimensions, got "
                                 "lhs contracting {} and rhs contracting {}",
                                 list_str(dn->lhs_contracting), list_str(dn->rhs_contracting)));
  Shape lb = take(lhs.shape(), dn->lhs_batch), rb = take(rhs.shape(), dn->rhs_batch);
  if (lb != rb)
    throw ShapeError(fmt::format("dot_general requires lhs batch dimensions and rhs batch dimensions to have the "
                                 "same shape, got {} (lhs dims {} of {}) and {} (rhs dims {} of {})",
                                 shape_str(lb), list_str(dn->lhs_batch), shape_str(lhs.shape()), shape_str(rb),
                                 list_str(dn->rhs_batch), shape_str(rhs.shape())));
  Shape lc = take(lhs.shape(), dn->lhs_contracting), rc = take(rhs.shape(), dn->rhs_contracting);
  if (lc != rc)
    throw ShapeError(fmt::format("dot_general requires contracting dimensions to have the same shape, got {} (lhs "
                                 "dims {} of {}) and {} (rhs dims {} of {})",
                                 shape_str(lc), list_str(dn->lhs_contracting), shape_str(lhs.shape()), shape_str(rc),
                                 list_str(dn->rhs_contracting), shape_str(rhs.shape())));
  DType in_dt = lhs.dtype(), out_dt = in_dt;
  bool weak = lhs.weak_type() && rhs.weak_type();
  if (auto* pet = std::get_if<DType>(&p.at("preferred_element_type"))) {
    out_dt = *pet;
    weak = weak && out_dt == in_dt;  // jnp passes the input dtype: jnp.dot(2., 3.) stays weak
    bool in_f = is_floating(in_dt), out_f = is_floating(out_dt);
    if (in_f && !out_f)
      throw DTypeError(fmt::format("dot_general: input type {} is incompatible with preferred_element_type {}; "
                                   "compatible combinations are (integral, integral), (integral, floating) and "
                                   "(floating, floating)",
                                   dtype_name(in_dt), dtype_name(out_dt)));
    if ((in_f == out_f) && in_dt != DType::bool_ && itemsize(out_dt) < itemsize(in_dt))
      throw DTypeError(fmt::format("dot_general: preferred_element_type {} must not be narrower than the input "
                                   "type {}",
                                   dtype_name(out_dt), dtype_name(in_dt)));
  }
  auto lf = free_dims(lhs.ndim(), dn->lhs_contracting, dn->lhs_batch);
  auto rf = free_dims(rhs.ndim(), dn->rhs_contracting, dn->rhs_batch);
  Shape out = lb;
  for (int64_t d : lf) out.push_back(lhs.shape()[size_t(d)]);
  for (int64_t d : rf) out.push_back(rhs.shape()[size_t(d)]);
  return {AbstractValue{out, out_dt, weak, {}}};
}

// dot_general's operands as a batched GEMM [B, M, K] x [B, K, N], viewed in place where their
// dims allow (a transpose flag and leading dimension), else copied into canonical order.
struct GemmProblem {
  int64_t B = 1, M = 1, N = 1, K = 1;
  GemmOperand A, Bop;
  std::unique_ptr<Scratch> la, rb;
};
GemmProblem gemm_problem(const Array& lhs, const Array& rhs, const DotDimsParam& dn) {
  const auto &lb = dn.lhs_batch, &rb = dn.rhs_batch, &lc = dn.lhs_contracting, &rc = dn.rhs_contracting;
  auto lf = free_dims(lhs.ndim(), lc, lb);
  auto rf = free_dims(rhs.ndim(), rc, rb);
  const Shape &ls = lhs.shape(), &rs = rhs.shape();
  GemmProblem g;
  g.B = group_size(ls, lb), g.M = group_size(ls, lf), g.N = group_size(rs, rf), g.K = group_size(ls, lc);
  g.A = GemmOperand{raw_ptr(lhs)};
  g.Bop = GemmOperand{raw_ptr(rhs)};
  if (g.K == 0) return g;
  size_t es = itemsize(lhs.dtype());
  // An operand as [B, rows, cols]: stored (rows, cols) -> no transpose; stored (cols, rows) ->
  // transpose; else copied into (batch, rows, cols) order.
  auto view = [&](const Array& x, const std::vector<int64_t>& batch, const std::vector<int64_t>& rows,
                  const std::vector<int64_t>& cols, int64_t nrows, int64_t ncols, GemmOperand& op,
                  std::unique_ptr<Scratch>& scratch) {
    const Shape& shape = x.shape();
    if (try_view(shape, batch, rows, cols, op)) {
      op.trans = false;
    } else if (try_view(shape, batch, cols, rows, op)) {
      op.trans = true;
    } else {
      scratch = std::make_unique<Scratch>(size_t(x.size()) * es);
      permute_copy(raw_ptr(x), shape, concat({&batch, &rows, &cols}), es, scratch->p);
      op = GemmOperand{scratch->p, false, std::max<int64_t>(ncols, 1), nrows * ncols, {}};
    }
  };
  view(lhs, lb, lf, lc, g.M, g.K, g.A, g.la);    // lhs as [B, M, K]
  view(rhs, rb, rc, rf, g.K, g.N, g.Bop, g.rb);  // rhs as [B, K, N]
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

const PrimitiveDef& g_dot_general = register_primitive([] {
  PrimitiveDef def;
  def.name = "dot_general";
  def.kind = PrimKind::Linalg;
  def.arity = Arity::exactly(2);
  def.abstract_eval = dot_general_abstract_eval;
  def.cpu_impl = dot_general_impl;
  return def;
}());

}  // namespace

std::optional<GemmViews> gemm_views(const Shape& ls, const Shape& rs, const DotDimsParam& dn) {
  const auto &lb = dn.lhs_batch, &rb = dn.rhs_batch, &lc = dn.lhs_contracting, &rc = dn.rhs_contracting;
  auto lf = free_dims(int64_t(ls.size()), lc, lb);
  auto rf = free_dims(int64_t(rs.size()), rc, rb);
  GemmViews g;
  g.B = group_size(ls, lb), g.M = group_size(ls, lf), g.N = group_size(rs, rf), g.K = group_size(ls, lc);
  auto view = [](const Shape& shape, const std::vector<int64_t>& batch, const std::vector<int64_t>& rows,
                 const std::vector<int64_t>& cols, GemmOperand& op) {
    if (try_view(shape, batch, rows, cols, op)) op.trans = false;
    else if (try_view(shape, batch, cols, rows, op)) op.trans = true;
    else return false;
    return true;
  };
  if (!view(ls, lb, lf, lc, g.A) || !view(rs, rb, rc, rf, g.Bop)) return std::nullopt;
  return g;
}

void dot_general_accumulate_into(const Array& lhs, const Array& rhs, const DotDimsParam& dn, double alpha,
                                 const Array& acc) {
  DType dt = acc.dtype();
  if ((dt != DType::float32 && dt != DType::float64) || lhs.dtype() != dt || rhs.dtype() != dt)
    throw Error(fmt::format("internal: dot_general_accumulate on {} x {} into {}; only f32 and f64 GEMMs accumulate",
                            dtype_name(lhs.dtype()), dtype_name(rhs.dtype()), dtype_name(dt)));
  if (acc.size() == 0) return;
  GemmProblem g = gemm_problem(lhs, rhs, dn);
  if (g.K == 0) return;  // acc + alpha * 0
  if (dt == DType::float32)
    run_blas<float>(g.B, g.M, g.N, g.K, g.A, g.Bop, static_cast<float*>(raw_ptr(acc)), float(alpha), 1.0f);
  else
    run_blas<double>(g.B, g.M, g.N, g.K, g.A, g.Bop, static_cast<double*>(raw_ptr(acc)), alpha, 1.0);
}

namespace {
// acc + alpha * dot_general(lhs, rhs): introduced by jit's pass fuse_gemm_updates (an SGD step
// `w - lr * dw` whose dw is a dot_general), never traced by users. The executable runs it in
// place over a dying or donated acc; this impl, used otherwise, accumulates into a copy.
const PrimitiveDef& g_dot_general_accumulate = register_primitive([] {
  PrimitiveDef def;
  def.name = "dot_general_accumulate";
  def.kind = PrimKind::Linalg;
  def.arity = Arity::exactly(3);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) {
    Params dp{{"dimension_numbers", p.at("dimension_numbers")}, {"preferred_element_type", std::monostate{}}};
    AbstractValue dot = dot_general_abstract_eval(in.first(2), dp)[0];
    AbstractValue out = in[2].aval();
    if (dot.shape != out.shape || dot.dtype != out.dtype)
      throw ShapeError(fmt::format("dot_general_accumulate: the product is {} but the accumulator is {}", dot.str(),
                                   out.str()));
    for (const Array& x : in) out.vma = vma_union(out.vma, x.aval().vma);  // the standard vma rule
    out.weak_type = false;
    return std::vector<AbstractValue>{out};
  };
  def.cpu_impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
    Array out = make_uninitialized(out_avals[0], concrete(in[2])->device());
    std::memcpy(raw_ptr(out), raw_ptr(in[2]), size_t(in[2].size()) * itemsize(in[2].dtype()));
    dot_general_accumulate_into(in[0], in[1], *p.object<DotDimsParam>("dimension_numbers"), p.get<double>("alpha"),
                                out);
    return std::vector<Array>{out};
  };
  return def;
}());
}  // namespace

namespace prims {
const PrimitiveDef& dot_general() { return g_dot_general; }
}  // namespace prims

namespace lax {
Array dot_general(const Array& lhs, const Array& rhs, const DotDimensionNumbers& dimension_numbers,
                  std::optional<DType> preferred_element_type) {
  auto dn = std::make_shared<DotDimsParam>();
  dn->lhs_contracting = dimension_numbers.contracting.first;
  dn->rhs_contracting = dimension_numbers.contracting.second;
  dn->lhs_batch = dimension_numbers.batch.first;
  dn->rhs_batch = dimension_numbers.batch.second;
  Params params{{"dimension_numbers", std::shared_ptr<const ParamObject>(std::move(dn))},
                {"out_sharding", std::monostate{}},
                {"precision", std::monostate{}},
                {"preferred_element_type", preferred_element_type ? ParamValue(*preferred_element_type)
                                                                  : ParamValue(std::monostate{})}};
  return bind1(prims::dot_general(), {lhs, rhs}, params);
}
}  // namespace lax

}  // namespace cjax
