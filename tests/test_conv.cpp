// conv_general_dilated / lax::conv. Expected values from a direct numpy loop reference
// (cross-correlation over the lhs-dilated, padded input with rhs-dilated taps).
#include <doctest/doctest.h>

#include <cmath>

#include "cjax/cjax.h"
#include "core/lax/linalg.h"
#include "test_util.h"

using namespace cjax;
namespace jnp = cjax::numpy;

using namespace cjax::testing;
namespace {
const std::vector<double> kC1 = {-2.0, 9.0, 14.0, -3.0, -8.0, 0.0, -11.0, 18.0, 1.0, 1.0, -6.0, -6.0};
}  // namespace

TEST_CASE("conv NCHW VALID stride 1") {
  Array x = seq({1, 2, 4, 4}, 7, 3), w = seq({3, 2, 3, 3}, 5, 2);
  Array y = lax::conv(x, w, {1, 1}, "VALID");
  CHECK(y.shape() == Shape{1, 3, 2, 2});
  CHECK(y.dtype() == f32);
  CHECK(vals(y) == kC1);
}

TEST_CASE("conv dtypes: f64, bf16, f16, int32, int8 -> int32 preferred") {
  for (DType dt : {f64, bf16, f16, i32, i16}) {
    CAPTURE(dtype_name(dt));
    Array y = lax::conv(seq({1, 2, 4, 4}, 7, 3, dt), seq({3, 2, 3, 3}, 5, 2, dt), {1, 1}, "VALID");
    CHECK(y.dtype() == dt);
    CHECK(vals(y) == kC1);
  }
  Array y = lax::conv_general_dilated(seq({1, 2, 4, 4}, 7, 3, i8), seq({3, 2, 3, 3}, 5, 2, i8), {1, 1}, "VALID", {}, {},
                                      {}, 1, i32);
  CHECK(y.dtype() == i32);
  CHECK(vals(y) == kC1);
}

TEST_CASE("conv SAME stride 2 and explicit padding") {
  Array x = seq({1, 2, 4, 4}, 7, 3), w = seq({3, 2, 3, 3}, 5, 2);
  Array y = lax::conv(x, w, {2, 2}, "SAME");  // pads (0, 1) per dim, as JAX's padtype_to_pads
  CHECK(y.shape() == Shape{1, 3, 2, 2});
  CHECK(vals(y) == std::vector<double>{-2.0, -11.0, 11.0, -10.0, -8.0, 9.0, 4.0, 10.0, 1.0, 4.0, -3.0, -10.0});
  Array z = lax::conv_general_dilated(x, w, {1, 2}, std::vector<std::pair<int64_t, int64_t>>{{1, 0}, {2, 1}});
  CHECK(z.shape() == Shape{1, 3, 3, 3});
  CHECK(vals(z) == std::vector<double>{5.0,   -4.0, 3.0, 3.0,   -2.0, -11.0, 3.0, 14.0,  5.0,
                                       -10.0, 0.0,  5.0, 7.0,   -8.0, 9.0,   6.0, -11.0, -14.0,
                                       10.0,  -1.0, 2.0, -14.0, 1.0,  4.0,   4.0, -6.0,  7.0});
  // odd size, stride 2: pads (1, 1)
  Array s = lax::conv(seq({1, 1, 5, 5}, 7, 3), seq({1, 1, 3, 3}, 5, 2), {2, 2}, "SAME");
  CHECK(s.shape() == Shape{1, 1, 3, 3});
  CHECK(vals(s) == std::vector<double>{1.0, -9.0, 4.0, -5.0, -2.0, 1.0, 14.0, -3.0, -5.0});
}

