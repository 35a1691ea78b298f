// Shape primitives (broadcast_in_dim, reshape, transpose, squeeze, expand_dims, rev, concatenate,
// pad, iota) and the numpy shape-manipulation functions. Expected values were computed offline
// with numpy and pasted as literals; large-array references are plain loops.
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>
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

// ------------------------------------------------------------------------------------------
// Primitives: every dtype through the generic strided-copy kernel
// ------------------------------------------------------------------------------------------
TEST_CASE("data movement primitives on every dtype") {
  for (DType d : kAllDTypes) {
    CAPTURE(dtype_name(d));
    Array a = idx_array({2, 3, 4}, d);
    Array t = lax::transpose(a, {2, 0, 1});
    CHECK(t.shape() == Shape{4, 2, 3});
    CHECK(t.dtype() == d);
    CHECK(vec<double>(t) ==
          expect_idx({0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23}, d));
    Array b = lax::broadcast_in_dim(idx_array({3, 1}, d), {2, 3, 4}, {1, 2});
    CHECK(vec<double>(b) == expect_idx({0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2}, d));
    Array r = lax::rev(a, {0, 2});
    CHECK(vec<double>(r) ==
          expect_idx({15, 14, 13, 12, 19, 18, 17, 16, 23, 22, 21, 20, 3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8}, d));
    Array s = lax::slice(idx_array({4, 5}, d), {1, 0}, {4, 5}, {2, 2});
    CHECK(s.shape() == Shape{2, 3});
    CHECK(vec<double>(s) == expect_idx({5, 7, 9, 15, 17, 19}, d));
    Array c = lax::concatenate({idx_array({2, 3}, d), idx_array({2, 2}, d, 50)}, 1);
    CHECK(vec<double>(c) == expect_idx({0, 1, 2, 50, 51, 3, 4, 5, 52, 53}, d));
    // pad (2, 3) with ((1, 0, 1), (0, 2, 0)) and value 7 (bool: 1)
    Array pv = lax::convert_element_type(make_scalar(7, i32), d);
    Array p = lax::pad(idx_array({2, 3}, d), pv, {{1, 0, 1}, {0, 2, 0}});
    CHECK(p.shape() == Shape{4, 5});
    CHECK(vec<double>(p) == expect_idx({7, 7, 7, 7, 7, 0, 1, 2, 7, 7, 7, 7, 7, 7, 7, 3, 4, 5, 7, 7}, d));
    Array re = lax::reshape(a, {6, 4});
    CHECK(vec<double>(re) == vec<double>(a));
  }
}

TEST_CASE("broadcast_in_dim") {
  Array x = jnp::array<int32_t>({1, 2, 3});
  CHECK(vec<int32_t>(lax::broadcast_in_dim(x, {2, 3}, {1})) == VI{1, 2, 3, 1, 2, 3});
  CHECK(vec<int32_t>(lax::broadcast_in_dim(x, {3, 2}, {0})) == VI{1, 1, 2, 2, 3, 3});
  // scalar -> (2, 3); weak type is kept
  Array s = lax::broadcast_in_dim(Array(2.5f), {2, 3}, {});
  CHECK(s.shape() == Shape{2, 3});
  CHECK(s.weak_type());
  CHECK(vec<float>(s) == VF(6, 2.5f));
  // inserting size-1 dims only is a zero-copy view
  Array v = lax::broadcast_in_dim(x, {1, 3, 1}, {1});
  CHECK(concrete(v)->buffer() == concrete(x)->buffer());
  CHECK(vec<int32_t>(v) == VI{1, 2, 3});
  // zero-size target
  CHECK(lax::broadcast_in_dim(x, {0, 3}, {1}).shape() == Shape{0, 3});
  CHECK(lax::broadcast_in_dim(jnp::zeros({0}, f32), {2, 0}, {1}).size() == 0);
  // lax::broadcast prepends dims
  Array bb = lax::broadcast(x, {2});
  CHECK(bb.shape() == Shape{2, 3});
  CHECK(vec<int32_t>(bb) == VI{1, 2, 3, 1, 2, 3});
  CHECK(lax::broadcast(x, {}).shape() == Shape{3});
  // identity returns the operand itself
  CHECK(lax::broadcast_in_dim(x, {3}, {0}).impl() == x.impl());
}

TEST_CASE("broadcast_in_dim large (parallel path)") {
  const int64_t n = 1000, m = 300;
  VF col(n);
  for (int64_t i = 0; i < n; ++i) col[size_t(i)] = float(i) * 0.5f;
  Array y = lax::broadcast_in_dim(jnp::array<float>(col, {n, 1}), {n, m}, {0, 1});
  auto v = vec<float>(y);
  bool ok = true;
  for (int64_t i = 0; i < n && ok; ++i)
    for (int64_t j = 0; j < m; ++j) ok = ok && v[size_t(i * m + j)] == float(i) * 0.5f;
  CHECK(ok);
  Array z = lax::broadcast_in_dim(jnp::array<float>(VF(col.begin(), col.begin() + m), {m}), {n, m}, {1});
  auto w = vec<float>(z);
  ok = true;
  for (int64_t i = 0; i < n && ok; ++i)
    for (int64_t j = 0; j < m; ++j) ok = ok && w[size_t(i * m + j)] == float(j) * 0.5f;
  CHECK(ok);
}

