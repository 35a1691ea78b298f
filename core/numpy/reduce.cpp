// numpy reductions (jnp.sum, mean, var, max, argmax, logsumexp, cumsum, sort, argsort, ...) and
// jnp.linalg.norm, composed from lax primitives as jax.numpy does, so they trace and differentiate.
//
// dtype rules (JAX's, default 32-bit mode):
//  * sum/prod: bool and integers narrower than 32 bits promote to int32 (unsigned: uint32); a
//    `dtype` argument converts the input first; a bool result reduces with or (sum) / and (prod).
//  * mean/var/std/logsumexp/norm: integer and bool inputs compute in float32.
//  * cumsum/cumprod: keep the input dtype, except bool, which accumulates in int32.
//  * Results are strongly typed (a weak C++ scalar input gives a strong result).
// max/min of an empty reduction raise numpy's ValueError ("zero-size array to reduction operation
// max which has no identity"); argmax/argmin of an empty axis raise ValueError too.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "cjax/lax.h"
#include "cjax/numpy.h"
#include "core/array/array_impl.h"
#include "core/array/util.h"

namespace cjax::numpy {
namespace {

std::string axes_text(const std::vector<int64_t>& a) {
  if (a.size() == 1) return fmt::format("({},)", a[0]);
  return fmt::format("({})", fmt::join(a, ", "));
}

// Canonical, sorted axes of `axis` for an array of rank ndim (None: all axes).
std::vector<int64_t> reduction_axes(const Array& x, const Axis& axis, std::string_view fn) {
  std::vector<int64_t> a;
  if (axis.is_none()) {
    a.resize(size_t(x.ndim()));
    std::iota(a.begin(), a.end(), int64_t(0));
    return a;
  }
  a = canonicalize_axes(axis.axes(), x.ndim(), fn);
  std::sort(a.begin(), a.end());
  return a;
}

int64_t reduced_count(const Array& x, const std::vector<int64_t>& axes) {
  int64_t n = 1;
  for (int64_t a : axes) n *= x.shape()[size_t(a)];
  return n;
}

Array keep(const Array& r, const std::vector<int64_t>& axes, bool keepdims) {
  if (!keepdims || axes.empty()) return r;
  return lax::expand_dims(r, axes);
}

// Broadcasts a keepdims-shaped reduction result back to x's shape.
Array bcast_back(const Array& r_keep, const Shape& shape) {
  if (r_keep.shape() == shape) return r_keep;
  std::vector<int64_t> dims(shape.size());
  std::iota(dims.begin(), dims.end(), int64_t(0));
  // size-1 dims of r_keep broadcast: broadcast_in_dim needs operand dim == 1 or equal, which holds.
  return lax::broadcast_in_dim(r_keep, shape, dims);
}

DType sum_dtype(DType d) {
  switch (d) {
    case DType::bool_:
    case DType::int8:
    case DType::int16: return DType::int32;
    case DType::uint8: return DType::uint32;
    default: return d;
  }
}
DType inexact_dtype(DType d) { return is_floating(d) ? d : DType::float32; }
DType compute_dtype(DType d) { return d == DType::bfloat16 || d == DType::float16 ? DType::float32 : d; }

Array scalar_of(double v, DType d) { return make_scalar(v, d, false); }

void require_identity_free(const Array& x, const std::vector<int64_t>& axes, std::string_view name) {
  for (int64_t a : axes)
    if (x.shape()[size_t(a)] == 0)
      throw ValueError(
          fmt::format("zero-size array to reduction operation {} which has no identity "
                      "(jnp.{} of an array of shape {} over axes {}: axis {} has size 0); reduce a "
                      "non-empty array, or use a reduction with an identity such as sum",
                      name, name, shape_str(x.shape()), axes_text(axes), a));
}

Array sum_impl(const Array& x, const Axis& axis, bool keepdims, std::optional<DType> dtype, bool is_prod) {
  std::string_view fn = is_prod ? "jnp.prod" : "jnp.sum";
  std::vector<int64_t> axes = reduction_axes(x, axis, fn);
  DType rt = dtype ? *dtype : sum_dtype(x.dtype());
  Array r;
  if (rt == DType::bool_) {
    Array a = convert_to(x, DType::bool_, false);
    r = is_prod ? lax::reduce_and(a, axes) : lax::reduce_or(a, axes);
  } else {
    Array a = convert_to(x, rt, false);
    r = is_prod ? lax::reduce_prod(a, axes) : lax::reduce_sum(a, axes);
  }
  return keep(r, axes, keepdims);
}

Array minmax_impl(const Array& x, const Axis& axis, bool keepdims, bool is_max) {
  std::string_view name = is_max ? "max" : "min";
  std::vector<int64_t> axes = reduction_axes(x, axis, is_max ? "jnp.max" : "jnp.min");
  require_identity_free(x, axes, name);
  Array a = convert_to(x, x.dtype(), false);
  Array r = is_max ? lax::reduce_max(a, axes) : lax::reduce_min(a, axes);
  return keep(r, axes, keepdims);
}

Array arg_impl(const Array& x, std::optional<int64_t> axis, bool keepdims, bool is_max) {
  std::string_view name = is_max ? "argmax" : "argmin";
  std::string fn = fmt::format("jnp.{}", name);
  Array a = x;
  int64_t ax = 0;
  if (!axis)
    a = lax::reshape(x, Shape{x.size()});
  else
    ax = canonicalize_axis(*axis, x.ndim(), fn);
  if (a.shape()[size_t(ax)] == 0)
    throw ValueError(
        fmt::format("attempt to get {} of an empty sequence ({} of an array of shape {}{}); the "
                    "reduced axis must be non-empty",
                    name, fn, shape_str(x.shape()), axis ? fmt::format(" along axis {}", *axis) : ""));
  Array r = is_max ? lax::argmax(a, ax, DType::int32) : lax::argmin(a, ax, DType::int32);
  if (!keepdims) return r;
  if (!axis) return lax::reshape(r, Shape(size_t(x.ndim()), 1));
  return lax::expand_dims(r, {ax});
}

Array cum_impl(const Array& x, std::optional<int64_t> axis, std::optional<DType> dtype, bool is_prod) {
  std::string fn = is_prod ? "jnp.cumprod" : "jnp.cumsum";
  Array a = x;
  int64_t ax = 0;
  if (!axis)
    a = lax::reshape(x, Shape{x.size()});
  else
    ax = canonicalize_axis(*axis, x.ndim(), fn);
  DType rt = dtype ? *dtype : x.dtype();
  DType ct = rt == DType::bool_ ? DType::int32 : rt;  // bools accumulate in int32 (JAX)
  a = convert_to(a, ct, false);
  Array r = is_prod ? lax::cumprod(a, ax) : lax::cumsum(a, ax);
  if (rt == DType::bool_ && dtype) r = convert_to(r, DType::bool_, false);
  return r;
}

// sum(x * x) over axes in an inexact dtype, for var and norms.
Array sum_sq(const Array& a, const std::vector<int64_t>& axes) { return lax::reduce_sum(lax::mul(a, a), axes); }

}  // namespace

Array sum(const Array& x, Axis axis, bool keepdims, std::optional<DType> dtype) {
  return sum_impl(x, axis, keepdims, dtype, false);
}
Array prod(const Array& x, Axis axis, bool keepdims, std::optional<DType> dtype) {
  return sum_impl(x, axis, keepdims, dtype, true);
}

Array mean(const Array& x, Axis axis, bool keepdims, std::optional<DType> dtype) {
  std::vector<int64_t> axes = reduction_axes(x, axis, "jnp.mean");
  DType rt = dtype ? *dtype : inexact_dtype(x.dtype());
  DType ct = compute_dtype(rt == DType::bool_ ? DType::float32 : rt);
  int64_t n = reduced_count(x, axes);
  Array s = lax::reduce_sum(convert_to(x, ct, false), axes);
  if (is_integer(ct) && n == 0)
    throw ValueError(
        fmt::format("jnp.mean: integer dtype {} over an empty reduction (shape {}, axes {}) divides "
                    "by zero; use a floating dtype",
                    dtype_name(ct), shape_str(x.shape()), axes_text(axes)));
  Array r = lax::div(s, scalar_of(double(n), ct));
  return keep(convert_to(r, rt, false), axes, keepdims);
}

Array var(const Array& x, Axis axis, int64_t ddof, bool keepdims) {
  std::vector<int64_t> axes = reduction_axes(x, axis, "jnp.var");
  DType rt = inexact_dtype(x.dtype()), ct = compute_dtype(rt);
  int64_t n = reduced_count(x, axes);
  Array a = convert_to(x, ct, false);
  Array m = lax::div(lax::reduce_sum(a, axes), scalar_of(double(n), ct));
  Array centered = lax::sub(a, bcast_back(keep(m, axes, true), a.shape()));
  Array s = sum_sq(centered, axes);
  // numpy divides by max(n - ddof, 0): inf / nan when ddof >= n.
  Array r = lax::div(s, scalar_of(double(std::max<int64_t>(n - ddof, 0)), ct));
  return keep(convert_to(r, rt, false), axes, keepdims);
}

Array std(const Array& x, Axis axis, int64_t ddof, bool keepdims) {
  Array v = var(x, axis, ddof, keepdims);
  if (v.dtype() == DType::bfloat16 || v.dtype() == DType::float16)
    return convert_to(lax::sqrt(convert_to(v, DType::float32, false)), v.dtype(), false);
  return lax::sqrt(v);
}

Array max(const Array& x, Axis axis, bool keepdims) { return minmax_impl(x, axis, keepdims, true); }
Array min(const Array& x, Axis axis, bool keepdims) { return minmax_impl(x, axis, keepdims, false); }
Array amax(const Array& x, Axis axis, bool keepdims) { return minmax_impl(x, axis, keepdims, true); }
Array amin(const Array& x, Axis axis, bool keepdims) { return minmax_impl(x, axis, keepdims, false); }

Array any(const Array& x, Axis axis, bool keepdims) {
  std::vector<int64_t> axes = reduction_axes(x, axis, "jnp.any");
  return keep(lax::reduce_or(convert_to(x, DType::bool_, false), axes), axes, keepdims);
}
Array all(const Array& x, Axis axis, bool keepdims) {
  std::vector<int64_t> axes = reduction_axes(x, axis, "jnp.all");
  return keep(lax::reduce_and(convert_to(x, DType::bool_, false), axes), axes, keepdims);
}

Array argmax(const Array& x, std::optional<int64_t> axis, bool keepdims) { return arg_impl(x, axis, keepdims, true); }
Array argmin(const Array& x, std::optional<int64_t> axis, bool keepdims) { return arg_impl(x, axis, keepdims, false); }

Array logsumexp(const Array& x, Axis axis, bool keepdims) {
  std::vector<int64_t> axes = reduction_axes(x, axis, "jnp.logsumexp");
  Array a = convert_to(x, inexact_dtype(x.dtype()), false);
  // Shift by the (finite) max: exp never overflows; rows of -inf give -inf, +inf gives +inf.
  Array amax = lax::reduce_max(a, axes);  // identity -inf for empty reductions
  amax = lax::select(lax::is_finite(amax), amax, lax::broadcast_in_dim(scalar_of(0.0, a.dtype()), amax.shape(), {}));
  Array shifted = lax::sub(a, bcast_back(keep(amax, axes, true), a.shape()));
  Array s = lax::reduce_sum(lax::exp(shifted), axes);
  Array r = lax::add(lax::log(s), amax);
  return keep(r, axes, keepdims);
}

Array cumsum(const Array& x, std::optional<int64_t> axis, std::optional<DType> dtype) {
  return cum_impl(x, axis, dtype, false);
}
Array cumprod(const Array& x, std::optional<int64_t> axis, std::optional<DType> dtype) {
  return cum_impl(x, axis, dtype, true);
}

Array count_nonzero(const Array& x, Axis axis, bool keepdims) {
  Array nz = lax::ne(x, scalar_of(0.0, x.dtype()));
  return sum(nz, axis, keepdims, DType::int32);
}

Array sort(const Array& x, std::optional<int64_t> axis) {
  if (!axis) return lax::sort(lax::reshape(x, Shape{x.size()}), 0, true);
  int64_t ax = canonicalize_axis(*axis, x.ndim(), "jnp.sort");
  return lax::sort(x, ax, true);
}

Array argsort(const Array& x, std::optional<int64_t> axis) {
  Array a = x;
  int64_t ax = 0;
  if (!axis)
    a = lax::reshape(x, Shape{x.size()});
  else
    ax = canonicalize_axis(*axis, x.ndim(), "jnp.argsort");
  Array idx = lax::broadcasted_iota(DType::int32, a.shape(), ax);
  return lax::sort(std::vector<Array>{a, idx}, ax, true, 1)[1];
}

namespace linalg {
namespace {
Array vector_norm(const Array& a, double ord, const std::vector<int64_t>& axes) {
  if (std::isinf(ord)) {
    Array m = ord > 0 ? lax::reduce_max(lax::abs(a), axes) : lax::reduce_min(lax::abs(a), axes);
    return m;
  }
  if (ord == 0) return lax::reduce_sum(convert_to(lax::ne(a, scalar_of(0.0, a.dtype())), a.dtype(), false), axes);
  if (ord == 1) return lax::reduce_sum(lax::abs(a), axes);
  if (ord == 2) return lax::sqrt(sum_sq(a, axes));
  Array p = scalar_of(ord, a.dtype());
  Array s = lax::reduce_sum(lax::pow(lax::abs(a), p), axes);
  return lax::pow(s, scalar_of(1.0 / ord, a.dtype()));
}
}  // namespace

Array norm(const Array& x, std::optional<double> ord, Axis axis, bool keepdims) {
  DType rt = inexact_dtype(x.dtype());
  Array a = convert_to(x, rt, false);
  std::vector<int64_t> axes = reduction_axes(x, axis, "jnp.linalg.norm");
  if (axis.is_none()) {
    if (!ord) {  // 2-norm of the flattened array (Frobenius for matrices)
      Array r = lax::sqrt(sum_sq(a, axes));
      return keep(r, axes, keepdims);
    }
    if (x.ndim() != 1 && x.ndim() != 2)
      throw ValueError(
          fmt::format("jnp.linalg.norm: with ord={} and axis=None the array must be 1-D or 2-D, got "
                      "shape {}; pass axis explicitly",
                      *ord, shape_str(x.shape())));
  }
  if (axes.size() == 1) {
    double o = ord ? *ord : 2.0;
    if (std::isinf(o) && x.shape()[size_t(axes[0])] == 0)
      throw ValueError(
          fmt::format("zero-size array to reduction operation {} which has no identity "
                      "(jnp.linalg.norm with ord={} of shape {} along axis {})",
                      o > 0 ? "max" : "min", o, shape_str(x.shape()), axes[0]));
    return keep(vector_norm(a, o, axes), axes, keepdims);
  }
  if (axes.size() == 2) {
    int64_t row = axes[0], col = axes[1];
    if (axis.is_none() == false) {  // keep the user's order: norm(x, 1, {1, 0}) swaps roles
      auto c = canonicalize_axes(axis.axes(), x.ndim(), "jnp.linalg.norm");
      row = c[0];
      col = c[1];
    }
    if (!ord) return keep(lax::sqrt(sum_sq(a, axes)), axes, keepdims);
    double o = *ord;
    if (o == 1 || o == -1 || std::isinf(o)) {
      // ord=+-1: max/min over columns of the column sums; ord=+-inf: over rows of the row sums.
      int64_t sum_axis = std::isinf(o) ? col : row, pick_axis = std::isinf(o) ? row : col;
      for (int64_t ax : axes)
        if (x.shape()[size_t(ax)] == 0)
          throw ValueError(
              fmt::format("zero-size array to reduction operation {} which has no identity "
                          "(jnp.linalg.norm with ord={} of a matrix of shape {})",
                          o > 0 ? "max" : "min", o, shape_str(x.shape())));
      Array s = lax::reduce_sum(lax::abs(a), {sum_axis});
      int64_t p = pick_axis > sum_axis ? pick_axis - 1 : pick_axis;
      Array r = o > 0 ? lax::reduce_max(s, {p}) : lax::reduce_min(s, {p});
      return keep(r, axes, keepdims);
    }
    throw ValueError(
        fmt::format("jnp.linalg.norm: matrix norm ord={} is not supported (supported: None/Frobenius, "
                    "1, -1, inf, -inf; ord=2/-2 need singular values: use jnp.linalg.svd)",
                    o));
  }
  throw ValueError(
      fmt::format("jnp.linalg.norm: axis must name 1 axis (vector norm) or 2 axes (matrix norm), got {} "
                  "axes {} for an array of shape {}",
                  axes.size(), axes_text(axes), shape_str(x.shape())));
}
}  // namespace linalg

}  // namespace cjax::numpy
