// Collectives over a vmapped axis (JAX's vmap(f, axis_name='b')): inside f, lax::psum(x, "b")
// and the other collectives act over the batch, the examples being the group's members — the
// same values as a loop over the examples that applies the collective's definition. Also with
// grad and jit, nested vmaps, and vmap inside shard_map and shard_map inside vmap.
#include <cmath>

#include "test_util.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {
using VA = std::vector<Array>;
Array arange_f(int64_t n) { return jnp::arange(n).astype(f32); }
VmapOptions named(const char* name) { return {.axis_name = name}; }

// The examples of `xs` along axis 0.
VA examples(const Array& xs) {
  VA out;
  for (int64_t b = 0; b < xs.shape()[0]; ++b) out.push_back(take_example(xs, 0, b));
  return out;
}
Array chunk(const Array& x, int64_t dim, int64_t k, int64_t n) {
  int64_t size = x.shape()[size_t(dim)] / n;
  return lax::slice_in_dim(x, k * size, (k + 1) * size, 1, dim);
}
// Loop references: member k's result from every member's operand, by the definitions of
// include/cjax/collectives.h.
Array ref_all_gather(const VA& xs, int64_t axis, bool tiled) {
  if (tiled) return jnp::concatenate(xs, axis);
  return jnp::stack(xs, axis);
}
Array ref_psum_scatter(const VA& xs, int64_t k, int64_t dim, bool tiled) {
  Array s;
  for (const Array& x : xs) {
    Array c = chunk(x, dim, k, int64_t(xs.size()));
    s = s.defined() ? s + c : c;
  }
  return tiled ? s : jnp::squeeze(s, dim);
}
Array ref_all_to_all(const VA& xs, int64_t k, int64_t split, int64_t concat, bool tiled) {
  VA parts;
  for (const Array& x : xs) parts.push_back(chunk(x, split, k, int64_t(xs.size())));
  if (tiled) return jnp::concatenate(parts, concat);
  for (Array& p : parts) p = jnp::squeeze(p, split);
  return jnp::stack(parts, concat);
}
}  // namespace

TEST_CASE("the test runs with 8 CPU devices") { REQUIRE(device_count() == 8); }

TEST_CASE("psum over the vmapped axis sums over the batch: x / psum(x) normalizes") {
  auto f = vmap([](const Array& x) { return x / lax::psum(x, "b"); }, 0, 0, named("b"));
  Array x = jnp::array<float>({1, 2, 3, 4});
  check_all_close(f(x), jnp::array<float>({0.1f, 0.2f, 0.3f, 0.4f}));
  check_all_close(jit(f)(x), jnp::array<float>({0.1f, 0.2f, 0.3f, 0.4f}));
  // Examples that are vectors: the sum is over the batch only, element by element.
  Array xs = arange_f(6).reshape({3, 2}) + 1.f;  // rows [1 2] [3 4] [5 6]: column sums 9, 12
  Array got = vmap([](const Array& r) { return lax::psum(r, "b"); }, 0, 0, named("b"))(xs);
  CHECK(got.shape() == Shape{3, 2});
  CHECK(vals(got) == std::vector<double>{9, 12, 9, 12, 9, 12});
  // A batch on axis 1 and a result moved to axis 1.
  Array t = vmap([](const Array& c) { return c / lax::psum(c, "b"); }, 1, 1, named("b"))(xs.T());
  check_all_close(t, (xs / jnp::sum(xs, 0, true)).T());
}

TEST_CASE("pmean, pmax, pmin over the batch; psum of an unbatched value multiplies by the batch size") {
  Array x = jnp::array<float>({3, 1, 4, 1, 5});
  auto with = [&](auto op) { return vmap([op](const Array& e) { return op(e); }, 0, 0, named("b"))(x); };
  CHECK(vals(with([](const Array& e) { return lax::pmax(e, "b"); })) == std::vector<double>{5, 5, 5, 5, 5});
  CHECK(vals(with([](const Array& e) { return lax::pmin(e, "b"); })) == std::vector<double>{1, 1, 1, 1, 1});
  check_all_close(with([](const Array& e) { return lax::pmean(e, "b"); }), jnp::full({5}, 2.8f));
  CHECK(vals(with([](const Array& e) { return e - lax::pmax(e, "b"); })) == std::vector<double>{-2, -4, -1, -4, 0});
  CHECK(vmap([](const Array& e) { return lax::axis_size("b") + 0 * e; }, 0, 0, named("b"))(x)
            .astype(i32)
            .to_vector<int32_t>() == std::vector<int32_t>{5, 5, 5, 5, 5});
  // Unbatched operands: a constant (the front end multiplies), and a traced value of an
  // enclosing jit (the batching rule multiplies).
  auto scale = [](const Array& e, const Array& w) { return e * lax::psum(w, "b"); };
  Array w = Array(2.f);
  CHECK(vals(vmap(scale, {0, None}, 0, named("b"))(x, w)) == std::vector<double>{30, 10, 40, 10, 50});
  CHECK(vals(jit(vmap(scale, {0, None}, 0, named("b")))(x, w)) == std::vector<double>{30, 10, 40, 10, 50});
  auto top = [](const Array& e, const Array& w) { return e + lax::pmax(w, "b"); };
  CHECK(vals(jit(vmap(top, {0, None}, 0, named("b")))(x, w)) == std::vector<double>{5, 3, 6, 3, 7});
}

