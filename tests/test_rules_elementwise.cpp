// Autodiff and batching rules of the elementwise primitives (autodiff/rules_elementwise.cpp):
// numerical gradient checks for every differentiable primitive (with rank-0 operands next to
// full ones, so transposes unbroadcast), closed-form gradients, zero-derivative ops under grad,
// vmap against per-example results for every primitive, and staged gradients in JAX's text.
#include <doctest/doctest.h>

#include <cmath>
#include <numbers>
#include <optional>

#include "autodiff/check_grads.h"
#include "cjax/cjax.h"
#include "core/array/primitive.h"
#include "core/backend/scalar_ops.h"
#include "test_util.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {

using VecFn = std::function<std::vector<Array>(const std::vector<Array>&)>;
using OneFn = std::function<Array(const std::vector<Array>&)>;

VecFn wrap(OneFn f) {
  return [f = std::move(f)](const std::vector<Array>& a) { return std::vector<Array>{f(a)}; };
}
OneFn unary(Array (*op)(const Array&)) {
  return [op](const std::vector<Array>& a) { return op(a[0]); };
}
OneFn binary(Array (*op)(const Array&, const Array&)) {
  return [op](const std::vector<Array>& a) { return op(a[0], a[1]); };
}
Array d(std::vector<double> v) { return arr<double>(v); }
Array d0(double v) { return make_scalar(v, f64); }

struct GradCase {
  std::string name;
  OneFn f;
  std::vector<Array> args;
  int order = 2;
};

void run_grad_cases(const std::vector<GradCase>& cases, CheckGradsOptions opts = {}) {
  for (const GradCase& c : cases) {
    CAPTURE(c.name);
    opts.order = c.order;
    CHECK_NOTHROW(check_grads(wrap(c.f), c.args, opts));
  }
}

}  // namespace

TEST_CASE("check_grads: unary primitives, f64, order 2") {
  Array any = d({-1.3, -0.4, 0.35, 1.1, 2.2});            // no kinks needed
  Array pos = d({0.3, 0.9, 1.7, 3.1, 6.4});               // log / sqrt / rsqrt domains
  Array unit = d({-0.8, -0.35, 0.1, 0.45, 0.85});         // asin / acos / atanh / erf_inv domains
  Array big = d({1.3, 2.0, 3.5, 7.0, 11.0});              // acosh domain
  Array gam = d({-2.4, -0.6, 0.3, 1.0, 2.5, 7.2, 13.1});  // lgamma: reflection, recurrence, series
  std::vector<GradCase> cases = {
      {"neg", unary(lax::neg), {any}},           {"abs", unary(lax::abs), {any}},
      {"exp", unary(lax::exp), {any}},           {"exp2", unary(lax::exp2), {any}},
      {"log", unary(lax::log), {pos}},           {"log1p", unary(lax::log1p), {unit}},
      {"expm1", unary(lax::expm1), {any}},       {"tanh", unary(lax::tanh), {any}},
      {"logistic", unary(lax::logistic), {any}}, {"sin", unary(lax::sin), {any}},
      {"cos", unary(lax::cos), {any}},           {"tan", unary(lax::tan), {unit}},
      {"asin", unary(lax::asin), {unit}},        {"acos", unary(lax::acos), {unit}},
      {"atan", unary(lax::atan), {any}},         {"sinh", unary(lax::sinh), {any}},
      {"cosh", unary(lax::cosh), {any}},         {"asinh", unary(lax::asinh), {any}},
      {"acosh", unary(lax::acosh), {big}},       {"atanh", unary(lax::atanh), {unit}},
      {"sqrt", unary(lax::sqrt), {pos}},         {"rsqrt", unary(lax::rsqrt), {pos}},
      {"cbrt", unary(lax::cbrt), {any}},         {"erf", unary(lax::erf), {any}},
      {"erfc", unary(lax::erfc), {any}},         {"erf_inv", unary(lax::erf_inv), {unit}},
      {"lgamma", unary(lax::lgamma), {gam}},     {"square", unary(lax::square), {any}},
  };
  for (int y : {0, 1, 2, 3, -2, 5})
    cases.push_back({"integer_pow", [y](const std::vector<Array>& a) { return lax::integer_pow(a[0], y); }, {pos}});
  run_grad_cases(cases);
}

