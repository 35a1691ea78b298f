// Meshes of virtual GPU devices (CJAX_NUM_CUDA_VIRTUAL_DEVICES=8: eight logical devices on GPU
// 0): sharded device_put and reads, every collective of shard_map (eager and under jit) through
// the cuda buffer communicator, and grad through them, against the same programs on the CPU mesh.
// Exits with 77 (ctest: skipped) where no GPU exists.
#include <cjax/cjax.h>
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>

#include "backends/cuda/cuda_device.h"
#include "core/array/array_impl.h"

using namespace cjax;
namespace jnp = cjax::numpy;

namespace {
// Before any device list is made: eight virtual devices on each platform.
const bool g_setup = [] {
  setenv("CJAX_NUM_CUDA_VIRTUAL_DEVICES", "8", 0);
  setenv("CJAX_NUM_CPU_DEVICES", "8", 0);
  if (devices("cuda").empty()) {
    std::printf("skipped: no cuda device (%s)\n", cuda::driver_unavailable_reason().c_str());
    std::fflush(stdout);
    std::_Exit(77);
  }
  return true;
}();

Mesh gpu_mesh() { return Mesh(devices("cuda"), {2, 4}, {"i", "j"}); }
Mesh cpu_mesh() { return Mesh(devices("cpu"), {2, 4}, {"i", "j"}); }
// The values of a (sharded, GPU) array, read on the host.
std::vector<float> fv(const Array& a) {
  return device_put(a, SingleDeviceSharding(devices("cpu")[0])).astype(DType::float32).to_vector<float>();
}

using Body = std::function<Array(const Array&)>;
std::vector<std::pair<std::string, Body>> bodies() {
  return {
      {"psum over j", [](const Array& b) { return lax::psum(b, "j"); }},
      {"psum over both",
       [](const Array& b) {
         return lax::psum(b, {"i", "j"});
       }},
      {"psum bf16", [](const Array& b) { return lax::psum(b.astype(DType::bfloat16), "j").astype(DType::float32); }},
      {"psum int32",
       [](const Array& b) {
         return lax::psum(b.astype(DType::int32), {"i", "j"}).astype(DType::float32);
       }},
      {"pmax", [](const Array& b) { return lax::pmax(b, "j"); }},
      {"pmin", [](const Array& b) { return lax::pmin(b, "i"); }},
      {"all_gather tiled axis 1", [](const Array& b) { return lax::all_gather(b, "j", {.axis = 1, .tiled = true}); }},
      {"all_gather stacked axis 1",
       [](const Array& b) {
         return lax::all_gather(b, "i", {.axis = 1}).reshape({4, 12});
       }},
      {"psum_scatter tiled dim 1",
       [](const Array& b) { return lax::psum_scatter(b, "i", {.scatter_dimension = 1, .tiled = true}); }},
      {"all_to_all tiled", [](const Array& b) { return lax::all_to_all(b, "i", 1, 0, {.tiled = true}); }},
      {"ppermute ring",
       [](const Array& b) {
         return lax::ppermute(b, "j", {{0, 1}, {1, 2}, {2, 3}, {3, 0}});
       }},
      {"ppermute partial (zeros elsewhere)",
       [](const Array& b) {
         return lax::ppermute(b, "j", {{0, 2}, {3, 1}});
       }},
      {"pbroadcast", [](const Array& b) { return lax::pbroadcast(b, "j", 2); }},
  };
}
}  // namespace

TEST_CASE("eight virtual devices share GPU 0, each with its own memory accounting") {
  std::vector<Device> gpus = devices("cuda");
  REQUIRE(gpus.size() == 8);
  for (const Device& d : gpus) CHECK(cuda::gpu(d).device == cuda::gpu(gpus[0]).device);
  int64_t before = memory_stats(gpus[3]).bytes_in_use;
  Array x = device_put(jnp::ones({1024}), SingleDeviceSharding(gpus[3]));
  CHECK(memory_stats(gpus[3]).bytes_in_use == before + 4096);
  Array y = device_put(x, SingleDeviceSharding(gpus[5]));  // a device-to-device copy on the GPU
  CHECK(concrete(y)->device() == gpus[5]);
  CHECK(fv(y * 2.0f) == std::vector<float>(1024, 2.0f));
}

TEST_CASE("sharded device_put onto a GPU mesh: blocks on their devices, values read back") {
  Mesh mesh = gpu_mesh();
  Array x = jnp::arange(8 * 24).astype(DType::float32).reshape({8, 24});
  Array s = device_put(x, NamedSharding(mesh, P("i", "j")));
  const ConcreteArray& c = *concrete(s);
  REQUIRE(c.buffers.size() == 8);
  for (size_t k = 0; k < 8; ++k) CHECK(c.buffers[k]->device() == mesh.devices()[k]);
  CHECK(fv(s) == fv(x));
  Array back = device_put(s, SingleDeviceSharding(devices("cpu")[0]));
  CHECK(fv(back) == fv(x));
  Array replicated = device_put(x, NamedSharding(mesh, P()));
  CHECK(fv(replicated) == fv(x));
}

