// The autodiff and vmap machinery on a few primitives: jvp, linearize/vjp, grad, nesting,
// staging (make_jaxpr of grad), vmap, and their misuse errors.
#include <doctest/doctest.h>

#include <cmath>

#include "autodiff/check_grads.h"
#include "cjax/cjax.h"
#include "test_util.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

TEST_CASE("grad of sin(x) * x") {
  auto f = [](const Array& x) { return lax::mul(lax::sin(x), x); };
  Array x = make_scalar(0.7, f32);
  Array g = grad(f)(x);
  CHECK(g.item<float>() == doctest::Approx(std::cos(0.7) * 0.7 + std::sin(0.7)));
  // second order: d2/dx2 (x sin x) = 2 cos x - x sin x
  Array g2 = grad(grad(f))(x);
  CHECK(g2.item<float>() == doctest::Approx(2 * std::cos(0.7) - 0.7 * std::sin(0.7)));
}

TEST_CASE("jvp and vjp agree") {
  auto f = [](const Array& x, const Array& y) { return lax::add(lax::mul(x, y), lax::sin(x)); };
  Array x = arr<float>({0.5, 1.0, -2.0}), y = arr<float>({2.0, 3.0, 4.0});
  auto [out, tan] = jvp(f, std::tuple{x, y}, std::tuple{jnp::ones({3}), jnp::zeros({3})});
  auto tv = vals(tan);
  CHECK(tv[0] == doctest::Approx(2.0 + std::cos(0.5)));
  auto [out2, f_vjp] = vjp(f, x, y);
  CHECK(vals(out2) == vals(out));
  auto [gx, gy] = f_vjp(jnp::ones({3}));
  CHECK(vals(gx)[0] == doctest::Approx(2.0 + std::cos(0.5)));
  CHECK(vals(gy) == vals(x));
}

TEST_CASE("make_jaxpr of grad stages forward then backward") {
  auto f = [](const Array& x) { return lax::mul(lax::sin(x), x); };
  auto cj = make_jaxpr(grad(f))(make_scalar(0.5, f32));
  MESSAGE(text(cj));
  CHECK(text(cj).find("cos") != std::string::npos);
}

TEST_CASE("vmap of an elementwise function") {
  auto f = [](const Array& x, const Array& y) { return lax::mul(lax::sin(x), y); };
  Array xs = arr<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  Array y = arr<float>({1, 2, 3});
  Array out = vmap(f, {0, None})(xs, y);
  CHECK(out.shape() == Shape{2, 3});
  CHECK(vals(out)[4] == doctest::Approx(std::sin(4.0) * 2));
  Array out1 = vmap(f, {1, None}, 1)(xs.T(), y);
  CHECK(out1.shape() == Shape{3, 2});
}

TEST_CASE("grad misuse") {
  auto f = [](const Array& x) { return lax::sin(x); };
  CHECK_ERR(grad(f)(arr<float>({1, 2})), ShapeError, "scalar output", "f32[2]");
  CHECK_ERR(grad(f)(make_scalar(1, i32)), DTypeError, "floating", "i32[]");
}

TEST_CASE("check_grads on a small composite, and it catches a wrong rule") {
  auto f = [](const std::vector<Array>& a) {
    return std::vector<Array>{lax::add(lax::mul(lax::sin(a[0]), a[1]), lax::neg(a[0]))};
  };
  Array x = arr<double>({0.3, -1.2, 2.0}), y = arr<double>({1.5, 0.5, -0.7});
  check_grads(f, {x, y}, {.order = 2});
  CHECK_NOTHROW(check_grads(f, {x.astype(f32), y.astype(f32)}, {.order = 1}));
  // stop_gradient makes the derivative disagree with finite differences on purpose.
  auto g = [](const std::vector<Array>& a) { return std::vector<Array>{lax::mul(lax::stop_gradient(a[0]), a[0])}; };
  CHECK_ERR(check_grads(g, {x}, {.order = 1, .rev = false}), Error, "JVP (order 1)");
  // The reverse-mode check compares vjp with jvp, which agree with each other here.
  CHECK_NOTHROW(check_grads(g, {x}, {.order = 1, .fwd = false}));
}
