// Differentiating shard_map (docs/shard_map.md §3): the worked examples A–V of §3.5 with both
// check_vma settings — values, gradients, and the collectives in the transposed bodies — plus
// jvp, vmap and jit compositions, and jit running consecutive shard_maps as one.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstdlib>
#include <map>

#include "core/spmd/collectives.h"
#include "jit/passes/passes.h"
#include "test_util.h"
#include "trace/jaxpr.h"
#include "trace/shard_map.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {
Array arange_f(int64_t n) { return jnp::arange(n).astype(f32); }
std::vector<double> v(const Array& a) {
  std::vector<float> f = a.astype(f32).to_vector<float>();
  return std::vector<double>(f.begin(), f.end());
}
Mesh mesh_i(int n = 4) { return make_mesh({n}, {"i"}); }

// The body of every shard_map equation of `j`, in order (not recursing into the bodies' own
// sub-jaxprs).
std::vector<std::shared_ptr<const Jaxpr>> body_jaxprs(const ClosedJaxpr& j) {
  std::vector<std::shared_ptr<const Jaxpr>> out;
  std::function<void(const Jaxpr&)> walk = [&](const Jaxpr& jp) {
    for (const JaxprEqn& e : jp.eqns()) {
      if (e.primitive == &g_shard_map) out.push_back(ShardMapInfo::from(e.params).body);
      for (const auto& [name, val] : e.params.items())
        if (auto* obj = std::get_if<std::shared_ptr<const ParamObject>>(&val))
          if (auto* jp2 = dynamic_cast<const JaxprParam*>(obj->get()); jp2 && e.primitive != &g_shard_map)
            walk(*jp2->jaxpr);
    }
  };
  walk(*j.jaxpr);
  return out;
}
// Primitive counts of those bodies.
std::vector<std::map<std::string, int>> bodies(const ClosedJaxpr& j) {
  std::vector<std::map<std::string, int>> out;
  for (const auto& body : body_jaxprs(j)) {
    std::map<std::string, int> counts;
    for (const JaxprEqn& b : body->eqns()) counts[b.primitive->name]++;
    out.push_back(counts);
  }
  return out;
}
// The parameters of the only `prim` equation of the last shard_map body of `j`.
Params last_body_params(const ClosedJaxpr& j, const std::string& prim) {
  auto all = body_jaxprs(j);
  REQUIRE(!all.empty());
  std::vector<Params> found;
  for (const JaxprEqn& e : all.back()->eqns())
    if (e.primitive->name == prim) found.push_back(e.params);
  REQUIRE(found.size() == 1);
  return found[0];
}
int count(const std::map<std::string, int>& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? 0 : it->second;
}
int collectives(const std::map<std::string, int>& m) {
  int n = 0;
  for (const char* k : {"psum", "psum_invariant", "all_gather", "reduce_scatter", "ppermute", "all_to_all", "pmax",
                        "pmin", "all_gather_invariant", "pbroadcast"})
    n += count(m, k);
  return n;
}
ShardMapOptions vma(bool on) { return {.check_vma = on}; }
}  // namespace

TEST_CASE("A: fan-in psum to an unmapped output") {
  for (bool on : {true, false}) {
    CAPTURE(on);
    auto f = shard_map([](const Array& x) { return lax::psum(x, "i"); }, mesh_i(), P("i"), P(), vma(on));
    auto loss = [&](const Array& x) { return jnp::sum(f(x)); };
    CHECK(v(f(arange_f(4))) == std::vector<double>{6});
    CHECK(v(grad(loss)(arange_f(4))) == std::vector<double>{1, 1, 1, 1});
    CHECK(v(jit(grad(loss))(arange_f(4))) == std::vector<double>{1, 1, 1, 1});
    if (on) {
      auto b = bodies(make_jaxpr(grad(loss))(arange_f(4)));
      REQUIRE(!b.empty());
      CHECK(count(b.back(), "pvary") == 1);
      CHECK(collectives(b.back()) == 0);
    }
  }
}

