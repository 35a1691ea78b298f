// The collective recorder (cjax/collective_recorder.h) on the two-layer MLP of
// docs/sharding.md §3.1: the collectives of DP and FSDP in the forward and backward passes,
// listed from the staged program and recorded while it runs.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "test_util.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace rec_test {
struct Mlp {
  cjax::Array w1, w2;
};
CJAX_TREE(Mlp, w1, w2)
}  // namespace rec_test
using rec_test::Mlp;

namespace {
Array local_loss(const Array& x, const Array& t, const Array& w1, const Array& w2) {
  Array y = jnp::dot(nn::relu(jnp::dot(x, w1)), w2);
  return jnp::mean(jnp::square(y - t));
}
Mesh mesh4(const char* n) { return make_mesh({4}, {n}); }

Array loss_dp(const Mlp& p, const Array& x, const Array& t) {
  return shard_map([](const Mlp& w, const Array& xb,
                      const Array& tb) { return lax::pmean(local_loss(xb, tb, w.w1, w.w2), "data"); },
                   mesh4("data"), {P(), P("data"), P("data")}, P())(p, x, t);
}
Array loss_fsdp(const Mlp& p, const Array& x, const Array& t) {
  return shard_map(
      [](const Mlp& w, const Array& xb, const Array& tb) {
        Array w1 = lax::all_gather(w.w1, "fsdp", {.axis = 0, .tiled = true});
        Array w2 = lax::all_gather(w.w2, "fsdp", {.axis = 1, .tiled = true});
        return lax::pmean(local_loss(xb, tb, w1, w2), "fsdp");
      },
      mesh4("fsdp"), {{P("fsdp", None), P(None, "fsdp")}, P("fsdp"), P("fsdp")}, P())(p, x, t);
}

struct Problem {
  Mlp p{random::normal(random::key(1), {8, 32}), random::normal(random::key(2), {32, 8})};
  Array x = random::normal(random::key(3), {16, 8}), t = random::normal(random::key(4), {16, 8});
  // The gradient computed by `g` equals the single-device one.
  template <class G>
  void check_grad(const G& g) const {
    Mlp dw = g(p, x, t);
    auto ref =
        grad([](const Mlp& w, const Array& xx, const Array& tt) { return local_loss(xx, tt, w.w1, w.w2); })(p, x, t);
    check_all_close(dw.w1, ref.w1, 1e-5);
    check_all_close(dw.w2, ref.w2, 1e-5);
  }
};

// "phase kind axes in->out" of the collectives that move data.
std::vector<std::string> moving(const std::vector<debug::CollectiveRecord>& rs) {
  std::vector<std::string> out;
  for (const auto& r : rs)
    if (r.communicates)
      out.push_back(fmt::format("{} {} {} {}->{}", r.phase == debug::Phase::Backward ? "bwd" : "fwd", r.kind,
                                fmt::join(r.axes, ","), shape_str(r.in_shape), shape_str(r.out_shape)));
  return out;
}
}  // namespace

TEST_CASE("DP: one all-reduce of the loss forward, one per weight backward") {
  Problem pr;
  auto [p, x, t] = std::tuple{pr.p, pr.x, pr.t};
  auto g = grad(loss_dp);
  std::vector<std::string> want{"fwd psum_invariant data ()->()", "bwd psum_invariant data (32, 8)->(32, 8)",
                                "bwd psum_invariant data (8, 32)->(8, 32)"};
  CHECK(moving(debug::collectives(make_jaxpr(g)(p, x, t))) == want);
  debug::CollectiveRecorder rec;
  pr.check_grad(jit(g));
  CHECK(moving(rec.records()) == want);
  CHECK(rec.records().front().str() == "forward psum_invariant over ('data',) f32[] -> f32[] (4 bytes)");
}

TEST_CASE("FSDP: all_gathers forward, reduce_scatters backward") {
  Problem pr;
  auto [p, x, t] = std::tuple{pr.p, pr.x, pr.t};
  auto g = grad(loss_fsdp);
  std::vector<std::string> got = moving(debug::collectives(make_jaxpr(g)(p, x, t)));
  std::vector<std::string> want{"fwd all_gather fsdp (2, 32)->(8, 32)", "fwd all_gather fsdp (32, 2)->(32, 8)",
                                "fwd psum_invariant fsdp ()->()", "bwd reduce_scatter fsdp (32, 8)->(32, 2)",
                                "bwd reduce_scatter fsdp (8, 32)->(2, 32)"};
  CHECK(got == want);
  debug::CollectiveRecorder rec;
  pr.check_grad(jit(g));
  CHECK(moving(rec.records()) == want);
  // No pvary moves data; all are listed.
  int casts = 0;
  for (const auto& r : debug::collectives(make_jaxpr(g)(p, x, t))) casts += r.kind == "pvary" && !r.communicates;
  CHECK(casts >= 1);
}
