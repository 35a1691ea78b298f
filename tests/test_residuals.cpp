// What a gradient program keeps for its backward pass (jit/passes: recompute_elementwise,
// recompute_shard_map_residuals, sink_broadcasts): short elementwise chains of the forward (GELU's
// tanh, RMSNorm's 2x and x rsqrt(...)) are computed again where the backward reads them instead
// of being written out, and the backward of a normalization stays in one kernel per pass.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>

#include "cjax/cjax.h"
#include "core/array/primitive.h"
#include "jit/executable.h"
#include "jit/passes/passes.h"
#include "test_util.h"
#include "trace/shard_map.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {

// Each output of `got` equals `want`'s within 1e-5 relative.
void check_close(const std::vector<Array>& got, const std::vector<Array>& want) {
  REQUIRE(got.size() == want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    std::vector<float> g = got[k].to_vector<float>(), e = want[k].to_vector<float>();
    REQUIRE(g.size() == e.size());
    for (size_t i = 0; i < g.size(); ++i) CHECK(g[i] == doctest::Approx(e[i]).epsilon(1e-5));
  }
}

}  // namespace

TEST_CASE("a GELU's forward residuals are computed again in the backward kernel, not written out" CJAX_JIT_ONLY) {
  auto gelu = [](const Array& h) {
    return h * 0.5f * (1.0f + jnp::tanh((h + jnp::power(h, 3) * 0.044715f) * 0.7978845834732056f));
  };
  auto loss = [&](const std::vector<Array>& w, const Array& x) {
    return jnp::sum(jnp::square(jnp::matmul(gelu(jnp::matmul(x, w[0])), w[1])));
  };
  auto grads = [&](const std::vector<Array>& w, const Array& x) { return grad(loss)(w, x); };
  Array x = random::normal(random::key(94), {48, 32});
  std::vector<Array> w = {random::normal(random::key(95), {32, 64}) * 0.2f,
                          random::normal(random::key(96), {64, 16}) * 0.2f};
  auto tanh_kernel_outputs = [&] {
    Executable e(make_jaxpr(grads)(w, x));
    std::vector<size_t> outs;  // per kernel that computes a tanh, in program order
    for (const FusedKernel& k : e.plan().kernels)
      if (std::any_of(k.eqns.begin(), k.eqns.end(), [](const JaxprEqn& q) { return q.primitive->name == "tanh"; }))
        outs.push_back(k.outputs.size());
    return outs;
  };
  setenv("CJAX_RECOMPUTE_ELEMENTWISE", "0", 1);
  std::vector<size_t> kept = tanh_kernel_outputs();
  unsetenv("CJAX_RECOMPUTE_ELEMENTWISE");
  std::vector<size_t> recomputed = tanh_kernel_outputs();
  REQUIRE(!kept.empty());
  CHECK(kept[0] >= 4);              // the activation and tanh, 1 - tanh, 0.5 (1 + tanh), 3 h^2 for the backward
  REQUIRE(recomputed.size() == 2);  // the forward kernel, and the backward one that computes tanh again
  CHECK(recomputed[0] == 1);        // writes the activation only
  check_close(jit(grads)(w, x), grads(w, x));

  // In a shard_map body the GELU's constants are pvary(literal), scalar variables: the backward
  // computes tanh again there too (a second tanh in the optimized body).
  Mesh mesh = make_mesh({8}, {"d"});
  auto sharded_grads = [&](const std::vector<Array>& w, const Array& x) {
    // w is the same on every device: its gradient comes out summed over 'd' (pvary's transpose).
    auto body = [&](const std::vector<Array>& w, const Array& xb) { return grad(loss)(w, xb); };
    return shard_map(body, mesh, SpecTree{P(), P("d")}, P())(w, x);
  };
  auto body_tanhs = [&] {
    int64_t tanhs = 0;
    auto program = make_jaxpr(sharded_grads)(w, x);
    for (const JaxprEqn& e : program->eqns())
      if (e.primitive->name == "shard_map") {
        auto body = optimize(*e.params.object<JaxprParam>("jaxpr")->jaxpr);
        for (const JaxprEqn& q : body->eqns()) tanhs += q.primitive->name == "tanh";
      }
    return tanhs;
  };
  setenv("CJAX_RECOMPUTE_ELEMENTWISE", "0", 1);
  CHECK(body_tanhs() == 1);
  unsetenv("CJAX_RECOMPUTE_ELEMENTWISE");
  CHECK(body_tanhs() == 2);
  check_close(jit(sharded_grads)(w, x), grads(w, x));
}