TEST_CASE("reshape is a zero-copy view") {
  Array x = jnp::array<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  Array y = lax::reshape(x, {3, 2});
  CHECK(y.shape() == Shape{3, 2});
  CHECK(concrete(y)->buffer() == concrete(x)->buffer());
  CHECK(vec<float>(y) == VF{0, 1, 2, 3, 4, 5});
  CHECK(lax::reshape(x, {2, 3}).impl() == x.impl());
  CHECK(lax::reshape(make_scalar(4, f32), {1, 1}).shape() == Shape{1, 1});
  CHECK(lax::reshape(jnp::zeros({0, 3}), {3, 0, 5}).shape() == Shape{3, 0, 5});
  CHECK(find_primitive("reshape") == &prims::reshape());
}

TEST_CASE("transpose") {
  Array x = jnp::array<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  CHECK(vec<float>(lax::transpose(x, {1, 0})) == VF{0, 3, 1, 4, 2, 5});
  CHECK(lax::transpose(x, {0, 1}).impl() == x.impl());
  CHECK(lax::transpose(make_scalar(3, f32), {}).shape() == Shape{});
  CHECK(lax::transpose(jnp::zeros({0, 3}), {1, 0}).shape() == Shape{3, 0});
  // moving only a size-1 dim keeps the layout (view)
  Array y = lax::reshape(x, {2, 1, 3});
  Array z = lax::transpose(y, {1, 0, 2});
  CHECK(z.shape() == Shape{1, 2, 3});
  CHECK(vec<float>(z) == VF{0, 1, 2, 3, 4, 5});
}

TEST_CASE("transpose large (cache-blocked and parallel)") {
  for (DType d : {f32, bf16, i8, f64}) {
    CAPTURE(dtype_name(d));
    const int64_t n = 301, m = 517;
    VI v(size_t(n * m));
    for (int64_t i = 0; i < n * m; ++i) v[size_t(i)] = int32_t((i * 7) % 101);
    Array x = lax::convert_element_type(jnp::array<int32_t>(v, {n, m}), d);
    auto t = vec<int32_t>(lax::transpose(x, {1, 0}));
    bool ok = true;
    for (int64_t i = 0; i < n && ok; ++i)
      for (int64_t j = 0; j < m; ++j) ok = ok && t[size_t(j * n + i)] == v[size_t(i * m + j)];
    CHECK(ok);
  }
  // 3-D: (a, b, c) -> (c, a, b)
  const int64_t a = 70, b = 65, c = 90;
  VF v(size_t(a * b * c));
  std::iota(v.begin(), v.end(), 0.f);
  auto t = vec<float>(lax::transpose(jnp::array<float>(v, {a, b, c}), {2, 0, 1}));
  bool ok = true;
  for (int64_t i = 0; i < a && ok; ++i)
    for (int64_t j = 0; j < b; ++j)
      for (int64_t k = 0; k < c; ++k) ok = ok && t[size_t((k * a + i) * b + j)] == v[size_t((i * b + j) * c + k)];
  CHECK(ok);
  // A weight gradient's [3, N, H, D] -> [3, D, N, H] (8 x 8 register blocks, D and N H multiples of 8),
  // and the same with a ragged edge (D = 131) for the blocks' scalar rows and columns.
  for (int64_t d : {128, 131}) {
    CAPTURE(d);
    VF w(size_t(3 * 8 * 16 * d));
    for (size_t i = 0; i < w.size(); ++i) w[i] = float(i) * 0.5f - 7.0f;
    auto wt = vec<float>(lax::transpose(jnp::array<float>(w, {3, 8, 16, d}), {0, 3, 1, 2}));
    bool same = true;
    for (int64_t q = 0; q < 3; ++q)
      for (int64_t n = 0; n < 8; ++n)
        for (int64_t h = 0; h < 16; ++h)
          for (int64_t e = 0; e < d; ++e)
            same = same && wt[size_t(((q * d + e) * 8 + n) * 16 + h)] == w[size_t(((q * 8 + n) * 16 + h) * d + e)];
    CHECK(same);
  }
}

TEST_CASE("squeeze / expand_dims") {
  Array x = jnp::array<int32_t>({1, 2, 3}, {1, 3, 1});
  CHECK(lax::squeeze(x, {0, 2}).shape() == Shape{3});
  CHECK(lax::squeeze(x, {-1}).shape() == Shape{1, 3});
  CHECK(lax::squeeze(x, {}).impl() == x.impl());
  CHECK(lax::squeeze(lax::reshape(make_scalar(1, f32), {1, 1}), {0, 1}).shape() == Shape{});
  Array e = lax::expand_dims(jnp::array<int32_t>({1, 2, 3}), {0, -1});
  CHECK(e.shape() == Shape{1, 3, 1});
  CHECK(vec<int32_t>(e) == VI{1, 2, 3});
  CHECK(lax::expand_dims(make_scalar(2, i32), {0}).shape() == Shape{1});
}

TEST_CASE("rev") {
  CHECK(vec<int32_t>(lax::rev(jnp::array<int32_t>({1, 2, 3, 4}), {0})) == VI{4, 3, 2, 1});
  CHECK(vec<int32_t>(lax::rev(jnp::array<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3}), {-1})) == VI{3, 2, 1, 6, 5, 4});
  CHECK(lax::rev(jnp::zeros({0, 2}), {0}).shape() == Shape{0, 2});
  Array s = make_scalar(3, i32);
  CHECK(lax::rev(s, {}).impl() == s.impl());
}