TEST_CASE("B: fan-out identity") {
  for (bool on : {true, false}) {
    CAPTURE(on);
    auto f = shard_map([](const Array& x) { return x; }, mesh_i(), P(), P("i"), vma(on));
    auto loss = [&](const Array& x) { return jnp::sum(f(x)); };
    Array x = jnp::array(std::vector<float>{1, 2});
    CHECK(v(f(x)) == std::vector<double>{1, 2, 1, 2, 1, 2, 1, 2});
    CHECK(v(grad(loss)(x)) == std::vector<double>{4, 4});
    CHECK(v(jit(grad(loss))(x)) == std::vector<double>{4, 4});
    if (on) {
      auto fwd = bodies(make_jaxpr(f)(x));
      REQUIRE(fwd.size() == 1);
      CHECK(fwd[0] == std::map<std::string, int>{{"pvary", 1}});
      auto b = bodies(make_jaxpr(grad(loss))(x));
      CHECK(b.back() == std::map<std::string, int>{{"psum_invariant", 1}});
    }
  }
}

TEST_CASE("C: psum with implicit fan-out") {
  for (bool on : {true, false}) {
    CAPTURE(on);
    auto f = shard_map([](const Array& x) { return lax::psum(x, "i"); }, mesh_i(), P("i"), P("i"), vma(on));
    auto loss = [&](const Array& x) { return jnp::sum(f(x)); };
    CHECK(v(f(arange_f(4))) == std::vector<double>{6, 6, 6, 6});
    CHECK(v(grad(loss)(arange_f(4))) == std::vector<double>{4, 4, 4, 4});
    if (on) {
      CHECK(bodies(make_jaxpr(f)(arange_f(4)))[0] == std::map<std::string, int>{{"psum_invariant", 1}, {"pvary", 1}});
      auto b = bodies(make_jaxpr(grad(loss))(arange_f(4)));
      CHECK(b.back() == std::map<std::string, int>{{"psum_invariant", 1}, {"pvary", 1}});
    }
  }
}

TEST_CASE("D: the cursed identity transposes to an empty body") {
  for (bool on : {true, false}) {
    CAPTURE(on);
    auto f = shard_map([](const Array& x) { return x; }, mesh_i(), P(), P(), vma(on));
    CHECK(f(Array(3.f)).item<float>() == 3.f);
    CHECK(grad(f)(Array(3.f)).item<float>() == 1.f);
    // check_vma=false (V): the transpose divides the P() cotangent by 4 and psums the P() input
    // cotangent, psum(ct/4) = ct.
    auto b = bodies(make_jaxpr(grad(f))(Array(3.f)));
    REQUIRE(!b.empty());
    if (on)
      CHECK(b.back().empty());
    else
      CHECK(b.back() == std::map<std::string, int>{{"div", 1}, {"psum", 1}});
    // Transposed twice (the vjp of ct -> vjp(f)(ct)): t(t(f)) == f, again without communication.
    auto once = [&](const Array& ct) {
      auto [y, f_vjp] = vjp(f, Array(3.f));
      return std::get<0>(f_vjp(ct));
    };
    CHECK(once(Array(2.f)).item<float>() == 2.f);
    CHECK(grad(once)(Array(2.f)).item<float>() == 1.f);
    // With check_vma=false the program grows with every transposition (§3.1): two psums.
    auto twice = bodies(make_jaxpr(grad(once))(Array(2.f)));
    REQUIRE(twice.size() >= 2);
    if (on)
      for (const auto& body : twice) CHECK(body.empty());
    else
      CHECK(twice.back() == std::map<std::string, int>{{"div", 2}, {"psum", 2}});
  }
}

TEST_CASE("E, F: psum of a replicated input and a repeated psum") {
  for (bool on : {true, false}) {
    CAPTURE(on);
    auto e = shard_map([](const Array& x) { return lax::psum(x, "i"); }, mesh_i(), P(), P(), vma(on));
    CHECK(e(Array(1.5f)).item<float>() == 6.f);
    CHECK(grad(e)(Array(1.5f)).item<float>() == 4.f);
    auto f =
        shard_map([](const Array& x) { return lax::psum(lax::psum(x, "i"), "i"); }, mesh_i(), P("i"), P(), vma(on));
    auto loss = [&](const Array& x) { return jnp::sum(f(x)); };
    CHECK(v(f(arange_f(4))) == std::vector<double>{24});
    CHECK(v(grad(loss)(arange_f(4))) == std::vector<double>{4, 4, 4, 4});
  }
}

