// Control flow: cond, switch_, while_loop, fori_loop and scan — eager, jit, vmap, jvp/grad,
// JAX's jaxpr text and its parse round trip, and misuse.
#include <doctest/doctest.h>

#include <cmath>

#include "autodiff/check_grads.h"
#include "cjax/cjax.h"
#include "test_util.h"
#include "trace/eval_jaxpr.h"
#include "trace/jaxpr.h"
#include "trace/jaxpr_parser.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {

Array f64s(const std::vector<double>& v) { return arr<double>(v); }
Array scalar(double v, DType d = f32) { return make_scalar(v, d); }

Array sin_or_neg(const Array& p, const Array& x) {
  return lax::cond(
      p, [](const Array& v) { return lax::sin(v); }, [](const Array& v) { return lax::neg(v); }, x);
}

// Polynomial-ish branches so the derivatives differ per branch.
Array three_way(const Array& i, const Array& x) {
  std::vector<std::function<Array(const Array&)>> branches{
      [](const Array& v) { return lax::mul(v, v); },
      [](const Array& v) { return lax::sin(v); },
      [](const Array& v) { return lax::exp(v); },
  };
  return lax::switch_(i, branches, x);
}

std::pair<Array, Array> cumulative(const Array& h0, const Array& xs) {
  return lax::scan([](const Array& c, const Array& x) { return std::pair{lax::add(c, x), lax::mul(c, x)}; }, h0, xs);
}

void check_roundtrip(const ClosedJaxpr& cj) {
  std::string t = text(cj);
  auto parsed = parse_jaxpr(t);
  CHECK(parsed->pretty_print() == t);
}

}  // namespace

// ---- cond ----

TEST_CASE("cond runs the chosen branch eagerly, under jit, and prints as JAX") {
  Array x = arr<float>({1, 2});
  CHECK(vals(sin_or_neg(Array(true), x)) == std::vector<double>{std::sin(1.0f), std::sin(2.0f)});
  CHECK(vals(sin_or_neg(Array(false), x)) == std::vector<double>{-1, -2});
  CHECK(vals(jit(sin_or_neg)(Array(false), x)) == std::vector<double>{-1, -2});
  CHECK(vals(jit(sin_or_neg)(Array(true), x))[1] == doctest::Approx(std::sin(2.0)));
  // A numeric predicate means != 0.
  CHECK(vals(sin_or_neg(scalar(0.0), x)) == std::vector<double>{-1, -2});
  CHECK(vals(sin_or_neg(make_scalar(3, i32), x))[0] == doctest::Approx(std::sin(1.0)));

  auto cj = make_jaxpr(sin_or_neg)(Array(true), arr<float>({1, 2, 3}));
  CHECK(text(cj) ==
        "{ lambda ; a:bool[] b:f32[3]. let\n"
        "    c:i32[] = convert_element_type[new_dtype=int32 weak_type=False] a\n"
        "    d:f32[3] = cond[\n"
        "      branches=(\n"
        "        { lambda ; e:f32[3]. let f:f32[3] = neg e in (f,) }\n"
        "        { lambda ; g:f32[3]. let h:f32[3] = sin g in (h,) }\n"
        "      )\n"
        "    ] c b\n"
        "  in (d,) }");
  check_roundtrip(cj);
  auto parsed = parse_jaxpr(text(cj));
  CHECK(vals(eval_jaxpr(*parsed, {}, std::vector<Array>{Array(false), arr<float>({1, 2, 3})})[0]) ==
        std::vector<double>{-1, -2, -3});
}

