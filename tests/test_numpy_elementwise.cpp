// cjax::numpy elementwise functions, creation functions and Array operators. Reference values
// were computed offline with numpy 1.24 (float32 unless noted) and pasted as literals.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <string>

#include "cjax/cjax.h"
#include "core/array/util.h"

using namespace cjax;
namespace jnp = cjax::numpy;

namespace {
const double kNaN = std::numeric_limits<double>::quiet_NaN();
const double kInf = std::numeric_limits<double>::infinity();
const DType kAll[] = {bool_, i8, i16, i32, i64, u8, u32, bf16, f16, f32, f64};
const DType kNumeric[] = {i8, i16, i32, i64, u8, u32, bf16, f16, f32, f64};
const DType kInts[] = {i8, i16, i32, i64, u8, u32};
const DType kFloats[] = {bf16, f16, f32, f64};

Array F(std::vector<float> v, Shape s = {}) { return jnp::array<float>(v, std::move(s)); }
Array I(std::vector<int32_t> v, Shape s = {}) { return jnp::array<int32_t>(v, std::move(s)); }
Array of(DType d, std::vector<float> v) { return jnp::array<float>(v).astype(d); }

void check_values(const Array& a, const std::vector<double>& want, double eps = 1e-6) {
  auto got = a.to_vector<double>();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CAPTURE(i);
    if (std::isnan(want[i]))
      CHECK(std::isnan(got[i]));
    else if (std::isinf(want[i]))
      CHECK(got[i] == want[i]);
    else
      CHECK(got[i] == doctest::Approx(want[i]).epsilon(eps));
  }
}
std::vector<bool> B(const Array& a) { return a.to_vector<bool>(); }
}  // namespace

// ---------------------------------------------------------------------------------------------
TEST_CASE("arithmetic: float32 values") {
  Array x = F({1.5f, -2.f, 3.25f, 0.f}), y = F({0.5f, 4.f, -1.25f, 2.f});
  CHECK(jnp::add(x, y).to_vector<float>() == std::vector<float>{2.f, 2.f, 2.f, 2.f});
  CHECK(jnp::subtract(x, y).to_vector<float>() == std::vector<float>{1.f, -6.f, 4.5f, -2.f});
  CHECK(jnp::multiply(x, y).to_vector<float>() == std::vector<float>{0.75f, -8.f, -4.0625f, 0.f});
  CHECK(jnp::divide(x, y).to_vector<float>() == std::vector<float>{3.f, -0.5f, -2.6f, 0.f});
  CHECK(jnp::true_divide(x, y).dtype() == f32);
  CHECK(jnp::negative(x).to_vector<float>() == std::vector<float>{-1.5f, 2.f, -3.25f, -0.f});
  CHECK(jnp::positive(x).to_vector<float>() == x.to_vector<float>());
  CHECK(jnp::abs(x).to_vector<float>() == std::vector<float>{1.5f, 2.f, 3.25f, 0.f});
  CHECK(jnp::absolute(x).to_vector<float>() == std::vector<float>{1.5f, 2.f, 3.25f, 0.f});
  check_values(jnp::sign(F({-2.f, 0.f, 3.f, NAN})), {-1, 0, 1, kNaN});
  CHECK(jnp::reciprocal(F({4.f, 0.5f, -2.f})).to_vector<float>() == std::vector<float>{0.25f, 2.f, -0.5f});
  CHECK(jnp::square(F({1.5f, -3.f})).to_vector<float>() == std::vector<float>{2.25f, 9.f});
  // Results are strongly typed float32.
  CHECK_FALSE(jnp::add(x, y).weak_type());
}

TEST_CASE("arithmetic: every dtype (add, subtract, multiply, maximum, minimum)") {
  for (DType d : kAll) {
    CAPTURE(dtype_name(d));
    Array x = of(d, {1, 2, 3}), y = of(d, {3, 2, 1});
    Array s = jnp::add(x, y), m = jnp::multiply(x, y);
    CHECK(s.dtype() == d);
    CHECK(m.dtype() == d);
    if (d == bool_) {  // add is logical or, multiply logical and
      CHECK(B(s) == std::vector<bool>{true, true, true});
      CHECK(B(m) == std::vector<bool>{true, true, true});
      CHECK(B(jnp::add(jnp::array<bool>({false, true}), jnp::array<bool>({false, false}))) ==
            std::vector<bool>{false, true});
      CHECK(B(jnp::multiply(jnp::array<bool>({true, true}), jnp::array<bool>({false, true}))) ==
            std::vector<bool>{false, true});
      continue;
    }
    CHECK(s.to_vector<double>() == std::vector<double>{4, 4, 4});
    CHECK(m.to_vector<double>() == std::vector<double>{3, 4, 3});
    CHECK(jnp::subtract(y, x).to_vector<double>() ==
          std::vector<double>{2, 0, -2 + (is_unsigned_integer(d) ? std::ldexp(1.0, int(itemsize(d) * 8)) : 0)});
    CHECK(jnp::maximum(x, y).to_vector<double>() == std::vector<double>{3, 2, 3});
    CHECK(jnp::minimum(x, y).to_vector<double>() == std::vector<double>{1, 2, 1});
    CHECK(jnp::maximum(x, y).dtype() == d);
  }
  // bool maximum/minimum are or/and.
  CHECK(B(jnp::maximum(jnp::array<bool>({false, true}), jnp::array<bool>({false, false}))) ==
        std::vector<bool>{false, true});
}

TEST_CASE("true division: integers promote to float32, floats keep their dtype") {
  for (DType d : kAll) {
    CAPTURE(dtype_name(d));
    Array r = jnp::divide(of(d, {1, 2, 3}), of(d, {2, 2, 2}));
    if (d == bool_) {
      CHECK(r.dtype() == f32);
      CHECK(r.to_vector<float>() == std::vector<float>{1, 1, 1});
      continue;
    }
    CHECK(r.dtype() == (is_floating(d) ? d : f32));
    CHECK(r.to_vector<double>() == std::vector<double>{0.5, 1, 1.5});
  }
  // Weak int / weak int -> weak float32 (JAX keeps weak_type through inexact promotion).
  Array w = Array(1) / Array(4);
  CHECK(w.dtype() == f32);
  CHECK(w.weak_type());
  CHECK(w.item<float>() == 0.25f);
  // Float division by zero: IEEE.
  check_values(jnp::divide(F({1.f, -1.f, 0.f}), F({0.f, 0.f, 0.f})), {kInf, -kInf, kNaN});
}