TEST_CASE("grad of a shard_map: the backward body computes a GELU's residuals again from the forward's" CJAX_JIT_ONLY) {
  auto gelu = [](const Array& h) { return nn::gelu(h, true); };  // x * 0.5 (1 + tanh(...)): x is a residual too
  // The same under a checkpoint that saves everything but all_gathers (the transformer sample's
  // FSDP layouts): the backward body then reads the residuals inside its remat2 call.
  bool checkpointed = false;
  SUBCASE("plain") {}
  SUBCASE("checkpointed") { checkpointed = true; }
  Mesh mesh = make_mesh({8}, {"d"});
  // The loss is a shard_map (rows of x over 'd'); grad outside it splits the body in two.
  auto loss = [&](const std::vector<Array>& w, const Array& x) {
    auto body = [&](const std::vector<Array>& w, const Array& xb) {
      auto block = [&](const std::vector<Array>& w, const Array& xb) {
        return jnp::sum(jnp::square(jnp::matmul(gelu(jnp::matmul(xb, w[0])), w[1])));
      };
      Array l = checkpointed ? checkpoint(block, checkpoint_policies::save_everything_except({"all_gather"}))(w, xb)
                             : block(w, xb);
      return lax::psum(l, "d");
    };
    return shard_map(body, mesh, SpecTree{P(), P("d")}, P())(w, x);
  };
  auto grads = [&](const std::vector<Array>& w, const Array& x) { return grad(loss)(w, x); };
  Array x = random::normal(random::key(97), {48, 32});
  std::vector<Array> w = {random::normal(random::key(98), {32, 64}) * 0.2f,
                          random::normal(random::key(99), {64, 16}) * 0.2f};
  // Per shard_map of the optimized program: its outputs and the tanh equations of its body.
  auto boundaries = [&] {
    std::vector<std::pair<size_t, int64_t>> out;
    auto program = optimize(*make_jaxpr(grads)(w, x));
    for (const JaxprEqn& e : program->eqns()) {
      if (e.primitive->name != "shard_map") continue;
      int64_t tanhs = 0;
      for (const JaxprEqn& q : e.params.object<JaxprParam>("jaxpr")->jaxpr->eqns())
        tanhs += q.primitive->name == "tanh";
      out.push_back({e.outputs.size(), tanhs});
    }
    return out;
  };
  // The forward and backward bodies kept apart, as where merge_shard_maps cannot join them.
  setenv("CJAX_MERGE_SHARD_MAPS", "0", 1);
  setenv("CJAX_RECOMPUTE_ELEMENTWISE", "0", 1);
  auto kept = boundaries();
  unsetenv("CJAX_RECOMPUTE_ELEMENTWISE");
  auto recomputed = boundaries();
  unsetenv("CJAX_MERGE_SHARD_MAPS");
  REQUIRE(kept.size() == 2);  // forward and backward
  REQUIRE(recomputed.size() == 2);
  CHECK(kept[0].second == 1);
  CHECK(kept[1].second == 0);  // the backward reads tanh and what is made of it
  // tanh(u), 1 - tanh, 1 + tanh (or 0.5 (1 + tanh)) and h^2 are no longer returned.
  CHECK(recomputed[0].first + 3 <= kept[0].first);
  CHECK(recomputed[1].second == 1);  // computed once in the backward body
  CHECK(recomputed[1].first == kept[1].first);
  // The gradients: against the unsharded loss (the partial sums round differently).
  auto plain = [&](const std::vector<Array>& w, const Array& x) {
    return jnp::sum(jnp::square(jnp::matmul(gelu(jnp::matmul(x, w[0])), w[1])));
  };
  check_close(jit(grads)(w, x), grad(plain)(w, x));
}