TEST_CASE("cond with tree operands, tree outputs and closed-over values") {
  Array w = arr<float>({10, 20});
  auto f = [&](const Array& p, const std::pair<Array, Array>& xy) {
    return lax::cond(
        p,
        [&](const std::pair<Array, Array>& v) {
          return std::pair{lax::add(v.first, w), v.second};
        },
        [](const std::pair<Array, Array>& v) {
          return std::pair{v.second, v.first};
        },
        xy);
  };
  auto [a, b] = f(Array(true), std::pair{arr<float>({1, 2}), arr<float>({3, 4})});
  CHECK(vals(a) == std::vector<double>{11, 22});
  CHECK(vals(b) == std::vector<double>{3, 4});
  auto [c, d] = f(Array(false), std::pair{arr<float>({1, 2}), arr<float>({3, 4})});
  CHECK(vals(c) == std::vector<double>{3, 4});
  CHECK(vals(d) == std::vector<double>{1, 2});
  // The captured array is a leading operand (a constvar of the outer jaxpr).
  auto cj = make_jaxpr(f)(Array(true), std::pair{arr<float>({1, 2}), arr<float>({3, 4})});
  CHECK(text(cj) ==
        "{ lambda a:f32[2]; b:bool[] c:f32[2] d:f32[2]. let\n"
        "    e:i32[] = convert_element_type[new_dtype=int32 weak_type=False] b\n"
        "    f:f32[2] g:f32[2] = cond[\n"
        "      branches=(\n"
        "        { lambda ; h:f32[2] i:f32[2] j:f32[2]. let  in (j, i) }\n"
        "        { lambda ; k:f32[2] l:f32[2] m:f32[2]. let n:f32[2] = add l k in (n, m) }\n"
        "      )\n"
        "    ] e a c d\n"
        "  in (f, g) }");
  check_roundtrip(cj);
}

TEST_CASE("branches of more than 10 equations are hoisted as let jaxprs and parse back") {
  auto chain = [](Array v, bool use_sin) {
    for (int k = 0; k < 11; ++k) v = use_sin ? lax::sin(v) : lax::cos(v);
    return v;
  };
  auto f = [&](const Array& p, const Array& x) {
    return lax::cond(
        p, [&](const Array& v) { return chain(v, true); }, [&](const Array& v) { return chain(v, false); }, x);
  };
  auto cj = make_jaxpr(f)(Array(true), scalar(0.5));
  std::string t = text(cj);
  CHECK(t.rfind("let jaxpr = { lambda ; a:f32[]. let\n", 0) == 0);
  CHECK(t.find("let jaxpr1 = ") != std::string::npos);
  CHECK(t.find("cond[branches=(jaxpr jaxpr1)] ") != std::string::npos);
  check_roundtrip(cj);
  auto parsed = parse_jaxpr(t);
  double want = 0.5;
  for (int k = 0; k < 11; ++k) want = std::cos(want);
  CHECK(eval_jaxpr(*parsed, {}, std::vector<Array>{Array(false), scalar(0.5)})[0].item<float>() ==
        doctest::Approx(want));
}

TEST_CASE("switch_ clamps its index as JAX") {
  Array x = scalar(0.5);
  CHECK(three_way(make_scalar(0, i32), x).item<float>() == doctest::Approx(0.25));
  CHECK(three_way(make_scalar(1, i32), x).item<float>() == doctest::Approx(std::sin(0.5)));
  CHECK(three_way(make_scalar(2, i32), x).item<float>() == doctest::Approx(std::exp(0.5)));
  CHECK(three_way(make_scalar(-7, i32), x).item<float>() == doctest::Approx(0.25));
  CHECK(three_way(make_scalar(9, i32), x).item<float>() == doctest::Approx(std::exp(0.5)));
  CHECK(jit(three_way)(make_scalar(1, i32), x).item<float>() == doctest::Approx(std::sin(0.5)));
  auto cj = make_jaxpr(three_way)(make_scalar(1, i32), x);
  CHECK(text(cj) ==
        "{ lambda ; a:i32[] b:f32[]. let\n"
        "    c:i32[] = clamp 0:i32[] a 2:i32[]\n"
        "    d:f32[] = cond[\n"
        "      branches=(\n"
        "        { lambda ; e:f32[]. let f:f32[] = mul e e in (f,) }\n"
        "        { lambda ; g:f32[]. let h:f32[] = sin g in (h,) }\n"
        "        { lambda ; i:f32[]. let j:f32[] = exp i in (j,) }\n"
        "      )\n"
        "    ] c b\n"
        "  in (d,) }");
  check_roundtrip(cj);
}