TEST_CASE("axis_index is the batch index; pvary is the identity; pbroadcast takes one example") {
  Array x = jnp::full({4}, 10.f);
  auto idx = vmap([](const Array& e) { return e + lax::axis_index("b").astype(f32); }, 0, 0, named("b"));
  CHECK(vals(idx(x)) == std::vector<double>{10, 11, 12, 13});
  CHECK(vals(jit(idx)(x)) == std::vector<double>{10, 11, 12, 13});
  Array only = vmap([](const Array&) { return lax::axis_index("b"); }, 0, 0, named("b"))(x);
  CHECK(only.dtype() == i32);
  CHECK(only.to_vector<int32_t>() == std::vector<int32_t>{0, 1, 2, 3});
  Array xs = arange_f(8).reshape({4, 2});
  CHECK(vals(vmap([](const Array& e) { return lax::pvary(e, "b"); }, 0, 0, named("b"))(xs)) == vals(xs));
  Array bc = vmap([](const Array& e) { return lax::pbroadcast(e, "b", 2); }, 0, 0, named("b"))(xs);
  CHECK(vals(bc) == std::vector<double>{4, 5, 4, 5, 4, 5, 4, 5});
}

TEST_CASE("all_gather over the batch gives every example the whole batch") {
  Array xs = arange_f(6).reshape({3, 2});
  VA ex = examples(xs);
  for (bool tiled : {false, true})
    for (int axis : {0, 1}) {
      if (tiled && axis == 1) continue;  // out of bounds for a tiled gather of rank-1 examples
      CAPTURE(tiled);
      CAPTURE(axis);
      auto f = vmap([&](const Array& e) { return lax::all_gather(e, "b", {.axis = axis, .tiled = tiled}); }, 0, 0,
                    named("b"));
      Array got = f(xs);
      Array want = ref_all_gather(ex, axis, tiled);
      for (int64_t b = 0; b < 3; ++b) check_all_close(take_example(got, 0, b), want);
      check_all_close(jit(f)(xs), got);
    }
  // Concretely: stacked along axis 1 of each [2] example gives [2, 3] = xs.T.
  Array t = vmap([](const Array& e) { return lax::all_gather(e, "b", {.axis = 1}); }, 0, 0, named("b"))(xs);
  CHECK(t.shape() == Shape{3, 2, 3});
  check_all_close(take_example(t, 0, 1), xs.T());
  // An unbatched operand under jit: every member contributes the same value.
  auto g = jit(vmap([](const Array& e, const Array& w) { return e + jnp::sum(lax::all_gather(w, "b")); }, {0, None}, 0,
                    named("b")));
  CHECK(vals(g(arange_f(3), Array(2.f))) == std::vector<double>{6, 7, 8});
}

TEST_CASE("psum_scatter over the batch: member k gets the sum of chunk k") {
  Array sq = arange_f(9).reshape({3, 3});  // example j: row j; member k gets sum_j xs[j][k]
  Array got = vmap([](const Array& e) { return lax::psum_scatter(e, "b"); }, 0, 0, named("b"))(sq);
  CHECK(vals(got) == std::vector<double>{9, 12, 15});
  Array xs = arange_f(3 * 6).reshape({3, 6});
  VA ex = examples(xs);
  auto f = vmap([](const Array& e) { return lax::psum_scatter(e, "b", {.tiled = true}); }, 0, 0, named("b"));
  Array tiled = f(xs);
  CHECK(tiled.shape() == Shape{3, 2});
  for (int64_t k = 0; k < 3; ++k) check_all_close(take_example(tiled, 0, k), ref_psum_scatter(ex, k, 0, true));
  check_all_close(jit(f)(xs), tiled);
  // A rank-2 example scattered along its dimension 1.
  Array m = arange_f(3 * 2 * 3).reshape({3, 2, 3});
  Array r =
      vmap([](const Array& e) { return lax::psum_scatter(e, "b", {.scatter_dimension = 1}); }, 0, 0, named("b"))(m);
  VA mex = examples(m);
  for (int64_t k = 0; k < 3; ++k) check_all_close(take_example(r, 0, k), ref_psum_scatter(mex, k, 1, false));
}

