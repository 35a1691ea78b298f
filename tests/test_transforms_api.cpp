// The public transformation API over trees: grad/value_and_grad with argnums and has_aux, vjp and
// jvp of tree functions, jacfwd/jacrev/hessian, vmap in_axes/out_axes (ints, None, tree
// prefixes), nested vmap, vmap of grad and grad of vmap.
#include <doctest/doctest.h>

#include <cmath>

#include "autodiff/check_grads.h"
#include "cjax/cjax.h"
#include "test_util.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {
struct Linear {
  Array w, b;
};
CJAX_TREE(Linear, w, b)

Array predict(const Linear& p, const Array& x) { return jnp::tanh(jnp::matmul(x, p.w) + p.b); }
Array mse(const Linear& p, const Array& x, const Array& y) { return jnp::mean(jnp::square(predict(p, x) - y)); }

void check_close(const Array& a, const Array& b, double tol = 1e-5) {
  REQUIRE(a.shape() == b.shape());
  auto x = vals(a), y = vals(b);
  for (size_t i = 0; i < x.size(); ++i) CHECK(x[i] == doctest::Approx(y[i]).epsilon(tol).scale(1));
}
}  // namespace

TEST_CASE("grad over a CJAX_TREE struct, argnums and has_aux") {
  Linear p{arr<double>({0.1, -0.2, 0.3, 0.4, 0.5, -0.6}, {3, 2}), arr<double>({0.01, -0.02})};
  Array x = arr<double>({1, 2, 3, -1, 0.5, 0.25}, {2, 3}), y = arr<double>({0.5, -0.5, 0.1, 0.2}, {2, 2});
  Linear g = grad(mse)(p, x, y);
  // Closed form: d/dW mean((tanh(xW+b) - y)^2) = x^T [2/N (t - y) (1 - t^2)]
  Array t = jnp::tanh(jnp::matmul(x, p.w) + p.b);
  Array delta = (t - y) * (1.0 - t * t) * (2.0 / 4.0);
  check_close(g.w, jnp::matmul(x.T(), delta));
  check_close(g.b, jnp::sum(delta, 0));

  auto [loss, gs] = value_and_grad(mse, argnums<0, 1>)(p, x, y);
  CHECK(loss.item<double>() == doctest::Approx(mse(p, x, y).item<double>()));
  check_close(std::get<0>(gs).w, g.w);
  check_close(std::get<1>(gs), jnp::matmul(delta, p.w.T()));  // d/dx

  auto with_aux = [](const Linear& p, const Array& x, const Array& y) {
    Array pred = predict(p, x);
    return std::pair{jnp::mean(jnp::square(pred - y)), std::map<std::string, Array>{{"pred", pred}}};
  };
  auto [out, g2] = value_and_grad(with_aux, has_aux)(p, x, y);
  check_close(out.second.at("pred"), t);
  check_close(g2.w, g.w);
  auto [g3, aux] = grad(with_aux, argnums<0>, has_aux)(p, x, y);
  check_close(g3.b, g.b);
  check_close(aux.at("pred"), t);
}

TEST_CASE("vjp and jvp of a tree function") {
  auto f = [](const std::vector<Array>& xs) { return std::pair{lax::mul(xs[0], xs[1]), lax::sin(xs[0])}; };
  std::vector<Array> xs{arr<double>({0.5, 1.5}), arr<double>({2, 3})};
  auto [out, f_vjp] = vjp(f, xs);
  auto [cts] = f_vjp(std::pair{arr<double>({1, 1}), arr<double>({1, 0})});
  CHECK(vals(cts[0])[0] == doctest::Approx(2 + std::cos(0.5)));
  CHECK(vals(cts[0])[1] == doctest::Approx(3));
  CHECK(vals(cts[1]) == vals(xs[0]));
  auto [o2, t2] = jvp(f, std::tuple{xs}, std::tuple{std::vector<Array>{arr<double>({1, 0}), arr<double>({0, 1})}});
  CHECK(vals(t2.first) == std::vector<double>{2, 1.5});
  CHECK(vals(t2.second)[1] == doctest::Approx(0));
  // An integer input gets a zero cotangent of its dtype.
  auto g = [](const Array& x, const Array& n) { return lax::mul(x, lax::convert_element_type(n, f64)); };
  auto [o3, g_vjp] = vjp(g, arr<double>({1, 2}), arr<int32_t>({3, 4}));
  auto [gx, gn] = g_vjp(arr<double>({1, 1}));
  CHECK(vals(gx) == std::vector<double>{3, 4});
  CHECK(gn.dtype() == i32);
  CHECK(vals(gn) == std::vector<double>{0, 0});
}

TEST_CASE("jacfwd, jacrev and hessian") {
  auto f = [](const Array& x) { return jnp::stack({lax::mul(x[0], x[1]), lax::sin(x[0])}); };
  Array x = arr<double>({0.3, 2.0});
  Array jf = jacfwd(f)(x), jr = jacrev(f)(x);
  CHECK(jf.shape() == Shape{2, 2});
  std::vector<double> want{2.0, 0.3, std::cos(0.3), 0};
  for (size_t i = 0; i < 4; ++i) {
    CHECK(vals(jf)[i] == doctest::Approx(want[i]));
    CHECK(vals(jr)[i] == doctest::Approx(want[i]));
  }
  auto energy = [](const Array& x) { return jnp::sum(x * x * x); };
  Array h = hessian(energy)(arr<double>({1, 2, 3}));
  CHECK(h.shape() == Shape{3, 3});
  CHECK(vals(h) == std::vector<double>{6, 0, 0, 0, 12, 0, 0, 0, 18});
}