TEST_CASE("cond and switch_ under vmap: batched operands, batched predicate") {
  Array xs = arr<float>({1, 2, 3});
  // Unbatched predicate: the cond stays a cond over batched branches.
  auto f = [](const Array& x) { return sin_or_neg(Array(false), x); };
  CHECK(vals(vmap(f)(xs)) == std::vector<double>{-1, -2, -3});
  std::string t = text(make_jaxpr(vmap(f))(xs));
  CHECK(t.find("cond[") != std::string::npos);
  // Batched predicate: both branches run and select_n picks per example.
  Array ps = jnp::array<bool>({true, false, true}, {3});
  auto v = vals(vmap(sin_or_neg)(ps, xs));
  CHECK(v[0] == doctest::Approx(std::sin(1.0)));
  CHECK(v[1] == -2);
  CHECK(v[2] == doctest::Approx(std::sin(3.0)));
  std::string tb = text(make_jaxpr(vmap(sin_or_neg))(ps, xs));
  CHECK(tb.find("select_n") != std::string::npos);
  CHECK(tb.find("cond[") == std::string::npos);
  // Batched index of switch_, batch on axis 1 of x.
  Array idx = jnp::array<int32_t>({0, 1, 2, 5}, {4});
  Array x2 = arr<float>({0.5, 0.5, 0.5, 0.5, 1, 1, 1, 1}, {2, 4});
  auto out = vmap(three_way, {0, 1})(idx, x2);  // [4, 2]
  CHECK(out.shape() == Shape{4, 2});
  auto o = vals(out);
  CHECK(o[0] == doctest::Approx(0.25));
  CHECK(o[1] == doctest::Approx(1));
  CHECK(o[2] == doctest::Approx(std::sin(0.5)));
  CHECK(o[4] == doctest::Approx(std::exp(0.5)));
  CHECK(o[7] == doctest::Approx(std::exp(1.0)));
}

TEST_CASE("grad of cond and switch_: values and check_grads") {
  auto g = grad([](const Array& x) { return sin_or_neg(Array(true), x); });
  CHECK(g(scalar(0.3)).item<float>() == doctest::Approx(std::cos(0.3)));
  auto gf = grad([](const Array& x) { return sin_or_neg(Array(false), x); });
  CHECK(gf(scalar(0.3)).item<float>() == doctest::Approx(-1));
  for (int i = 0; i < 3; ++i) {
    Array idx = make_scalar(i, i32);
    check_grads([&](const std::vector<Array>& a) { return std::vector<Array>{three_way(idx, a[0])}; },
                {f64s({0.7, -0.4})}, {.order = 2});
  }
  for (bool p : {true, false}) {
    // Operands closed over and passed, mixed: x * w in one branch, x + w in the other.
    check_grads(
        [&](const std::vector<Array>& a) {
          Array w = a[1];
          return std::vector<Array>{lax::cond(
              Array(p), [&](const Array& v) { return lax::mul(lax::sin(v), w); },
              [&](const Array& v) { return lax::add(lax::mul(v, v), w); }, a[0])};
        },
        {f64s({0.3, 1.2}), f64s({2.0, -1.0})}, {.order = 2});
  }
  // A predicate computed from the differentiated input; per example under vmap (a batched index).
  auto leaky = [](const Array& x) {
    return lax::cond(
        x > 0, [](const Array& v) { return v * v; }, [](const Array& v) { return v * 0.1; }, x);
  };
  check_grads([&](const std::vector<Array>& a) { return std::vector<Array>{leaky(a[0])}; }, {scalar(0.8, f64)},
              {.order = 2});
  check_grads([&](const std::vector<Array>& a) { return std::vector<Array>{leaky(a[0])}; }, {scalar(-0.8, f64)},
              {.order = 2});
  auto vg_leaky = vals(vmap(grad(leaky))(arr<float>({-2, 3})));
  CHECK(vg_leaky[0] == doctest::Approx(0.1));
  CHECK(vg_leaky[1] == 6);
  CHECK(vals(jit(vmap(grad(leaky)))(arr<float>({-2, 3})))[1] == 6);
  // grad through jit and vmap of grad.
  auto jg = jit(grad([](const Array& x) { return three_way(make_scalar(2, i32), x); }));
  CHECK(jg(scalar(0.5)).item<float>() == doctest::Approx(std::exp(0.5)));
  auto vg = vmap(grad(sin_or_neg, argnums<1>))(jnp::array<bool>({true, false}, {2}), arr<float>({0.2, 0.4}));
  CHECK(vals(vg)[0] == doctest::Approx(std::cos(0.2)));
  CHECK(vals(vg)[1] == doctest::Approx(-1));
}

// ---- while_loop / fori_loop ----

