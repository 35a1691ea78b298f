// Reductions, cumulative ops and numpy reductions. Reference values computed offline with numpy.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "cjax/cjax.h"
#include "core/array/primitive.h"
#include "core/array/visit_dtype.h"
#include "test_util.h"

using namespace cjax;
namespace jnp = cjax::numpy;
using doctest::Approx;
using doctest::Contains;

using namespace cjax::testing;
namespace {
Array arange_f32(int64_t n, Shape s) {
  std::vector<float> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0.f);
  return jnp::array<float>(v, s);
}
bool near(double got, double ref, double tol) { return std::fabs(got - ref) <= tol; }

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST_CASE("reduce_sum over each axis set, negative axes, empty axes list") {
  Array x = arange_f32(24, {2, 3, 4});
  CHECK(lax::reduce_sum(x, {0, 2}).shape() == Shape{3});
  CHECK(dv(lax::reduce_sum(x, {0, 2})) == std::vector<double>{60, 92, 124});
  CHECK(dv(lax::reduce_sum(x, {2, 0})) == std::vector<double>{60, 92, 124});  // sorted
  CHECK(dv(lax::reduce_sum(x, {-1, -3})) == std::vector<double>{60, 92, 124});
  CHECK(dv(lax::reduce_max(x, {1})) == std::vector<double>{8, 9, 10, 11, 20, 21, 22, 23});
  CHECK(lax::reduce_sum(x, {0, 1, 2}).shape() == Shape{});
  CHECK(lax::reduce_sum(x, {0, 1, 2}).item<double>() == 276);
  CHECK(dv(lax::reduce_sum(x, {})) == dv(x));
  Array m = arange_f32(6, {2, 3});
  CHECK(dv(lax::reduce_sum(m, {0})) == std::vector<double>{3, 5, 7});
  CHECK(dv(lax::reduce_sum(m, {1})) == std::vector<double>{3, 12});
  // size-1 axes
  Array y = arange_f32(6, {1, 6, 1});
  CHECK(dv(lax::reduce_sum(y, {0, 2})) == std::vector<double>{0, 1, 2, 3, 4, 5});
  // scalars
  CHECK(lax::reduce_sum(Array(2.5f), {}).item<float>() == 2.5f);
}

TEST_CASE("reduce_sum / prod / max / min on every numeric dtype") {
  std::vector<double> v{1, 2, 3, 4, 5, 6};
  auto check = [&](auto tag) {
    using T = typename decltype(tag)::type;
    Array x = arr<T>(v, {2, 3});
    CAPTURE(dtype_name(x.dtype()));
    Array s = lax::reduce_sum(x, {1});
    CHECK(s.dtype() == x.dtype());
    CHECK(dv(s) == std::vector<double>{6, 15});
    CHECK(dv(lax::reduce_prod(x, {1})) == std::vector<double>{6, 120});
    CHECK(dv(lax::reduce_max(x, {0})) == std::vector<double>{4, 5, 6});
    CHECK(dv(lax::reduce_min(x, {0, 1})) == std::vector<double>{1});
  };
  check(Tag<int8_t>{});
  check(Tag<int16_t>{});
  check(Tag<int32_t>{});
  check(Tag<int64_t>{});
  check(Tag<uint8_t>{});
  check(Tag<uint32_t>{});
  check(Tag<bfloat16_t>{});
  check(Tag<float16_t>{});
  check(Tag<float>{});
  check(Tag<double>{});
}

TEST_CASE("integer sums and products wrap like XLA") {
  CHECK(lax::reduce_sum(jnp::array<int8_t>({100, 100}), {0}).item<int>() == -56);
  CHECK(lax::reduce_sum(jnp::array<uint8_t>({200, 100}), {0}).item<int>() == 44);
  CHECK(lax::reduce_prod(jnp::array<int32_t>({65536, 65536}), {0}).item<int>() == 0);
  CHECK(lax::reduce_prod(jnp::array<int16_t>({-300, 300}), {0}).item<int>() == -24464);  // -90000 wrapped to int16
  CHECK(lax::reduce_sum(jnp::array<int32_t>({2147483647, 1}), {0}).item<int64_t>() == -2147483648LL);
  CHECK(lax::reduce_sum(jnp::array<uint32_t>({4294967295u, 2u}), {0}).item<int64_t>() == 1);
}

TEST_CASE("bf16 / f16 sums accumulate in f32") {
  // 4096 ones in bf16: a bf16 accumulator would stop at 256.
  std::vector<bfloat16_t> ones(4096, bfloat16_t(1.f));
  CHECK(lax::reduce_sum(jnp::array<bfloat16_t>(ones), {0}).item<float>() == 4096.f);
  std::vector<float16_t> h(3000, float16_t(1.f));
  CHECK(lax::reduce_sum(jnp::array<float16_t>(h), {0}).item<float>() == 3000.f);
}

