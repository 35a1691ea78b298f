// The cuda platform on a GPU: arrays on cuda devices, host reads, eager elementwise kernels
// against the CPU kernels, and counted host fallbacks. Without a GPU the program exits with 77,
// which ctest reports as skipped (scripts/gpu_check.sh runs it on a GPU machine).
#include <cjax/cjax.h>
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <random>
#include <sstream>

#include "core/array/primitive.h"
#include "cuda_test_util.h"

using namespace cjax;
using namespace cuda_test;
namespace jnp = cjax::numpy;

namespace {
bool in_domain(ScalarDomain dom, DType d) {
  bool fl = d == bf16 || d == f16 || d == f32 || d == f64;
  switch (dom) {
    case ScalarDomain::Float:
    case ScalarDomain::Pred: return fl;
    case ScalarDomain::Int: return !fl && d != bool_;
    case ScalarDomain::Num: return d != bool_;
    case ScalarDomain::Logic: return !fl;
    case ScalarDomain::Any:
    case ScalarDomain::Cmp: return true;
  }
  return false;
}

// Random operands of `d`: floats in (-3, 3) (positive for ops that need it), integers with the
// edge cases of division and shifts mixed in.
Array operand(DType d, int64_t n, std::mt19937& rng, const ScalarOpInfo& info, int k) {
  std::vector<double> v(static_cast<size_t>(n));
  bool positive = info.op == ScalarOp::Log || info.op == ScalarOp::Sqrt || info.op == ScalarOp::Rsqrt ||
                  info.op == ScalarOp::Lgamma || (info.op == ScalarOp::Pow && k == 0) || info.op == ScalarOp::Acosh;
  std::uniform_real_distribution<double> real(positive ? 0.05 : -3.0, 3.0);
  if (info.op == ScalarOp::Acosh) real = std::uniform_real_distribution<double>(1.0, 4.0);
  if (info.op == ScalarOp::Asin || info.op == ScalarOp::Acos || info.op == ScalarOp::Atanh ||
      info.op == ScalarOp::ErfInv)
    real = std::uniform_real_distribution<double>(-0.95, 0.95);
  std::uniform_int_distribution<int> small(-100, 100), shift(-2, 40), coin(0, 1);
  bool is_shift = info.op == ScalarOp::ShiftLeft || info.op == ScalarOp::ShiftRightLogical ||
                  info.op == ScalarOp::ShiftRightArithmetic;
  for (size_t i = 0; i < v.size(); ++i) {
    if (d == bf16 || d == f16 || d == f32 || d == f64)
      v[i] = real(rng);
    else if (d == bool_)
      v[i] = coin(rng);
    else if (is_shift && k == 1)
      v[i] = d == u8 || d == u32 ? std::abs(shift(rng)) : shift(rng);
    else
      v[i] = (d == u8 || d == u32) ? std::abs(small(rng)) : small(rng);
  }
  if (d == i32 && n >= 4) {  // INT_MIN / -1, x / 0, x % 0
    v[0] = std::numeric_limits<int32_t>::min();
    if (k == 1) v[0] = -1, v[1] = 0, v[2] = 0;
  }
  return jnp::array(v).astype(d);
}

}  // namespace

TEST_CASE("cuda devices are listed and named") {
  std::vector<Device> gpus = devices("cuda");
  REQUIRE(!gpus.empty());
  CHECK(gpus[0].str() == "cuda:0");
  CHECK(gpus[0].repr() == "CudaDevice(id=0)");
  CHECK(devices("gpu") == gpus);
  CHECK(devices().at(0).platform() == Platform::cpu);  // the default platform stays the CPU
  CHECK_THROWS_AS(device_put(jnp::zeros({2}), SingleDeviceSharding(Device(Platform::cuda, int(gpus.size())))),
                  BackendError);
}

TEST_CASE("device_put to the GPU and back keeps every value, and memory is accounted") {
  MemoryStats before = memory_stats(kGpu);
  {
    Array x = jnp::arange(0.0, 1000.0, 1.0, f32) * 0.5f;
    Array g = on_gpu(x);
    CHECK(device_of(g) == kGpu);
    CHECK(memory_stats(kGpu).bytes_in_use == before.bytes_in_use + 4000);
    CHECK(g.to_vector<float>() == x.to_vector<float>());
    CHECK(on_gpu(jnp::array<float>({2.5f})).item<float>() == 2.5f);
    Array back = device_put(g, SingleDeviceSharding(default_device()));
    CHECK(device_of(back).platform() == Platform::cpu);
    CHECK(back.to_vector<float>() == x.to_vector<float>());
    Array b = on_gpu(jnp::array<float>({1.5f, -2.25f, 3.0f}).astype(bf16));
    CHECK(b.astype(f32).to_vector<float>() == std::vector<float>{1.5f, -2.25f, 3.0f});
    std::ostringstream text;
    text << on_gpu(jnp::array<int32_t>({1, 2, 3}));
    CHECK(text.str() == "[1 2 3]");
  }
  CHECK(memory_stats(kGpu).bytes_in_use == before.bytes_in_use);
  CHECK(memory_stats(kGpu).peak_bytes_in_use >= before.bytes_in_use + 4000);
}