TEST_CASE("check_grads: binary and ternary primitives, full and rank-0 operands") {
  Array x = d({-1.3, -0.45, 0.35, 1.1, 2.2}), y = d({0.7, 1.9, -1.15, 0.4, -2.6});
  Array px = d({0.3, 0.9, 1.7, 3.1, 2.4}), py = d({1.5, -0.7, 0.45, 2.2, -1.3});
  Array sx = d0(0.85), sy = d0(-1.7), spx = d0(1.6);
  struct Bin {
    const char* name;
    Array (*op)(const Array&, const Array&);
    Array a, b, sa, sb;
  };
  std::vector<Bin> bins = {
      {"add", lax::add, x, y, sx, sy}, {"sub", lax::sub, x, y, sx, sy}, {"mul", lax::mul, x, y, sx, sy},
      {"div", lax::div, x, y, sx, sy}, {"rem", lax::rem, x, y, sx, sy}, {"pow", lax::pow, px, py, spx, sy},
      {"max", lax::max, x, y, sx, sy}, {"min", lax::min, x, y, sx, sy}, {"atan2", lax::atan2, x, y, sx, sy},
  };
  std::vector<GradCase> cases;
  for (const Bin& b : bins) {
    cases.push_back({b.name, binary(b.op), {b.a, b.b}});
    cases.push_back({b.name, binary(b.op), {b.sa, b.b}});  // rank-0 lhs
    cases.push_back({b.name, binary(b.op), {b.a, b.sb}});  // rank-0 rhs
    cases.push_back({b.name, binary(b.op), {b.sa, b.sb}});
  }
  // clamp: elements below, inside and above; lo/hi full or rank-0.
  Array lo = d({-1.0, -1.0, 0.0, 0.5, 3.0}), hi = d({-0.5, 1.0, 2.0, 0.9, 4.0});
  OneFn clamp = [](const std::vector<Array>& a) { return lax::clamp(a[0], a[1], a[2]); };
  cases.push_back({"clamp", clamp, {lo, x, hi}});
  cases.push_back({"clamp", clamp, {d0(-0.5), x, d0(1.5)}});
  cases.push_back({"clamp", clamp, {d0(-0.5), d0(0.3), hi}});
  cases.push_back({"clamp", clamp, {d0(2.0), d0(2.5), d0(3.0)}});
  run_grad_cases(cases);
}

TEST_CASE("check_grads: select_n, convert_element_type, compositions through zero-derivative ops") {
  Array x = d({-1.3, -0.45, 0.35, 1.1, 2.2}), y = d({0.7, 1.9, -1.15, 0.4, -2.6});
  std::vector<GradCase> cases = {
      {"select",
       [](const std::vector<Array>& a) {
         return lax::select(lax::gt(a[0], a[1]), lax::sin(a[0]), lax::mul(a[1], a[1]));
       },
       {x, y}},
      {"select_n int32 predicate",
       [](const std::vector<Array>& a) {
         Array which = arr<int32_t>({0, 2, 1, 2, 0});
         return lax::select_n(which, {lax::exp(a[0]), a[1], lax::mul(a[0], a[1])});
       },
       {x, y}},
      {"select_n scalar predicate",
       [](const std::vector<Array>& a) { return lax::select(lax::lt(a[1], d0(0.0)), lax::cos(a[0]), a[0]); },
       {x, d0(-0.3)}},
      {"floor/round/sign scale",
       [](const std::vector<Array>& a) {
         return lax::mul(lax::add(lax::add(lax::floor(a[0]), lax::ceil(a[0])),
                                  lax::add(lax::round(a[0]), lax::sign(a[0]))),
                         lax::sin(a[0]));
       },
       {x}},
  };
  run_grad_cases(cases);
  // f64 -> f32 -> f64 rounds to f32, so the numerical derivative is only good to f32 precision.
  GradCase convert = {"convert_element_type",
                      [](const std::vector<Array>& a) {
                        return lax::convert_element_type(lax::mul(lax::convert_element_type(a[0], f32),
                                                                  lax::convert_element_type(a[0], f32)),
                                                         f64);
                      },
                      {x}};
  run_grad_cases({convert}, {.eps = 1e-2, .atol = 1e-3});
}

