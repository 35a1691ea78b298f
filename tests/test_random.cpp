// cjax::random: JAX's threefry2x32 PRNG, bit for bit (docs/prng.md §5 golden vectors, both schemes).
// Values marked "ref" come from an offline from-scratch Python reimplementation of JAX's algorithms
// (threefry, split, random_bits, uniform, randint, permutation) that reproduces every golden vector.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <numeric>
#include <set>

#include "cjax/cjax.h"

using namespace cjax;
namespace jnp = cjax::numpy;

namespace {

// Sets the threefry scheme for one scope and restores the previous one.
struct Scheme {
  bool saved;
  explicit Scheme(bool partitionable) : saved(config::threefry_partitionable()) {
    config::set_threefry_partitionable(partitionable);
  }
  ~Scheme() { config::set_threefry_partitionable(saved); }
};

std::vector<uint32_t> vu32(const Array& a) { return a.to_vector<uint32_t>(); }

int64_t ulp_distance(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  if (ia < 0) ia = int32_t(0x80000000u) - ia;
  if (ib < 0) ib = int32_t(0x80000000u) - ib;
  return std::llabs(int64_t(ia) - int64_t(ib));
}

void check_floats_exact(const Array& a, const std::vector<float>& want) {
  auto got = a.to_vector<float>();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i)
    CHECK_MESSAGE(got[i] == want[i], "element ", i, ": ", got[i], " vs ", want[i]);
}

template <class E>
std::string message_of(auto&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("WRONG TYPE: ") + e.what();
  }
  return "NO THROW";
}

}  // namespace

TEST_CASE("threefry2x32 known answers (JAX tests)") {
  auto run = [](uint32_t k0, uint32_t k1, uint32_t x0, uint32_t x1) {
    auto [a, b] = lax::threefry2x32(jnp::array<uint32_t>({k0}), jnp::array<uint32_t>({k1}), jnp::array<uint32_t>({x0}),
                                    jnp::array<uint32_t>({x1}));
    return std::pair{vu32(a)[0], vu32(b)[0]};
  };
  CHECK(run(0, 0, 0, 0) == std::pair{0x6b200159u, 0x99ba4efeu});
  CHECK(run(0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu) == std::pair{0x1cb996fcu, 0xbb002be7u});
  CHECK(run(0x13198a2eu, 0x03707344u, 0x243f6a88u, 0x85a308d3u) == std::pair{0xc4923a9cu, 0x483df7a0u});
}

TEST_CASE("key from seed") {
  Array k = random::key(0);
  CHECK(k.dtype() == u32);
  CHECK(k.shape() == Shape{2});
  CHECK(vu32(k) == std::vector<uint32_t>{0, 0});
  CHECK(vu32(random::key(42)) == std::vector<uint32_t>{0, 42});
  CHECK(vu32(random::PRNGKey(0x123456789abcdefULL)) == std::vector<uint32_t>{0x01234567u, 0x89abcdefu});
  CHECK(vu32(random::key(uint64_t(-1))) == std::vector<uint32_t>{0xffffffffu, 0xffffffffu});  // x64 reading
  // Array seeds: a 32-bit seed has a zero high word (JAX's default x32 mode), negatives wrap.
  CHECK(vu32(random::key(Array(42))) == std::vector<uint32_t>{0, 42});
  CHECK(vu32(random::key(Array(-1))) == std::vector<uint32_t>{0, 0xffffffffu});
  CHECK(vu32(random::key(Array(int64_t(0x100000005LL)))) == std::vector<uint32_t>{1, 5});
  CHECK(vu32(random::key_data(k)) == std::vector<uint32_t>{0, 0});
}

