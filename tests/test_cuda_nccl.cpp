// NCCL end to end on one GPU (nranks = 1, as one GPU allows): CJAX_CUDA_COLLECTIVES=nccl sends
// every cuda collective through NCCL, and a one-process distributed run passes the communicator's
// unique id through the coordinator's store. Every collective of shard_map, eager and under jit,
// against the CPU mesh; grad through psum. Exits with 77 (ctest: skipped) where no GPU exists.
#include <cjax/cjax.h>
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/nccl.h"
#include "core/array/array_impl.h"
#include "core/backend/backend.h"
#include "core/distributed/kv_store.h"
#include "core/distributed/runtime.h"

#if !CJAX_HAVE_NCCL
namespace {
const bool g_skip = [] {
  std::printf("skipped: this build found no nccl.h\n");
  std::fflush(stdout);
  std::_Exit(77);
  return true;
}();
}  // namespace
#else
using namespace cjax;
namespace jnp = cjax::numpy;

namespace {
// Before the runtime starts: one process of a distributed run, one real GPU, NCCL collectives.
const bool g_setup = [] {
  setenv("CJAX_CUDA_COLLECTIVES", "nccl", 1);
  unsetenv("CJAX_NUM_CUDA_VIRTUAL_DEVICES");
  distributed::initialize({.coordinator_address = "127.0.0.1:" + std::to_string(30000 + getpid() % 20000),
                           .num_processes = 1,
                           .process_id = 0});
  if (devices("cuda").empty()) {
    std::printf("skipped: no cuda device (%s)\n", cuda::driver_unavailable_reason().c_str());
    std::fflush(stdout);
    std::_Exit(77);
  }
  if (!cuda::nccl_available()) {
    std::printf("NCCL is not available: %s\n",
                [] {
                  try {
                    cuda::nccl();
                  } catch (const std::exception& e) {
                    return std::string(e.what());
                  }
                  return std::string();
                }()
                    .c_str());
    std::fflush(stdout);
    std::_Exit(1);
  }
  return true;
}();

Mesh gpu_mesh() { return Mesh({devices("cuda")[0]}, {1}, {"x"}); }
Mesh cpu_mesh() { return Mesh({devices("cpu")[0]}, {1}, {"x"}); }
std::vector<float> fv(const Array& a) {
  return device_put(a, SingleDeviceSharding(devices("cpu")[0])).astype(DType::float32).to_vector<float>();
}
}  // namespace

TEST_CASE("every collective over an NCCL communicator of one rank equals the CPU mesh, eager and under jit") {
  using Body = std::function<Array(const Array&)>;
  std::vector<std::pair<std::string, Body> > bodies = {
      {"psum", [](const Array& b) { return lax::psum(b, "x"); }},
      {"pmax", [](const Array& b) { return lax::pmax(b, "x"); }},
      {"pmin", [](const Array& b) { return lax::pmin(b, "x"); }},
      {"psum bf16", [](const Array& b) { return lax::psum(b.astype(DType::bfloat16), "x").astype(DType::float32); }},
      {"psum int32", [](const Array& b) { return lax::psum(b.astype(DType::int32), "x").astype(DType::float32); }},
      {"all_gather tiled", [](const Array& b) { return lax::all_gather(b, "x", {.axis = 1, .tiled = true}); }},
      {"all_gather stacked",
       [](const Array& b) {
         return lax::all_gather(b, "x", {.axis = 0}).reshape({8, 24});
       }},
      {"psum_scatter",
       [](const Array& b) { return lax::psum_scatter(b, "x", {.scatter_dimension = 1, .tiled = true}); }},
      {"all_to_all", [](const Array& b) { return lax::all_to_all(b, "x", 1, 0, {.tiled = true}); }},
      {"ppermute to itself",
       [](const Array& b) {
         return lax::ppermute(b, "x", {{0, 0}});
       }},
      {"ppermute to nobody (zeros)", [](const Array& b) { return lax::ppermute(b, "x", {}) + 1.0f; }},
      {"pbroadcast", [](const Array& b) { return lax::pbroadcast(b, "x", 0); }},
  };
  Array x = jnp::sin(jnp::arange(8 * 24).astype(DType::float32).reshape({8, 24})) * 5.0f;
  Array xg = device_put(x, NamedSharding(gpu_mesh(), P("x")));
  int64_t fallbacks = profiler::host_fallback_count();
  for (const auto& [name, body] : bodies) {
    INFO(name);
    ShardMapOptions o{.check_vma = false};
    std::vector<float> want = fv(shard_map(body, cpu_mesh(), P("x"), P("x"), o)(x));
    Array eager = shard_map(body, gpu_mesh(), P("x"), P("x"), o)(xg);
    CHECK(concrete(eager)->buffers[0]->device().platform() == Platform::cuda);
    CHECK(fv(eager) == want);
    CHECK(fv(jit(shard_map(body, gpu_mesh(), P("x"), P("x"), o))(xg)) == want);
  }
  CHECK(profiler::host_fallback_count() == fallbacks);
}