TEST_CASE("floor_divide, remainder, mod, fmod: signs and every numeric dtype") {
  Array a = I({7, -7, 7, -7}), b = I({2, 2, -2, -2});
  CHECK(jnp::floor_divide(a, b).to_vector<int>() == std::vector<int>{3, -4, -4, 3});
  Array c = I({7, -7, 7, -7}), m = I({3, 3, -3, -3});
  CHECK(jnp::remainder(c, m).to_vector<int>() == std::vector<int>{1, 2, -2, -1});  // sign of divisor
  CHECK(jnp::mod(c, m).to_vector<int>() == std::vector<int>{1, 2, -2, -1});
  CHECK(jnp::fmod(c, m).to_vector<int>() == std::vector<int>{1, -1, 1, -1});  // sign of dividend
  // Floats (numpy): [7.5, -7.5, 1, 1, -1] // [2, 2, 0.1, 0, 0] = [3, -4, 9, inf, -inf].
  check_values(jnp::floor_divide(F({7.5f, -7.5f, 1.f, 1.f, -1.f}), F({2.f, 2.f, 0.1f, 0.f, 0.f})),
               {3, -4, 9, kInf, -kInf});
  check_values(jnp::remainder(F({7.5f, -7.5f, 5.25f}), F({2.f, 2.f, -2.f})), {1.5, 0.5, -0.75});
  check_values(jnp::fmod(F({7.5f, -7.5f, 5.25f}), F({2.f, 2.f, -2.f})), {1.5, -1.5, 1.25});
  check_values(jnp::remainder(F({1.f}), F({0.f})), {kNaN});
  for (DType d : kNumeric) {
    CAPTURE(dtype_name(d));
    Array x = of(d, {7, 6, 5}), y = of(d, {2, 4, 3});
    CHECK(jnp::floor_divide(x, y).dtype() == d);
    CHECK(jnp::floor_divide(x, y).to_vector<double>() == std::vector<double>{3, 1, 1});
    CHECK(jnp::remainder(x, y).to_vector<double>() == std::vector<double>{1, 2, 2});
    CHECK(jnp::fmod(x, y).to_vector<double>() == std::vector<double>{1, 2, 2});
  }
  // bool is promoted to int32 (numeric promotion).
  Array bt = jnp::floor_divide(jnp::array<bool>({true}), jnp::array<bool>({true}));
  CHECK(bt.dtype() == i32);
  CHECK(bt.item<int>() == 1);
}

TEST_CASE("integer division by zero follows XLA (x / 0 = -1) and JAX's compositions") {
  Array x = I({5, 0, -5}), z = I({0, 0, 0});
  // lax div: -1; floor_divide corrects the truncated quotient by the remainder (x rem 0 = x).
  CHECK(lax::div(x, z).to_vector<int>() == std::vector<int>{-1, -1, -1});
  CHECK(jnp::floor_divide(x, z).to_vector<int>() == std::vector<int>{-2, -1, -2});
  // remainder / fmod by zero give 0 (JAX replaces a zero divisor by one).
  CHECK(jnp::remainder(x, z).to_vector<int>() == std::vector<int>{0, 0, 0});
  CHECK(jnp::fmod(x, z).to_vector<int>() == std::vector<int>{0, 0, 0});
  // unsigned: quotient is all ones.
  Array u = jnp::floor_divide(jnp::array<uint8_t>({9}), jnp::array<uint8_t>({0}));
  CHECK(u.item<int>() == 255);
  // INT_MIN // -1 wraps (XLA).
  Array mn = jnp::floor_divide(jnp::array<int32_t>({INT32_MIN}), Array(-1));
  CHECK(mn.item<int32_t>() == INT32_MIN);
}

TEST_CASE("power: integer_pow for concrete integer exponents, pow for floats, bit loop for int arrays") {
  CHECK(jnp::power(F({1.5f, -2.f, 3.f}), Array(2)).to_vector<float>() == std::vector<float>{2.25f, 4.f, 9.f});
  CHECK(jnp::power(F({2.f, 4.f}), Array(-1)).to_vector<float>() == std::vector<float>{0.5f, 0.25f});
  Array ip = jnp::power(I({2, 3, -4}), Array(3));
  CHECK(ip.dtype() == i32);
  CHECK(ip.to_vector<int>() == std::vector<int>{8, 27, -64});
  // int ** int array (binary exponentiation with lax ops): 0 ** 0 = 1, 0 ** 2 = 0.
  Array ia = jnp::power(I({2, 3, 4, 0, 0, -2}), I({3, 2, 0, 0, 2, 5}));
  CHECK(ia.dtype() == i32);
  CHECK(ia.to_vector<int>() == std::vector<int>{8, 9, 1, 1, 0, -32});
  // float base, float exponent: lax.pow.
  check_values(jnp::power(Array(2.0f), F({0.5f, -1.f, 3.f})), {1.4142135381698608, 0.5, 8.0});
  // int base ** float exponent -> float32.
  Array fp = jnp::power(I({4, 9}), F({0.5f, 0.5f}));
  CHECK(fp.dtype() == f32);
  CHECK(fp.to_vector<float>() == std::vector<float>{2.f, 3.f});
  // NaN propagates.
  check_values(jnp::power(F({NAN, 2.f}), F({2.f, NAN})), {kNaN, kNaN});
  for (DType d : kNumeric) {
    CAPTURE(dtype_name(d));
    Array r = jnp::power(of(d, {1, 2, 3}), Array(2));
    CHECK(r.dtype() == d);
    CHECK(r.to_vector<double>() == std::vector<double>{1, 4, 9});
    Array r2 = jnp::power(of(d, {1, 2, 3}), of(d, {3, 2, 1}));
    CHECK(r2.dtype() == d);
    CHECK(r2.to_vector<double>() == std::vector<double>{1, 4, 3});
  }
  // Weak scalars: 4 ** 3 stays a weak int.
  Array w = jnp::power(Array(4), Array(3));
  CHECK(w.dtype() == i32);
  CHECK(w.weak_type());
  CHECK(w.item<int>() == 64);
}

