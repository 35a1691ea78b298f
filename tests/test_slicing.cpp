// Slicing primitives: slice, dynamic_slice (clamped starts), dynamic_update_slice and the
// *_in_dim helpers. Expected values computed offline with numpy / by hand (XLA clamping).
#include <doctest/doctest.h>

#include <string>

#include "cjax/cjax.h"
#include "core/array/array_impl.h"
#include "core/lax/shape.h"
#include "test_util.h"

using namespace cjax;
namespace jnp = cjax::numpy;

using namespace cjax::testing;
using VI = std::vector<int32_t>;
using VF = std::vector<float>;
using VD = std::vector<double>;
namespace {
Array I(int64_t v, DType d = i32) { return make_scalar(double(v), d); }
}  // namespace

TEST_CASE("slice") {
  Array a = jnp::reshape(jnp::arange(35), {5, 7});
  Array s = lax::slice(a, {0, 1}, {5, 7}, {2, 3});
  CHECK(s.shape() == Shape{3, 2});
  CHECK(vec<int32_t>(s) == VI{1, 4, 15, 18, 29, 32});
  CHECK(vec<int32_t>(lax::slice(a, {1, 2}, {4, 3}, {2, 1})) == VI{9, 23});
  Array x = jnp::reshape(jnp::arange(12), {3, 4});
  CHECK(vec<int32_t>(lax::slice(x, {1, 1}, {3, 4})) == VI{5, 6, 7, 9, 10, 11});
  // to empty, of empty, of a scalar
  CHECK(lax::slice(x, {1, 2}, {1, 4}).shape() == Shape{0, 2});
  CHECK(lax::slice(jnp::zeros({0, 3}), {0, 1}, {0, 3}).shape() == Shape{0, 2});
  CHECK(vec<float>(lax::slice(make_scalar(4, f32), {}, {})) == VF{4});
  // every dtype
  for (DType d : kAllDTypes) {
    CAPTURE(dtype_name(d));
    Array t = lax::slice(idx_array({5, 7}, d), {0, 1}, {5, 7}, {2, 3});
    CHECK(t.dtype() == d);
    CHECK(vec<double>(t) == expect_idx({1, 4, 15, 18, 29, 32}, d));
  }
  // weak type kept
  CHECK(lax::slice(lax::broadcast_in_dim(Array(1.0f), {4}, {}), {1}, {3}).weak_type());
}

TEST_CASE("slice_in_dim") {
  Array x = jnp::arange(10);
  CHECK(vec<int32_t>(lax::slice_in_dim(x, -3, -1)) == VI{7, 8});
  CHECK(vec<int32_t>(lax::slice_in_dim(x, 1, 10, 4)) == VI{1, 5, 9});
  Array m = jnp::reshape(jnp::arange(12), {3, 4});
  CHECK(vec<int32_t>(lax::slice_in_dim(m, 1, 4, 2, -1)) == VI{1, 3, 5, 7, 9, 11});
  CHECK(lax::slice_in_dim(m, 2, 2, 1, 0).shape() == Shape{0, 4});
}