TEST_CASE("grad values against closed forms") {
  auto g = [](auto f, double v) { return grad(f)(d0(v)).template item<double>(); };
  using A = const Array&;
  CHECK(g([](A x) { return lax::tanh(x); }, 0.4) == doctest::Approx(1 - std::pow(std::tanh(0.4), 2)));
  CHECK(g([](A x) { return lax::logistic(x); }, 0.4) ==
        doctest::Approx(std::exp(-0.4) / std::pow(1 + std::exp(-0.4), 2)));
  CHECK(g([](A x) { return lax::atan2(x, d0(2.0)); }, 0.5) == doctest::Approx(2.0 / (0.25 + 4)));
  CHECK(g([](A x) { return lax::pow(d0(3.0), x); }, 1.5) == doctest::Approx(std::log(3.0) * std::pow(3.0, 1.5)));
  // As JAX (float exponent): d/dx x^0 at 0 is 0 * 0^-1 = NaN.
  CHECK(std::isnan(g([](A x) { return lax::pow(x, d0(0.0)); }, 0.0)));
  CHECK(g([](A x) { return lax::rem(x, d0(1.5)); }, 4.0) == 1.0);
  CHECK(g([](A y) { return lax::rem(d0(4.0), y); }, 1.5) == -2.0);  // -trunc(x / y)
  CHECK(g([](A x) { return lax::erf_inv(x); }, 0.3) ==
        doctest::Approx(std::sqrt(std::numbers::pi) / 2 * std::exp(std::pow(0.2724627147267544, 2))));
  // lgamma' = digamma (series and reflection built from lax ops), lgamma'' = trigamma.
  const double euler = 0.5772156649015329, psi_half = -euler - 2 * std::log(2.0);
  auto dlg = [&](double v) { return g([](A x) { return lax::lgamma(x); }, v); };
  CHECK(dlg(1.0) == doctest::Approx(-euler).epsilon(1e-12));
  CHECK(dlg(0.5) == doctest::Approx(psi_half).epsilon(1e-12));
  CHECK(dlg(2.5) == doctest::Approx(psi_half + 2 + 2.0 / 3).epsilon(1e-12));
  CHECK(dlg(-0.5) == doctest::Approx(psi_half + 2).epsilon(1e-12));
  CHECK(dlg(30.0) == doctest::Approx(3.3844381326855246).epsilon(1e-12));
  CHECK(grad(grad([](A x) { return lax::lgamma(x); }))(d0(1.0)).item<double>() ==
        doctest::Approx(std::numbers::pi * std::numbers::pi / 6).epsilon(1e-9));
  CHECK(grad(grad([](A x) { return lax::lgamma(x); }))(d0(3.0)).item<double>() ==
        doctest::Approx(std::numbers::pi * std::numbers::pi / 6 - 1 - 0.25).epsilon(1e-9));
  // max/min split ties evenly, as JAX.
  auto gmax = grad([](A x, A y) { return lax::max(x, y); }, argnums<0, 1>);
  auto [tx, ty] = gmax(d0(2.0), d0(2.0));
  CHECK(tx.item<double>() == 0.5);
  CHECK(ty.item<double>() == 0.5);
  auto [ux, uy] = grad([](A x, A y) { return lax::min(x, y); }, argnums<0, 1>)(d0(1.0), d0(2.0));
  CHECK(ux.item<double>() == 1.0);
  CHECK(uy.item<double>() == 0.0);
  // clamp: the selected operand gets the tangent.
  auto gclamp = grad([](A lo, A x, A hi) { return lax::clamp(lo, x, hi); }, argnums<0, 1, 2>);
  auto [c0, c1, c2] = gclamp(d0(0.0), d0(2.0), d0(1.0));
  CHECK(std::vector<double>{c0.item<double>(), c1.item<double>(), c2.item<double>()} == std::vector<double>{0, 0, 1});
  auto [e0, e1, e2] = gclamp(d0(0.0), d0(0.5), d0(1.0));
  CHECK(std::vector<double>{e0.item<double>(), e1.item<double>(), e2.item<double>()} == std::vector<double>{0, 1, 0});
  // integer_pow with y == 0 has a zero derivative.
  CHECK(g([](A x) { return lax::integer_pow(x, 0); }, 3.0) == 0.0);
  CHECK(g([](A x) { return lax::integer_pow(x, -3); }, 2.0) == doctest::Approx(-3.0 / 16));
}

