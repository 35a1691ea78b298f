// jit on the GPU: the corpus's fused kernels (tests/cuda_jit_corpus.h) against the CPU's LLVM
// kernels, bitwise repeatable; library steps on the device; donation; the disk cache; CJAX_DUMP.
#include <cjax/cjax.h>
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/backend/kernel_cache.h"
#include "cuda_jit_corpus.h"
#include "cuda_test_util.h"
#include "jit/executable.h"

using namespace cjax;
using namespace cuda_test;
namespace jnp = cjax::numpy;

namespace {
std::vector<Array> to_gpu(const std::vector<Array>& xs) {
  std::vector<Array> out;
  for (const Array& x : xs) out.push_back(on_gpu(x));
  return out;
}
int64_t count_mismatches(const Array& want, const Array& got, double rtol) {
  std::vector<double> w = want.astype(f64).to_vector<double>(), g = got.astype(f64).to_vector<double>();
  int64_t bad = 0;
  for (size_t i = 0; i < w.size(); ++i)
    if (!close(w[i], g[i], rtol, rtol) && bad++ < 3) MESSAGE("[" << i << "]: cpu " << w[i] << " gpu " << g[i]);
  return bad;
}
std::string file_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}
}  // namespace

TEST_CASE("every corpus program under jit on the GPU matches the CPU, runs no host fallback and repeats bitwise") {
  for (const cuda_corpus::Program& prog : cuda_corpus::programs()) {
    CAPTURE(prog.name);
    auto f = jit(prog.fn);
    std::vector<Array> want = f(prog.args);
    std::vector<Array> gargs = to_gpu(prog.args);
    int64_t before = profiler::host_fallback_count();
    std::vector<Array> got = f(gargs);
    CHECK(profiler::host_fallback_count() - before == 0);
    std::vector<Array> again = f(gargs);
    REQUIRE(got.size() == want.size());
    for (size_t o = 0; o < got.size(); ++o) {
      CAPTURE(o);
      CHECK(device_of(got[o]) == kGpu);
      CHECK(got[o].shape() == want[o].shape());
      CHECK(got[o].dtype() == want[o].dtype());
      CHECK(count_mismatches(want[o], got[o], prog.rtol) == 0);
      // Deterministic: the same bits on every run (fixed reduction trees).
      std::vector<double> a = got[o].astype(f64).to_vector<double>(), b = again[o].astype(f64).to_vector<double>();
      bool same = a.size() == b.size();
      for (size_t i = 0; same && i < a.size(); ++i) same = std::memcmp(&a[i], &b[i], sizeof(double)) == 0;
      CHECK(same);
    }
  }
}

TEST_CASE("a jit training loop on the GPU: donated parameters are updated in place") {
  cuda_corpus::Program mlp = cuda_corpus::programs().back();
  REQUIRE(mlp.name == "MLP training step");
  auto step = jit(
      [&](const std::vector<Array>& w, const Array& x, const Array& labels) {
        std::vector<Array> out = mlp.fn({w[0], w[1], w[2], x, labels});
        return std::vector<Array>(out.begin() + 1, out.end());
      },
      {.donate_argnums = {0}});
  std::vector<Array> w = {mlp.args[0], mlp.args[1], mlp.args[2]};
  std::vector<Array> gw = to_gpu(w);
  Array gx = on_gpu(mlp.args[3]), gl = on_gpu(mlp.args[4]);
  int64_t before = profiler::host_fallback_count();
  for (int i = 0; i < 5; ++i) {
    w = step(w, mlp.args[3], mlp.args[4]);
    const void* first = raw_ptr(gw[0]);
    gw = step(gw, gx, gl);
    if (i > 0) CHECK(raw_ptr(gw[0]) == first);  // the update wrote over the donated buffer
  }
  CHECK(profiler::host_fallback_count() - before == 0);
  for (size_t k = 0; k < w.size(); ++k) CHECK(count_mismatches(w[k], gw[k], 1e-4) == 0);
}

