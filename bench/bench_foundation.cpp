// Foundation benchmarks (issue 2): eager dispatch, elementwise add vs a C++ loop, matmul vs
// OpenBLAS, sum vs the machine's STREAM bandwidth, and PyTorch CPU when installed. All ratios are
// measured in this run.
#include <cblas.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "bench/harness.h"
#include "cjax/cjax.h"
#include "core/array/array_impl.h"
#include "core/backend/parallel.h"

using namespace cjax;
using namespace cjax::bench;
namespace jnp = cjax::numpy;

namespace {

std::string fmt_us(double s) { return std::to_string(s * 1e6).substr(0, 6) + " us"; }
std::string fmt_ms(double s) { return std::to_string(s * 1e3).substr(0, 6) + " ms"; }
std::string fmt_gbs(double g) { return std::to_string(g).substr(0, 5) + " GB/s"; }

// STREAM copy (b = a) over `n` floats with the same thread pool: the machine's bandwidth figure.
double stream_copy_gbs(int64_t n) {
  std::unique_ptr<float[]> a(new float[size_t(n)]), b(new float[size_t(n)]);
  parallel_for(n, 1 << 16, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) a[size_t(i)] = float(i & 1023), b[size_t(i)] = 0;
  });
  double t = time_median(
      [&] {
        parallel_for(n, 1 << 16, [&](int64_t s, int64_t e) {
          std::memcpy(b.get() + s, a.get() + s, size_t(e - s) * sizeof(float));
        });
      },
      9);
  return 2.0 * double(n) * sizeof(float) / t / 1e9;
}

// Read-only bandwidth: a hand-written, vectorizable parallel sum (16 accumulators) over `n` floats.
double read_loop_gbs(const float* p, int64_t n, float* result) {
  double t = time_median(
      [&] {
        std::vector<float> partial(64, 0.f);
        std::mutex mu;
        float total = 0;
        parallel_for(n, 1 << 20, [&](int64_t s, int64_t e) {
          float acc[16] = {};
          int64_t i = s;
          for (; i + 16 <= e; i += 16)
            for (int k = 0; k < 16; ++k) acc[k] += p[i + k];
          for (; i < e; ++i) acc[0] += p[i];
          float c = 0;
          for (float a : acc) c += a;
          std::lock_guard<std::mutex> lock(mu);
          total += c;
        });
        *result = total;
      },
      9);
  return double(n) * sizeof(float) / t / 1e9;
}

// PyTorch 1.13 eager numbers from bench/peers/torch_foundation.py, if torch is importable.
std::string run_torch_peer() {
  std::string cmd = torch_isa_env() + "/usr/bin/python3 " CJAX_BENCH_DIR "/peers/torch_foundation.py 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {};
  std::string out;
  char buf[256];
  while (fgets(buf, sizeof buf, p)) out += buf;
  if (pclose(p) != 0) return {};
  return out;
}
double peer_value(const std::string& out, const std::string& key) {
  auto pos = out.find(key + "=");
  return pos == std::string::npos ? -1 : std::atof(out.c_str() + pos + key.size() + 1);
}

}  // namespace

