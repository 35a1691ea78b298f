// make_jaxpr, JaxprTrace and the jaxpr printer. Each golden text is what JAX prints for the
// Python program in the comment beside it (JAX's printer: jax/_src/core.py pp_jaxpr, laid out by
// jaxlib/_pretty_printer.cc at width 80).
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>
#include <map>
#include <sstream>

#include "cjax/cjax.h"
#include "core/array/array_impl.h"
#include "test_util.h"
#include "trace/jaxpr.h"
#include "trace/jaxpr_trace.h"

using namespace cjax;
namespace jnp = cjax::numpy;
using cjax::testing::text;

TEST_CASE("elementwise chain with scalar literals") {
  // jax.make_jaxpr(lambda x: x * 2.0 + 1)(jnp.ones(3))
  auto cj = make_jaxpr([](const Array& x) { return x * 2.0 + 1; })(jnp::ones({3}));
  CHECK(text(cj) ==
        "{ lambda ; a:f32[3]. let\n"
        "    b:f32[3] = mul a 2.0:f32[]\n"
        "    c:f32[3] = add b 1.0:f32[]\n"
        "  in (c,) }");
  CHECK(cj.consts.empty());
  CHECK(cj->eqns().size() == 2);
  CHECK(cj->eqns()[0].primitive->name == "mul");
  CHECK(std::holds_alternative<Literal>(cj->eqns()[0].inputs[1]));
  CHECK(cj.str() == text(cj));
}

TEST_CASE("one-line jaxprs and integer literals") {
  // jax.make_jaxpr(lambda x: jnp.sin(x))(jnp.ones(3))
  CHECK(text(make_jaxpr([](const Array& x) { return jnp::sin(x); })(jnp::ones({3}))) ==
        "{ lambda ; a:f32[3]. let b:f32[3] = sin a in (b,) }");
  // jax.make_jaxpr(lambda x: x + 2)(jnp.arange(4))
  CHECK(text(make_jaxpr([](const Array& x) { return x + 2; })(jnp::arange(4))) ==
        "{ lambda ; a:i32[4]. let b:i32[4] = add a 2:i32[] in (b,) }");
  // jax.make_jaxpr(lambda x: x * 0.1)(jnp.ones(2, jnp.float64))  (with jax_enable_x64)
  CHECK(text(make_jaxpr([](const Array& x) { return x * 0.1; })(jnp::ones({2}, f64))) ==
        "{ lambda ; a:f64[2]. let b:f64[2] = mul a 0.1:f64[] in (b,) }");
}

TEST_CASE("dot_general breaks its params across lines") {
  // jax.make_jaxpr(jnp.matmul)(jnp.ones((8, 16)), jnp.ones((16, 4)))
  auto cj = make_jaxpr([](const Array& a, const Array& b) { return jnp::matmul(a, b); })(jnp::ones({8, 16}),
                                                                                         jnp::ones({16, 4}));
  CHECK(text(cj) ==
        "{ lambda ; a:f32[8,16] b:f32[16,4]. let\n"
        "    c:f32[8,4] = dot_general[\n"
        "      dimension_numbers=(([1], [0]), ([], []))\n"
        "      out_sharding=None\n"
        "      precision=None\n"
        "      preferred_element_type=float32\n"
        "    ] a b\n"
        "  in (c,) }");
  CHECK(cj.in_avals().size() == 2);
  CHECK(cj.out_avals()[0].shape == Shape{8, 4});
}

TEST_CASE("reduce_sum via numpy sum") {
  // jax.make_jaxpr(jnp.sum)(jnp.ones((2, 3)))   (JAX 0.9)
  CHECK(text(make_jaxpr([](const Array& x) { return jnp::sum(x); })(jnp::ones({2, 3}))) ==
        "{ lambda ; a:f32[2,3]. let\n"
        "    b:f32[] = reduce_sum[axes=(0, 1) out_sharding=None] a\n"
        "  in (b,) }");
  // jax.make_jaxpr(lambda x: jnp.sum(x, 0))(jnp.ones((1234, 1000, 100)))
  CHECK(text(make_jaxpr([](const Array& x) { return jnp::sum(x, 0); })(
            make_abstract(AbstractValue{{1234, 1000, 100}, f32, false, {}}))) ==
        "{ lambda ; a:f32[1234,1000,100]. let\n"
        "    b:f32[1000,100] = reduce_sum[axes=(0,) out_sharding=None] a\n"
        "  in (b,) }");
}

