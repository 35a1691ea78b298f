// Rules of gather and the scatters (autodiff/rules_gather_scatter.cpp): numerical gradient checks
// (f64, orders 1 and 2, forward and reverse) through numpy indexing, .at[] updates and raw lax
// calls, grads against closed forms (duplicate indices, ties), vmap against stacked per-example
// results with batched/unbatched operands, indices and updates.
#include <doctest/doctest.h>

#include <optional>

#include "autodiff/check_grads.h"
#include "cjax/cjax.h"
#include "core/lax/gather_scatter.h"
#include "test_util.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;
using lax::GatherScatterMode;

namespace {

using VA = std::vector<Array>;
using Axes = std::vector<std::optional<int>>;

Array rnd(uint32_t seed, const Shape& shape) { return random::normal(random::key(seed), shape, f64); }
Array ints(const std::vector<double>& v, Shape s = {}) { return arr<int32_t>(v, std::move(s)); }

// Rows of a (5, 3) operand picked by an index vector: gather collapsing dim 0.
const lax::GatherDimensionNumbers kRows{{1}, {0}, {0}, {}, {}};
const lax::ScatterDimensionNumbers kRowUpdates{{1}, {0}, {0}, {}, {}};
// Rows from (B, 5, 3) with per-example indices (B, 2, 1): operand/indices batching dims.
const lax::GatherDimensionNumbers kBatchedRows{{2}, {1}, {1}, {0}, {0}};
const lax::ScatterDimensionNumbers kBatchedRowUpdates{{2}, {1}, {1}, {0}, {0}};

Array scatter_prim(ScatterKind kind, const Array& x, const Array& idx, const Array& u,
                   const lax::ScatterDimensionNumbers& dn, GatherScatterMode mode = GatherScatterMode::fill_or_drop,
                   bool unique = false) {
  return scatter_with(kind, x, idx, u, dn, mode, false, unique);
}

}  // namespace

TEST_CASE("gather: check_grads through indexing, take_along_axis and raw lax.gather") {
  Array x = rnd(1, {5, 3});
  Array idx = ints({4, 0, 2, 0}, {4});  // a repeated row: its cotangents add up
  auto index = [&](const VA& a) { return VA{a[0][idx]}; };
  CHECK_NOTHROW(check_grads(index, {x}, {.order = 2}));
  auto index2 = [&](const VA& a) { return VA{a[0][{Index(ints({1, 3}, {2})), Slice(0, 2)}]}; };
  CHECK_NOTHROW(check_grads(index2, {x}, {.order = 2}));
  Array along = ints({0, 2, 1, 1, 0, 0, 2, 2, 1, 0, 1, 2, 2, 0, 1}, {5, 3});
  auto tal = [&](const VA& a) { return VA{jnp::take_along_axis(a[0], along, 1)}; };
  CHECK_NOTHROW(check_grads(tal, {x}, {.order = 2}));
  // out-of-bounds starts: clip clamps them, fill_or_drop reads the fill value (no gradient)
  Array oob = ints({-2, 1, 7, 4}, {4, 1});
  for (auto mode : {GatherScatterMode::clip, GatherScatterMode::fill_or_drop}) {
    CAPTURE(int(mode));
    auto g = [&](const VA& a) { return VA{lax::gather(a[0], oob, kRows, {1, 3}, mode, 0.5)}; };
    CHECK_NOTHROW(check_grads(g, {x}, {.order = 2}));
  }
  auto g_batched = [&](const VA& a) {
    return VA{lax::gather(a[0], ints({1, 4, 0, 0}, {2, 2, 1}), kBatchedRows, {1, 1, 3})};
  };
  CHECK_NOTHROW(check_grads(g_batched, {rnd(2, {2, 5, 3})}, {.order = 2}));
}