TEST_CASE("concatenate") {
  Array x = jnp::array<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  CHECK(vec<float>(lax::concatenate({x, x}, 1)) == VF{0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5});
  CHECK(vec<float>(lax::concatenate({x, x}, -2)) == VF{0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5});
  Array empty = jnp::zeros({0, 3});
  Array c = lax::concatenate({empty, x, empty}, 0);
  CHECK(c.shape() == Shape{2, 3});
  CHECK(vec<float>(c) == VF{0, 1, 2, 3, 4, 5});
  CHECK(lax::concatenate({empty, empty}, 0).shape() == Shape{0, 3});
  CHECK(lax::concatenate({x}, 0).impl() == x.impl());
  // many operands, weak types: all-weak inputs stay weak
  std::vector<Array> parts;
  for (int i = 0; i < 20; ++i) parts.push_back(jnp::array<int32_t>({i}));
  VI want(20);
  std::iota(want.begin(), want.end(), 0);
  CHECK(vec<int32_t>(lax::concatenate(parts, 0)) == want);
}

TEST_CASE("pad primitive") {
  Array x = jnp::array<int32_t>({1, 2, 3, 4, 5});
  Array z = make_scalar(0, i32);
  Array p = lax::pad(x, z, {{-1, -2, 2}});
  CHECK(p.shape() == Shape{10});
  CHECK(vec<int32_t>(p) == VI{0, 0, 2, 0, 0, 3, 0, 0, 4, 0});
  Array y = jnp::array<int32_t>({1, 2, 3, 4}, {2, 2});
  Array q = lax::pad(y, make_scalar(9, i32), {{-1, 1, 1}, {-1, 1, 0}});
  CHECK(q.shape() == Shape{3, 2});
  CHECK(vec<int32_t>(q) == VI{9, 9, 4, 9, 9, 9});
  // empty operand: all padding
  CHECK(vec<float>(lax::pad(jnp::zeros({0}), make_scalar(2, f32), {{2, 1, 3}})) == VF{2, 2, 2});
  // crop to empty
  CHECK(lax::pad(x, z, {{-3, -2, 0}}).shape() == Shape{0});
  // scalar operand, no config
  CHECK(vec<float>(lax::pad(make_scalar(5, f32), make_scalar(0, f32), {})) == VF{5});
  // NaN padding value propagates
  auto nan = vec<float>(lax::pad(jnp::array<float>({1}), make_scalar(std::nan(""), f32), {{1, 0, 0}}));
  CHECK(std::isnan(nan[0]));
  CHECK(nan[1] == 1.f);
}

TEST_CASE("iota") {
  CHECK(vec<int32_t>(lax::iota(i32, 4)) == VI{0, 1, 2, 3});
  CHECK(lax::iota(i32, 0).shape() == Shape{0});
  Array b = lax::broadcasted_iota(f32, {2, 3, 2}, 1);
  CHECK(vec<float>(b) == VF{0, 0, 1, 1, 2, 2, 0, 0, 1, 1, 2, 2});
  CHECK(vec<float>(lax::broadcasted_iota(bf16, {2, 2}, -1)) == VF{0, 1, 0, 1});
  for (DType d : kAllDTypes) {
    if (d == bool_) continue;
    Array t = lax::iota(d, 5);
    CHECK(t.dtype() == d);
    CHECK(!t.weak_type());
    CHECK(vec<double>(t) == VD{0, 1, 2, 3, 4});
  }
  // large, parallel
  auto big = vec<int32_t>(lax::broadcasted_iota(i32, {400, 300}, 0));
  CHECK(big[0] == 0);
  CHECK(big[299] == 0);
  CHECK(big[300] == 1);
  CHECK(big[size_t(399 * 300 + 7)] == 399);
}

TEST_CASE("shape primitive misuse") {
  Array x = jnp::array<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  CHECK_ERR(lax::transpose(x, {0, 0}), ShapeError, "permutation (0, 0)", "(2, 3)");
  CHECK_ERR(lax::transpose(x, {0}), ShapeError, "permutation (0,)");
  CHECK_ERR(lax::broadcast_in_dim(jnp::zeros({3}), {4}, {0}), ShapeError, "(3,)", "(4,)");
  CHECK_ERR(lax::broadcast_in_dim(x, {3, 2}, {1, 0}), ShapeError, "strictly increasing");
  CHECK_ERR(lax::broadcast_in_dim(x, {6}, {0}), ShapeError, "higher rank");
  CHECK_ERR(lax::reshape(x, {4}), ShapeError, "(4,)", "(2, 3)");
  CHECK_ERR(lax::squeeze(x, {0}), ShapeError, "size not equal to one", "(2, 3)");
  CHECK_ERR(lax::squeeze(x, {3}), ValueError, "axis 3");
  CHECK_ERR(lax::concatenate({x, jnp::zeros({2, 4})}, 0), ShapeError, "concatenation axis 0", "dimension 1");
  CHECK_ERR(lax::concatenate({x, jnp::zeros({6})}, 0), ShapeError, "number of dimensions", "(6,)");
  CHECK_ERR(lax::concatenate({x, jnp::zeros({2, 3}, i32)}, 0), DTypeError, "float32", "int32");
  CHECK_ERR(lax::concatenate({x, x}, 2), ValueError, "axis 2");
  CHECK_ERR(lax::pad(x, make_scalar(0, f32), {{-3, 0, 0}, {0, 0, 0}}), ShapeError, "dimension 0", "at least 0");
  CHECK_ERR(lax::pad(x, make_scalar(0, i32), {{0, 0, 0}, {0, 0, 0}}), DTypeError, "float32", "int32");
  CHECK_ERR(lax::pad(x, make_scalar(0, f32), {{0, 0, 0}}), ShapeError, "rank 2");
  CHECK_ERR(lax::pad(x, make_scalar(0, f32), {{0, 0, -1}, {0, 0, 0}}), ValueError, "interior");
  CHECK_ERR(lax::iota(bool_, 3), DTypeError, "bool");
  CHECK_ERR(lax::broadcasted_iota(i32, {2, 3}, 2), ValueError, "axis 2");
  CHECK_ERR(lax::rev(x, {0, 0}), ValueError, "repeated axis 0");
}