TEST_CASE("reduce_and / reduce_or on bool and integers") {
  Array b = jnp::array<bool>({true, false, true, true}, {2, 2});
  CHECK(iv(lax::reduce_and(b, {1})) == std::vector<int64_t>{0, 1});
  CHECK(iv(lax::reduce_or(b, {1})) == std::vector<int64_t>{1, 1});
  CHECK(iv(lax::reduce_or(b, {0})) == std::vector<int64_t>{1, 1});
  CHECK(lax::reduce_and(b, {1}).dtype() == DType::bool_);
  Array i = jnp::array<int32_t>({6, 3, 12});
  CHECK(lax::reduce_and(i, {0}).item<int>() == 0);
  CHECK(lax::reduce_or(i, {0}).item<int>() == 15);
  CHECK(lax::reduce_and(jnp::array<uint8_t>({0xF0, 0x3C}), {0}).item<int>() == 0x30);
  // bool max/min = or/and
  CHECK(iv(lax::reduce_max(b, {1})) == std::vector<int64_t>{1, 1});
  CHECK(iv(lax::reduce_min(b, {1})) == std::vector<int64_t>{0, 1});
}

TEST_CASE("empty reductions give the identity; zero-size kept axes give empty results") {
  Array e = jnp::zeros({0, 3});
  CHECK(dv(lax::reduce_sum(e, {0})) == std::vector<double>{0, 0, 0});
  CHECK(dv(lax::reduce_prod(e, {0})) == std::vector<double>{1, 1, 1});
  CHECK(dv(lax::reduce_max(e, {0})) == std::vector<double>{-kInf, -kInf, -kInf});
  CHECK(dv(lax::reduce_min(e, {0})) == std::vector<double>{kInf, kInf, kInf});
  CHECK(lax::reduce_sum(e, {1}).shape() == Shape{0});
  CHECK(lax::reduce_sum(e, {0, 1}).item<float>() == 0.f);
  Array ei = jnp::zeros({0, 2}, DType::int32);
  CHECK(iv(lax::reduce_max(ei, {0})) == std::vector<int64_t>{INT32_MIN, INT32_MIN});
  CHECK(iv(lax::reduce_min(ei, {0})) == std::vector<int64_t>{INT32_MAX, INT32_MAX});
  Array eu = jnp::zeros({0}, DType::uint8);
  CHECK(lax::reduce_min(eu, {0}).item<int>() == 255);
  CHECK(lax::reduce_and(eu, {0}).item<int>() == 255);
  Array eb = jnp::zeros({2, 0}, DType::bool_);
  CHECK(iv(lax::reduce_and(eb, {1})) == std::vector<int64_t>{1, 1});
  CHECK(iv(lax::reduce_or(eb, {1})) == std::vector<int64_t>{0, 0});
  CHECK(iv(lax::reduce_max(eb, {1})) == std::vector<int64_t>{0, 0});
}

TEST_CASE("NaN and Inf propagate through max/min/sum") {
  Array x = arr<float>({1, kNaN, 3, -kInf, 2, kInf}, {2, 3});
  auto mx = dv(lax::reduce_max(x, {1}));
  CHECK(std::isnan(mx[0]));
  CHECK(mx[1] == kInf);
  auto mn = dv(lax::reduce_min(x, {1}));
  CHECK(std::isnan(mn[0]));
  CHECK(mn[1] == -kInf);
  auto s = dv(lax::reduce_sum(x, {1}));
  CHECK(std::isnan(s[0]));
  CHECK(std::isnan(s[1]));  // -inf + inf
  // NaN first, last and in a column reduction
  CHECK(std::isnan(lax::reduce_max(arr<double>({kNaN, 1, 2}), {0}).item<double>()));
  CHECK(std::isnan(lax::reduce_min(arr<float>({1, 2, kNaN}), {0}).item<float>()));
  auto col = dv(lax::reduce_max(arr<float>({1, 5, kNaN, 2, 3, 4}, {3, 2}), {0}));
  CHECK(std::isnan(col[0]));
  CHECK(col[1] == 5);
  CHECK(std::isnan(lax::reduce_max(arr<bfloat16_t>({1, kNaN}), {0}).item<float>()));
}