TEST_CASE("golden vectors: legacy scheme") {
  Scheme s(false);
  CHECK(vu32(random::split(random::key(0), 2)) ==
        std::vector<uint32_t>{4146024105u, 967050713u, 2718843009u, 1272950319u});
  CHECK(vu32(random::split(random::key(42), 2)) ==
        std::vector<uint32_t>{2465931498u, 3679230171u, 255383827u, 267815257u});
  Array s4 = random::split(random::key(0), 4);
  CHECK(s4.shape() == Shape{4, 2});
  CHECK(vu32(s4) == std::vector<uint32_t>{2285895361u, 1501764800u, 1518642379u, 4090693311u, 433833334u, 4221794875u,
                                          839183663u, 3740430601u});
  CHECK(vu32(random::fold_in(random::key(0), 4)) == std::vector<uint32_t>{2285895361u, 433833334u});

  Array k = random::key(1701);
  Array b8 = random::bits(k, {3}, u8);
  CHECK(b8.dtype() == u8);
  CHECK(b8.to_vector<uint8_t>() == std::vector<uint8_t>{216, 115, 43});
  Array b16 = random::bits(k, {3}, i16);
  CHECK(b16.dtype() == i16);
  std::vector<uint16_t> v16;
  for (int16_t x : b16.to_vector<int16_t>()) v16.push_back(uint16_t(x));
  CHECK(v16 == std::vector<uint16_t>{41682, 1300, 55017});
  CHECK(vu32(random::bits(k, {3})) == std::vector<uint32_t>{56197195u, 4200222568u, 961309823u});
  std::vector<uint64_t> v64;
  for (int64_t x : random::bits(k, {3}, i64).to_vector<int64_t>()) v64.push_back(uint64_t(x));
  CHECK(v64 == std::vector<uint64_t>{3982329540505020460ull, 16822122385914693683ull, 7882654074788531506ull});

  check_floats_exact(random::uniform(random::key(0), {4}), {0.9653214f, 0.22515893f, 0.63302994f, 0.29638183f});
  check_floats_exact(random::uniform(random::key(0), {3}), {0.9653214f, 0.31468165f, 0.63302994f});

  auto n = random::normal(random::key(0), {3}).to_vector<float>();
  const float want[] = {1.8160863f, -0.48262316f, 0.33988908f};
  for (int i = 0; i < 3; ++i) CHECK_MESSAGE(ulp_distance(n[size_t(i)], want[i]) <= 2, n[size_t(i)], " vs ", want[i]);
}

TEST_CASE("golden vectors: partitionable scheme (default)") {
  CHECK(config::threefry_partitionable());
  CHECK(vu32(random::split(random::key(0))) ==
        std::vector<uint32_t>{1797259609u, 2579123966u, 928981903u, 3453687069u});
  CHECK(vu32(random::split(random::key(42), 2)) ==
        std::vector<uint32_t>{1832780943u, 270669613u, 64467757u, 2916123636u});
  // split(key, n)[i] == fold_in(key, i)
  Array s4 = random::split(random::key(0), 4);
  auto v = vu32(s4);
  for (int i = 0; i < 4; ++i) {
    auto f = vu32(random::fold_in(random::key(0), i));
    CHECK(v[size_t(2 * i)] == f[0]);
    CHECK(v[size_t(2 * i + 1)] == f[1]);
  }
  CHECK(vu32(random::fold_in(random::key(0), 4)) == std::vector<uint32_t>{2285895361u, 433833334u});
  CHECK(vu32(random::fold_in(random::key(0), Array(4))) == std::vector<uint32_t>{2285895361u, 433833334u});

  Array k = random::key(1701);
  CHECK(random::bits(k, {3}, u8).to_vector<uint8_t>() == std::vector<uint8_t>{37, 59, 52});
  std::vector<uint16_t> v16;
  for (int16_t x : random::bits(k, {3}, i16).to_vector<int16_t>()) v16.push_back(uint16_t(x));
  CHECK(v16 == std::vector<uint16_t>{42789, 29755, 60468});
  CHECK(vu32(random::bits(k, {3}, u32)) == std::vector<uint32_t>{1111271205u, 2679469115u, 974515252u});
  std::vector<uint64_t> v64;
  for (int64_t x : random::bits(k, {3}, i64).to_vector<int64_t>()) v64.push_back(uint64_t(x));
  CHECK(v64 == std::vector<uint64_t>{3182764935064573181ull, 366096495144982249ull, 241365115613244543ull});

  check_floats_exact(random::uniform(random::key(0), {4}), {0.947667f, 0.9785799f, 0.33229148f, 0.46866846f});
  check_floats_exact(random::uniform(random::key(0), {3}), {0.947667f, 0.9785799f, 0.33229148f});
  Array k1 = random::split(random::key(0))[1];
  Array u0 = random::uniform(k1);
  CHECK(u0.shape() == Shape{});
  CHECK(u0.item<float>() == 0.0072938204f);  // JAX docs print 0.00729382
  CHECK(std::abs(u0.item<float>() - 0.00729382f) < 1e-9f);

  auto n = random::normal(random::key(0), {3}).to_vector<float>();
  const float want[] = {1.6226422f, 2.0252647f, -0.43359444f};
  for (int i = 0; i < 3; ++i) CHECK_MESSAGE(ulp_distance(n[size_t(i)], want[i]) <= 2, n[size_t(i)], " vs ", want[i]);
}

