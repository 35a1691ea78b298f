#include <doctest/doctest.h>

#include <cmath>

#include "cjax/cjax.h"

using namespace cjax;
namespace jnp = cjax::numpy;

TEST_CASE("elementwise add and scalar broadcast") {
  Array x = jnp::array<float>({1, 2, 3});
  Array y = jnp::array<float>({10, 20, 30});
  CHECK(lax::add(x, y).to_vector<float>() == std::vector<float>{11, 22, 33});
  CHECK(lax::mul(x, lax::convert_element_type(Array(2), f32)).to_vector<float>() == std::vector<float>{2, 4, 6});
}

TEST_CASE("float16 conversion round-trips every bit pattern; bfloat16 rounds to nearest even") {
  int mismatches = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    float f = float16_t::to_float(uint16_t(h));
    if (!std::isnan(f) && float16_t::from_float(f) != h) ++mismatches;
  }
  CHECK(mismatches == 0);
  CHECK(float16_t::from_float(65504.f) == 0x7bff);
  CHECK(float16_t::from_float(65520.f) == 0x7c00);  // rounds up to inf
  CHECK(float16_t::to_float(1) == doctest::Approx(5.960464477539063e-08).epsilon(1e-12));
  CHECK(float(bfloat16_t(1.0f)) == 1.0f);
  CHECK(bfloat16_t(1.00390625f).bits == 0x3f80);  // tie: rounds to even (down)
  CHECK(bfloat16_t(1.01171875f).bits == 0x3f82);  // tie: rounds to even (up)
  CHECK(std::isnan(float(bfloat16_t(std::nanf("")))));
}

TEST_CASE("unsigned C++ scalars are weak integers") {
  Array u(7u), z(size_t(9));
  CHECK(u.dtype() == i64);
  CHECK(u.weak_type());
  CHECK(z.item<int64_t>() == 9);
}

TEST_CASE("integer arithmetic wraps like XLA (no undefined behaviour)") {
  namespace jnp = cjax::numpy;
  Array imin = jnp::array<int32_t>({INT32_MIN, INT32_MAX});
  Array one = jnp::array<int32_t>({1, 1});
  CHECK(lax::sub(imin, one).to_vector<int32_t>() == std::vector<int32_t>{INT32_MAX, INT32_MAX - 1});
  CHECK(lax::add(imin, one).to_vector<int32_t>() == std::vector<int32_t>{INT32_MIN + 1, INT32_MIN});
  CHECK(lax::neg(imin).to_vector<int32_t>() == std::vector<int32_t>{INT32_MIN, -INT32_MAX});
  CHECK(lax::abs(imin).to_vector<int32_t>() == std::vector<int32_t>{INT32_MIN, INT32_MAX});
  Array big = jnp::array<int64_t>({int64_t(1) << 32});
  CHECK(lax::mul(big, big).to_vector<int64_t>() == std::vector<int64_t>{0});
  Array s16 = jnp::array<int16_t>({-1, 300});
  CHECK(lax::mul(s16, s16).to_vector<int16_t>() == std::vector<int16_t>{1, int16_t(90000 - 65536)});
  CHECK(lax::integer_pow(jnp::array<int32_t>({3}), 21).to_vector<int32_t>() ==
        std::vector<int32_t>{int32_t(10460353203LL - 2LL * 4294967296LL)});
}