TEST_CASE("G, H: mapped outputs after psum") {
  for (bool on : {true, false}) {
    CAPTURE(on);
    auto g = shard_map([](const Array& x) { return lax::psum(x, "i"); }, mesh_i(), P("i"), P("i"), vma(on));
    Array w = jnp::array(std::vector<float>{1, 2, 3, 4});
    CHECK(v(grad([&](const Array& x) { return jnp::sum(g(x) * w); })(arange_f(4))) ==
          std::vector<double>{10, 10, 10, 10});
    auto h = shard_map([](const Array& x, const Array& y) { return lax::psum(x, "i") * y; }, mesh_i(), {P("i"), P("i")},
                       P("i"), vma(on));
    CHECK(v(h(arange_f(4), w)) == std::vector<double>{6, 12, 18, 24});
    auto [gx, gy] =
        grad([&](const Array& x, const Array& y) { return jnp::sum(h(x, y)); }, argnums<0, 1>)(arange_f(4), w);
    CHECK(v(gx) == std::vector<double>{10, 10, 10, 10});
    CHECK(v(gy) == std::vector<double>{6, 6, 6, 6});
  }
}

TEST_CASE("I: data-parallel mean loss needs one all-reduce for the weight gradient") {
  for (bool on : {true, false}) {
    CAPTURE(on);
    auto loss = [&](const Array& w, const Array& x) {
      return shard_map([](const Array& wb, const Array& xb) { return lax::pmean(jnp::sum(wb * xb), "i"); }, mesh_i(),
                       {P(), P("i")}, P(), vma(on))(w, x);
    };
    CHECK(loss(Array(2.f), arange_f(8)).item<float>() == 14.f);
    auto [gw, gx] = grad(loss, argnums<0, 1>)(Array(2.f), arange_f(8));
    CHECK(gw.item<float>() == 7.f);
    CHECK(v(gx) == std::vector<double>(8, 0.5));
    if (on) {
      auto b = bodies(make_jaxpr(grad(loss))(Array(2.f), arange_f(8)));
      CHECK(count(b.back(), "psum_invariant") == 1);
    }
  }
}

TEST_CASE("J, K, L: replicated and closed-over parameters") {
  for (bool on : {true, false}) {
    CAPTURE(on);
    auto j = shard_map([](const Array& w, const Array& x) { return w * x; }, mesh_i(), {P(), P("i")}, P("i"), vma(on));
    auto [gw, gx] = grad([&](const Array& w, const Array& x) { return jnp::sum(j(w, x)); },
                         argnums<0, 1>)(jnp::array(std::vector<float>{1, 2}), arange_f(8));
    CHECK(v(gw) == std::vector<double>{12, 16});
    CHECK(v(gx) == std::vector<double>{1, 2, 1, 2, 1, 2, 1, 2});
    auto k = [&](const Array& w) {
      return jnp::sum(shard_map([&](const Array& x) { return w * x; }, mesh_i(), P("i"), P("i"), vma(on))(arange_f(8)));
    };
    CHECK(grad(k)(Array(1.f)).item<float>() == 28.f);
    auto l = [&](const Array& w, const Array& x) {
      return jnp::sum(shard_map([&](const Array& xb) { return lax::psum(jnp::sum(jnp::square(w * xb)), "i"); },
                                mesh_i(), P("i"), P(), vma(on))(x));
    };
    CHECK(l(Array(3.f), arange_f(8)).item<float>() == 1260.f);
    CHECK(grad(l)(Array(3.f), arange_f(8)).item<float>() == 840.f);
  }
}