TEST_CASE("while_loop eagerly, under jit and its text") {
  auto w = [](const Array& x) {
    return lax::while_loop([](const Array& c) { return lax::lt(c, scalar(10)); },
                           [](const Array& c) { return lax::mul(c, scalar(2)); }, x);
  };
  CHECK(w(scalar(1)).item<float>() == 16);
  CHECK(w(scalar(11)).item<float>() == 11);
  CHECK(jit(w)(scalar(3)).item<float>() == 12);
  auto cj = make_jaxpr(w)(scalar(1));
  CHECK(text(cj) ==
        "{ lambda ; a:f32[]. let\n"
        "    b:f32[] = while[\n"
        "      body_jaxpr={ lambda ; c:f32[]. let d:f32[] = mul c 2.0:f32[] in (d,) }\n"
        "      body_nconsts=0\n"
        "      cond_jaxpr={ lambda ; e:f32[]. let f:bool[] = lt e 10.0:f32[] in (f,) }\n"
        "      cond_nconsts=0\n"
        "    ] a\n"
        "  in (b,) }");
  check_roundtrip(cj);
  // A tree carry with a closed-over bound in cond and a closed-over step in the body.
  Array limit = arr<float>({5}), step = arr<float>({1.5});
  auto w2 = [&](const std::pair<Array, Array>& c0) {
    return lax::while_loop([&](const std::pair<Array, Array>& c) { return jnp::all(lax::lt(c.first, limit)); },
                           [&](const std::pair<Array, Array>& c) {
                             return std::pair{lax::add(c.first, step), lax::add(c.second, make_scalar(1, i32))};
                           },
                           c0);
  };
  auto [x, n] = w2(std::pair{arr<float>({0}), make_scalar(0, i32)});
  CHECK(vals(x)[0] == 6);
  CHECK(n.item<int>() == 4);
  std::string t = text(make_jaxpr(w2)(std::pair{arr<float>({0}), make_scalar(0, i32)}));
  CHECK(t.find("body_nconsts=1") != std::string::npos);
  CHECK(t.find("cond_nconsts=1") != std::string::npos);
}

TEST_CASE("fori_loop: static bounds lower to scan, traced bounds to while") {
  auto body = [](const Array& i, const Array& c) {
    Array doubled = lax::mul(c, scalar(2));
    return lax::add(doubled, i.astype(f32));
  };
  auto f = [&](const Array& x) { return lax::fori_loop(0, 4, body, x); };
  CHECK(f(scalar(1)).item<float>() == 1 * 16 + 0 * 8 + 1 * 4 + 2 * 2 + 3);
  CHECK(lax::fori_loop(3, 3, body, scalar(7)).item<float>() == 7);
  CHECK(lax::fori_loop(5, 2, body, scalar(7)).item<float>() == 7);
  auto cj = make_jaxpr(f)(scalar(1));
  CHECK(text(cj) ==
        "{ lambda ; a:f32[]. let\n"
        "    _:i32[] b:f32[] = scan[\n"
        "      _split_transpose=False\n"
        "      jaxpr={ lambda ; c:i32[] d:f32[]. let\n"
        "          e:i32[] = add c 1:i32[]\n"
        "          f:f32[] = mul d 2.0:f32[]\n"
        "          g:f32[] = convert_element_type[new_dtype=float32 weak_type=False] c\n"
        "          h:f32[] = add f g\n"
        "        in (e, h) }\n"
        "      length=4\n"
        "      linear=(False, False)\n"
        "      num_carry=2\n"
        "      num_consts=0\n"
        "      reverse=False\n"
        "      unroll=1\n"
        "    ] 0:i32[] a\n"
        "  in (b,) }");
  check_roundtrip(cj);
  // Traced bounds: a while over (i, hi, carry).
  auto g = [&](const Array& lo, const Array& hi, const Array& x) { return lax::fori_loop(lo, hi, body, x); };
  auto t = text(make_jaxpr(g)(make_scalar(0, i32), make_scalar(4, i32), scalar(1)));
  CHECK(t.find("while[") != std::string::npos);
  CHECK(t.find("scan[") == std::string::npos);
  CHECK(jit(g)(make_scalar(0, i32), make_scalar(4, i32), scalar(1)).item<float>() == 27);
  CHECK(jit(g)(make_scalar(2, i32), make_scalar(4, i32), scalar(1)).item<float>() == 1 * 4 + 2 * 2 + 3);
  // Concrete Array bounds are static, as in JAX.
  CHECK(g(make_scalar(0, i32), make_scalar(4, i32), scalar(1)).item<float>() == 27);
}

