// cjax::lax — thin, exact wrappers over primitives, as in jax.lax. Shapes and dtypes must already
// agree (no implicit broadcasting or promotion, except that elementwise binary ops accept rank-0
// operands of the same dtype, as JAX does); mismatches raise ShapeError / DTypeError.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cjax/array.h"

namespace cjax::lax {

// ---- elementwise (one primitive each; see core/backend/scalar_ops.h) ----
Array neg(const Array&);
Array sign(const Array&);
Array abs(const Array&);
Array floor(const Array&);
Array ceil(const Array&);
Array round(const Array&);  // half to even
Array is_finite(const Array&);
Array exp(const Array&);
Array exp2(const Array&);
Array log(const Array&);
Array log1p(const Array&);
Array expm1(const Array&);
Array tanh(const Array&);
Array logistic(const Array&);
Array sin(const Array&);
Array cos(const Array&);
Array tan(const Array&);
Array asin(const Array&);
Array acos(const Array&);
Array atan(const Array&);
Array sinh(const Array&);
Array cosh(const Array&);
Array asinh(const Array&);
Array acosh(const Array&);
Array atanh(const Array&);
Array sqrt(const Array&);
Array rsqrt(const Array&);
Array cbrt(const Array&);
Array erf(const Array&);
Array erfc(const Array&);
Array erf_inv(const Array&);
Array lgamma(const Array&);
Array bitwise_not(const Array&);
Array square(const Array&);
Array add(const Array&, const Array&);
Array sub(const Array&, const Array&);
Array mul(const Array&, const Array&);
Array div(const Array&, const Array&);  // ints: toward zero
Array rem(const Array&, const Array&);
Array pow(const Array&, const Array&);
Array max(const Array&, const Array&);
Array min(const Array&, const Array&);  // NaN-propagating
Array atan2(const Array&, const Array&);
Array nextafter(const Array&, const Array&);
Array bitwise_and(const Array&, const Array&);
Array bitwise_or(const Array&, const Array&);
Array bitwise_xor(const Array&, const Array&);
Array shift_left(const Array&, const Array&);
Array shift_right_logical(const Array&, const Array&);
Array shift_right_arithmetic(const Array&, const Array&);
Array eq(const Array&, const Array&);
Array ne(const Array&, const Array&);
Array lt(const Array&, const Array&);
Array le(const Array&, const Array&);
Array gt(const Array&, const Array&);
Array ge(const Array&, const Array&);
Array clamp(const Array& lo, const Array& x, const Array& hi);
Array integer_pow(const Array&, int y);
Array convert_element_type(const Array&, DType);
Array bitcast_convert_type(const Array&, DType);  // same item size only
// select_n(which, cases): cases[which]; `which` is bool (2 cases) or int32.
Array select_n(const Array& which, const std::vector<Array>& cases);
Array select(const Array& pred, const Array& on_true, const Array& on_false);
Array stop_gradient(const Array&);  // identity on values; blocks gradients (autodiff layer)

// ---- shape ----
Array broadcast_in_dim(const Array&, const Shape& shape, const std::vector<int64_t>& broadcast_dimensions);
Array broadcast(const Array&, const Shape& sizes);  // prepends dimensions
Array reshape(const Array&, const Shape& new_sizes);
Array transpose(const Array&, const std::vector<int64_t>& permutation);
Array squeeze(const Array&, const std::vector<int64_t>& dimensions);
Array expand_dims(const Array&, const std::vector<int64_t>& dimensions);
Array rev(const Array&, const std::vector<int64_t>& dimensions);
Array concatenate(const std::vector<Array>&, int64_t dimension);
struct PadConfig {
  int64_t lo = 0, hi = 0, interior = 0;
};  // negative lo/hi crop
Array pad(const Array&, const Array& padding_value, const std::vector<PadConfig>& config);
Array iota(DType, int64_t size);
Array broadcasted_iota(DType, const Shape& shape, int64_t dimension);

// ---- slicing and indexing ----
Array slice(const Array&, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
            const std::vector<int64_t>& strides = {});
Array slice_in_dim(const Array&, int64_t start, int64_t limit, int64_t stride = 1, int64_t axis = 0);
// Start indices are clamped so the slice stays in bounds (XLA semantics).
Array dynamic_slice(const Array&, const std::vector<Array>& start_indices, const std::vector<int64_t>& sizes);
Array dynamic_slice_in_dim(const Array&, const Array& start, int64_t size, int64_t axis = 0);
Array dynamic_update_slice(const Array&, const Array& update, const std::vector<Array>& start_indices);
Array dynamic_update_slice_in_dim(const Array&, const Array& update, const Array& start, int64_t axis);
Array dynamic_index_in_dim(const Array&, const Array& index, int64_t axis = 0, bool keepdims = true);

enum class GatherScatterMode { clip, fill_or_drop, promise_in_bounds };
struct GatherDimensionNumbers {
  std::vector<int64_t> offset_dims, collapsed_slice_dims, start_index_map;
  std::vector<int64_t> operand_batching_dims, start_indices_batching_dims;
};
// XLA/JAX gather; indices' last dimension is the index vector.
Array gather(const Array& operand, const Array& start_indices, const GatherDimensionNumbers& dimension_numbers,
             const std::vector<int64_t>& slice_sizes, GatherScatterMode mode = GatherScatterMode::fill_or_drop,
             std::optional<double> fill_value = std::nullopt);
struct ScatterDimensionNumbers {
  std::vector<int64_t> update_window_dims, inserted_window_dims, scatter_dims_to_operand_dims;
  std::vector<int64_t> operand_batching_dims, scatter_indices_batching_dims;
};
Array scatter_add(const Array& operand, const Array& scatter_indices, const Array& updates,
                  const ScatterDimensionNumbers& dimension_numbers,
                  GatherScatterMode mode = GatherScatterMode::fill_or_drop);
Array scatter(const Array& operand, const Array& scatter_indices, const Array& updates,
              const ScatterDimensionNumbers& dimension_numbers,
              GatherScatterMode mode = GatherScatterMode::fill_or_drop);  // overwrite
Array scatter_mul(const Array& operand, const Array& scatter_indices, const Array& updates,
                  const ScatterDimensionNumbers& dimension_numbers,
                  GatherScatterMode mode = GatherScatterMode::fill_or_drop);
Array scatter_min(const Array& operand, const Array& scatter_indices, const Array& updates,
                  const ScatterDimensionNumbers& dimension_numbers,
                  GatherScatterMode mode = GatherScatterMode::fill_or_drop);
Array scatter_max(const Array& operand, const Array& scatter_indices, const Array& updates,
                  const ScatterDimensionNumbers& dimension_numbers,
                  GatherScatterMode mode = GatherScatterMode::fill_or_drop);

// ---- reductions ----
Array reduce_sum(const Array&, const std::vector<int64_t>& axes);
Array reduce_max(const Array&, const std::vector<int64_t>& axes);
Array reduce_min(const Array&, const std::vector<int64_t>& axes);
Array reduce_prod(const Array&, const std::vector<int64_t>& axes);
Array reduce_and(const Array&, const std::vector<int64_t>& axes);
Array reduce_or(const Array&, const std::vector<int64_t>& axes);
Array argmax(const Array&, int64_t axis, DType index_dtype = DType::int32);
Array argmin(const Array&, int64_t axis, DType index_dtype = DType::int32);
Array cumsum(const Array&, int64_t axis = 0, bool reverse = false);
Array cumprod(const Array&, int64_t axis = 0, bool reverse = false);
Array cummax(const Array&, int64_t axis = 0, bool reverse = false);
Array cummin(const Array&, int64_t axis = 0, bool reverse = false);
Array cumlogsumexp(const Array&, int64_t axis = 0, bool reverse = false);
// Sorts all operands along `dimension` by the first `num_keys` operands (lexicographic; NaNs last).
std::vector<Array> sort(const std::vector<Array>& operands, int64_t dimension = -1, bool is_stable = true,
                        int num_keys = 1);
Array sort(const Array&, int64_t dimension = -1, bool is_stable = true);
std::pair<Array, Array> top_k(const Array&, int64_t k);

// ---- linear algebra ----
struct DotDimensionNumbers {
  std::pair<std::vector<int64_t>, std::vector<int64_t>> contracting;  // (lhs, rhs)
  std::pair<std::vector<int64_t>, std::vector<int64_t>> batch;        // (lhs, rhs)
};
// Output dims: batch, lhs free, rhs free. Accumulates in f32 for bf16/f16 (f64 for f64) and
// returns preferred_element_type if given, else the input dtype.
Array dot_general(const Array& lhs, const Array& rhs, const DotDimensionNumbers& dimension_numbers,
                  std::optional<DType> preferred_element_type = std::nullopt);
struct ConvDimensionNumbers {
  std::string lhs_spec = "NCHW", rhs_spec = "OIHW", out_spec = "NCHW";  // any permutation, 1-3 spatial dims
};
struct Padding {
  std::string mode;                                    // "SAME", "VALID", or empty for explicit
  std::vector<std::pair<int64_t, int64_t>> explicit_;  // per spatial dim
  Padding(const char* m) : mode(m) {}
  Padding(std::string m) : mode(std::move(m)) {}
  Padding(std::vector<std::pair<int64_t, int64_t>> p) : explicit_(std::move(p)) {}
};
Array conv_general_dilated(const Array& lhs, const Array& rhs, const std::vector<int64_t>& window_strides,
                           const Padding& padding, const std::vector<int64_t>& lhs_dilation = {},
                           const std::vector<int64_t>& rhs_dilation = {}, const ConvDimensionNumbers& dn = {},
                           int64_t feature_group_count = 1, std::optional<DType> preferred_element_type = std::nullopt);
Array conv(const Array& lhs, const Array& rhs, const std::vector<int64_t>& window_strides, const Padding& padding);

// ---- random bits ----
// The threefry2x32 block function on u32 arrays of one shape (docs/prng.md §1): returns (y0, y1).
std::pair<Array, Array> threefry2x32(const Array& k0, const Array& k1, const Array& x0, const Array& x1);

}  // namespace cjax::lax