TEST_CASE("large reductions: inner, outer, middle axes vs double references") {
  const int64_t A = 37, B = 1000, C = 65;
  std::vector<float> v(size_t(A * B * C));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float((i * 7919) % 1000) / 1000.f - 0.5f;
  Array x = jnp::array<float>(v, {A, B, C});
  // over axis 1 (outer rows streamed into an accumulator row)
  auto s1 = dv(lax::reduce_sum(x, {1}));
  REQUIRE(s1.size() == size_t(A * C));
  for (int64_t a = 0; a < A; a += 9)
    for (int64_t c = 0; c < C; c += 16) {
      double ref = 0;
      for (int64_t b = 0; b < B; ++b) ref += v[size_t((a * B + b) * C + c)];
      CHECK(near(s1[size_t(a * C + c)], ref, 1e-3));
    }
  // over axes {0, 2} (non-adjacent)
  auto s02 = dv(lax::reduce_sum(x, {0, 2}));
  for (int64_t b = 0; b < B; b += 111) {
    double ref = 0;
    for (int64_t a = 0; a < A; ++a)
      for (int64_t c = 0; c < C; ++c) ref += v[size_t((a * B + b) * C + c)];
    CHECK(near(s02[size_t(b)], ref, 1e-3));
  }
  // max over the outer axis
  auto m0 = dv(lax::reduce_max(x, {0}));
  for (int64_t k = 0; k < B * C; k += 997) {
    double ref = -kInf;
    for (int64_t a = 0; a < A; ++a) ref = std::max(ref, double(v[size_t(a * B * C + k)]));
    CHECK(m0[size_t(k)] == ref);
  }
  // long inner rows: [3, 100000] over axis 1
  Array y = jnp::array<float>(std::vector<float>(v.begin(), v.begin() + 300000), {3, 100000});
  auto s = dv(lax::reduce_sum(y, {1}));
  for (int r = 0; r < 3; ++r) {
    double ref = 0;
    for (int64_t i = 0; i < 100000; ++i) ref += v[size_t(r * 100000 + i)];
    CHECK(near(s[size_t(r)], ref, 1e-2));
  }
  // tall and thin: [200000, 2] over axis 0 (row-blocked)
  Array t = jnp::array<float>(std::vector<float>(v.begin(), v.begin() + 400000), {200000, 2});
  auto st = dv(lax::reduce_sum(t, {0}));
  double r0 = 0, r1 = 0;
  for (int64_t i = 0; i < 200000; ++i) {
    r0 += v[size_t(2 * i)];
    r1 += v[size_t(2 * i + 1)];
  }
  CHECK(near(st[0], r0, 1e-2));
  CHECK(near(st[1], r1, 1e-2));
}

TEST_CASE("f32 sum of 1M elements is deterministic and accurate") {
  const int64_t n = 1 << 20;
  std::vector<float> v(static_cast<size_t>(n));
  double ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    v[size_t(i)] = float(std::sin(double(i) * 0.001) * 3.0 + 0.25);
    ref += double(v[size_t(i)]);
  }
  Array x = jnp::array<float>(v);
  float a = lax::reduce_sum(x, {0}).item<float>();
  float b = lax::reduce_sum(x, {0}).item<float>();
  float c = jnp::sum(x).item<float>();
  CHECK(std::memcmp(&a, &b, 4) == 0);
  CHECK(std::memcmp(&a, &c, 4) == 0);
  CHECK(double(a) == Approx(ref).epsilon(1e-6));
  // the same data as rows of a matrix reduced twice gives identical bits too
  Array m = x.reshape({16, n / 16});
  CHECK(dv(lax::reduce_sum(m, {1})) == dv(lax::reduce_sum(m, {1})));
}