TEST_CASE("forward-mode jvp of while_loop; reverse mode raises" CJAX_JIT_ONLY) {
  auto w = [](const Array& x) {
    auto r = lax::while_loop([](const std::pair<Array, Array>& c) { return lax::lt(c.first, make_scalar(3, i32)); },
                             [](const std::pair<Array, Array>& c) {
                               return std::pair{lax::add(c.first, make_scalar(1, i32)), lax::sin(c.second)};
                             },
                             std::pair{make_scalar(0, i32), x});
    return r.second;
  };
  double x0 = 0.7, s1 = std::sin(x0), s2 = std::sin(s1), s3 = std::sin(s2);
  auto [out, tan] = jvp(w, std::tuple{scalar(x0, f64)}, std::tuple{scalar(1, f64)});
  CHECK(out.item<double>() == doctest::Approx(s3));
  CHECK(tan.item<double>() == doctest::Approx(std::cos(s2) * std::cos(s1) * std::cos(x0)));
  CHECK(jacfwd(w)(scalar(x0, f64)).item<double>() == doctest::Approx(std::cos(s2) * std::cos(s1) * std::cos(x0)));
  check_grads([&](const std::vector<Array>& a) { return std::vector<Array>{w(a[0])}; }, {f64s({0.3, -0.5})},
              {.order = 2, .rev = false});
  // The jvp of a while is one while equation.
  auto jt =
      text(make_jaxpr([&](const Array& x) { return std::get<1>(jvp(w, std::tuple{x}, std::tuple{x})); })(scalar(0.5)));
  CHECK(jt.find("while[") != std::string::npos);
  CHECK_ERR(grad(w)(scalar(0.5)), ValueError, "Reverse-mode differentiation does not work for lax::while_loop",
            "lax::scan");
  auto g = [](const Array& hi, const Array& x) {
    return lax::fori_loop(
        make_scalar(0, i32), hi, [](const Array&, const Array& c) { return lax::sin(c); }, x);
  };
  CHECK_ERR(jit(grad(g, argnums<1>))(make_scalar(2, i32), scalar(0.5)), ValueError, "fori_loop with static");
  // vmap of the while with a batched predicate: each example runs its own trip count.
  auto count = [](const Array& x) {
    return lax::while_loop([](const Array& c) { return lax::lt(c, scalar(100)); },
                           [](const Array& c) { return lax::mul(c, scalar(3)); }, x);
  };
  CHECK(vals(vmap(count)(arr<float>({1, 50, 200, 7}))) == std::vector<double>{243, 150, 200, 189});
  std::string vt = text(make_jaxpr(vmap(count))(arr<float>({1, 50})));
  CHECK(vt.find("reduce_or") != std::string::npos);
  CHECK(vt.find("select_n") != std::string::npos);
  // vmap with an unbatched predicate (a bound traced by jit): the carry is batched, the trip count shared.
  auto dyn = jit([](const Array& hi, const Array& xs) {
    return vmap([&](const Array& x) {
      auto twice = [](const Array&, const Array& c) { return lax::mul(c, scalar(2)); };
      return lax::fori_loop(make_scalar(0, i32), hi, twice, x);
    })(xs);
  });
  CHECK(vals(dyn(make_scalar(3, i32), arr<float>({1, 2}))) == std::vector<double>{8, 16});
}

TEST_CASE("grad of fori_loop with static bounds") {
  auto f = [](const Array& x) {
    return lax::fori_loop(
        0, 3, [](const Array& i, const Array& c) { return lax::sin(c) * (i.astype(f64) + 1.0); }, x);
  };
  check_grads([&](const std::vector<Array>& a) { return std::vector<Array>{f(a[0])}; }, {f64s({0.3, -0.8})},
              {.order = 2});
  // d/dx of 3 sin(2 sin(sin x))
  double x = 0.4, a = std::sin(x), b = 2 * std::sin(a);
  CHECK(grad(f)(scalar(x, f64)).item<double>() == doctest::Approx(3 * std::cos(b) * 2 * std::cos(a) * std::cos(x)));
  CHECK(jit(grad(f))(scalar(x, f64)).item<double>() ==
        doctest::Approx(3 * std::cos(b) * 2 * std::cos(a) * std::cos(x)));
  CHECK(vals(vmap(grad(f))(f64s({x, x})))[1] == doctest::Approx(3 * std::cos(b) * 2 * std::cos(a) * std::cos(x)));
}