TEST_CASE("unary float functions: values, and integers computed in float32") {
  Array x = F({0.f, 1.f, -1.5f, 2.f});
  check_values(jnp::exp(x), {1.0, 2.7182819843292236, 0.22313015162944794, 7.3890557289123535});
  check_values(jnp::expm1(x), {0.0, 1.718281865119934, -0.7768698334693909, 6.389056205749512});
  check_values(jnp::exp2(x), {1.0, 2.0, 0.3535533845424652, 4.0});
  check_values(jnp::log1p(x), {0.0, 0.6931471824645996, kNaN, 1.0986123085021973});
  check_values(jnp::sin(x), {0.0, 0.8414710164070129, -0.9974949955940247, 0.9092974066734314});
  check_values(jnp::cos(x), {1.0, 0.5403022766113281, 0.07073719799518585, -0.41614681482315063});
  check_values(jnp::tan(x), {0.0, 1.5574077367782593, -14.101420402526855, -2.18503999710083}, 1e-5);
  check_values(jnp::arctan(x), {0.0, 0.7853981852531433, -0.9827937483787537, 1.1071487665176392});
  check_values(jnp::sinh(x), {0.0, 1.175201177597046, -2.129279375076294, 3.6268603801727295});
  check_values(jnp::cosh(x), {1.0, 1.5430806875228882, 2.352409601211548, 3.762195587158203});
  check_values(jnp::tanh(x), {0.0, 0.7615941762924194, -0.9051482081413269, 0.9640275835990906});
  check_values(jnp::arcsinh(x), {0.0, 0.8813735842704773, -1.19476318359375, 1.4436354637145996});
  check_values(jnp::cbrt(x), {0.0, 1.0, -1.1447142362594604, 1.2599210739135742});
  Array y = F({0.25f, 0.5f, 1.f, 4.f});
  check_values(jnp::log(y), {-1.3862943649291992, -0.6931471824645996, 0.0, 1.3862943649291992});
  check_values(jnp::log2(y), {-2.0, -1.0, 0.0, 2.0});
  check_values(jnp::log10(y), {-0.6020600199699402, -0.3010300099849701, 0.0, 0.6020600199699402});
  check_values(jnp::sqrt(y), {0.5, 0.7071067690849304, 1.0, 2.0});
  check_values(jnp::rsqrt(y), {2.0, 1.4142135381698608, 1.0, 0.5});
  Array z = F({0.25f, 0.5f, 0.75f, -0.5f});
  check_values(jnp::arcsin(z), {0.252680242061615, 0.5235987901687622, 0.8480621576309204, -0.5235987901687622});
  check_values(jnp::arccos(z), {1.3181161880493164, 1.0471975803375244, 0.7227342128753662, 2.094395160675049});
  check_values(jnp::arctanh(z), {0.2554128170013428, 0.5493061542510986, 0.972955048084259, -0.5493061542510986});
  check_values(jnp::arccosh(F({1.f, 2.f, 10.f})), {0.0, 1.316957950592041, 2.993222951889038});
  check_values(jnp::arctan2(F({1.f, -1.f, 0.f, 1.f}), F({1.f, 1.f, -1.f, 0.f})),
               {0.7853981256484985, -0.7853981256484985, 3.1415927410125732, 1.5707963705062866});
  // Domain errors give NaN, poles give inf.
  check_values(jnp::log(F({-1.f, 0.f})), {kNaN, -kInf});
  check_values(jnp::sqrt(F({-1.f})), {kNaN});
  check_values(jnp::exp(F({NAN, INFINITY, -INFINITY})), {kNaN, kInf, 0});
  // Integer inputs: jnp.exp(int32) -> float32 (values: numpy float32 of exp(1), exp(2)).
  Array e = jnp::exp(I({1, 2}));
  CHECK(e.dtype() == f32);
  check_values(e, {2.7182817459106445, 7.389056205749512});
  Array bl = jnp::sqrt(jnp::array<bool>({true, false}));
  CHECK(bl.dtype() == f32);
  CHECK(bl.to_vector<float>() == std::vector<float>{1.f, 0.f});
  // Every dtype: ints/bool -> float32, floats keep their dtype.
  for (DType d : kAll) {
    CAPTURE(dtype_name(d));
    Array r = jnp::exp(of(d, {0, 1}));
    CHECK(r.dtype() == (is_floating(d) ? d : f32));
    double e1 = d == bf16 ? 2.71875 : d == f16 ? 2.71875 : 2.718281828459045;
    check_values(r, {1.0, e1}, d == f32 || d == f64 || !is_floating(d) ? 1e-6 : 1e-3);
    CHECK(jnp::sin(of(d, {0})).dtype() == (is_floating(d) ? d : f32));
  }
  // Weak int scalar stays weak.
  CHECK(jnp::exp(Array(0)).weak_type());
  CHECK(jnp::exp(Array(0)).dtype() == f32);
}

TEST_CASE("abs, sign, negative on every numeric dtype") {
  for (DType d : kNumeric) {
    CAPTURE(dtype_name(d));
    if (is_unsigned_integer(d)) {
      CHECK(jnp::abs(of(d, {0, 5})).to_vector<double>() == std::vector<double>{0, 5});
      CHECK(jnp::sign(of(d, {0, 5})).to_vector<double>() == std::vector<double>{0, 1});
      continue;
    }
    Array x = of(d, {-3, 0, 2});
    CHECK(jnp::abs(x).to_vector<double>() == std::vector<double>{3, 0, 2});
    CHECK(jnp::sign(x).to_vector<double>() == std::vector<double>{-1, 0, 1});
    CHECK(jnp::negative(x).to_vector<double>() == std::vector<double>{3, 0, -2});
    CHECK(jnp::abs(x).dtype() == d);
  }
  CHECK(jnp::abs(jnp::array<int8_t>({-128, -3, 4})).to_vector<int>() == std::vector<int>{-128, 3, 4});  // wraps
  CHECK(B(jnp::abs(jnp::array<bool>({true, false}))) == std::vector<bool>{true, false});
  CHECK(jnp::square(I({3, -4})).to_vector<int>() == std::vector<int>{9, 16});
}

TEST_CASE("rounding: round (half to even, decimals), floor, ceil, trunc, rint") {
  check_values(jnp::round(F({0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 2.675f})), {0, 2, 2, -0.0, -2, 3});
  CHECK(std::signbit(jnp::round(F({-0.5f})).item<float>()));
  check_values(jnp::round(F({1.25f, 1.35f, -2.45f, 0.05f}), 1),
               {1.2000000476837158, 1.399999976158142, -2.4000000953674316, 0.0});
  check_values(jnp::round(F({15.f, 25.f, -15.f, 149.f}), -1), {20, 20, -20, 150});
  // Integers: decimals >= 0 is the identity; negative decimals round half to even (numpy).
  CHECK(jnp::round(I({15, 25, -15, 14, 16, -25, 35}), -1).to_vector<int>() ==
        std::vector<int>{20, 20, -20, 10, 20, -20, 40});
  CHECK(jnp::round(I({7}), 2).to_vector<int>() == std::vector<int>{7});
  CHECK(jnp::round(jnp::array<int8_t>({100, -128}), -3).to_vector<int>() == std::vector<int>{0, 0});
  // float16 with decimals is computed in float32 and rounded back.
  Array h = jnp::round(of(f16, {1.25f, 2.5f}), 1);
  CHECK(h.dtype() == f16);
  check_values(h, {1.2001953125, 2.5});
  check_values(jnp::floor(F({-1.5f, 1.5f, NAN})), {-2, 1, kNaN});
  check_values(jnp::ceil(F({-1.5f, 1.5f, INFINITY})), {-1, 2, kInf});
  check_values(jnp::trunc(F({-1.7f, 1.7f, -0.2f})), {-1, 1, -0.0});
  check_values(jnp::rint(F({0.5f, 1.5f, -2.5f, 2.4f})), {0, 2, -2, 2});
  // Integers: floor/ceil/trunc keep the array, rint converts to float32.
  Array xi = I({-3, 4});
  CHECK(jnp::floor(xi).dtype() == i32);
  CHECK(jnp::ceil(xi).to_vector<int>() == std::vector<int>{-3, 4});
  CHECK(jnp::trunc(xi).dtype() == i32);
  CHECK(jnp::rint(xi).dtype() == f32);
  CHECK(jnp::rint(xi).to_vector<float>() == std::vector<float>{-3.f, 4.f});
  for (DType d : kAll) {
    CAPTURE(dtype_name(d));
    Array r = jnp::round(of(d, {2, 3}));
    CHECK(r.dtype() == d);
    CHECK(r.to_vector<double>() == std::vector<double>{d == bool_ ? 1.0 : 2.0, d == bool_ ? 1.0 : 3.0});
    CHECK(jnp::floor(of(d, {2})).dtype() == d);
  }
  for (DType d : kFloats) {
    CAPTURE(dtype_name(d));
    CHECK(jnp::round(of(d, {0.5f, 1.5f, 2.5f})).to_vector<double>() == std::vector<double>{0, 2, 2});
    CHECK(jnp::trunc(of(d, {-1.5f, 1.5f})).to_vector<double>() == std::vector<double>{-1, 1});
  }
}

