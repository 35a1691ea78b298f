// GEMM rows (issue 21): jnp::matmul, on the library the host's measurement chose for each shape
// class (backends/cpu/kernels/gemm_choice.h), against the best library for the shape measured in
// the same rounds: OpenBLAS called directly (cblas_sgemm per batch entry) and cjax's LIBXSMM
// path. Run under CJAX_ISA=avx2 as well, for the AVX2 column.
#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <memory>
#include <string_view>
#include <thread>

#include "backends/cpu/kernels/gemm_choice.h"
#include "bench/harness.h"
#include "cjax/cjax.h"
#include "core/array/array_impl.h"

using namespace cjax;
using namespace cjax::bench;
namespace jnp = cjax::numpy;

namespace {

struct Shape3 {
  const char* what;
  int batch, m, n, k;
  bool a_trans = false, b_trans = false;  // A stored [K, M], B stored [N, K] (a backward pass's products)
};

void gemm_row(const Shape3& s) {
  Array A = jnp::sin(jnp::arange(int64_t(s.batch) * s.m * s.k).astype(DType::float32))
                .reshape(s.a_trans ? Shape{s.batch, s.k, s.m} : Shape{s.batch, s.m, s.k});
  Array B = jnp::cos(jnp::arange(int64_t(s.batch) * s.k * s.n).astype(DType::float32))
                .reshape(s.b_trans ? Shape{s.batch, s.n, s.k} : Shape{s.batch, s.k, s.n});
  // C[b] = op(A[b]) op(B[b]): contract A's K axis (1 when stored transposed) with B's (2 when transposed).
  lax::DotDimensionNumbers dims{{{s.a_trans ? 1 : 2}, {s.b_trans ? 2 : 1}}, {{0}, {0}}};
  auto product = [&] { return lax::dot_general(A, B, dims); };
  std::unique_ptr<float[]> C(new float[size_t(s.batch) * s.m * s.n]);
  const float* pa = data_ptr<const float>(A);
  const float* pb = data_ptr<const float>(B);
  product().block_until_ready();  // the first call of a class measures the libraries
  auto ours = [&] { product().block_until_ready(); };
  auto xsmm = [&] {
    set_gemm_engine_override(GemmEngine::xsmm);
    product().block_until_ready();
    set_gemm_engine_override(std::nullopt);
  };
  auto blas = [&] {
    OpenBlasOwnThreads own;
    for (int b = 0; b < s.batch; ++b)
      cblas_sgemm(CblasRowMajor, s.a_trans ? CblasTrans : CblasNoTrans, s.b_trans ? CblasTrans : CblasNoTrans, s.m, s.n,
                  s.k, 1.f, pa + size_t(b) * s.m * s.k, s.a_trans ? s.m : s.k, pb + size_t(b) * s.k * s.n,
                  s.b_trans ? s.k : s.n, 0.f, C.get() + size_t(b) * s.m * s.n, s.n);
  };
  double work = 2.0 * s.batch * s.m * s.n * s.k;
  int reps = std::clamp(int(2e9 / std::max(work, 1.0)), 7, 201);
  // OpenBLAS on its own threads leaves them spinning for a while after each call, which halves
  // the speed of whatever runs next on a small machine: it is timed after the others, and the
  // next row waits for its threads to sleep.
  std::vector<double> t = interleaved_medians({ours, xsmm}, reps);
  t.push_back(time_median(blas, reps));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  double best = std::min(t[1], t[2]);
  auto us = [](double sec) { return fmt::format("{:.1f}us", sec * 1e6); };
  row(fmt::format("{} {}{} {}x[{}x{}x{}]", s.what, s.a_trans ? 'T' : 'N', s.b_trans ? 'T' : 'N', s.batch, s.m, s.n,
                  s.k),
      fmt::format("{} {:.0f}GF", us(t[0]), work / t[0] / 1e9), fmt::format("xsmm {} blas {}", us(t[1]), us(t[2])),
      t[0] / best, "<= 1.05x best");
}

}  // namespace

// bench_gemm [substring]: only the rows whose description contains it ("MLP layer", "dW").
int main(int argc, char** argv) {
  std::string_view only = argc > 1 ? argv[1] : "";
  print_host();
  std::printf("%-44s %-18s %-26s %8s\n", "GEMM f32 (batch x [M x N x K])", "cjax (chosen)", "libraries", "vs best");
  for (const Shape3& s :
       {Shape3{"square", 1, 1024, 1024, 1024}, Shape3{"square", 1, 512, 512, 512}, Shape3{"square", 1, 256, 256, 256},
        Shape3{"MLP layer", 1, 32, 1024, 1024}, Shape3{"MLP layer", 1, 128, 512, 784},
        Shape3{"projection", 1, 2048, 1024, 256}, Shape3{"attention QK", 64, 64, 64, 16},
        Shape3{"attention PV", 64, 64, 16, 64}, Shape3{"transformer sample MLP in", 1, 2048, 512, 128},
        Shape3{"transformer sample MLP out", 1, 2048, 128, 512},
        // The sample's backward products: dX = dY W^T (B transposed), dW = X^T dY (A transposed).
        Shape3{"transformer MLP in, dX", 1, 2048, 128, 512, false, true},
        Shape3{"transformer MLP out, dX", 1, 2048, 512, 128, false, true},
        Shape3{"transformer MLP in, dW", 1, 128, 512, 2048, true, false},
        Shape3{"transformer MLP out, dW", 1, 512, 128, 2048, true, false}})
    if (std::string_view(s.what).find(only) != std::string_view::npos) gemm_row(s);
  return 0;
}