TEST_CASE("every elementwise primitive on the GPU matches the CPU kernel") {
  std::mt19937 rng(7);
  const DType dtypes[] = {bool_, i8, i32, i64, u8, u32, bf16, f16, f32, f64};
  const int64_t n = 5000;  // several blocks and a partial one
  int64_t fallbacks_before = profiler::host_fallback_count();
  int checked = 0;
  for (const ScalarOpInfo& info : kScalarOps) {
    const PrimitiveDef* def = find_primitive(info.name);
    REQUIRE(def);
    for (DType d : dtypes) {
      if (!in_domain(info.domain, d)) continue;
      for (bool scalar_last : {false, true}) {
        if (scalar_last && info.arity == 1) continue;
        std::vector<Array> cpu_in, gpu_in;
        for (int k = 0; k < info.arity; ++k) {
          Array a = operand(d, scalar_last && k == info.arity - 1 ? 1 : n, rng, info, k);
          if (scalar_last && k == info.arity - 1) a = jnp::reshape(a, Shape{});
          cpu_in.push_back(a);
          gpu_in.push_back(on_gpu(a));
        }
        CAPTURE(info.name);
        CAPTURE(dtype_name(d));
        CAPTURE(scalar_last);
        Array want = bind1(*def, cpu_in);
        Array got = bind1(*def, gpu_in);
        REQUIRE(device_of(got) == kGpu);
        REQUIRE(got.dtype() == want.dtype());
        std::vector<double> w = want.astype(f64).to_vector<double>(), g = got.astype(f64).to_vector<double>();
        bool exact = d != f32 && d != f64 && d != bf16 && d != f16;
        bool rounding_only = info.op == ScalarOp::Add || info.op == ScalarOp::Sub || info.op == ScalarOp::Mul ||
                             info.op == ScalarOp::Neg || info.op == ScalarOp::Abs || info.op == ScalarOp::Max ||
                             info.op == ScalarOp::Min || info.op == ScalarOp::Floor || info.op == ScalarOp::Ceil ||
                             info.op == ScalarOp::Round || info.domain == ScalarDomain::Cmp ||
                             info.op == ScalarOp::Clamp || info.op == ScalarOp::Square || info.op == ScalarOp::Sign;
        double rtol = exact || rounding_only ? 0 : d == f64 ? 1e-13 : d == f32 ? 2e-6 : 1e-2;
        double atol = exact || rounding_only ? 0 : d == f64 ? 1e-14 : d == f32 ? 1e-6 : 1e-2;
        if (info.op == ScalarOp::Lgamma) atol *= 10;  // absolute error near lgamma's roots
        int bad = 0;
        for (size_t i = 0; i < w.size(); ++i)
          if (!close(w[i], g[i], rtol, atol) && bad++ < 3)
            MESSAGE(info.name << " " << dtype_name(d) << " [" << i << "]: cpu " << w[i] << " gpu " << g[i]);
        CHECK(bad == 0);
        ++checked;
      }
    }
  }
  MESSAGE(checked << " (primitive, dtype, operand shape) combinations compared");
  CHECK(checked > 150);
  CHECK(profiler::host_fallback_count() == fallbacks_before);  // every one ran as a GPU kernel
}

TEST_CASE("weak scalars, numpy operators and conversions run on the GPU") {
  int64_t before = profiler::host_fallback_count();
  Array x = on_gpu(jnp::array<float>({1.0f, 2.0f, 4.0f}));
  Array y = jnp::exp(x * 2.0f + 1.0f) / x;
  CHECK(device_of(y) == kGpu);
  std::vector<float> v = y.to_vector<float>();
  for (size_t i = 0; i < v.size(); ++i) {
    float xi = float(1 << i);
    CHECK(v[i] == doctest::Approx(std::exp(xi * 2 + 1) / xi).epsilon(1e-6));
  }
  Array h = x.astype(bf16);
  CHECK(device_of(h) == kGpu);
  CHECK(h.astype(f32).to_vector<float>() == std::vector<float>{1, 2, 4});
  CHECK(profiler::host_fallback_count() == before);
}