TEST_CASE("argmax / argmin: first occurrence, NaN wins, axes, index dtype") {
  Array x = arr<float>({1, 3, 3, 0, 2, 0}, {2, 3});
  CHECK(iv(lax::argmax(x, 1)) == std::vector<int64_t>{1, 1});
  CHECK(iv(lax::argmin(x, 1)) == std::vector<int64_t>{0, 0});
  CHECK(iv(lax::argmax(x, 0)) == std::vector<int64_t>{0, 0, 0});
  CHECK(iv(lax::argmin(x, -2)) == std::vector<int64_t>{1, 1, 1});
  CHECK(lax::argmax(x, 1).dtype() == DType::int32);
  CHECK(lax::argmax(x, 1, DType::int64).dtype() == DType::int64);
  Array n = arr<float>({1, kNaN, 5, kNaN}, {4});
  CHECK(lax::argmax(n, 0).item<int>() == 1);
  CHECK(lax::argmin(n, 0).item<int>() == 1);
  Array n2 = arr<double>({1, 9, 2, kNaN, 3, 5, kNaN, 0}, {4, 2});
  CHECK(iv(lax::argmax(n2, 0)) == std::vector<int64_t>{3, 1});
  CHECK(iv(lax::argmin(n2, 0)) == std::vector<int64_t>{3, 1});
  auto each = [&](auto tag) {
    using T = typename decltype(tag)::type;
    Array y = arr<T>({2, 7, 7, 1, 1, 5}, {2, 3});
    CAPTURE(dtype_name(y.dtype()));
    CHECK(iv(lax::argmax(y, 1)) == std::vector<int64_t>{1, 2});
    CHECK(iv(lax::argmin(y, 1)) == std::vector<int64_t>{0, 0});
    CHECK(iv(lax::argmax(y, 0)) == std::vector<int64_t>{0, 0, 0});
  };
  each(Tag<int8_t>{});
  each(Tag<int16_t>{});
  each(Tag<int32_t>{});
  each(Tag<int64_t>{});
  each(Tag<uint8_t>{});
  each(Tag<uint32_t>{});
  each(Tag<bfloat16_t>{});
  each(Tag<float16_t>{});
  each(Tag<double>{});
  Array b = jnp::array<bool>({false, true, true});
  CHECK(lax::argmax(b, 0).item<int>() == 1);
  CHECK(lax::argmin(b, 0).item<int>() == 0);
  CHECK(lax::argmax(jnp::zeros({0, 3}), 1).shape() == Shape{0});
}

TEST_CASE("cumulative ops: cumsum / cumprod / cummax / cummin / cumlogsumexp, reverse, axes") {
  Array x = arr<int32_t>({1, 2, 3, 4}, {2, 2});
  CHECK(iv(lax::cumsum(x, 1)) == std::vector<int64_t>{1, 3, 3, 7});
  CHECK(iv(lax::cumsum(x, 0)) == std::vector<int64_t>{1, 2, 4, 6});
  CHECK(iv(lax::cumsum(x, 1, true)) == std::vector<int64_t>{3, 2, 7, 4});
  CHECK(iv(lax::cumprod(x, 1)) == std::vector<int64_t>{1, 2, 3, 12});
  CHECK(iv(lax::cumprod(x, 0, true)) == std::vector<int64_t>{3, 8, 3, 4});
  Array y = arr<float>({3, 1, 4, 1, 5, 9, 2, 6}, {8});
  CHECK(dv(lax::cummax(y)) == std::vector<double>{3, 3, 4, 4, 5, 9, 9, 9});
  CHECK(dv(lax::cummin(y)) == std::vector<double>{3, 1, 1, 1, 1, 1, 1, 1});
  CHECK(dv(lax::cummax(y, 0, true)) == std::vector<double>{9, 9, 9, 9, 9, 9, 6, 6});
  auto l = dv(lax::cumlogsumexp(arr<double>({0, 1, 2, -1})));
  std::vector<double> lref{0., 1.31326169, 2.40760596, 2.4401897};
  for (size_t i = 0; i < 4; ++i) CHECK(l[i] == Approx(lref[i]).epsilon(1e-7));
  auto lr = dv(lax::cumlogsumexp(arr<float>({0, 1, 2, -1}), 0, true));
  std::vector<double> lrref{2.4401897, 2.34901222, 2.04858735, -1.};
  for (size_t i = 0; i < 4; ++i) CHECK(lr[i] == Approx(lrref[i]).epsilon(1e-6));
  auto li = dv(lax::cumlogsumexp(arr<float>({-kInf, -kInf, 0, kInf})));
  CHECK(li[0] == -kInf);
  CHECK(li[1] == -kInf);
  CHECK(li[2] == 0);
  CHECK(li[3] == kInf);
  // NaN propagates forward
  auto cn = dv(lax::cumsum(arr<float>({1, kNaN, 2})));
  CHECK(cn[0] == 1);
  CHECK(std::isnan(cn[1]));
  CHECK(std::isnan(cn[2]));
  auto cm = dv(lax::cummax(arr<float>({1, kNaN, 2})));
  CHECK(std::isnan(cm[2]));
  // bf16 cumsum accumulates in f32 (256 + 1 + 1 ... stays exact where representable)
  std::vector<bfloat16_t> ones(300, bfloat16_t(1.f));
  auto cb = dv(lax::cumsum(jnp::array<bfloat16_t>(ones)));
  CHECK(cb[255] == 256);
  CHECK(cb[299] == 300);  // 300 is exact in bf16; an all-bf16 accumulator would stick at 256
  // int8 wraps
  CHECK(iv(lax::cumsum(jnp::array<int8_t>({100, 100, 100}))) == std::vector<int64_t>{100, -56, 44});
  // 3-D middle axis, larger than one block
  Array z = arange_f32(2 * 5000 * 3, {2, 5000, 3});
  auto cz = dv(lax::cumsum(z, 1));
  CHECK(cz[size_t(4999 * 3 + 2)] == Approx(double(5000) * (2 + 14999) / 2).epsilon(1e-4));
  CHECK(lax::cumsum(jnp::zeros({0, 4}), 0).shape() == Shape{0, 4});
}

