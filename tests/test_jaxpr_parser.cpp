// parse_jaxpr: the inverse of the jaxpr printer. Every program whose golden text test_jaxpr.cpp and
// test_eval_jaxpr.cpp check is traced again here and its text parsed back: the parsed jaxpr prints
// the same text, passes check_jaxpr and evaluates to the same values.
#include <doctest/doctest.h>
#include <fmt/format.h>

#include <cmath>

#include "cjax/cjax.h"
#include "core/array/array_impl.h"
#include "core/lax/gather_scatter.h"
#include "test_util.h"
#include "trace/eval_jaxpr.h"
#include "trace/jaxpr.h"
#include "trace/jaxpr_parser.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {

// text(parse(text(cj))) == text(cj), and the parsed jaxpr type-checks.
std::shared_ptr<const Jaxpr> check_round_trip(const ClosedJaxpr& cj) {
  std::string t = text(cj);
  auto parsed = parse_jaxpr(t);
  CHECK(parsed->pretty_print() == t);
  check_jaxpr(*parsed);
  return parsed;
}

// For `f` of flat Array arguments: the parsed jaxpr (with the traced consts) evaluates to what the
// traced jaxpr evaluates to, and both to f's eager values.
template <class F, class... A>
void check_same_values(F f, const A&... args) {
  ClosedJaxpr cj = make_jaxpr(f)(args...);
  check_round_trip(cj);
  ClosedJaxpr parsed = parse_closed_jaxpr(text(cj), cj.consts);
  std::vector<Array> flat{args...};
  std::vector<Array> want = eval_jaxpr(cj, flat), got = eval_jaxpr(parsed, flat);
  std::vector<Array> eager = tree::leaves(f(args...));
  REQUIRE(got.size() == want.size());
  REQUIRE(eager.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i].shape() == want[i].shape());
    CHECK(got[i].dtype() == want[i].dtype());
    CHECK(vals(got[i]) == vals(want[i]));
    CHECK(vals(got[i]) == vals(eager[i]));
  }
}

// A call-like primitive holding a sub-jaxpr, registered by this test only.
const PrimitiveDef& parser_test_call() {
  static const PrimitiveDef& def =
      register_primitive(PrimitiveDef{"parser_test_call",
                                      PrimKind::HigherOrder,
                                      Arity::any(),
                                      [](std::span<const Array>, const Params& p) {
                                        return p.object<JaxprParam>("jaxpr")->jaxpr->out_avals();
                                      },
                                      [](std::span<const Array> in, std::span<const AbstractValue>, const Params& p) {
                                        return eval_jaxpr(*p.object<JaxprParam>("jaxpr")->jaxpr, {}, in);
                                      },
                                      std::nullopt,
                                      {}});
  return def;
}
Array call(const Array& x, std::shared_ptr<const Jaxpr> j, const char* name = nullptr) {
  Params p{{"jaxpr", std::shared_ptr<const ParamObject>(std::make_shared<JaxprParam>(std::move(j)))}};
  if (name) p.set("name", std::string(name));
  return bind1(parser_test_call(), {x}, p);
}

}  // namespace