TEST_CASE("clip, maximum/minimum propagate NaN, fmax/fmin ignore it") {
  Array x = F({-2.f, 0.5f, 3.f, NAN});
  check_values(jnp::clip(x, Array(0.f), Array(1.f)), {0, 0.5, 1, kNaN});
  check_values(jnp::clip(x, std::nullopt, Array(1.f)), {-2, 0.5, 1, kNaN});
  check_values(jnp::clip(x, Array(0.f)), {0, 0.5, 3, kNaN});
  CHECK(jnp::clip(x).to_vector<double>().size() == 4);
  Array ci = jnp::clip(I({-5, 5, 50}), Array(0), Array(10));
  CHECK(ci.dtype() == i32);
  CHECK(ci.to_vector<int>() == std::vector<int>{0, 5, 10});
  // clip with array bounds (broadcast).
  check_values(jnp::clip(F({1.f, 5.f}, {2, 1}), F({2.f, 0.f}), Array(3.f)), {2, 1, 3, 3});

  Array a = F({1.f, NAN, NAN, 4.f}), b = F({NAN, 2.f, NAN, 3.f});
  check_values(jnp::maximum(a, b), {kNaN, kNaN, kNaN, 4});
  check_values(jnp::minimum(a, b), {kNaN, kNaN, kNaN, 3});
  check_values(jnp::fmax(a, b), {1, 2, kNaN, 4});
  check_values(jnp::fmin(a, b), {1, 2, kNaN, 3});
  check_values(jnp::maximum(F({-INFINITY, 0.f}), F({1.f, -0.f})), {1, 0});
  for (DType d : kFloats) {
    CAPTURE(dtype_name(d));
    Array p = of(d, {1, NAN}), q = of(d, {NAN, 2});
    check_values(jnp::maximum(p, q), {kNaN, kNaN});
    check_values(jnp::fmax(p, q), {1, 2});
    check_values(jnp::fmin(p, q), {1, 2});
  }
  CHECK(jnp::fmax(I({1, 5}), I({3, 2})).to_vector<int>() == std::vector<int>{3, 5});
}

TEST_CASE("where: broadcasting, promotion, non-bool conditions, NaN") {
  Array c = jnp::array<bool>({true, false, true});
  check_values(jnp::where(c, F({1.f, 2.f, 3.f}), Array(0.f)), {1, 0, 3});
  // (3,1) condition, (1,2) x, scalar y -> (3,2); int and weak float promote to weak float32.
  Array c2 = jnp::array<bool>({true, false, true}, {3, 1});
  Array r = jnp::where(c2, I({1, 2}, {1, 2}), Array(0.5));
  CHECK(r.shape() == Shape{3, 2});
  CHECK(r.dtype() == f32);
  CHECK(r.to_vector<float>() == std::vector<float>{1, 2, 0.5f, 0.5f, 1, 2});
  // Non-bool condition: nonzero is true (NaN is nonzero).
  check_values(jnp::where(F({0.f, NAN, -1.f}), Array(1.f), Array(2.f)), {2, 1, 1});
  // NaN values pass through.
  check_values(jnp::where(c, F({NAN, 1.f, NAN}), F({0.f, NAN, 0.f})), {kNaN, kNaN, kNaN});
  // Scalar condition.
  CHECK(jnp::where(Array(false), I({1, 2}), I({3, 4})).to_vector<int>() == std::vector<int>{3, 4});
  for (DType d : kAll) {
    CAPTURE(dtype_name(d));
    Array w = jnp::where(jnp::array<bool>({true, false}), of(d, {1, 1}), of(d, {0, 0}));
    CHECK(w.dtype() == d);
    CHECK(w.to_vector<double>() == std::vector<double>{1, 0});
  }
  // Mixed strong dtypes promote like JAX.
  CHECK(jnp::where(c, jnp::ones({3}, u8), jnp::ones({3}, i8)).dtype() == i16);
}

TEST_CASE("isnan, isinf, isfinite, isposinf, isneginf, nan_to_num") {
  Array x = F({1.f, NAN, INFINITY, -INFINITY, 0.f});
  CHECK(B(jnp::isnan(x)) == std::vector<bool>{false, true, false, false, false});
  CHECK(B(jnp::isinf(x)) == std::vector<bool>{false, false, true, true, false});
  CHECK(B(jnp::isfinite(x)) == std::vector<bool>{true, false, false, false, true});
  CHECK(B(jnp::isposinf(x)) == std::vector<bool>{false, false, true, false, false});
  CHECK(B(jnp::isneginf(x)) == std::vector<bool>{false, false, false, true, false});
  for (DType d : kAll) {
    CAPTURE(dtype_name(d));
    Array v = of(d, {1, 0});
    CHECK(jnp::isnan(v).dtype() == bool_);
    CHECK(jnp::isnan(v).shape() == Shape{2});
    CHECK(B(jnp::isnan(v)) == std::vector<bool>{false, false});
    CHECK(B(jnp::isinf(v)) == std::vector<bool>{false, false});
    CHECK(B(jnp::isfinite(v)) == std::vector<bool>{true, true});
    CHECK(B(jnp::isposinf(v)) == std::vector<bool>{false, false});
    CHECK(B(jnp::isneginf(v)) == std::vector<bool>{false, false});
  }
  for (DType d : kFloats) {
    CAPTURE(dtype_name(d));
    Array v = of(d, {NAN, INFINITY, -INFINITY});
    CHECK(B(jnp::isnan(v)) == std::vector<bool>{true, false, false});
    CHECK(B(jnp::isinf(v)) == std::vector<bool>{false, true, true});
    CHECK(B(jnp::isfinite(v)) == std::vector<bool>{false, false, false});
  }
  check_values(jnp::nan_to_num(F({NAN, INFINITY, -INFINITY, 1.f})),
               {0.0, 3.4028234663852886e+38, -3.4028234663852886e+38, 1.0});
  check_values(jnp::nan_to_num(F({NAN, INFINITY, -INFINITY}), 7.0, 1.0, -2.0), {7, 1, -2});
  check_values(jnp::nan_to_num(of(f16, {NAN, INFINITY, -INFINITY})), {0, 65504, -65504});
  check_values(jnp::nan_to_num(of(bf16, {INFINITY, -INFINITY})), {3.3895313892515355e38, -3.3895313892515355e38});
  check_values(jnp::nan_to_num(jnp::array<double>({INFINITY})), {std::numeric_limits<double>::max()});
  CHECK(jnp::nan_to_num(I({3})).to_vector<int>() == std::vector<int>{3});
}