// ---------------------------------------------------------------------------------------------
// numpy layer
// ---------------------------------------------------------------------------------------------
TEST_CASE("jnp.sum / prod: dtype promotion, keepdims, axes, dtype argument") {
  Array b = jnp::array<bool>({true, true, false, true});
  CHECK(jnp::sum(b).dtype() == DType::int32);
  CHECK(jnp::sum(b).item<int>() == 3);
  CHECK(jnp::sum(jnp::array<int8_t>({100, 100})).dtype() == DType::int32);
  CHECK(jnp::sum(jnp::array<int8_t>({100, 100})).item<int>() == 200);
  CHECK(jnp::sum(jnp::array<int16_t>({30000, 30000})).item<int>() == 60000);
  CHECK(jnp::sum(jnp::array<uint8_t>({200, 100})).dtype() == DType::uint32);
  CHECK(jnp::sum(jnp::array<uint8_t>({200, 100})).item<int>() == 300);
  CHECK(jnp::sum(jnp::array<int64_t>({1, 2})).dtype() == DType::int64);
  CHECK(jnp::sum(arr<bfloat16_t>({1, 2})).dtype() == DType::bfloat16);
  CHECK(jnp::sum(arr<float16_t>({1, 2})).item<float>() == 3.f);
  Array x = arange_f32(24, {2, 3, 4});
  CHECK(jnp::sum(x, {0, 2}, true).shape() == Shape{1, 3, 1});
  CHECK(dv(jnp::sum(x, {0, -1}, true)) == std::vector<double>{60, 92, 124});
  CHECK(jnp::sum(x, -1).shape() == Shape{2, 3});
  CHECK(jnp::sum(x, None, true).shape() == Shape{1, 1, 1});
  CHECK(jnp::sum(x, std::vector<int64_t>{}, false).shape() == Shape{2, 3, 4});  // an empty axis list reduces nothing
  CHECK(jnp::sum(x, 1, false, DType::float64).dtype() == DType::float64);
  CHECK(jnp::sum(x, 1, false, DType::int32).dtype() == DType::int32);
  CHECK(jnp::sum(jnp::array<int32_t>({1, 0, 2}), None, false, DType::bool_).item<bool>() == true);
  // zero-size
  CHECK(dv(jnp::sum(jnp::zeros({0, 3}), 0)) == std::vector<double>{0, 0, 0});
  CHECK(jnp::sum(jnp::zeros({0, 3}), 1).shape() == Shape{0});
  CHECK(jnp::sum(jnp::zeros({0})).item<float>() == 0.f);
  // 0-d and weak scalars: strongly typed result
  CHECK(jnp::sum(Array(2.5f)).item<float>() == 2.5f);
  CHECK(jnp::sum(Array(2.5f)).weak_type() == false);
  CHECK(jnp::sum(Array(3)).dtype() == DType::int32);
  // prod
  CHECK(iv(jnp::prod(jnp::array<int32_t>({1, 2, 3, 4, 5, 6}, {2, 3}), 1)) == std::vector<int64_t>{6, 120});
  CHECK(jnp::prod(b).dtype() == DType::int32);
  CHECK(jnp::prod(b).item<int>() == 0);
  CHECK(jnp::prod(jnp::array<int8_t>({16, 16})).item<int>() == 256);
  CHECK(jnp::prod(jnp::zeros({0})).item<float>() == 1.f);
  CHECK(jnp::prod(b, None, false, DType::bool_).item<bool>() == false);
}

