// dot_general on the GPU through cuBLASLt (dlopened: the library is 0.5 GB and only GPU runs need
// it). A row-major C[b] (M x N) = op(A)[b] op(B)[b] is the column-major C^T = op(B)^T op(A)^T, so
// cuBLASLt's A is our B and its B our A; transposes and batch strides come from the operands'
// views (core/lax/linalg.h gemm_views), so no operand is copied unless its dims interleave. f32
// computes in f32 (no TF32: the CPU's results, PyTorch's default), bf16/f16 in f32, f64 in f64.
// Integer and bool operands run on the host (counted fallback).
#include "core/lax/linalg.h"

#include <absl/container/flat_hash_map.h>
#include <cublasLt.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <memory>
#include <mutex>
#include <numeric>

#include "backends/cuda/cuda_device.h"
#include "cjax/errors.h"
#include "cjax/lax.h"
#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/backend/backend.h"

namespace cjax::cuda {
namespace {

#define CJAX_CUBLASLT_FUNCTIONS(X)        \
  X(cublasLtCreate)                       \
  X(cublasLtGetVersion)                   \
  X(cublasLtMatmul)                       \
  X(cublasLtMatmulDescCreate)             \
  X(cublasLtMatmulDescDestroy)            \
  X(cublasLtMatmulDescSetAttribute)       \
  X(cublasLtMatrixLayoutCreate)           \
  X(cublasLtMatrixLayoutDestroy)          \
  X(cublasLtMatrixLayoutSetAttribute)     \
  X(cublasLtMatmulPreferenceCreate)       \
  X(cublasLtMatmulPreferenceDestroy)      \
  X(cublasLtMatmulPreferenceSetAttribute) \
  X(cublasLtMatmulAlgoGetHeuristic)

struct CublasLt {
#define CJAX_X(f) decltype(&::f) f = nullptr;
  CJAX_CUBLASLT_FUNCTIONS(CJAX_X)
#undef CJAX_X
};

const CublasLt& cublaslt() {
  static const CublasLt api = [] {
    std::string loaded, tried;
    void* lib = open_first_library(toolkit_library_candidates("libcublasLt.so.13"), &loaded, &tried);
    if (!lib) throw BackendError(fmt::format("cuBLASLt (libcublasLt.so.13) not found; tried {}", tried));
    CublasLt a;
#define CJAX_X(f)                                                      \
  a.f = reinterpret_cast<decltype(a.f)>(dlsym(lib, CJAX_CUDA_STR(f))); \
  if (!a.f) throw BackendError("libcublasLt.so.13 lacks " CJAX_CUDA_STR(f));
    CJAX_CUBLASLT_FUNCTIONS(CJAX_X)
#undef CJAX_X
    return a;
  }();
  return api;
}

void check_lt(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw BackendError(fmt::format("{}: cublasStatus {}", what, int(s)));
}

constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // Hopper's recommendation

struct PerDevice {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  absl::flat_hash_map<std::string, cublasLtMatmulAlgo_t> algos;  // heuristic choice per problem
};

// Per cjax device, virtual devices included: one cublasLtMatmul may launch several kernels that
// pass partial results through the workspace (split-K), and the host threads of virtual devices
// on one GPU call it concurrently, so their launches interleave on the shared stream. A workspace
// shared between them let one device's reduction kernel read another's partials (wrong, run-to-run
// varying GEMMs in sharded training steps). Entries stay where they are while others are added.
std::mutex g_mu;
absl::flat_hash_map<int, std::unique_ptr<PerDevice>>& per_device() {
  static absl::flat_hash_map<int, std::unique_ptr<PerDevice>> m;
  return m;
}

std::optional<cudaDataType_t> cuda_type(DType d) {
  switch (d) {
    case DType::float32: return CUDA_R_32F;
    case DType::float64: return CUDA_R_64F;
    case DType::bfloat16: return CUDA_R_16BF;
    case DType::float16: return CUDA_R_16F;
    default: return std::nullopt;
  }
}

// Largest power of two (up to 256) dividing every address: cuBLASLt picks kernels by alignment.
uint32_t alignment(std::initializer_list<uintptr_t> addrs) {
  uint32_t a = 256;
  for (uintptr_t p : addrs)
    while (a > 1 && p % a) a /= 2;
  return a;
}

struct Layout {
  cublasLtMatrixLayout_t h = nullptr;
  Layout(cudaDataType_t t, int64_t rows, int64_t cols, int64_t ld, int64_t batch, int64_t stride) {
    const CublasLt& lt = cublaslt();
    check_lt(lt.cublasLtMatrixLayoutCreate(&h, t, uint64_t(rows), uint64_t(cols), ld), "cublasLtMatrixLayoutCreate");
    if (batch > 1) {
      int32_t count = int32_t(batch);
      check_lt(lt.cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)),
               "BATCH_COUNT");
      check_lt(lt.cublasLtMatrixLayoutSetAttribute(h, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride,
                                                   sizeof(stride)),
               "STRIDED_BATCH_OFFSET");
    }
  }
  ~Layout() { cublaslt().cublasLtMatrixLayoutDestroy(h); }
  Layout(const Layout&) = delete;
  Layout& operator=(const Layout&) = delete;
};

