// Differential fuzz test: random programs (tests/fuzz_programs.h) mixing elementwise math,
// broadcasting, reductions, shape ops, indexing, contractions, nn ops and control flow (cond,
// switch_, fori_loop, scan), each checked for
//   eager == jit (per example) == vmap(jit) == jit(vmap(jit)) over the three examples stacked
//     along random in_axes (some inputs unbatched) with random out_axes,
//   grad(eager) == grad(jit) == jit(grad) of the sum of the outputs w.r.t. every input, and
//     vmap(grad(jit)) == the per-example grads,
//   check_grads of the jitted function on the f64 programs (jvp vs central differences, vjp/jvp
//     dot products), order 1, order 2 for every 8th program.
// A failure prints the program as an op list; CJAX_FUZZ_SEED=<seed> CJAX_FUZZ_ONLY=<index>
// reruns just that program (CJAX_FUZZ_COUNT=<n> changes how many are generated).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "autodiff/check_grads.h"
#include "cjax/autodiff.h"
#include "cjax/cjax.h"
#include "cjax/jit.h"
#include "cjax/vmap.h"
#include "fuzz_programs.h"

using namespace cjax;
using cjax::fuzz::Generated;
using cjax::fuzz::Program;
namespace jnp = cjax::numpy;

namespace {

constexpr uint64_t kDefaultSeed = 20240611;
constexpr int kDefaultCount = 450;

uint64_t env_or(const char* name, uint64_t fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::strtoull(v, nullptr, 10) : fallback;
}

struct Tolerance {
  double forward, gradient;
};
// Relative + absolute: |got - want| <= tol * (1 + |want|).
Tolerance tolerance_for(const Program& p) { return p.any_f32() ? Tolerance{1e-4, 2e-3} : Tolerance{1e-5, 1e-5}; }

// "" when `got` matches `want` in shape, dtype and values, else what differs.
std::string compare(const Array& got, const Array& want, double tol, const std::string& what) {
  std::ostringstream os;
  if (got.shape() != want.shape() || got.dtype() != want.dtype()) {
    os << what << ": got " << got.aval().str() << ", want " << want.aval().str();
    return os.str();
  }
  std::vector<double> g = fuzz::detail::host(got), w = fuzz::detail::host(want);
  for (size_t i = 0; i < g.size(); ++i) {
    bool ok = std::abs(g[i] - w[i]) <= tol * (1 + std::abs(w[i])) || (std::isnan(g[i]) && std::isnan(w[i]));
    if (!ok) {
      os << what << ": element " << i << " is " << g[i] << ", want " << w[i] << " (tolerance " << tol << ")";
      return os.str();
    }
  }
  return "";
}

Array sum_of_outputs(const Program& p, const std::vector<Array>& xs) {
  std::vector<Array> outs = fuzz::run(p, xs);
  Array total = jnp::sum(outs[0]);
  for (size_t k = 1; k < outs.size(); ++k) total = total + jnp::sum(outs[k]);
  return total;
}

// Every check of one program; returns the failures (empty when it passes).
// The three examples stacked along each batched input's axis, and vmap's in_axes for them.
struct Batch {
  std::vector<Array> stacked;
  AxisSpec in_axes = 0;
};
Batch stack_examples(const Generated& g) {
  const Program& p = g.program;
  Batch b;
  std::vector<AxisSpec> leaf_axes;
  for (size_t i = 0; i < p.inputs.size(); ++i) {
    if (p.batched[i]) {
      b.stacked.push_back(jnp::stack({g.input_sets[0][i], g.input_sets[1][i], g.input_sets[2][i]}, p.batch_axis[i]));
      leaf_axes.push_back(p.batch_axis[i]);
    } else {
      b.stacked.push_back(g.input_sets[0][i]);
      leaf_axes.push_back(None);
    }
  }
  b.in_axes = AxisSpec(std::vector<AxisSpec>{AxisSpec(leaf_axes)});  // one argument: the input list
  return b;
}
AxisSpec out_axes_of(const Program& p) { return AxisSpec(std::vector<AxisSpec>(p.out_axis.begin(), p.out_axis.end())); }
// Example `e` of a batched output whose examples lie along `axis`.
Array example(const Array& batched, int axis, int64_t e) { return jnp::moveaxis(batched, axis, 0)[e]; }

// Every check of one program; returns the failures (empty when it passes). check_grads_order 0
// skips the numerical derivative checks.
std::vector<std::string> check_program(const Generated& g, int check_grads_order) {
  const Program& p = g.program;
  Tolerance tol = tolerance_for(p);
  std::vector<std::string> failures;
  auto note = [&](const std::string& f) {
    if (!f.empty()) failures.push_back(f);
  };
  std::string stage = "eager";
  try {
    std::vector<std::vector<Array>> eager;
    for (const auto& set : g.input_sets) eager.push_back(fuzz::run(p, set));

    stage = "jit";
    auto f = [&p](const std::vector<Array>& xs) { return fuzz::run(p, xs); };
    auto jitted = jit(f, {.name = "fuzz"});
    for (size_t e = 0; e < g.input_sets.size(); ++e) {
      std::vector<Array> outs = jitted(g.input_sets[e]);
      for (size_t o = 0; o < outs.size(); ++o)
        note(compare(outs[o], eager[e][o], tol.forward,
                     "jit output " + std::to_string(o) + " of example " + std::to_string(e)));
    }
    if (!config::disable_jit() && jitted.trace_count() != 1)
      note("jit traced " + std::to_string(jitted.trace_count()) + " times for one signature");

    stage = "vmap(jit)";
    Batch batch = stack_examples(g);
    auto batched_fn = vmap(jitted, batch.in_axes, out_axes_of(p));
    std::vector<Array> batched = batched_fn(batch.stacked);
    for (size_t o = 0; o < batched.size(); ++o)
      for (int64_t e = 0; e < 3; ++e)
        note(compare(example(batched[o], p.out_axis[o], e), eager[size_t(e)][o], tol.forward,
                     "vmap(jit) output " + std::to_string(o) + " of example " + std::to_string(e)));
    stage = "jit(vmap(jit))";
    std::vector<Array> staged_batch = jit(batched_fn)(batch.stacked);
    for (size_t o = 0; o < staged_batch.size(); ++o)
      note(compare(staged_batch[o], batched[o], tol.forward, "jit(vmap(jit)) output " + std::to_string(o)));

    stage = "grad";
    auto loss = [&p](const std::vector<Array>& xs) { return sum_of_outputs(p, xs); };
    std::vector<std::vector<Array>> g_eager;
    for (const auto& set : g.input_sets) g_eager.push_back(grad(loss)(set));
    stage = "grad(jit)";
    std::vector<Array> g_jit = grad(jit(loss))(g.input_sets[0]);
    stage = "jit(grad)";
    std::vector<Array> g_staged = jit(grad(loss))(g.input_sets[0]);
    for (size_t i = 0; i < g_jit.size(); ++i) {
      note(compare(g_jit[i], g_eager[0][i], tol.gradient, "grad(jit) of input " + std::to_string(i)));
      note(compare(g_staged[i], g_eager[0][i], tol.gradient, "jit(grad) of input " + std::to_string(i)));
    }
    stage = "vmap(grad(jit))";
    std::vector<Array> g_batched = vmap(grad(jit(loss)), batch.in_axes)(batch.stacked);
    for (size_t i = 0; i < g_batched.size(); ++i)
      for (int64_t e = 0; e < 3; ++e)
        note(compare(g_batched[i][e], g_eager[size_t(e)][i], tol.gradient,
                     "vmap(grad(jit)) of input " + std::to_string(i) + ", example " + std::to_string(e)));

    if (check_grads_order > 0) {
      stage = "check_grads(jit)";
      check_grads(jitted, g.input_sets[0], {.order = check_grads_order});
    }
  } catch (const std::exception& e) {
    failures.push_back(stage + " threw: " + e.what());
  }
  return failures;
}

}  // namespace