TEST_CASE("zero-derivative primitives work under grad and give zero") {
  using A = const Array&;
  Array x = d0(1.7);
  for (auto f :
       std::vector<std::function<Array(A)>>{[](A v) { return lax::floor(v); }, [](A v) { return lax::ceil(v); },
                                            [](A v) { return lax::round(v); }, [](A v) { return lax::sign(v); },
                                            [](A v) { return lax::nextafter(v, d0(3.0)); },
                                            [](A v) { return lax::stop_gradient(v); },
                                            [](A v) { return lax::convert_element_type(lax::is_finite(v), f64); },
                                            [](A v) { return lax::convert_element_type(lax::lt(v, d0(2.0)), f64); },
                                            [](A v) {
                                              return lax::convert_element_type(lax::convert_element_type(v, i32), f64);
                                            },
                                            [](A v) {
                                              return lax::convert_element_type(lax::bitcast_convert_type(v, i64), f64);
                                            }}) {
    CHECK(grad(f)(x).item<double>() == 0.0);
  }
  // x * floor(x): the derivative is floor(x) only.
  CHECK(grad([](A v) { return lax::mul(v, lax::floor(v)); })(x).item<double>() == 1.0);
}

TEST_CASE("vjp transposes unbroadcast rank-0 operands") {
  using A = const Array&;
  Array v = d({1.0, 2.0, 3.0}), s = d0(0.5), ct = d({1.0, -1.0, 2.0});
  auto [out, f_vjp] = vjp([](A a, A b) { return lax::sub(lax::mul(a, b), lax::div(b, a)); }, s, v);
  CHECK(vals(out) == std::vector<double>{0.5 - 2, 1 - 4, 1.5 - 6});
  auto [gs, gv] = f_vjp(ct);
  // d/ds = sum ct * (v + v / s^2), d/dv = ct * (s - 1 / s)
  CHECK(gs.shape() == Shape{});
  CHECK(gs.item<double>() == doctest::Approx((1 + 4) * 1 - (2 + 8) + (3 + 12) * 2));
  CHECK(vals(gv) == std::vector<double>{-1.5, 1.5, -3.0});
  // add / sub / select_n with a scalar predicate, rank-0 cotangents summed.
  auto [out2, g_vjp] =
      vjp([](A a, A b) { return lax::select(lax::gt(a, d0(0.0)), lax::add(b, a), lax::sub(b, a)); }, s, v);
  auto [hs, hv] = g_vjp(ct);
  CHECK(hs.item<double>() == 2.0);
  CHECK(vals(hv) == vals(ct));
  // convert_element_type transposes back to the input dtype.
  auto [out3, c_vjp] = vjp([](A a) { return lax::convert_element_type(a, f32); }, v);
  auto [cv] = c_vjp(arr<float>({1, 2, 3}));
  CHECK(cv.dtype() == f64);
  CHECK(vals(cv) == std::vector<double>{1, 2, 3});
}