// ---- scan ----

TEST_CASE("scan eagerly, reversed, with trees, without xs and under jit") {
  auto [c, ys] = cumulative(scalar(0), arr<float>({1, 2, 3}));
  CHECK(c.item<float>() == 6);
  CHECK(vals(ys) == std::vector<double>{0, 2, 9});
  auto [cr, ysr] = lax::scan(
      [](const Array& c, const Array& x) {
        return std::pair{lax::add(c, x), c};
      },
      scalar(0), arr<float>({1, 2, 3}), {.reverse = true});
  CHECK(cr.item<float>() == 6);
  CHECK(vals(ysr) == std::vector<double>{5, 3, 0});
  // Tree carry and xs; a y that is a tree.
  std::map<std::string, Array> xs{{"a", arr<float>({1, 2, 3, 4, 5, 6}, {3, 2})}, {"b", arr<float>({10, 20, 30})}};
  auto [c2, y2] = lax::scan(
      [](const std::pair<Array, Array>& c, const std::map<std::string, Array>& x) {
        Array s = lax::add(c.first, x.at("a"));
        return std::pair{std::pair{s, lax::add(c.second, x.at("b"))}, std::vector<Array>{s, lax::neg(x.at("b"))}};
      },
      std::pair{arr<float>({0, 0}), scalar(0)}, xs);
  CHECK(vals(c2.first) == std::vector<double>{9, 12});
  CHECK(c2.second.item<float>() == 60);
  CHECK(vals(y2[0]) == std::vector<double>{1, 2, 4, 6, 9, 12});
  CHECK(vals(y2[1]) == std::vector<double>{-10, -20, -30});
  // No xs: length given; y None.
  auto [c3, none] = lax::scan(
      [](const Array& c) {
        return std::pair{lax::mul(c, scalar(3)), None};
      },
      scalar(1), None, {.length = 4});
  CHECK(c3.item<float>() == 81);
  (void)none;
  auto [c4, y4] = lax::scan(
      [](const Array& c, NoneT) {
        return std::pair{lax::add(c, scalar(1)), c};
      },
      scalar(0), None, {.length = 3});
  CHECK(vals(y4) == std::vector<double>{0, 1, 2});
  // A weakly typed initial carry takes the body's dtype (JAX's weak-type promotion).
  auto [c6, y6] = lax::scan(
      [](const Array& c, const Array& x) {
        return std::pair{c + x, c};
      },
      Array(0.0), arr<float>({1, 2, 3}));
  CHECK(c6.dtype() == f32);
  CHECK(c6.item<float>() == 6);
  CHECK(vals(y6) == std::vector<double>{0, 1, 3});
  // Zero length: ys has a leading 0 axis.
  auto [c5, y5] = cumulative(scalar(2), jnp::zeros({0}));
  CHECK(c5.item<float>() == 2);
  CHECK(y5.shape() == Shape{0});
  auto [cj_, ysj] = jit(cumulative)(scalar(0), arr<float>({1, 2, 3}));
  CHECK(vals(ysj) == std::vector<double>{0, 2, 9});
  CHECK(cj_.item<float>() == 6);
}

TEST_CASE("scan prints as one equation with JAX's params") {
  Array w = arr<float>({2, 3});
  auto f = [&](const Array& h0, const Array& xs) {
    auto step = [&](const Array& c, const Array& x) { return std::pair{lax::add(lax::mul(c, w), x), lax::sin(c)}; };
    return lax::scan(step, h0, xs, {.reverse = true, .unroll = 2});
  };
  auto cj = make_jaxpr(f)(arr<float>({0, 0}), jnp::zeros({5, 2}));
  CHECK(text(cj) ==
        "{ lambda a:f32[2]; b:f32[2] c:f32[5,2]. let\n"
        "    d:f32[2] e:f32[5,2] = scan[\n"
        "      _split_transpose=False\n"
        "      jaxpr={ lambda ; f:f32[2] g:f32[2] h:f32[2]. let\n"
        "          i:f32[2] = mul g f\n"
        "          j:f32[2] = add i h\n"
        "          k:f32[2] = sin g\n"
        "        in (j, k) }\n"
        "      length=5\n"
        "      linear=(False, False, False)\n"
        "      num_carry=1\n"
        "      num_consts=1\n"
        "      reverse=True\n"
        "      unroll=2\n"
        "    ] a b c\n"
        "  in (d, e) }");
  check_roundtrip(cj);
  auto parsed = parse_jaxpr(text(cj));
  auto outs = eval_jaxpr(*parsed, std::vector<Array>{w}, std::vector<Array>{arr<float>({1, 1}), jnp::ones({5, 2})});
  auto direct = f(arr<float>({1, 1}), jnp::ones({5, 2}));
  CHECK(vals(outs[0]) == vals(direct.first));
  CHECK(vals(outs[1]) == vals(direct.second));
}

