// JAX's type promotion table (jax.numpy type promotion docs, default 32-bit mode) for cjax's 11
// dtypes, strong x strong and weak C++ scalars against each dtype, checked through
// numpy::result_type and through real operations (values and weak_type).
#include <doctest/doctest.h>

#include <string>

#include "cjax/cjax.h"
#include "core/array/util.h"

using namespace cjax;
namespace jnp = cjax::numpy;

namespace {
// Order of rows/columns below.
const DType kOrder[11] = {bool_, i8, i16, i32, i64, u8, u32, bf16, f16, f32, f64};

// JAX's documented table restricted to our dtypes (row op column).
const char* kTable[11][11] = {
    //        bool    i8      i16     i32     i64     u8      u32     bf16    f16     f32     f64
    /*bool*/ {"bool", "i8", "i16", "i32", "i64", "u8", "u32", "bf16", "f16", "f32", "f64"},
    /*i8  */ {"i8", "i8", "i16", "i32", "i64", "i16", "i64", "bf16", "f16", "f32", "f64"},
    /*i16 */ {"i16", "i16", "i16", "i32", "i64", "i16", "i64", "bf16", "f16", "f32", "f64"},
    /*i32 */ {"i32", "i32", "i32", "i32", "i64", "i32", "i64", "bf16", "f16", "f32", "f64"},
    /*i64 */ {"i64", "i64", "i64", "i64", "i64", "i64", "i64", "bf16", "f16", "f32", "f64"},
    /*u8  */ {"u8", "i16", "i16", "i32", "i64", "u8", "u32", "bf16", "f16", "f32", "f64"},
    /*u32 */ {"u32", "i64", "i64", "i64", "i64", "u32", "u32", "bf16", "f16", "f32", "f64"},
    /*bf16*/ {"bf16", "bf16", "bf16", "bf16", "bf16", "bf16", "bf16", "bf16", "f32", "f32", "f64"},
    /*f16 */ {"f16", "f16", "f16", "f16", "f16", "f16", "f16", "f32", "f16", "f32", "f64"},
    /*f32 */ {"f32", "f32", "f32", "f32", "f32", "f32", "f32", "f32", "f32", "f32", "f64"},
    /*f64 */ {"f64", "f64", "f64", "f64", "f64", "f64", "f64", "f64", "f64", "f64", "f64"},
};

DType parse(const char* s) { return *dtype_from_name(s); }

Array ones_of(DType d) { return jnp::ones({3}, d); }
}  // namespace

TEST_CASE("promotion: strong x strong matches JAX's table (result_type and add)") {
  for (int i = 0; i < 11; ++i) {
    for (int j = 0; j < 11; ++j) {
      DType a = kOrder[i], b = kOrder[j], want = parse(kTable[i][j]);
      CAPTURE(dtype_name(a));
      CAPTURE(dtype_name(b));
      CHECK(promote_types(a, b) == want);
      TypeInfo t = jnp::result_type({ones_of(a), ones_of(b)});
      CHECK(t.dtype == want);
      CHECK_FALSE(t.weak);
      Array r = jnp::add(ones_of(a), ones_of(b));
      CHECK(r.dtype() == want);
      CHECK_FALSE(r.weak_type());
      // bool + bool is logical or (True); everything else 1 + 1 = 2.
      CHECK(r.to_vector<double>() == std::vector<double>(3, want == bool_ ? 1.0 : 2.0));
      // The table is symmetric.
      CHECK(std::string(kTable[i][j]) == kTable[j][i]);
    }
  }
}

TEST_CASE("promotion: weak int scalar (C++ int / int64_t) against each dtype") {
  // i* column of JAX's table: yields to every strong dtype; bool + i* -> weak int32.
  for (DType d : kOrder) {
    CAPTURE(dtype_name(d));
    for (Array s : {Array(2), Array(int64_t(2))}) {
      Array r = jnp::multiply(ones_of(d), s);
      if (d == bool_) {
        CHECK(r.dtype() == i32);
        CHECK(r.weak_type());
      } else {
        CHECK(r.dtype() == d);
        CHECK_FALSE(r.weak_type());
      }
      CHECK(r.to_vector<double>() == std::vector<double>(3, 2.0));
      TypeInfo t = jnp::result_type({s, ones_of(d)});
      CHECK(t.dtype == r.dtype());
      CHECK(t.weak == r.weak_type());
    }
  }
}

TEST_CASE("promotion: weak float scalar (C++ float / double) against each dtype") {
  // f* column: bool and integers -> weak float32; floats keep their dtype (strong).
  for (DType d : kOrder) {
    CAPTURE(dtype_name(d));
    for (Array s : {Array(0.5f), Array(0.5)}) {
      Array r = jnp::add(ones_of(d), s);
      if (is_floating(d)) {
        CHECK(r.dtype() == d);
        CHECK_FALSE(r.weak_type());
      } else {
        CHECK(r.dtype() == f32);
        CHECK(r.weak_type());
      }
      CHECK(r.to_vector<double>() == std::vector<double>(3, 1.5));
    }
  }
}