TEST_CASE("logical functions: nonzero is true, every dtype") {
  Array a = I({0, 2, -1, 0}), b = F({0.f, 0.f, 0.5f, NAN});
  CHECK(B(jnp::logical_and(a, b)) == std::vector<bool>{false, false, true, false});
  CHECK(B(jnp::logical_or(a, b)) == std::vector<bool>{false, true, true, true});
  CHECK(B(jnp::logical_xor(a, b)) == std::vector<bool>{false, true, false, true});
  CHECK(B(jnp::logical_not(a)) == std::vector<bool>{true, false, false, true});
  CHECK(jnp::logical_and(a, b).dtype() == bool_);
  for (DType d : kAll) {
    CAPTURE(dtype_name(d));
    Array v = of(d, {0, 1});
    CHECK(B(jnp::logical_not(v)) == std::vector<bool>{true, false});
    CHECK(B(jnp::logical_and(v, Array(true))) == std::vector<bool>{false, true});
  }
  // Broadcasting (2,1) with (3,).
  Array r = jnp::logical_or(jnp::array<bool>({true, false}, {2, 1}), jnp::array<bool>({false, true, false}));
  CHECK(r.shape() == Shape{2, 3});
  CHECK(B(r) == std::vector<bool>{true, true, true, false, true, false});
}

TEST_CASE("bitwise functions and shifts") {
  Array a = I({12, -1}), b = I({10, 7});
  CHECK(jnp::bitwise_and(a, b).to_vector<int>() == std::vector<int>{8, 7});
  CHECK(jnp::bitwise_or(a, b).to_vector<int>() == std::vector<int>{14, -1});
  CHECK(jnp::bitwise_xor(a, b).to_vector<int>() == std::vector<int>{6, -8});
  CHECK(jnp::invert(jnp::array<int8_t>({0, 5, -1})).to_vector<int>() == std::vector<int>{-1, -6, 0});
  CHECK(jnp::bitwise_not(jnp::array<uint8_t>({0, 5, 255})).to_vector<int>() == std::vector<int>{255, 250, 0});
  CHECK(jnp::invert(jnp::array<uint32_t>({0})).item<uint32_t>() == 4294967295u);
  CHECK(B(jnp::invert(jnp::array<bool>({true, false}))) == std::vector<bool>{false, true});
  CHECK(B(jnp::bitwise_xor(jnp::array<bool>({true, true}), jnp::array<bool>({true, false}))) ==
        std::vector<bool>{false, true});
  for (DType d : kInts) {
    CAPTURE(dtype_name(d));
    Array x = of(d, {12, 5}), y = of(d, {10, 3});
    CHECK(jnp::bitwise_and(x, y).to_vector<double>() == std::vector<double>{8, 1});
    CHECK(jnp::bitwise_or(x, y).to_vector<double>() == std::vector<double>{14, 7});
    CHECK(jnp::bitwise_xor(x, y).to_vector<double>() == std::vector<double>{6, 6});
    CHECK(jnp::left_shift(x, of(d, {1, 2})).to_vector<double>() == std::vector<double>{24, 20});
    CHECK(jnp::right_shift(x, of(d, {2, 1})).to_vector<double>() == std::vector<double>{3, 2});
    CHECK(jnp::left_shift(x, of(d, {1, 2})).dtype() == d);
  }
  // numpy: int8 [1, 3] << [3, 5] = [8, 96]; int8 [-16, -1, 64] >> [2, 3, 1] = [-4, -1, 32] (arithmetic);
  // uint8 [240, 255] >> [2, 7] = [60, 1] (logical).
  CHECK(jnp::left_shift(jnp::array<int8_t>({1, 3}), jnp::array<int8_t>({3, 5})).to_vector<int>() ==
        std::vector<int>{8, 96});
  CHECK(jnp::right_shift(jnp::array<int8_t>({-16, -1, 64}), jnp::array<int8_t>({2, 3, 1})).to_vector<int>() ==
        std::vector<int>{-4, -1, 32});
  CHECK(jnp::right_shift(jnp::array<uint8_t>({240, 255}), jnp::array<uint8_t>({2, 7})).to_vector<int>() ==
        std::vector<int>{60, 1});
  // Shift by a weak scalar keeps the dtype.
  CHECK(jnp::left_shift(jnp::array<uint8_t>({3}), Array(2)).dtype() == u8);
  // bool shifts are promoted to int32.
  Array bs = jnp::left_shift(jnp::array<bool>({true}), jnp::array<bool>({true}));
  CHECK(bs.dtype() == i32);
  CHECK(bs.item<int>() == 2);
}

TEST_CASE("comparisons: promotion, broadcasting, NaN") {
  Array x = F({1.f, 2.f, NAN}), y = I({1, 3, 0});
  CHECK(B(jnp::equal(x, y)) == std::vector<bool>{true, false, false});
  CHECK(B(jnp::not_equal(x, y)) == std::vector<bool>{false, true, true});
  CHECK(B(jnp::less(x, y)) == std::vector<bool>{false, true, false});
  CHECK(B(jnp::less_equal(x, y)) == std::vector<bool>{true, true, false});
  CHECK(B(jnp::greater(x, y)) == std::vector<bool>{false, false, false});
  CHECK(B(jnp::greater_equal(x, y)) == std::vector<bool>{true, false, false});
  CHECK(jnp::equal(x, y).dtype() == bool_);
  // u8 vs negative literal would overflow; against a strong int8 array both go to int16.
  CHECK(B(jnp::less(jnp::array<uint8_t>({200}), jnp::array<int8_t>({-1}))) == std::vector<bool>{false});
  for (DType d : kAll) {
    CAPTURE(dtype_name(d));
    Array a = of(d, {0, 1}), b = of(d, {1, 1});
    CHECK(B(jnp::less(a, b)) == std::vector<bool>{true, false});
    CHECK(B(jnp::equal(a, b)) == std::vector<bool>{false, true});
  }
  Array r = jnp::greater(I({1, 2, 3}, {3, 1}), I({2}));
  CHECK(r.shape() == Shape{3, 1});
  CHECK(B(r) == std::vector<bool>{false, false, true});
}

TEST_CASE("isclose, allclose, array_equal") {
  Array a = F({1.f, 1.f, INFINITY, NAN, INFINITY, 1e-9f}), b = F({1.000001f, 1.01f, INFINITY, NAN, -INFINITY, 0.f});
  CHECK(B(jnp::isclose(a, b)) == std::vector<bool>{true, false, true, false, false, true});
  CHECK(B(jnp::isclose(a, b, 1e-5, 1e-8, true)) == std::vector<bool>{true, false, true, true, false, true});
  CHECK(B(jnp::isclose(a, b, 0.1)) == std::vector<bool>{true, true, true, false, false, true});
  CHECK(B(jnp::isclose(I({1, 2}), I({1, 3}))) == std::vector<bool>{true, false});
  CHECK(jnp::allclose(F({1.f, 2.f}), F({1.f, 2.000001f})));
  CHECK_FALSE(jnp::allclose(F({1.f, NAN}), F({1.f, NAN})));
  CHECK(jnp::allclose(F({1.f, NAN}), F({1.f, NAN}), 1e-5, 1e-8, true));
  CHECK(jnp::allclose(F({1.f, 2.f}), Array(1.5f), 0.5));
  CHECK(jnp::array_equal(I({1, 2}), F({1.f, 2.f})));
  CHECK_FALSE(jnp::array_equal(I({1, 2}), I({1, 2}, {2, 1})));
  CHECK_FALSE(jnp::array_equal(F({NAN}), F({NAN})));
  CHECK(jnp::array_equal(jnp::zeros({0}), jnp::zeros({0})));
}

