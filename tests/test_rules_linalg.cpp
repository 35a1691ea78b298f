// Rules of dot_general and conv_general_dilated (autodiff/rules_linalg.cpp): numerical gradient
// checks (f64, orders 1 and 2, forward and reverse), grads against closed forms, vmap against
// stacked per-example results, and the staged gradient of a matmul in JAX's text.
#include <doctest/doctest.h>

#include <cmath>
#include <optional>

#include "autodiff/check_grads.h"
#include "cjax/cjax.h"
#include "test_util.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {

using VA = std::vector<Array>;
using Axes = std::vector<std::optional<int>>;

Array rnd(uint32_t seed, const Shape& shape, DType dt = f64) { return random::normal(random::key(seed), shape, dt); }

lax::DotDimensionNumbers dims(std::vector<int64_t> lc, std::vector<int64_t> rc, std::vector<int64_t> lb = {},
                              std::vector<int64_t> rb = {}) {
  return {{std::move(lc), std::move(rc)}, {std::move(lb), std::move(rb)}};
}

struct DotCase {
  const char* name;
  Shape lhs, rhs;
  lax::DotDimensionNumbers dn;
};
const DotCase kDotCases[] = {
    {"matmul", {3, 4}, {4, 5}, dims({1}, {0})},
    {"vector dot", {4}, {4}, dims({0}, {0})},
    {"outer product", {3}, {2}, dims({}, {})},
    {"batched matmul", {2, 3, 4}, {2, 4, 5}, dims({2}, {1}, {0}, {0})},
    {"several contracting dims, rhs order swapped", {2, 3, 4}, {4, 3, 5}, dims({1, 2}, {1, 0})},
    {"batch dims not leading", {3, 2, 4}, {4, 5, 2}, dims({2}, {0}, {1}, {2})},
    {"two batch dims", {2, 3, 4, 2}, {3, 2, 2, 5}, dims({3}, {2}, {0, 1}, {1, 0})},
};

struct ConvCase {
  const char* name;
  Shape lhs, rhs;
  std::vector<int64_t> strides;
  lax::Padding padding;
  std::vector<int64_t> lhs_dilation, rhs_dilation;
  lax::ConvDimensionNumbers dn;
  int64_t groups = 1;
};
const lax::ConvDimensionNumbers kNCH{"NCH", "OIH", "NCH"};
const ConvCase kConvCases[] = {
    {"1-D valid", {2, 3, 9}, {4, 3, 3}, {1}, "VALID", {}, {}, kNCH},
    {"1-D stride 2 leaves the last input unused", {1, 2, 8}, {3, 2, 3}, {2}, "VALID", {}, {}, kNCH},
    {"2-D same, strides", {1, 2, 6, 5}, {3, 2, 3, 2}, {2, 1}, "SAME", {}, {}, {}},
    {"2-D explicit padding, rhs dilation",
     {2, 2, 7, 6},
     {2, 2, 2, 3},
     {1, 1},
     std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {0, 1}},
     {},
     {2, 1},
     {}},
    {"2-D lhs dilation (transposed conv)",
     {1, 2, 4, 3},
     {3, 2, 3, 3},
     {1, 1},
     std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {2, 0}},
     {2, 2},
     {},
     {}},
    {"2-D feature groups", {2, 4, 6, 5}, {6, 2, 3, 3}, {2, 2}, "SAME", {}, {}, {}, 2},
    {"2-D NHWC / HWIO", {2, 6, 5, 3}, {3, 2, 3, 4}, {1, 2}, "SAME", {}, {}, {"NHWC", "HWIO", "NHWC"}},
    {"2-D NHWC, groups, all dilations",
     {1, 5, 6, 4},
     {2, 2, 2, 6},
     {2, 1},
     std::vector<std::pair<int64_t, int64_t>>{{1, 0}, {0, 2}},
     {1, 2},
     {2, 1},
     {"NHWC", "HWIO", "NHWC"},
     2},
};