TEST_CASE("ppermute over the batch: a shift, and zeros where no example sends") {
  Array xs = arange_f(8).reshape({4, 2}) + 1.f;
  std::vector<std::pair<int, int>> shift = {{0, 1}, {1, 2}, {2, 3}, {3, 0}};
  auto f = vmap([&](const Array& e) { return lax::ppermute(e, "b", shift); }, 0, 0, named("b"));
  CHECK(vals(f(xs)) == std::vector<double>{7, 8, 1, 2, 3, 4, 5, 6});
  CHECK(vals(jit(f)(xs)) == std::vector<double>{7, 8, 1, 2, 3, 4, 5, 6});
  auto partial = vmap([](const Array& e) { return lax::ppermute(e, "b", {{0, 1}, {1, 2}}); }, 0, 0, named("b"));
  CHECK(vals(partial(xs)) == std::vector<double>{0, 0, 1, 2, 3, 4, 0, 0});
  // Batch on axis 1.
  Array t = vmap([&](const Array& e) { return lax::ppermute(e, "b", shift); }, 1, 1, named("b"))(xs.T());
  CHECK(vals(t.T()) == std::vector<double>{7, 8, 1, 2, 3, 4, 5, 6});
}

TEST_CASE("all_to_all over the batch equals the loop reference") {
  const int64_t B = 2;
  struct Case {
    Shape example;
    int split, concat;
    bool tiled;
  };
  for (Case c :
       {Case{{2, 3}, 0, 1, false}, Case{{3, 2}, 1, 0, false}, Case{{2, 3}, 0, 0, false}, Case{{4, 3}, 0, 1, true},
        Case{{2, 4}, 1, 0, true}, Case{{4, 2}, 0, 0, true}, Case{{2, 6}, 1, 1, true}}) {
    CAPTURE(c.split);
    CAPTURE(c.concat);
    CAPTURE(c.tiled);
    Shape s = c.example;
    s.insert(s.begin(), B);
    Array xs = arange_f(shape_size(s)).reshape(s);
    VA ex = examples(xs);
    auto f = vmap([&](const Array& e) { return lax::all_to_all(e, "b", c.split, c.concat, {.tiled = c.tiled}); }, 0, 0,
                  named("b"));
    Array got = f(xs);
    for (int64_t k = 0; k < B; ++k)
      check_all_close(take_example(got, 0, k), ref_all_to_all(ex, k, c.split, c.concat, c.tiled));
    check_all_close(jit(f)(xs), got);
  }
  // By hand: examples [[0 1] [2 3]] and [[4 5] [6 7]], split rows, stack the pieces as columns.
  Array xs = arange_f(8).reshape({2, 2, 2});
  Array got = vmap([](const Array& e) { return lax::all_to_all(e, "b", 0, 1); }, 0, 0, named("b"))(xs);
  CHECK(vals(got) == std::vector<double>{0, 4, 1, 5, 2, 6, 3, 7});
}