TEST_CASE(
    "a GPU program comes from the disk kernel cache the second time, and CJAX_DUMP writes its CUDA C++, PTX and ptxas "
    "report") {
  auto dir = std::filesystem::temp_directory_path() / fmt::format("cjax_cuda_jit_{}", ::getpid());
  std::filesystem::remove_all(dir);
  setenv("CJAX_CACHE_DIR", (dir / "cache").c_str(), 1);
  Array x = on_gpu(cuda_corpus::normal(40, {1001}));
  auto f = [](const Array& x) { return jnp::sin(x) * 3.0f + jnp::exp(-x); };
  Executable cold(make_jaxpr(f)(x));
  auto s0 = kernel_cache_stats();
  std::vector<Array> a = cold.run(std::vector<Array>{x});
  CHECK(kernel_cache_stats().disk_writes == s0.disk_writes + 1);
  clear_memory_kernel_cache();
  Executable warm(make_jaxpr(f)(x));  // (its CPU kernels come from the disk cache too)
  auto s1 = kernel_cache_stats();
  std::vector<Array> b = warm.run(std::vector<Array>{x});
  CHECK(kernel_cache_stats().disk_hits == s1.disk_hits + 1);
  CHECK(kernel_cache_stats().misses == s1.misses);
  CHECK(b[0].to_vector<float>() == a[0].to_vector<float>());
  setenv("CJAX_CACHE_DIR", "", 1);

  setenv("CJAX_DUMP", (dir / "dump").c_str(), 1);
  Executable dumped(make_jaxpr(f)(x), "dumped");
  dumped.run(std::vector<Array>{x});
  unsetenv("CJAX_DUMP");
  std::string cu, ptx, ptxas;
  for (auto& e : std::filesystem::directory_iterator(dir / "dump")) {
    std::string name = e.path().filename().string();
    if (name.ends_with(".cuda:0.cu")) cu = file_text(e.path());
    if (name.ends_with(".cuda:0.ptx")) ptx = file_text(e.path());
    if (name.ends_with(".cuda:0.ptxas.txt")) ptxas = file_text(e.path());
  }
  CHECK(cu.find("extern \"C\" __global__ void __launch_bounds__(256) k0(") != std::string::npos);
  CHECK(ptx.find(".entry k0") != std::string::npos);
  CHECK(ptxas.find("0 bytes spill stores") != std::string::npos);
  std::filesystem::remove_all(dir);
}

TEST_CASE("jit refuses arguments committed to two devices, naming them") {
  Array g = on_gpu(jnp::ones({4}));
  Array c = device_put(jnp::ones({4}), SingleDeviceSharding(Device(Platform::cpu, 0)));
  auto f = jit([](const Array& a, const Array& b) { return a + b; });
  CHECK_THROWS_WITH_AS(f(g, c), doctest::Contains("device_put it to cuda:0"), BackendError);
  // Uncommitted host values (jnp::ones) follow the GPU argument.
  Array r = f(g, jnp::ones({4}));
  CHECK(device_of(r) == kGpu);
  CHECK(r.to_vector<float>() == std::vector<float>{2, 2, 2, 2});
}

namespace {
struct GraphsOff {  // CJAX_CUDA_GRAPHS=0 while it lives (read at every call)
  GraphsOff() { setenv("CJAX_CUDA_GRAPHS", "0", 1); }
  ~GraphsOff() { unsetenv("CJAX_CUDA_GRAPHS"); }
};
bool same_bits(const Array& a, const Array& b) {
  std::vector<double> x = a.astype(f64).to_vector<double>(), y = b.astype(f64).to_vector<double>();
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(double)) == 0;
}
}  // namespace