TEST_CASE("bits: shapes, sizes and the prefix property of the partitionable scheme") {
  Array k = random::key(5);
  Array b = random::bits(k, {2, 3});
  CHECK(b.shape() == Shape{2, 3});
  CHECK(b.dtype() == u32);
  auto flat = vu32(random::bits(k, {6}));
  CHECK(vu32(b) == flat);
  auto pre = vu32(random::bits(k, {4}));
  CHECK(std::equal(pre.begin(), pre.end(), flat.begin()));
  CHECK(random::bits(k, {0}).size() == 0);
  CHECK(random::bits(k, {3, 0}, u8).shape() == Shape{3, 0});
  CHECK(random::bits(k).shape() == Shape{});
  Scheme s(false);
  CHECK(random::bits(k, {0}, u8).size() == 0);
  CHECK(random::bits(k, {5}, u8).size() == 5);
  CHECK(random::bits(k, {}, i16).shape() == Shape{});
}

TEST_CASE("uniform: dtypes (ref values) and ranges") {
  for (bool part : {true, false}) {
    Scheme s(part);
    Array k = random::key(0);
    Array d = random::uniform(k, {4}, f64);
    CHECK(d.dtype() == f64);
    Array h = random::uniform(k, {4}, f16);
    CHECK(h.dtype() == f16);
    Array b = random::uniform(k, {4}, bf16);
    CHECK(b.dtype() == bf16);
    Array r = random::uniform(k, {4}, f32, -2.0, 3.0);
    if (part) {
      CHECK(d.to_vector<double>() ==
            std::vector<double>{0.41845711171638644, 0.21629545460551136, 0.9653214611189975, 0.5745005337275046});
      CHECK(h.to_vector<float>() == std::vector<float>{0.310546875f, 0.212890625f, 0.0546875f, 0.65625f});
      CHECK(b.to_vector<float>() == std::vector<float>{0.6484375f, 0.5703125f, 0.15625f, 0.203125f});
      check_floats_exact(r, {2.7383351f, 2.8928995f, -0.33854258f, 0.3433423f});
    } else {
      CHECK(d.to_vector<double>() ==
            std::vector<double>{0.5322264882505428, 0.3496568652295886, 0.3535864826281059, 0.9524387567934782});
      CHECK(h.to_vector<float>() == std::vector<float>{0.138671875f, 0.2158203125f, 0.08203125f, 0.8037109375f});
      CHECK(b.to_vector<float>() == std::vector<float>{0.34375f, 0.0f, 0.125f, 0.4140625f});
      check_floats_exact(r, {2.8266072f, -0.87420535f, 1.1651497f, -0.51809084f});
    }
  }
  // Range [minval, maxval) on a large draw, per dtype; array bounds broadcast.
  for (DType dt : {f32, f64, bf16, f16}) {
    Array u = random::uniform(random::key(3), {20000}, dt, -1.5, 2.5);
    CHECK(jnp::min(u).item<double>() >= -1.5);
    CHECK(jnp::max(u).item<double>() < 2.5);
    CHECK(std::abs(jnp::mean(u.astype(f32)).item<double>() - 0.5) < 0.05);
  }
  Array lo = jnp::array<float>({0.f, 10.f, 100.f});
  Array u = random::uniform(random::key(1), {1000, 3}, f32, lo, lo + 1.f);
  CHECK(u.shape() == Shape{1000, 3});
  auto mn = jnp::min(u, 0).to_vector<float>(), mx = jnp::max(u, 0).to_vector<float>();
  const float los[] = {0.f, 10.f, 100.f};
  for (int j = 0; j < 3; ++j) {
    CHECK(mn[size_t(j)] >= los[j]);
    CHECK(mx[size_t(j)] < los[j] + 1.f);
  }
}