TEST_CASE("broadcast_in_dim from broadcast_to") {
  // jax.make_jaxpr(lambda a, b: a + jnp.broadcast_to(b, (2, 3)))(jnp.ones((2, 3)), jnp.ones(3))
  auto f = [](const Array& a, const Array& b) { return a + jnp::broadcast_to(b, {2, 3}); };
  CHECK(text(make_jaxpr(f)(jnp::ones({2, 3}), jnp::ones({3}))) ==
        "{ lambda ; a:f32[2,3] b:f32[3]. let\n"
        "    c:f32[2,3] = broadcast_in_dim[\n"
        "      broadcast_dimensions=(1,)\n"
        "      shape=(2, 3)\n"
        "      sharding=None\n"
        "    ] b\n"
        "    d:f32[2,3] = add a c\n"
        "  in (d,) }");
}

TEST_CASE("closed-over constants become constvars, scalars literals") {
  // c = jnp.array([1., 2., 3.]); jax.make_jaxpr(lambda x: x + c)(jnp.ones(3))
  Array c = jnp::array<float>({1, 2, 3});
  auto cj = make_jaxpr([&](const Array& x) { return x + c; })(jnp::ones({3}));
  CHECK(text(cj) == "{ lambda a:f32[3]; b:f32[3]. let c:f32[3] = add b a in (c,) }");
  REQUIRE(cj.consts.size() == 1);
  CHECK(cj.consts[0].impl() == c.impl());
  // The same constant used twice is one constvar:
  // jax.make_jaxpr(lambda x: x * c + c)(jnp.ones(3))
  CHECK(text(make_jaxpr([&](const Array& x) { return x * c + c; })(jnp::ones({3}))) ==
        "{ lambda a:f32[3]; b:f32[3]. let c:f32[3] = mul b a; d:f32[3] = add c a in (d,) }");
  // A rank-0 concrete array is inlined like a Python scalar (JAX inlines rank-0 arrays too):
  // s = jnp.float32(3); jax.make_jaxpr(lambda x: x - s)(jnp.ones(3))
  Array s = make_scalar(3.0, f32);
  CHECK(text(make_jaxpr([&](const Array& x) { return x - s; })(jnp::ones({3}))) ==
        "{ lambda ; a:f32[3]. let b:f32[3] = sub a 3.0:f32[] in (b,) }");
}

TEST_CASE("weak-typed input") {
  // jax.make_jaxpr(lambda x: x * 0.1)(2.0)   (x is a weakly typed f32[]; weak types are not printed)
  auto cj = make_jaxpr([](const Array& x) { return x * 0.1; })(Array(2.0f));
  CHECK(text(cj) == "{ lambda ; a:f32[]. let b:f32[] = mul a 0.10000000149011612:f32[] in (b,) }");
  CHECK(cj->invars()[0].aval().weak_type);
  CHECK(cj->eqns()[0].outputs[0].aval().weak_type);
}

TEST_CASE("tree inputs and tree outputs") {
  // def f(params, xy):
  //   x, y = xy
  //   return {'y': x @ params['w'] + params['b'], 'n': jnp.sum(y)}
  // jax.make_jaxpr(f)({'w': jnp.ones((4, 2)), 'b': jnp.ones((3, 2))}, (jnp.ones((3, 4)), jnp.ones(5)))
  Dict params{{"w", jnp::ones({4, 2})}, {"b", jnp::ones({3, 2})}};
  auto f = [](const Dict& p, const std::pair<Array, Array>& xy) {
    Dict out;
    out["y"] = jnp::matmul(xy.first, p["w"]) + p["b"].array();
    out["n"] = jnp::sum(xy.second);
    return out;
  };
  auto cj = make_jaxpr(f)(params, std::pair{jnp::ones({3, 4}), jnp::ones({5})});
  CHECK(text(cj) ==
        "{ lambda ; a:f32[3,2] b:f32[4,2] c:f32[3,4] d:f32[5]. let\n"
        "    e:f32[3,2] = dot_general[\n"
        "      dimension_numbers=(([1], [0]), ([], []))\n"
        "      out_sharding=None\n"
        "      precision=None\n"
        "      preferred_element_type=float32\n"
        "    ] c b\n"
        "    f:f32[3,2] = add e a\n"
        "    g:f32[] = reduce_sum[axes=(0,) out_sharding=None] d\n"
        "  in (g, f) }");
  // std::map and std::vector trees; static (non-tree) arguments are passed through.
  // jax.make_jaxpr(lambda xs, k: [x * k for x in xs], static_argnums=1)([jnp.ones(2), jnp.ones(2)], 3)
  auto g = [](const std::vector<Array>& xs, int k) {
    std::vector<Array> out;
    for (const Array& x : xs) out.push_back(x * k);
    return out;
  };
  CHECK(text(make_jaxpr(g)(std::vector<Array>{jnp::ones({2}), jnp::ones({2})}, 3)) ==
        "{ lambda ; a:f32[2] b:f32[2]. let\n"
        "    c:f32[2] = mul a 3.0:f32[]\n"
        "    d:f32[2] = mul b 3.0:f32[]\n"
        "  in (c, d) }");
}