TEST_CASE("heaviside, hypot, logaddexp") {
  // JAX's composition where(x < 0, 0, where(x > 0, 1, x2)) gives x2 for NaN (numpy gives NaN); we follow JAX.
  check_values(jnp::heaviside(F({-1.f, 0.f, 2.f, NAN}), Array(0.5f)), {0, 0.5, 1, 0.5});
  check_values(jnp::heaviside(F({0.f}), Array(NAN)), {kNaN});
  Array hi = jnp::heaviside(I({-3, 0, 4}), I({7, 7, 7}));
  CHECK(hi.dtype() == f32);
  CHECK(hi.to_vector<float>() == std::vector<float>{0, 7, 1});
  check_values(jnp::hypot(F({3.f, 0.f, 1e30f, INFINITY, -5.f}), F({4.f, 0.f, 1e30f, NAN, 12.f})),
               {5.0, 0.0, 1.4142135130433894e+30, kInf, 13.0});
  check_values(jnp::logaddexp(F({1000.f, 0.f, -INFINITY, INFINITY, 1.f}), F({1000.f, 0.f, -INFINITY, INFINITY, 2.f})),
               {1000.6931762695312, 0.6931471824645996, -kInf, kInf, 2.3132617473602295});
  check_values(jnp::logaddexp(F({NAN, 1.f}), F({1.f, NAN})), {kNaN, kNaN});
  check_values(jnp::logaddexp(F({INFINITY}), F({-INFINITY})), {kInf});
  for (DType d : kFloats) {
    CAPTURE(dtype_name(d));
    CHECK(jnp::hypot(of(d, {3}), of(d, {4})).to_vector<double>() == std::vector<double>{5});
    CHECK(jnp::logaddexp(of(d, {0}), of(d, {0})).dtype() == d);
  }
}

TEST_CASE("broadcasting: (3,1) + (1,4), scalar + array, zero-size, rank promotion") {
  Array a = jnp::multiply(jnp::arange(3).reshape({3, 1}), Array(10)), b = jnp::arange(4).reshape({1, 4});
  Array c = jnp::add(a, b);
  CHECK(c.shape() == Shape{3, 4});
  CHECK(c.to_vector<int>() == std::vector<int>{0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23});
  // (4,) + (2, 3, 4): leading dims added.
  Array d = jnp::add(F({1.f, 2.f, 3.f, 4.f}), jnp::zeros({2, 3, 4}));
  CHECK(d.shape() == Shape{2, 3, 4});
  CHECK(d.to_vector<float>()[5] == 2.f);
  // scalar + array (both orders), 0-d arrays.
  CHECK((Array(1.f) + F({1.f, 2.f})).to_vector<float>() == std::vector<float>{2.f, 3.f});
  CHECK((F({1.f, 2.f}) - Array(1.f)).to_vector<float>() == std::vector<float>{0.f, 1.f});
  Array s = jnp::add(jnp::full({}, Array(2.f)), jnp::full({}, Array(3.f)));
  CHECK(s.shape() == Shape{});
  CHECK(s.item<float>() == 5.f);
  // zero-size.
  Array z = jnp::add(jnp::zeros({0, 3}), jnp::ones({1, 3}));
  CHECK(z.shape() == Shape{0, 3});
  CHECK(z.size() == 0);
  CHECK(jnp::multiply(jnp::zeros({0}), Array(2.f)).shape() == Shape{0});
  CHECK(jnp::where(jnp::zeros({0}, bool_), Array(1.f), Array(2.f)).shape() == Shape{0});
  CHECK(jnp::exp(jnp::zeros({2, 0})).shape() == Shape{2, 0});
  // broadcast_all is a full broadcast.
  auto bb = broadcast_all("test", {F({1.f, 2.f}), Array(3.f), jnp::zeros({3, 1})});
  CHECK(bb[0].shape() == Shape{3, 2});
  CHECK(bb[1].shape() == Shape{3, 2});
  CHECK(bb[1].to_vector<float>() == std::vector<float>(6, 3.f));
  CHECK(bb[2].shape() == Shape{3, 2});
}

TEST_CASE("bfloat16 / float16 results are rounded to the storage type") {
  // bf16 has 8 significant bits: 1 + 2^-8 is a tie and rounds to even (1.0); 1 + 3*2^-8 -> 1 + 2^-6.
  Array one = jnp::ones({2}, bf16);
  CHECK(jnp::add(one, of(bf16, {0.00390625f, 0.01171875f})).to_vector<float>() == std::vector<float>{1.f, 1.015625f});
  // 1/3 in bf16 = 0.333984375; in f16 = 0.333251953125.
  CHECK(jnp::divide(of(bf16, {1}), of(bf16, {3})).item<float>() == 0.333984375f);
  CHECK(jnp::divide(of(f16, {1}), of(f16, {3})).item<float>() == 0.333251953125f);
  // f16: 1 + 2^-11 ties to 1; 0.1 * 3 = 0.2998046875; overflow to inf above 65504.
  CHECK(jnp::add(of(f16, {1}), Array(std::ldexp(1.0, -11))).item<float>() == 1.f);
  CHECK(jnp::multiply(of(f16, {0.1f}), Array(3)).item<float>() == 0.2998046875f);
  CHECK(std::isinf(jnp::add(of(f16, {65504}), of(f16, {32})).item<float>()));
  CHECK(jnp::exp(of(bf16, {0.5f})).item<float>() == 1.6484375f);
  CHECK(jnp::exp(of(f16, {0.5f})).item<float>() == 1.6484375f);
}

TEST_CASE("creation: zeros, ones, full, empty, *_like, asarray") {
  for (DType d : kAll) {
    CAPTURE(dtype_name(d));
    Array z = jnp::zeros({2, 3}, d), o = jnp::ones({2, 3}, d), e = jnp::empty({4}, d);
    CHECK(z.dtype() == d);
    CHECK(z.shape() == Shape{2, 3});
    CHECK(z.to_vector<double>() == std::vector<double>(6, 0.0));
    CHECK(o.to_vector<double>() == std::vector<double>(6, 1.0));
    CHECK(e.to_vector<double>() == std::vector<double>(4, 0.0));
    CHECK_FALSE(o.weak_type());
    Array f = jnp::full({3}, Array(1), d);
    CHECK(f.dtype() == d);
    CHECK(f.to_vector<double>() == std::vector<double>(3, 1.0));
    CHECK(jnp::zeros_like(o).dtype() == d);
    CHECK(jnp::ones_like(z).to_vector<double>() == std::vector<double>(6, 1.0));
    CHECK(jnp::full_like(z, Array(1)).dtype() == d);
  }
  CHECK(jnp::zeros({}).shape() == Shape{});
  CHECK(jnp::zeros({0, 5}).size() == 0);
  CHECK(jnp::zeros({3}).dtype() == f32);
  // full: dtype from the fill value (weak stays weak, as lax.full), value converted.
  Array fw = jnp::full({2}, Array(2.5));
  CHECK(fw.dtype() == f64);
  CHECK(fw.weak_type());
  Array fs = jnp::full({2}, jnp::array<int8_t>({-3}).reshape({}));
  CHECK(fs.dtype() == i8);
  CHECK_FALSE(fs.weak_type());
  CHECK(jnp::full({2}, Array(2.7), i32).to_vector<int>() == std::vector<int>{2, 2});
  CHECK(jnp::full({2}, Array(NAN), f16).to_vector<float>().size() == 2);
  // full with an array fill value broadcasts it.
  Array fb = jnp::full({2, 3}, F({1.f, 2.f, 3.f}));
  CHECK(fb.to_vector<float>() == std::vector<float>{1, 2, 3, 1, 2, 3});
  // full_like takes x's dtype (not the fill's) and its weak type.
  Array fl = jnp::full_like(I({1, 2}), Array(7.9));
  CHECK(fl.dtype() == i32);
  CHECK(fl.to_vector<int>() == std::vector<int>{7, 7});
  CHECK(jnp::full_like(I({1}), Array(1), f64).dtype() == f64);
  CHECK(jnp::zeros_like(Array(1.0)).weak_type());
  CHECK(jnp::zeros_like(F({1.f}), i8).dtype() == i8);
  // asarray: strong copy of the type.
  Array as = jnp::asarray(Array(2.5));
  CHECK(as.dtype() == f64);
  CHECK_FALSE(as.weak_type());
  CHECK(jnp::asarray(I({1}), f32).dtype() == f32);
  Array same = I({1});
  CHECK(jnp::asarray(same).impl() == same.impl());
}