TEST_CASE("M, N, O: all_gather and psum_scatter transpose into each other") {
  for (bool on : {true, false}) {
    CAPTURE(on);
    auto m = shard_map([](const Array& x) { return lax::all_gather(x, "i", {.tiled = true}); }, mesh_i(), P("i"),
                       P("i"), vma(on));
    auto m_loss = [&](const Array& x) { return jnp::sum(m(x) * arange_f(16)); };
    CHECK(v(grad(m_loss)(arange_f(4))) == std::vector<double>{24, 28, 32, 36});
    // M's transposed body is one psum_scatter (reduce_scatter) along the gathered axis.
    ClosedJaxpr mj = make_jaxpr(grad(m_loss))(arange_f(4));
    auto mb = bodies(mj).back();
    CHECK(count(mb, "reduce_scatter") == 1);
    CHECK(collectives(mb) == 1);
    Params mp = last_body_params(mj, "reduce_scatter");
    CHECK(mp.i("scatter_dimension") == 0);
    CHECK(mp.get<bool>("tiled"));
    CHECK(collective_axes(mp) == std::vector<std::string>{"i"});
    auto o = shard_map([](const Array& x) { return lax::psum_scatter(x, "i", {.tiled = true}); }, mesh_i(), P("i"),
                       P("i"), vma(on));
    Array w = jnp::array(std::vector<float>{1, 2, 3, 4});
    auto o_loss = [&](const Array& x) { return jnp::sum(o(x) * w); };
    CHECK(v(grad(o_loss)(arange_f(16))) == v(jnp::tile(w, {4})));
    // O's transposed body is one tiled all_gather along the scattered dimension.
    ClosedJaxpr oj = make_jaxpr(grad(o_loss))(arange_f(16));
    auto ob = bodies(oj).back();
    CHECK(count(ob, "all_gather") == 1);
    CHECK(collectives(ob) == 1);
    Params op = last_body_params(oj, "all_gather");
    CHECK(op.i("all_gather_dimension") == 0);
    CHECK(op.get<bool>("tiled"));
    // N: all_gather_invariant transposes to a local slice (check_vma=true); with check_vma=false
    // it is a plain all_gather, so its transpose is a psum_scatter of the divided cotangent.
    auto n = shard_map([](const Array& a) { return lax::all_gather(a, "i", {.tiled = true, .to_invariant = true}); },
                       mesh_i(), P("i"), P(), vma(on));
    auto n_loss = [&](const Array& a) { return jnp::sum(n(a)); };
    CHECK(v(n(arange_f(8))) == v(arange_f(8)));
    Array gn = grad(n_loss)(arange_f(8));
    CHECK(v(gn) == std::vector<double>(8, 1));
    CHECK(gn.sharding().str() == "NamedSharding(mesh=Mesh('i': 4), spec=P('i',), memory_kind=device)");
    CHECK(v(jit(grad(n_loss))(arange_f(8))) == std::vector<double>(8, 1));
    auto nb = bodies(make_jaxpr(grad(n_loss))(arange_f(8))).back();
    if (on) {
      CHECK(collectives(nb) == 0);
      CHECK(count(nb, "dynamic_slice") == 1);
      CHECK(count(nb, "axis_index") == 1);
    } else {
      CHECK(count(nb, "reduce_scatter") == 1);
      CHECK(collectives(nb) == 1);
    }
  }
}

TEST_CASE("P, Q, R: ppermute, all_to_all and 2-D psum gradients") {
  for (bool on : {true, false}) {
    CAPTURE(on);
    auto p = shard_map(
        [](const Array& x) {
          return lax::ppermute(x, "i", {{0, 1}, {1, 2}, {2, 3}});
        },
        mesh_i(), P("i"), P("i"), vma(on));
    Array x = jnp::array(std::vector<float>{1, 2, 3, 4});
    CHECK(v(p(x)) == std::vector<double>{0, 1, 2, 3});
    Array w = jnp::array(std::vector<float>{10, 20, 30, 40});
    auto p_loss = [&](const Array& y) { return jnp::sum(p(y) * w); };
    CHECK(v(grad(p_loss)(x)) == std::vector<double>{20, 30, 40, 0});
    // P's transposed body is a ppermute with every pair swapped.
    ClosedJaxpr pj = make_jaxpr(grad(p_loss))(x);
    CHECK(collectives(bodies(pj).back()) == 1);
    CHECK(last_body_params(pj, "ppermute").get<std::vector<std::vector<int64_t>>>("perm") ==
          std::vector<std::vector<int64_t>>{{1, 0}, {2, 1}, {3, 2}});
    auto q = shard_map([](const Array& a) { return lax::all_to_all(a, "x", 1, 0, {.tiled = true}); },
                       make_mesh({4}, {"x"}), P("x", None), P(None, "x"), vma(on));
    Array a = arange_f(64).reshape({8, 8});
    CHECK(v(q(a)) == v(a));
    auto q_loss = [&](const Array& y) { return 2.f * jnp::sum(q(y)); };
    CHECK(v(grad(q_loss)(a)) == std::vector<double>(64, 2));
    // Q's transposed body is an all_to_all with split and concat axes swapped.
    ClosedJaxpr qj = make_jaxpr(grad(q_loss))(a);
    CHECK(collectives(bodies(qj).back()) == 1);
    Params qp = last_body_params(qj, "all_to_all");
    CHECK(qp.i("split_axis") == 0);
    CHECK(qp.i("concat_axis") == 1);
    CHECK(qp.get<bool>("tiled"));
    auto r = shard_map([](const Array& y) { return lax::psum(y, "j"); }, make_mesh({2, 2}, {"i", "j"}), P("i", "j"),
                       P("i", None), vma(on));
    Array x4 = arange_f(16).reshape({4, 4});
    CHECK(v(r(x4)) == std::vector<double>{2, 4, 10, 12, 18, 20, 26, 28});
    CHECK(v(grad([&](const Array& y) {
            return jnp::sum(r(y) * arange_f(8).reshape({4, 2}));
          })(x4)) == std::vector<double>{0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5, 6, 7, 6, 7});
  }
}

