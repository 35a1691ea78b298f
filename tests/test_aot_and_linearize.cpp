// The small API of issue 16 item 5: linearize, linear_transpose, eval_shape / shape_dtype_struct
// and ahead-of-time lowering (jit(f).lower(...).compile(), cost and memory analysis).
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>

#include "cjax/cjax.h"
#include "jit/executable.h"
#include "test_util.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {
struct Layer {
  Array w, b;
};
CJAX_TREE(Layer, w, b)

Array f32s(const std::vector<double>& v, Shape s = {}) { return arr<float>(v, std::move(s)); }
double dot_all(const Array& a, const Array& b) { return jnp::sum(a * b).astype(f64).item<double>(); }
}  // namespace

// ---- linearize ----

TEST_CASE("linearize: out equals f, f_jvp equals jvp's tangent, and is linear") {
  auto f = [](const Array& x, const Array& y) { return jnp::sin(x) * y + jnp::square(x); };
  Array x = f32s({0.1, -0.5, 2.0}), y = f32s({1.5, 2.0, -1.0});
  Array dx = f32s({1.0, 0.5, -2.0}), dy = f32s({0.25, -1.0, 3.0});
  auto [out, f_jvp] = linearize(f, x, y);
  check_all_close(out, f(x, y));
  auto [out2, tangent] = jvp(f, std::tuple{x, y}, std::tuple{dx, dy});
  check_all_close(out2, out);
  check_all_close(f_jvp(dx, dy), tangent);
  // Closed form: cos(x) y dx + sin(x) dy + 2 x dx.
  check_all_close(f_jvp(dx, dy), jnp::cos(x) * y * dx + jnp::sin(x) * dy + 2.0 * x * dx, 1e-5);
  // Linear: called again with other tangents, scaled and summed.
  check_all_close(f_jvp(dx * 3.0, dy * 3.0), tangent * 3.0, 1e-5);
  check_all_close(f_jvp(dx, jnp::zeros_like(dy)) + f_jvp(jnp::zeros_like(dx), dy), tangent, 1e-5);
}

TEST_CASE("linearize over trees, with an integer leaf, under jit and with wrong tangents") {
  auto f = [](const Layer& p, const Array& x) {
    Array h = jnp::tanh(jnp::matmul(x, p.w) + p.b);
    return std::pair{jnp::sum(h), std::map<std::string, Array>{{"h", h}}};
  };
  Layer p{f32s({0.1, -0.2, 0.3, 0.4, 0.5, -0.6}, {3, 2}), f32s({0.01, -0.02})};
  Array x = f32s({1, 2, 3, -1, 0.5, 0.25}, {2, 3});
  Layer dp{f32s({1, 0, 0, 0, 0, 1}, {3, 2}), f32s({0.5, 0.5})};
  Array dx = jnp::ones({2, 3});
  auto [out, f_jvp] = linearize(f, p, x);
  auto [o2, t2] = jvp(f, std::tuple{p, x}, std::tuple{dp, dx});
  check_all_close(out.first, o2.first);
  auto t = f_jvp(dp, dx);
  check_all_close(t.first, t2.first, 1e-5);
  check_all_close(t.second.at("h"), t2.second.at("h"), 1e-5);

  // Integer leaves have no tangent space: their tangents are ignored.
  auto g = [](const Array& x, const Array& n) { return x * n.astype(f32); };
  Array n = jnp::arange(3);
  auto [gy, g_jvp] = linearize(g, f32s({1, 2, 3}), n);
  check_all_close(gy, f32s({0, 2, 6}));
  check_all_close(g_jvp(f32s({1, 1, 1}), jnp::ones({3}, i32) * 7), f32s({0, 1, 2}));

  // Composes with jit: the linearization happens inside the trace.
  auto jitted = jit([&](const Array& x) {
    auto [y, fj] = linearize([](const Array& v) { return jnp::exp(v) * v; }, x);
    return std::pair{y, fj(jnp::ones_like(x))};
  });
  Array xs = f32s({0.0, 0.5, 1.0});
  auto [jy, jt] = jitted(xs);
  check_all_close(jy, jnp::exp(xs) * xs, 1e-6);
  check_all_close(jt, jnp::exp(xs) * (xs + 1.0), 1e-6);

  CHECK_ERR(f_jvp(dp, jnp::ones({2, 4})), ValueError, "linearize: tangent leaf 2", "f32[2,4]", "f32[2,3]");
  auto h = [](const std::vector<Array>& v) { return v[0] * v.back(); };
  auto [hy, h_jvp] = linearize(h, std::vector<Array>{f32s({1}), f32s({2})});
  check_all_close(hy, f32s({2}));
  CHECK_ERR(h_jvp(std::vector<Array>{f32s({1})}), ValueError, "linearize: the tangent of argument 0", "tree structure");
}