TEST_CASE("golden texts of test_jaxpr round-trip") {
  auto chain = make_jaxpr([](const Array& x) { return x * 2.0 + 1; })(jnp::ones({3}));
  CHECK(text(chain) ==
        "{ lambda ; a:f32[3]. let\n"
        "    b:f32[3] = mul a 2.0:f32[]\n"
        "    c:f32[3] = add b 1.0:f32[]\n"
        "  in (c,) }");
  auto parsed = check_round_trip(chain);
  REQUIRE(parsed->eqns().size() == 2);
  CHECK(parsed->eqns()[0].primitive->name == "mul");
  CHECK(std::get<Literal>(parsed->eqns()[0].inputs[1]).value().item<double>() == 2.0);
  CHECK(std::get<Var>(parsed->eqns()[1].inputs[0]) == parsed->eqns()[0].outputs[0]);
  CHECK(std::get<Var>(parsed->outvars()[0]) == parsed->eqns()[1].outputs[0]);

  check_round_trip(make_jaxpr([](const Array& x) { return jnp::sin(x); })(jnp::ones({3})));
  check_round_trip(make_jaxpr([](const Array& x) { return x + 2; })(jnp::arange(4)));
  check_round_trip(make_jaxpr([](const Array& x) { return x * 0.1; })(jnp::ones({2}, f64)));
  check_round_trip(make_jaxpr([](const Array& a, const Array& b) { return jnp::matmul(a, b); })(jnp::ones({8, 16}),
                                                                                                jnp::ones({16, 4})));
  check_round_trip(make_jaxpr([](const Array& x) { return jnp::sum(x); })(jnp::ones({2, 3})));
  check_round_trip(make_jaxpr([](const Array& x) { return jnp::sum(x, 0); })(
      make_abstract(AbstractValue{{1234, 1000, 100}, f32, false, {}})));
  check_round_trip(make_jaxpr([](const Array& a, const Array& b) {
    return a + jnp::broadcast_to(b, {2, 3});
  })(jnp::ones({2, 3}), jnp::ones({3})));
  Array c = jnp::array<float>({1, 2, 3});
  check_round_trip(make_jaxpr([&](const Array& x) { return x + c; })(jnp::ones({3})));
  check_round_trip(make_jaxpr([&](const Array& x) { return x * c + c; })(jnp::ones({3})));
  Array s = make_scalar(3.0, f32);
  check_round_trip(make_jaxpr([&](const Array& x) { return x - s; })(jnp::ones({3})));
  check_round_trip(make_jaxpr([&](const Array& x) { return x * jnp::sum(c); })(jnp::ones({3})));
  // Weak-typed input: the text does not show weak types; the parsed jaxpr is consistently strong.
  auto weak = make_jaxpr([](const Array& x) { return x * 0.1; })(Array(2.0f));
  check_round_trip(weak);
  CHECK_FALSE(parse_jaxpr(text(weak))->invars()[0].aval().weak_type);
  Dict params{{"w", jnp::ones({4, 2})}, {"b", jnp::ones({3, 2})}};
  auto tree_fn = [](const Dict& p, const std::pair<Array, Array>& xy) {
    Dict out;
    out["y"] = jnp::matmul(xy.first, p["w"]) + p["b"].array();
    out["n"] = jnp::sum(xy.second);
    return out;
  };
  check_round_trip(make_jaxpr(tree_fn)(params, std::pair{jnp::ones({3, 4}), jnp::ones({5})}));
  auto g = [](const std::vector<Array>& xs, int k) {
    std::vector<Array> out;
    for (const Array& x : xs) out.push_back(x * k);
    return out;
  };
  check_round_trip(make_jaxpr(g)(std::vector<Array>{jnp::ones({2}), jnp::ones({2})}, 3));
  check_round_trip(make_jaxpr([](const Array& x, const Array& y) {
    return std::tuple{x + y, x * y};
  })(jnp::ones({3}), jnp::ones({3})));
  auto lit_out = make_jaxpr([](const Array& x) {
    return std::vector<Array>{x, x, make_scalar(2.0, f32)};
  })(jnp::ones({3}));
  CHECK(text(lit_out) == "{ lambda ; a:f32[3]. let  in (a, a, 2.0:f32[]) }");
  auto lit_parsed = check_round_trip(lit_out);
  CHECK(lit_parsed->eqns().empty());
  CHECK(std::get<Var>(lit_parsed->outvars()[0]) == std::get<Var>(lit_parsed->outvars()[1]));
  check_round_trip(make_jaxpr([](const Array& x) { return x; })(jnp::ones({3})));
  Array c4 = jnp::ones({4});
  check_round_trip(make_jaxpr([&](const Array&) { return c4; })(jnp::ones({3})));
  // Unused outputs print as `_`: the parsed equation still has a typed output.
  auto dropped = make_jaxpr([](const Array& x) {
    (void)jnp::cos(x);
    return jnp::sin(x);
  })(jnp::ones({3}));
  CHECK(text(dropped) == "{ lambda ; a:f32[3]. let _:f32[3] = cos a; b:f32[3] = sin a in (b,) }");
  auto dparsed = check_round_trip(dropped);
  REQUIRE(dparsed->eqns()[0].outputs.size() == 1);
  CHECK(dparsed->eqns()[0].outputs[0].aval().str() == "f32[3]");
  // Names past z.
  auto long_fn = [](const Array& a) {
    Array y = a;
    for (int i = 0; i < 14; ++i) y = jnp::sin(y) * y;
    return y;
  };
  check_round_trip(make_jaxpr(long_fn)(jnp::ones({2})));
}