TEST_CASE("promotion: documented examples") {
  // u8 + i8 -> i16, u32 + i32 -> i64, bf16 + f16 -> f32, i64 + f16 -> f16.
  CHECK(jnp::add(ones_of(u8), ones_of(i8)).dtype() == i16);
  CHECK(jnp::add(ones_of(u32), ones_of(i32)).dtype() == i64);
  CHECK(jnp::add(ones_of(bf16), ones_of(f16)).dtype() == f32);
  CHECK(jnp::add(ones_of(i64), ones_of(f16)).dtype() == f16);
  // weak float + int32 array -> float32, weakly typed.
  Array r = jnp::arange(3) + 0.5;
  CHECK(r.dtype() == f32);
  CHECK(r.weak_type());
  CHECK(r.to_vector<float>() == std::vector<float>{0.5f, 1.5f, 2.5f});
  // f64 array * 0.1 stays f64, and the scalar is the exact double 0.1.
  Array x = jnp::array<double>({1.0, 3.0});
  Array y = x * 0.1;
  CHECK(y.dtype() == f64);
  CHECK_FALSE(y.weak_type());
  CHECK(y.to_vector<double>() == std::vector<double>{0.1, 3.0 * 0.1});
  // f16 array * 2.0 -> f16; bf16 array + 1 -> bf16.
  CHECK((jnp::ones({2}, f16) * 2.0).dtype() == f16);
  CHECK((jnp::ones({2}, bf16) + 1).dtype() == bf16);
  // i8 array + 100 stays i8 (and wraps like int8 arithmetic).
  Array b = jnp::array<int8_t>({100}) + 100;
  CHECK(b.dtype() == i8);
  CHECK(b.item<int>() == -56);
  // Weak x weak: same dtype keeps it; mixed kinds take the default dtype, still weak.
  Array ww = Array(1.5) * Array(2.0);
  CHECK(ww.dtype() == f64);
  CHECK(ww.weak_type());
  CHECK(ww.item<double>() == 3.0);
  Array wi = Array(2) + Array(int64_t(3));
  CHECK(wi.dtype() == i32);
  CHECK(wi.weak_type());
  CHECK(wi.item<int>() == 5);
  Array wf = Array(2) * Array(0.5);
  CHECK(wf.dtype() == f32);
  CHECK(wf.weak_type());
  CHECK(wf.item<float>() == 1.0f);
  // bool + weak int -> weak int32 (True + 1 == 2).
  Array bi = Array(true) + 1;
  CHECK(bi.dtype() == i32);
  CHECK(bi.weak_type());
  CHECK(bi.item<int>() == 2);
  // Three-way result_type.
  TypeInfo t = jnp::result_type({ones_of(u8), ones_of(i8), Array(1.0)});
  CHECK(t.dtype == f32);
  CHECK(t.weak);
  TypeInfo t2 = jnp::result_type({ones_of(u8), ones_of(bf16), Array(1)});
  CHECK(t2.dtype == bf16);
  CHECK_FALSE(t2.weak);
}

TEST_CASE("promotion: promote_dtypes and convert_to helpers keep weak_type right") {
  auto p = promote_dtypes("test", {ones_of(i32), Array(2.5)});
  CHECK(p[0].dtype() == f32);
  CHECK(p[1].dtype() == f32);
  CHECK(p[0].weak_type());
  CHECK(p[1].weak_type());
  CHECK(p[1].item<float>() == 2.5f);
  auto q = promote_dtypes("test", {ones_of(f16), Array(3)});
  CHECK(q[1].dtype() == f16);
  CHECK_FALSE(q[1].weak_type());
  CHECK(q[1].item<float>() == 3.0f);
  Array c = convert_to(jnp::array<float>({1.5f, -2.5f}), i32);
  CHECK(c.dtype() == i32);
  CHECK(c.to_vector<int>() == std::vector<int>{1, -2});
  Array w = convert_to(Array(7), f64, true);
  CHECK(w.dtype() == f64);
  CHECK(w.weak_type());
  CHECK(w.item<double>() == 7.0);
}

TEST_CASE("promotion: integer literal overflow and result_type misuse") {
  // JAX raises OverflowError for a Python int that does not fit the array's dtype.
  CHECK_THROWS_WITH_AS(jnp::add(jnp::ones({2}, u8), Array(300)), doctest::Contains("300 does not fit in uint8"),
                       ValueError);
  CHECK_THROWS_WITH_AS(jnp::add(jnp::ones({2}, u32), Array(-1)), doctest::Contains("uint32"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::multiply(jnp::ones({2}, i8), Array(int64_t(1) << 40)), doctest::Contains("int8"),
                       ValueError);
  CHECK_THROWS_AS(jnp::result_type({}), ValueError);
}