TEST_CASE("multiple outputs, repeated and literal outputs") {
  // jax.make_jaxpr(lambda x, y: (x + y, x * y))(jnp.ones(3), jnp.ones(3))
  auto f = [](const Array& x, const Array& y) { return std::tuple{x + y, x * y}; };
  CHECK(text(make_jaxpr(f)(jnp::ones({3}), jnp::ones({3}))) ==
        "{ lambda ; a:f32[3] b:f32[3]. let\n"
        "    c:f32[3] = add a b\n"
        "    d:f32[3] = mul a b\n"
        "  in (c, d) }");
  // jax.make_jaxpr(lambda x: (x, x, jnp.float32(2)))(jnp.ones(3))
  auto g = [](const Array& x) { return std::vector<Array>{x, x, make_scalar(2.0, f32)}; };
  CHECK(text(make_jaxpr(g)(jnp::ones({3}))) == "{ lambda ; a:f32[3]. let  in (a, a, 2.0:f32[]) }");
}

TEST_CASE("identity function: a jaxpr without equations") {
  // jax.make_jaxpr(lambda x: x)(jnp.ones(3))
  auto cj = make_jaxpr([](const Array& x) { return x; })(jnp::ones({3}));
  CHECK(text(cj) == "{ lambda ; a:f32[3]. let  in (a,) }");
  CHECK(cj->eqns().empty());
  // A closed-over constant returned as is: jax.make_jaxpr(lambda x: c)(jnp.ones(3)), c = jnp.ones(4)
  Array c = jnp::ones({4});
  CHECK(text(make_jaxpr([&](const Array&) { return c; })(jnp::ones({3}))) ==
        "{ lambda a:f32[4]; b:f32[3]. let  in (a,) }");
}

TEST_CASE("unused equation outputs print as _") {
  // def f(x): jnp.cos(x); return jnp.sin(x)
  // jax.make_jaxpr(f)(jnp.ones(3))
  auto f = [](const Array& x) {
    (void)jnp::cos(x);
    return jnp::sin(x);
  };
  CHECK(text(make_jaxpr(f)(jnp::ones({3}))) == "{ lambda ; a:f32[3]. let _:f32[3] = cos a; b:f32[3] = sin a in (b,) }");
}

TEST_CASE("long jaxprs: one equation per line, names past z") {
  // def f(x):
  //   for _ in range(14): x = jnp.sin(x) * x
  //   return x
  // jax.make_jaxpr(f)(jnp.ones(2))
  auto f = [](const Array& a) {
    Array y = a;
    for (int i = 0; i < 14; ++i) y = jnp::sin(y) * y;
    return y;
  };
  std::string expect = "{ lambda ; a:f32[2]. let\n";
  const char* names[] = {"b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l",  "m",  "n",  "o", "p",
                         "q", "r", "s", "t", "u", "v", "w", "x", "y", "z", "ba", "bb", "bc", "bd"};
  for (int i = 0; i < 14; ++i) {
    std::string prev = i == 0 ? "a" : names[2 * i - 1];
    expect += fmt::format("    {}:f32[2] = sin {}\n", names[2 * i], prev);
    expect += fmt::format("    {}:f32[2] = mul {} {}\n", names[2 * i + 1], names[2 * i], prev);
  }
  expect += "  in (bc,) }";
  CHECK(text(make_jaxpr(f)(jnp::ones({2}))) == expect);
}

