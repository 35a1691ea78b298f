// The cuda platform's eager kernels against the GPU's copy ceiling (cuMemcpyDtoD, bytes read +
// written) measured in the same run. bench/peers/cuda_eager_peers.py times the same operations
// in PyTorch and JAX on the same GPU (scripts/gpu_check.sh runs both and prints the ratios).
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "backends/cuda/cuda_device.h"
#include "bench/harness.h"
#include "cjax/cjax.h"
#include "core/array/array_impl.h"
#include "jit/executable.h"

using namespace cjax;
using namespace cjax::bench;
namespace jnp = cjax::numpy;
namespace nn = cjax::nn;

namespace {
const Device kGpu(Platform::cuda, 0);

double seconds(const std::function<void()>& fn, int reps) { return time_median(fn, reps); }

// GB/s of one device-to-device copy of `bytes` (counted twice: read and write).
double copy_ceiling(size_t bytes) {
  Array a = device_put(jnp::zeros({int64_t(bytes / 4)}), SingleDeviceSharding(kGpu));
  Array b = device_put(jnp::zeros({int64_t(bytes / 4)}), SingleDeviceSharding(kGpu));
  const cuda::Driver& api = cuda::activate(kGpu);
  auto src = reinterpret_cast<CUdeviceptr>(raw_ptr(a)), dst = reinterpret_cast<CUdeviceptr>(raw_ptr(b));
  double t = seconds(
      [&] {
        cuda::check(api.cuMemcpyDtoD(dst, src, bytes), "cuMemcpyDtoD");
        cuda::check(api.cuCtxSynchronize(), "cuCtxSynchronize");
      },
      20);
  return 2.0 * double(bytes) / t / 1e9;
}
}  // namespace

