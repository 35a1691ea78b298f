// jit: caching by signature, retrace explanations, composition with grad/vmap/make_jaxpr,
// nested jit printing, passes, donation and CJAX_DISABLE_JIT.
#include <doctest/doctest.h>

#include <cmath>

#include "cjax/cjax.h"
#include "jit/passes/passes.h"
#include "test_util.h"
#include "trace/eval_jaxpr.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {
int g_traces = 0;
Array sin_times(const Array& x, const Array& y) {
  ++g_traces;
  return lax::mul(lax::sin(x), y);
}
}  // namespace

TEST_CASE("jit caches by signature and retraces on new shapes, dtypes and static values" CJAX_JIT_ONLY) {
  g_traces = 0;
  auto f = jit([](const Array& x, const Array& y) { return sin_times(x, y); });
  Array x = arr<float>({0.5, 1, 2}), y = arr<float>({1, 2, 3});
  Array out = f(x, y);
  CHECK(vals(out)[1] == doctest::Approx(std::sin(1.0) * 2).epsilon(1e-6));
  f(y, x);
  f(x + 1, y);
  CHECK(g_traces == 1);
  CHECK(f.trace_count() == 1);
  f(arr<float>({1, 2}), arr<float>({3, 4}));  // new shape
  CHECK(f.trace_count() == 2);
  f(x.astype(f64), y.astype(f64));  // new dtype
  CHECK(f.trace_count() == 3);
  CHECK(f.cache_size() == 3);

  auto g = jit([](const Array& x, int power) { return lax::integer_pow(x, power); });
  CHECK(vals(g(x, 2)) == std::vector<double>{0.25, 1, 4});
  g(x, 2);
  CHECK(g.trace_count() == 1);
  CHECK(vals(g(x, 3))[2] == 8);
  CHECK(g.trace_count() == 2);
}

TEST_CASE("explain_cache_misses names the changed argument" CJAX_JIT_ONLY) {
  config::set_explain_cache_misses(true);
  auto f = jit([](const std::map<std::string, Array>& p, const Array& x) { return lax::mul(p.at("w"), x); },
               {.name = "model"});
  std::map<std::string, Array> p{{"w", arr<float>({1, 2, 3})}};
  f(p, arr<float>({1, 1, 1}));
  CHECK(f.last_cache_miss().find("never traced") != std::string::npos);
  f(p, make_scalar(2, f32));
  CHECK(f.last_cache_miss().find("at argument 1: seen f32[3], but now given f32[]") != std::string::npos);
  std::map<std::string, Array> p2{{"w", arr<double>({1, 2, 3})}};
  f(p2, arr<double>({1, 1, 1}));
  CHECK(f.last_cache_miss().find("'model'") != std::string::npos);
  CHECK(f.last_cache_miss().find("['w']") != std::string::npos);
  auto g = jit([](const Array& x, int k) { return lax::integer_pow(x, k); });
  g(make_scalar(2, f32), 2);
  g(make_scalar(2, f32), 3);
  CHECK(g.last_cache_miss().find("argument 1 is static and changed from 2 to 3") != std::string::npos);
  config::set_explain_cache_misses(false);
}

TEST_CASE("nested jit prints as a jit equation with its name" CJAX_JIT_ONLY) {
  auto inner = jit([](const Array& x) { return lax::sin(x); }, {.name = "inner"});
  auto f = [&](const Array& x) { return lax::mul(inner(x), 2.0f); };
  auto cj = make_jaxpr(f)(arr<float>({1, 2, 3}));
  CHECK(text(cj) ==
        "{ lambda ; a:f32[3]. let\n"
        "    b:f32[3] = jit[\n"
        "      name=inner\n"
        "      jaxpr={ lambda ; c:f32[3]. let d:f32[3] = sin c in (d,) }\n"
        "    ] a\n"
        "    e:f32[3] = mul b 2.0:f32[]\n"
        "  in (e,) }");
  Array x = arr<float>({1, 2, 3});
  CHECK(vals(jit(f)(x))[2] == doctest::Approx(2 * std::sin(3.0)).epsilon(1e-6));
}