TEST_CASE("the group's NCCL communicator is made once, its id passed through the coordinator's store") {
  Device d = devices("cuda")[0];
  Backend& cuda_backend = backend_for(Platform::cuda);
  std::vector<Device> group = {d};
  std::shared_ptr<BufferCommunicator> a = cuda_backend.communicator(group), b = cuda_backend.communicator(group);
  CHECK(a.get() == b.get());
  CHECK(a->size() == 1);
  // A psum ran above: its communicator's id is in the store under the run's generation.
  REQUIRE(distributed::store() != nullptr);
  CHECK(distributed::store()->check(fmt::format("nccl{}/{}/0", distributed::generation(), d.id())));
  // In place (recv == send), as the interface allows, then a barrier.
  Array x = device_put(jnp::arange(1000).astype(DType::float32), SingleDeviceSharding(d));
  a->all_reduce(0, raw_ptr(x), raw_ptr(x), 1000, DType::float32, ReduceOp::Sum);
  a->barrier(0);
  CHECK(fv(x) == fv(jnp::arange(1000).astype(DType::float32)));
  Array flags = device_put(jnp::arange(10) > 4, SingleDeviceSharding(d));  // bool: or = max over bytes
  a->all_reduce(0, raw_ptr(flags), raw_ptr(flags), 10, DType::bool_, ReduceOp::Sum);
  CHECK(fv(flags) == fv(jnp::arange(10) > 4));
  CHECK_THROWS_WITH_AS(a->all_reduce(0, raw_ptr(x), raw_ptr(x), 1, DType::int16, ReduceOp::Sum),
                       doctest::Contains("NCCL has no int16 reductions"), BackendError);
  setenv("CJAX_CUDA_COLLECTIVES", "bogus", 1);
  CHECK_THROWS_WITH_AS(cuda::collectives_use_nccl(group), doctest::Contains("expected auto, nccl or local"),
                       ValueError);
  setenv("CJAX_CUDA_COLLECTIVES", "local", 1);
  CHECK_FALSE(cuda::collectives_use_nccl(group));
  setenv("CJAX_CUDA_COLLECTIVES", "auto", 1);
  CHECK_FALSE(cuda::collectives_use_nccl(group));  // one GPU, one process: the in-process kernels
  setenv("CJAX_CUDA_COLLECTIVES", "nccl", 1);
  CHECK(cuda::collectives_use_nccl(group));
}

TEST_CASE("grad through psum and all_gather over NCCL equals the CPU mesh") {
  auto loss_on = [](const Mesh& mesh) {
    return [mesh](const Array& w, const Array& x) {
      auto body = [](const Array& wb, const Array& xb) {
        Array full_w = lax::all_gather(wb, "x", {.axis = 0, .tiled = true});
        return lax::psum(jnp::sum(jnp::square(jnp::tanh(jnp::matmul(xb, full_w)))), "x");
      };
      return shard_map(body, mesh, {P("x", None), P("x", None)}, P())(w, x);
    };
  };
  Array w = random::normal(random::key(1), {16, 8}) * 0.3f, x = random::normal(random::key(2), {8, 16});
  auto [lc, gc] = value_and_grad(loss_on(cpu_mesh()))(w, x);
  Array wg = device_put(w, NamedSharding(gpu_mesh(), P("x", None)));
  Array xg = device_put(x, NamedSharding(gpu_mesh(), P("x", None)));
  auto [lg, gg] = jit(value_and_grad(loss_on(gpu_mesh())))(wg, xg);
  CHECK(lg.item<float>() == doctest::Approx(lc.item<float>()).epsilon(1e-5));
  std::vector<float> a = fv(gc), b = fv(gg);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(b[i] == doctest::Approx(a[i]).epsilon(1e-4));
}

TEST_CASE("joining an NCCL communicator whose other rank never comes raises CollectiveError after the timeout") {
  using namespace std::chrono;
  ncclUniqueId id{};
  REQUIRE(cuda::nccl().ncclGetUniqueId(&id) == ncclSuccess);
  cuda::activate(devices("cuda")[0]);
  auto start = steady_clock::now();
  CHECK_THROWS_WITH_AS(cuda::init_rank(id, 2, 0, milliseconds(1500)), doctest::Contains("rank 0 of 2"),
                       CollectiveError);
  double waited = duration<double>(steady_clock::now() - start).count();
  CHECK(waited >= 1.5);
  CHECK(waited < 30);  // aborted, not waited for
  // NCCL stays usable: a psum over the mesh's own communicator still runs.
  Array x = device_put(jnp::arange(8, DType::float32).reshape({8, 1}), NamedSharding(gpu_mesh(), P("x")));
  Array y = shard_map([](const Array& b) { return lax::psum(b, "x") * 2.0f; }, gpu_mesh(), P("x"), P("x"))(x);
  CHECK(fv(y) == std::vector<float>{0, 2, 4, 6, 8, 10, 12, 14});
}
#endif  // CJAX_HAVE_NCCL