// ---- vmap ----
namespace {

Array slice_at(const Array& x, std::optional<int> axis, int64_t i) {
  if (!axis) return x;
  int ax = *axis < 0 ? *axis + x.ndim() : *axis;
  return lax::squeeze(lax::slice_in_dim(x, i, i + 1, 1, ax), {ax});
}

// vmap(f)(args) with `axes` (nullopt: unbatched) equals stacking f on each example; every output
// is compared exactly (the batched op runs the same scalar kernel).
void check_vmap(const VecFn& f, const std::vector<Array>& args, const std::vector<std::optional<int>>& axes) {
  int64_t size = -1;
  std::vector<AxisSpec> specs;
  for (size_t i = 0; i < args.size(); ++i) {
    if (axes[i])
      specs.emplace_back(*axes[i]);
    else
      specs.emplace_back(None);
    if (axes[i]) size = args[i].shape()[size_t(*axes[i] < 0 ? *axes[i] + args[i].ndim() : *axes[i])];
  }
  std::vector<AxisSpec> per_argument;  // one argument (the vector), whose spec lists its leaves
  per_argument.emplace_back(specs);
  AxisSpec in_axes(per_argument);
  auto batched = vmap([&](const std::vector<Array>& a) { return f(a); }, in_axes);
  std::vector<Array> got = batched(args);
  std::vector<std::vector<Array>> per_output;
  for (int64_t b = 0; b < size; ++b) {
    std::vector<Array> ex;
    for (size_t i = 0; i < args.size(); ++i) ex.push_back(slice_at(args[i], axes[i], b));
    std::vector<Array> outs = f(ex);
    per_output.resize(outs.size());
    for (size_t k = 0; k < outs.size(); ++k) per_output[k].push_back(outs[k]);
  }
  REQUIRE(got.size() == per_output.size());
  for (size_t k = 0; k < got.size(); ++k) {
    Array want = jnp::stack(per_output[k], 0);
    CHECK(got[k].shape() == want.shape());
    CHECK(got[k].dtype() == want.dtype());
    CHECK(vals(got[k]) == vals(want));
  }
}

// Batched layouts for an op of `arity` operands whose examples have shape {3} (or {} when
// `scalar_examples`): every operand mapped at 0, at 1 / -1 on transposed data, mixed with
// unbatched full operands, with unbatched rank-0 operands and batched rank-0 examples.
// Operands from `scalar_ok` on must not be rank-0 (select_n's cases).
void check_vmap_layouts(const VecFn& f, const std::vector<Array>& pool, int arity, int scalar_ok = 4) {
  // pool[i]: a {4, 3} array for operand i (4 examples of shape {3}).
  std::vector<Array> a(pool.begin(), pool.begin() + arity);
  std::vector<std::optional<int>> all0(size_t(arity), 0), all1(size_t(arity), 1), allm1(size_t(arity), -1);
  std::vector<Array> t;
  for (const Array& x : a) t.push_back(x.T());
  {
    CAPTURE("axis 0");
    check_vmap(f, a, all0);
  }
  {
    CAPTURE("axis 1");
    check_vmap(f, t, all1);
  }
  {
    CAPTURE("axis -1");
    check_vmap(f, t, allm1);
  }
  for (int u = 0; u < arity; ++u) {
    CAPTURE(u);
    std::vector<Array> mixed = a;
    std::vector<std::optional<int>> axes = all0;
    mixed[size_t(u)] = slice_at(a[size_t(u)], 0, 1);  // unbatched {3}
    axes[size_t(u)] = std::nullopt;
    if (arity > 1) check_vmap(f, mixed, axes);
    if (u >= scalar_ok) continue;
    mixed[size_t(u)] = slice_at(mixed[size_t(u)], 0, 2);  // unbatched rank-0
    if (arity > 1) check_vmap(f, mixed, axes);
    // batched rank-0 examples (shape {4}) next to unbatched full operands
    std::vector<Array> sc;
    std::vector<std::optional<int>> sc_axes;
    for (int i = 0; i < arity; ++i) {
      sc.push_back(i == u ? slice_at(a[size_t(i)], 1, 0) : slice_at(a[size_t(i)], 0, 3));
      sc_axes.push_back(i == u ? std::optional<int>(0) : std::nullopt);
    }
    check_vmap(f, sc, sc_axes);
  }
}

Array grid(DType dt, std::vector<double> v) { return arr<double>(v, {4, 3}).astype(dt); }

}  // namespace

