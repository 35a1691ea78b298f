// sort (multi-operand, stable, NaN last, -0.0 == +0.0 like JAX's comparator), top_k, jnp.sort/argsort.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "cjax/cjax.h"
#include "core/array/primitive.h"
#include "core/array/visit_dtype.h"
#include "test_util.h"

using namespace cjax;
namespace jnp = cjax::numpy;
using doctest::Contains;

using namespace cjax::testing;
namespace {}  // namespace

TEST_CASE("sort floats: NaN last, -0.0 and +0.0 equal (stable), infinities") {
  Array x = arr<float>({3, kNaN, -1, 0.0, -0.0, kInf, -kInf, 2});
  auto s = dv(lax::sort(x));
  CHECK(s[0] == -kInf);
  CHECK(s[1] == -1);
  CHECK(s[2] == 0);
  CHECK(!std::signbit(s[2]));  // +0.0 came first in the input and stays first
  CHECK(s[3] == 0);
  CHECK(std::signbit(s[3]));
  CHECK(s[4] == 2);
  CHECK(s[5] == 3);
  CHECK(s[6] == kInf);
  CHECK(std::isnan(s[7]));
  auto s2 = dv(lax::sort(arr<double>({-0.0, kNaN, 0.0, -kNaN, 1})));
  CHECK(std::signbit(s2[0]));
  CHECK(!std::signbit(s2[1]));
  CHECK(s2[2] == 1);
  CHECK(std::isnan(s2[3]));
  CHECK(std::isnan(s2[4]));
  CHECK(lax::sort(x).dtype() == DType::float32);
}

TEST_CASE("sort every dtype") {
  auto each = [](auto tag) {
    using T = typename decltype(tag)::type;
    Array x = arr<T>({3, 1, 2, 5, 4, 0}, {2, 3});
    CAPTURE(dtype_name(x.dtype()));
    CHECK(dv(lax::sort(x)) == std::vector<double>{1, 2, 3, 0, 4, 5});
    CHECK(dv(lax::sort(x, 0)) == std::vector<double>{3, 1, 0, 5, 4, 2});
    CHECK(lax::sort(x).dtype() == x.dtype());
  };
  each(Tag<int8_t>{});
  each(Tag<int16_t>{});
  each(Tag<int32_t>{});
  each(Tag<int64_t>{});
  each(Tag<uint8_t>{});
  each(Tag<uint32_t>{});
  each(Tag<bfloat16_t>{});
  each(Tag<float16_t>{});
  each(Tag<float>{});
  each(Tag<double>{});
  CHECK(iv(lax::sort(jnp::array<int8_t>({-128, 127, 0, -1}))) == std::vector<int64_t>{-128, -1, 0, 127});
  CHECK(iv(lax::sort(jnp::array<int64_t>({INT64_MAX, INT64_MIN, 0}))) == std::vector<int64_t>{INT64_MIN, 0, INT64_MAX});
  CHECK(iv(lax::sort(jnp::array<uint32_t>({4294967295u, 0u, 5u}))) == std::vector<int64_t>{0, 5, 4294967295LL});
  CHECK(iv(lax::sort(jnp::array<bool>({true, false, true}))) == std::vector<int64_t>{0, 1, 1});
  auto h = dv(lax::sort(arr<bfloat16_t>({1, kNaN, -kInf, -2})));
  CHECK(h[0] == -kInf);
  CHECK(h[1] == -2);
  CHECK(std::isnan(h[3]));
  // zero-size and length-1 axes
  CHECK(lax::sort(jnp::zeros({0, 3})).shape() == Shape{0, 3});
  CHECK(lax::sort(jnp::zeros({3, 0}), 0).shape() == Shape{3, 0});
  CHECK(dv(lax::sort(arr<float>({7}))) == std::vector<double>{7});
}