TEST_CASE("nested make_jaxpr: the inner trace's parent is the outer trace") {
  // def f(x):
  //   y = x * 2.0
  //   inner = jax.make_jaxpr(lambda z: z + y)(x)
  //   return y
  // inner: { lambda a:f32[3]; b:f32[3]. let c:f32[3] = add b a in (c,) }
  // jax.make_jaxpr(f)(jnp.ones(3))
  ClosedJaxpr inner;
  Trace* outer_trace = nullptr;
  Trace* inner_parent = nullptr;
  Array y_outer;
  auto f = [&](const Array& x) {
    Array y = x * 2.0;
    y_outer = y;
    outer_trace = current_trace();
    inner = make_jaxpr([&](const Array& z) {
      inner_parent = current_trace()->parent();
      return z + y;
    })(x);
    return y;
  };
  auto outer = make_jaxpr(f)(jnp::ones({3}));
  CHECK(text(outer) == "{ lambda ; a:f32[3]. let b:f32[3] = mul a 2.0:f32[] in (b,) }");
  CHECK(text(inner) == "{ lambda a:f32[3]; b:f32[3]. let c:f32[3] = add b a in (c,) }");
  CHECK(outer_trace != eval_trace());
  CHECK(inner_parent == outer_trace);
  REQUIRE(inner.consts.size() == 1);
  CHECK(inner.consts[0].impl() == y_outer.impl());  // the outer tracer is the inner const's value
  CHECK(current_trace() == eval_trace());
}

TEST_CASE("escaped tracers raise EscapedTracerError naming the primitive") {
  Array leaked;
  auto cj = make_jaxpr([&](const Array& x) {
    leaked = jnp::sin(x);
    return x;
  })(jnp::ones({3}));
  CHECK(text(cj) == "{ lambda ; a:f32[3]. let _:f32[3] = sin a in (a,) }");
  REQUIRE(leaked.defined());
  // Used eagerly after its trace ended.
  CHECK_ERR(leaked * 2.0, EscapedTracerError, "'mul'", "f32[3]", "escaped");
  CHECK_ERR(jnp::exp(leaked), EscapedTracerError, "'exp'");
  // Used inside another trace.
  CHECK_ERR(make_jaxpr([&](const Array& x) { return x + leaked; })(jnp::ones({3})), EscapedTracerError, "'add'",
            "f32[3]");
  // Returned from another trace.
  CHECK_ERR(make_jaxpr([&](const Array&) { return leaked; })(jnp::ones({3})), EscapedTracerError, "output 0", "f32[3]");
  // Reading it needs a value.
  CHECK_ERR(leaked.to_vector<float>(), ConcretizationError, "f32[3]");
  CHECK(current_trace() == eval_trace());
}

TEST_CASE("concrete values stay usable inside a trace; tracers are abstract") {
  Array c = jnp::array<float>({1, 2, 3});
  float read = 0;
  std::vector<float> vec;
  auto cj = make_jaxpr([&](const Array& x) {
    read = c.to_vector<float>()[1];  // eager reads of a concrete value
    vec = c.to_vector<float>();
    CHECK_ERR(x.to_vector<float>(), ConcretizationError, "f32[3]");
    return x * jnp::sum(c);
  })(jnp::ones({3}));
  CHECK(vec == std::vector<float>{1, 2, 3});
  CHECK(read == 2.0f);
  // `if (x > 0)` on a tracer needs its value.
  CHECK_THROWS_AS(make_jaxpr([](const Array& x) { return bool(x > 0) ? x : -x; })(Array(1.0f)), ConcretizationError);
  // c = jnp.array([1., 2., 3.]); jax.make_jaxpr(lambda x: x * jnp.sum(c))(jnp.ones(3))
  std::string t = text(cj);
  CHECK(t ==
        "{ lambda a:f32[3]; b:f32[3]. let\n"
        "    c:f32[] = reduce_sum[axes=(0,) out_sharding=None] a\n"
        "    d:f32[3] = mul b c\n"
        "  in (d,) }");
}