TEST_CASE("normal: statistics, dtypes") {
  Array z = random::normal(random::key(11), {100000});
  CHECK(std::abs(jnp::mean(z).item<double>()) < 0.01);
  CHECK(std::abs(jnp::var(z).item<double>() - 1.0) < 0.02);
  CHECK(jnp::all(jnp::isfinite(z)).item<bool>());
  for (DType dt : {f64, bf16, f16}) {
    Array w = random::normal(random::key(12), {20000}, dt);
    CHECK(w.dtype() == dt);
    Array wf = w.astype(f32);
    CHECK(std::abs(jnp::mean(wf).item<double>()) < 0.03);
    CHECK(std::abs(jnp::var(wf).item<double>() - 1.0) < 0.05);
    CHECK(jnp::all(jnp::isfinite(wf)).item<bool>());
  }
  // f64 normal matches sqrt(2) * erf_inv(u) of the same uniform draw.
  Array u = random::uniform(random::key(12), {5}, f64, -0.9999999999999999, 1.0);
  CHECK(jnp::allclose(random::normal(random::key(12), {5}, f64), lax::erf_inv(u) * std::sqrt(2.0), 1e-15, 0));
}

TEST_CASE("truncated_normal") {
  Array t = random::truncated_normal(random::key(2), -1.0, 2.0, Shape{50000});
  CHECK(t.dtype() == f32);
  CHECK(jnp::min(t).item<float>() > -1.f);
  CHECK(jnp::max(t).item<float>() < 2.f);
  // Mean of N(0,1) truncated to (-1, 2): (phi(-1) - phi(2)) / (Phi(2) - Phi(-1)) = 0.22955.
  CHECK(std::abs(jnp::mean(t).item<double>() - 0.22955) < 0.01);
  // Shape from broadcasting lower and upper.
  Array lo = jnp::array<float>({-1.f, 0.f}), hi = jnp::array<float>({0.f, 1.f});
  Array tb = random::truncated_normal(random::key(2), lo, hi);
  CHECK(tb.shape() == Shape{2});
  auto v = tb.to_vector<float>();
  CHECK((v[0] > -1.f && v[0] < 0.f));
  CHECK((v[1] > 0.f && v[1] < 1.f));
  // Half types: bounds stay strictly inside (bit-exact nextafter for 16-bit floats).
  for (DType dt : {bf16, f16}) {
    Array h = random::truncated_normal(random::key(4), -2.0, 2.0, Shape{20000}, dt);
    CHECK(h.dtype() == dt);
    CHECK(jnp::min(h).astype(f32).item<float>() > -2.f);
    CHECK(jnp::max(h).astype(f32).item<float>() < 2.f);
  }
  // A very narrow window collapses onto the open interval's bounds.
  Array n = random::truncated_normal(random::key(4), 1.0, 1.0000001, Shape{100});
  CHECK(jnp::min(n).item<float>() >= 1.f);
}

TEST_CASE("bernoulli") {
  Array b = random::bernoulli(random::key(5), 0.3, Shape{100000});
  CHECK(b.dtype() == bool_);
  CHECK(std::abs(jnp::mean(b.astype(f32)).item<double>() - 0.3) < 0.01);
  CHECK(jnp::all(random::bernoulli(random::key(5), 0.0, Shape{1000}) == false).item<bool>());
  CHECK(jnp::all(random::bernoulli(random::key(5), 1.0, Shape{1000})).item<bool>());
  Array p = jnp::array<float>({0.f, 1.f, 0.f, 1.f});
  CHECK(random::bernoulli(random::key(6), p).to_vector<bool>() == std::vector<bool>{false, true, false, true});
  // Equals uniform < p on the same key (JAX's definition).
  Array u = random::uniform(random::key(7), {10});
  CHECK(jnp::array_equal(random::bernoulli(random::key(7), 0.5, Shape{10}), u < 0.5f));
}