TEST_CASE("S, U: invariant over an unmentioned axis; closed-over scalar with no inputs") {
  for (bool on : {true, false}) {
    CAPTURE(on);
    auto s =
        shard_map([](const Array& x, const Array& y) { return jnp::sin(x) + 3.f + std::tan(2.f) * jnp::cos(x) + y; },
                  make_mesh({2, 2}, {"x", "y"}), {P("x"), P(None)}, P("x"), vma(on));
    Array x = arange_f(8) / 10.f, y = arange_f(4) / 10.f;
    std::vector<float> xs = x.to_vector<float>(), ys = y.to_vector<float>(), want;
    for (size_t k = 0; k < 8; ++k) want.push_back(std::sin(xs[k]) + 3.f + std::tan(2.f) * std::cos(xs[k]) + ys[k % 4]);
    check_all_close(s(x, y), jnp::array(want), 1e-6);
    auto gy = grad([&](const Array& a, const Array& b) { return jnp::sum(s(a, b)); }, argnums<1>)(x, y);
    check_all_close(gy, jnp::full({4}, Array(2.f)), 1e-6);
    auto u = [&](const Array& z) {
      return shard_map([&]() { return jnp::sin(z); }, mesh_i(), SpecTree{}, P(), vma(on))();
    };
    CHECK(grad(u)(Array(2.f)).item<float>() == doctest::Approx(std::cos(2.0)).epsilon(1e-6));
  }
}

TEST_CASE("a tangent that dies at stop_gradient keeps no residuals (softmax's max)") {
  // softmax subtracts stop_gradient(max(x)): the jvp of max (its argmax mask and count) is
  // computed and then dropped. Neither side of the split body may keep it.
  auto f = shard_map([](const Array& x) { return nn::softmax(x); }, mesh_i(), P("i"), P("i"));
  auto plain = [](const Array& x) { return jnp::sum(jnp::square(nn::softmax(x))); };
  auto loss = [&](const Array& x) { return jnp::sum(jnp::square(f(x))); };
  Array x = jnp::reshape(arange_f(32), {8, 4}) * 0.3f;
  auto b = bodies(make_jaxpr(grad(loss))(x));
  REQUIRE(b.size() >= 2);
  for (const auto& body : b) {
    CHECK(count(body, "eq") == 0);
    CHECK(count(body, "reduce_max") <= 1);
  }
  std::vector<double> want = v(grad(plain)(x)), got = v(grad(loss)(x));
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-6));
}

TEST_CASE("jvp, vmap and jit compose with shard_map") {
  auto f = shard_map([](const Array& x) { return lax::psum(jnp::sin(x), "i"); }, mesh_i(), P("i"), P());
  auto [y, t] = jvp(f, std::tuple{arange_f(4)}, std::tuple{jnp::ones({4})});
  check_all_close(y, jnp::sum(jnp::sin(arange_f(4)), 0, true), 1e-5);
  check_all_close(t, jnp::sum(jnp::cos(arange_f(4)), 0, true), 1e-5);
  Array xs = arange_f(12).reshape({3, 4});
  Array batched = vmap(f)(xs);
  CHECK(batched.shape() == Shape{3, 1});
  for (int b = 0; b < 3; ++b) check_all_close(batched[b], f(xs[b]), 1e-5);
  check_all_close(jit(vmap(f))(xs), batched, 1e-5);
  auto inner_jit = shard_map(jit([](const Array& x) { return lax::psum(x * x, "i"); }), mesh_i(), P("i"), P());
  CHECK(v(inner_jit(arange_f(4))) == std::vector<double>{14});
  CHECK(v(grad([&](const Array& x) { return jnp::sum(inner_jit(x)); })(arange_f(4))) ==
        std::vector<double>{0, 2, 4, 6});
}