// ------------------------------------------------------------------------------------------
// numpy
// ------------------------------------------------------------------------------------------
TEST_CASE("jnp.reshape / ravel / Array::reshape / T") {
  Array x = jnp::arange(6);
  CHECK(jnp::reshape(x, {2, -1}).shape() == Shape{2, 3});
  CHECK(jnp::reshape(x, {-1}).shape() == Shape{6});
  CHECK(x.reshape({3, 2}).shape() == Shape{3, 2});
  CHECK(jnp::reshape(jnp::zeros({0, 4}), {-1, 2}).shape() == Shape{0, 2});
  CHECK(jnp::ravel(jnp::reshape(x, {3, 2})).shape() == Shape{6});
  CHECK(jnp::ravel(make_scalar(1, f32)).shape() == Shape{1});
  Array m = jnp::reshape(x, {2, 3});
  CHECK(m.T().shape() == Shape{3, 2});
  CHECK(vec<int32_t>(m.T()) == VI{0, 3, 1, 4, 2, 5});
  CHECK(make_scalar(1, f32).T().shape() == Shape{});
  CHECK_ERR(jnp::reshape(x, {4, -1}), ShapeError, "(6,)", "(4, -1)");
  CHECK_ERR(jnp::reshape(x, {4}), ShapeError, "(6,)", "(4,)");
  CHECK_ERR(jnp::reshape(x, {-1, -1}), ValueError, "one unknown dimension");
  CHECK_ERR(x.reshape({-2, 3}), ShapeError, "negative");
}

TEST_CASE("jnp.transpose / swapaxes / moveaxis") {
  Array a = jnp::reshape(jnp::arange(24), {2, 3, 4});
  CHECK(jnp::transpose(a).shape() == Shape{4, 3, 2});
  CHECK(vec<int32_t>(jnp::transpose(a, {-1, 0, 1})) ==
        VI{0, 4, 8, 12, 16, 20, 1, 5, 9, 13, 17, 21, 2, 6, 10, 14, 18, 22, 3, 7, 11, 15, 19, 23});
  CHECK(vec<int32_t>(jnp::swapaxes(a, 0, -1)) ==
        VI{0, 12, 4, 16, 8, 20, 1, 13, 5, 17, 9, 21, 2, 14, 6, 18, 10, 22, 3, 15, 7, 19, 11, 23});
  Array m1 = jnp::moveaxis(a, 0, -1);
  CHECK(m1.shape() == Shape{3, 4, 2});
  VI want{0, 12, 1, 13, 2, 14, 3, 15, 4, 16, 5, 17, 6, 18, 7, 19, 8, 20, 9, 21, 10, 22, 11, 23};
  CHECK(vec<int32_t>(m1) == want);
  Array m2 = jnp::moveaxis(a, std::vector<int64_t>{0, 1}, std::vector<int64_t>{-1, 0});
  CHECK(m2.shape() == Shape{3, 4, 2});
  CHECK(vec<int32_t>(m2) == want);
  CHECK_ERR(jnp::transpose(a, {0, 1}), ShapeError, "(0, 1)", "(2, 3, 4)");
  CHECK_ERR(jnp::transpose(a, {0, 1, 1}), ValueError, "repeated axis");
  CHECK_ERR(jnp::swapaxes(a, 0, 5), ValueError, "axis 5", "rank 3");
  CHECK_ERR(jnp::moveaxis(a, std::vector<int64_t>{0}, std::vector<int64_t>{1, 2}), ValueError, "same number");
}