TEST_CASE("golden texts of test_eval_jaxpr round-trip and evaluate to the same values") {
  check_same_values([](const Array& x) { return jnp::sin(x * 2.0 + 1) - x; }, jnp::array<float>({0, 1, -2.5f}));
  check_same_values([](const Array& x) { return x * 3 - 1; }, jnp::arange(4));
  auto mm = [](const Array& a, const Array& b) { return jnp::matmul(a, b); };
  check_same_values(mm, seq({3, 4}, 7, 3), seq({4, 2}, 5, 2));
  check_same_values(mm, seq({2, 3}, 4, 1, f64), seq({3, 5}, 6, 2, f64));
  check_same_values([](const Array& x) { return jnp::sum(x, 0); }, seq({4, 3}, 5, 2));
  check_same_values([](const Array& x) { return jnp::max(x); }, seq({2, 3, 2}, 7, 3, i32));
  check_same_values([](const Array& x) { return jnp::mean(x, -1); }, seq({2, 5}, 9, 4));
  check_same_values(
      [](const Array& x, const Array& y) {
        return x.reshape({3, 1}) + y;
      },
      seq({3}, 3, 1), seq({4}, 4, 0));
  check_same_values([](const Array& x) { return jnp::broadcast_to(x, {2, 3}); }, seq({3}, 5, 2));
  check_same_values(
      [](const Array& x, const Array& y) {
        return std::tuple{x + y, x * y};
      },
      seq({3}, 4, 1), seq({3}, 3, 0));
  check_same_values([](const Array& x) { return std::vector<Array>{x, x, make_scalar(2.0, f32)}; }, seq({2}, 3, 1));
  Array c = jnp::ones({4});
  check_same_values([&](const Array& x) { return std::vector<Array>{c, x}; }, seq({3}, 3, 1));
  auto inner = make_jaxpr([](const Array& x) { return jnp::exp(x) * 2.0; })(jnp::ones({2}));
  auto outer = make_jaxpr([&](const Array& x) {
    std::vector<Array> a{x};
    std::vector<Array> b{eval_jaxpr(inner, a)[0]};
    return eval_jaxpr(inner, b)[0];
  })(jnp::ones({2}));
  check_round_trip(outer);
}

TEST_CASE("a jaxpr with constvars: parse_closed_jaxpr takes the consts") {
  Array c = jnp::array<float>({1, 2, 3});
  auto f = [&](const Array& x) { return x * c + c; };
  check_same_values(f, jnp::array<float>({2, -1, 0.5f}));
  std::string t = "{ lambda a:f32[3]; b:f32[3]. let c:f32[3] = mul b a; d:f32[3] = add c a in (d,) }";
  ClosedJaxpr cj = parse_closed_jaxpr(t, {jnp::array<float>({10, 20, 30})});
  CHECK(text(cj) == t);
  std::vector<Array> args{jnp::array<float>({1, 2, 3})};
  CHECK(vals(eval_jaxpr(cj, args)[0]) == std::vector<double>{20, 60, 120});
  CHECK_ERR(parse_closed_jaxpr(t, {}), ValueError, "1 constvars", "0 consts");
  CHECK_ERR(parse_closed_jaxpr(t, {jnp::ones({4})}), ValueError, "const 0", "f32[4]", "f32[3]");
  CHECK_ERR(parse_closed_jaxpr(t, {jnp::ones({3}, i32)}), ValueError, "const 0", "i32[3]", "f32[3]");
  CHECK_ERR(parse_closed_jaxpr(t, {Array()}), ValueError, "const 0", "empty");
}

