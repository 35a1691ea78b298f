// Tracing-layer benchmarks (issue 3): building the jaxpr of an MLP train step (trace + autodiff +
// passes) and dispatching a cached jit call with 10 array arguments. Peers measured in the same
// run: the eager step for the trace, and an eager call of the same function for dispatch.
#include <fmt/format.h>

#include <cstdio>

#include "bench/harness.h"
#include "cjax/cjax.h"
#include "jit/passes/passes.h"
#include "trace/jaxpr.h"
#include "trace/source_info.h"

using namespace cjax;
namespace jnp = cjax::numpy;

namespace {

struct Layer {
  Array w, b;
};
CJAX_TREE(Layer, w, b)

// MLP 784-128x5-8 with tanh, softmax cross-entropy (the issue 5 configuration).
Array loss(const std::vector<Layer>& params, const Array& x, const Array& labels) {
  Array h = x;
  for (size_t i = 0; i < params.size(); ++i) {
    h = jnp::matmul(h, params[i].w) + params[i].b;
    if (i + 1 < params.size()) h = jnp::tanh(h);
  }
  Array logp = nn::log_softmax(h, -1);
  return -jnp::mean(jnp::sum(logp * nn::one_hot(labels, 8), -1));
}

std::vector<Layer> sgd(const std::vector<Layer>& p, const std::vector<Layer>& g) {
  return tree::map([](const Array& a, const Array& b) { return a - b * 0.01f; }, p, g);
}

}  // namespace

int main() {
  std::vector<int64_t> sizes{784, 128, 128, 128, 128, 128, 8};
  std::vector<Layer> params;
  Array key = random::key(0);
  for (size_t i = 0; i + 1 < sizes.size(); ++i) {
    key = random::split(key)[0];
    params.push_back({random::normal(key, {sizes[i], sizes[i + 1]}) * 0.05f, jnp::zeros({sizes[i + 1]})});
  }
  Array x = random::normal(random::key(1), {32, 784});
  Array labels = random::randint(random::key(2), {32}, 0, 8);
  auto step = [](const std::vector<Layer>& p, const Array& x, const Array& y) {
    auto [l, g] = value_and_grad(loss)(p, x, y);
    return std::pair{l, sgd(p, g)};
  };

  std::printf("cjax tracing benchmarks\n\n%-44s %-18s %-26s %8s\n", "benchmark", "cjax", "peer", "ratio");
  size_t n_eqns = 0;
  double t_trace = bench::time_median(
      [&] {
        ClosedJaxpr cj = make_jaxpr(step)(params, x, labels);
        auto opt = optimize(*cj);
        n_eqns = opt->eqns().size();
      },
      21);
  config::set_capture_source_info(false);
  double t_trace_nosrc = bench::time_median(
      [&] {
        ClosedJaxpr cj = make_jaxpr(step)(params, x, labels);
        optimize(*cj);
      },
      21);
  config::set_capture_source_info(true);
  double t_eager = bench::time_median([&] { step(params, x, labels); }, 21);
  bench::row("trace+passes MLP train step (" + std::to_string(n_eqns) + " eqns)",
             fmt::format("{:.2f} ms", t_trace * 1e3), fmt::format("eager step {:.2f} ms", t_eager * 1e3),
             t_trace / t_eager, "<= 5 ms");
  bench::row("  the same without source locations", fmt::format("{:.2f} ms", t_trace_nosrc * 1e3),
             fmt::format("with them {:.2f} ms", t_trace * 1e3), t_trace_nosrc / t_trace, "-");

  std::vector<Array> args;
  for (int i = 0; i < 10; ++i) args.push_back(jnp::full({8}, float(i)));
  auto f10 = [](const Array& a0, const Array& a1, const Array& a2, const Array& a3, const Array& a4, const Array& a5,
                const Array& a6, const Array& a7, const Array& a8,
                const Array& a9) { return ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)) + (a8 + a9); };
  auto jf = jit(f10);
  jf(args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8], args[9]);
  const int n = 20000;
  double t_jit = bench::time_median(
                     [&] {
                       for (int i = 0; i < n; ++i)
                         jf(args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8], args[9]);
                     },
                     5) /
                 n;
  double t_eag = bench::time_median(
                     [&] {
                       for (int i = 0; i < n; ++i)
                         f10(args[0], args[1], args[2], args[3], args[4], args[5], args[6], args[7], args[8], args[9]);
                     },
                     5) /
                 n;
  bench::row("cached jit call, 10 args f32[8], 9 adds", fmt::format("{:.2f} us", t_jit * 1e6),
             fmt::format("eager 9 adds {:.2f} us", t_eag * 1e6), t_jit / t_eag, "<= 5 us");
  auto jid = jit([](const std::vector<Array>& a) { return a[0]; });
  double t_id = bench::time_median(
                    [&] {
                      for (int i = 0; i < n; ++i) jid(args);
                    },
                    5) /
                n;
  bench::row("cached jit call, 10 args, identity body", fmt::format("{:.2f} us", t_id * 1e6), "-", 0, "-");
  return 0;
}