TEST_CASE("differential fuzz: eager == jit == vmap(jit), grad(eager) == grad(jit) == vmap(grad), check_grads") {
  uint64_t seed = env_or("CJAX_FUZZ_SEED", kDefaultSeed);
  int count = int(env_or("CJAX_FUZZ_COUNT", kDefaultCount));
  const char* only = std::getenv("CJAX_FUZZ_ONLY");
  if (only && *only) count = std::max(count, std::atoi(only) + 1);
  auto start = std::chrono::steady_clock::now();

  std::map<std::string, int> kind_counts;
  int programs = 0, failed = 0, gradient_checked = 0;
  for (int index = 0; index < count; ++index) {
    if (only && *only && index != std::atoi(only)) continue;
    Generated g;
    try {
      g = fuzz::generate(seed, index);
    } catch (const std::exception& e) {
      ++failed;
      FAIL_CHECK("generating program " << index << " of seed " << seed << " failed:\n" << std::string(e.what()));
      continue;
    }
    if (only) MESSAGE(g.program.str());
    ++programs;
    for (const auto& op : g.program.ops) ++kind_counts[fuzz::kind_name(op.kind)];
    // Central differences are only meaningful in f64 (check_grads uses eps = 2e-2 for f32);
    // every 8th program is also checked to second order.
    int order = g.program.all_f64() ? (index % 8 == 0 ? 2 : 1) : 0;
    gradient_checked += order > 0;
    std::vector<std::string> failures = check_program(g, order);
    if (!failures.empty()) {
      ++failed;
      std::string all;
      for (const auto& f : failures) all += "\n  " + f;
      FAIL_CHECK(g.program.str() << all);
    }
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::ostringstream coverage;
  for (const auto& [name, n] : kind_counts) coverage << " " << name << "=" << n;
  MESSAGE(programs << " programs (" << gradient_checked << " with check_grads), " << failed << " failed, " << seconds
                   << " s; ops:" << coverage.str());
  if (only) return;
  CHECK(programs >= 300);
  CHECK(gradient_checked >= 50);
  // The generator reaches every op kind often enough to matter.
  for (int k = 0; k < int(fuzz::Kind::Count); ++k)
    CHECK_MESSAGE(kind_counts[fuzz::kind_name(fuzz::Kind(k))] >= 15, fuzz::kind_name(fuzz::Kind(k)));
}