TEST_CASE("vmap with spmd_axis_name splits the batch over a mesh axis") {
  Mesh mesh = make_mesh({2, 4}, {"y", "x"});
  auto f = shard_map([](const Array& x) { return lax::psum(x, "x"); }, mesh, P("x"), P());
  Array xs = arange_f(16).reshape({2, 8});
  auto vf = vmap(f, 0, 0, {.spmd_axis_name = "y"});
  Array got = vf(xs);
  CHECK(got.shape() == Shape{2, 2});
  std::vector<float> all = got.to_vector<float>();
  for (int b = 0; b < 2; ++b)
    CHECK(std::vector<float>(all.begin() + 2 * b, all.begin() + 2 * b + 2) == f(xs[b]).to_vector<float>());
  std::string text = make_jaxpr(vf)(xs).str();
  CHECK(text.find("in_specs=(P('y', 'x'),)") != std::string::npos);
  CHECK(text.find("out_specs=(P('y',),)") != std::string::npos);
  auto bad = shard_map([](const Array& x) { return x; }, mesh, P("y"), P("y"));
  CHECK_ERR(vmap(bad, 0, 0, {.spmd_axis_name = "y"})(xs), SpecError, "spmd_axis_name cannot appear");
}

TEST_CASE("T (D1): cond with a varying predicate makes its outputs vary") {
  Mesh m = make_mesh({2}, {"i"});
  auto body = [](const Array& x) {
    Array y = lax::cond(
        lax::axis_index("i") == 0, [](const Array& a) { return 2.f * a; }, [](const Array& a) { return 3.f * a; }, x);
    return jnp::expand_dims(y, 0);
  };
  auto f = shard_map(body, m, P(), P("i"));
  CHECK(v(f(Array(2.f))) == std::vector<double>{4, 6});
  CHECK(v(jit(f)(Array(2.f))) == std::vector<double>{4, 6});
  CHECK(grad([&](const Array& x) { return jnp::sum(f(x)); })(Array(2.f)).item<float>() == 5.f);
  CHECK(jit(grad([&](const Array& x) { return jnp::sum(f(x)); }))(Array(2.f)).item<float>() == 5.f);
  // The predicate varies, so the unexpanded result cannot be declared replicated.
  auto scalar = shard_map(
      [](const Array& x) {
        return lax::cond(
            lax::axis_index("i") == 0, [](const Array& a) { return 2.f * a; }, [](const Array& a) { return 3.f * a; },
            x);
      },
      m, P(), P());
  CHECK_ERR(scalar(Array(2.f)), VmaError, "require replication");
  CHECK_ERR(jit(scalar)(Array(2.f)), VmaError, "require replication");
}

TEST_CASE("D3: a loop carry that starts invariant and becomes varying") {
  Mesh m = make_mesh({4}, {"i"});
  auto f = shard_map(
      [](const Array& x) {
        Array c = lax::fori_loop(
            0, 3, [](const Array&, const Array& c) { return c + lax::axis_index("i"); }, jnp::zeros({}, i32));
        Array s = lax::scan(
                      [](const Array& c, const Array& xi) {
                        return std::pair{c + xi * lax::axis_index("i").astype(f32), c};
                      },
                      Array(0.f), x)
                      .first;
        return jnp::stack({c.astype(f32), s});
      },
      m, P(), P("i"));
  std::vector<double> want;
  for (int d = 0; d < 4; ++d) {
    want.push_back(3 * d);
    want.push_back(d * (0 + 1 + 2));
  }
  CHECK(v(f(arange_f(3))) == want);
  CHECK(v(jit(f)(arange_f(3))) == want);
  auto g = grad([&](const Array& x) { return jnp::sum(f(x)); })(arange_f(3));
  CHECK(v(g) == std::vector<double>{6, 6, 6});  // d/dx_k of sum_d d*x_k = 0+1+2+3
}