TEST_CASE("conversions to integers and bool on the GPU saturate and wrap as on the CPU") {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  Array host = jnp::array<float>({-1e10f, -3.7f, -0.5f, 0.0f, 0.5f, 2.9f, 200.0f, 300.0f, 1e10f, nan, inf, -inf});
  Array x = on_gpu(host);
  int64_t before = profiler::host_fallback_count();
  for (DType d : {i8, i16, i32, i64, u8, u32, bool_}) {
    CAPTURE(dtype_name(d));
    Array got = x.astype(d);
    CHECK(device_of(got) == kGpu);
    CHECK(got.astype(f64).to_vector<double>() == host.astype(d).astype(f64).to_vector<double>());
  }
  Array wide = on_gpu(jnp::array<int32_t>({-129, -128, 127, 128, 255, 256, 70000}));
  for (DType d : {i8, u8, i16, bool_, f32, bf16})
    CHECK(wide.astype(d).astype(f64).to_vector<double>() == to_host(wide).astype(d).astype(f64).to_vector<double>());
  CHECK(profiler::host_fallback_count() == before);
}

TEST_CASE("a primitive without a GPU kernel runs on the host, counted, and its result stays on the GPU") {
  Array x = on_gpu(jnp::arange(0.0, 10.0, 1.0, f32));
  int64_t before = profiler::host_fallback_count();
  Array s = lax::cumsum(x);  // no GPU kernel yet
  CHECK(profiler::host_fallback_count() == before + 1);
  CHECK(device_of(s) == kGpu);
  CHECK(s.to_vector<float>().back() == 45.0f);
  // A whole computation mixes GPU kernels and fallbacks and stays correct.
  Array m = jnp::max(jnp::tanh(x) * 3.0f);
  CHECK(m.item<float>() == doctest::Approx(3.0f * std::tanh(9.0f)));
  // grad runs eagerly on GPU operands too.
  auto f = [](const Array& a) { return jnp::sum(jnp::sin(a) * a); };
  Array dx = grad(f)(x);
  CHECK(device_of(dx) == kGpu);
  std::vector<float> d = dx.to_vector<float>();
  for (int i = 0; i < 10; ++i)
    CHECK(d[size_t(i)] == doctest::Approx(std::cos(float(i)) * i + std::sin(float(i))).epsilon(1e-5));
}

TEST_CASE("uncommitted CPU values follow GPU operands; committed ones on two platforms are an error") {
  Array g = on_gpu(jnp::ones({3}));
  Array follows = g + jnp::array<float>({1.0f, 2.0f, 3.0f});  // uncommitted: copied to the GPU, as in JAX
  CHECK(device_of(follows) == kGpu);
  CHECK(follows.to_vector<float>() == std::vector<float>{2, 3, 4});
  Array c = device_put(jnp::ones({3}), SingleDeviceSharding(default_device()));  // committed to cpu:0
  CHECK(device_of(c * 2.0f).platform() == Platform::cpu);
  try {
    (void)(g + c);
    FAIL("mixed platforms were accepted");
  } catch (const BackendError& e) {
    CHECK(std::string(e.what()).find("cuda:0") != std::string::npos);
    CHECK(std::string(e.what()).find("device_put") != std::string::npos);
  }
  // jit over a GPU argument runs on the GPU (tests/test_cuda_jit.cpp has the details).
  auto f = jit([](const Array& a) { return jnp::sin(a) * 2.0f + a; });
  Array r = f(g);
  CHECK(device_of(r) == kGpu);
  std::vector<float> got = r.to_vector<float>(), want = f(jnp::ones({3})).to_vector<float>();
  for (size_t i = 0; i < got.size(); ++i) CHECK(close(got[i], want[i], 1e-6, 1e-6));
}