TEST_CASE("every collective on the GPU mesh equals the CPU mesh, eager and under jit") {
  Array x = jnp::sin(jnp::arange(8 * 24).astype(DType::float32).reshape({8, 24})) * 5.0f;  // blocks [4, 6]
  int64_t fallbacks = profiler::host_fallback_count();
  for (const auto& [name, body] : bodies()) {
    INFO(name);
    ShardMapOptions o{.check_vma = false};
    std::vector<float> want = fv(shard_map(body, cpu_mesh(), P("i", "j"), P("i", "j"), o)(x));
    Array xg = device_put(x, NamedSharding(gpu_mesh(), P("i", "j")));
    Array eager = shard_map(body, gpu_mesh(), P("i", "j"), P("i", "j"), o)(xg);
    CHECK(concrete(eager)->buffers[0]->device().platform() == Platform::cuda);
    CHECK(fv(eager) == want);  // the same rank-order combination: bitwise equal
    CHECK(fv(jit(shard_map(body, gpu_mesh(), P("i", "j"), P("i", "j"), o))(xg)) == want);
  }
  CHECK(profiler::host_fallback_count() == fallbacks);
}

TEST_CASE("grad through psum and all_gather on the GPU mesh equals the CPU mesh") {
  auto loss_on = [](const Mesh& mesh) {
    return [mesh](const Array& w, const Array& x) {
      auto body = [](const Array& wb, const Array& xb) {
        Array full_w = lax::all_gather(wb, "j", {.axis = 0, .tiled = true});
        Array h = jnp::tanh(jnp::matmul(xb, full_w));
        return lax::psum(jnp::sum(jnp::square(h)), {"i", "j"});
      };
      return shard_map(body, mesh, {P("j", None), P("i", None)}, P())(w, x);
    };
  };
  Array w = random::normal(random::key(1), {16, 8}) * 0.3f, x = random::normal(random::key(2), {8, 16});
  auto [lc, gc] = value_and_grad(loss_on(cpu_mesh()))(w, x);
  Array wg = device_put(w, NamedSharding(gpu_mesh(), P("j", None)));
  Array xg = device_put(x, NamedSharding(gpu_mesh(), P("i", None)));
  auto [lg, gg] = jit(value_and_grad(loss_on(gpu_mesh())))(wg, xg);
  CHECK(lg.item<float>() == doctest::Approx(lc.item<float>()).epsilon(1e-5));
  std::vector<float> a = fv(gc), b = fv(gg);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(b[i] == doctest::Approx(a[i]).epsilon(1e-4));
}

TEST_CASE("GEMMs on eight virtual devices at once equal each GEMM run alone (split-K workspaces)") {
  // Weight-gradient shapes (small output, long contraction) make cuBLASLt split K and pass partial
  // sums through its workspace; each virtual device's host thread calls it concurrently, so the
  // devices' launches interleave on the one stream. A shared workspace mixed devices' partials.
  Mesh mesh = gpu_mesh();
  Array x = random::normal(random::key(3), {8 * 64, 8192});
  Array y = random::normal(random::key(4), {8 * 64, 8192});
  auto body = [](const Array& xb, const Array& yb) {
    Array g = jnp::matmul(xb.T(), lax::slice(yb, {0, 0}, {64, 64}));  // [8192, 64]: K = 64 rows
    Array h = jnp::matmul(xb, yb.T());                                // [64, 64]: K = 8192 (split-K)
    return lax::concatenate({h, lax::slice(g, {0, 0}, {64, 64})}, 1);
  };
  std::vector<float> want;
  for (int64_t d = 0; d < 8; ++d) {  // each device's block alone, on cuda:0
    Device gpu0 = devices("cuda")[0];
    Array xb = device_put(lax::slice(x, {d * 64, 0}, {d * 64 + 64, 8192}), SingleDeviceSharding(gpu0));
    Array yb = device_put(lax::slice(y, {d * 64, 0}, {d * 64 + 64, 8192}), SingleDeviceSharding(gpu0));
    std::vector<float> b = fv(body(xb, yb));
    want.insert(want.end(), b.begin(), b.end());
  }
  Array xs = device_put(x, NamedSharding(mesh, P(axes("i", "j"), None)));
  Array ys = device_put(y, NamedSharding(mesh, P(axes("i", "j"), None)));
  auto sharded = shard_map(body, mesh, {P(axes("i", "j"), None), P(axes("i", "j"), None)}, P(axes("i", "j"), None));
  for (int rep = 0; rep < 4; ++rep) {
    INFO("repetition " << rep);
    CHECK(fv(sharded(xs, ys)) == want);
    CHECK(fv(jit(sharded)(xs, ys)) == want);
  }
}