TEST_CASE("jnp.expand_dims / squeeze / atleast") {
  Array x = jnp::array<float>({1, 2, 3});
  CHECK(jnp::expand_dims(x, 0).shape() == Shape{1, 3});
  CHECK(jnp::expand_dims(x, -1).shape() == Shape{3, 1});
  CHECK(jnp::expand_dims(x, {0, 2}).shape() == Shape{1, 3, 1});
  CHECK(jnp::squeeze(jnp::zeros({1, 3, 1})).shape() == Shape{3});
  CHECK(jnp::squeeze(jnp::zeros({1, 3, 1}), -1).shape() == Shape{1, 3});
  CHECK(jnp::squeeze(jnp::zeros({1, 1})).shape() == Shape{});
  CHECK_ERR(jnp::squeeze(jnp::zeros({2, 3}), 0), ShapeError, "axis 0", "(2, 3)", "size 2");
  CHECK_ERR(jnp::expand_dims(x, 3), ValueError, "axis 3");
  CHECK(jnp::atleast_1d(make_scalar(1, f32)).shape() == Shape{1});
  CHECK(jnp::atleast_1d(x).impl() == x.impl());
  CHECK(jnp::atleast_2d(make_scalar(1, f32)).shape() == Shape{1, 1});
  CHECK(jnp::atleast_2d(x).shape() == Shape{1, 3});
}

TEST_CASE("jnp.broadcast_to / broadcast_arrays / broadcast_shapes") {
  Array x = jnp::array<int32_t>({1, 2}, {2, 1});
  Array b = jnp::broadcast_to(x, {2, 2, 3});
  CHECK(b.shape() == Shape{2, 2, 3});
  CHECK(vec<int32_t>(b) == VI{1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2});
  CHECK(jnp::broadcast_to(x, {2, 1}).impl() == x.impl());
  CHECK(jnp::broadcast_to(make_scalar(3, f32), {0, 2}).shape() == Shape{0, 2});
  CHECK(jnp::broadcast_shapes({{3, 1, 5}, {4, 1}, {1}}) == Shape{3, 4, 5});
  CHECK(jnp::broadcast_shapes({{0, 1}, {1, 3}}) == Shape{0, 3});
  CHECK(jnp::broadcast_shapes({{}, {2}}) == Shape{2});
  CHECK(jnp::broadcast_shapes({}) == Shape{});
  auto arrs = jnp::broadcast_arrays({jnp::array<float>({1, 2, 3}), jnp::array<float>({5, 6}, {2, 1})});
  CHECK(arrs[0].shape() == Shape{2, 3});
  CHECK(vec<float>(arrs[0]) == VF{1, 2, 3, 1, 2, 3});
  CHECK(vec<float>(arrs[1]) == VF{5, 5, 5, 6, 6, 6});
  CHECK_ERR(jnp::broadcast_to(jnp::zeros({3}), {4}), ShapeError, "(3,)", "(4,)");
  CHECK_ERR(jnp::broadcast_to(jnp::zeros({2, 3}), {3}), ShapeError, "(2, 3)", "(3,)");
  CHECK_ERR(jnp::broadcast_shapes({{2, 3}, {4, 3}}), ShapeError, "(2, 3)", "(4, 3)");
  CHECK_ERR(jnp::broadcast_shapes({{3}, {1}, {4}}), ShapeError, "(3,)", "(4,)");
}

TEST_CASE("jnp.concatenate / stack / hstack / vstack") {
  Array a = jnp::array<int32_t>({0, 1, 2, 3, 4, 5}, {2, 3});
  Array b = jnp::array<float>({50, 51, 52, 53}, {2, 2});
  Array c = jnp::concatenate({a, b}, -1);
  CHECK(c.dtype() == f32);
  CHECK(vec<float>(c) == VF{0, 1, 2, 50, 51, 3, 4, 5, 52, 53});
  CHECK(jnp::concatenate({jnp::zeros({2}, bf16), jnp::zeros({1}, f16)}).dtype() == f32);
  CHECK(jnp::concatenate({jnp::zeros({2}, i8), jnp::zeros({1}, u8)}).dtype() == i16);
  CHECK(jnp::concatenate({jnp::zeros({0, 3}), jnp::ones({2, 3})}).shape() == Shape{2, 3});
  CHECK(vec<int32_t>(jnp::stack({jnp::array<int32_t>({1, 2}), jnp::array<int32_t>({3, 4})}, -1)) == VI{1, 3, 2, 4});
  Array s = jnp::stack({jnp::array<int32_t>({1, 2}), jnp::array<int32_t>({3, 4})});
  CHECK(s.shape() == Shape{2, 2});
  CHECK(vec<int32_t>(s) == VI{1, 2, 3, 4});
  CHECK(jnp::stack({make_scalar(1, f32), make_scalar(2, f32)}).shape() == Shape{2});
  CHECK(vec<int32_t>(jnp::hstack({jnp::array<int32_t>({1, 2}, {2, 1}), jnp::array<int32_t>({3, 4, 5, 6}, {2, 2})})) ==
        VI{1, 3, 4, 2, 5, 6});
  CHECK(vec<int32_t>(jnp::hstack({make_scalar(1, i32), jnp::array<int32_t>({2, 3})})) == VI{1, 2, 3});
  Array v = jnp::vstack({jnp::array<int32_t>({1, 2}), jnp::array<int32_t>({3, 4, 5, 6}, {2, 2})});
  CHECK(v.shape() == Shape{3, 2});
  CHECK(vec<int32_t>(v) == VI{1, 2, 3, 4, 5, 6});
  CHECK_ERR(jnp::concatenate({a, jnp::zeros({3, 3})}, 1), ShapeError, "concatenation axis 1", "dimension 0");
  CHECK_ERR(jnp::concatenate({a, jnp::zeros({3})}), ShapeError, "same number of dimensions", "(3,)");
  CHECK_ERR(jnp::concatenate({make_scalar(1, f32), make_scalar(1, f32)}), ShapeError, "zero-dimensional");
  CHECK_ERR(jnp::concatenate({a}, 2), ValueError, "axis 2");
  CHECK_ERR(jnp::stack({jnp::zeros({2}), jnp::zeros({3})}), ShapeError, "(2,)", "(3,)", "index 1");
  CHECK_ERR(jnp::stack({}), ValueError, "at least one");
}

