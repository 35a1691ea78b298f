// Rules of the reduction, cumulative and sort primitives (autodiff/rules_reduce.cpp): numerical
// gradient checks, closed-form gradients, tie handling, vmap against per-example loops, and the
// staged text of a gradient.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <string>

#include "autodiff/check_grads.h"
#include "cjax/cjax.h"
#include "test_util.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {

using Fn = std::function<std::vector<Array>(const std::vector<Array>&)>;

// Distinct, irregular f64 values of `shape` (no ties), around [-3, 3] (shifted by `offset`).
Array distinct(const Shape& shape, double seed = 0.0, double offset = 0.0) {
  std::vector<double> v(size_t(shape_size(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 3 * std::sin(1.37 * double(i) + 0.41 + seed) + offset + 1e-3 * double(i);
  return arr<double>(v, shape);
}
// Values in [0.5, 1.5] (for products, where large magnitudes would make tolerances meaningless).
Array near_one(const Shape& shape, double seed = 0.0) {
  std::vector<double> v(size_t(shape_size(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1 + 0.5 * std::sin(2.13 * double(i) + 0.7 + seed);
  return arr<double>(v, shape);
}
Fn unary(std::function<Array(const Array&)> f) {
  return [f](const std::vector<Array>& a) { return std::vector<Array>{f(a[0])}; };
}
void check_close(const Array& got, const Array& want, double tol = 1e-12) {
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  auto g = vals(got), w = vals(want);
  for (size_t i = 0; i < g.size(); ++i) CHECK_MESSAGE(std::abs(g[i] - w[i]) <= tol * (1 + std::abs(w[i])), "at " << i);
}
// x indexed at i along `axis` (the axis removed).
Array index_at(const Array& x, int64_t i, int axis) {
  int64_t ax = axis < 0 ? axis + x.ndim() : axis;
  return lax::squeeze(lax::slice_in_dim(x, i, i + 1, 1, ax), {ax});
}
// vmap(f, in_axes)(args) equals f applied to each example, stacked along 0 (every output).
void check_vmap(const std::function<std::vector<Array>(const std::vector<Array>&)>& f, const std::vector<Array>& args,
                const std::vector<std::optional<int>>& in_axes) {
  int64_t size = 0;
  for (size_t k = 0; k < args.size(); ++k)
    if (in_axes[k]) size = args[k].shape()[size_t(*in_axes[k] < 0 ? *in_axes[k] + args[k].ndim() : *in_axes[k])];
  std::vector<Array> batched;
  auto f1 = [&](const Array& a) { return f({a}); };
  auto f2 = [&](const Array& a, const Array& b) { return f({a, b}); };
  if (args.size() == 1)
    batched = vmap(f1, *in_axes[0])(args[0]);
  else if (!in_axes[0])
    batched = vmap(f2, {None, *in_axes[1]})(args[0], args[1]);
  else if (!in_axes[1])
    batched = vmap(f2, {*in_axes[0], None})(args[0], args[1]);
  else
    batched = vmap(f2, {*in_axes[0], *in_axes[1]})(args[0], args[1]);
  std::vector<std::vector<Array>> per_example;
  for (int64_t i = 0; i < size; ++i) {
    std::vector<Array> ex;
    for (size_t k = 0; k < args.size(); ++k) ex.push_back(in_axes[k] ? index_at(args[k], i, *in_axes[k]) : args[k]);
    per_example.push_back(f(ex));
  }
  REQUIRE(batched.size() == per_example[0].size());
  for (size_t o = 0; o < batched.size(); ++o) {
    std::vector<Array> column;
    for (auto& outs : per_example) column.push_back(outs[o]);
    check_close(batched[o], jnp::stack(column, 0));
  }
}
void check_vmap1(const std::function<Array(const Array&)>& f, const Array& x, int in_axis) {
  check_vmap([&](const std::vector<Array>& a) { return std::vector<Array>{f(a[0])}; }, {x}, {in_axis});
}

}  // namespace

TEST_CASE("check_grads of every differentiable reduction, cumulative and sort primitive") {
  struct Case {
    std::string name;
    Fn f;
    std::vector<Array> args;
  };
  Array x34 = distinct({3, 4}), x234 = distinct({2, 3, 4}, 0.5);
  Array with_zero = arr<double>({0.7, 0.0, 1.3, -0.9, 1.1, 0.8, -1.2, 0.0, 0.0, 1.4, 0.6, 1.05}, {3, 4});
  std::vector<Case> cases = {
      {"reduce_sum axis 1", unary([](const Array& x) { return lax::reduce_sum(x, {1}); }), {x34}},
      {"reduce_sum axes 0,2",
       unary([](const Array& x) {
         return lax::reduce_sum(x, {0, 2});
       }),
       {x234}},
      {"reduce_sum all",
       unary([](const Array& x) {
         return lax::reduce_sum(lax::mul(x, x), {0, 1, 2});
       }),
       {x234}},
      {"reduce_max axis 1", unary([](const Array& x) { return lax::reduce_max(x, {1}); }), {x34}},
      {"reduce_max axes 0,2",
       unary([](const Array& x) {
         return lax::reduce_max(lax::mul(x, x), {0, 2});
       }),
       {x234}},
      {"reduce_min axis 0", unary([](const Array& x) { return lax::reduce_min(x, {0}); }), {x34}},
      {"reduce_min axes 1,2",
       unary([](const Array& x) {
         return lax::reduce_min(x, {1, 2});
       }),
       {x234}},
      {"reduce_prod axis 1", unary([](const Array& x) { return lax::reduce_prod(x, {1}); }), {near_one({3, 5})}},
      {"reduce_prod axes 0,2",
       unary([](const Array& x) {
         return lax::reduce_prod(x, {0, 2});
       }),
       {near_one({2, 3, 4})}},
      {"reduce_prod with zeros", unary([](const Array& x) { return lax::reduce_prod(x, {1}); }), {with_zero}},
      {"cumsum axis 0", unary([](const Array& x) { return lax::cumsum(x, 0); }), {x34}},
      {"cumsum axis 1 reverse", unary([](const Array& x) { return lax::cumsum(lax::mul(x, x), 1, true); }), {x234}},
      {"cumprod axis 1", unary([](const Array& x) { return lax::cumprod(x, 1); }), {near_one({3, 5})}},
      {"cumprod axis 0 reverse", unary([](const Array& x) { return lax::cumprod(x, 0, true); }), {near_one({6, 2})}},
      {"cumprod with zeros", unary([](const Array& x) { return lax::cumprod(x, 1); }), {with_zero}},
      {"cummax axis 1", unary([](const Array& x) { return lax::cummax(x, 1); }), {distinct({3, 7})}},
      {"cummax axis 0 reverse", unary([](const Array& x) { return lax::cummax(x, 0, true); }), {x234}},
      {"cummin axis 2", unary([](const Array& x) { return lax::cummin(x, 2); }), {x234}},
      {"cummin axis 0 reverse", unary([](const Array& x) { return lax::cummin(x, 0, true); }), {distinct({5, 2})}},
      {"cumlogsumexp axis 1", unary([](const Array& x) { return lax::cumlogsumexp(x, 1); }), {distinct({3, 6})}},
      {"cumlogsumexp axis 0 reverse", unary([](const Array& x) { return lax::cumlogsumexp(x, 0, true); }), {x234}},
      {"sort last axis", unary([](const Array& x) { return lax::sort(x); }), {x34}},
      {"sort axis 0", unary([](const Array& x) { return lax::sort(lax::mul(x, x), 0); }), {x234}},
      {"sort two operands, one key",
       [](const std::vector<Array>& a) {
         return lax::sort({a[0], a[1]}, 1, true, 1);
       },
       {x34, distinct({3, 4}, 2.0)}},
      {"sort two keys",
       [](const std::vector<Array>& a) {
         Array k0 = lax::floor(lax::abs(a[0]));  // repeated first keys: the second key decides
         return lax::sort({k0, a[0], a[1]}, 0, true, 2);
       },
       {distinct({5, 3}), distinct({5, 3}, 1.0)}},
      {"top_k", [](const std::vector<Array>& a) { return std::vector<Array>{lax::top_k(a[0], 3).first}; }, {x234}},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    CHECK_NOTHROW(check_grads(c.f, c.args, {.order = 2}));
  }
}

TEST_CASE("reduce_max/min split the tangent equally between ties") {
  Array x = arr<double>({1, 3, 3, 2, 3, -1}, {2, 3});
  Array g = grad([](const Array& v) { return lax::reduce_sum(lax::reduce_max(v, {0, 1}), {}); })(x);
  CHECK(vals(g) == std::vector<double>{0, 1.0 / 3, 1.0 / 3, 0, 1.0 / 3, 0});
  Array g_rows = grad([](const Array& v) { return lax::reduce_sum(lax::reduce_max(v, {1}), {0}); })(x);
  CHECK(vals(g_rows) == std::vector<double>{0, 0.5, 0.5, 0, 1, 0});
  Array g_min = grad([](const Array& v) { return lax::reduce_sum(lax::reduce_min(v, {0}), {0}); })(
      arr<double>({2, 5, -1, 2, 4, -1}, {2, 3}));
  CHECK(vals(g_min) == std::vector<double>{0.5, 0, 0.5, 0.5, 1, 0.5});
  auto [out, t] = jvp([](const Array& v) { return lax::reduce_max(v, {0}); }, std::tuple{arr<double>({4, 1, 4})},
                      std::tuple{arr<double>({1, 10, 3})});
  CHECK(out.item<double>() == 4);
  CHECK(t.item<double>() == 2);  // (1 + 3) / 2
}

TEST_CASE("vjp of reductions and scans against closed forms") {
  SUBCASE("reduce_sum broadcasts the cotangent back") {
    auto [out, f_vjp] = vjp([](const Array& v) { return lax::reduce_sum(v, {0, 2}); }, distinct({2, 3, 2}));
    auto [g] = f_vjp(arr<double>({1, 2, 3}));
    CHECK(vals(g) == std::vector<double>{1, 1, 2, 2, 3, 3, 1, 1, 2, 2, 3, 3});
  }
  SUBCASE("reduce_prod: prod / x_i, exact with one and two zeros") {
    auto f = [](const Array& v) { return lax::reduce_prod(v, {0}); };
    CHECK(vals(grad(f)(arr<double>({2, 3, 5, -0.5}))) == std::vector<double>{-7.5, -5, -3, 30});
    CHECK(vals(grad(f)(arr<double>({2, 0, 5, -0.5}))) == std::vector<double>{0, -5, 0, 0});
    CHECK(vals(grad(f)(arr<double>({2, 0, 5, 0}))) == std::vector<double>{0, 0, 0, 0});
    // Second derivative d2/dx0 dx1 of x0 x1 x2 = x2 at a zero.
    Array h = hessian(f)(arr<double>({0, 0, 5}));
    CHECK(vals(h) == std::vector<double>{0, 5, 0, 5, 0, 0, 0, 0, 0});
  }
  SUBCASE("cumsum transposes to a reversed cumsum") {
    auto [out, f_vjp] = vjp([](const Array& v) { return lax::cumsum(v, 0); }, arr<double>({1, 2, 3}));
    CHECK(vals(out) == std::vector<double>{1, 3, 6});
    CHECK(vals(std::get<0>(f_vjp(arr<double>({1, 2, 3})))) == std::vector<double>{6, 5, 3});
    auto [out_r, f_vjp_r] = vjp([](const Array& v) { return lax::cumsum(v, 0, true); }, arr<double>({1, 2, 3}));
    CHECK(vals(std::get<0>(f_vjp_r(arr<double>({1, 2, 3})))) == std::vector<double>{1, 3, 6});
  }
  SUBCASE("cumprod: d/dx_j sum_i prod_{k<=i} x_k, with a zero") {
    auto f = [](const Array& v) { return lax::reduce_sum(lax::cumprod(v, 0), {0}); };
    // x = (2, 3, 4): outputs 2, 6, 24. d/dx0 = 1 + 3 + 12 = 16, d/dx1 = 2 + 8 = 10, d/dx2 = 6.
    CHECK(vals(grad(f)(arr<double>({2, 3, 4}))) == std::vector<double>{16, 10, 6});
    // x = (2, 0, 4): outputs 2, 0, 0. d/dx0 = 1, d/dx1 = 2 + 8 = 10, d/dx2 = 0.
    CHECK(vals(grad(f)(arr<double>({2, 0, 4}))) == std::vector<double>{1, 10, 0});
  }
  SUBCASE("cummax/cummin route the cotangent to the running extreme") {
    auto fmax = [](const Array& v) { return lax::reduce_sum(lax::cummax(v, 0), {0}); };
    // cummax of (1, 3, 2, 5, 4) = (1, 3, 3, 5, 5)
    CHECK(vals(grad(fmax)(arr<double>({1, 3, 2, 5, 4}))) == std::vector<double>{1, 2, 0, 2, 0});
    auto fmin_rev = [](const Array& v) { return lax::reduce_sum(lax::cummin(v, 0, true), {0}); };
    // reverse cummin of (1, 3, 2, 5, 4) = (1, 2, 2, 4, 4)
    CHECK(vals(grad(fmin_rev)(arr<double>({1, 3, 2, 5, 4}))) == std::vector<double>{1, 0, 2, 0, 2});
  }
  SUBCASE("cumlogsumexp: softmax weights of each prefix") {
    auto f = [](const Array& v) { return lax::reduce_sum(lax::cumlogsumexp(v, 0), {0}); };
    std::vector<double> x{0.5, -1.0, 2.0};
    Array g = grad(f)(arr<double>(x));
    double e0 = std::exp(x[0]), e1 = std::exp(x[1]), e2 = std::exp(x[2]);
    double s1 = e0 + e1, s2 = s1 + e2;
    std::vector<double> want{1 + e0 / s1 + e0 / s2, e1 / s1 + e1 / s2, e2 / s2};
    auto gv = vals(g);
    for (size_t i = 0; i < 3; ++i) CHECK(gv[i] == doctest::Approx(want[i]).epsilon(1e-13));
  }
  SUBCASE("sort sends each cotangent back to where its value came from") {
    auto [out, f_vjp] = vjp([](const Array& v) { return lax::sort(v, 0); }, arr<double>({3, 1, 2}));
    CHECK(vals(out) == std::vector<double>{1, 2, 3});
    CHECK(vals(std::get<0>(f_vjp(arr<double>({10, 20, 30})))) == std::vector<double>{30, 10, 20});
    // The values operand of a keyed sort is permuted by the keys.
    auto [outs, f_vjp2] = vjp(
        [](const Array& k, const Array& v) {
          return lax::sort({k, v}, 0, true, 1)[1];
        },
        arr<double>({2, 0, 1}), arr<double>({5, 6, 7}));
    CHECK(vals(outs) == std::vector<double>{6, 7, 5});
    auto [gk, gv] = f_vjp2(arr<double>({1, 2, 3}));
    CHECK(vals(gk) == std::vector<double>{0, 0, 0});
    CHECK(vals(gv) == std::vector<double>{3, 1, 2});
  }
  SUBCASE("top_k scatters the cotangent to the chosen entries") {
    auto f = [](const Array& v) { return lax::top_k(v, 2).first; };
    auto [out, f_vjp] = vjp(f, arr<double>({1, 9, 4, 7, 2, 8}, {2, 3}));
    CHECK(vals(out) == std::vector<double>{9, 4, 8, 7});
    CHECK(vals(std::get<0>(f_vjp(arr<double>({1, 2, 3, 4}, {2, 2})))) == std::vector<double>{0, 1, 2, 4, 0, 3});
  }
}

TEST_CASE("argmax/argmin/reduce_and/reduce_or have zero derivatives") {
  auto f = [](const Array& v) {
    Array i = lax::convert_element_type(lax::argmax(v, 0), f64);
    Array j = lax::convert_element_type(lax::argmin(v, 0), f64);
    Array any = lax::convert_element_type(lax::reduce_or(lax::gt(v, make_scalar(2.0, f64)), {0}), f64);
    Array all = lax::convert_element_type(lax::reduce_and(lax::gt(v, make_scalar(0.0, f64)), {0}), f64);
    return lax::mul(lax::add(lax::add(i, j), lax::add(any, all)), lax::reduce_sum(v, {0}));
  };
  Array x = arr<double>({1, 3, 0.5});
  // argmax 1, argmin 2, any(x > 2) true, all(x > 0) true: the factor is 5.
  CHECK(vals(grad(f)(x)) == std::vector<double>{5, 5, 5});
  auto [out, t] =
      jvp([](const Array& v) { return lax::argmax(v, 0); }, std::tuple{x}, std::tuple{arr<double>({1, 1, 1})});
  CHECK(out.item<int32_t>() == 1);
  CHECK(vals(t) == std::vector<double>{0});
}

TEST_CASE("vmap of reductions matches per-example results") {
  Array x = distinct({4, 3, 5});
  for (int in_axis : {0, 1, -1}) {
    CAPTURE(in_axis);
    // Reduced axes before and after the batch dimension.
    for (const std::vector<int64_t>& axes : std::vector<std::vector<int64_t>>{{0}, {1}, {0, 1}, {}}) {
      CAPTURE(axes.size());
      check_vmap1([&](const Array& v) { return lax::reduce_sum(v, axes); }, x, in_axis);
      check_vmap1([&](const Array& v) { return lax::reduce_max(v, axes); }, x, in_axis);
      check_vmap1([&](const Array& v) { return lax::reduce_min(v, axes); }, x, in_axis);
      check_vmap1([&](const Array& v) { return lax::reduce_prod(v, axes); }, near_one({4, 3, 5}), in_axis);
      Array b = lax::gt(x, make_scalar(0.0, f64));
      check_vmap1([&](const Array& v) { return lax::reduce_and(v, axes); }, b, in_axis);
      check_vmap1([&](const Array& v) { return lax::reduce_or(v, axes); }, b, in_axis);
    }
    for (int64_t axis : {0, 1}) {
      check_vmap1([&](const Array& v) { return lax::argmax(v, axis); }, x, in_axis);
      check_vmap1([&](const Array& v) { return lax::argmin(v, axis); }, x, in_axis);
    }
  }
}

TEST_CASE("vmap of cumulative ops, sort and top_k matches per-example results") {
  Array x = distinct({4, 3, 5});
  for (int in_axis : {0, 1, -1}) {
    CAPTURE(in_axis);
    for (int64_t axis : {0, 1}) {
      for (bool reverse : {false, true}) {
        check_vmap1([&](const Array& v) { return lax::cumsum(v, axis, reverse); }, x, in_axis);
        check_vmap1([&](const Array& v) { return lax::cumprod(v, axis, reverse); }, near_one({4, 3, 5}), in_axis);
        check_vmap1([&](const Array& v) { return lax::cummax(v, axis, reverse); }, x, in_axis);
        check_vmap1([&](const Array& v) { return lax::cummin(v, axis, reverse); }, x, in_axis);
        check_vmap1([&](const Array& v) { return lax::cumlogsumexp(v, axis, reverse); }, x, in_axis);
      }
      check_vmap1([&](const Array& v) { return lax::sort(v, axis); }, x, in_axis);
    }
    auto top2 = [](const std::vector<Array>& a) {
      auto [values, indices] = lax::top_k(a[0], 2);
      return std::vector<Array>{values, indices};
    };
    check_vmap(top2, {x}, {in_axis});
  }
  // Multi-operand sorts with batched and unbatched operands.
  Array keys = distinct({4, 6}), values = distinct({6, 4}, 1.0), shared = distinct({6}, 2.0);
  auto sort2 = [](const std::vector<Array>& a) { return lax::sort({a[0], a[1]}, 0, true, 1); };
  check_vmap(sort2, {keys, values}, {0, 1});
  check_vmap(sort2, {keys, shared}, {0, std::nullopt});
  check_vmap(sort2, {shared, values}, {std::nullopt, 1});
  Array k2 = lax::floor(distinct({4, 6}));
  check_vmap([](const std::vector<Array>& a) { return lax::sort({a[0], a[1]}, 0, true, 2); }, {k2, values}, {0, 1});
}

TEST_CASE("vmap of gradients through sort, top_k and reduce_max") {
  Array x = distinct({3, 5});
  auto g_sort = [](const Array& v) {
    return grad([](const Array& w) { return lax::reduce_sum(lax::mul(lax::sort(w, 0), lax::iota(f64, 5)), {0}); })(v);
  };
  check_vmap1(g_sort, x, 0);
  check_vmap1(g_sort, x.T(), 1);
  auto g_max = [](const Array& v) { return grad([](const Array& w) { return lax::reduce_max(w, {0}); })(v); };
  check_vmap1(g_max, x, 0);
  check_vmap1(g_max, x, 1);
  auto g_topk = [](const Array& v) {
    return grad([](const Array& w) { return lax::reduce_sum(lax::top_k(w, 2).first, {0}); })(v);
  };
  check_vmap1(g_topk, x, 0);
  check_vmap1(g_topk, x, -1);
}

TEST_CASE("make_jaxpr of grad of reduce_sum") {
  auto cj = make_jaxpr(grad([](const Array& v) { return lax::reduce_sum(v, {0}); }))(jnp::ones({3}));
  // The broadcast_in_dim line is over 80 columns, so the printer breaks its params as JAX's does.
  CHECK(text(cj) ==
        "{ lambda ; a:f32[3]. let\n"
        "    _:f32[] = reduce_sum[axes=(0,) out_sharding=None] a\n"
        "    b:f32[3] = broadcast_in_dim[\n"
        "      broadcast_dimensions=()\n"
        "      shape=(3,)\n"
        "      sharding=None\n"
        "    ] 1.0:f32[]\n"
        "  in (b,) }");
  auto cj_max = make_jaxpr(grad([](const Array& v) { return lax::reduce_max(v, {0}); }))(jnp::ones({3}));
  // JAX's rule reshapes b to f32[1] and lets eq broadcast it; cjax's eq needs equal shapes, so
  // b is broadcast_in_dim'ed instead. The rest is JAX's _reduce_chooser_jvp_rule transposed.
  CHECK(text(cj_max) ==
        "{ lambda ; a:f32[3]. let\n"
        "    b:f32[] = reduce_max[axes=(0,) out_sharding=None] a\n"
        "    c:f32[3] = broadcast_in_dim[\n"
        "      broadcast_dimensions=()\n"
        "      shape=(3,)\n"
        "      sharding=None\n"
        "    ] b\n"
        "    d:bool[3] = eq a c\n"
        "    e:f32[3] = convert_element_type[new_dtype=float32 weak_type=False] d\n"
        "    f:f32[] = reduce_sum[axes=(0,) out_sharding=None] e\n"
        "    g:f32[] = div 1.0:f32[] f\n"
        "    h:f32[3] = broadcast_in_dim[\n"
        "      broadcast_dimensions=()\n"
        "      shape=(3,)\n"
        "      sharding=None\n"
        "    ] g\n"
        "    i:f32[3] = mul h e\n"
        "  in (i,) }");
}