TEST_CASE("scan under vmap: batched xs, batched init, batched consts") {
  Array xs = arr<float>({1, 2, 3, 4, 5, 6}, {2, 3});  // batch 2, length 3
  auto [c, ys] = vmap(cumulative, {None, 0})(scalar(0), xs);
  CHECK(vals(c) == std::vector<double>{6, 15});
  CHECK(vals(ys) == std::vector<double>{0, 2, 9, 0, 20, 54});
  // Batch along axis 1 of xs and a batched init.
  auto [c2, ys2] = vmap(cumulative, {0, 1})(arr<float>({1, 10}), xs.T());
  CHECK(vals(c2) == std::vector<double>{7, 25});
  CHECK(vals(ys2) == std::vector<double>{1, 4, 12, 40, 70, 114});
  // Only a closed-over value is batched: the carry becomes batched by the fixpoint.
  auto f = [](const Array& w) {
    return lax::scan(
               [&](const Array& c, const Array& x) {
                 return std::pair{lax::add(lax::mul(c, w), x), c};
               },
               scalar(1), arr<float>({1, 1}))
        .first;
  };
  CHECK(vals(vmap(f)(arr<float>({2, 3}))) == std::vector<double>{7, 13});
  std::string t = text(make_jaxpr(vmap(cumulative, {None, 0}))(scalar(0), xs));
  CHECK(t.find("scan[") != std::string::npos);
}

TEST_CASE("grad of scan: check_grads forward and reverse, reverse scans and an RNN") {
  check_grads(
      [](const std::vector<Array>& a) {
        auto [c, ys] = lax::scan(
            [](const Array& c, const Array& x) {
              return std::pair{lax::sin(lax::mul(c, x)), lax::mul(c, c)};
            },
            a[0], a[1]);
        return std::vector<Array>{c, ys};
      },
      {scalar(0.7, f64), f64s({0.5, -1.1, 0.9})}, {.order = 2});
  check_grads(
      [](const std::vector<Array>& a) {
        auto [c, ys] = lax::scan(
            [&](const Array& c, const Array& x) {
              return std::pair{lax::add(lax::mul(c, a[2]), lax::cos(x)), lax::exp(c)};
            },
            a[0], a[1], {.reverse = true});
        return std::vector<Array>{c, ys};
      },
      {scalar(0.2, f64), f64s({0.5, -1.1, 0.9, 0.3}), scalar(0.8, f64)}, {.order = 2});
  // An RNN: h' = tanh(W h + U x + b), loss = sum of the hidden states.
  Array W = arr<double>({0.3, -0.2, 0.1, 0.4}, {2, 2}), U = arr<double>({0.5, -0.7, 0.2, 0.1, 0.9, -0.3}, {2, 3});
  Array b = f64s({0.05, -0.1}), h0 = f64s({0.1, 0.2});
  Array xs = arr<double>({0.1, 0.2, 0.3, -0.1, 0.5, -0.4, 0.3, 0.3, 0.0, 0.7, -0.6, 0.2}, {4, 3});
  auto rnn = [](const std::vector<Array>& p) {
    auto [h, hs] = lax::scan(
        [&](const Array& h, const Array& x) {
          Array hn = jnp::tanh(jnp::matmul(p[0], h) + jnp::matmul(p[1], x) + p[2]);
          return std::pair{hn, hn};
        },
        p[3], p[4]);
    return std::vector<Array>{jnp::sum(hs) + jnp::sum(h)};
  };
  check_grads(rnn, {W, U, b, h0, xs}, {.order = 2});
  // The same gradient as the unrolled loop.
  auto unrolled = [](const std::vector<Array>& p) {
    Array h = p[3], total = scalar(0, f64);
    for (int t = 0; t < 4; ++t) {
      h = jnp::tanh(jnp::matmul(p[0], h) + jnp::matmul(p[1], p[4][t]) + p[2]);
      total = total + jnp::sum(h);
    }
    return std::vector<Array>{total + jnp::sum(h)};
  };
  auto gw = grad([&](const Array& w) { return rnn({w, U, b, h0, xs})[0]; })(W);
  auto gw2 = grad([&](const Array& w) { return unrolled({w, U, b, h0, xs})[0]; })(W);
  auto g1 = vals(gw), g2 = vals(gw2);
  for (size_t i = 0; i < g1.size(); ++i) CHECK(g1[i] == doctest::Approx(g2[i]).epsilon(1e-12));
  // grad keeps scans (forward and a reversed transposed scan), never unrolls.
  std::string t = text(make_jaxpr(grad([&](const Array& w) { return rnn({w, U, b, h0, xs})[0]; }))(W));
  CHECK(t.find("scan[") != std::string::npos);
  CHECK(t.find("reverse=True") != std::string::npos);
  CHECK(t.find("tanh") != std::string::npos);
  CHECK(t.find("length=4") != std::string::npos);
  // jit(grad) and vmap(grad) agree with eager grad.
  auto gj = vals(jit(grad([&](const Array& w) { return rnn({w, U, b, h0, xs})[0]; }))(W));
  for (size_t i = 0; i < g1.size(); ++i) CHECK(gj[i] == doctest::Approx(g1[i]).epsilon(1e-12));
}