TEST_CASE("io writes GPU arrays") {
  auto path = std::filesystem::temp_directory_path() / "cjax_cuda_io.npy";
  Array g = on_gpu(jnp::arange(0.0, 6.0, 1.0, f32).reshape({2, 3}));
  io::save_npy(path, g);
  Array back = io::load_npy(path);
  CHECK(back.shape() == Shape{2, 3});
  CHECK(back.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
  std::filesystem::remove(path);
}

TEST_CASE("dot_general runs on cuBLASLt: transposes, batches and interleaved batch dims, every float dtype") {
  std::mt19937 rng(11);
  std::normal_distribution<double> normal(0.0, 1.0);
  auto random = [&](Shape s, DType d) {
    std::vector<double> v(static_cast<size_t>(shape_size(s)));
    for (double& x : v) x = normal(rng);
    return jnp::array(v).astype(d).reshape(s);
  };
  struct Case {
    Shape lhs, rhs;
    std::vector<int64_t> lc, rc, lb, rb;
  };
  const Case cases[] = {
      {{64, 32}, {32, 48}, {1}, {0}, {}, {}},                    // plain
      {{64, 32}, {48, 32}, {1}, {1}, {}, {}},                    // x @ w.T
      {{32, 64}, {32, 48}, {0}, {0}, {}, {}},                    // x.T @ w
      {{4, 16, 8}, {4, 8, 12}, {2}, {1}, {0}, {0}},              // batched
      {{2, 16, 4, 8}, {2, 24, 4, 8}, {3}, {3}, {0, 2}, {0, 2}},  // attention's q k^T: batch dims interleave
      {{7, 5}, {5, 3}, {1}, {0}, {}, {}},                        // odd sizes
      {{4, 6, 8}, {3, 8, 2, 5}, {2}, {1}, {}, {}},               // x . w[3,d,n,h]: w's free dims interleave
      {{2, 6, 3, 4}, {6, 5, 4}, {1, 3}, {0, 2}, {}, {}},         // two contracting dims around a free one
  };
  int64_t before = profiler::host_fallback_count();
  for (DType d : {f32, bf16, f16, f64})
    for (const Case& c : cases) {
      Array l = random(c.lhs, d), r = random(c.rhs, d);
      auto dot = [&](const Array& a, const Array& b) {
        return lax::dot_general(a, b, lax::DotDimensionNumbers{{c.lc, c.rc}, {c.lb, c.rb}});
      };
      Array want = dot(l, r);
      Array got = dot(on_gpu(l), on_gpu(r));
      CAPTURE(dtype_name(d));
      CAPTURE(shape_str(c.lhs));
      REQUIRE(device_of(got) == kGpu);
      REQUIRE(got.shape() == want.shape());
      std::vector<double> w = want.astype(f64).to_vector<double>(), g = got.astype(f64).to_vector<double>();
      double tol = d == f64 ? 1e-12 : d == f32 ? 1e-4 : 3e-2;
      int bad = 0;
      for (size_t i = 0; i < w.size(); ++i)
        if (!close(w[i], g[i], tol, tol) && bad++ < 3) MESSAGE("[" << i << "]: cpu " << w[i] << " gpu " << g[i]);
      CHECK(bad == 0);
    }
  CHECK(profiler::host_fallback_count() == before);
  // bf16 operands with an f32 result (preferred_element_type), as mixed-precision training uses.
  Array l = random({16, 32}, bf16), r = random({32, 8}, bf16);
  lax::DotDimensionNumbers matmul{{{1}, {0}}, {{}, {}}};
  Array want = lax::dot_general(l, r, matmul, f32);
  Array got = lax::dot_general(on_gpu(l), on_gpu(r), matmul, f32);
  CHECK(got.dtype() == f32);
  std::vector<float> w = want.to_vector<float>(), g = got.to_vector<float>();
  for (size_t i = 0; i < w.size(); ++i) CHECK(g[i] == doctest::Approx(w[i]).epsilon(1e-4));
  // Integer operands have no cuBLASLt path: counted fallback, still exact.
  Array li = jnp::arange(12, i32).reshape({3, 4}), ri = jnp::arange(8, i32).reshape({4, 2});
  before = profiler::host_fallback_count();
  CHECK(jnp::matmul(on_gpu(li), on_gpu(ri)).to_vector<int32_t>() == jnp::matmul(li, ri).to_vector<int32_t>());
  CHECK(profiler::host_fallback_count() == before + 1);
}

TEST_CASE("with the default platform set to cuda, created arrays live on the GPU, uncommitted, and ops run there") {
  config::set_default_platform("gpu");
  CHECK(config::default_platform() == "cuda");
  CHECK(default_device() == kGpu);
  CHECK(devices() == devices("cuda"));
  int64_t before = profiler::host_fallback_count();
  Array x = jnp::arange(0.0, 8.0, 1.0, f32);
  Array k = random::key(3);
  Array n = random::normal(k, {8});
  Array y = jnp::ones({8}) * 2.0f + x + n * 0.0f;
  for (const Array& a : {x, k, n, y}) CHECK(device_of(a) == kGpu);
  CHECK_FALSE(concrete(x)->committed);
  CHECK(y.to_vector<float>() == std::vector<float>{2, 3, 4, 5, 6, 7, 8, 9});
  // Committed CPU values still refuse to mix.
  Array c = device_put(jnp::ones({8}), SingleDeviceSharding(Device(Platform::cpu, 0)));
  CHECK_THROWS_AS(c + y, BackendError);
  // jit with only uncommitted host arguments (or none) runs on the default device too.
  auto f = jit([](const Array& a) { return a * 3.0f + 1.0f; });
  Array r = f(jnp::array<float>({1.0f, 2.0f}));
  CHECK(device_of(r) == kGpu);
  CHECK(r.to_vector<float>() == std::vector<float>{4, 7});
  CHECK(profiler::host_fallback_count() - before == 0);
  config::set_default_platform("cpu");
  CHECK(device_of(jnp::ones({2})).platform() == Platform::cpu);
}