TEST_CASE("gather: grads against closed forms") {
  Array x = rnd(3, {5, 3});
  Array g = grad([](const Array& a) { return jnp::sum(a[ints({4, 0, 2, 0}, {4})]); })(x);
  CHECK(vals(g) == std::vector<double>{2, 2, 2, 0, 0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1});
  // fill_or_drop: the out-of-bounds row gets no gradient; clip: it lands on the clamped row.
  Array oob = ints({7, 1}, {2, 1});
  auto summed = [&](GatherScatterMode mode) {
    return [&oob, mode](const Array& a) { return jnp::sum(lax::gather(a, oob, kRows, {1, 3}, mode, 0.0)); };
  };
  Array gf = grad(summed(GatherScatterMode::fill_or_drop))(x);
  CHECK(vals(gf) == std::vector<double>{0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  Array gc = grad(summed(GatherScatterMode::clip))(x);
  CHECK(vals(gc) == std::vector<double>{0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1});
}

TEST_CASE("gather: the transpose is a scatter-add (staged)") {
  auto backward = [](const Array& x, const Array& ct) {
    auto [out, f_vjp] = vjp([](const Array& a) { return lax::gather(a, ints({2, 0}, {2, 1}), kRows, {1, 3}); }, x);
    return std::get<0>(f_vjp(ct));
  };
  std::string t = text(make_jaxpr(backward)(rnd(4, {5, 3}), rnd(5, {2, 3})));
  // As JAX's _gather_transpose_fancy: zeros (lax.full) scatter-added with the matching numbers.
  CHECK(t.find(R"(    d:f64[5,3] = broadcast_in_dim[
      broadcast_dimensions=()
      shape=(5, 3)
      sharding=None
    ] 0.0:f64[]
    e:f64[5,3] = scatter-add[
      dimension_numbers=ScatterDimensionNumbers(update_window_dims=(1,), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,), operand_batching_dims=(), scatter_indices_batching_dims=())
      indices_are_sorted=False
      mode=GatherScatterMode.FILL_OR_DROP
      unique_indices=False
      update_consts=()
      update_jaxpr=None
    ] d a c
  in (e,) })") != std::string::npos);
}

TEST_CASE("scatter-add: check_grads with duplicate indices, and grads") {
  Array x = rnd(6, {5, 3}), u = rnd(7, {4, 3});
  Array idx = ints({1, 3, 1, 1}, {4});
  auto add = [&](const VA& a) { return VA{a[0].at(idx).add(a[1])}; };
  CHECK_NOTHROW(check_grads(add, {x, u}, {.order = 2}));
  auto raw = [&](const VA& a) {
    return VA{lax::scatter_add(a[0], ints({-1, 2, 9, 2}, {4, 1}), a[1], kRowUpdates, GatherScatterMode::clip)};
  };
  CHECK_NOTHROW(check_grads(raw, {x, u}, {.order = 2}));
  auto loss = [&](const Array& xx, const Array& uu) { return jnp::sum(jnp::sin(xx.at(idx).add(uu))); };
  auto [gx, gu] = grad(loss, argnums<0, 1>)(x, u);
  Array out = x.at(idx).add(u);
  check_all_close(gx, jnp::cos(out));
  check_all_close(gu, jnp::cos(out)[idx]);  // each update sees the cotangent of the row it lands on
}

TEST_CASE("scatter (overwrite): check_grads with and without unique indices") {
  Array x = rnd(8, {5, 3}), u = rnd(9, {4, 3});
  Array dup = ints({1, 3, 1, 0}, {4});
  auto set = [&](const VA& a) { return VA{a[0].at(dup).set(a[1])}; };
  CHECK_NOTHROW(check_grads(set, {x, u}, {.order = 2}));
  Array uniq = ints({4, 1, 0, 2}, {4, 1});
  auto set_unique = [&](const VA& a) {
    return VA{scatter_prim(ScatterKind::Set, a[0], uniq, a[1], kRowUpdates, GatherScatterMode::fill_or_drop, true)};
  };
  CHECK_NOTHROW(check_grads(set_unique, {x, u}, {.order = 2}));
  // The overwritten operand rows get no gradient; with duplicates only the winning update does.
  auto loss = [&](const Array& xx, const Array& uu) { return jnp::sum(xx.at(dup).set(uu) * 2.0); };
  auto [gx, gu] = grad(loss, argnums<0, 1>)(x, u);
  CHECK(vals(gx) == std::vector<double>{0, 0, 0, 0, 0, 0, 2, 2, 2, 0, 0, 0, 2, 2, 2});
  Array won = lax::eq(x.at(dup).set(u)[dup], u);  // which of the duplicates landed
  check_all_close(gu, jnp::where(won, jnp::full({4, 3}, 2.0, f64), jnp::zeros({4, 3}, f64)));
  CHECK(vals(jnp::sum(gu)) == std::vector<double>{18});  // three distinct rows of three, times 2
}

TEST_CASE("scatter (overwrite): transpose needs unique indices, as in JAX") {
  auto backward = [](const Array& u, const Array& ct) {
    auto lin = [](const Array& uu) {
      return lax::scatter(jnp::zeros({5, 3}, f64), ints({1, 1}, {2, 1}), uu, kRowUpdates);
    };
    auto [out, f_vjp] = vjp(lin, u);
    return std::get<0>(f_vjp(ct));
  };
  // The JVP of a non-unique scatter is built from scatter-adds, so its vjp works.
  Array g = backward(jnp::ones({2, 3}, f64), jnp::ones({5, 3}, f64));
  CHECK(vals(jnp::sum(g)) == std::vector<double>{3});
}