TEST_CASE("jnp.split / array_split") {
  Array x = jnp::arange(10);
  auto p = jnp::split(x, 5);
  REQUIRE(p.size() == 5);
  CHECK(vec<int32_t>(p[4]) == VI{8, 9});
  auto q = jnp::split(x, std::vector<int64_t>{3, -2, 20});
  REQUIRE(q.size() == 4);
  CHECK(vec<int32_t>(q[0]) == VI{0, 1, 2});
  CHECK(vec<int32_t>(q[1]) == VI{3, 4, 5, 6, 7});
  CHECK(vec<int32_t>(q[2]) == VI{8, 9});
  CHECK(q[3].shape() == Shape{0});
  auto r = jnp::split(x, std::vector<int64_t>{5, 2});
  REQUIRE(r.size() == 3);
  CHECK(r[1].shape() == Shape{0});
  CHECK(vec<int32_t>(r[2]) == VI{2, 3, 4, 5, 6, 7, 8, 9});
  auto a = jnp::array_split(jnp::arange(7), 3);
  REQUIRE(a.size() == 3);
  CHECK(vec<int32_t>(a[0]) == VI{0, 1, 2});
  CHECK(vec<int32_t>(a[1]) == VI{3, 4});
  CHECK(vec<int32_t>(a[2]) == VI{5, 6});
  auto b = jnp::array_split(jnp::reshape(jnp::arange(12), {3, 4}), 3, -1);
  CHECK(b[0].shape() == Shape{3, 2});
  CHECK(vec<int32_t>(b[0]) == VI{0, 1, 4, 5, 8, 9});
  CHECK(vec<int32_t>(b[2]) == VI{3, 7, 11});
  CHECK_ERR(jnp::split(x, 3), ValueError, "equal division", "size 10", "3 sections");
  CHECK_ERR(jnp::split(x, 0), ValueError, "larger than 0");
  CHECK_ERR(jnp::split(make_scalar(1, f32), 1), ShapeError, "zero-dimensional");
}

TEST_CASE("jnp.tile / repeat") {
  Array m = jnp::array<int32_t>({1, 2, 3, 4}, {2, 2});
  Array t = jnp::tile(m, {2, 3});
  CHECK(t.shape() == Shape{4, 6});
  CHECK(vec<int32_t>(t) == VI{1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4, 1, 2, 1, 2, 1, 2, 3, 4, 3, 4, 3, 4});
  Array t1 = jnp::tile(jnp::array<int32_t>({1, 2, 3}), {2, 1, 2});
  CHECK(t1.shape() == Shape{2, 1, 6});
  CHECK(vec<int32_t>(t1) == VI{1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3});
  CHECK(jnp::tile(m, {0}).shape() == Shape{2, 0});
  CHECK(vec<int32_t>(jnp::repeat(m, 2, 1)) == VI{1, 1, 2, 2, 3, 3, 4, 4});
  CHECK(vec<int32_t>(jnp::repeat(m, 3)) == VI{1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4});
  CHECK(jnp::repeat(m, 0, -2).shape() == Shape{0, 2});
  CHECK(jnp::repeat(make_scalar(2, f32), 3).shape() == Shape{3});
  CHECK_ERR(jnp::tile(m, {-1}), ValueError, "non-negative");
  CHECK_ERR(jnp::repeat(m, -1), ValueError, "non-negative");
}