TEST_CASE("jnp.mean / var / std") {
  Array a = arr<float>({1, 2, 3, 4, 2, 4, 4, 5}, {2, 4});
  auto m = dv(jnp::mean(a, 1));
  CHECK(m[0] == Approx(2.5));
  CHECK(m[1] == Approx(3.75));
  auto v = dv(jnp::var(a, 1));
  CHECK(v[0] == Approx(1.25));
  CHECK(v[1] == Approx(1.1875));
  auto v1 = dv(jnp::var(a, 1, 1));
  CHECK(v1[0] == Approx(1.6666666));
  CHECK(v1[1] == Approx(1.5833334));
  auto s = dv(jnp::std(a, 1));
  CHECK(s[0] == Approx(1.118034));
  CHECK(s[1] == Approx(1.0897248));
  CHECK(jnp::var(a).item<float>() == Approx(1.609375));
  CHECK(jnp::std(a, None, 1).item<float>() == Approx(1.3562027));
  CHECK(jnp::var(a, 1, 0, true).shape() == Shape{2, 1});
  Array i = jnp::array<int32_t>({1, 2, 3, 4, 5, 7}, {2, 3});
  CHECK(jnp::mean(i).dtype() == DType::float32);
  CHECK(dv(jnp::mean(i, 0)) == std::vector<double>{2.5, 3.5, 5.0});
  CHECK(jnp::mean(i).item<float>() == Approx(3.6666667));
  CHECK(jnp::var(i).item<float>() == Approx(3.8888889));
  CHECK(jnp::var(i).dtype() == DType::float32);
  CHECK(jnp::mean(jnp::array<bool>({true, false, true, true})).item<float>() == 0.75f);
  CHECK(jnp::mean(i, None, false, DType::float64).dtype() == DType::float64);
  CHECK(jnp::mean(arr<bfloat16_t>({1, 2, 3, 4})).dtype() == DType::bfloat16);
  CHECK(jnp::mean(arr<bfloat16_t>({1, 2, 3, 4})).item<float>() == 2.5f);
  CHECK(jnp::std(arr<float16_t>({1, 3})).item<float>() == 1.f);
  CHECK(jnp::mean(a, {0, 1}, true).shape() == Shape{1, 1});
  // empty: NaN (0/0) like numpy; var with ddof >= n: inf/nan
  CHECK(std::isnan(jnp::mean(jnp::zeros({0})).item<float>()));
  CHECK(dv(jnp::mean(jnp::zeros({0, 2}), 1)).empty());
  CHECK(std::isinf(jnp::var(arr<float>({1, 3}), None, 2).item<float>()));
  CHECK(std::isnan(jnp::mean(arr<float>({1, kNaN})).item<float>()));
}

TEST_CASE("jnp.max / min / amax / amin / any / all") {
  Array x = arr<float>({1, 5, -2, 7, 0, 3}, {2, 3});
  CHECK(jnp::max(x).item<float>() == 7);
  CHECK(jnp::min(x).item<float>() == -2);
  CHECK(dv(jnp::amax(x, 0)) == std::vector<double>{7, 5, 3});
  CHECK(dv(jnp::amin(x, -1)) == std::vector<double>{-2, 0});
  CHECK(jnp::max(x, 1, true).shape() == Shape{2, 1});
  CHECK(std::isnan(jnp::max(arr<float>({1, kNaN, 3})).item<float>()));
  CHECK(jnp::max(jnp::array<int8_t>({-5, -3})).item<int>() == -3);
  CHECK(jnp::max(jnp::array<int8_t>({-5, -3})).dtype() == DType::int8);
  CHECK(jnp::min(jnp::array<bool>({true, false})).item<bool>() == false);
  CHECK(jnp::max(Array(4)).item<int>() == 4);
  // reducing a non-empty axis of an array with a zero-size kept axis is fine
  CHECK(jnp::max(jnp::zeros({0, 3}), 1).shape() == Shape{0});
  Array b = jnp::array<bool>({true, false, true, true}, {2, 2});
  CHECK(iv(jnp::any(b, 1)) == std::vector<int64_t>{1, 1});
  CHECK(iv(jnp::all(b, 1)) == std::vector<int64_t>{0, 1});
  CHECK(jnp::all(b).item<bool>() == false);
  CHECK(jnp::any(arr<float>({0, 0, kNaN})).item<bool>() == true);  // NaN is truthy
  CHECK(jnp::any(jnp::array<int32_t>({0, 0})).item<bool>() == false);
  CHECK(jnp::all(jnp::zeros({0})).item<bool>() == true);
  CHECK(jnp::any(jnp::zeros({0})).item<bool>() == false);
  CHECK(jnp::all(b, 0, true).shape() == Shape{1, 2});
}

TEST_CASE("jnp.argmax / argmin") {
  Array x = arr<float>({1, 9, 9, 4, 0, 4}, {2, 3});
  CHECK(jnp::argmax(x).item<int>() == 1);
  CHECK(jnp::argmin(x).item<int>() == 4);
  CHECK(jnp::argmax(x).dtype() == DType::int32);
  CHECK(iv(jnp::argmax(x, 1)) == std::vector<int64_t>{1, 0});
  CHECK(iv(jnp::argmin(x, -1)) == std::vector<int64_t>{0, 1});
  CHECK(jnp::argmax(x, 0, true).shape() == Shape{1, 3});
  CHECK(jnp::argmax(x, std::nullopt, true).shape() == Shape{1, 1});
  CHECK(jnp::argmax(arr<float>({1, kNaN, 3})).item<int>() == 1);
  CHECK(jnp::argmin(arr<float>({1, 3, kNaN})).item<int>() == 2);
  CHECK(jnp::argmax(Array(3.f)).item<int>() == 0);
}