TEST_CASE("grad(jit f), jit(grad f), vmap(jit f) and jit(vmap f) agree with eager") {
  auto f = [](const Array& x) { return lax::mul(lax::sin(x), x); };
  Array x = make_scalar(0.8, f32);
  double want = std::cos(0.8) * 0.8 + std::sin(0.8);
  CHECK(grad(jit(f))(x).item<float>() == doctest::Approx(want));
  CHECK(jit(grad(f))(x).item<float>() == doctest::Approx(want));
  CHECK(grad(grad(jit(f)))(x).item<float>() == doctest::Approx(2 * std::cos(0.8) - 0.8 * std::sin(0.8)));
  Array xs = arr<float>({0.1, 0.2, 0.3});
  auto v1 = vals(vmap(jit(f))(xs)), v2 = vals(jit(vmap(f))(xs));
  for (int i = 0; i < 3; ++i) {
    double xi = 0.1 * (i + 1);
    CHECK(v1[size_t(i)] == doctest::Approx(std::sin(xi) * xi));
    CHECK(v2[size_t(i)] == doctest::Approx(std::sin(xi) * xi));
  }
  auto vg = vals(vmap(grad(jit(f)))(xs));
  CHECK(vg[2] == doctest::Approx(std::cos(0.3) * 0.3 + std::sin(0.3)));
}

TEST_CASE("grad of jit keeps the jit equation, split into known and unknown parts" CJAX_JIT_ONLY) {
  auto f = jit([](const Array& x) { return lax::mul(lax::sin(x), x); }, {.name = "f"});
  auto cj = make_jaxpr(grad(f))(make_scalar(0.5, f32));
  std::string t = text(cj);
  MESSAGE(t);
  CHECK(t.find("jit[") != std::string::npos);
  CHECK(t.find("name=f") != std::string::npos);
}

TEST_CASE("passes: cse, dce and constant folding") {
  auto f = [](const Array& x) {
    Array a = lax::sin(x), b = lax::sin(x);
    Array unused = lax::cos(x);
    Array c = lax::add(make_scalar(2, f32), make_scalar(3, f32));
    return lax::mul(lax::add(a, b), c);
  };
  auto cj = make_jaxpr(f)(arr<float>({1, 2}));
  auto opt = optimize(*cj);
  CHECK(opt->pretty_print() ==
        "{ lambda ; a:f32[2]. let\n"
        "    b:f32[2] = sin a\n"
        "    c:f32[2] = add b b\n"
        "    d:f32[2] = mul c 5.0:f32[]\n"
        "  in (d,) }");
  CHECK(vals(jit(f)(arr<float>({1, 2})))[0] == doctest::Approx(2 * std::sin(1.0) * 5));
}

TEST_CASE("passes: identity transposes vanish and weight-gradient transposes fold into dot_general") {
  namespace jnp = cjax::numpy;
  auto loss = [](const Array& w, const Array& x) { return jnp::sum(jnp::tanh(jnp::matmul(x, w))); };
  Array w = random::normal(random::key(1), {5, 3}), x = random::normal(random::key(2), {4, 5});
  auto cj = make_jaxpr(grad(loss))(w, x);
  auto count = [](const Jaxpr& j, const std::string& name) {
    int n = 0;
    for (const JaxprEqn& e : j.eqns()) n += e.primitive->name == name;
    return n;
  };
  CHECK(count(*cj, "transpose") >= 1);  // dW = transpose(dot_general(dy, x)), as JAX's rule emits
  auto opt = optimize(*cj);
  CHECK(count(*opt, "transpose") == 0);
  CHECK(count(*opt, "dot_general") == count(*cj, "dot_general"));
  // dW = x^T dy, computed as dot_general(x, dy) contracting the batch axis: same values.
  std::vector<float> want = eval_jaxpr(*cj, cj.consts, std::vector<Array>{w, x})[0].to_vector<float>();
  std::vector<float> got = eval_jaxpr(*opt, cj.consts, std::vector<Array>{w, x})[0].to_vector<float>();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-6));
  // A batched dot_general whose free dimensions are swapped folds the same way.
  auto bf = [](const Array& a, const Array& b) {
    return lax::transpose(lax::dot_general(a, b, {{{2}, {1}}, {{0}, {0}}}), {0, 2, 1});
  };
  Array a = random::normal(random::key(3), {2, 4, 3}), b = random::normal(random::key(4), {2, 3, 5});
  auto bj = make_jaxpr(bf)(a, b);
  auto bopt = optimize(*bj);
  CHECK(count(*bopt, "transpose") == 0);
  CHECK(eval_jaxpr(*bopt, bj.consts, std::vector<Array>{a, b})[0].to_vector<float>() ==
        eval_jaxpr(*bj, bj.consts, std::vector<Array>{a, b})[0].to_vector<float>());
}