TEST_CASE("scatter-mul: check_grads with duplicates (including a zero update) and unique indices") {
  Array x = rnd(10, {5, 3}), u = rnd(11, {4, 3});
  Array dup = ints({1, 3, 1, 1}, {4});
  auto mul = [&](const VA& a) { return VA{a[0].at(dup).multiply(a[1])}; };
  CHECK_NOTHROW(check_grads(mul, {x, u}, {.order = 2}));
  Array uniq = ints({4, 1, 0, 2}, {4, 1});
  auto mul_unique = [&](const VA& a) {
    return VA{scatter_prim(ScatterKind::Mul, a[0], uniq, a[1], kRowUpdates, GatherScatterMode::fill_or_drop, true)};
  };
  CHECK_NOTHROW(check_grads(mul_unique, {x, u}, {.order = 2}));
  // d/du_i prod_k u_k at a zero update: the product of the others, exact.
  Array u0 = arr<double>({2, 0, 3, 5}, {4, 1}), x0 = arr<double>({1, 7}, {2, 1});
  Array rows = ints({0, 0, 0, 1}, {4});
  auto [gx, gu] =
      grad([&](const Array& xx, const Array& uu) { return jnp::sum(xx.at(rows).multiply(uu)); }, argnums<0, 1>)(x0, u0);
  CHECK(vals(gu) == std::vector<double>{0, 6, 0, 7});
  CHECK(vals(gx) == std::vector<double>{0, 5});
  Array u00 = arr<double>({2, 0, 0, 5}, {4, 1});  // two zeros to one row: every partial is zero
  Array gu00 = grad([&](const Array& uu) { return jnp::sum(x0.at(rows).multiply(uu)); })(u00);
  CHECK(vals(gu00) == std::vector<double>{0, 0, 0, 7});
}

TEST_CASE("scatter-min / scatter-max: check_grads away from ties, and ties share the tangent") {
  Array x = rnd(12, {5, 3}), u = rnd(13, {4, 3});
  Array dup = ints({1, 3, 1, 1}, {4});
  auto mn = [&](const VA& a) { return VA{a[0].at(dup).min(a[1])}; };
  auto mx = [&](const VA& a) { return VA{a[0].at(dup).max(a[1])}; };
  CHECK_NOTHROW(check_grads(mn, {x, u}, {.order = 2}));
  CHECK_NOTHROW(check_grads(mx, {x, u}, {.order = 2}));
  // operand 1 at row 0 ties with two updates of 1: each of the three gets a third.
  Array x0 = arr<double>({1, -4}, {2}), u0 = arr<double>({1, 1, 0.5, -5}, {4});
  Array rows = ints({0, 0, 0, 1}, {4});
  auto [gx, gu] =
      grad([&](const Array& xx, const Array& uu) { return jnp::sum(xx.at(rows).max(uu)); }, argnums<0, 1>)(x0, u0);
  check_all_close(gx, arr<double>({1.0 / 3, 1}));
  check_all_close(gu, arr<double>({1.0 / 3, 1.0 / 3, 0, 0}));
}

