// eval_jaxpr and check_jaxpr: evaluating a traced jaxpr gives the function's values eagerly,
// re-tracing eval_jaxpr stages the same jaxpr text, and check_jaxpr validates typing.
#include <doctest/doctest.h>

#include <sstream>

#include "cjax/cjax.h"
#include "core/array/array_impl.h"
#include "test_util.h"
#include "trace/eval_jaxpr.h"
#include "trace/jaxpr.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {

// For a function `f` of flat Array leaves `args`: eval_jaxpr(make_jaxpr(f)(args)) == f(args)
// eagerly; make_jaxpr of eval_jaxpr prints the same text; check_jaxpr passes.
template <class F, class... A>
void round_trip(F f, const A&... args) {
  ClosedJaxpr cj = make_jaxpr(f)(args...);
  check_jaxpr(cj);
  std::vector<Array> flat;
  (([&] {
     for (const Array& l : tree::leaves(args)) flat.push_back(l);
   })(),
   ...);
  std::vector<Array> got = eval_jaxpr(cj, flat);
  std::vector<Array> want = tree::leaves(f(args...));
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(concrete(got[i]) != nullptr);
    CHECK(got[i].aval() == want[i].aval());
    CHECK(vals(got[i]) == vals(want[i]));
  }
  auto restaged = make_jaxpr([&](const A&... xs) {
    std::vector<Array> in;
    (([&] {
       for (const Array& l : tree::leaves(xs)) in.push_back(l);
     })(),
     ...);
    return eval_jaxpr(cj, in);
  })(args...);
  CHECK(text(restaged) == text(cj));
  check_jaxpr(restaged);
}
}  // namespace

TEST_CASE("elementwise chain with literals") {
  // jax.make_jaxpr(lambda x: jnp.sin(x * 2.0 + 1) - x)(jnp.array([0., 1., -2.5]))
  auto f = [](const Array& x) { return jnp::sin(x * 2.0 + 1) - x; };
  Array x = jnp::array<float>({0, 1, -2.5f});
  round_trip(f, x);
  auto cj = make_jaxpr(f)(x);
  CHECK(text(cj) ==
        "{ lambda ; a:f32[3]. let\n"
        "    b:f32[3] = mul a 2.0:f32[]\n"
        "    c:f32[3] = add b 1.0:f32[]\n"
        "    d:f32[3] = sin c\n"
        "    e:f32[3] = sub d a\n"
        "  in (e,) }");
  // np.sin(np.float32([0,1,-2.5])*2+1) - [0,1,-2.5]
  std::vector<Array> in{x};
  auto out = eval_jaxpr(cj, in);
  auto v = vals(out[0]);
  CHECK(v[0] == doctest::Approx(0.8414709848));
  CHECK(v[1] == doctest::Approx(0.1411200081 - 1.0));
  CHECK(v[2] == doctest::Approx(0.7568024953 + 2.5));  // sin(-4) = 0.7568...
  // Integer chain: jax.make_jaxpr(lambda x: x * 3 - 1)(jnp.arange(4))
  round_trip([](const Array& x) { return x * 3 - 1; }, jnp::arange(4));
}

TEST_CASE("matmul") {
  auto f = [](const Array& a, const Array& b) { return jnp::matmul(a, b); };
  Array a = seq({3, 4}, 7, 3), b = seq({4, 2}, 5, 2);
  round_trip(f, a, b);
  // Mixed dtypes: f64 @ f64
  round_trip(f, seq({2, 3}, 4, 1, f64), seq({3, 5}, 6, 2, f64));
}

TEST_CASE("reductions") {
  round_trip([](const Array& x) { return jnp::sum(x, 0); }, seq({4, 3}, 5, 2));
  round_trip([](const Array& x) { return jnp::max(x); }, seq({2, 3, 2}, 7, 3, i32));
  round_trip([](const Array& x) { return jnp::mean(x, -1); }, seq({2, 5}, 9, 4));
}

TEST_CASE("broadcasting") {
  // x[:, None] + y: broadcast_in_dim on both sides
  round_trip([](const Array& x, const Array& y) { return x.reshape({3, 1}) + y; }, seq({3}, 3, 1), seq({4}, 4, 0));
  round_trip([](const Array& x) { return jnp::broadcast_to(x, {2, 3}); }, seq({3}, 5, 2));
}