TEST_CASE("passes: a fused q/k/v projection is split and its gradients joined without transposed copies") {
  namespace jnp = cjax::numpy;
  // The transformer sample's projection: one einsum to [3, b, s, n, h] (a dot_general to
  // [b, s, 3, n, h] and a transpose), then q, k, v = its three slices; under grad the three
  // gradients are concatenated back and transposed for the projection's own gradients.
  auto loss = [](const Array& x, const Array& w) {
    Array qkv = jnp::einsum("bsd,cdnh->cbsnh", x, w);
    return jnp::sum(jnp::tanh(qkv[0]) * qkv[1] + jnp::square(qkv[2]));
  };
  Array x = random::normal(random::key(1), {2, 5, 4}), w = random::normal(random::key(2), {3, 4, 2, 3});
  auto count = [](const Jaxpr& j, const std::string& name) {
    int n = 0;
    for (const JaxprEqn& e : j.eqns()) n += e.primitive->name == name;
    return n;
  };
  auto check = [&](const ClosedJaxpr& cj, int transposes_left) {
    auto opt = optimize(*cj);
    CHECK(count(*cj, "transpose") > transposes_left);
    CHECK(count(*opt, "transpose") == transposes_left);
    // Only data moves: the same bits.
    std::vector<Array> want = eval_jaxpr(*cj, cj.consts, std::vector<Array>{x, w});
    std::vector<Array> got = eval_jaxpr(*opt, cj.consts, std::vector<Array>{x, w});
    REQUIRE(got.size() == want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      CHECK(got[i].shape() == want[i].shape());
      CHECK(got[i].to_vector<float>() == want[i].to_vector<float>());
    }
  };
  SUBCASE("forward: the slices read the dot_general's result") { check(make_jaxpr(loss)(x, w), 0); }
  SUBCASE("gradients: the concatenate writes the layout the gradients' products read") {
    // What remains is the weight gradient's own [3, n, h, d] -> [3, d, n, h] transpose.
    check(make_jaxpr(grad(loss, argnums<0, 1>))(x, w), 1);
  }
  SUBCASE("left alone: a slice that keeps a moved dimension wider than 1") {
    auto two = [](const Array& x, const Array& w) {
      Array qkv = jnp::einsum("bsd,cdnh->cbsnh", x, w);
      return qkv[{Slice(0, 2)}];
    };
    auto cj = make_jaxpr(two)(x, w);
    CHECK(count(*optimize(*cj), "transpose") == count(*cj, "transpose"));
  }
}

TEST_CASE("passes: remat and custom_jvp calls are inlined so their bodies fuse") {
  namespace jnp = cjax::numpy;
  auto log1pexp = custom_jvp([](const Array& x) { return jnp::log1p(jnp::exp(x)); },
                             [](const std::tuple<Array>& p, const std::tuple<Array>& t) {
                               auto [x] = p;
                               auto [dx] = t;
                               return std::pair{jnp::log1p(jnp::exp(x)), dx * lax::logistic(x)};
                             });
  auto layer = checkpoint([&](const Array& x) { return jnp::sin(log1pexp(x)) * 2.0f; });
  auto loss = [&](const Array& x) { return jnp::sum(layer(x)); };
  Array x = jnp::linspace(-2.0, 2.0, 7);
  auto cj = make_jaxpr(value_and_grad(loss))(x);
  auto opt = optimize(*cj);
  std::function<int(const Jaxpr&)> calls = [&](const Jaxpr& j) {
    int n = 0;
    for (const JaxprEqn& e : j.eqns()) n += e.primitive->name == "remat2" || e.primitive->name == "custom_jvp_call";
    return n;
  };
  CHECK(calls(*cj) > 0);
  CHECK(calls(*opt) == 0);
  auto want = eval_jaxpr(*cj, cj.consts, std::vector<Array>{x}),
       got = eval_jaxpr(*opt, cj.consts, std::vector<Array>{x});
  REQUIRE(want.size() == got.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i].to_vector<float>() == want[i].to_vector<float>());
}