TEST_CASE("jnp.logsumexp") {
  CHECK(jnp::logsumexp(arr<double>({1, 2, 3})).item<double>() == Approx(3.40760596444438));
  auto r = dv(jnp::logsumexp(arr<float>({0.5, -1, 2, 3, 3, 3}, {2, 3}), 1));
  CHECK(r[0] == Approx(2.2413113));
  CHECK(r[1] == Approx(4.09861229));
  // large values: stable
  CHECK(jnp::logsumexp(arr<float>({1000, 1000})).item<float>() == Approx(1000.6931472));
  // rows of -inf give -inf; +inf gives +inf; NaN propagates
  auto s = dv(jnp::logsumexp(arr<float>({-kInf, -kInf, 1, kInf, kNaN, 0}, {3, 2}), 1));
  CHECK(s[0] == -kInf);
  CHECK(s[1] == kInf);
  CHECK(std::isnan(s[2]));
  CHECK(jnp::logsumexp(jnp::zeros({0})).item<float>() == -kInf);
  CHECK(jnp::logsumexp(jnp::array<int32_t>({0, 0})).dtype() == DType::float32);
  CHECK(jnp::logsumexp(jnp::array<int32_t>({0, 0})).item<float>() == Approx(0.6931472));
  CHECK(jnp::logsumexp(arr<float>({1, 2, 3, 4}, {2, 2}), 0, true).shape() == Shape{1, 2});
}

TEST_CASE("jnp.cumsum / cumprod / count_nonzero") {
  Array x = jnp::array<int32_t>({1, 2, 3, 4}, {2, 2});
  CHECK(iv(jnp::cumsum(x)) == std::vector<int64_t>{1, 3, 6, 10});
  CHECK(jnp::cumsum(x).shape() == Shape{4});
  CHECK(iv(jnp::cumsum(x, 0)) == std::vector<int64_t>{1, 2, 4, 6});
  CHECK(iv(jnp::cumsum(x, -1)) == std::vector<int64_t>{1, 3, 3, 7});
  CHECK(iv(jnp::cumprod(x)) == std::vector<int64_t>{1, 2, 6, 24});
  CHECK(jnp::cumsum(x, 0, DType::float32).dtype() == DType::float32);
  Array b = jnp::array<bool>({true, true, false});
  CHECK(jnp::cumsum(b).dtype() == DType::int32);
  CHECK(iv(jnp::cumsum(b)) == std::vector<int64_t>{1, 2, 2});
  CHECK(jnp::cumsum(jnp::array<int8_t>({1, 2})).dtype() == DType::int8);
  CHECK(dv(jnp::cumsum(Array(2.f))) == std::vector<double>{2});
  CHECK(jnp::cumsum(jnp::zeros({0})).shape() == Shape{0});
  CHECK(dv(jnp::cumprod(arr<bfloat16_t>({2, 3}))) == std::vector<double>{2, 6});
  Array z = arr<float>({0, 1, 0, kNaN, -0.0, 2}, {2, 3});
  CHECK(jnp::count_nonzero(z).item<int>() == 3);
  CHECK(jnp::count_nonzero(z).dtype() == DType::int32);
  CHECK(iv(jnp::count_nonzero(z, 1)) == std::vector<int64_t>{1, 2});
  CHECK(jnp::count_nonzero(z, 0, true).shape() == Shape{1, 3});
  CHECK(jnp::count_nonzero(jnp::array<bool>({true, false, true})).item<int>() == 2);
}