TEST_CASE("a jit program of several kernels runs as one CUDA graph from its second call, with the same bits") {
  cuda_corpus::Program mlp = cuda_corpus::programs().back();
  REQUIRE(mlp.name == "MLP training step");
  auto step = jit(mlp.fn);
  std::vector<Array> a = to_gpu(mlp.args), b = to_gpu(mlp.args);
  b[3] = on_gpu(cuda_corpus::normal(99, mlp.args[3].shape()));  // other inputs, other buffers
  std::vector<Array> want_a, want_b;
  {
    GraphsOff off;
    want_a = step(a);
    want_b = step(b);
  }
  int64_t replays = Executable::graph_replays();
  std::vector<Array> ga = step(a);  // recorded (a call has run to its end), then replayed
  std::vector<Array> gb = step(b);  // replayed with b's buffers
  std::vector<Array> ga2 = step(a);
  CHECK(Executable::graph_replays() == replays + 3);
  REQUIRE(ga.size() == want_a.size());
  for (size_t o = 0; o < ga.size(); ++o) {
    CAPTURE(o);
    CHECK(same_bits(ga[o], want_a[o]));
    CHECK(same_bits(gb[o], want_b[o]));        // the replay read b, not the recorded a
    CHECK(same_bits(ga2[o], want_a[o]));       // and gb's replay did not write over ga's results
    CHECK(raw_ptr(ga[o]) != raw_ptr(ga2[o]));  // each call gets results of its own
  }
  // Intermediates live in the graph's memory: replays allocate only their results.
  MemoryStats m0 = memory_stats(kGpu);
  for (int i = 0; i < 5; ++i) step(a);
  CHECK(memory_stats(kGpu).bytes_in_use == m0.bytes_in_use);
}

TEST_CASE("a recorded training step reads each call's arguments and writes the donated buffers") {
  cuda_corpus::Program mlp = cuda_corpus::programs().back();
  auto body = [&](const std::vector<Array>& w, const Array& x, const Array& labels) {
    std::vector<Array> out = mlp.fn({w[0], w[1], w[2], x, labels});
    return std::vector<Array>(out.begin() + 1, out.end());
  };
  auto step = jit(body, {.donate_argnums = {0}});
  std::vector<Array> want = {mlp.args[0], mlp.args[1], mlp.args[2]};
  std::vector<Array> gw = to_gpu(want);
  int64_t replays = Executable::graph_replays();
  for (int i = 0; i < 6; ++i) {
    Array x = cuda_corpus::normal(uint32_t(200 + i), mlp.args[3].shape());  // a new batch each step
    want = step(want, x, mlp.args[4]);
    const void* donated = raw_ptr(gw[0]);
    gw = step(gw, on_gpu(x), on_gpu(mlp.args[4]));
    CHECK(raw_ptr(gw[0]) == donated);  // the result took the donated buffer
  }
  CHECK(Executable::graph_replays() - replays == 5);
  for (size_t k = 0; k < want.size(); ++k) CHECK(count_mismatches(want[k], gw[k], 1e-4) == 0);
}

TEST_CASE("a program that reads device memory on the host is not recorded and runs instruction by instruction") {
  // cumsum has no cuda kernel yet: a counted host fallback, which a recording cannot hold.
  auto f = jit([](const Array& x) { return jnp::cumsum(jnp::tanh(x) * 2.0f) + jnp::sum(x); });
  Array x = cuda_corpus::normal(5, {300});
  Array want = f(x);
  Array gx = on_gpu(x);
  int64_t replays = Executable::graph_replays();
  for (int i = 0; i < 3; ++i) CHECK(count_mismatches(want, f(gx), 1e-5) == 0);
  CHECK(Executable::graph_replays() == replays);
}

TEST_CASE("a single-kernel program is never recorded; CJAX_CUDA_GRAPHS=0 turns recording off") {
  // (A program is recorded at the first call after one that ran to its end.)
  Array x = on_gpu(cuda_corpus::normal(6, {1000}));
  auto one = jit([](const Array& v) { return jnp::sin(v) * 2.0f; });
  auto two = jit([](const Array& v) { return jnp::matmul(jnp::reshape(v, {10, 100}), jnp::ones({100, 4})) * 2.0f; });
  int64_t replays = Executable::graph_replays();
  for (int i = 0; i < 3; ++i) one(x);
  CHECK(Executable::graph_replays() == replays);
  {
    GraphsOff off;
    for (int i = 0; i < 3; ++i) two(x);
    CHECK(Executable::graph_replays() == replays);
  }
  Array r = two(x);  // recorded: its earlier calls ran to their end
  CHECK(Executable::graph_replays() == replays + 1);
  CHECK(r.shape() == Shape{10, 4});
}