// ---- misuse ----

TEST_CASE("control flow errors name the problem") {
  Array x = arr<float>({1, 2});
  CHECK_ERR(lax::cond(
                Array(true), [](const Array& v) { return v; }, [](const Array& v) { return v.astype(i32); }, x),
            DTypeError, "lax::cond", "false_fn has type i32[2]", "true_fn has type f32[2]");
  CHECK_ERR(lax::cond(
                Array(true), [](const Array& v) { return v; }, [](const Array& v) { return v[0]; }, x),
            ShapeError, "false_fn has type f32[]", "true_fn has type f32[2]");
  CHECK_ERR(lax::cond(
                Array(true),
                [](const Array& v) {
                  return std::vector<Array>{v, v};
                },
                [](const Array& v) { return std::vector<Array>{v}; }, x),
            ValueError, "same tree structure", "false_fn", "true_fn");
  CHECK_ERR(sin_or_neg(jnp::array<bool>({true, false}, {2}), x), ShapeError, "pred must be a scalar", "bool[2]");
  CHECK_ERR(three_way(scalar(1), scalar(1)), DTypeError, "index must be an integer");
  CHECK_ERR(cumulative(scalar(0), scalar(1)), ShapeError, "no leading axis");
  CHECK_ERR(lax::scan(
                [](const Array& c, const std::vector<Array>& xs) {
                  return std::pair{c, lax::add(xs[0], xs[1])};
                },
                scalar(0), std::vector<Array>{jnp::zeros({3}), jnp::zeros({4})}),
            ShapeError, "disagrees", "3, 4");
  CHECK_ERR(lax::scan(
                [](const Array& c, const Array& x) {
                  return std::pair{c, x};
                },
                scalar(0), jnp::zeros({3}), {.length = 5}),
            ShapeError, "`length` argument of 5", "3");
  CHECK_ERR(lax::scan(
                [](const Array& c) {
                  return std::pair{c, c};
                },
                scalar(0), None),
            ValueError, "`length` not provided");
  CHECK_ERR(lax::scan(
                [](const Array& c, const Array& x) {
                  return std::pair{c.astype(i32), x};
                },
                scalar(0), jnp::zeros({3})),
            DTypeError, "lax::scan f", "f32[]", "i32[]");
  CHECK_ERR(lax::while_loop([](const Array& c) { return c; }, [](const Array& c) { return c; }, scalar(1)), DTypeError,
            "cond_fn must return a boolean scalar", "f32[]");
  CHECK_ERR(lax::fori_loop(
                0, 3, [](const Array&, const Array& c) { return std::vector<Array>{c}; }, scalar(1)),
            ValueError, "same tree structure");
  // Python-style control flow on a traced value inside a branch is a concretization error naming the branch.
  auto branchy = [](const Array& v) { return bool(v > 0) ? v : -v; };
  CHECK_ERR(lax::cond(
                Array(true), branchy, [](const Array& v) { return v; }, scalar(1)),
            ConcretizationError, "lax::cond true_fn");
}
