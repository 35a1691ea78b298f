// Control flow: cond, switch_, while_loop, fori_loop and scan (eager, jit, vmap, grad, printing).
#include <doctest/doctest.h>

#include <cmath>

#include "cjax/cjax.h"
#include "test_util.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

TEST_CASE("smoke") {
  auto f = [](const Array& p, const Array& x) {
    return lax::cond(p, [](const Array& v) { return lax::sin(v); }, [](const Array& v) { return lax::neg(v); }, x);
  };
  MESSAGE(text(make_jaxpr(f)(Array(true), arr<float>({1, 2, 3}))));
  auto g = [](const Array& x) {
    return lax::fori_loop(0, 5, [](const Array& i, const Array& c) { return c * 2.0f + i.astype(f32); }, x);
  };
  MESSAGE(text(make_jaxpr(g)(arr<float>({1, 2, 3}))));
  auto h = [](const Array& h0, const Array& xs) {
    return lax::scan([](const Array& c, const Array& x) { return std::pair{lax::add(c, x), lax::mul(c, x)}; }, h0, xs);
  };
  MESSAGE(text(make_jaxpr(h)(arr<float>({0}, {}), arr<float>({1, 2, 3}))));
  auto w = [](const Array& x) {
    return lax::while_loop([](const Array& c) { return lax::lt(c, make_scalar(10, f32)); },
                           [](const Array& c) { return lax::mul(c, make_scalar(2, f32)); }, x);
  };
  MESSAGE(text(make_jaxpr(w)(make_scalar(1, f32))));
  CHECK(w(make_scalar(1, f32)).item<float>() == 16);
  CHECK(vals(f(Array(true), arr<float>({1, 2}))) == std::vector<double>{std::sin(1.0f), std::sin(2.0f)});
  CHECK(vals(g(arr<float>({1})))[0] == 1*32 + 0*16 + 1*8 + 2*4+3*2+4);
  auto [c, ys] = h(make_scalar(0, f32), arr<float>({1, 2, 3}));
  CHECK(c.item<float>() == 6);
  CHECK(vals(ys) == std::vector<double>{0, 2, 9});
}