TEST_CASE("a sum over the size-1 axes a broadcast added is the broadcast's source") {
  // The transpose of x[..., None] * y: broadcast_in_dim [4, 3] -> [4, 3, 1], then reduce_sum over
  // the new axis. Both go; a sum over a size-1 axis of anything else stays.
  auto f = [](const Array& x, const Array& z) {
    Array expanded = lax::broadcast_in_dim(x, {4, 3, 1}, {0, 1});
    return std::vector<Array>{lax::reduce_sum(expanded, {2}) * 2.0f, lax::reduce_sum(z, {2})};
  };
  Array x = jnp::arange(12).astype(DType::float32).reshape({4, 3});
  Array z = jnp::arange(12).astype(DType::float32).reshape({4, 3, 1});
  auto program = optimize(*make_jaxpr(f)(x, z));
  int sums = 0, broadcasts = 0;
  for (const JaxprEqn& e : program->eqns()) {
    sums += e.primitive->name == "reduce_sum";
    broadcasts += e.primitive->name == "broadcast_in_dim";
  }
  CHECK(sums == 1);  // z's
  CHECK(broadcasts == 0);
  std::vector<Array> got = jit(f)(x, z);
  CHECK(got[0].to_vector<float>() == (x * 2.0f).to_vector<float>());
  CHECK(got[1].to_vector<float>() == x.to_vector<float>());
}

TEST_CASE(
    "RMSNorm's gradient: the forward kernel writes the normalized value, the backward runs in one "
    "kernel" CJAX_JIT_ONLY) {
  // h = x W0 (a GEMM: h is in memory), y = rms_norm(h, g) W1. The backward needs 2h and
  // h rsqrt(mean(h^2) + eps): both are computed again from h where the backward reads h anyway.
  auto loss = [](const std::vector<Array>& w, const Array& x) {
    return jnp::sum(jnp::square(jnp::matmul(nn::rms_norm(jnp::matmul(x, w[0]), w[2], 1e-6), w[1])));
  };
  auto grads = [&](const std::vector<Array>& w, const Array& x) { return grad(loss)(w, x); };
  Array x = random::normal(random::key(90), {64, 32});
  std::vector<Array> w = {random::normal(random::key(91), {32, 48}) * 0.2f,
                          random::normal(random::key(92), {48, 16}) * 0.2f,
                          1.0f + 0.1f * random::normal(random::key(93), {48})};
  // Per kernel that computes the rsqrt (the forward): its outputs of h's full size.
  auto norm_kernels = [&] {
    Executable e(make_jaxpr(grads)(w, x));
    std::vector<int64_t> full_outputs;
    for (const FusedKernel& k : e.plan().kernels)
      if (std::any_of(k.eqns.begin(), k.eqns.end(), [](const JaxprEqn& q) { return q.primitive->name == "rsqrt"; })) {
        int64_t full = 0;
        for (const Var& v : k.outputs) full += v.aval().shape == Shape{64, 48};
        full_outputs.push_back(full);
      }
    return std::pair{full_outputs, e.plan().kernels.size()};
  };
  setenv("CJAX_RECOMPUTE_ELEMENTWISE", "0", 1);
  auto [kept, kept_kernels] = norm_kernels();
  unsetenv("CJAX_RECOMPUTE_ELEMENTWISE");
  auto [recomputed, kernels] = norm_kernels();
  REQUIRE(kept.size() == 1);
  CHECK(kept[0] >= 3);  // 2h, h rsqrt(...) and the normalized value
  REQUIRE(recomputed.size() == 1);
  CHECK(recomputed[0] == 1);  // the normalized value: the next GEMM reads it
  CHECK(kernels <= kept_kernels);
  // The backward's row sum and the dx that reads it are one two-pass kernel: no kernel of its own
  // for the sum over the size-1 axis that the transpose of rsqrt(...)[..., None] emits.
  auto program = optimize(*make_jaxpr(grads)(w, x));
  for (const JaxprEqn& e : program->eqns())
    if (e.primitive->name == "reduce_sum") {
      const Shape& in = atom_aval(e.inputs[0]).shape;
      for (int64_t a : e.params.ints("axes")) CHECK(in[size_t(a)] != 1);
    }
  check_close(jit(grads)(w, x), grads(w, x));
}