TEST_CASE("gather: vmap equals stacked per-example results") {
  auto rows = [](const VA& a) { return lax::gather(a[0], a[1], kRows, {1, 3}); };
  Array x = rnd(20, {5, 3}), idx = ints({4, 0, 2}, {3, 1});
  Array xs0 = rnd(21, {2, 5, 3}), xs1 = rnd(22, {5, 2, 3}), xsl = rnd(23, {5, 3, 2});
  Array is0 = ints({4, 0, 2, 1, 1, 3}, {2, 3, 1}), is1 = ints({4, 0, 2, 1, 1, 3}, {3, 2, 1});
  Array isl = ints({4, 0, 2, 1, 1, 3}, {3, 1, 2});
  check_vmap_matches_stack(rows, {xs0, idx}, {0, std::nullopt}, 2);
  check_vmap_matches_stack(rows, {xs1, idx}, {1, std::nullopt}, 2);
  check_vmap_matches_stack(rows, {xsl, idx}, {-1, std::nullopt}, 2);
  check_vmap_matches_stack(rows, {x, is0}, {std::nullopt, 0}, 2);
  check_vmap_matches_stack(rows, {x, is1}, {std::nullopt, 1}, 2);
  check_vmap_matches_stack(rows, {x, isl}, {std::nullopt, -1}, 2);
  check_vmap_matches_stack(rows, {xs1, is0}, {1, 0}, 2);
  check_vmap_matches_stack(rows, {xsl, is1}, {-1, 1}, 2);
  // clip / fill modes and a gather that already has batching dims
  auto clipped = [](const VA& a) { return lax::gather(a[0], a[1], kRows, {1, 3}, GatherScatterMode::clip); };
  auto filled = [](const VA& a) {
    return lax::gather(a[0], a[1], kRows, {1, 3}, GatherScatterMode::fill_or_drop, -1.0);
  };
  Array oob = ints({7, 0, -3, 2, 5, 4}, {2, 3, 1});
  check_vmap_matches_stack(clipped, {xs0, oob}, {0, 0}, 2);
  check_vmap_matches_stack(filled, {x, oob}, {std::nullopt, 0}, 2);
  check_vmap_matches_stack(filled, {xs1, oob}, {1, 0}, 2);
  auto brows = [](const VA& a) { return lax::gather(a[0], a[1], kBatchedRows, {1, 1, 3}); };
  Array bx = rnd(24, {3, 2, 5, 3}), bi = ints({1, 4, 0, 0, 2, 2, 3, 1, 0, 4, 4, 4}, {2, 2, 3, 1});
  check_vmap_matches_stack(brows, {bx, bi}, {0, 2}, 3);
  check_vmap_matches_stack(brows, {bx, take_example(bi, 2, 0)}, {0, std::nullopt}, 3);
  check_vmap_matches_stack(brows, {take_example(bx, 0, 0), bi}, {std::nullopt, 2}, 3);
  // numpy-style indexing and take_along_axis under vmap
  check_vmap_matches_stack([](const VA& a) { return a[0][a[1]]; }, {xs0, ints({4, 0, 4, 1, 2, 2}, {2, 3})}, {0, 0}, 2);
  check_vmap_matches_stack([](const VA& a) { return jnp::take_along_axis(a[0], a[1], 0); },
                           {xs1, ints({4, 0, 4, 1, 2, 2, 0, 0, 1, 3, 3, 3}, {2, 2, 3})}, {1, 0}, 2);
}

TEST_CASE("scatters: vmap equals stacked per-example results") {
  for (ScatterKind kind : {ScatterKind::Set, ScatterKind::Add, ScatterKind::Mul, ScatterKind::Min, ScatterKind::Max}) {
    CAPTURE(int(kind));
    auto f = [kind](const VA& a) { return scatter_prim(kind, a[0], a[1], a[2], kRowUpdates); };
    Array x = rnd(30, {5, 3}), idx = ints({4, 0, 4}, {3, 1}), u = rnd(31, {3, 3});
    Array xs = rnd(32, {5, 2, 3}), is = ints({4, 0, 4, 1, 9, 1}, {2, 3, 1}), us = rnd(33, {3, 3, 2});
    check_vmap_matches_stack(f, {xs, idx, u}, {1, std::nullopt, std::nullopt}, 2);
    check_vmap_matches_stack(f, {x, is, u}, {std::nullopt, 0, std::nullopt}, 2);
    check_vmap_matches_stack(f, {x, idx, us}, {std::nullopt, std::nullopt, -1}, 2);
    check_vmap_matches_stack(f, {xs, is, us}, {1, 0, -1}, 2);
    check_vmap_matches_stack(f, {x, is, us}, {std::nullopt, 0, 2}, 2);
    check_vmap_matches_stack(f, {xs, idx, us}, {1, std::nullopt, 2}, 2);
    auto fb = [kind](const VA& a) { return scatter_prim(kind, a[0], a[1], a[2], kBatchedRowUpdates); };
    Array bx = rnd(34, {2, 2, 5, 3}), bi = ints({1, 4, 1, 0, 2, 2, 3, 1}, {2, 2, 2, 1}), bu = rnd(35, {2, 2, 3, 2});
    check_vmap_matches_stack(fb, {bx, bi, bu}, {1, 0, 3}, 2);
    check_vmap_matches_stack(fb, {take_example(bx, 1, 0), bi, bu}, {std::nullopt, 0, 3}, 2);
  }
}

TEST_CASE("scatter and gather: gradients under vmap agree with per-example gradients") {
  Array xs = rnd(40, {3, 5, 2}), u = rnd(41, {4, 2});
  Array idx = ints({1, 3, 1, 0}, {4});
  auto loss = [&](const Array& x, const Array& uu) {
    return jnp::sum(jnp::sin(x.at(idx).set(uu)[ints({0, 1, 1}, {3})]));
  };
  auto both = [&](const Array& x, const Array& uu) { return grad(loss, argnums<0, 1>)(x, uu); };
  auto [gx, gu] = vmap(both, {0, None})(xs, u);
  for (int64_t i = 0; i < 3; ++i) {
    auto [ex, eu] = both(take_example(xs, 0, i), u);
    check_all_close(take_example(gx, 0, i), ex);
    check_all_close(take_example(gu, 0, i), eu);
  }
}