// D = alpha * op(A) op(B) + beta * C in cuBLASLt's column-major terms, over `batch` strided
// matrices (batch 1 for a single GEMM); C has D's layout (C == D accumulates in place).
void lt_matmul(const Device& dev, DType in, DType out, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
               const void* a, int64_t lda, int64_t stride_a, const void* b, int64_t ldb, int64_t stride_b, void* d,
               int64_t batch, double alpha_value, const void* c, double beta) {
  const CublasLt& lt = cublaslt();
  const Driver& api = activate(dev);
  cudaDataType_t tin = *cuda_type(in), tout = *cuda_type(out);
  bool f64 = in == DType::float64;
  cublasComputeType_t compute = f64 ? CUBLAS_COMPUTE_64F : CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = f64 ? CUDA_R_64F : CUDA_R_32F;
  std::unique_lock lock(g_mu);
  std::unique_ptr<PerDevice>& slot = per_device()[dev.id()];
  if (!slot) slot = std::make_unique<PerDevice>();
  PerDevice& pd = *slot;
  if (!pd.handle) {
    check_lt(lt.cublasLtCreate(&pd.handle), "cublasLtCreate");
    CUdeviceptr ws = 0;
    check(api.cuMemAllocAsync(&ws, kWorkspaceBytes, device_stream(dev)), "cuMemAllocAsync (cuBLASLt workspace)");
    pd.workspace = reinterpret_cast<void*>(ws);
  }
  lock.unlock();
  cublasLtMatmulDesc_t desc = nullptr;
  check_lt(lt.cublasLtMatmulDescCreate(&desc, compute, scale), "cublasLtMatmulDescCreate");
  cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, tb = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  lt.cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta));
  lt.cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb));
  Layout la(tin, trans_a ? k : m, trans_a ? m : k, lda, batch, stride_a);
  Layout lb(tin, trans_b ? n : k, trans_b ? k : n, ldb, batch, stride_b);
  Layout ld(tout, m, n, m, batch, m * n);
  uint32_t align = alignment({uintptr_t(a), uintptr_t(b), uintptr_t(d), uintptr_t(c)});
  std::string key = fmt::format("{} {} {} {} {}x{}x{} {} {} {} {} {} {} {}", int(in), int(out), ta, tb, m, n, k, lda,
                                ldb, stride_a, stride_b, batch, align, beta != 0);
  cublasLtMatmulAlgo_t algo;
  lock.lock();
  auto it = pd.algos.find(key);
  bool cached = it != pd.algos.end();
  if (cached) algo = it->second;
  lock.unlock();
  if (!cached) {
    cublasLtMatmulPreference_t pref = nullptr;
    check_lt(lt.cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    uint64_t ws = kWorkspaceBytes;
    lt.cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
      lt.cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    cublasStatus_t s =
        lt.cublasLtMatmulAlgoGetHeuristic(pd.handle, desc, la.h, lb.h, ld.h, ld.h, pref, 1, &result, &found);
    lt.cublasLtMatmulPreferenceDestroy(pref);
    if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
      lt.cublasLtMatmulDescDestroy(desc);
      throw BackendError(fmt::format("cuBLASLt has no algorithm for a {} GEMM {}x{}x{} (batch {}): status {}",
                                     dtype_name(in), m, n, k, batch, int(s)));
    }
    algo = result.algo;
    lock.lock();
    pd.algos.emplace(key, algo);
    lock.unlock();
  }
  float alpha32 = float(alpha_value), beta32 = float(beta);
  double alpha64 = alpha_value, beta64 = beta;
  const void* alpha = f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* betap = f64 ? static_cast<const void*>(&beta64) : &beta32;
  cublasStatus_t s = lt.cublasLtMatmul(pd.handle, desc, alpha, a, la.h, b, lb.h, betap, c, ld.h, d, ld.h, &algo,
                                       pd.workspace, kWorkspaceBytes, compute_stream(dev));
  lt.cublasLtMatmulDescDestroy(desc);
  check_lt(s, "cublasLtMatmul");
}