TEST_CASE("jnp.pad modes") {
  Array x = jnp::array<int32_t>({1, 2, 3});
  std::vector<std::pair<int64_t, int64_t>> w{{4, 5}};
  CHECK(vec<int32_t>(jnp::pad(x, w, "edge")) == VI{1, 1, 1, 1, 1, 2, 3, 3, 3, 3, 3, 3});
  CHECK(vec<int32_t>(jnp::pad(x, w, "reflect")) == VI{1, 2, 3, 2, 1, 2, 3, 2, 1, 2, 3, 2});
  CHECK(vec<int32_t>(jnp::pad(x, w, "symmetric")) == VI{3, 3, 2, 1, 1, 2, 3, 3, 2, 1, 1, 2});
  CHECK(vec<int32_t>(jnp::pad(x, w, "wrap")) == VI{3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2});
  CHECK(vec<int32_t>(jnp::pad(x, w)) == VI{0, 0, 0, 0, 1, 2, 3, 0, 0, 0, 0, 0});
  Array y = jnp::reshape(jnp::arange(6), {2, 3});
  std::vector<std::pair<int64_t, int64_t>> w2{{1, 2}, {2, 1}};
  CHECK(jnp::pad(y, w2, "edge").shape() == Shape{5, 6});
  CHECK(vec<int32_t>(jnp::pad(y, w2, "edge")) ==
        VI{0, 0, 0, 1, 2, 2, 0, 0, 0, 1, 2, 2, 3, 3, 3, 4, 5, 5, 3, 3, 3, 4, 5, 5, 3, 3, 3, 4, 5, 5});
  CHECK(vec<int32_t>(jnp::pad(y, w2, "reflect")) ==
        VI{5, 4, 3, 4, 5, 4, 2, 1, 0, 1, 2, 1, 5, 4, 3, 4, 5, 4, 2, 1, 0, 1, 2, 1, 5, 4, 3, 4, 5, 4});
  CHECK(vec<int32_t>(jnp::pad(y, w2, "symmetric")) ==
        VI{1, 0, 0, 1, 2, 2, 1, 0, 0, 1, 2, 2, 4, 3, 3, 4, 5, 5, 4, 3, 3, 4, 5, 5, 1, 0, 0, 1, 2, 2});
  CHECK(vec<int32_t>(jnp::pad(y, w2, "wrap")) ==
        VI{4, 5, 3, 4, 5, 3, 1, 2, 0, 1, 2, 0, 4, 5, 3, 4, 5, 3, 1, 2, 0, 1, 2, 0, 4, 5, 3, 4, 5, 3});
  CHECK(vec<int32_t>(jnp::pad(y, {{0, 1}, {1, 0}}, "constant", Array(-1))) ==
        VI{-1, 0, 1, 2, -1, 3, 4, 5, -1, -1, -1, -1});
  CHECK(vec<int32_t>(jnp::pad(jnp::array<int32_t>({5}), {{2, 3}}, "reflect")) == VI{5, 5, 5, 5, 5, 5});
  CHECK(vec<int32_t>(jnp::pad(jnp::array<int32_t>({5}), {{2, 3}}, "symmetric")) == VI{5, 5, 5, 5, 5, 5});
  Array pf = jnp::pad(jnp::array<float>({1.5f}), 1);
  CHECK(pf.dtype() == f32);
  CHECK(vec<float>(pf) == VF{0, 1.5f, 0});
  CHECK(vec<float>(jnp::pad(jnp::zeros({0}), {{1, 1}})) == VF{0, 0});
  CHECK_ERR(jnp::pad(x, w, "foo"), ValueError, "'foo'", "reflect");
  CHECK_ERR(jnp::pad(jnp::zeros({0}), {{1, 1}}, "edge"), ValueError, "empty axis 0", "edge");
  CHECK_ERR(jnp::pad(y, {{1, 1}, {1, 1}, {1, 1}}), ShapeError, "3", "(2, 3)");
  CHECK_ERR(jnp::pad(y, {{-1, 1}}), ValueError, "non-negative");
}

TEST_CASE("jnp.flip / roll") {
  Array a = jnp::reshape(jnp::arange(24), {2, 3, 4});
  VI all(24);
  for (int i = 0; i < 24; ++i) all[size_t(i)] = 23 - i;
  CHECK(vec<int32_t>(jnp::flip(a)) == all);
  CHECK(vec<int32_t>(jnp::flip(a, 1)) ==
        VI{8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3, 20, 21, 22, 23, 16, 17, 18, 19, 12, 13, 14, 15});
  CHECK(vec<int32_t>(jnp::flip(a, {0, -1})) ==
        VI{15, 14, 13, 12, 19, 18, 17, 16, 23, 22, 21, 20, 3, 2, 1, 0, 7, 6, 5, 4, 11, 10, 9, 8});
  CHECK(vec<int32_t>(jnp::roll(jnp::arange(10), 3)) == VI{7, 8, 9, 0, 1, 2, 3, 4, 5, 6});
  CHECK(vec<int32_t>(jnp::roll(jnp::arange(10), -12)) == VI{2, 3, 4, 5, 6, 7, 8, 9, 0, 1});
  Array y = jnp::reshape(jnp::arange(6), {2, 3});
  Array r = jnp::roll(y, 1);
  CHECK(r.shape() == Shape{2, 3});
  CHECK(vec<int32_t>(r) == VI{5, 0, 1, 2, 3, 4});
  CHECK(vec<int32_t>(jnp::roll(y, -1, 1)) == VI{1, 2, 0, 4, 5, 3});
  CHECK(jnp::roll(jnp::zeros({0}), 2, 0).shape() == Shape{0});
  CHECK_ERR(jnp::roll(y, 1, 2), ValueError, "axis 2");
}