Array conv_of(const ConvCase& c, const Array& l, const Array& r) {
  return lax::conv_general_dilated(l, r, c.strides, c.padding, c.lhs_dilation, c.rhs_dilation, c.dn, c.groups);
}

}  // namespace

TEST_CASE("dot_general: check_grads, f64, orders 1 and 2, forward and reverse") {
  uint32_t seed = 0;
  for (const DotCase& c : kDotCases) {
    CAPTURE(c.name);
    auto f = [&](const VA& a) { return VA{lax::dot_general(a[0], a[1], c.dn)}; };
    CHECK_NOTHROW(check_grads(f, {rnd(seed, c.lhs), rnd(seed + 1, c.rhs)}, {.order = 2}));
    seed += 2;
  }
}

TEST_CASE("dot_general: grads against closed forms") {
  Array x = rnd(1, {3, 4}), w = rnd(2, {4, 5});
  auto loss = [&](const Array& xx, const Array& ww) { return jnp::sum(lax::dot_general(xx, ww, dims({1}, {0}))); };
  auto [gx, gw] = grad(loss, argnums<0, 1>)(x, w);
  // d/dx sum(x @ w) = ones @ w^T (row sums of w), d/dw = x^T @ ones (column sums of x).
  check_all_close(gx, lax::broadcast_in_dim(jnp::sum(w, {1}), {3, 4}, {1}));
  check_all_close(gw, lax::broadcast_in_dim(jnp::sum(x, {0}), {4, 5}, {0}));
}

TEST_CASE("dot_general: preferred_element_type wider than the inputs") {
  Array x = rnd(3, {3, 4}, f32), w = rnd(4, {4, 2}, f32);
  auto f = [](const VA& a) { return VA{lax::dot_general(a[0], a[1], dims({1}, {0}), f64)}; };
  CHECK_NOTHROW(check_grads(f, {x, w}, {.order = 1}));
  auto loss = [](const Array& xx, const Array& ww) { return jnp::sum(lax::dot_general(xx, ww, dims({1}, {0}), f64)); };
  auto [gx, gw] = grad(loss, argnums<0, 1>)(x, w);
  CHECK(gx.dtype() == f32);  // cotangents come back in the primal dtypes
  CHECK(gw.dtype() == f32);
  check_all_close(gw, lax::broadcast_in_dim(jnp::sum(x, {0}), {4, 2}, {0}), 1e-5);
  auto [out, tangent] = jvp([](const Array& xx) { return lax::dot_general(xx, xx, dims({0}, {0}), f64); },
                            std::tuple{rnd(5, {4}, f32)}, std::tuple{jnp::ones({4}, f32)});
  CHECK(tangent.dtype() == f64);
}

TEST_CASE("dot_general: vmap equals stacked per-example results") {
  Array x3 = rnd(10, {3, 4}), w = rnd(11, {4, 5});
  auto matmul = [](const VA& a) { return lax::dot_general(a[0], a[1], dims({1}, {0})); };
  // lhs batched on each axis, rhs unbatched
  check_vmap_matches_stack(matmul, {rnd(12, {2, 3, 4}), w}, {0, std::nullopt}, 2);
  check_vmap_matches_stack(matmul, {rnd(13, {3, 2, 4}), w}, {1, std::nullopt}, 2);
  check_vmap_matches_stack(matmul, {rnd(14, {3, 4, 2}), w}, {-1, std::nullopt}, 2);
  // rhs batched, lhs unbatched
  check_vmap_matches_stack(matmul, {x3, rnd(15, {2, 4, 5})}, {std::nullopt, 0}, 2);
  check_vmap_matches_stack(matmul, {x3, rnd(16, {4, 2, 5})}, {std::nullopt, 1}, 2);
  check_vmap_matches_stack(matmul, {x3, rnd(17, {4, 5, 2})}, {std::nullopt, -1}, 2);
  // both batched, at different positions
  check_vmap_matches_stack(matmul, {rnd(18, {2, 3, 4}), rnd(19, {4, 5, 2})}, {0, -1}, 2);
  check_vmap_matches_stack(matmul, {rnd(20, {3, 2, 4}), rnd(21, {4, 2, 5})}, {1, 1}, 2);
  // a dot_general with its own batch and several contracting dims
  auto general = [](const VA& a) { return lax::dot_general(a[0], a[1], dims({2, 3}, {1, 0}, {0}, {2})); };
  Array l = rnd(22, {2, 3, 4, 5}), r = rnd(23, {5, 4, 2, 6});
  check_vmap_matches_stack(general,
                           {lax::broadcast_in_dim(l, {3, 2, 3, 4, 5}, {1, 2, 3, 4}) + rnd(24, {3, 2, 3, 4, 5}), r},
                           {0, std::nullopt}, 3);
  check_vmap_matches_stack(general, {l, rnd(25, {5, 4, 2, 3, 6})}, {std::nullopt, 3}, 3);
  check_vmap_matches_stack(general, {rnd(26, {2, 3, 4, 3, 5}), rnd(27, {3, 5, 4, 2, 6})}, {3, 0}, 3);
}