TEST_CASE("conv rhs dilation and lhs dilation (transposed conv)") {
  Array y = lax::conv_general_dilated(seq({1, 1, 5, 5}, 7, 3), seq({1, 1, 2, 2}, 5, 2), {1, 1}, "VALID", {}, {2, 1});
  CHECK(y.shape() == Shape{1, 1, 3, 4});
  CHECK(vals(y) == std::vector<double>{9.0, 7.0, 5.0, -4.0, -8.0, -3.0, 9.0, 7.0, -4.0, -6.0, -8.0, -3.0});
  Array t = lax::conv_general_dilated(seq({1, 1, 3, 3}, 7, 3), seq({1, 1, 3, 3}, 5, 2), {1, 1},
                                      std::vector<std::pair<int64_t, int64_t>>{{1, 1}, {1, 1}}, {2, 2});
  CHECK(t.shape() == Shape{1, 1, 5, 5});
  CHECK(vals(t) == std::vector<double>{-6.0, 1.0, -4.0, 0.0,  -2.0, 3.0,  7.0,  2.0, 5.0, 1.0,  0.0, -2.0, 2.0,
                                       -3.0, 4.0, 0.0,  -6.0, -1.0, -1.0, -2.0, 6.0, 9.0, -6.0, 1.0, -4.0});
}

TEST_CASE("conv feature groups") {
  Array y = lax::conv_general_dilated(seq({2, 4, 3, 3}, 7, 3), seq({6, 2, 2, 2}, 5, 2), {1, 1}, "VALID", {}, {}, {}, 2);
  CHECK(y.shape() == Shape{2, 6, 2, 2});
  CHECK(vals(y) == std::vector<double>{5.0,  2.0,  -4.0,  7.0,   -10.0, 5.0,  0.0,  8.0,   10.0,  3.0,   -11.0, -11.0,
                                       0.0,  -8.0, -10.0, -4.0,  -4.0,  6.0,  5.0,  -6.0,  7.0,   -10.0, 5.0,   2.0,
                                       2.0,  6.0,  7.0,   -10.0, 5.0,   -8.0, 8.0,  9.0,   3.0,   3.0,   -11.0, 3.0,
                                       -8.0, 5.0,  -4.0,  9.0,   6.0,   2.0,  -6.0, -10.0, -10.0, -6.0,  2.0,   6.0});
}

TEST_CASE("conv NHWC / HWIO layout") {
  std::vector<float> xv = {-3, -1, -2, 0, -1, 1, 0, 2, 1, 3,  2, -3, 3,  -2, -3, -1,
                           -2, 0,  -1, 1, 0,  2, 1, 3, 2, -3, 3, -2, -3, -1, -2, 0};
  std::vector<float> wv = {-2, 1,  -1, 2,  0,  -2, -1, 2,  0,  -2, 1,  -1, 0,  -2, 1,  -1, 2,  0,
                           1,  -1, 2,  0,  -2, 1,  2,  0,  -2, 1,  -1, 2,  -2, 1,  -1, 2,  0,  -2,
                           -1, 2,  0,  -2, 1,  -1, 0,  -2, 1,  -1, 2,  0,  1,  -1, 2,  0,  -2, 1};
  Array x = jnp::array(xv, {1, 4, 4, 2}), w = jnp::array(wv, {3, 3, 2, 3});
  Array y = lax::conv_general_dilated(x, w, {1, 1}, "VALID", {}, {}, {"NHWC", "HWIO", "NHWC"});
  CHECK(y.shape() == Shape{1, 2, 2, 3});
  CHECK(vals(y) == std::vector<double>{-2.0, -8.0, 1.0, 9.0, 0.0, 1.0, 14.0, -11.0, -6.0, -3.0, 18.0, -6.0});
  // Same data, NHWC in, NCHW out.
  Array z = lax::conv_general_dilated(x, w, {1, 1}, "VALID", {}, {}, {"NHWC", "HWIO", "NCHW"});
  CHECK(z.shape() == Shape{1, 3, 2, 2});
  CHECK(vals(z) == kC1);
}