TEST_CASE("jnp.linalg.norm") {
  Array v = arr<float>({3, -4, 0, 1});
  CHECK(jnp::linalg::norm(v).item<float>() == Approx(5.0990195));
  CHECK(jnp::linalg::norm(v, 1.0).item<float>() == 8);
  CHECK(jnp::linalg::norm(v, 2.0).item<float>() == Approx(5.0990195));
  CHECK(jnp::linalg::norm(v, kInf).item<float>() == 4);
  CHECK(jnp::linalg::norm(v, -kInf).item<float>() == 0);
  CHECK(jnp::linalg::norm(v, 0.0).item<float>() == 3);
  CHECK(jnp::linalg::norm(v, 3.0).item<float>() == Approx(4.5143576));
  Array m = arr<float>({1, -2, 3, -4, 5, -6}, {2, 3});
  CHECK(jnp::linalg::norm(m).item<float>() == Approx(9.539392));
  CHECK(jnp::linalg::norm(m, 1.0).item<float>() == 9);
  CHECK(jnp::linalg::norm(m, -1.0).item<float>() == 5);
  CHECK(jnp::linalg::norm(m, kInf).item<float>() == 15);
  CHECK(jnp::linalg::norm(m, -kInf).item<float>() == 6);
  CHECK(jnp::linalg::norm(m, 1.0, {1, 0}).item<float>() == 15);
  auto rows = dv(jnp::linalg::norm(m, std::nullopt, 1));
  CHECK(rows[0] == Approx(3.7416575));
  CHECK(rows[1] == Approx(8.774964));
  CHECK(jnp::linalg::norm(m, std::nullopt, 1, true).shape() == Shape{2, 1});
  CHECK(jnp::linalg::norm(m, std::nullopt, None, true).shape() == Shape{1, 1});
  CHECK(jnp::linalg::norm(jnp::array<int32_t>({3, 4})).dtype() == DType::float32);
  CHECK(jnp::linalg::norm(jnp::array<int32_t>({3, 4})).item<float>() == 5);
  CHECK(jnp::linalg::norm(jnp::zeros({0})).item<float>() == 0);
}

TEST_CASE("misuse: typed errors that name the axis, rank, dtype and shape") {
  Array x = jnp::zeros({2, 3});
  CHECK_THROWS_AS(lax::reduce_sum(x, {2}), ValueError);
  std::string e = error_of([&] { lax::reduce_sum(x, {2}); });
  CHECK(e.find("axis 2") != std::string::npos);
  CHECK(e.find("rank 2") != std::string::npos);
  CHECK_THROWS_WITH_AS(jnp::sum(x, {0, -2}), Contains("repeated axis -2"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::sum(x, 5), Contains("axis 5 is out of bounds for an array of rank 2"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::mean(Array(1.f), 0), Contains("rank 0"), ValueError);
  // direct bind with non-canonical params (what a jaxpr could carry)
  CHECK_THROWS_WITH_AS(bind1(*find_primitive("reduce_max"), {x}, Params{{"axes", std::vector<int64_t>{1, 1}}}),
                       Contains("duplicate axis 1"), ValueError);
  CHECK_THROWS_WITH_AS(bind1(*find_primitive("reduce_sum"), {x}, Params{{"axes", std::vector<int64_t>{-1}}}),
                       Contains("reduction axis -1 is out of bounds"), ValueError);
  CHECK_THROWS_WITH_AS(lax::reduce_sum(jnp::zeros({2}, DType::bool_), {0}),
                       Contains("reduce_sum does not accept dtype bool"), DTypeError);
  CHECK_THROWS_WITH_AS(lax::reduce_and(jnp::zeros({2}), {0}), Contains("reduce_and does not accept dtype float32"),
                       DTypeError);
  CHECK_THROWS_WITH_AS(lax::cumsum(jnp::zeros({2}, DType::bool_)), Contains("cumsum does not accept dtype bool"),
                       DTypeError);
  CHECK_THROWS_WITH_AS(lax::cumlogsumexp(jnp::zeros({2}, DType::int32)), Contains("floating-point"), DTypeError);
  CHECK_THROWS_WITH_AS(lax::cumsum(x, 2), Contains("axis 2"), ValueError);
  // argmax of an empty axis
  CHECK_THROWS_WITH_AS(lax::argmax(jnp::zeros({3, 0}), 1),
                       Contains("non-empty reduced dimension: operand shape (3, 0)"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::argmax(jnp::zeros({0})), Contains("attempt to get argmax of an empty sequence"),
                       ValueError);
  CHECK_THROWS_WITH_AS(jnp::argmin(jnp::zeros({2, 0}), 1), Contains("argmin of an empty sequence"), ValueError);
  CHECK_THROWS_WITH_AS(lax::argmax(x, 0, DType::float32), Contains("index_dtype must be an integer type, got float32"),
                       DTypeError);
  // reductions without identity over empty axes
  CHECK_THROWS_WITH_AS(jnp::max(jnp::zeros({0, 3}), 0),
                       Contains("zero-size array to reduction operation max which has no identity"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::min(jnp::zeros({0})), Contains("reduction operation min which has no identity"),
                       ValueError);
  CHECK_THROWS_WITH_AS(jnp::amax(jnp::zeros({2, 0}), 1), Contains("shape (2, 0)"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::linalg::norm(jnp::zeros({0}), kInf), Contains("no identity"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::linalg::norm(jnp::zeros({2, 2}), 2.0), Contains("ord=2 is not supported"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::linalg::norm(jnp::zeros({2, 2, 2}), std::nullopt, {0, 1, 2}),
                       Contains("1 axis (vector norm) or 2 axes"), ValueError);
}