TEST_CASE("grad of a nested partial-manual shard_map (issue 16 item 2)") {
  // The inner shard_map's out_specs gather over 'j': running it inside the outer body exchanges
  // blocks between devices, so the outer body needs its devices' communicator.
  Mesh m = make_mesh({2, 2}, {"i", "j"});
  Array x = jnp::arange(32).astype(f32).reshape({4, 8}) / 10.0;
  std::vector<double> xv = v(x);
  {
    auto inner =
        shard_map([](const Array& a) { return a * a * a; }, m, P(None, "j"), P(None, "j"), {.axis_names = {"j"}});
    auto outer =
        shard_map([inner](const Array& a) { return inner(a); }, m, P("i", None), P("i", None), {.axis_names = {"i"}});
    auto loss = [outer](const Array& a) { return jnp::sum(outer(a)); };
    std::vector<double> cube, three_sq;
    for (double e : xv) {
      cube.push_back(e * e * e);
      three_sq.push_back(3 * e * e);
    }
    auto close = [](const std::vector<double>& got, const std::vector<double>& want) {
      REQUIRE(got.size() == want.size());
      for (size_t k = 0; k < got.size(); ++k) CHECK(got[k] == doctest::Approx(want[k]).epsilon(1e-5));
    };
    close(v(outer(x)), cube);
    close(v(jit(outer)(x)), cube);
    close(v(grad(loss)(x)), three_sq);
    close(v(jit(grad(loss))(x)), three_sq);
  }
  {
    // The inner body sums its two column blocks over 'j': s = a^3 + (the other block)^3, out s * a.
    auto inner = shard_map([](const Array& a) { return lax::psum(a * a * a, "j") * a; }, m, P(None, "j"), P(None, "j"),
                           {.axis_names = {"j"}});
    auto outer =
        shard_map([inner](const Array& a) { return inner(a); }, m, P("i", None), P("i", None), {.axis_names = {"i"}});
    auto loss = [outer](const Array& a) { return jnp::sum(outer(a)); };
    auto reference = [](const Array& a) {  // one device, no shard_map
      Array l = lax::slice_in_dim(a, 0, 4, 1, 1), r = lax::slice_in_dim(a, 4, 8, 1, 1);
      Array s = l * l * l + r * r * r;
      return jnp::concatenate({s * l, s * r}, 1);
    };
    auto ref_loss = [reference](const Array& a) { return jnp::sum(reference(a)); };
    check_all_close(outer(x), reference(x), 1e-5);
    check_all_close(jit(outer)(x), reference(x), 1e-5);
    Array want = grad(ref_loss)(x);
    check_all_close(grad(loss)(x), want, 1e-5);
    check_all_close(jit(grad(loss))(x), want, 1e-5);
    // By hand at one element: d/dl [ (l^3 + r^3) (l + r) ] = 3l^2 (l + r) + (l^3 + r^3).
    double l = xv[1], r = xv[5];
    CHECK(v(want)[1] == doctest::Approx(3 * l * l * (l + r) + l * l * l + r * r * r).epsilon(1e-5));
  }
}

// ---------------------------------------------------------------------------------------------
// jit runs grad's forward and backward bodies and an update shard_map after them as one
// shard_map (jit/passes/merge_shard_maps.cpp): same values, same collectives in the same phases.

namespace {
std::vector<std::string> moving_collectives(const std::vector<debug::CollectiveRecord>& rs) {
  std::vector<std::string> out;
  for (const auto& r : rs)
    if (r.communicates)
      out.push_back(
          fmt::format("{} {} {}", r.phase == debug::Phase::Backward ? "bwd" : "fwd", r.kind, shape_str(r.in_shape)));
  return out;
}
int shard_maps_in(const Jaxpr& j) {
  int n = 0;
  for (const JaxprEqn& e : j.eqns()) n += e.primitive == &g_shard_map;
  return n;
}
}  // namespace