TEST_CASE("closed-over constants become constvars and are passed back as consts") {
  Array c = jnp::array<float>({1, 2, 3});
  auto f = [&](const Array& x) { return x * c + c; };
  auto cj = make_jaxpr(f)(jnp::ones({3}));
  REQUIRE(cj.consts.size() == 1);
  CHECK(text(cj) == "{ lambda a:f32[3]; b:f32[3]. let c:f32[3] = mul b a; d:f32[3] = add c a in (d,) }");
  round_trip(f, jnp::array<float>({2, -1, 0.5f}));
  // Explicit consts: a different constant value gives a different result.
  std::vector<Array> consts{jnp::array<float>({10, 20, 30})}, args{jnp::array<float>({1, 2, 3})};
  CHECK(vals(eval_jaxpr(*cj, consts, args)[0]) == std::vector<double>{20, 60, 120});
}

TEST_CASE("multiple outputs, repeated and literal outputs") {
  round_trip([](const Array& x, const Array& y) { return std::tuple{x + y, x * y}; }, seq({3}, 4, 1), seq({3}, 3, 0));
  round_trip([](const Array& x) { return std::vector<Array>{x, x, make_scalar(2.0, f32)}; }, seq({2}, 3, 1));
  // A returned constant array and an input returned as is.
  Array c = jnp::ones({4});
  round_trip([&](const Array& x) { return std::vector<Array>{c, x}; }, seq({3}, 3, 1));
}

TEST_CASE("tree arguments and tree outputs") {
  Dict params{{"w", seq({4, 2}, 5, 2)}, {"b", seq({3, 2}, 3, 1)}};
  auto f = [](const Dict& p, const std::pair<Array, Array>& xy) {
    Dict out;
    out["y"] = jnp::matmul(xy.first, p["w"]) + p["b"].array();
    out["n"] = jnp::sum(xy.second);
    return out;
  };
  round_trip(f, params, std::pair{seq({3, 4}, 6, 2), seq({5}, 4, 1)});
}

TEST_CASE("eval_jaxpr under another trace composes: nested make_jaxpr of nested eval") {
  auto inner = make_jaxpr([](const Array& x) { return jnp::exp(x) * 2.0; })(jnp::ones({2}));
  // Tracing a function that evaluates the jaxpr twice stages both copies.
  auto outer = make_jaxpr([&](const Array& x) {
    std::vector<Array> a{x};
    std::vector<Array> b{eval_jaxpr(inner, a)[0]};
    return eval_jaxpr(inner, b)[0];
  })(jnp::ones({2}));
  CHECK(text(outer) ==
        "{ lambda ; a:f32[2]. let\n"
        "    b:f32[2] = exp a\n"
        "    c:f32[2] = mul b 2.0:f32[]\n"
        "    d:f32[2] = exp c\n"
        "    e:f32[2] = mul d 2.0:f32[]\n"
        "  in (e,) }");
  check_jaxpr(outer);
}

TEST_CASE("eval_jaxpr argument errors") {
  auto cj = make_jaxpr([](const Array& x, const Array& y) { return x + y; })(jnp::ones({3}), jnp::ones({3}));
  std::vector<Array> one{jnp::ones({3})};
  CHECK_ERR(eval_jaxpr(cj, one), ValueError, "2 invars", "1 values");
  std::vector<Array> bad_shape{jnp::ones({3}), jnp::ones({4})};
  CHECK_ERR(eval_jaxpr(cj, bad_shape), ShapeError, "invars 1", "f32[4]", "f32[3]");
  std::vector<Array> bad_dtype{jnp::ones({3}, i32), jnp::ones({3})};
  CHECK_ERR(eval_jaxpr(cj, bad_dtype), DTypeError, "invars 0", "i32[3]", "f32[3]", "int32", "float32");
  std::vector<Array> empty{Array(), jnp::ones({3})};
  CHECK_ERR(eval_jaxpr(cj, empty), ValueError, "invars 0", "empty");
  Array c = jnp::ones({2});
  auto cc = make_jaxpr([&](const Array& x) { return x + c; })(jnp::ones({2}));
  std::vector<Array> none, arg{jnp::ones({2})};
  CHECK_ERR(eval_jaxpr(*cc, none, arg), ValueError, "1 constvars", "0 values");
  std::vector<Array> wrong_const{jnp::ones({5})};
  CHECK_ERR(eval_jaxpr(*cc, wrong_const, arg), ShapeError, "constvars 0", "f32[5]", "f32[2]");
}