TEST_CASE("randint: JAX's algorithm, bit exact (ref values), every width") {
  for (bool part : {true, false}) {
    Scheme s(part);
    Array a = random::randint(random::key(0), {8}, 0, 10);
    CHECK(a.dtype() == i32);
    Array b = random::randint(random::key(7), {5}, -5, 5, i8);
    Array c = random::randint(random::key(7), {5}, -1000, 1000, i16);
    Array d = random::randint(random::key(7), {4}, int64_t(-1000000000000LL), int64_t(1000000000000LL), i64);
    Array e = random::randint(random::key(3), {6}, 0, 256, u8);  // maxval past uint8's max: full range
    CHECK(e.dtype() == u8);
    if (part) {
      CHECK(a.to_vector<int32_t>() == std::vector<int32_t>{9, 0, 2, 3, 1, 7, 2, 3});
      CHECK(b.to_vector<int8_t>() == std::vector<int8_t>{-2, -1, -5, 0, -5});
      CHECK(c.to_vector<int16_t>() == std::vector<int16_t>{-361, 814, -140, -635, 470});
      CHECK(d.to_vector<int64_t>() ==
            std::vector<int64_t>{565873535173LL, 705619275709LL, -91019902590LL, -64926815037LL});
      CHECK(e.to_vector<uint8_t>() == std::vector<uint8_t>{75, 115, 157, 170, 12, 104});
    } else {
      CHECK(a.to_vector<int32_t>() == std::vector<int32_t>{8, 6, 8, 4, 6, 0, 3, 8});
      CHECK(b.to_vector<int8_t>() == std::vector<int8_t>{-4, 3, 2, 2, 0});
      CHECK(c.to_vector<int16_t>() == std::vector<int16_t>{878, 95, -542, 433, -705});
      CHECK(d.to_vector<int64_t>() ==
            std::vector<int64_t>{776104432987LL, -883840045334LL, -665892406893LL, 787305419269LL});
      CHECK(e.to_vector<uint8_t>() == std::vector<uint8_t>{208, 250, 86, 133, 37, 218});
    }
  }
  // Range and coverage.
  Array r = random::randint(random::key(9), {10000}, -3, 4);
  CHECK(jnp::min(r).item<int>() == -3);
  CHECK(jnp::max(r).item<int>() == 3);
  // maxval <= minval returns minval (JAX issue #222), no error.
  CHECK(jnp::all(random::randint(random::key(9), {10}, 5, 5) == 5).item<bool>());
  CHECK(jnp::all(random::randint(random::key(9), {10}, 5, 2) == 5).item<bool>());
  // Array bounds broadcast; uint32 full range works.
  Array lo = jnp::array<int32_t>({0, 100});
  Array rr = random::randint(random::key(9), {500, 2}, lo, lo + 10);
  auto mn = jnp::min(rr, 0).to_vector<int32_t>(), mx = jnp::max(rr, 0).to_vector<int32_t>();
  CHECK(mn == std::vector<int32_t>{0, 100});
  CHECK(mx == std::vector<int32_t>{9, 109});
  Array big = random::randint(random::key(1), {1000}, int64_t(0), int64_t(4294967296LL), u32);
  CHECK(big.dtype() == u32);
  CHECK(jnp::max(big).item<int64_t>() > int64_t(4000000000LL));
  // i64 with a span past 2^63 (unsigned remainder path).
  Array w = random::randint(random::key(2), {1000}, int64_t(INT64_MIN), int64_t(INT64_MAX), i64);
  CHECK(jnp::min(w).item<int64_t>() < int64_t(-4000000000000000000LL));
  CHECK(jnp::max(w).item<int64_t>() > int64_t(4000000000000000000LL));
}