TEST_CASE("vmap: every scalar-op primitive, batch dims at 0 / 1 / -1, mixed and rank-0 operands") {
  Array fa = grid(f64, {-1.3, -0.4, 0.35, 1.1, 2.2, 0.6, -0.7, 0.05, 0.8, -0.25, 1.6, -0.9});
  Array fb = grid(f64, {0.7, 1.9, -1.15, 0.4, -2.6, 0.9, 1.2, -0.3, 0.55, 2.1, -0.45, 0.35});
  Array fc = grid(f64, {1.5, 2.0, 0.5, 1.8, -0.1, 1.0, 0.2, 0.6, 1.3, 0.1, 2.5, 0.0});
  Array pa = jnp::abs(fa) + 0.2, pb = fb;
  Array ia = grid(i32, {-7, 3, 0, 12, -1, 5, 9, -4, 2, 6, -8, 1});
  Array ib = grid(i32, {2, 1, 3, 0, 4, 2, 1, 5, 3, 2, 1, 4});
  Array ba = grid(bool_, {1, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 1});
  Array bb = grid(bool_, {0, 0, 1, 0, 1, 1, 1, 0, 0, 1, 1, 0});
  Array ua = grid(u32, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}), ub = grid(u32, {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 3, 5});
  struct Op {
    std::string name;
    int arity;
    std::vector<Array> pool;
  };
  auto unit = jnp::tanh(fa);
  std::vector<Op> ops;
  for (const ScalarOpInfo& info : kScalarOps) {
    std::string n(info.name);
    std::vector<Array> pool;
    if (info.domain == ScalarDomain::Int)
      pool = {ia, ib};
    else if (info.domain == ScalarDomain::Logic)
      pool = {ba, bb};
    else if (n == "log" || n == "log1p" || n == "sqrt" || n == "rsqrt" || n == "acosh" || n == "lgamma" || n == "pow")
      pool = {pa + 1.0, pb};
    else if (n == "asin" || n == "acos" || n == "atanh" || n == "erf_inv")
      pool = {unit, unit};
    else if (n == "clamp")
      pool = {fa, fb, fc};
    else
      pool = {fa, fb, fc};
    ops.push_back({n, info.arity, pool});
    if (info.domain == ScalarDomain::Num || info.domain == ScalarDomain::Any || info.domain == ScalarDomain::Cmp) {
      if (n != "div" && n != "rem")
        ops.push_back({n + " i32", info.arity, {ia, ib, ia + 1}});
      else
        ops.push_back({n + " i32", info.arity, {ia, ib + 1}});
    }
    if (info.domain == ScalarDomain::Logic) ops.push_back({n + " u32", info.arity, {ua, ub}});
  }
  for (const Op& op : ops) {
    CAPTURE(op.name);
    const PrimitiveDef* def = find_primitive(op.name.substr(0, op.name.find(' ')));
    REQUIRE(def);
    VecFn f = [def](const std::vector<Array>& a) { return cjax::bind(*def, a); };
    check_vmap_layouts(f, op.pool, op.arity);
  }
}