TEST_CASE("dot_general: gradients of vmapped matmuls agree with per-example gradients") {
  Array xs = rnd(30, {3, 2, 4}), w = rnd(31, {4, 5});
  auto loss = [](const Array& x, const Array& ww) {
    return jnp::sum(jnp::tanh(lax::dot_general(x, ww, dims({1}, {0}))));
  };
  auto grad_w = [&](const Array& x, const Array& ww) { return grad(loss, argnums<1>)(x, ww); };
  Array batched = vmap(grad_w, {0, None})(xs, w);
  for (int64_t i = 0; i < 3; ++i) check_all_close(take_example(batched, 0, i), grad_w(take_example(xs, 0, i), w));
}

TEST_CASE("dot_general: staged reverse pass in JAX's text") {
  Array x = jnp::ones({2, 3});
  auto backward = [&](const Array& w, const Array& ct) {
    auto [out, f_vjp] = vjp([&](const Array& ww) { return lax::dot_general(x, ww, dims({1}, {0})); }, w);
    return std::get<0>(f_vjp(ct));
  };
  std::string t = text(make_jaxpr(backward)(jnp::ones({3, 4}), jnp::ones({2, 4})));
  // JAX's _dot_general_transpose_rhs: contract the cotangent with x over the rows, then transpose
  // (4, 3) back to w's (3, 4). The unused forward product stays, printed as `_`, as in JAX.
  CHECK(t == R"({ lambda a:f32[2,3]; b:f32[3,4] c:f32[2,4]. let
    _:f32[2,4] = dot_general[
      dimension_numbers=(([1], [0]), ([], []))
      out_sharding=None
      precision=None
      preferred_element_type=None
    ] a b
    d:f32[4,3] = dot_general[
      dimension_numbers=(([0], [0]), ([], []))
      out_sharding=None
      precision=None
      preferred_element_type=None
    ] c a
    e:f32[3,4] = transpose[permutation=(1, 0)] d
  in (e,) })");
  // The cotangent of the lhs comes back through an identity transpose, bound as JAX binds it.
  auto backward_lhs = [&](const Array& xx, const Array& ct) {
    auto [out, f_vjp] = vjp([&](const Array& a) { return lax::dot_general(a, jnp::ones({3, 4}), dims({1}, {0})); }, xx);
    return std::get<0>(f_vjp(ct));
  };
  std::string t2 = text(make_jaxpr(backward_lhs)(x, jnp::ones({2, 4})));
  CHECK(t2.find(R"(    d:f32[2,3] = dot_general[
      dimension_numbers=(([1], [1]), ([], []))
      out_sharding=None
      precision=None
      preferred_element_type=None
    ] c a
    e:f32[2,3] = transpose[permutation=(0, 1)] d
  in (e,) })") != std::string::npos);
}