TEST_CASE("permutation (ref values) and shuffles") {
  for (bool part : {true, false}) {
    Scheme s(part);
    auto p10 = random::permutation(random::key(0), 10).to_vector<int32_t>();
    auto p5 = random::permutation(random::key(1), 5).to_vector<int32_t>();
    if (part) {
      CHECK(p10 == std::vector<int32_t>{0, 1, 8, 5, 6, 4, 3, 2, 7, 9});
      CHECK(p5 == std::vector<int32_t>{3, 2, 0, 1, 4});
    } else {
      CHECK(p10 == std::vector<int32_t>{2, 7, 9, 6, 0, 8, 1, 3, 4, 5});
      CHECK(p5 == std::vector<int32_t>{1, 0, 3, 2, 4});
    }
  }
  // 5000 elements need two sorting rounds; the result is a permutation.
  auto big = random::permutation(random::key(3), 5000).to_vector<int32_t>();
  std::vector<int32_t> sorted = big;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int32_t> iota(5000);
  std::iota(iota.begin(), iota.end(), 0);
  CHECK(sorted == iota);
  CHECK(big != iota);
  CHECK(random::permutation(random::key(3), 1).to_vector<int32_t>() == std::vector<int32_t>{0});
  CHECK(random::permutation(random::key(3), 0).size() == 0);
  // Array forms: a 1-D array is shuffled like arange; 2-D rows are permuted as wholes.
  Array x = jnp::arange(10) * 10;
  auto px = random::permutation(random::key(0), x).to_vector<int32_t>();
  CHECK(px == std::vector<int32_t>{0, 10, 80, 50, 60, 40, 30, 20, 70, 90});
  CHECK(random::permutation(random::key(0), Array(10)).to_vector<int32_t>() ==
        std::vector<int32_t>{0, 1, 8, 5, 6, 4, 3, 2, 7, 9});
  Array m = jnp::arange(12).reshape({4, 3});
  auto pm = random::permutation(random::key(0), m).to_vector<int32_t>();
  auto pr = random::permutation(random::key(0), 4).to_vector<int32_t>();
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 3; ++j) CHECK(pm[size_t(i * 3 + j)] == pr[size_t(i)] * 3 + j);
  Array pi = random::permutation(random::key(0), m, 1, true);
  CHECK(pi.shape() == Shape{4, 3});
  CHECK(jnp::array_equal(jnp::sort(pi, 1), m));
}

TEST_CASE("categorical and gumbel") {
  Array logits = jnp::log(jnp::array<float>({0.1f, 0.2f, 0.7f}));
  Array c = random::categorical(random::key(0), logits, -1, Shape{30000});
  CHECK(c.dtype() == i32);
  CHECK(c.shape() == Shape{30000});
  for (int j = 0; j < 3; ++j) {
    double freq = jnp::mean((c == j).astype(f32)).item<double>();
    double want = j == 0 ? 0.1 : j == 1 ? 0.2 : 0.7;
    CHECK(std::abs(freq - want) < 0.015);
  }
  // Definition: argmax(gumbel(key, shape) + logits).
  Array l2 = jnp::array<float>({1.f, 2.f, 3.f, 0.f, 0.f, 5.f}, {2, 3});
  Array c2 = random::categorical(random::key(4), l2);
  CHECK(c2.shape() == Shape{2});
  Array g = random::gumbel(random::key(4), {2, 3});
  CHECK(jnp::array_equal(c2, jnp::argmax(g + l2, 1)));
  // axis 0.
  Array c0 = random::categorical(random::key(4), l2, 0);
  CHECK(c0.shape() == Shape{3});
  CHECK(jnp::array_equal(c0, jnp::argmax(random::gumbel(random::key(4), {2, 3}) + l2, 0)));
  // A -inf logit is never drawn.
  Array l3 = jnp::array<float>({-INFINITY, 0.f, 0.f});
  CHECK(jnp::min(random::categorical(random::key(8), l3, -1, Shape{2000})).item<int>() >= 1);
  Array gs = random::gumbel(random::key(1), {100000});
  CHECK(std::abs(jnp::mean(gs).item<double>() - 0.5772157) < 0.02);  // Euler-Mascheroni
}