TEST_CASE("creation: arange, linspace, eye, identity, iota") {
  Array a = jnp::arange(5);
  CHECK(a.dtype() == i32);
  CHECK(a.to_vector<int>() == std::vector<int>{0, 1, 2, 3, 4});
  CHECK(jnp::arange(0).size() == 0);
  CHECK(jnp::arange(-3).size() == 0);
  CHECK(jnp::arange(3, f32).to_vector<float>() == std::vector<float>{0, 1, 2});
  CHECK(jnp::arange(int64_t(5), int64_t(-5), int64_t(-3)).to_vector<int>() == std::vector<int>{5, 2, -1, -4});
  CHECK(jnp::arange(int64_t(10), int64_t(0), int64_t(3)).size() == 0);
  CHECK(jnp::arange(0, 10, 4).to_vector<int>() == std::vector<int>{0, 4, 8});  // plain ints
  CHECK(jnp::arange(2, 5).to_vector<int>() == std::vector<int>{2, 3, 4});
  CHECK(jnp::arange(0, 3, 1, f32).dtype() == f32);
  CHECK(jnp::arange(int64_t(2), int64_t(9), int64_t(3), i64).to_vector<int64_t>() == std::vector<int64_t>{2, 5, 8});
  CHECK(jnp::arange(int64_t(1), int64_t(4), int64_t(1), u8).dtype() == u8);
  // numpy float32 arange(0, 1, 0.1): 10 elements.
  check_values(jnp::arange(0.0, 1.0, 0.1),
               {0.0, 0.10000000149011612, 0.20000000298023224, 0.30000001192092896, 0.4000000059604645, 0.5,
                0.6000000238418579, 0.699999988079071, 0.800000011920929, 0.9000000357627869});
  Array ad = jnp::arange(1.0, 2.0, 0.3, f64);
  CHECK(ad.dtype() == f64);
  CHECK(ad.to_vector<double>() == std::vector<double>{1.0, 1.3, 1.6, 1.9000000000000001});
  CHECK(jnp::arange(2.0, 1.0, 0.5).size() == 0);
  CHECK(jnp::arange(1.0, -1.0, -0.5).to_vector<float>() == std::vector<float>{1.f, 0.5f, 0.f, -0.5f});

  CHECK(jnp::linspace(0, 1, 5).to_vector<float>() == std::vector<float>{0, 0.25f, 0.5f, 0.75f, 1});
  CHECK(jnp::linspace(0, 1, 4, false).to_vector<float>() == std::vector<float>{0, 0.25f, 0.5f, 0.75f});
  check_values(jnp::linspace(-1, 2, 7, true, f64), {-1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0}, 1e-15);
  CHECK(jnp::linspace(0, 10, 4, true, i32).to_vector<int>() == std::vector<int>{0, 3, 6, 10});
  CHECK(jnp::linspace(2.5, -3.5, 5).to_vector<float>() == std::vector<float>{2.5f, 1.f, -0.5f, -2.f, -3.5f});
  CHECK(jnp::linspace(3, 7, 1).to_vector<float>() == std::vector<float>{3.f});
  CHECK(jnp::linspace(3, 7, 0).size() == 0);
  CHECK(jnp::linspace(0, 1, 3, true, bf16).dtype() == bf16);
  CHECK(jnp::linspace(0, 1, 3, true, bf16).to_vector<float>() == std::vector<float>{0.f, 0.5f, 1.f});

  Array e = jnp::eye(3, 4, 1);
  CHECK(e.shape() == Shape{3, 4});
  CHECK(e.to_vector<float>() == std::vector<float>{0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1});
  CHECK(jnp::eye(3, 2, -1).to_vector<float>() == std::vector<float>{0, 0, 1, 0, 0, 1});
  CHECK(jnp::eye(2, std::nullopt, 5).to_vector<float>() == std::vector<float>{0, 0, 0, 0});
  CHECK(jnp::eye(2, std::nullopt, 0, bool_).dtype() == bool_);
  CHECK(jnp::identity(3, i32).to_vector<int>() == std::vector<int>{1, 0, 0, 0, 1, 0, 0, 0, 1});
  CHECK(jnp::eye(0).shape() == Shape{0, 0});
  Array io = jnp::iota(u8, 4);
  CHECK(io.dtype() == u8);
  CHECK(io.to_vector<int>() == std::vector<int>{0, 1, 2, 3});
  CHECK(jnp::iota(f16, 3).to_vector<float>() == std::vector<float>{0, 1, 2});
}