TEST_CASE("multi-operand sort: key/value, lexicographic num_keys, stability") {
  Array k = jnp::array<int32_t>({2, 1, 2, 1});
  Array v = arr<float>({10, 20, 30, 40});
  auto r = lax::sort({k, v}, 0, true, 1);
  REQUIRE(r.size() == 2);
  CHECK(iv(r[0]) == std::vector<int64_t>{1, 1, 2, 2});
  CHECK(dv(r[1]) == std::vector<double>{20, 40, 10, 30});
  CHECK(r[1].dtype() == DType::float32);
  Array k1 = jnp::array<int32_t>({1, 1, 0, 0});
  Array k2 = arr<float>({5, 3, 4, 4});
  Array idx = jnp::array<int32_t>({0, 1, 2, 3});
  auto r2 = lax::sort({k1, k2, idx}, -1, true, 2);
  CHECK(iv(r2[2]) == std::vector<int64_t>{2, 3, 1, 0});
  CHECK(dv(r2[1]) == std::vector<double>{4, 4, 3, 5});
  // num_keys=1 ignores the second operand's order
  auto r3 = lax::sort({k1, k2, idx}, 0, true, 1);
  CHECK(iv(r3[2]) == std::vector<int64_t>{2, 3, 0, 1});
  // along dimension 0 of a matrix, values follow keys column by column
  Array km = arr<float>({3, 1, 1, 2, 2, 0}, {3, 2});
  Array vm = jnp::array<int32_t>({0, 1, 2, 3, 4, 5}, {3, 2});
  auto rm = lax::sort({km, vm}, 0, true, 1);
  CHECK(dv(rm[0]) == std::vector<double>{1, 0, 2, 1, 3, 2});
  CHECK(iv(rm[1]) == std::vector<int64_t>{2, 5, 4, 1, 0, 3});
  // unstable request: still a valid sort
  auto ru = lax::sort({k, v}, 0, false, 1);
  CHECK(iv(ru[0]) == std::vector<int64_t>{1, 1, 2, 2});
}

TEST_CASE("large sort matches std::sort, stable argsort keeps ties in order") {
  std::mt19937 rng(42);
  std::uniform_int_distribution<int> d(-500, 500);
  std::vector<float> v(100000);
  for (auto& e : v) e = float(d(rng)) * 0.5f;
  auto got = lax::sort(jnp::array<float>(v)).to_vector<float>();
  std::vector<float> ref = v;
  std::sort(ref.begin(), ref.end());
  CHECK(got == ref);
  auto idx = jnp::argsort(jnp::array<float>(v)).to_vector<int64_t>();
  std::vector<int64_t> ridx(v.size());
  std::iota(ridx.begin(), ridx.end(), int64_t(0));
  std::stable_sort(ridx.begin(), ridx.end(), [&](int64_t a, int64_t b) { return v[size_t(a)] < v[size_t(b)]; });
  CHECK(idx == ridx);
}

TEST_CASE("jnp.sort / jnp.argsort") {
  Array x = arr<float>({3, 1, 2, 1, 3});
  CHECK(iv(jnp::argsort(x)) == std::vector<int64_t>{1, 3, 2, 0, 4});
  CHECK(jnp::argsort(x).dtype() == DType::int32);
  CHECK(iv(jnp::argsort(arr<double>({kNaN, 1, -kInf}))) == std::vector<int64_t>{2, 1, 0});
  Array m = arr<float>({4, 2, 9, 1, 3, 0}, {2, 3});
  CHECK(dv(jnp::sort(m)) == std::vector<double>{2, 4, 9, 0, 1, 3});
  CHECK(dv(jnp::sort(m, 0)) == std::vector<double>{1, 2, 0, 4, 3, 9});
  CHECK(dv(jnp::sort(m, std::nullopt)) == std::vector<double>{0, 1, 2, 3, 4, 9});
  CHECK(jnp::sort(m, std::nullopt).shape() == Shape{6});
  CHECK(iv(jnp::argsort(m)) == std::vector<int64_t>{1, 0, 2, 2, 0, 1});
  CHECK(iv(jnp::argsort(m, 0)) == std::vector<int64_t>{1, 0, 1, 0, 1, 0});
  CHECK(iv(jnp::argsort(m, std::nullopt)) == std::vector<int64_t>{5, 3, 1, 4, 0, 2});
  CHECK(iv(jnp::argsort(jnp::array<bool>({true, false, true, false}))) == std::vector<int64_t>{1, 3, 0, 2});
  CHECK(dv(jnp::sort(Array(2.f), std::nullopt)) == std::vector<double>{2});
  CHECK(jnp::argsort(jnp::zeros({0})).shape() == Shape{0});
}

