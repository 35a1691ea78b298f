// Array's elementwise operators and astype: numpy broadcasting and JAX type promotion, each
// mapping to its cjax::numpy function (operator/ is true division, % is numpy's remainder with
// the divisor's sign, & | ^ ~ are bitwise, i.e. logical on bools).
#include "cjax/array.h"
#include "cjax/lax.h"
#include "cjax/numpy.h"

namespace cjax {

namespace jnp = cjax::numpy;

// JAX's astype: convert_element_type to a strongly typed `d` (a no-op for the same strong dtype).
Array Array::astype(DType d) const { return lax::convert_element_type(*this, d); }

Array operator+(const Array& x, const Array& y) { return jnp::add(x, y); }
Array operator-(const Array& x, const Array& y) { return jnp::subtract(x, y); }
Array operator*(const Array& x, const Array& y) { return jnp::multiply(x, y); }
Array operator/(const Array& x, const Array& y) { return jnp::true_divide(x, y); }
Array operator%(const Array& x, const Array& y) { return jnp::remainder(x, y); }
Array operator-(const Array& x) { return jnp::negative(x); }
Array operator==(const Array& x, const Array& y) { return jnp::equal(x, y); }
Array operator!=(const Array& x, const Array& y) { return jnp::not_equal(x, y); }
Array operator<(const Array& x, const Array& y) { return jnp::less(x, y); }
Array operator<=(const Array& x, const Array& y) { return jnp::less_equal(x, y); }
Array operator>(const Array& x, const Array& y) { return jnp::greater(x, y); }
Array operator>=(const Array& x, const Array& y) { return jnp::greater_equal(x, y); }
Array operator&(const Array& x, const Array& y) { return jnp::bitwise_and(x, y); }
Array operator|(const Array& x, const Array& y) { return jnp::bitwise_or(x, y); }
Array operator^(const Array& x, const Array& y) { return jnp::bitwise_xor(x, y); }
Array operator~(const Array& x) { return jnp::invert(x); }
// In-place forms rebind the handle to a new array (arrays are immutable, as in JAX).
Array& operator+=(Array& x, const Array& y) { return x = jnp::add(x, y); }
Array& operator-=(Array& x, const Array& y) { return x = jnp::subtract(x, y); }
Array& operator*=(Array& x, const Array& y) { return x = jnp::multiply(x, y); }
Array& operator/=(Array& x, const Array& y) { return x = jnp::true_divide(x, y); }

}  // namespace cjax