TEST_CASE("structured params: dot_general, conv, gather, scatter, reductions, sort, top_k") {
  // dot_general with batch dimensions.
  check_same_values([](const Array& a, const Array& b) { return jnp::matmul(a, b); }, seq({2, 3, 4}, 7, 3),
                    seq({2, 4, 5}, 5, 2));
  // Gather via integer-array indexing and via take.
  Array idx = jnp::array<int32_t>({2, 0, 1, 2});
  auto gather_fn = [&](const Array& x) { return x[idx]; };
  auto gj = make_jaxpr(gather_fn)(seq({3, 4}, 11, 5));
  CHECK(text(gj).find("gather[") != std::string::npos);
  CHECK(text(gj).find("GatherDimensionNumbers(") != std::string::npos);
  check_same_values(gather_fn, seq({3, 4}, 11, 5));
  check_same_values([](const Array& x, const Array& i) { return jnp::take(x, i, 1); }, seq({3, 4}, 11, 5),
                    jnp::array<int32_t>({3, 0}));
  auto parsed_gather = parse_jaxpr(text(gj));
  bool saw_mode = false;
  for (const JaxprEqn& e : parsed_gather->eqns())
    if (e.primitive->name == "gather") {
      CHECK(e.params.object<GatherDimensionNumbersParam>("dimension_numbers") != nullptr);
      CHECK(e.params.object<GatherScatterModeParam>("mode") != nullptr);
      saw_mode = true;
    }
  CHECK(saw_mode);
  // Scatter via .at[].add and .at[].set.
  auto scatter_add = [&](const Array& x, const Array& u) { return x.at(idx).add(u); };
  auto sj = make_jaxpr(scatter_add)(seq({3, 4}, 7, 3), seq({4, 4}, 5, 2));
  CHECK(text(sj).find("scatter-add[") != std::string::npos);
  check_same_values(scatter_add, seq({3, 4}, 7, 3), seq({4, 4}, 5, 2));
  check_same_values([](const Array& x, const Array& u) { return x.at(1).set(u); }, seq({3, 4}, 7, 3), seq({4}, 5, 2));
  // Convolutions: NCHW default and a permuted layout with explicit padding.
  check_same_values(
      [](const Array& x, const Array& w) {
        return lax::conv_general_dilated(x, w, {1, 1}, "SAME");
      },
      seq({1, 2, 5, 5}, 7, 3), seq({3, 2, 3, 3}, 5, 2));
  check_same_values(
      [](const Array& x, const Array& w) {
        return lax::conv_general_dilated(x, w, {2}, std::vector<std::pair<int64_t, int64_t>>{{1, 2}}, {}, {2},
                                         lax::ConvDimensionNumbers{"NWC", "WIO", "NWC"});
      },
      seq({2, 9, 3}, 7, 3), seq({2, 3, 4}, 5, 2));
  // Reductions, cumulative sums, sort, argsort, top_k, pad.
  check_same_values(
      [](const Array& x) {
        return std::tuple{jnp::max(x, 1), jnp::min(x, 0), jnp::prod(x, 1)};
      },
      seq({3, 4}, 5, 2));
  check_same_values([](const Array& x) { return jnp::cumsum(x, 1); }, seq({3, 4}, 5, 2));
  check_same_values([](const Array& x) { return std::tuple{jnp::sort(x), jnp::argsort(x)}; }, seq({2, 5}, 7, 3));
  check_same_values(
      [](const Array& x) {
        auto [v, i] = lax::top_k(x, 2);
        return std::tuple{v, i};
      },
      seq({3, 5}, 7, 3));
  check_same_values([](const Array& x) { return lax::pad(x, Array(0.5f), {{1, 2, 1}}); }, seq({3}, 7, 3));
  check_same_values([](const Array& x) { return jnp::argmax(x, 1); }, seq({3, 5}, 7, 3));
}