TEST_CASE("dynamic_slice clamps like XLA") {
  Array x = jnp::arange(10);
  CHECK(vec<int32_t>(lax::dynamic_slice(x, {I(2)}, {3})) == VI{2, 3, 4});
  CHECK(vec<int32_t>(lax::dynamic_slice(x, {I(8)}, {4})) == VI{6, 7, 8, 9});   // clamped to 6
  CHECK(vec<int32_t>(lax::dynamic_slice(x, {I(-3)}, {2})) == VI{7, 8});        // -3 -> 7
  CHECK(vec<int32_t>(lax::dynamic_slice(x, {I(-1)}, {4})) == VI{6, 7, 8, 9});  // -1 -> 9 -> 6
  CHECK(vec<int32_t>(lax::dynamic_slice(x, {I(-20)}, {2})) == VI{0, 1});       // -10 -> 0
  CHECK(vec<int32_t>(lax::dynamic_slice(x, {I(100, i64)}, {1})) == VI{9});
  CHECK(lax::dynamic_slice(x, {I(5)}, {0}).shape() == Shape{0});
  Array m = jnp::reshape(jnp::arange(20), {4, 5});
  CHECK(vec<int32_t>(lax::dynamic_slice(m, {I(1), I(3)}, {2, 2})) == VI{8, 9, 13, 14});
  CHECK(vec<int32_t>(lax::dynamic_slice(m, {I(5), I(-1)}, {2, 3})) == VI{12, 13, 14, 17, 18, 19});
  // index dtypes: int8, uint8, uint32, int64, mixed (converted to one)
  CHECK(vec<int32_t>(lax::dynamic_slice(m, {I(1, i8), I(1, i8)}, {1, 2})) == VI{6, 7});
  CHECK(vec<int32_t>(lax::dynamic_slice(m, {I(3, u8), I(0, u8)}, {1, 2})) == VI{15, 16});
  CHECK(vec<int32_t>(lax::dynamic_slice(m, {I(2, u32), I(4, u32)}, {1, 1})) == VI{14});
  CHECK(vec<int32_t>(lax::dynamic_slice(m, {I(2, i64), I(1, i32)}, {1, 1})) == VI{11});
  CHECK(vec<int32_t>(lax::dynamic_slice(m, {Array(1), Array(int64_t(2))}, {1, 1})) == VI{7});
  for (DType d : kAllDTypes) {
    CAPTURE(dtype_name(d));
    Array t = lax::dynamic_slice(idx_array({4, 5}, d), {I(1), I(3)}, {2, 2});
    CHECK(t.dtype() == d);
    CHECK(vec<double>(t) == expect_idx({8, 9, 13, 14}, d));
  }
  // scalar operand: no indices
  CHECK(vec<float>(lax::dynamic_slice(make_scalar(3, f32), {}, {})) == VF{3});
}

TEST_CASE("dynamic_update_slice clamps like XLA") {
  Array z = jnp::zeros({5}, i32);
  Array u = jnp::array<int32_t>({1, 2});
  CHECK(vec<int32_t>(lax::dynamic_update_slice(z, u, {I(1)})) == VI{0, 1, 2, 0, 0});
  CHECK(vec<int32_t>(lax::dynamic_update_slice(z, u, {I(4)})) == VI{0, 0, 0, 1, 2});
  CHECK(vec<int32_t>(lax::dynamic_update_slice(z, u, {I(-1)})) == VI{0, 0, 0, 1, 2});
  CHECK(vec<int32_t>(lax::dynamic_update_slice(z, u, {I(-9)})) == VI{1, 2, 0, 0, 0});
  // the operand is not modified
  CHECK(vec<int32_t>(z) == VI{0, 0, 0, 0, 0});
  Array m = jnp::reshape(jnp::arange(12), {3, 4});
  Array r = lax::dynamic_update_slice(m, jnp::array<int32_t>({-1, -2, -3, -4}, {2, 2}), {I(2), I(1)});
  CHECK(vec<int32_t>(r) == VI{0, 1, 2, 3, 4, -1, -2, 7, 8, -3, -4, 11});
  // empty update, zero-size operand
  CHECK(vec<int32_t>(lax::dynamic_update_slice(u, jnp::zeros({0}, i32), {I(1)})) == VI{1, 2});
  CHECK(lax::dynamic_update_slice(jnp::zeros({0, 2}), jnp::zeros({0, 1}), {I(0), I(1)}).shape() == Shape{0, 2});
  for (DType d : kAllDTypes) {
    CAPTURE(dtype_name(d));
    Array t = lax::dynamic_update_slice(idx_array({2, 3}, d), idx_array({1, 2}, d, 50), {I(1), I(1)});
    CHECK(t.dtype() == d);
    CHECK(vec<double>(t) == expect_idx({0, 1, 2, 3, 50, 51}, d));
  }
  // large: parallel copy paths
  const int64_t n = 512, k = 300;
  Array big = lax::dynamic_update_slice(jnp::zeros({n, n}), jnp::ones({k, k}), {I(400), I(-100)});
  auto v = vec<float>(big);
  // start clamped to (212, 212)
  bool ok = true;
  for (int64_t i = 0; i < n && ok; ++i)
    for (int64_t j = 0; j < n; ++j) ok = ok && v[size_t(i * n + j)] == ((i >= 212 && j >= 212) ? 1.f : 0.f);
  CHECK(ok);
}