TEST_CASE("Array operators and astype") {
  Array x = F({1.f, -2.f, 3.f}), y = F({2.f, 2.f, 2.f});
  CHECK((x + y).to_vector<float>() == std::vector<float>{3, 0, 5});
  CHECK((x - y).to_vector<float>() == std::vector<float>{-1, -4, 1});
  CHECK((x * y).to_vector<float>() == std::vector<float>{2, -4, 6});
  CHECK((x / y).to_vector<float>() == std::vector<float>{0.5f, -1, 1.5f});
  CHECK((x % y).to_vector<float>() == std::vector<float>{1, 0, 1});
  CHECK((F({-1.f}) % Array(3.f)).item<float>() == 2.f);  // sign of divisor
  CHECK((-x).to_vector<float>() == std::vector<float>{-1, 2, -3});
  CHECK(B(x == y) == std::vector<bool>{false, false, false});
  CHECK(B(x != y) == std::vector<bool>{true, true, true});
  CHECK(B(x < y) == std::vector<bool>{true, true, false});
  CHECK(B(x <= y) == std::vector<bool>{true, true, false});
  CHECK(B(x > y) == std::vector<bool>{false, false, true});
  CHECK(B(x >= y) == std::vector<bool>{false, false, true});
  CHECK(B(x > 0.f) == std::vector<bool>{true, false, true});
  // Integer operators: / is true division, % floors.
  Array a = I({7, -7}), b = I({2, 2});
  CHECK((a / b).dtype() == f32);
  CHECK((a / b).to_vector<float>() == std::vector<float>{3.5f, -3.5f});
  CHECK((a % b).to_vector<int>() == std::vector<int>{1, 1});
  CHECK((a & b).to_vector<int>() == std::vector<int>{2, 0});
  CHECK((a | b).to_vector<int>() == std::vector<int>{7, -5});
  CHECK((a ^ b).to_vector<int>() == std::vector<int>{5, -5});
  CHECK((~a).to_vector<int>() == std::vector<int>{-8, 6});
  // bool operators are logical.
  Array p = jnp::array<bool>({true, false}), q = jnp::array<bool>({true, true});
  CHECK(B(p & q) == std::vector<bool>{true, false});
  CHECK(B(p | q) == std::vector<bool>{true, true});
  CHECK(B(p ^ q) == std::vector<bool>{false, true});
  CHECK(B(~p) == std::vector<bool>{false, true});
  CHECK(B((x > 0.f) & (x < 2.f)) == std::vector<bool>{true, false, false});
  // Compound assignment rebinds the handle.
  Array acc = F({1.f, 2.f});
  Array before = acc;
  acc += Array(1.f);
  acc *= F({2.f, 3.f});
  acc -= Array(1);
  acc /= Array(2.f);
  CHECK(acc.to_vector<float>() == std::vector<float>{1.5f, 4.f});
  CHECK(before.to_vector<float>() == std::vector<float>{1.f, 2.f});
  // astype: strong result; same dtype is a no-op; float -> int truncates; to bool is nonzero.
  CHECK(x.astype(i32).to_vector<int>() == std::vector<int>{1, -2, 3});
  CHECK(x.astype(f32).impl() == x.impl());
  CHECK(B(F({0.f, 0.5f, NAN}).astype(bool_)) == std::vector<bool>{false, true, true});
  CHECK(F({1.7f}).astype(bf16).dtype() == bf16);
  CHECK(F({1.7f}).astype(bf16).item<float>() == 1.703125f);
  Array w = Array(2.5).astype(f64);
  CHECK(w.dtype() == f64);
  CHECK_FALSE(w.weak_type());
  // Scalars on either side.
  CHECK((2.f * x).to_vector<float>() == std::vector<float>{2, -4, 6});
  CHECK((1 - I({1, 2})).to_vector<int>() == std::vector<int>{0, -1});
  CHECK((Array(1.f) / F({4.f})).item<float>() == 0.25f);
}

TEST_CASE("misuse: typed errors naming the function, shapes and dtypes") {
  // 1. incompatible broadcast names both shapes.
  CHECK_THROWS_WITH_AS(jnp::add(jnp::zeros({3}), jnp::zeros({4})), doctest::Contains("(3,) and (4,)"), ShapeError);
  CHECK_THROWS_WITH_AS(F({1.f, 2.f}) * jnp::zeros({2, 3}), doctest::Contains("multiply"), ShapeError);
  // 2. where with incompatible shapes.
  CHECK_THROWS_WITH_AS(jnp::where(jnp::zeros({2}, bool_), jnp::zeros({3}), Array(1.f)), doctest::Contains("(3,)"),
                       ShapeError);
  // 3. bitwise on floats names the dtype.
  CHECK_THROWS_WITH_AS(jnp::bitwise_and(jnp::zeros({2}), jnp::zeros({2})), doctest::Contains("float32"), DTypeError);
  CHECK_THROWS_WITH_AS(jnp::bitwise_or(I({1}), Array(1.5)), doctest::Contains("bitwise_or"), DTypeError);
  // 4. invert / operator~ on floats.
  CHECK_THROWS_WITH_AS(~jnp::zeros({2}, f64), doctest::Contains("float64"), DTypeError);
  // 5. shifts on floats.
  CHECK_THROWS_WITH_AS(jnp::left_shift(jnp::zeros({2}), I({1, 1})), doctest::Contains("left_shift"), DTypeError);
  CHECK_THROWS_WITH_AS(jnp::right_shift(jnp::zeros({2}, bf16), Array(1)), doctest::Contains("bfloat16"), DTypeError);
  // 6. power: integer ** negative integer.
  CHECK_THROWS_WITH_AS(jnp::power(I({2, 3}), Array(-1)), doctest::Contains("negative"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::power(I({2, 3}), I({1, -2})), doctest::Contains("-2"), ValueError);
  // 7. boolean subtract / negative / sign.
  CHECK_THROWS_WITH_AS(jnp::array<bool>({true}) - jnp::array<bool>({false}), doctest::Contains("bool"), DTypeError);
  CHECK_THROWS_WITH_AS(-jnp::array<bool>({true}), doctest::Contains("negative"), DTypeError);
  CHECK_THROWS_WITH_AS(jnp::sign(jnp::array<bool>({true})), doctest::Contains("bool"), DTypeError);
  // 8. integer literal overflow.
  CHECK_THROWS_WITH_AS(jnp::array<uint8_t>({1}) + 256, doctest::Contains("256"), ValueError);
  // 9. arange with step 0, linspace with a negative count.
  CHECK_THROWS_WITH_AS(jnp::arange(int64_t(0), int64_t(5), int64_t(0)), doctest::Contains("step"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::arange(0.0, 1.0, 0.0), doctest::Contains("step"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::linspace(0, 1, -2), doctest::Contains("-2"), ValueError);
  // 10. negative dimensions.
  CHECK_THROWS_WITH_AS(jnp::zeros({2, -2}), doctest::Contains("(2, -2)"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::eye(-1), doctest::Contains("eye"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::iota(i32, -1), doctest::Contains("iota"), ValueError);
  // 11. full with a fill value that does not broadcast.
  CHECK_THROWS_WITH_AS(jnp::full({2, 3}, F({1.f, 2.f})), doctest::Contains("(2,)"), ShapeError);
  // 12. empty handles.
  CHECK_THROWS_AS(jnp::add(Array(), F({1.f})), ValueError);
  // 13. promote_dtypes / broadcast_all helpers name the caller.
  CHECK_THROWS_WITH_AS(broadcast_all("my_op", {jnp::zeros({2, 3}), jnp::zeros({3, 2})}), doctest::Contains("my_op"),
                       ShapeError);
}

TEST_CASE("eager f32[8] + f32[8] in a loop (time reported, not asserted)") {
  Array x = jnp::ones({8}), y = jnp::ones({8});
  Array z = x + y;
  const int n = 200000;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) z = x + y;
  auto t1 = std::chrono::steady_clock::now();
  double ns = std::chrono::duration<double, std::nano>(t1 - t0).count() / n;
  MESSAGE("eager x + y (f32[8]): " << ns << " ns/op");
  CHECK(z.to_vector<float>() == std::vector<float>(8, 2.f));
  // No bound on ns: a loaded CI machine under ASan took 23 us here; the goal (<= 500 ns) is
  // measured by bench/bench_foundation against PyTorch in the same run.
}