TEST_CASE("conv 1-D and 3-D with the default layout") {
  Array y = lax::conv(seq({1, 1, 6}, 7, 3), seq({1, 1, 3}, 5, 2), {1}, "SAME");
  CHECK(y.shape() == Shape{1, 1, 6});
  CHECK(vals(y) == std::vector<double>{3.0, 8.0, 5.0, 2.0, -1.0, -4.0});
  Array z = lax::conv(seq({1, 1, 3, 3, 3}, 7, 3), seq({1, 1, 2, 2, 2}, 5, 2), {1, 1, 1}, "VALID");
  CHECK(z.shape() == Shape{1, 1, 2, 2, 2});
  CHECK(vals(z) == std::vector<double>{5.0, 2.0, -4.0, 7.0, 6.0, -4.0, -10.0, -6.0});
}

TEST_CASE("conv NaN propagation, zero-size batch, empty output") {
  Array x = seq({1, 1, 3, 3}, 7, 3);
  x = x.at({0, 0, 0, 0}).set(Array(NAN));
  Array y = lax::conv(x, jnp::ones({1, 1, 2, 2}), {1, 1}, "VALID");
  auto v = y.to_vector<float>();
  CHECK(std::isnan(v[0]));
  CHECK(!std::isnan(v[3]));
  Array e = lax::conv(jnp::zeros({0, 2, 4, 4}), jnp::ones({3, 2, 3, 3}), {1, 1}, "VALID");
  CHECK(e.shape() == Shape{0, 3, 2, 2});
  Array s = lax::conv(jnp::ones({1, 1, 2, 2}), jnp::ones({1, 1, 3, 3}), {1, 1}, "VALID");
  CHECK(s.shape() == Shape{1, 1, 0, 0});
}

TEST_CASE("conv dimension_numbers parameter prints like JAX") {
  ConvDimsParam p;
  p.lhs_spec = {0, 3, 1, 2};
  p.rhs_spec = {3, 2, 0, 1};
  p.out_spec = {0, 3, 1, 2};
  CHECK(p.str() == "ConvDimensionNumbers(lhs_spec=(0, 3, 1, 2), rhs_spec=(3, 2, 0, 1), out_spec=(0, 3, 1, 2))");
  CHECK(prims::conv_general_dilated().name == "conv_general_dilated");
}

TEST_CASE("conv misuse") {
  Array x = jnp::ones({1, 2, 4, 4}), w = jnp::ones({3, 3, 3, 3});
  CHECK_THROWS_WITH_AS(lax::conv(x, w, {1, 1}, "VALID"),
                       doctest::Contains("lhs feature dimension (size 2) must equal the rhs input feature dimension "
                                         "(size 3)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(lax::conv_general_dilated(x, jnp::ones({3, 2, 3, 3}), {1, 1}, "VALID", {}, {},
                                                 {"NHWX", "OIHW", "NCHW"}),
                       doctest::Contains("\"NHWX\" must contain the characters 'N' and 'C'"), ValueError);
  CHECK_THROWS_WITH_AS(lax::conv(x, jnp::ones({3, 2, 3, 3}, f64), {1, 1}, "VALID"),
                       doctest::Contains("same dtype, got float32 and float64"), DTypeError);
  CHECK_THROWS_WITH_AS(lax::conv(x, jnp::ones({3, 2, 3, 3}), {1, 1}, "FULL"),
                       doctest::Contains("unknown padding \"FULL\""), ValueError);
  CHECK_THROWS_WITH_AS(lax::conv(x, jnp::ones({3, 2, 3, 3}), {1}, "VALID"),
                       doctest::Contains("one entry per spatial dimension (2)"), ValueError);
  CHECK_THROWS_WITH_AS(lax::conv_general_dilated(x, jnp::ones({3, 1, 3, 3}), {1, 1}, "VALID", {}, {}, {}, 2),
                       doctest::Contains("must be a multiple of feature_group_count (2)"), ShapeError);
}
