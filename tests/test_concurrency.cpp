// cjax from several host threads at once: one jitted function shared by all threads (cache hits,
// concurrent misses, async dispatch), eager ops, grad under jit, and sharded programs. Every result
// is checked against the value the same thread expects; scripts/tsan.sh runs this file under
// ThreadSanitizer.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <thread>
#include <vector>

#include "cjax/cjax.h"
#include "test_util.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

TEST_CASE("one jitted function called from four threads gives each thread its own values") {
  auto f = jit([](const Array& x, const Array& y) { return jnp::tanh(x) * y + jnp::sum(x * y); }, {.name = "shared"});
  std::atomic<int> mismatches{0};
  on_threads(4, [&](int t) {
    for (int i = 0; i < 50; ++i) {
      float base = float(t * 100 + i);
      Array x = jnp::arange(64).astype(f32) / 64.0f + base;
      Array y = jnp::full({64}, float(t + 1), f32);
      std::vector<float> got = f(x, y).to_vector<float>();
      std::vector<float> xs = x.to_vector<float>();
      double total = 0;
      for (float v : xs) total += double(v) * (t + 1);
      for (size_t k = 0; k < got.size(); ++k) {
        double want = std::tanh(double(xs[k])) * (t + 1) + total;
        if (std::abs(got[k] - want) > 1e-5 * std::max(1.0, std::abs(want))) ++mismatches;
      }
    }
  });
  CHECK(mismatches.load() == 0);
  if (!config::disable_jit()) CHECK(f.cache_size() == 1);
}

TEST_CASE("concurrent cache misses: each thread's shape compiles once and every result is right") {
  auto f = jit([](const Array& x) { return jnp::cumsum(x * 2.0f); }, {.name = "per_shape"});
  on_threads(4, [&](int t) {
    int64_t n = 8 + t;  // a signature per thread, several threads missing at once
    for (int i = 0; i < 20; ++i) {
      std::vector<float> got = f(jnp::ones({n}, f32)).to_vector<float>();
      REQUIRE(got.size() == size_t(n));
      for (int64_t k = 0; k < n; ++k) REQUIRE(got[size_t(k)] == float(2 * (k + 1)));
    }
  });
  if (!config::disable_jit()) CHECK(f.cache_size() == 4);
}

TEST_CASE("grad under jit and eager ops from several threads") {
  auto loss = [](const Array& w, const Array& x) { return jnp::sum(jnp::square(jnp::matmul(x, w))); };
  auto g = jit(grad(loss), {.name = "grad_step"});
  on_threads(3, [&](int t) {
    Array x = jnp::eye(4) * float(t + 1);
    for (int i = 0; i < 20; ++i) {
      Array w = jnp::full({4, 2}, float(i), f32);
      // d/dw sum((x w)^2) = 2 x^T x w = 2 (t+1)^2 w
      std::vector<float> got = g(w, x).to_vector<float>();
      for (float v : got) REQUIRE(v == float(2 * (t + 1) * (t + 1) * i));
      Array eager = jnp::exp(jnp::zeros({16}, f32)) * float(t);
      for (float v : eager.to_vector<float>()) REQUIRE(v == float(t));
    }
  });
}

TEST_CASE("sharded programs from two threads: shard_map with collectives under jit") {
  Mesh mesh = make_mesh({4}, {"i"});
  auto total = jit(shard_map([](const Array& b) { return lax::psum(jnp::sum(b), "i"); }, mesh, P("i"), P()),
                   {.name = "psum_total"});
  on_threads(2, [&](int t) {
    for (int i = 0; i < 25; ++i) {
      Array x = jnp::arange(16).astype(f32) + float(t * 1000 + i);
      float want = 120.0f + 16.0f * float(t * 1000 + i);
      REQUIRE(total(x).item<float>() == want);
    }
  });
}