TEST_CASE("top_k: descending values, int32 indices, ties by lower index, NaN largest") {
  auto [v, i] = lax::top_k(arr<float>({1, 5, 3, 5, 2}), 3);
  CHECK(dv(v) == std::vector<double>{5, 5, 3});
  CHECK(iv(i) == std::vector<int64_t>{1, 3, 2});
  CHECK(i.dtype() == DType::int32);
  CHECK(v.dtype() == DType::float32);
  auto [vn, in] = lax::top_k(arr<double>({1, kNaN, 3, -kInf}), 2);
  CHECK(std::isnan(dv(vn)[0]));
  CHECK(dv(vn)[1] == 3);
  CHECK(iv(in) == std::vector<int64_t>{1, 2});
  auto [vm, im] = lax::top_k(jnp::array<int32_t>({4, 9, 1, 7, 7, 0}, {2, 3}), 2);
  CHECK(vm.shape() == Shape{2, 2});
  CHECK(iv(vm) == std::vector<int64_t>{9, 4, 7, 7});
  CHECK(iv(im) == std::vector<int64_t>{1, 0, 0, 1});
  auto each = [](auto tag) {
    using T = typename decltype(tag)::type;
    auto [tv, ti] = lax::top_k(arr<T>({2, 8, 4, 6}), 2);
    CAPTURE(dtype_name(tv.dtype()));
    CHECK(dv(tv) == std::vector<double>{8, 6});
    CHECK(iv(ti) == std::vector<int64_t>{1, 3});
  };
  each(Tag<int8_t>{});
  each(Tag<int16_t>{});
  each(Tag<int64_t>{});
  each(Tag<uint8_t>{});
  each(Tag<uint32_t>{});
  each(Tag<bfloat16_t>{});
  each(Tag<float16_t>{});
  each(Tag<double>{});
  auto [v0, i0] = lax::top_k(arr<float>({1, 2}), 0);
  CHECK(v0.shape() == Shape{0});
  auto [va, ia] = lax::top_k(arr<float>({1, 2}), 2);
  CHECK(dv(va) == std::vector<double>{2, 1});
  auto [ve, ie] = lax::top_k(jnp::zeros({0, 4}), 2);
  CHECK(ve.shape() == Shape{0, 2});
}

TEST_CASE("sort / top_k misuse") {
  Array x = jnp::zeros({2, 3});
  CHECK_THROWS_WITH_AS(lax::sort(x, 2), Contains("axis 2 is out of bounds for an array of rank 2"), ValueError);
  CHECK_THROWS_WITH_AS(lax::sort(x, -3), Contains("axis -3"), ValueError);
  CHECK_THROWS_WITH_AS(cjax::bind(*find_primitive("sort"), {x},
                                  Params{{"dimension", int64_t(5)}, {"is_stable", true}, {"num_keys", int64_t(1)}}),
                       Contains("sort: dimension 5 is out of bounds for operands of rank 2 and shape (2, 3)"),
                       ValueError);
  CHECK_THROWS_WITH_AS(lax::sort({x, jnp::zeros({3, 2})}, 0), Contains("operand 1 has shape (3, 2)"), ShapeError);
  CHECK_THROWS_WITH_AS(lax::sort({x, x}, 0, true, 3), Contains("num_keys=3"), ValueError);
  CHECK_THROWS_WITH_AS(lax::sort({x}, 0, true, 0), Contains("num_keys=0"), ValueError);
  CHECK_THROWS_WITH_AS(lax::sort(Array(1.f)), Contains("got a scalar"), ShapeError);
  CHECK_THROWS_WITH_AS(jnp::sort(x, 4), Contains("axis 4"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::argsort(x, -5), Contains("axis -5"), ValueError);
  CHECK_THROWS_WITH_AS(lax::top_k(x, 4), Contains("k=4 is larger than the last dimension (3)"), ValueError);
  CHECK_THROWS_WITH_AS(lax::top_k(x, -1), Contains("k must be nonnegative, got k=-1"), ValueError);
  CHECK_THROWS_WITH_AS(lax::top_k(Array(1.f), 1), Contains("at least one dimension"), ShapeError);
  CHECK_THROWS_WITH_AS(lax::top_k(jnp::zeros({3}, DType::bool_), 1), Contains("does not accept dtype bool"),
                       DTypeError);
}