int main() {
  print_host();
  std::vector<Device> gpus = devices("cuda");
  if (gpus.empty()) {
    std::printf("no cuda device: %s\n", cuda::driver_unavailable_reason().c_str());
    return 77;
  }
  const cuda::GpuInfo& info = cuda::gpu(kGpu);
  std::printf("GPU: %s, sm_%d%d, %d SMs, %.1f GiB\n", info.name.c_str(), info.cc_major, info.cc_minor,
              info.multiprocessors, double(info.total_memory) / (1 << 30));
  double ceiling = copy_ceiling(size_t(1) << 30);
  std::printf("ceiling: device-to-device copy of 1 GiB: %.0f GB/s (read + write)\n\n", ceiling);

  std::printf("%-34s %12s %10s %10s\n", "eager op (cjax)", "time", "GB/s", "of copy");
  auto report = [&](const std::string& what, double t, double bytes) {
    double gbs = bytes / t / 1e9;
    std::printf("%-34s %9.1f us %10.0f %9.0f%%\n", what.c_str(), t * 1e6, gbs, 100 * gbs / ceiling);
    std::printf("ROW,%s,%.9f\n", what.c_str(), t);  // read by bench/peers/cuda_eager_peers.py
  };
  for (int64_t n : {int64_t(1) << 24, int64_t(1) << 26, int64_t(1) << 28}) {
    Array x = device_put(jnp::ones({n}), SingleDeviceSharding(kGpu));
    Array y = device_put(jnp::ones({n}), SingleDeviceSharding(kGpu));
    Array z;
    double t = seconds(
        [&] {
          z = x + y;
          z.block_until_ready();
        },
        20);
    report(fmt::format("add f32[{}M]", n >> 20), t, 12.0 * double(n));
  }
  {
    int64_t n = int64_t(1) << 26;
    Array x = device_put(jnp::ones({n}), SingleDeviceSharding(kGpu)).astype(bf16);
    Array y = x * 2.0f;
    Array z;
    double t = seconds(
        [&] {
          z = x * y;
          z.block_until_ready();
        },
        20);
    report("mul bf16[64M]", t, 6.0 * double(n));
    Array xf = device_put(jnp::ones({n}), SingleDeviceSharding(kGpu));
    t = seconds(
        [&] {
          z = jnp::tanh(xf);
          z.block_until_ready();
        },
        20);
    report("tanh f32[64M]", t, 8.0 * double(n));
  }
  // Small library ops of a training step (their host-side launch cost shows here).
  {
    Array m = device_put(jnp::ones({512, 2048}), SingleDeviceSharding(kGpu));
    Array b = device_put(jnp::ones({2048}), SingleDeviceSharding(kGpu));
    Array z;
    auto row = [&](const char* what, const std::function<Array()>& f) {
      double t = seconds(
          [&] {
            z = f();
            z.block_until_ready();
          },
          50);
      std::printf("%-34s %9.1f us\n", what, t * 1e6);
      std::printf("ROW,%s,%.9f\n", what, t);
    };
    row("sum f32[512,2048] all", [&] { return jnp::sum(m); });
    row("sum f32[512,2048] axis 0", [&] { return jnp::sum(m, 0); });
    row("sum f32[512,2048] axis 1", [&] { return jnp::sum(m, 1); });
    row("bias add f32[512,2048]+[2048]", [&] { return m + b; });
    row("transpose f32[512,2048]", [&] { return jnp::transpose(m); });
  }
  // GEMMs on cuBLASLt through dot_general (TFLOP/s; the peers run torch.matmul / jnp.matmul).
  std::printf("\n%-34s %12s %10s\n", "matmul (cjax dot_general)", "time", "TFLOP/s");
  for (auto [n, d] : {std::pair{int64_t(8192), bf16}, std::pair{int64_t(4096), bf16}, std::pair{int64_t(4096), f32},
                      std::pair{int64_t(1024), bf16}}) {
    Array a = device_put(jnp::ones({n, n}), SingleDeviceSharding(kGpu)).astype(d);
    Array b = device_put(jnp::ones({n, n}), SingleDeviceSharding(kGpu)).astype(d) * 0.5f;
    Array c;
    double t = seconds(
        [&] {
          c = jnp::matmul(a, b);
          c.block_until_ready();
        },
        20);
    std::string what = fmt::format("matmul {}[{}^3]", dtype_name(d), n);
    std::printf("%-34s %9.1f us %10.1f\n", what.c_str(), t * 1e6, 2.0 * double(n) * double(n) * double(n) / t / 1e12);
    std::printf("ROW,%s,%.9f\n", what.c_str(), t);
  }
  std::printf("\n");
  // jit: fused kernels generated as CUDA C++ (bytes = inputs read + outputs written once).
  // Per call: one call and a synchronisation (as the peers are timed). Streamed: ten calls queued
  // back to back and one synchronisation, per call: the kernel's own rate, host costs overlapped.
  std::printf("%-34s %12s %10s %10s %12s %10s\n", "jit (cjax fused kernels)", "per call", "GB/s", "of copy", "streamed",
              "of copy");
  auto report_jit = [&](const std::string& what, const std::function<Array()>& call, double bytes) {
    Array z;
    double t = seconds(
        [&] {
          z = call();
          z.block_until_ready();
        },
        20);
    double streamed = seconds(
                          [&] {
                            for (int i = 0; i < 10; ++i) z = call();
                            z.block_until_ready();
                          },
                          10) /
                      10;
    std::printf("%-34s %9.1f us %10.0f %9.0f%% %9.1f us %9.0f%%\n", what.c_str(), t * 1e6, bytes / t / 1e9,
                100 * bytes / t / 1e9 / ceiling, streamed * 1e6, 100 * bytes / streamed / 1e9 / ceiling);
    std::printf("ROW,%s,%.9f\n", what.c_str(), t);
  };
  {
    auto chain = [](const Array& x) {  // 15 elementwise ops, one kernel
      Array y = x * 1.5f + 0.25f;
      y = jnp::tanh(y) * x - 0.5f;
      y = jnp::exp(y * 0.125f) + jnp::square(x);
      return jnp::sqrt(jnp::abs(y) + 1.0f) / (y * y + 2.0f);
    };
    auto chain_jit = jit(chain);
    for (auto [n, d] : {std::pair{int64_t(1) << 24, f32}, std::pair{int64_t(1) << 26, f32},
                        std::pair{int64_t(1) << 28, f32}, std::pair{int64_t(1) << 26, bf16}}) {
      Array x = device_put(random::normal(random::key(7), {n}), SingleDeviceSharding(kGpu)).astype(d);
      report_jit(
          fmt::format("jit chain {}[{}M]", dtype_name(d), n >> 20), [&] { return chain_jit(x); },
          2.0 * double(itemsize(d)) * double(n));
    }
    auto softmax_jit = jit([](const Array& x) { return nn::softmax(x, -1); });
    auto rms_jit = jit([](const Array& x, const Array& g) { return nn::rms_norm(x, g); });
    auto layer_norm_jit = jit([](const Array& x, const Array& g, const Array& b) {
      Array mu = jnp::mean(x, -1, true);
      Array var = jnp::mean(jnp::square(x - mu), -1, true);
      return (x - mu) / jnp::sqrt(var + 1e-5f) * g + b;
    });
    for (auto [r, c, d] :
         {std::tuple{int64_t(4096), int64_t(4096), f32}, std::tuple{int64_t(32768), int64_t(1024), f32},
          std::tuple{int64_t(1024), int64_t(32768), f32}, std::tuple{int64_t(4096), int64_t(4096), bf16}}) {
      Array x = device_put(random::normal(random::key(8), {r, c}), SingleDeviceSharding(kGpu)).astype(d);
      double bytes = 2.0 * double(itemsize(d)) * double(r * c);
      report_jit(
          fmt::format("jit softmax {}[{},{}]", dtype_name(d), r, c), [&] { return softmax_jit(x); }, bytes);
      if (d != f32 || c != 1024) continue;
      Array g = device_put(jnp::ones({c}), SingleDeviceSharding(kGpu)),
            b = device_put(jnp::zeros({c}), SingleDeviceSharding(kGpu));
      report_jit(
          fmt::format("jit rms_norm {}[{},{}]", dtype_name(d), r, c), [&] { return rms_jit(x, g); }, bytes);
      report_jit(
          fmt::format("jit layer_norm {}[{},{}]", dtype_name(d), r, c), [&] { return layer_norm_jit(x, g, b); }, bytes);
    }
    // Host time of a cached one-kernel jit call (queued, not waited for).
    Array one = device_put(jnp::ones({1}), SingleDeviceSharding(kGpu)), acc = one;
    auto tiny = jit([](const Array& a, const Array& b) { return a * 0.5f + b; });
    acc = tiny(acc, one);
    const int calls = 1000;
    double t = seconds(
        [&] {
          for (int i = 0; i < calls; ++i) acc = tiny(acc, one);
          acc.block_until_ready();
        },
        5);
    std::printf("%-34s %9.2f us per call\n", "jit 1-kernel call, chain of 1000", t / calls * 1e6);
    std::printf("ROW,jit tiny call,%.9f\n", t / calls);
    // A program of 1000 tiny launches (500 [8,8] GEMMs on cuBLASLt, each followed by a fused tanh
    // kernel), run instruction by instruction and as one recorded CUDA graph.
    auto deep = jit([](const Array& x, const Array& w) {
      Array y = x;
      for (int i = 0; i < 500; ++i) y = jnp::tanh(jnp::matmul(y, w));
      return y;
    });
    Array x8 = device_put(random::normal(random::key(9), {8, 8}), SingleDeviceSharding(kGpu));
    Array w8 = device_put(random::normal(random::key(10), {8, 8}) * 0.3f, SingleDeviceSharding(kGpu));
    Array direct, graphed;
    for (bool graphs : {false, true}) {
      setenv("CJAX_CUDA_GRAPHS", graphs ? "1" : "0", 1);
      (graphs ? graphed : direct) = deep(x8, w8);
      (graphs ? graphed : direct) = deep(x8, w8);  // with graphs: recorded here
      double td = seconds([&] { deep(x8, w8).block_until_ready(); }, 20);
      std::printf("%-34s %9.2f us per launch (%.0f us per call)\n",
                  graphs ? "1000 tiny launches, CUDA graph" : "1000 tiny launches, direct", td / 1000 * 1e6, td * 1e6);
      std::printf("ROW,%s,%.9f\n", graphs ? "tiny launch graph" : "tiny launch direct", td / 1000);
    }
    unsetenv("CJAX_CUDA_GRAPHS");
    std::printf("graph and direct results equal: %s (%lld replays)\n",
                direct.to_vector<float>() == graphed.to_vector<float>() ? "yes" : "NO",
                static_cast<long long>(Executable::graph_replays()));
  }
  std::printf("\n");
  // An MLP training step (forward, backward through value_and_grad, SGD update) on the GPU, eager
  // and under jit with the parameters donated.
  {
    auto loss = [](const std::vector<Array>& p, const Array& x, const Array& y) {
      Array h = jnp::tanh(jnp::matmul(x, p[0]) + p[1]);
      h = jnp::tanh(jnp::matmul(h, p[2]) + p[3]);
      return jnp::mean(jnp::square(jnp::matmul(h, p[4]) - y));
    };
    auto eager_step = [&](const std::vector<Array>& p, const Array& x, const Array& y) {
      auto [value, grads] = value_and_grad(loss)(p, x, y);
      std::vector<Array> out{value};
      for (size_t i = 0; i < p.size(); ++i) out.push_back(p[i] - 0.01f * grads[i]);
      return out;
    };
    auto jit_step = jit(eager_step, {.donate_argnums = {0}});
    const int64_t batch = 512, width = 2048;
    auto put = [](const Array& a) { return device_put(a, SingleDeviceSharding(kGpu)); };
    Array x = put(random::normal(random::key(4), {batch, width})),
          y = put(random::normal(random::key(5), {batch, width}));
    for (bool jitted : {false, true}) {
      std::vector<Array> params = {put(random::normal(random::key(1), {width, width}) * 0.02f),
                                   put(jnp::zeros({width})),
                                   put(random::normal(random::key(2), {width, width}) * 0.02f),
                                   put(jnp::zeros({width})),
                                   put(random::normal(random::key(3), {width, width}) * 0.02f)};
      int64_t before = profiler::host_fallback_count();
      Array l;
      double t = seconds(
          [&] {
            std::vector<Array> out = jitted ? jit_step(params, x, y) : eager_step(params, x, y);
            l = out[0];
            params.assign(out.begin() + 1, out.end());
            params.back().block_until_ready();
          },
          20);
      std::printf("%-34s %9.1f us  (loss %.5f, %lld host fallbacks per step)\n",
                  jitted ? "jit MLP train step f32, donated" : "MLP train step f32 512x2048 x3", t * 1e6,
                  double(l.item<float>()), static_cast<long long>((profiler::host_fallback_count() - before) / 21));
      std::printf("ROW,%s,%.9f\n", jitted ? "jit mlp step f32" : "mlp step f32", t);
    }
  }
  // Causal attention at the transformer sample's shape, forward + backward (the gradient of
  // sum(attention * w)), jitted: the fused kernels (backends/cuda/kernels/attention.cpp) against
  // the unfused program (implementation = xla: cuBLASLt products, fused softmax).
  for (DType d : {f32, bf16}) {
    auto put = [&](const Array& a) { return device_put(a.astype(d), SingleDeviceSharding(kGpu)); };
    auto keys = random::split(random::key(9), 4);
    Array q = put(random::normal(keys[0], {32, 64, 8, 16})), k = put(random::normal(keys[1], {32, 64, 8, 16})),
          v = put(random::normal(keys[2], {32, 64, 8, 16})), w = put(random::normal(keys[3], {32, 64, 8, 16}));
    double times[2];
    for (int fused = 1; fused >= 0; --fused) {
      auto loss = [&w, fused](const Array& q, const Array& k, const Array& v) {
        nn::AttentionOptions o;
        o.is_causal = true;
        o.implementation = fused ? nn::AttentionImplementation::fused : nn::AttentionImplementation::xla;
        return jnp::sum((nn::dot_product_attention(q, k, v, o) * w).astype(f32));
      };
      auto grads = jit([loss](const Array& q, const Array& k, const Array& v) {
        auto [gq, gk, gv] = grad(loss, argnums<0, 1, 2>)(q, k, v);
        return std::vector<Array>{gq, gk, gv};
      });
      std::vector<Array> g;
      times[fused] = seconds(
          [&] {
            g = grads(q, k, v);
            g[0].block_until_ready();
          },
          50);
    }
    std::string what = fmt::format("attention fwd+bwd {}[32,64,8,16]", dtype_name(d));
    std::printf("%-34s %9.1f us fused, %9.1f us unfused (%.2fx)\n", what.c_str(), times[1] * 1e6, times[0] * 1e6,
                times[0] / times[1]);
    std::printf("ROW,%s,%.9f\n", what.c_str(), times[1]);
  }
  // Host cost of one eager op on the GPU (dispatch + launch), on 1-element arrays.
  {
    Array a = device_put(jnp::ones({1}), SingleDeviceSharding(kGpu));
    Array b = a;
    const int calls = 10000;
    double t = seconds(
        [&] {
          for (int i = 0; i < calls; ++i) b = b + a;
          b.block_until_ready();
        },
        5);
    std::printf("%-34s %9.2f us per op\n", "eager add f32[1], chain of 10000", t / calls * 1e6);
    std::printf("ROW,add f32[1] per op,%.9f\n", t / calls);
    std::printf("result check: %.0f (expected %d)\n", double(b.item<float>()), 1 + calls * 6);
  }
  std::printf("host fallbacks in this run: %lld\n", static_cast<long long>(profiler::host_fallback_count()));
  return 0;
}