TEST_CASE("sub-jaxprs: inline, hoisted with let, named, and in fresh scopes") {
  auto body = make_jaxpr([](const Array& x) { return jnp::sin(x); })(jnp::ones({3}));
  auto once = make_jaxpr([&](const Array& x) { return call(x, body.jaxpr); })(jnp::ones({3}));
  CHECK(text(once) ==
        "{ lambda ; a:f32[3]. let\n"
        "    b:f32[3] = parser_test_call[\n"
        "      jaxpr={ lambda ; c:f32[3]. let d:f32[3] = sin c in (d,) }\n"
        "    ] a\n"
        "  in (b,) }");
  auto p1 = check_round_trip(once);
  auto sub = p1->eqns()[0].params.object<JaxprParam>("jaxpr")->jaxpr;
  CHECK(sub->invars()[0].aval().str() == "f32[3]");
  CHECK_FALSE(sub->invars()[0] == p1->invars()[0]);
  check_same_values([&](const Array& x) { return call(x, body.jaxpr); }, seq({3}, 5, 2));

  auto twice = make_jaxpr([&](const Array& x) { return call(call(x, body.jaxpr), body.jaxpr); })(jnp::ones({3}));
  CHECK(text(twice) ==
        "let jaxpr = { lambda ; a:f32[3]. let b:f32[3] = sin a in (b,) } in\n"
        "{ lambda ; c:f32[3]. let\n"
        "    d:f32[3] = parser_test_call[jaxpr=jaxpr] c\n"
        "    e:f32[3] = parser_test_call[jaxpr=jaxpr] d\n"
        "  in (e,) }");
  auto p2 = check_round_trip(twice);
  CHECK(p2->eqns()[0].params.object<JaxprParam>("jaxpr")->jaxpr ==
        p2->eqns()[1].params.object<JaxprParam>("jaxpr")->jaxpr);
  check_same_values([&](const Array& x) { return call(call(x, body.jaxpr), body.jaxpr); }, seq({3}, 5, 2));

  // Named calls hoist under their name (`name=f` stays text); a hoisted jaxpr refers to another.
  auto named = make_jaxpr([&](const Array& x) { return call(x, body.jaxpr, "<f>"); })(jnp::ones({3}));
  auto inner2 =
      make_jaxpr([&](const Array& x) { return call(call(x, named.jaxpr, "g"), named.jaxpr, "g"); })(jnp::ones({3}));
  auto nested =
      make_jaxpr([&](const Array& x) { return call(call(x, inner2.jaxpr, "h"), inner2.jaxpr, "h"); })(jnp::ones({3}));
  std::string nt = text(nested);
  CHECK(nt.find("let h = ") == 0);
  CHECK(nt.find("let g = ") != std::string::npos);
  auto p3 = check_round_trip(nested);
  CHECK(std::get<std::string>(p3->eqns()[0].params.at("name")) == "h");
  check_same_values([&](const Array& x) { return call(call(x, inner2.jaxpr, "h"), inner2.jaxpr, "h"); },
                    seq({3}, 5, 2));

  // A sub-jaxpr with more than 10 equations is hoisted even when used once.
  auto big = make_jaxpr([](const Array& x) {
    Array y = x;
    for (int i = 0; i < 11; ++i) y = y * 2.0;
    return y;
  })(jnp::ones({2}));
  auto big_call = make_jaxpr([&](const Array& x) { return call(x, big.jaxpr); })(jnp::ones({2}));
  CHECK(text(big_call).find("let jaxpr = ") == 0);
  check_round_trip(big_call);

  // Hand-written: a sub-jaxpr cannot see its enclosing jaxpr's variables.
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3]. let\n"
                        "    b:f32[3] = parser_test_call[jaxpr={ lambda ; c:f32[3]. let d:f32[3] = sin a in (d,) }] a\n"
                        "  in (b,) }"),
            ValueError, "line 2", "undefined variable 'a'");
}