TEST_CASE("conv_general_dilated: check_grads, f64, orders 1 and 2, forward and reverse") {
  uint32_t seed = 40;
  for (const ConvCase& c : kConvCases) {
    CAPTURE(c.name);
    auto f = [&](const VA& a) { return VA{conv_of(c, a[0], a[1])}; };
    CHECK_NOTHROW(check_grads(f, {rnd(seed, c.lhs), rnd(seed + 1, c.rhs)}, {.order = 2}));
    seed += 2;
  }
}

TEST_CASE("conv_general_dilated: grad against a closed form") {
  // 1-D valid conv with a width-1 kernel is a matmul over features: d/dw sum(out) = sum over
  // batch and positions of lhs.
  Array l = rnd(60, {2, 3, 5}), w = rnd(61, {4, 3, 1});
  auto loss = [](const Array& ll, const Array& ww) {
    return jnp::sum(lax::conv_general_dilated(ll, ww, {1}, "VALID", {}, {}, kNCH));
  };
  auto [gl, gw] = grad(loss, argnums<0, 1>)(l, w);
  check_all_close(gw, lax::broadcast_in_dim(jnp::sum(l, {0, 2}), {4, 3, 1}, {1}));
  check_all_close(gl, lax::broadcast_in_dim(jnp::sum(w, {0, 2}), {2, 3, 5}, {1}));
}

TEST_CASE("conv_general_dilated: preferred_element_type and f32 gradients") {
  Array l = rnd(62, {1, 2, 5, 4}, f32), w = rnd(63, {3, 2, 2, 2}, f32);
  auto f = [](const VA& a) { return VA{lax::conv_general_dilated(a[0], a[1], {1, 1}, "SAME", {}, {}, {}, 1, f64)}; };
  CHECK_NOTHROW(check_grads(f, {l, w}, {.order = 1}));
  auto loss = [](const Array& ll, const Array& ww) {
    return jnp::sum(lax::conv_general_dilated(ll, ww, {1, 1}, "SAME", {}, {}, {}, 1, f64));
  };
  auto [gl, gw] = grad(loss, argnums<0, 1>)(l, w);
  CHECK(gl.dtype() == f32);
  CHECK(gw.dtype() == f32);
}

TEST_CASE("conv_general_dilated: vmap equals stacked per-example results") {
  for (const ConvCase& c : kConvCases) {
    CAPTURE(c.name);
    auto f = [&](const VA& a) { return conv_of(c, a[0], a[1]); };
    auto with_axis = [](Shape s, int axis, int64_t B) {
      s.insert(s.begin() + (axis < 0 ? int(s.size()) + 1 + axis : axis), B);
      return s;
    };
    Array l = rnd(70, c.lhs), r = rnd(71, c.rhs);
    check_vmap_matches_stack(f, {rnd(72, with_axis(c.lhs, 0, 2)), r}, {0, std::nullopt}, 2);
    check_vmap_matches_stack(f, {rnd(73, with_axis(c.lhs, -1, 2)), r}, {-1, std::nullopt}, 2);
    check_vmap_matches_stack(f, {l, rnd(74, with_axis(c.rhs, 1, 3))}, {std::nullopt, 1}, 3);
    check_vmap_matches_stack(f, {l, rnd(75, with_axis(c.rhs, -1, 2))}, {std::nullopt, -1}, 2);
    check_vmap_matches_stack(f, {rnd(76, with_axis(c.lhs, 2, 2)), rnd(77, with_axis(c.rhs, 0, 2))}, {2, 0}, 2);
  }
}

TEST_CASE("conv_general_dilated: vmap of a gradient") {
  const ConvCase& c = kConvCases[5];  // feature groups
  auto loss = [&](const Array& l, const Array& r) { return jnp::sum(jnp::sin(conv_of(c, l, r))); };
  Array ls = rnd(80, {2, 2, 4, 6, 5}), r = rnd(81, c.rhs);
  auto grad_r = [&](const Array& l, const Array& rr) { return grad(loss, argnums<1>)(l, rr); };
  Array batched = vmap(grad_r, {0, None})(ls, r);
  for (int64_t i = 0; i < 2; ++i) check_all_close(take_example(batched, 0, i), grad_r(take_example(ls, 0, i), r));
}