TEST_CASE("grad of a shard_map and the update shard_map after it run as one shard_map under jit") {
  Mesh mesh = make_mesh({8}, {"d"});
  bool capture = true, checkpointed = false;
  SUBCASE("with source info") {}
  SUBCASE("without source info: the backward's collectives are still recorded as such") { capture = false; }
  // The backward body reads its residuals inside a remat call, inlined when merging.
  SUBCASE("checkpointed: everything saved but the all_gather") { checkpointed = true; }
  // FSDP: w0 sharded by rows and gathered in the body, w1 replicated; rows of x over 'd'.
  auto loss = [&](const std::vector<Array>& w, const Array& x) {
    auto block = [](const std::vector<Array>& w, const Array& xb) {
      Array w0 = lax::all_gather(w[0], "d", {.axis = 0, .tiled = true});
      return lax::psum(jnp::sum(jnp::square(jnp::matmul(jnp::tanh(jnp::matmul(xb, w0)), w[1]))), "d");
    };
    auto body = [&](const std::vector<Array>& w, const Array& xb) {
      return checkpointed ? checkpoint(block, checkpoint_policies::save_everything_except({"all_gather"}))(w, xb)
                          : block(w, xb);
    };
    return shard_map(body, mesh, SpecTree{SpecTree{P("d", None), P()}, P("d")}, P())(w, x);
  };
  auto sgd = shard_map(
      [](const Array& w0, const Array& w1, const Array& g0, const Array& g1) {
        return std::vector<Array>{w0 - 0.1f * g0, w1 - 0.1f * g1};
      },
      mesh, SpecTree{P("d", None), P(), P("d", None), P()}, SpecTree{P("d", None), P()});
  auto step = [&](const std::vector<Array>& w, const Array& x) {
    std::vector<Array> g = grad(loss)(w, x);
    return sgd(w[0], w[1], g[0], g[1]);
  };
  Array x = random::normal(random::key(61), {32, 16});
  std::vector<Array> w = {random::normal(random::key(62), {16, 24}) * 0.3f,
                          random::normal(random::key(63), {24, 8}) * 0.3f};
  config::set_capture_source_info(capture);

  ClosedJaxpr traced = make_jaxpr(step)(w, x);
  CHECK(shard_maps_in(*traced.jaxpr) == 3);  // forward, backward, update
  CHECK(shard_maps_in(*optimize(*traced.jaxpr, traced.consts)) == 1);
  std::vector<Array> merged, separate;
  std::vector<std::string> merged_collectives, separate_collectives;
  {
    debug::CollectiveRecorder rec;
    merged = jit(step)(w, x);
    for (Array& a : merged) a.block_until_ready();  // a jit call returns before its program has run
    merged_collectives = moving_collectives(rec.records());
  }

  setenv("CJAX_MERGE_SHARD_MAPS", "0", 1);
  CHECK(shard_maps_in(*optimize(*traced.jaxpr, traced.consts)) == 3);
  {
    debug::CollectiveRecorder rec;
    separate = jit(step)(w, x);
    for (Array& a : separate) a.block_until_ready();
    separate_collectives = moving_collectives(rec.records());
  }
  unsetenv("CJAX_MERGE_SHARD_MAPS");
  config::set_capture_source_info(true);

  std::vector<std::string> want = {"fwd all_gather (2, 24)", "fwd psum_invariant ()", "bwd psum_invariant (24, 8)",
                                   "bwd reduce_scatter (16, 24)"};
  CHECK_MESSAGE(separate_collectives == want, fmt::format("{}", fmt::join(separate_collectives, "; ")));
  CHECK_MESSAGE(merged_collectives == want, fmt::format("{}", fmt::join(merged_collectives, "; ")));
  // The update against one device's SGD step.
  auto plain = [](const std::vector<Array>& w, const Array& x) {
    return jnp::sum(jnp::square(jnp::matmul(jnp::tanh(jnp::matmul(x, w[0])), w[1])));
  };
  std::vector<Array> g = grad(plain)(w, x);
  REQUIRE(merged.size() == 2);
  for (size_t k = 0; k < 2; ++k) {
    check_all_close(merged[k], separate[k], 1e-6);
    check_all_close(merged[k], w[k] - 0.1f * g[k], 1e-5);
  }
}

TEST_CASE("shard_maps that cannot run as one stay apart under jit") {
  Mesh mesh = make_mesh({8}, {"d"});
  Array x = random::normal(random::key(64), {16, 8});
  auto rows = shard_map([](const Array& xb) { return jnp::sin(xb); }, mesh, P("d"), P("d"));
  // Another spec for the value between them: blocks of columns, not of rows.
  auto cols = shard_map([](const Array& xb) { return xb * 2.f; }, mesh, P(None, "d"), P(None, "d"));
  // A value between them that the caller reads first.
  auto twice = [&](const Array& x) { return rows(rows(x) + 1.f); };
  for (auto [f, want] :
       std::vector<std::pair<std::function<Array(const Array&)>, Array>>{{[&](const Array& x) { return cols(rows(x)); },
                                                                          jnp::sin(x) * 2.f},
                                                                         {twice, jnp::sin(jnp::sin(x) + 1.f)}}) {
    ClosedJaxpr traced = make_jaxpr(f)(x);
    CHECK(shard_maps_in(*optimize(*traced.jaxpr, traced.consts)) == 2);
    check_all_close(jit(f)(x), want, 1e-6);
  }
}