TEST_CASE("jnp.diagonal / trace") {
  Array d = jnp::reshape(jnp::arange(12), {3, 4});
  CHECK(vec<int32_t>(jnp::diagonal(d)) == VI{0, 5, 10});
  CHECK(vec<int32_t>(jnp::diagonal(d, 1)) == VI{1, 6, 11});
  CHECK(vec<int32_t>(jnp::diagonal(d, 3)) == VI{3});
  CHECK(jnp::diagonal(d, 4).shape() == Shape{0});
  CHECK(vec<int32_t>(jnp::diagonal(d, -1)) == VI{4, 9});
  CHECK(vec<int32_t>(jnp::diagonal(d, -2)) == VI{8});
  CHECK(jnp::diagonal(d, -3).shape() == Shape{0});
  Array e = jnp::reshape(jnp::arange(24), {2, 3, 4});
  Array e1 = jnp::diagonal(e, 0, 1, 2);
  CHECK(e1.shape() == Shape{2, 3});
  CHECK(vec<int32_t>(e1) == VI{0, 5, 10, 12, 17, 22});
  Array e2 = jnp::diagonal(e, 1, 0, 2);
  CHECK(e2.shape() == Shape{3, 2});
  CHECK(vec<int32_t>(e2) == VI{1, 14, 5, 18, 9, 22});
  CHECK(vec<int32_t>(jnp::diagonal(e, -1, 2, 0)) == VI{1, 14, 5, 18, 9, 22});
  CHECK(jnp::trace(d).item<int32_t>() == 15);
  CHECK(jnp::trace(d, 1).item<int32_t>() == 18);
  CHECK(jnp::trace(d, -1).item<int32_t>() == 13);
  CHECK(jnp::trace(d, 4).item<int32_t>() == 0);
  CHECK_ERR(jnp::diagonal(jnp::arange(3)), ShapeError, "two dimensions", "(3,)");
  CHECK_ERR(jnp::diagonal(d, 0, 1, -1), ValueError, "cannot be the same");
}

TEST_CASE("jnp.tri / tril / triu") {
  CHECK(vec<float>(jnp::tri(3, 4)) == VF{1, 0, 0, 0, 1, 1, 0, 0, 1, 1, 1, 0});
  CHECK(vec<float>(jnp::tri(3, 4, 1)) == VF{1, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1});
  CHECK(vec<float>(jnp::tri(3, 4, -1)) == VF{0, 0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0});
  Array t2 = jnp::tri(2, std::nullopt, 0, i32);
  CHECK(t2.dtype() == i32);
  CHECK(vec<int32_t>(t2) == VI{1, 0, 1, 1});
  CHECK(jnp::tri(0, 3).shape() == Shape{0, 3});
  Array f = jnp::reshape(jnp::arange(1, 13), {3, 4});
  CHECK(vec<int32_t>(jnp::tril(f)) == VI{1, 0, 0, 0, 5, 6, 0, 0, 9, 10, 11, 0});
  CHECK(vec<int32_t>(jnp::tril(f, 1)) == VI{1, 2, 0, 0, 5, 6, 7, 0, 9, 10, 11, 12});
  CHECK(vec<int32_t>(jnp::tril(f, -1)) == VI{0, 0, 0, 0, 5, 0, 0, 0, 9, 10, 0, 0});
  CHECK(vec<int32_t>(jnp::triu(f)) == VI{1, 2, 3, 4, 0, 6, 7, 8, 0, 0, 11, 12});
  CHECK(vec<int32_t>(jnp::triu(f, 1)) == VI{0, 2, 3, 4, 0, 0, 7, 8, 0, 0, 0, 12});
  CHECK(vec<int32_t>(jnp::triu(f, -1)) == VI{1, 2, 3, 4, 5, 6, 7, 8, 0, 10, 11, 12});
  CHECK(vec<int32_t>(jnp::tril(jnp::reshape(jnp::arange(1, 9), {2, 2, 2}))) == VI{1, 0, 3, 4, 5, 0, 7, 8});
  Array tb = jnp::tril(jnp::ones({2, 2}, bool_));
  CHECK(tb.dtype() == bool_);
  CHECK(vec<bool>(tb) == std::vector<bool>{true, false, true, true});
  CHECK_ERR(jnp::tril(jnp::arange(3)), ShapeError, "2-D", "(3,)");
  CHECK_ERR(jnp::tri(-1), ValueError, "negative");
}

// ------------------------------------------------------------------------------------------
// Shapes are checked once, where an array (concrete or traced) is created
// ------------------------------------------------------------------------------------------
TEST_CASE("a shape whose element count overflows 64 bits is a ShapeError, eagerly and traced") {
  const int64_t big = int64_t(1) << 40;
  CHECK_ERR(jnp::zeros({big, big}), ShapeError, "(1099511627776, 1099511627776)", "64-bit");
  CHECK_ERR(jnp::ones({big, big}, i32), ShapeError, "64-bit");
  // The product wraps to 16 in 64-bit arithmetic: still refused (it used to be accepted and y[5]
  // read past the buffer).
  const int64_t wraps = (int64_t(1) << 62) + 4;
  CHECK_ERR(jnp::arange(16).reshape({wraps, 4}), ShapeError, "(4611686018427387908, 4)");
  CHECK_ERR(make_jaxpr([&](const Array& x) { return x.reshape({wraps, 4}); })(jnp::arange(16)), ShapeError, "64-bit");
  CHECK_ERR(lax::broadcast_in_dim(jnp::ones({1}), {big, big, 1}, {2}), ShapeError, "64-bit");
  // Element count fits, byte size does not.
  CHECK_ERR(jnp::zeros({int64_t(1) << 62}, f64), ShapeError, "bytes", "float64");
  CHECK_THROWS_AS(make_abstract(AbstractValue{{3, -1}, f32, false, {}}), ShapeError);
  // Still fine: large but representable shapes are accepted abstractly.
  ClosedJaxpr cj = make_jaxpr([](const Array& x) {
    return x.reshape({int64_t(1) << 20, 16});
  })(make_abstract(AbstractValue{{int64_t(1) << 24}, f32, false, {}}));
  CHECK(cj.out_avals()[0].shape == Shape{int64_t(1) << 20, 16});
}