TEST_CASE("vmap: tree-prefix in_axes, out_axes, nesting, axis_size") {
  auto f = [](const std::map<std::string, Array>& p, const Array& x) {
    return lax::add(lax::mul(p.at("w"), x), p.at("b"));
  };
  std::map<std::string, Array> p{{"w", arr<float>({1, 2, 3, 4, 5, 6}, {2, 3})}, {"b", arr<float>({10, 20, 30})}};
  Array x = arr<float>({1, 1, 1});
  // p["w"] mapped over axis 0, p["b"] not, x not.
  Array out = vmap(f, {std::map<std::string, AxisSpec>{{"w", 0}, {"b", None}}, None})(p, x);
  CHECK(vals(out) == std::vector<double>{11, 22, 33, 14, 25, 36});
  // out_axes = 1
  Array out1 = vmap(f, {std::map<std::string, AxisSpec>{{"w", 0}, {"b", None}}, None}, 1)(p, x);
  CHECK(out1.shape() == Shape{3, 2});
  CHECK(vals(out1) == std::vector<double>{11, 14, 22, 25, 33, 36});
  // A mismatched prefix names the argument.
  CHECK_ERR(vmap(f, {std::map<std::string, AxisSpec>{{"w", 0}}, None})(p, x), ValueError, "argument 0", "tree prefix");
  // Nested vmap computes an outer product.
  auto mul = [](const Array& a, const Array& b) { return lax::mul(a, b); };
  Array outer = vmap(vmap(mul, {None, 0}), {0, None})(arr<float>({1, 2}), arr<float>({3, 4, 5}));
  CHECK(outer.shape() == Shape{2, 3});
  CHECK(vals(outer) == std::vector<double>{3, 4, 5, 6, 8, 10});
  // Static argument with None; axis_size with nothing mapped.
  auto scale = [](const Array& a, int k) { return lax::mul(a, make_scalar(k, f32)); };
  CHECK(vals(vmap(scale, {0, None})(arr<float>({1, 2}), 3)) == std::vector<double>{3, 6});
  Array rep = vmap([](const Array& a) { return lax::sin(a); }, None, 0, {.axis_size = 3})(make_scalar(0, f32));
  CHECK(rep.shape() == Shape{3});
  // Multiple outputs with different out_axes.
  auto two = [](const Array& a) { return std::pair{lax::neg(a), jnp::sum(a)}; };
  auto [neg, sums] = vmap(two, 1, {0, 0})(arr<float>({1, 2, 3, 4, 5, 6}, {3, 2}));
  CHECK(neg.shape() == Shape{2, 3});
  CHECK(vals(sums) == std::vector<double>{9, 12});
}

TEST_CASE("vmap of grad and grad of vmap") {
  auto f = [](const Array& x) { return lax::mul(lax::sin(x), x); };
  Array xs = arr<double>({0.1, 0.7, -1.3});
  Array per = vmap(grad(f))(xs);
  auto g = grad([&](const Array& x) { return jnp::sum(vmap(f)(x)); })(xs);
  for (size_t i = 0; i < 3; ++i) {
    double xi = vals(xs)[i];
    CHECK(vals(per)[i] == doctest::Approx(std::cos(xi) * xi + std::sin(xi)));
    CHECK(vals(g)[i] == doctest::Approx(std::cos(xi) * xi + std::sin(xi)));
  }
  // Per-example gradients of a model: vmap(grad) over the batch with params unmapped.
  Linear p{arr<double>({0.1, -0.2, 0.3, 0.4, 0.5, -0.6}, {3, 2}), arr<double>({0.01, -0.02})};
  Array x = arr<double>({1, 2, 3, -1, 0.5, 0.25}, {2, 3}), y = arr<double>({0.5, -0.5, 0.1, 0.2}, {2, 2});
  auto per_example = vmap(grad(mse), {None, 0, 0})(p, x[NewAxis].reshape({2, 1, 3}), y.reshape({2, 1, 2}));
  CHECK(per_example.w.shape() == Shape{2, 3, 2});
  Linear g0 = grad(mse)(p, x[{Slice(0, 1)}], y[{Slice(0, 1)}]);
  check_close(per_example.w[0], g0.w);
}

TEST_CASE("check_grads through composite numpy/nn functions") {
  auto softmax_xent = [](const std::vector<Array>& a) {
    Array logp = nn::log_softmax(a[0], -1);
    return std::vector<Array>{-jnp::sum(logp * a[1])};
  };
  Array logits = arr<double>({0.1, 2.0, -1.0, 0.5, 0.3, -0.2}, {2, 3});
  Array labels = arr<double>({0, 1, 0, 1, 0, 0}, {2, 3});
  check_grads(softmax_xent, {logits, labels}, {.order = 2});
  auto attention = [](const std::vector<Array>& a) {
    return std::vector<Array>{nn::dot_product_attention(a[0], a[1], a[2], {.is_causal = true})};
  };
  // The softmax inside runs in f32 even for f64 inputs (as JAX's), so check in f32 tolerances.
  Array q = random::normal(random::key(1), {1, 4, 2, 3});
  Array k = random::normal(random::key(2), {1, 4, 2, 3});
  Array v = random::normal(random::key(3), {1, 4, 2, 3});
  check_grads(attention, {q, k, v}, {.order = 1});
}