// out = alpha * dot_general(lhs, rhs) + acc (acc == nullptr: beta 0), or nullopt where cuBLASLt
// cannot take the operands (the caller falls back to the host). With `in_place`, out is acc's
// buffer (D = C).
// Operands whose dims interleave in memory (x[b,s,d] . w[3,d,n,h]: the free dims of w sit on
// both sides of d) are first copied into (batch, free, contracting) and (batch, contracting, free)
// order by the transpose kernel; the output of dot_general is in that order already.
std::optional<Array> gemm(const Array& lhs_in, const Array& rhs_in, const DotDimsParam& dn_in,
                          const AbstractValue& out_aval, double alpha, const Array* acc, bool in_place = false) {
  DType dt = lhs_in.dtype(), out_dt = out_aval.dtype;
  if (!cuda_type(dt) || !cuda_type(out_dt) || (dt == DType::float64) != (out_dt == DType::float64)) return std::nullopt;
  Array lhs = lhs_in, rhs = rhs_in;
  DotDimsParam dn = dn_in;
  std::optional<GemmViews> g = gemm_views(lhs.shape(), rhs.shape(), dn);
  if (!g) {
    auto order = [](int64_t rank, const std::vector<int64_t>& first, const std::vector<int64_t>& last) {
      std::vector<int64_t> perm = first, free;
      for (int64_t d = 0; d < rank; ++d)
        if (std::find(first.begin(), first.end(), d) == first.end() &&
            std::find(last.begin(), last.end(), d) == last.end())
          free.push_back(d);
      perm.insert(perm.end(), free.begin(), free.end());
      perm.insert(perm.end(), last.begin(), last.end());
      return perm;
    };
    std::vector<int64_t> lperm = order(lhs.ndim(), dn_in.lhs_batch, dn_in.lhs_contracting);
    // rhs: batch, contracting, free.
    std::vector<int64_t> rperm = dn_in.rhs_batch;
    rperm.insert(rperm.end(), dn_in.rhs_contracting.begin(), dn_in.rhs_contracting.end());
    for (int64_t d = 0; d < rhs.ndim(); ++d)
      if (std::find(rperm.begin(), rperm.end(), d) == rperm.end()) rperm.push_back(d);
    lhs = lax::transpose(lhs_in, lperm);
    rhs = lax::transpose(rhs_in, rperm);
    int64_t nb = int64_t(dn_in.lhs_batch.size()), nc = int64_t(dn_in.lhs_contracting.size());
    dn = DotDimsParam{};
    for (int64_t b = 0; b < nb; ++b) dn.lhs_batch.push_back(b), dn.rhs_batch.push_back(b);
    for (int64_t c = 0; c < nc; ++c)
      dn.lhs_contracting.push_back(lhs.ndim() - nc + c), dn.rhs_contracting.push_back(nb + c);
    g = gemm_views(lhs.shape(), rhs.shape(), dn);
    if (!g) return std::nullopt;
  }
  Device dev = concrete(lhs)->device();
  in_place = in_place && acc;
  Array out = in_place ? Array(std::make_shared<ConcreteArray>(out_aval, concrete(*acc)->buffer()))
                       : make_uninitialized(out_aval, dev);
  if (out.size() == 0 || (in_place && g->K == 0)) return out;
  const Driver& api = activate(dev);
  size_t out_bytes = size_t(out.size()) * itemsize(out_dt);
  if (g->K == 0) {  // an empty contraction: zeros (or the accumulator)
    CUdeviceptr o = reinterpret_cast<CUdeviceptr>(raw_ptr(out));
    if (acc)
      check(api.cuMemcpyDtoDAsync(o, reinterpret_cast<CUdeviceptr>(raw_ptr(*acc)), out_bytes, compute_stream(dev)),
            "cuMemcpyDtoDAsync");
    else
      check(api.cuMemsetD8Async(o, 0, out_bytes, compute_stream(dev)), "cuMemsetD8Async");
    return out;
  }
  const GemmOperand &A = g->A, &B = g->Bop;
  size_t es = itemsize(dt), os = itemsize(out_dt);
  auto* a0 = static_cast<const std::byte*>(raw_ptr(lhs));
  auto* b0 = static_cast<const std::byte*>(raw_ptr(rhs));
  auto* d0 = static_cast<std::byte*>(raw_ptr(out));
  auto* c0 = acc ? static_cast<const std::byte*>(raw_ptr(*acc)) : d0;
  // cuBLASLt's A = our B (N x K column-major when B is not transposed), its B = our A.
  bool uniform = A.batch_dims.empty() && B.batch_dims.empty();
  int64_t launches = uniform ? 1 : g->B;
  int64_t batch = uniform ? g->B : 1;
  for (int64_t b = 0; b < launches; ++b) {
    size_t out_offset = size_t(b * g->M * g->N) * os;
    lt_matmul(dev, dt, out_dt, B.trans, A.trans, g->N, g->M, g->K, b0 + size_t(B.batch_offset(b)) * es, B.ld,
              B.batch_stride, a0 + size_t(A.batch_offset(b)) * es, A.ld, A.batch_stride, d0 + out_offset, batch, alpha,
              c0 + out_offset, acc ? 1.0 : 0.0);
  }
  return out;
}