TEST_CASE("donated arguments are deleted" CJAX_JIT_ONLY) {
  auto f = jit([](const Array& x) { return lax::add(x, make_scalar(1, f32)); }, {.donate_argnums = {0}});
  Array x = arr<float>({1, 2});
  Array y = f(x);
  CHECK(vals(y) == std::vector<double>{2, 3});
  CHECK_ERR(x.to_vector<float>(), ValueError, "deleted", "donate");
  CHECK_ERR(lax::sin(x), ValueError, "deleted");
}

TEST_CASE("disable_jit runs the function op by op") {
  g_traces = 0;
  auto f = jit([](const Array& x, const Array& y) { return sin_times(x, y); });
  config::set_disable_jit(true);
  Array x = arr<float>({1, 2});
  f(x, x);
  f(x, x);
  CHECK(g_traces == 2);
  CHECK(f.trace_count() == 0);
  config::set_disable_jit(false);
  f(x, x);
  f(x, x);
  CHECK(g_traces == 3);
}

TEST_CASE("jit of a sharded argument partitions the program, never reading one shard") {
  Mesh mesh = make_mesh({4}, {"i"});
  Array x = device_put(jnp::arange(8).astype(f32), NamedSharding(mesh, P("i")));
  auto f = jit([](const Array& a) { return lax::mul(a, make_scalar(2, f32)); });
  Array y = f(x);
  CHECK(y.sharding().str() == "NamedSharding(mesh=Mesh('i': 4), spec=P('i',), memory_kind=device)");
  CHECK(vals(y) == std::vector<double>{0, 2, 4, 6, 8, 10, 12, 14});
  // rev has no sharding rule: its operand is gathered (with a warning naming the line) and the
  // result is whole on every device; eagerly too (JAX's eager = jit of one op).
  auto g = jit([](const Array& a) { return lax::rev(a, {0}); });
  Array r = g(x);
  CHECK(vals(r) == std::vector<double>{7, 6, 5, 4, 3, 2, 1, 0});
  CHECK(dynamic_cast<const NamedSharding&>(r.sharding()).is_fully_replicated());
  CHECK(vals(lax::rev(x, {0})) == std::vector<double>{7, 6, 5, 4, 3, 2, 1, 0});
  auto per_block = shard_map([](const Array& a) { return lax::rev(a, {0}); }, mesh, P("i"), P("i"));
  CHECK(vals(per_block(x)) == std::vector<double>{1, 0, 3, 2, 5, 4, 7, 6});
}

TEST_CASE("a jitted function keeps at most jit_cache_capacity() signatures, dropping the least recently used") {
  CHECK_ERR(config::set_jit_cache_capacity(0), ValueError, "at least 1");
  size_t saved = config::jit_cache_capacity();
  CHECK(saved == config::kDefaultJitCacheCapacity);
  config::set_jit_cache_capacity(3);
  auto f = jit([](const Array& x) { return x * 2.0f; }, {.name = "lru"});
  auto call = [&](int64_t n) { return vals(f(jnp::ones({n}, f32))); };
  for (int64_t n = 1; n <= 3; ++n) call(n);
  CHECK(f.cache_size() == 3);
  CHECK(f.trace_count() == 3);
  call(1);  // a hit: 1 is now the most recently used; 2 the least
  CHECK(f.trace_count() == 3);
  CHECK(call(4) == std::vector<double>{2, 2, 2, 2});  // evicts 2
  CHECK(f.cache_size() == 3);
  CHECK(f.trace_count() == 4);
  call(1);
  call(3);
  CHECK(f.trace_count() == 4);                  // 1 and 3 stayed
  CHECK(call(2) == std::vector<double>{2, 2});  // 2 was dropped: traced again
  CHECK(f.trace_count() == 5);
  CHECK(f.cache_size() == 3);
  config::set_jit_cache_capacity(saved);
}