TEST_CASE("split / fold_in shapes and properties") {
  Array k = random::key(0);
  CHECK(random::split(k, 1).shape() == Shape{1, 2});
  CHECK(random::split(k, Shape{2, 3}).shape() == Shape{2, 3, 2});
  CHECK(vu32(random::split(k, Shape{2, 3})).size() == 12);
  CHECK(vu32(random::split(k, Shape{2, 3})) == vu32(random::split(k, 6)));
  // Distinct keys.
  auto ks = vu32(random::split(k, 100));
  std::set<std::pair<uint32_t, uint32_t>> uniq;
  for (size_t i = 0; i < 100; ++i) uniq.insert({ks[2 * i], ks[2 * i + 1]});
  CHECK(uniq.size() == 100);
  // fold_in data is taken mod 2^32.
  CHECK(vu32(random::fold_in(k, -1)) == vu32(random::fold_in(k, int64_t(0xffffffffLL))));
  CHECK(vu32(random::fold_in(k, int64_t(0x100000003LL))) == vu32(random::fold_in(k, 3)));
  // Scheme-independent fold_in.
  Scheme s(false);
  CHECK(vu32(random::fold_in(random::key(0), 4)) == std::vector<uint32_t>{2285895361u, 433833334u});
}

TEST_CASE("misuse raises typed errors naming the problem") {
  Array k = random::key(0);
  // Key of wrong dtype.
  CHECK(message_of<DTypeError>([&] {
          random::uniform(jnp::array<int32_t>({0, 1}));
        }).find("int32") != std::string::npos);
  // Key of wrong shape.
  std::string m = message_of<ShapeError>([&] { random::split(jnp::array<uint32_t>({0, 1, 2})); });
  CHECK(m.find("(3,)") != std::string::npos);
  // A batch of keys where one key is expected.
  m = message_of<ShapeError>([&] { random::normal(random::split(k, 4), {3}); });
  CHECK(m.find("(4, 2)") != std::string::npos);
  CHECK(m.find("vmap") != std::string::npos);
  // split with n <= 0.
  CHECK_THROWS_WITH_AS(random::split(k, 0), doctest::Contains("got 0"), ValueError);
  CHECK_THROWS_WITH_AS(random::split(k, -3), doctest::Contains("got -3"), ValueError);
  // Non-float dtype for a float sampler, non-int dtype for randint.
  CHECK_THROWS_WITH_AS(random::uniform(k, {2}, i32), doctest::Contains("int32"), DTypeError);
  CHECK_THROWS_WITH_AS(random::normal(k, {2}, bool_), doctest::Contains("bool"), DTypeError);
  CHECK_THROWS_WITH_AS(random::randint(k, {2}, 0, 5, f32), doctest::Contains("float32"), DTypeError);
  // bits of an unsupported dtype.
  CHECK_THROWS_WITH_AS(random::bits(k, {2}, i32), doctest::Contains("int32"), DTypeError);
  // Negative shape.
  CHECK_THROWS_WITH_AS(random::uniform(k, {2, -1}), doctest::Contains("(2, -1)"), ShapeError);
  // Bounds that do not broadcast to the shape.
  CHECK_THROWS_WITH_AS(random::uniform(k, {3}, f32, jnp::zeros({2})), doctest::Contains("(2,)"), ShapeError);
  // fold_in with non-integer data.
  CHECK_THROWS_WITH_AS(random::fold_in(k, Array(1.5f)), doctest::Contains("float32"), DTypeError);
  // categorical with integer logits / bad axis / incompatible shape.
  CHECK_THROWS_WITH_AS(random::categorical(k, jnp::array<int32_t>({1, 2})), doctest::Contains("int32"), DTypeError);
  CHECK_THROWS_WITH_AS(random::categorical(k, jnp::zeros({2, 3}), 2), doctest::Contains("axis 2"), ValueError);
  CHECK_THROWS_WITH_AS(random::categorical(k, jnp::zeros({2, 3}), -1, Shape{5, 3}), doctest::Contains("(2,)"),
                       ShapeError);
  // bernoulli with an integer probability.
  CHECK_THROWS_WITH_AS(random::bernoulli(k, Array(1)), doctest::Contains("int32"), DTypeError);
  // Scalar float permutation argument.
  CHECK_THROWS_WITH_AS(random::permutation(k, Array(2.5f)), doctest::Contains("float32"), DTypeError);
}