TEST_CASE("grad and jit compose with collectives over the vmapped axis") {
  Array x = jnp::array<float>({1, 2, 3, 4});
  // L = sum_k x_k^2 / S with S = sum x: dL/dx_j = 2 x_j / S - sum x^2 / S^2 = 0.2 x_j - 0.3.
  auto per = [](const Array& e) { return e * e / lax::psum(e, "b"); };
  auto loss = [per](const Array& xs) { return jnp::sum(vmap(per, 0, 0, named("b"))(xs)); };
  std::vector<float> want = {-0.1f, 0.1f, 0.3f, 0.5f};
  check_all_close(grad(loss)(x), jnp::array<float>(want), 1e-5);
  check_all_close(jit(grad(loss))(x), jnp::array<float>(want), 1e-5);
  // Per-example gradients with psum's transpose a psum (JAX's semantics: the gradient of the sum
  // of every example's output) give the same values.
  auto per_grad = vmap(grad(per), 0, 0, named("b"));
  check_all_close(per_grad(x), jnp::array<float>(want), 1e-5);
  check_all_close(jit(per_grad)(x), jnp::array<float>(want), 1e-5);
  // A jit inside the vmap: its body is batched with the named axis.
  auto inner_jit = vmap(jit(per), 0, 0, named("b"));
  check_all_close(inner_jit(x), x * x / 10.f, 1e-6);
  // all_gather's transpose (psum_scatter) under grad: L = sum_k (x_k * sum_j x_j) = S^2.
  auto gather_loss = [](const Array& xs) {
    return jnp::sum(vmap([](const Array& e) { return e * jnp::sum(lax::all_gather(e, "b")); }, 0, 0, named("b"))(xs));
  };
  check_all_close(grad(gather_loss)(x), jnp::full({4}, 20.f), 1e-5);
  // ppermute's transpose: L = sum_k w_k * x_{k-1} -> dL/dx_j = w_{j+1}.
  Array w = jnp::array<float>({1, 10, 100, 1000});
  auto shift_loss = [w](const Array& xs) {
    auto f = vmap(
        [](const Array& e, const Array& we) {
          return we * lax::ppermute(e, "b", {{0, 1}, {1, 2}, {2, 3}, {3, 0}});
        },
        {0, 0}, 0, named("b"));
    return jnp::sum(f(xs, w));
  };
  CHECK(vals(grad(shift_loss)(x)) == std::vector<double>{10, 100, 1000, 1});
  CHECK(vals(jit(grad(shift_loss))(x)) == std::vector<double>{10, 100, 1000, 1});
}

TEST_CASE("nested vmaps resolve each axis name to its own level") {
  Array xs = arange_f(6).reshape({2, 3});  // outer 'b' over rows, inner 'c' over columns
  auto run = [&](const char* name) {
    return vmap(vmap([name](const Array& e) { return lax::psum(e, name); }, 0, 0, named("c")), 0, 0, named("b"))(xs);
  };
  CHECK(vals(run("c")) == std::vector<double>{3, 3, 3, 12, 12, 12});  // row sums
  CHECK(vals(run("b")) == std::vector<double>{3, 5, 7, 3, 5, 7});     // column sums
  Array both = vmap(vmap(
                        [](const Array& e) {
                          return lax::psum(e, {"b", "c"});
                        },
                        0, 0, named("c")),
                    0, 0, named("b"))(xs);
  CHECK(vals(both) == std::vector<double>(6, 15));
  Array ix = vmap(vmap(
                      [](const Array&) {
                        return lax::axis_index({"b", "c"});
                      },
                      0, 0, named("c")),
                  0, 0, named("b"))(xs);
  CHECK(iv(ix) == std::vector<int64_t>{0, 1, 2, 3, 4, 5});
  // The same name twice: the inner vmap shadows the outer one.
  Array shadow = vmap(vmap([](const Array& e) { return lax::psum(e, "b"); }, 0, 0, named("b")), 0, 0, named("b"))(xs);
  CHECK(vals(shadow) == std::vector<double>{3, 3, 3, 12, 12, 12});
}