std::vector<Array> dot_general_cuda(std::span<const Array> in, std::span<const AbstractValue> out_avals,
                                    const Params& p) {
  if (auto out = gemm(in[0], in[1], *p.object<DotDimsParam>("dimension_numbers"), out_avals[0], 1.0, nullptr))
    return {*out};
  return run_on_host(*find_primitive("dot_general"), Platform::cuda, in, out_avals, p);
}

// jit's fused GEMM update (jit/passes.h fuse_gemm_updates): acc + alpha * lhs.rhs in one cuBLASLt
// call with beta = 1, reading the accumulator as C and writing a new D; in place (D = C) when jit
// says nothing else holds the accumulator (param accumulate_in_place).
std::vector<Array> dot_general_accumulate_cuda(std::span<const Array> in, std::span<const AbstractValue> out_avals,
                                               const Params& p) {
  if (auto out = gemm(in[0], in[1], *p.object<DotDimsParam>("dimension_numbers"), out_avals[0], p.get<double>("alpha"),
                      &in[2], p.has("accumulate_in_place")))
    return {*out};
  return run_on_host(*find_primitive("dot_general_accumulate"), Platform::cuda, in, out_avals, p);
}

const bool g_registered = [] {
  register_kernel("dot_general", Platform::cuda, dot_general_cuda);
  register_kernel("dot_general_accumulate", Platform::cuda, dot_general_accumulate_cuda);
  return true;
}();

}  // namespace
}  // namespace cjax::cuda