TEST_CASE("literals of every printed kind") {
  struct Case {
    std::string literal;
    DType dtype;
    double value;
  };
  const Case cases[] = {
      {"2.0:f32[]", f32, 2.0},
      {"0.10000000149011612:f32[]", f32, double(0.1f)},
      {"1e-05:f64[]", f64, 1e-5},
      {"-2.5:f64[]", f64, -2.5},
      {"-0.0:f32[]", f32, -0.0},
      {"3.4028234663852886e+38:f32[]", f32, 3.4028234663852886e38},
      {"inf:f32[]", f32, kInf},
      {"-inf:f32[]", f32, -kInf},
      {"1.5:bf16[]", bf16, 1.5},
      {"0.333251953125:f16[]", f16, 0.333251953125},
      {"3:i32[]", i32, 3},
      {"-7:i32[]", i32, -7},
      {"-128:i8[]", i8, -128},
      {"255:u8[]", u8, 255},
      {"4294967295:u32[]", u32, 4294967295.0},
      {"True:bool[]", bool_, 1},
      {"False:bool[]", bool_, 0},
  };
  for (const Case& c : cases) {
    CAPTURE(c.literal);
    std::string t =
        fmt::format("{{ lambda ; a:{0}[]. let b:{0}[] = max a {1} in (b,) }}", dtype_short_name(c.dtype), c.literal);
    if (c.dtype == bool_) t = fmt::format("{{ lambda ; a:bool[]. let b:bool[] = and a {} in (b,) }}", c.literal);
    auto j = parse_jaxpr(t);
    CHECK(j->pretty_print() == t);
    check_jaxpr(*j);
    const Literal& l = std::get<Literal>(j->eqns()[0].inputs[1]);
    CHECK(l.aval().dtype == c.dtype);
    CHECK(l.value().item<double>() == c.value);
    CHECK(std::signbit(l.value().item<double>()) == std::signbit(c.value));
  }
  // nan, as an input and as an output; an i64 beyond 2^53 is exact.
  auto n = parse_jaxpr("{ lambda ; a:f32[2]. let b:f32[2] = add a nan:f32[] in (b, nan:f32[]) }");
  CHECK(std::isnan(std::get<Literal>(n->eqns()[0].inputs[1]).value().item<double>()));
  CHECK(std::isnan(std::get<Literal>(n->outvars()[1]).value().item<double>()));
  CHECK(n->pretty_print() == "{ lambda ; a:f32[2]. let b:f32[2] = add a nan:f32[] in (b, nan:f32[]) }");
  std::string big = "{ lambda ; a:i64[]. let b:i64[] = add a 9007199254740993:i64[] in (b,) }";
  auto bj = parse_jaxpr(big);
  CHECK(bj->pretty_print() == big);
  CHECK(std::get<Literal>(bj->eqns()[0].inputs[1]).value().item<int64_t>() == 9007199254740993LL);
  // Traced literals round-trip: Python-like weak scalars and inf from the program.
  check_round_trip(make_jaxpr([](const Array& x) { return jnp::maximum(x, -kInf) * 1e-5; })(jnp::ones({3})));
  check_round_trip(make_jaxpr([](const Array& x) { return jnp::where(x > 0, x, 0.0); })(jnp::ones({3})));
  // Base-26 names reach `in`, `inf` and `nan`: a variable `nan` is told apart from a nan literal, a
  // variable `in` from the keyword.
  auto in_var = parse_jaxpr("{ lambda ; in:f32[]. let b:f32[] = neg in in (b, in) }");
  CHECK(std::get<Var>(in_var->eqns()[0].inputs[0]) == in_var->invars()[0]);
  CHECK(std::get<Var>(in_var->outvars()[1]) == in_var->invars()[0]);
  auto nb = parse_jaxpr("{ lambda ; a:f32[]. let nan:f32[] = neg a; b:f32[] = add nan inf:f32[] in (b,) }");
  REQUIRE(nb->eqns().size() == 2);
  CHECK(std::holds_alternative<Var>(nb->eqns()[1].inputs[0]));
  CHECK(std::holds_alternative<Literal>(nb->eqns()[1].inputs[1]));
}

TEST_CASE("types: every dtype, rank 0 to 3, varying axes") {
  for (DType d : kAllDTypes) {
    std::string t = fmt::format("{{ lambda ; a:{0}[] b:{0}[2] c:{0}[2,3,4]. let  in (c, b, a) }}", dtype_short_name(d));
    auto j = parse_jaxpr(t);
    CHECK(j->pretty_print() == t);
    CHECK(j->invars()[2].aval().shape == Shape{2, 3, 4});
    CHECK(j->invars()[0].aval().dtype == d);
  }
  auto v = parse_jaxpr("{ lambda ; a:f32[2,8]{V:x,y} b:f32[8]{V:y}. let  in (a, b) }");
  CHECK(v->invars()[0].aval().vma == std::vector<std::string>{"x", "y"});
  CHECK(v->invars()[1].aval().vma == std::vector<std::string>{"y"});
  CHECK(v->pretty_print() == "{ lambda ; a:f32[2,8]{V:x,y} b:f32[8]{V:y}. let  in (a, b) }");
  auto none = parse_jaxpr("{ lambda ; . let  in () }");
  CHECK(none->invars().empty());
  CHECK(none->outvars().empty());
  CHECK(none->pretty_print() == "{ lambda ; . let  in () }");
}