TEST_CASE("vmap: convert, bitcast, integer_pow, select_n, threefry2x32, stop_gradient") {
  Array fa = grid(f32, {-1.3, -0.4, 0.35, 1.1, 2.2, 0.6, -0.7, 0.05, 0.8, -0.25, 1.6, -0.9});
  Array fb = grid(f32, {0.7, 1.9, -1.15, 0.4, -2.6, 0.9, 1.2, -0.3, 0.55, 2.1, -0.45, 0.35});
  Array ia = grid(i32, {-7, 3, 0, 12, -1, 5, 9, -4, 2, 6, -8, 1});
  Array which = grid(i32, {0, 1, 2, 2, 1, 0, 0, 2, 1, 1, 0, 2});
  Array pred = grid(bool_, {1, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 1});
  Array ua = grid(u32, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}), ub = grid(u32, {9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 3, 5});
  using V = const std::vector<Array>&;
  check_vmap_layouts([](V a) { return std::vector<Array>{lax::convert_element_type(a[0], i32)}; }, {fa}, 1);
  check_vmap_layouts([](V a) { return std::vector<Array>{lax::convert_element_type(a[0], f64)}; }, {ia}, 1);
  check_vmap_layouts([](V a) { return std::vector<Array>{lax::bitcast_convert_type(a[0], u32)}; }, {fa}, 1);
  check_vmap_layouts([](V a) { return std::vector<Array>{lax::integer_pow(a[0], 3)}; }, {fa}, 1);
  check_vmap_layouts([](V a) { return std::vector<Array>{lax::integer_pow(a[0], 2)}; }, {ia}, 1);
  check_vmap_layouts([](V a) { return std::vector<Array>{lax::stop_gradient(a[0])}; }, {fa}, 1);
  check_vmap_layouts(
      [](V a) {
        return std::vector<Array>{lax::select_n(a[0], {a[1], a[2], a[3]})};
      },
      {which, fa, fb, fa * 2.0f}, 4, 1);
  check_vmap_layouts([](V a) { return std::vector<Array>{lax::select(a[0], a[1], a[2])}; }, {pred, ia, ia + 5}, 3, 1);
  check_vmap_layouts(
      [](V a) {
        auto [y0, y1] = lax::threefry2x32(a[0], a[1], a[2], a[3]);
        return std::vector<Array>{y0, y1};
      },
      {ua, ub, ub + 7u, ua * 3u}, 4);
}

TEST_CASE("vmap keeps the batch dimension in place for elementwise ops") {
  Array xs = jnp::arange(12).astype(f32).reshape({3, 4});
  auto out = make_jaxpr(vmap([](const Array& x) { return lax::sin(lax::mul(x, make_scalar(2, f32))); }, 1, 1))(xs);
  CHECK(text(out).find("transpose") == std::string::npos);
}

TEST_CASE("vmap of grad and grad of vmap agree with per-example gradients") {
  using A = const Array&;
  Array xs = d({0.3, 1.2, 2.5, -0.7});
  auto g = vmap(grad([](A x) { return lax::mul(lax::tanh(x), lax::lgamma(lax::add(x, d0(2.0)))); }));
  std::vector<double> got = vals(g(xs));
  for (size_t i = 0; i < got.size(); ++i) {
    double x = vals(xs)[i];
    double want =
        grad([](A v) { return lax::mul(lax::tanh(v), lax::lgamma(lax::add(v, d0(2.0)))); })(d0(x)).item<double>();
    CHECK(got[i] == doctest::Approx(want).epsilon(1e-12));
  }
}

TEST_CASE("make_jaxpr of grad prints JAX's primitives") {
  using A = const Array&;
  Array x = make_scalar(0.5, f32);
  CHECK(text(make_jaxpr(grad([](A v) { return lax::sin(v); }))(x)) ==
        "{ lambda ; a:f32[]. let\n"
        "    _:f32[] = sin a\n"
        "    b:f32[] = cos a\n"
        "    c:f32[] = mul 1.0:f32[] b\n"
        "  in (c,) }");
  CHECK(text(make_jaxpr(grad([](A v, A w) { return lax::mul(v, w); }))(x, make_scalar(3, f32))) ==
        "{ lambda ; a:f32[] b:f32[]. let\n"
        "    _:f32[] = mul a b\n"
        "    c:f32[] = mul 1.0:f32[] b\n"
        "  in (c,) }");
  CHECK(text(make_jaxpr(grad([](A v) { return lax::tanh(v); }))(x)) ==
        "{ lambda ; a:f32[]. let\n"
        "    b:f32[] = tanh a\n"
        "    c:f32[] = sub 1.0:f32[] b\n"
        "    d:f32[] = mul 1.0:f32[] c\n"
        "    e:f32[] = mul d b\n"
        "    f:f32[] = add_any d e\n"
        "  in (f,) }");
}