int main() {
  print_host();
  std::printf("cjax foundation benchmarks: %d threads, %d CPU devices\n\n", num_threads(), device_count());
  std::printf("%-44s %-18s %-26s %8s\n", "benchmark", "cjax", "peer", "ratio");
  std::string torch = run_torch_peer();

  // 1. Eager dispatch: add on f32[8].
  Array a8 = jnp::ones({8}), b8 = jnp::ones({8});
  const int kOps = 200000;
  double t_dispatch = time_median(
                          [&] {
                            Array c;
                            for (int i = 0; i < kOps; ++i) c = a8 + b8;
                          },
                          5) /
                      kOps;
  double torch_dispatch = peer_value(torch, "add8_us") * 1e-6;
  if (torch_dispatch > 0)
    row("eager add f32[8] (per op)", fmt_us(t_dispatch), "torch " + fmt_us(torch_dispatch), t_dispatch / torch_dispatch,
        "<= 0.5 us; < torch");
  else
    row("eager add f32[8] (per op)", fmt_us(t_dispatch), "torch not installed", 0, "<= 0.5 us");

  // 2. add on 16M f32 vs a plain C++ loop writing a fresh output.
  const int64_t n = 16 << 20;
  Array x = jnp::ones({n}), y = jnp::ones({n});
  double t_add = time_median([&] { Array z = x + y; }, 9);
  std::unique_ptr<float[]> xs(new float[size_t(n)]), ys(new float[size_t(n)]), zs(new float[size_t(n)]);
  for (int64_t i = 0; i < n; ++i) xs[size_t(i)] = 1, ys[size_t(i)] = 1, zs[size_t(i)] = 0;
  double t_loop = time_median(
      [&] {
        float* __restrict z = zs.get();
        const float* __restrict p = xs.get();
        const float* __restrict q = ys.get();
        for (int64_t i = 0; i < n; ++i) z[i] = p[i] + q[i];
      },
      9);
  row("add 16M f32", fmt_ms(t_add), "C++ loop " + fmt_ms(t_loop), t_add / t_loop, "<= 1.2x");
  double torch_add = peer_value(torch, "add16m_ms") * 1e-3;
  if (torch_add > 0)
    row("add 16M f32 vs torch", fmt_ms(t_add), "torch " + fmt_ms(torch_add), t_add / torch_add, "< 1x");

  // 3. matmul 1024^3 vs a direct cblas_sgemm on the same data.
  const int m = 1024;
  Array A = jnp::ones({m, m}) * 0.5f, B = jnp::ones({m, m}) * 0.25f;
  double t_mm = time_median([&] { Array C = jnp::matmul(A, B); }, 7);
  std::unique_ptr<float[]> Cbuf(new float[size_t(m) * m]);
  const float* pa = data_ptr<const float>(A);
  const float* pb = data_ptr<const float>(B);
  double t_blas = time_median(
      [&] {
        OpenBlasOwnThreads own;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, m, m, 1.f, pa, m, pb, m, 0.f, Cbuf.get(), m);
      },
      7);
  double gflops = 2.0 * m * m * m / t_mm / 1e9;
  row("matmul 1024^3 f32", fmt_ms(t_mm) + " " + std::to_string(int(gflops)) + "GF", "OpenBLAS " + fmt_ms(t_blas),
      t_mm / t_blas, "<= 1.05x");
  double torch_mm = peer_value(torch, "mm1024_ms") * 1e-3;
  if (torch_mm > 0) row("matmul 1024^3 vs torch", fmt_ms(t_mm), "torch " + fmt_ms(torch_mm), t_mm / torch_mm, "");

  // 4. sum of 16M f32 vs the STREAM copy bandwidth measured now.
  double stream = stream_copy_gbs(n);
  double t_sum = time_median([&] { Array s = jnp::sum(x); }, 9);
  double sum_gbs = double(n) * sizeof(float) / t_sum / 1e9;
  float check = 0;
  double read_gbs = read_loop_gbs(data_ptr<const float>(x), n, &check);
  // STREAM copy moves 2 bytes per byte read (read + write); the hand-written read loop is the
  // read-only limit. The goal is against the read-only figure.
  row("sum 16M f32 vs STREAM copy", fmt_gbs(sum_gbs), "STREAM copy " + fmt_gbs(stream), sum_gbs / stream, "");
  row("sum 16M f32 vs read-only loop", fmt_gbs(sum_gbs), "C++ read loop " + fmt_gbs(read_gbs), sum_gbs / read_gbs,
      ">= 0.8x");
  double torch_sum = peer_value(torch, "sum16m_ms") * 1e-3;
  if (torch_sum > 0)
    row("sum 16M f32 vs torch", fmt_gbs(sum_gbs), "torch " + fmt_gbs(double(n) * 4 / torch_sum / 1e9),
        (double(n) * 4 / torch_sum / 1e9) / sum_gbs, "< 1x");
  return 0;
}