TEST_CASE("generic param values by their text") {
  auto j = parse_jaxpr(
      "{ lambda ; a:f32[2,3]. let\n"
      "    b:f32[3,2] = transpose[permutation=(1, 0)] a\n"
      "    c:i32[3,2] = convert_element_type[new_dtype=int32 weak_type=False] b\n"
      "    d:f32[6] = reshape[dimensions=None new_sizes=(6,) sharding=None] a\n"
      "    e:f32[] = reduce_sum[axes=(0,)] d\n"
      "  in (c, e) }");
  check_jaxpr(*j);
  const auto& e = j->eqns();
  CHECK(e[0].params.ints("permutation") == std::vector<int64_t>{1, 0});
  CHECK(e[1].params.get<DType>("new_dtype") == i32);
  CHECK(e[1].params.get<bool>("weak_type") == false);
  CHECK(std::holds_alternative<std::monostate>(e[2].params.at("dimensions")));
  CHECK(e[2].params.ints("new_sizes") == std::vector<int64_t>{6});
  std::vector<Array> in{seq({2, 3}, 6, 0)};
  auto out = eval_jaxpr(*j, {}, in);
  CHECK(vals(out[0]) == std::vector<double>{0, 3, 1, 4, 2, 5});
  CHECK(vals(out[1]) == std::vector<double>{15});
  // Nested int tuples, integers, unknown text kept as strings.
  auto pad = parse_jaxpr("{ lambda ; a:f32[3]. let b:f32[6] = pad[padding_config=((1, 2, 0),)] a 0.0:f32[] in (b,) }");
  CHECK(pad->eqns()[0].params.get<std::vector<std::vector<int64_t>>>("padding_config") ==
        std::vector<std::vector<int64_t>>{{1, 2, 0}});
  check_jaxpr(*pad);
  auto ip = parse_jaxpr("{ lambda ; a:f32[3]. let b:f32[3] = integer_pow[y=-2] a in (b,) }");
  CHECK(ip->eqns()[0].params.i("y") == -2);
}

