// cjax::numpy (alias jnp) — numpy semantics: broadcasting, JAX type promotion (weak C++ scalars),
// negative axes. Every function is a composition of lax primitives, so it traces and
// differentiates.
#pragma once
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cjax/array.h"

namespace cjax::numpy {

// An axis argument: None (all axes), one int, or a list of ints. Negative values count from the end.
class Axis {
 public:
  Axis() = default;
  Axis(NoneT) {}
  Axis(int a) : axes_(std::vector<int64_t>{a}) {}
  Axis(int64_t a) : axes_(std::vector<int64_t>{a}) {}
  Axis(std::initializer_list<int64_t> a) : axes_(std::vector<int64_t>(a)) {}
  Axis(std::vector<int64_t> a) : axes_(std::move(a)) {}
  bool is_none() const { return !axes_.has_value(); }
  const std::vector<int64_t>& axes() const { return *axes_; }

 private:
  std::optional<std::vector<int64_t>> axes_;
};

// ---- creation ----
template <class T>
Array array(const std::vector<T>& data, Shape shape = {});  // shape {} = 1-D
template <class T>
Array array(std::initializer_list<T> data, Shape shape = {}) {
  return array(std::vector<T>(data), std::move(shape));
}
Array asarray(const Array& x, std::optional<DType> dtype = std::nullopt);  // strong copy of the type
Array zeros(const Shape& shape, DType dtype = DType::float32);
Array ones(const Shape& shape, DType dtype = DType::float32);
Array full(const Shape& shape, const Array& fill_value, std::optional<DType> dtype = std::nullopt);
Array empty(const Shape& shape, DType dtype = DType::float32);  // zero-filled (deterministic)
Array zeros_like(const Array&, std::optional<DType> dtype = std::nullopt);
Array ones_like(const Array&, std::optional<DType> dtype = std::nullopt);
Array full_like(const Array&, const Array& fill_value, std::optional<DType> dtype = std::nullopt);
Array arange(int64_t stop, DType dtype = DType::int32);
Array arange(int64_t start, int64_t stop, int64_t step = 1, DType dtype = DType::int32);
// Plain int literals (arange(0, 10, 2)) would be ambiguous between the int64_t and double forms.
Array arange(int start, int stop, int step = 1, DType dtype = DType::int32);
Array arange(double start, double stop, double step, DType dtype = DType::float32);
Array linspace(double start, double stop, int64_t num = 50, bool endpoint = true, DType dtype = DType::float32);
Array eye(int64_t n, std::optional<int64_t> m = std::nullopt, int64_t k = 0, DType dtype = DType::float32);
Array identity(int64_t n, DType dtype = DType::float32);
Array iota(DType dtype, int64_t size);
Array tri(int64_t n, std::optional<int64_t> m = std::nullopt, int64_t k = 0, DType dtype = DType::float32);
Array tril(const Array&, int64_t k = 0);
Array triu(const Array&, int64_t k = 0);

// ---- type queries ----
TypeInfo result_type(const std::vector<Array>& arrays);

// ---- elementwise ----
Array add(const Array&, const Array&);
Array subtract(const Array&, const Array&);
Array multiply(const Array&, const Array&);
Array divide(const Array&, const Array&);  // true division
Array true_divide(const Array&, const Array&);
Array floor_divide(const Array&, const Array&);
Array remainder(const Array&, const Array&);
Array mod(const Array&, const Array&);    // sign of divisor
Array fmod(const Array&, const Array&);   // sign of dividend
Array power(const Array&, const Array&);  // integer exponents of integer arrays stay integer
Array negative(const Array&);
Array positive(const Array&);
Array abs(const Array&);
Array absolute(const Array&);
Array sign(const Array&);
Array reciprocal(const Array&);
Array exp(const Array&);
Array exp2(const Array&);
Array expm1(const Array&);
Array log(const Array&);
Array log2(const Array&);
Array log10(const Array&);
Array log1p(const Array&);
Array sqrt(const Array&);
Array rsqrt(const Array&);
Array cbrt(const Array&);
Array square(const Array&);
Array sin(const Array&);
Array cos(const Array&);
Array tan(const Array&);
Array arcsin(const Array&);
Array arccos(const Array&);
Array arctan(const Array&);
Array arctan2(const Array&, const Array&);
Array sinh(const Array&);
Array cosh(const Array&);
Array tanh(const Array&);
Array arcsinh(const Array&);
Array arccosh(const Array&);
Array arctanh(const Array&);
Array floor(const Array&);
Array ceil(const Array&);
Array round(const Array&, int decimals = 0);
Array trunc(const Array&);
Array rint(const Array&);
Array clip(const Array&, std::optional<Array> min = std::nullopt, std::optional<Array> max = std::nullopt);
Array maximum(const Array&, const Array&);
Array minimum(const Array&, const Array&);
Array fmax(const Array&, const Array&);
Array fmin(const Array&, const Array&);  // NaN-ignoring
Array where(const Array& condition, const Array& x, const Array& y);
Array isnan(const Array&);
Array isinf(const Array&);
Array isfinite(const Array&);
Array isposinf(const Array&);
Array isneginf(const Array&);
Array nan_to_num(const Array&, double nan = 0.0, std::optional<double> posinf = std::nullopt,
                 std::optional<double> neginf = std::nullopt);
Array logical_and(const Array&, const Array&);
Array logical_or(const Array&, const Array&);
Array logical_xor(const Array&, const Array&);
Array logical_not(const Array&);
Array bitwise_and(const Array&, const Array&);
Array bitwise_or(const Array&, const Array&);
Array bitwise_xor(const Array&, const Array&);
Array bitwise_not(const Array&);
Array invert(const Array&);
Array left_shift(const Array&, const Array&);
Array right_shift(const Array&, const Array&);
Array equal(const Array&, const Array&);
Array not_equal(const Array&, const Array&);
Array less(const Array&, const Array&);
Array less_equal(const Array&, const Array&);
Array greater(const Array&, const Array&);
Array greater_equal(const Array&, const Array&);
Array isclose(const Array&, const Array&, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false);
bool allclose(const Array&, const Array&, double rtol = 1e-5, double atol = 1e-8, bool equal_nan = false);
bool array_equal(const Array&, const Array&);
Array heaviside(const Array&, const Array&);
Array hypot(const Array&, const Array&);
Array logaddexp(const Array&, const Array&);

// ---- reductions ----
Array sum(const Array&, Axis axis = {}, bool keepdims = false, std::optional<DType> dtype = std::nullopt);
Array prod(const Array&, Axis axis = {}, bool keepdims = false, std::optional<DType> dtype = std::nullopt);
Array mean(const Array&, Axis axis = {}, bool keepdims = false, std::optional<DType> dtype = std::nullopt);
Array var(const Array&, Axis axis = {}, int64_t ddof = 0, bool keepdims = false);
Array std(const Array&, Axis axis = {}, int64_t ddof = 0, bool keepdims = false);
Array max(const Array&, Axis axis = {}, bool keepdims = false);
Array min(const Array&, Axis axis = {}, bool keepdims = false);
Array amax(const Array&, Axis axis = {}, bool keepdims = false);
Array amin(const Array&, Axis axis = {}, bool keepdims = false);
Array any(const Array&, Axis axis = {}, bool keepdims = false);
Array all(const Array&, Axis axis = {}, bool keepdims = false);
Array argmax(const Array&, std::optional<int64_t> axis = std::nullopt, bool keepdims = false);
Array argmin(const Array&, std::optional<int64_t> axis = std::nullopt, bool keepdims = false);
Array logsumexp(const Array&, Axis axis = {}, bool keepdims = false);
Array cumsum(const Array&, std::optional<int64_t> axis = std::nullopt, std::optional<DType> dtype = std::nullopt);
Array cumprod(const Array&, std::optional<int64_t> axis = std::nullopt, std::optional<DType> dtype = std::nullopt);
Array count_nonzero(const Array&, Axis axis = {}, bool keepdims = false);
Array sort(const Array&, std::optional<int64_t> axis = -1);     // nullopt: flattened
Array argsort(const Array&, std::optional<int64_t> axis = -1);  // stable

// ---- shape manipulation ----
Array reshape(const Array&, Shape shape);  // one -1 allowed
Array ravel(const Array&);
Array transpose(const Array&, std::vector<int64_t> axes = {});  // empty: reverse
Array swapaxes(const Array&, int64_t axis1, int64_t axis2);
Array moveaxis(const Array&, std::vector<int64_t> source, std::vector<int64_t> destination);
Array moveaxis(const Array&, int64_t source, int64_t destination);
Array expand_dims(const Array&, Axis axis);
Array squeeze(const Array&, Axis axis = {});
Array broadcast_to(const Array&, const Shape& shape);
std::vector<Array> broadcast_arrays(const std::vector<Array>&);
Shape broadcast_shapes(const std::vector<Shape>&);
Array atleast_1d(const Array&);
Array atleast_2d(const Array&);
Array concatenate(const std::vector<Array>&, int64_t axis = 0);
Array stack(const std::vector<Array>&, int64_t axis = 0);
Array hstack(const std::vector<Array>&);
Array vstack(const std::vector<Array>&);
std::vector<Array> split(const Array&, int64_t sections, int64_t axis = 0);  // must divide evenly
std::vector<Array> split(const Array&, const std::vector<int64_t>& indices, int64_t axis = 0);
std::vector<Array> array_split(const Array&, int64_t sections, int64_t axis = 0);
Array tile(const Array&, const std::vector<int64_t>& reps);
Array repeat(const Array&, int64_t repeats, std::optional<int64_t> axis = std::nullopt);
// mode: "constant", "edge", "reflect", "symmetric", "wrap"
Array pad(const Array&, const std::vector<std::pair<int64_t, int64_t>>& pad_width, const std::string& mode = "constant",
          const Array& constant_values = Array(0));
Array pad(const Array&, int64_t pad_width);  // same on every side of every axis
Array flip(const Array&, Axis axis = {});
Array roll(const Array&, int64_t shift, std::optional<int64_t> axis = std::nullopt);
// mode for out-of-range indices: "fill" (NaN / int min, JAX's default for take), "clip", "wrap"
Array take(const Array&, const Array& indices, std::optional<int64_t> axis = std::nullopt,
           const std::string& mode = "fill");
Array take_along_axis(const Array&, const Array& indices, int64_t axis);
Array diagonal(const Array&, int64_t offset = 0, int64_t axis1 = 0, int64_t axis2 = 1);
Array trace(const Array&, int64_t offset = 0);

// ---- linear algebra ----
Array dot(const Array&, const Array&);
Array matmul(const Array&, const Array&);
Array vdot(const Array&, const Array&);
Array inner(const Array&, const Array&);
Array outer(const Array&, const Array&);
Array tensordot(const Array&, const Array&, int64_t axes = 2);
Array tensordot(const Array&, const Array&, const std::pair<std::vector<int64_t>, std::vector<int64_t>>& axes);
// Any subscripts ("bsd,dh->bsh", implicit output "ij,jk", "...ij,...jk->...ik", traces "ii->i"),
// lowered to dot_general + transposes (+ reduce_sum for dims used by one operand only).
Array einsum(const std::string& subscripts, const std::vector<Array>& operands);
template <class... A>
Array einsum(const std::string& subscripts, const Array& a, const A&... rest) {
  return einsum(subscripts, std::vector<Array>{a, Array(rest)...});
}

namespace linalg {
// ord: nullopt = 2-norm of the flattened vector / Frobenius for matrices; 1, 2, inf (+/-) for vectors.
Array norm(const Array&, std::optional<double> ord = std::nullopt, Axis axis = {}, bool keepdims = false);
}  // namespace linalg

}  // namespace cjax::numpy