TEST_CASE("misuse") {
  CHECK_ERR(make_jaxpr([](const Array& x) { return x; })(Array()), ValueError, "empty Array");
  CHECK_ERR(make_jaxpr([](const Array& x) { return x + Array(); })(jnp::ones({2})), ValueError, "empty Array handle");
  CHECK_ERR(make_jaxpr([](const Array& x) {
              return std::vector<Array>{x, Array()};
            })(jnp::ones({2})),
            ValueError, "output 1");
  // The shape error of the traced op propagates, and the trace stack is restored.
  CHECK_THROWS_AS(make_jaxpr([](const Array& x, const Array& y) { return jnp::matmul(x, y); })(jnp::ones({2, 3}),
                                                                                               jnp::ones({4, 5})),
                  ShapeError);
  CHECK(current_trace() == eval_trace());
  ClosedJaxpr empty;
  CHECK_ERR(empty.pretty_print(), ValueError, "empty");
}

// ---- printer details: sub-jaxprs in params (higher-order primitives) -----------------------------

namespace {
// A call-like primitive holding a sub-jaxpr, registered by this test only.
const PrimitiveDef& test_call() {
  static const PrimitiveDef& def =
      register_primitive(PrimitiveDef{"test_call",
                                      PrimKind::HigherOrder,
                                      Arity::any(),
                                      [](std::span<const Array>, const Params& p) {
                                        return p.object<JaxprParam>("jaxpr")->jaxpr->out_avals();
                                      },
                                      nullptr,
                                      std::nullopt,
                                      {}});
  return def;
}
}  // namespace

TEST_CASE("sub-jaxprs print inline with shared names; big or repeated ones are hoisted") {
  auto body = make_jaxpr([](const Array& x) { return jnp::sin(x); })(jnp::ones({3}));
  auto call = [&](const Array& x, std::shared_ptr<const Jaxpr> j) {
    return bind1(test_call(), {x},
                 Params{{"jaxpr", std::shared_ptr<const ParamObject>(std::make_shared<JaxprParam>(j))}});
  };
  auto once = make_jaxpr([&](const Array& x) { return call(x, body.jaxpr); })(jnp::ones({3}));
  // The layout of JAX's pp_kv_pair for a Jaxpr-valued param (as pjit's jaxpr=... prints):
  CHECK(text(once) ==
        "{ lambda ; a:f32[3]. let\n"
        "    b:f32[3] = test_call[\n"
        "      jaxpr={ lambda ; c:f32[3]. let d:f32[3] = sin c in (d,) }\n"
        "    ] a\n"
        "  in (b,) }");
  // Used twice: hoisted as `let jaxpr = ... in` (JAX's pp_toplevel_jaxpr).
  auto twice = make_jaxpr([&](const Array& x) { return call(call(x, body.jaxpr), body.jaxpr); })(jnp::ones({3}));
  CHECK(text(twice) ==
        "let jaxpr = { lambda ; a:f32[3]. let b:f32[3] = sin a in (b,) } in\n"
        "{ lambda ; c:f32[3]. let\n"
        "    d:f32[3] = test_call[jaxpr=jaxpr] c\n"
        "    e:f32[3] = test_call[jaxpr=jaxpr] d\n"
        "  in (e,) }");
}

TEST_CASE("python_float_repr") {
  CHECK(python_float_repr(2.0) == "2.0");
  CHECK(python_float_repr(-0.0) == "-0.0");
  CHECK(python_float_repr(0.1) == "0.1");
  CHECK(python_float_repr(double(0.1f)) == "0.10000000149011612");
  CHECK(python_float_repr(1e-5) == "1e-05");
  CHECK(python_float_repr(0.0001) == "0.0001");
  CHECK(python_float_repr(123456.5) == "123456.5");
  CHECK(python_float_repr(1e16) == "1e+16");
  CHECK(python_float_repr(1e15) == "1000000000000000.0");
  CHECK(python_float_repr(1.5e300) == "1.5e+300");
  CHECK(python_float_repr(3.4028234663852886e38) == "3.4028234663852886e+38");
  CHECK(python_float_repr(1.0 / 0.0) == "inf");
  CHECK(python_float_repr(-1.0 / 0.0) == "-inf");
  CHECK(python_float_repr(std::nan("")) == "nan");
}