TEST_CASE("malformed texts name the line, the column and what was expected") {
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3]. let\n    b:f32[3] = sin a\n    c f32[3] = cos b\n  in (c,) }"),
            ValueError, "line 3, column 7", "expected ':' after variable 'c'");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3] b. let  in (a,) }"), ValueError, "line 1, column 22",
            "expected ':' after variable 'b'");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3]. let b:f32[3] = frobnicate a in (b,) }"), ValueError, "column 37",
            "unknown primitive 'frobnicate'");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3]. let b:f32[3] = add a q in (b,) }"), ValueError, "column 43",
            "undefined variable 'q'");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3]. let  in (z,) }"), ValueError, "undefined variable 'z'");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:q32[3]. let  in (a,) }"), ValueError, "column 14", "expected a type like f32[3]",
            "'q32'");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3,x]. let  in (a,) }"), ValueError, "column 20", "a dimension size");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3]. let b:f32[3] = mul a 2.0:f32[3] in (b,) }"), ValueError, "rank-0 type",
            "f32[3]");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:i32[3]. let b:i32[3] = mul a 2.5:i32[] in (b,) }"), ValueError,
            "'2.5' is not a int32 literal");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:u8[3]. let b:u8[3] = mul a 256:u8[] in (b,) }"), ValueError,
            "'256' is not a uint8 literal");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3]. let b:f32[3] = sin a in (b,)"), ValueError,
            "expected '}' closing the jaxpr", "end of the text");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3]. let b:f32[3] = sin a }"), ValueError,
            "expected an equation or 'in (...)'");
  CHECK_ERR(parse_jaxpr("lambda ; a:f32[3]. let  in (a,)"), ValueError, "line 1, column 1", "expected '{'");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3]. let  in (a,) } extra"), ValueError, "the end of the text", "'extra'");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3]. let b:f32[3] = sin a; b:f32[3] = cos a in (b,) }"), ValueError,
            "variable 'b' is defined twice");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3]. let b:f32[3] = reduce_sum[axes=(0,) axes=(0,)] a in (b,) }"), ValueError,
            "parameter 'axes' is given twice");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3]. let b:f32[3] = reduce_sum[axes] a in (b,) }"), ValueError,
            "'=' after parameter 'axes'");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3]. let b:f32[3] = reduce_sum[axes=(0,] a in (b,) }"), ValueError,
            "unbalanced brackets");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[2,3] b:f32[3,4]. let\n"
                        "    c:f32[2,4] = dot_general[\n"
                        "      dimension_numbers=((1, 0), ([], []))\n"
                        "      preferred_element_type=float32\n"
                        "    ] a b\n"
                        "  in (c,) }"),
            ValueError, "line 3, column 25", "dot_general's dimension_numbers like (([1], [0]), ([], []))");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3] b:i32[1,1]. let\n"
                        "    c:f32[1] = gather[mode=GatherScatterMode.SOMETIMES] a b\n"
                        "  in (c,) }"),
            ValueError, "line 2", "gather's mode like GatherScatterMode.FILL_OR_DROP");
  CHECK_ERR(parse_jaxpr(
                "let j = { lambda ; a:f32[3]. let b:f32[3] = sin a in (b,) \n{ lambda ; c:f32[3]. let  in (c,) }"),
            ValueError, "line 1, column 9", "no matching '}'");
  CHECK_ERR(parse_jaxpr("let j = { lambda ; a:f32[3]. let  in (a,) } in\n"
                        "let j = { lambda ; a:f32[3]. let  in (a,) } in\n"
                        "{ lambda ; c:f32[3]. let  in (c,) }"),
            ValueError, "line 2, column 5", "'j' is defined twice");
  // A malformed hoisted jaxpr is reported where it is, even when nothing references it.
  CHECK_ERR(parse_jaxpr("let j = { lambda ; a:f32[3]. let b = sin a in (b,) } in\n{ lambda ; c:f32[3]. let  in (c,) }"),
            ValueError, "line 1, column 36", "expected ':' after variable 'b'", "found '='");
}

// Every primitive's operand count is checked in one place (register_primitive) before its
// abstract_eval runs, so an equation with too few (or too many) operands is an error, never a read
// past the operand list.
TEST_CASE("an equation with the wrong number of operands is an error for every primitive") {
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3]. let b:f32[3] = stop_gradient in (b,) }"), ValueError, "line 1, column 37",
            "stop_gradient takes 1 operand, got 0");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3]. let b:f32[3] = add_any a in (b,) }"), ValueError,
            "add_any takes 2 operands, got 1");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3]. let b:f32[3] = sin a a in (b,) }"), ValueError,
            "sin takes 1 operand, got 2");
  CHECK_ERR(parse_jaxpr("{ lambda ; a:f32[3]. let b:f32[3] = select_n a in (b,) }"), ValueError,
            "select_n takes at least 2 operands, got 1");
  size_t checked = 0;
  for (const PrimitiveDef* def : all_primitives()) {
    CAPTURE(def->name);
    REQUIRE(def->arity.has_value());
    const Arity& arity = *def->arity;
    Array a = jnp::zeros({3}, f32);
    // Direct: infer_avals with one operand too few and one too many.
    if (arity.min > 0) {
      std::vector<Array> few(arity.min - 1, a);
      CHECK_THROWS_AS(infer_avals(*def, few, Params{}), ValueError);
    }
    if (arity.max != Arity::kUnbounded) {
      std::vector<Array> many(arity.max + 1, a);
      CHECK_THROWS_AS(infer_avals(*def, many, Params{}), ValueError);
    }
    // Through the parser: an equation without operands (and without params).
    std::string text = fmt::format("{{ lambda ; a:f32[3]. let b:f32[3] = {} in (b,) }}", def->name);
    if (arity.min > 0) {
      CHECK_THROWS_AS(parse_jaxpr(text), ValueError);
      ++checked;
    }
  }
  CHECK(checked > 60);
}