TEST_CASE("a vmap inside shard_map uses both the batch axis and the mesh axis") {
  Mesh mesh = make_mesh({2}, {"i"});
  Array x = arange_f(12).reshape({4, 3}) + 1.f;  // device d holds rows 2d, 2d+1; the vmap runs over them
  auto rows = [](const Array& a, int64_t lo, int64_t hi) { return lax::slice_in_dim(a, lo, hi, 1, 0); };
  auto body = [](const Array& block) {
    return vmap(
        [](const Array& row) {
          Array all = lax::psum(row, {"i", "b"});              // over every row of x
          Array mine = lax::psum(row, "b");                    // over this device's rows
          Array gi = lax::axis_index({"i", "b"}).astype(f32);  // the row's index in x
          return std::tuple{row / all, mine, jnp::full({3}, 1.f) * gi};
        },
        0, 0, named("b"))(block);
  };
  auto f = shard_map(body, mesh, P("i"), P("i"));
  Array colsum = jnp::sum(x, 0, true);
  Array local = jnp::concatenate({jnp::broadcast_to(jnp::sum(rows(x, 0, 2), 0, true), {2, 3}),
                                  jnp::broadcast_to(jnp::sum(rows(x, 2, 4), 0, true), {2, 3})});
  for (bool jitted : {false, true}) {
    CAPTURE(jitted);
    auto [normalized, mine, index] = jitted ? jit(f)(x) : f(x);
    check_all_close(normalized, x / colsum, 1e-6);
    check_all_close(mine, local, 1e-6);
    check_all_close(index, jnp::broadcast_to(arange_f(4).reshape({4, 1}), {4, 3}), 1e-6);
  }
  // psum over the mesh axis alone inside the vmap: row b of each device summed across devices.
  auto over_i = shard_map(
      [](const Array& block) {
        return vmap([](const Array& r) { return lax::psum(r, "i"); }, 0, 0, named("b"))(block);
      },
      mesh, P("i"), P());
  check_all_close(over_i(x), rows(x, 0, 2) + rows(x, 2, 4), 1e-6);
  check_all_close(jit(over_i)(x), rows(x, 0, 2) + rows(x, 2, 4), 1e-6);
  // grad through both: L = sum_r sum_c x[r,c] / colsum[c] = 3 for every x, so the gradient is 0.
  auto loss = [&](const Array& a) { return jnp::sum(std::get<0>(f(a))); };
  check_all_close(grad(loss)(x), jnp::zeros({4, 3}), 1e-5);
  // L = sum of the local sums: each row counted twice (once per row of its device).
  auto local_loss = [&](const Array& a) { return jnp::sum(std::get<1>(f(a))); };
  check_all_close(grad(local_loss)(x), jnp::full({4, 3}, 2.f), 1e-5);
  check_all_close(jit(grad(local_loss))(x), jnp::full({4, 3}, 2.f), 1e-5);
}

TEST_CASE("a shard_map inside a named vmap: its body's collectives over the batch axis") {
  Mesh mesh = make_mesh({2}, {"i"});
  Array xs = arange_f(12).reshape({3, 4}) + 1.f;  // 3 examples of f32[4], each split over 'i'
  auto f = vmap(shard_map([](const Array& block) { return block / lax::psum(block, "b"); }, mesh, P("i"), P("i")), 0, 0,
                named("b"));
  check_all_close(f(xs), xs / jnp::sum(xs, 0, true), 1e-6);
  check_all_close(jit(f)(xs), xs / jnp::sum(xs, 0, true), 1e-6);
  auto g = vmap(shard_map([](const Array& block) { return lax::psum(lax::psum(block, "b"), "i"); }, mesh, P("i"), P()),
                0, 0, named("b"));
  Array cols = jnp::sum(xs, 0);  // per column over the batch, then the two halves added
  Array want = lax::slice_in_dim(cols, 0, 2, 1, 0) + lax::slice_in_dim(cols, 2, 4, 1, 0);
  for (int64_t b = 0; b < 3; ++b) check_all_close(take_example(g(xs), 0, b), want, 1e-6);
}

TEST_CASE("errors: an unbound name, and a vmapped axis mixed with other axes where that is not supported") {
  CHECK_ERR(lax::psum(jnp::ones({2}), "b"), AxisNameError, "unbound axis name: b");
  CHECK_ERR(vmap([](const Array& e) { return lax::psum(e, "c"); }, 0, 0, named("b"))(jnp::ones({2})), AxisNameError,
            "unbound axis name: c");
  Array xs = arange_f(6).reshape({2, 3});
  CHECK_ERR(vmap(vmap(
                     [](const Array& e) {
                       return lax::all_gather(e, {"b", "c"});
                     },
                     0, 0, named("c")),
                 0, 0, named("b"))(xs),
            ValueError, "all_gather", "one vmapped axis");
  CHECK_ERR(vmap([](const Array& e) { return lax::psum_scatter(e, "b"); }, 0, 0, named("b"))(xs), ValueError,
            "scatter dimension size 3 must match shard count 2");
}

TEST_CASE("spmd_axis_name with a collective over the vmapped axis inside the shard_map is refused") {
  Mesh mesh = make_mesh({2, 2}, {"y", "x"});
  auto f = shard_map([](const Array& a) { return a / lax::psum(a, "b"); }, mesh, P("x"), P("x"));
  CHECK_ERR(vmap(f, 0, 0, {.axis_name = "b", .spmd_axis_name = "y"})(arange_f(8).reshape({2, 4})), ValueError,
            "spmd_axis_name 'y' and axis_name 'b'", "not supported");
}