// ---- linear_transpose ----

TEST_CASE("linear_transpose of a matmul by a fixed matrix is the transposed matrix") {
  Array A = f32s({1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, {3, 4});
  auto f = [&](const Array& v) { return jnp::matmul(A, v); };
  auto f_t = linear_transpose(f, jnp::zeros({4}));
  Array ct = f32s({1, -1, 0.5});
  auto [ct_v] = f_t(ct);
  check_all_close(ct_v, jnp::matmul(A.T(), ct));
  // The primal may be an abstract value: only its type matters.
  auto f_t2 = linear_transpose(f, shape_dtype_struct({4}, f32));
  check_all_close(std::get<0>(f_t2(ct)), jnp::matmul(A.T(), ct));
  // A batch of vectors: X -> A X, transposed X_ct -> A^T X_ct.
  auto g_t = linear_transpose([&](const Array& X) { return jnp::matmul(A, X); }, shape_dtype_struct({4, 2}, f32));
  Array ct2 = f32s({1, 2, 3, 4, 5, 6}, {3, 2});
  check_all_close(std::get<0>(g_t(ct2)), jnp::matmul(A.T(), ct2));
}

TEST_CASE("linear_transpose of sum, broadcast and a tree function") {
  // sum over axis 0 transposes to a broadcast back.
  auto s_t = linear_transpose([](const Array& x) { return jnp::sum(x, 0); }, shape_dtype_struct({3, 4}, f32));
  auto [bx] = s_t(f32s({1, 2, 3, 4}));
  check_all_close(bx, jnp::broadcast_to(f32s({1, 2, 3, 4}), {3, 4}));
  // broadcast transposes to a sum.
  auto b_t = linear_transpose([](const Array& x) { return jnp::broadcast_to(x, {2, 3}); }, jnp::zeros({3}));
  auto [sx] = b_t(f32s({1, 2, 3, 10, 20, 30}, {2, 3}));
  check_all_close(sx, f32s({11, 22, 33}));

  // Two tree arguments, two outputs: <f_t(ct), x> == <ct, f(x)>.
  auto f = [](const Layer& p, const Array& y) {
    return std::pair{2.0 * p.w - jnp::sum(y, 1, true), -p.b * 3.0 + y[0]};
  };
  Layer p{f32s({1, 2, 3, 4, 5, 6}, {2, 3}), f32s({1, -1, 2})};
  Array y = f32s({0.5, 1.5, -2, 1, 0, 3}, {2, 3});
  auto f_t = linear_transpose(f, p, y);
  auto ct = std::pair{f32s({1, 0, -1, 2, 0.5, 1}, {2, 3}), f32s({3, -2, 1})};
  auto [ct_p, ct_y] = f_t(ct);
  REQUIRE(ct_p.w.shape() == Shape{2, 3});
  REQUIRE(ct_p.b.shape() == Shape{3});
  REQUIRE(ct_y.shape() == Shape{2, 3});
  auto fx = f(p, y);
  double lhs = dot_all(ct_p.w, p.w) + dot_all(ct_p.b, p.b) + dot_all(ct_y, y);
  double rhs = dot_all(ct.first, fx.first) + dot_all(ct.second, fx.second);
  CHECK(lhs == doctest::Approx(rhs).epsilon(1e-5));
  check_all_close(ct_p.w, 2.0 * ct.first);
  check_all_close(ct_p.b, -3.0 * ct.second);

  // An input nothing flows to gets zeros.
  auto z_t = linear_transpose([](const Array& a, const Array&) { return a * 2.0; }, jnp::zeros({2}), jnp::zeros({3}));
  auto [za, zb] = z_t(f32s({1, 1}));
  check_all_close(za, f32s({2, 2}));
  check_all_close(zb, jnp::zeros({3}));
}

TEST_CASE("linear_transpose of a non-linear function raises") {
  Array x = jnp::ones({3});
  auto sq = linear_transpose([](const Array& v) { return v * v; }, x);
  CHECK_ERR(sq(x), ValueError, "linear_transpose: the function is not linear in its inputs",
            "'mul' multiplies two values that both depend on the inputs", "f32[3] = mul f32[3] f32[3]");
  auto sn = linear_transpose([](const Array& v) { return jnp::sin(v) * 2.0; }, x);
  CHECK_ERR(sn(x), ValueError, "not linear in its inputs", "'sin' is applied to a value computed from the inputs");
  auto dv = linear_transpose([](const Array& v) { return 1.0 / v; }, x);
  CHECK_ERR(dv(x), ValueError, "'div' divides by a value that depends on the inputs");
  auto mm = linear_transpose([](const Array& v) { return jnp::matmul(v, v); }, x);
  CHECK_ERR(mm(jnp::ones({})), ValueError, "'dot_general' multiplies two values");
  // Inside a nested jit too (checked as the call is transposed).
  auto nested = linear_transpose(jit([](const Array& v) { return jnp::exp(v); }), x);
  CHECK_ERR(nested(x), ValueError, "'exp' is applied to a value computed from the inputs");

  CHECK_ERR(linear_transpose([](const Array& v) { return v * 2; }, jnp::arange(3)), DTypeError,
            "linear_transpose: input leaf 0 has type i32[3]");
  auto ok = linear_transpose([](const Array& v) { return v * 2.0; }, x);
  CHECK_ERR(ok(jnp::ones({4})), ValueError, "cotangent leaf 0 has type f32[4]", "f32[3]");
  // Linear functions still transpose after the errors above (the check is scoped).
  check_all_close(std::get<0>(ok(f32s({1, 2, 3}))), f32s({2, 4, 6}));
  // grad is unaffected by linear_transpose's checks.
  check_all_close(grad([](const Array& v) { return jnp::sum(v * v); })(f32s({1, 2, 3})), f32s({2, 4, 6}));
}

// ---- eval_shape ----

TEST_CASE("eval_shape of a matmul too large to allocate") {
  Array a = shape_dtype_struct({int64_t(1) << 20, int64_t(1) << 20}, f32);
  CHECK(is_abstract(a));
  CHECK(a.shape() == Shape{1 << 20, 1 << 20});
  auto f = [](const Array& x, const Array& y) { return jnp::matmul(x, y) * 2.0 + jnp::sum(x); };
  Array out = eval_shape(f, a, a);
  CHECK(is_abstract(out));
  CHECK(out.shape() == Shape{1 << 20, 1 << 20});
  CHECK(out.dtype() == f32);
  CHECK_FALSE(out.weak_type());
  CHECK(text(out) == "ShapeDtypeStruct(shape=(1048576, 1048576), dtype=float32)");
  // Work on values derived from the arguments is staged, not computed.
  Array z = eval_shape(
      [](const Array& x) {
        return jnp::broadcast_to(x, {1 << 20, 1 << 20}) * 2.0;
      },
      shape_dtype_struct({}, bf16));
  CHECK(z.shape() == Shape{1 << 20, 1 << 20});
  CHECK(z.dtype() == bf16);
}

TEST_CASE("eval_shape of a tree matches the computed types, weak types included") {
  auto f = [](const Layer& p, const Array& x, const Array& s, int n) {
    Array h = jnp::matmul(x, p.w) + p.b;
    return std::make_tuple(h.reshape({-1, n}), std::map<std::string, Array>{{"i", jnp::arange(3) * 2}, {"w", s * 2.0}},
                           Layer{x.astype(f16), jnp::sum(h, 0) > 0});
  };
  Layer p{jnp::ones({3, 4}), jnp::zeros({4})};
  Array x = jnp::ones({2, 3}), s = Array(1.5f);
  auto got = eval_shape(f, p, x, s, 2);
  auto want = f(p, x, s, 2);
  std::vector<Array> g = tree::leaves(got), w = tree::leaves(want);
  REQUIRE(g.size() == w.size());
  for (size_t i = 0; i < g.size(); ++i) {
    CAPTURE(i);
    CHECK(is_abstract(g[i]));
    CHECK(g[i].aval() == w[i].aval());
  }
  CHECK(std::get<0>(got).shape() == Shape{4, 2});
  CHECK(std::get<1>(got).at("w").weak_type());
  CHECK(std::get<1>(got).at("i").dtype() == i32);
  CHECK(std::get<2>(got).b.dtype() == bool_);
  CHECK(text(std::get<1>(got).at("w")) == "ShapeDtypeStruct(shape=(), dtype=float32, weak_type=True)");
  // Abstract and concrete arguments mix; the types alone decide.
  auto again = eval_shape(f, Layer{shape_dtype_struct({3, 4}, f32), shape_dtype_struct({4}, f32)},
                          shape_dtype_struct({2, 3}, f32), shape_dtype_struct({}, f32, true), 4);
  CHECK(std::get<0>(again).shape() == Shape{2, 4});
}

TEST_CASE("abstract arrays hold no data") {
  Array a = shape_dtype_struct({2, 3}, f32);
  CHECK(text(a) == "ShapeDtypeStruct(shape=(2, 3), dtype=float32)");
  CHECK_FALSE(is_abstract(jnp::ones({2})));
  CHECK_ERR(a + 1.0, ValueError, "abstract value f32[2,3]", "has no data");
  CHECK_ERR(a.to_vector<float>(), ConcretizationError, "to_vector() needs a concrete value", "abstract value f32[2,3]");
  CHECK_ERR(shape_dtype_struct({2, -1}, f32), ValueError, "negative dimension");
  // make_jaxpr takes them too.
  CHECK(text(make_jaxpr([](const Array& v) { return v * 2.0; })(shape_dtype_struct({3}, f16))).find("a:f16[3]") !=
        std::string::npos);
}

// ---- ahead-of-time lowering ----

TEST_CASE("lower/compile a matmul: text, cost, memory, same values, one trace" CJAX_JIT_ONLY) {
  auto mm = [](const Array& a, const Array& b) { return jnp::matmul(a, b); };
  auto jf = jit(mm, {.name = "mm"});
  Array a = seq({64, 32}, 7, 3), b = seq({32, 16}, 5, 2);
  auto lowered = jf.lower(a, b);
  CHECK(jf.trace_count() == 1);
  CHECK(lowered.as_text().find("dot_general") != std::string::npos);
  CHECK(lowered.as_text().find("a:f32[64,32] b:f32[32,16]") != std::string::npos);
  CHECK(lowered.jaxpr().in_avals().size() == 2);
  auto compiled = lowered.compile();
  CHECK(compiled.as_text().find("dot_general") != std::string::npos);

  CostAnalysis cost = compiled.cost_analysis();
  CHECK(cost.flops == 2.0 * 64 * 32 * 16);
  CHECK(cost.transcendentals == 0);
  CHECK(cost.bytes_accessed == 4.0 * (64 * 32 + 32 * 16 + 64 * 16));
  MemoryAnalysis mem = compiled.memory_analysis();
  CHECK(mem.argument_size_in_bytes == 4 * (64 * 32 + 32 * 16));
  CHECK(mem.output_size_in_bytes == 4 * 64 * 16);
  CHECK(mem.alias_size_in_bytes == 0);
  CHECK(mem.temp_size_in_bytes == 0);

  Array c1 = compiled(a, b);
  Array c2 = jf(a, b);
  CHECK(jf.trace_count() == 1);
  CHECK(jf.cache_size() == 1);
  CHECK(vals(c1) == vals(c2));
  check_all_close(c1, mm(a, b));
  // lower again: a cache hit.
  (void)jf.lower(a, b).compile()(a, b);
  CHECK(jf.trace_count() == 1);
  // jit(f).lower(x).compile()(x) on a temporary jit.
  check_all_close(jit(mm).lower(a, b).compile()(a, b), c2);
}

TEST_CASE("cost analysis of fused elementwise work, reductions and scan" CJAX_JIT_ONLY) {
  auto f = [](const Array& x) { return jnp::sin(x) * 2.0 + 1.0; };
  auto c = jit(f).lower(jnp::ones({1000})).compile();
  CostAnalysis cost = c.cost_analysis();
  CHECK(cost.flops == 3000);
  CHECK(cost.transcendentals == 1000);
  if (fusion_enabled())
    CHECK(cost.bytes_accessed == 8000);  // one fused kernel: x in, result out
  else
    CHECK(cost.bytes_accessed == 3 * 8000 + 2 * 4);  // three steps (and two scalar literals)

  auto g = [](const Array& x) { return jnp::sum(jnp::exp(x), 1); };
  CostAnalysis gc = jit(g).lower(jnp::ones({8, 100})).compile().cost_analysis();
  CHECK(gc.flops == 800 + 800);  // exp per element, then one add per reduced element
  CHECK(gc.transcendentals == 800);

  auto body = [](const Array& carry, const Array& x) { return std::pair{carry * x + 1.0, carry}; };
  auto s = [&](const Array& init, const Array& xs) { return lax::scan(body, init, xs).first; };
  CostAnalysis sc = jit(s).lower(jnp::ones({4}), jnp::ones({10, 4})).compile().cost_analysis();
  CHECK(sc.flops == 10 * 8);  // mul and add per element, 10 steps
}

TEST_CASE("lower with abstract arguments; Compiled checks its signature" CJAX_JIT_ONLY) {
  auto f = [](const Layer& p, const Array& x, int k) { return jnp::tanh(jnp::matmul(x, p.w) + p.b) * double(k); };
  auto jf = jit(f, {.name = "layer"});
  Layer spec{shape_dtype_struct({3, 2}, f32), shape_dtype_struct({2}, f32)};
  auto compiled = jf.lower(spec, shape_dtype_struct({4, 3}, f32), 2).compile();
  CHECK(jf.trace_count() == 1);
  Layer p{seq({3, 2}, 5, 2) * 0.1, f32s({0.5, -0.5})};
  Array x = seq({4, 3}, 3, 1);
  Array got = compiled(p, x, 2);
  check_all_close(got, f(p, x, 2), 1e-6);
  check_all_close(jf(p, x, 2), got);
  CHECK(jf.trace_count() == 1);  // the call hit the entry lower made

  CHECK_ERR(compiled(p, seq({5, 3}, 3, 1), 2), ValueError, "jit 'layer': computation compiled for input types",
            "({f32[3,2], f32[2]}, f32[4,3], 2)", "called with input types",
            "at argument 1: compiled for f32[4,3], "
            "called with f32[5,3]");
  CHECK_ERR(compiled(Layer{p.w.astype(f64), p.b}, x, 2), ValueError,
            "at argument 0.w: compiled for f32[3,2], called with f64[3,2]");
  CHECK_ERR(compiled(p, x, 3), ValueError, "argument 2 is static and changed from 2 to 3");
  CHECK(jf.trace_count() == 1);

  // A call (not lower) with abstract arguments says what is wrong.
  CHECK_ERR(jf(spec, x, 2), ValueError, "jit 'layer': argument leaf 0 is an abstract value f32[3,2]");

  // A Compiled composes with grad (it binds the jit equation).
  auto sq = jit([](const Array& v) { return v * v; }).lower(jnp::ones({3})).compile();
  check_all_close(grad([&](const Array& v) { return jnp::sum(sq(v)); })(f32s({1, 2, 3})), f32s({2, 4, 6}));
}

TEST_CASE("memory analysis: donated arguments and intermediates" CJAX_JIT_ONLY) {
  auto f = [](const Array& w, const Array& v, const Array& x) {
    Array h = jnp::matmul(x, w);            // f32[8,16]: an intermediate
    return jnp::sum(jnp::matmul(h, v), 0);  // f32[8,32]: another, alive with h; f32[32] out
  };
  auto c =
      jit(f, {.donate_argnums = {0}}).lower(jnp::ones({32, 16}), jnp::ones({16, 32}), jnp::ones({8, 32})).compile();
  MemoryAnalysis m = c.memory_analysis();
  CHECK(m.argument_size_in_bytes == 4 * (32 * 16 + 16 * 32 + 8 * 32));
  CHECK(m.alias_size_in_bytes == 4 * 32 * 16);
  CHECK(m.output_size_in_bytes == 4 * 32);
  CHECK(m.temp_size_in_bytes == 4 * (8 * 16 + 8 * 32));
  CHECK(m.constant_size_in_bytes == 0);
}