TEST_CASE("check_jaxpr catches hand-broken jaxprs") {
  auto cj = make_jaxpr([](const Array& x) { return jnp::sin(x * 2.0); })(jnp::ones({3}));
  const Jaxpr& j = *cj;
  REQUIRE(j.eqns().size() == 2);

  SUBCASE("wrong output aval") {
    std::vector<JaxprEqn> eqns = j.eqns();
    Var wrong(AbstractValue{{4}, f32, false, {}});
    eqns[1].outputs[0] = wrong;
    Jaxpr broken(j.constvars(), j.invars(), eqns, {wrong});
    CHECK_ERR(check_jaxpr(broken), Error, "equation 1", "sin", "output 0 has type f32[4]", "gives f32[3]");
    Var wrong_dt(AbstractValue{{3}, i32, false, {}});
    eqns = j.eqns();
    eqns[0].outputs[0] = wrong_dt;
    eqns[1].inputs[0] = wrong_dt;
    CHECK_ERR(check_jaxpr(Jaxpr(j.constvars(), j.invars(), eqns, j.outvars())), Error, "equation 0", "mul", "i32[3]",
              "gives f32[3]");
  }
  SUBCASE("use before define") {
    std::vector<JaxprEqn> eqns{j.eqns()[1], j.eqns()[0]};
    CHECK_ERR(check_jaxpr(Jaxpr(j.constvars(), j.invars(), eqns, j.outvars())), Error, "equation 0", "sin", "input 0",
              "used before it is defined");
  }
  SUBCASE("defined twice") {
    std::vector<JaxprEqn> eqns{j.eqns()[0], j.eqns()[0], j.eqns()[1]};
    CHECK_ERR(check_jaxpr(Jaxpr(j.constvars(), j.invars(), eqns, j.outvars())), Error, "equation 1", "mul",
              "redefines");
  }
  SUBCASE("undefined outvar") {
    Var stray(AbstractValue{{3}, f32, false, {}});
    CHECK_ERR(check_jaxpr(Jaxpr(j.constvars(), j.invars(), j.eqns(), {stray})), Error, "outvar 0", "not defined");
  }
  SUBCASE("abstract_eval rejects the inputs") {
    std::vector<JaxprEqn> eqns = j.eqns();
    Var i(AbstractValue{{2}, f32, false, {}});
    eqns[0].inputs[1] = i;  // mul f32[3] f32[2]: lax does not broadcast
    CHECK_ERR(check_jaxpr(Jaxpr(j.constvars(), {j.invars()[0], i}, eqns, j.outvars())), Error, "equation 0", "mul",
              "abstract evaluation", "(3,) and (2,)");
  }
  SUBCASE("sub-jaxprs in JaxprParam params are checked") {
    std::vector<JaxprEqn> inner_eqns{j.eqns()[1], j.eqns()[0]};
    auto inner = std::make_shared<const Jaxpr>(j.constvars(), j.invars(), inner_eqns, j.outvars());
    std::vector<JaxprEqn> eqns = j.eqns();
    eqns[1].params.set("jaxpr", std::shared_ptr<const ParamObject>(std::make_shared<JaxprParam>(inner)));
    CHECK_ERR(check_jaxpr(Jaxpr(j.constvars(), j.invars(), eqns, j.outvars())), Error, "param jaxpr",
              "used before it is defined");
  }
  // And eval_jaxpr on a use-before-define jaxpr raises instead of crashing.
  std::vector<JaxprEqn> eqns{j.eqns()[1], j.eqns()[0]};
  std::vector<Array> x{jnp::ones({3})};
  CHECK_ERR(eval_jaxpr(Jaxpr(j.constvars(), j.invars(), eqns, j.outvars()), {}, x), Error, "sin", "not defined");
}