TEST_CASE("*_in_dim helpers") {
  Array m = jnp::reshape(jnp::arange(12), {3, 4});
  Array a = lax::dynamic_slice_in_dim(m, I(1), 2, 0);
  CHECK(a.shape() == Shape{2, 4});
  CHECK(vec<int32_t>(a) == VI{4, 5, 6, 7, 8, 9, 10, 11});
  CHECK(vec<int32_t>(lax::dynamic_slice_in_dim(m, I(3), 2, -1)) == VI{2, 3, 6, 7, 10, 11});
  Array row = lax::dynamic_index_in_dim(m, I(1), 0, false);
  CHECK(row.shape() == Shape{4});
  CHECK(vec<int32_t>(row) == VI{4, 5, 6, 7});
  Array col = lax::dynamic_index_in_dim(m, I(-1), 1);
  CHECK(col.shape() == Shape{3, 1});
  CHECK(vec<int32_t>(col) == VI{3, 7, 11});
  Array up = lax::dynamic_update_slice_in_dim(m, jnp::array<int32_t>({-1, -2, -3}, {3, 1}), I(2), 1);
  CHECK(vec<int32_t>(up) == VI{0, 1, -1, 3, 4, 5, -2, 7, 8, 9, -3, 11});
}

TEST_CASE("slicing misuse") {
  Array x = jnp::arange(3);
  Array m = jnp::reshape(jnp::arange(12), {3, 4});
  CHECK_ERR(lax::slice(x, {0}, {5}), ValueError, "limit_indices (5,)", "(3,)");
  CHECK_ERR(lax::slice(x, {2}, {1}), ValueError, "start_indices (2,)", "limit_indices (1,)");
  CHECK_ERR(lax::slice(x, {-1}, {2}), ValueError, "start_indices (-1,)");
  CHECK_ERR(lax::slice(x, {0}, {2}, {0}), ValueError, "strides must be positive");
  CHECK_ERR(lax::slice(m, {0}, {2}), ShapeError, "(3, 4)", "rank");
  CHECK_ERR(lax::slice_in_dim(m, 0, 1, 1, 2), ValueError, "axis 2");
  CHECK_ERR(lax::dynamic_slice(x, {I(0)}, {4}), ShapeError, "slice_sizes (4,)", "(3,)");
  CHECK_ERR(lax::dynamic_slice(x, {make_scalar(0, f32)}, {1}), DTypeError, "float32");
  CHECK_ERR(lax::dynamic_slice(m, {I(0)}, {1, 1}), ShapeError, "1 start indices", "(3, 4)");
  CHECK_ERR(lax::dynamic_slice(m, {jnp::array<int32_t>({0}), I(0)}, {1, 1}), ShapeError, "scalar", "(1,)");
  CHECK_ERR(bind1(prims::dynamic_slice(), {x, I(0, i64)}, Params{{"slice_sizes", std::vector<int64_t>{1, 1}}}),
            ShapeError, "slice_sizes (1, 1)");
  CHECK_ERR(bind1(prims::dynamic_slice(), {m, I(0, i64), I(0, i32)},
                  Params{{"slice_sizes", std::vector<int64_t>{1, 1}}}),
            DTypeError, "same type", "int64", "int32");
  CHECK_ERR(lax::dynamic_update_slice(x, jnp::zeros({2}), {I(0)}), DTypeError, "int32", "float32");
  CHECK_ERR(lax::dynamic_update_slice(x, jnp::zeros({4}, i32), {I(0)}), ShapeError, "(4,)", "(3,)");
  CHECK_ERR(lax::dynamic_update_slice(m, jnp::zeros({2}, i32), {I(0), I(0)}), ShapeError, "same rank", "(2,)");
  CHECK_ERR(lax::dynamic_index_in_dim(m, make_scalar(1, f32), 0), DTypeError, "float32");
}
