// numpy creation functions: zeros, ones, full, arange, linspace, eye, ... Constants are filled on
// the host (a concrete array is a constant under every trace); arange(stop) and iota lower to
// lax::iota as in JAX.
#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "cjax/lax.h"
#include "cjax/numpy.h"
#include "core/array/array_impl.h"
#include "core/array/util.h"
#include "core/array/visit_dtype.h"
#include "core/backend/parallel.h"

namespace cjax::numpy {
namespace {

void check_shape(std::string_view fn, const Shape& shape) {
  for (int64_t d : shape)
    if (d < 0)
      throw ValueError(
          fmt::format("{}: negative dimension {} in shape {}; dimensions must be >= 0", fn, d, shape_str(shape)));
}

// An array of `shape` with every element equal to the bytes of `elem`.
Array fill_bytes(const Shape& shape, DType d, bool weak, const void* elem) {
  Array out = make_uninitialized(AbstractValue{shape, d, weak, {}}, host_device());
  int64_t n = out.size();
  size_t sz = itemsize(d);
  auto* p = static_cast<unsigned char*>(raw_ptr(out));
  bool zero = true;
  for (size_t i = 0; i < sz; ++i) zero &= static_cast<const unsigned char*>(elem)[i] == 0;
  if (zero) {
    if (n) std::memset(p, 0, size_t(n) * sz);
    return on_default_device(out);
  }
  parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) std::memcpy(p + size_t(i) * sz, elem, sz);
  });
  return on_default_device(out);
}

template <class V>
Array fill_value(const Shape& shape, DType d, V v) {
  return visit_dtype(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T e;
    if constexpr (is_half_v<T>)
      e = T(float(v));
    else if constexpr (std::is_same_v<T, bool>)
      e = v != V(0);
    else
      e = T(v);
    return fill_bytes(shape, d, false, &e);
  });
}

// Fills a 1-D array of n elements with f(i) converted to dtype d.
template <class F>
Array fill_1d(int64_t n, DType d, F&& f) {
  Array out = make_uninitialized(AbstractValue{{n}, d, false, {}}, host_device());
  visit_dtype(d, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = data_ptr<T>(out);
    for (int64_t i = 0; i < n; ++i) {
      auto v = f(i);
      if constexpr (is_half_v<T>)
        p[i] = T(float(v));
      else if constexpr (std::is_same_v<T, bool>)
        p[i] = v != decltype(v)(0);
      else
        p[i] = T(v);
    }
  });
  return on_default_device(out);
}

}  // namespace

Array asarray(const Array& x, std::optional<DType> dtype) {
  DType d = dtype.value_or(x.dtype());
  if (x.dtype() == d && !x.weak_type()) return x;
  return convert_to(x, d, false);
}

Array zeros(const Shape& shape, DType dtype) {
  check_shape("zeros", shape);
  return fill_value(shape, dtype, 0);
}
Array ones(const Shape& shape, DType dtype) {
  check_shape("ones", shape);
  return fill_value(shape, dtype, 1);
}
Array empty(const Shape& shape, DType dtype) {
  check_shape("empty", shape);
  return fill_value(shape, dtype, 0);
}

namespace {
// full / full_like: `fill` converted to (d, weak), broadcast to `shape`.
Array full_impl(std::string_view fn, const Shape& shape, const Array& fill, DType d, bool weak) {
  check_shape(fn, shape);
  Array v = convert_to(fill, d, weak);
  if (v.ndim() == 0 && concrete(v)) return fill_bytes(shape, d, weak, raw_ptr(v));
  if (v.ndim() > int(shape.size()))
    throw ShapeError(fmt::format("{}: fill value of shape {} cannot be broadcast to shape {}", fn, shape_str(v.shape()),
                                 shape_str(shape)));
  size_t off = shape.size() - size_t(v.ndim());
  std::vector<int64_t> dims(size_t(v.ndim()));
  for (size_t i = 0; i < dims.size(); ++i) {
    int64_t d = v.shape()[i];
    if (d != 1 && d != shape[off + i])
      throw ShapeError(fmt::format("{}: fill value of shape {} cannot be broadcast to shape {}", fn,
                                   shape_str(v.shape()), shape_str(shape)));
    dims[i] = int64_t(off + i);
  }
  return lax::broadcast_in_dim(v, shape, dims);
}
}  // namespace

Array full(const Shape& shape, const Array& fill_value, std::optional<DType> dtype) {
  return full_impl("full", shape, fill_value, dtype.value_or(fill_value.dtype()), !dtype && fill_value.weak_type());
}
Array zeros_like(const Array& x, std::optional<DType> dtype) {
  DType d = dtype.value_or(x.dtype());
  bool weak = !dtype && x.weak_type();
  return full_impl("zeros_like", x.shape(), Array(0), d, weak);
}
Array ones_like(const Array& x, std::optional<DType> dtype) {
  DType d = dtype.value_or(x.dtype());
  bool weak = !dtype && x.weak_type();
  return full_impl("ones_like", x.shape(), Array(1), d, weak);
}
Array full_like(const Array& x, const Array& fill_value, std::optional<DType> dtype) {
  DType d = dtype.value_or(x.dtype());
  bool weak = !dtype && x.weak_type();
  return full_impl("full_like", x.shape(), fill_value, d, weak);
}

Array iota(DType dtype, int64_t size) {
  if (size < 0) throw ValueError(fmt::format("iota: size must be >= 0, got {}", size));
  return lax::iota(dtype, size);
}

Array arange(int64_t stop, DType dtype) {
  // JAX: arange(stop) is lax.iota(dtype, stop); a negative stop gives an empty array.
  return lax::iota(dtype, std::max<int64_t>(stop, 0));
}

Array arange(int64_t start, int64_t stop, int64_t step, DType dtype) {
  if (step == 0)
    throw ValueError(
        fmt::format("arange: step must not be zero (start={}, stop={}); use a positive step to count "
                    "up or a negative one to count down",
                    start, stop));
  // numpy length: ceil((stop - start) / step), at least 0 (exact integer arithmetic).
  __int128 span = __int128(stop) - start;
  __int128 n = step > 0 ? (span + step - 1) / step : (span + step + 1) / step;
  if (n < 0) n = 0;
  return fill_1d(int64_t(n), dtype, [&](int64_t i) { return int64_t(start + i * step); });
}

Array arange(int start, int stop, int step, DType dtype) {
  return arange(int64_t(start), int64_t(stop), int64_t(step), dtype);
}

Array arange(double start, double stop, double step, DType dtype) {
  if (step == 0)
    throw ValueError(
        fmt::format("arange: step must not be zero (start={}, stop={}); use a positive step to count "
                    "up or a negative one to count down",
                    start, stop));
  if (!std::isfinite(start) || !std::isfinite(stop) || !std::isfinite(step))
    throw ValueError(fmt::format("arange: start, stop and step must be finite, got ({}, {}, {})", start, stop, step));
  double len = std::ceil((stop - start) / step);
  int64_t n = len > 0 ? int64_t(len) : 0;
  // numpy fills value i as buffer[0] + i * (buffer[1] - buffer[0]) in the target type.
  if (dtype == DType::float64) {
    double b0 = start, delta = (start + step) - start;
    return fill_1d(n, dtype, [&](int64_t i) { return i == 0 ? b0 : i == 1 ? start + step : b0 + double(i) * delta; });
  }
  if (is_floating(dtype)) {
    float b0 = float(start), b1 = float(start + step), delta = b1 - b0;
    return fill_1d(n, dtype, [&](int64_t i) { return i == 0 ? b0 : i == 1 ? b1 : b0 + float(i) * delta; });
  }
  return fill_1d(n, dtype, [&](int64_t i) { return start + double(i) * step; });
}

Array linspace(double start, double stop, int64_t num, bool endpoint, DType dtype) {
  if (num < 0) throw ValueError(fmt::format("linspace: number of samples num={} must be non-negative", num));
  // JAX's formula in the computation dtype (the dtype itself for floats, float32 for integers and
  // bool), each operation rounded to it: step_i = i / div, out_i = start * (1 - step_i) + stop * step_i,
  // the endpoint exactly `stop`; integer results are floored.
  int64_t div = endpoint ? num - 1 : num;
  DType cd = is_floating(dtype) ? dtype : DType::float32;
  bool ints = !is_floating(dtype);
  auto fill = [&](auto zero) {
    using C = decltype(zero);  // float, or double for float64
    auto r = [cd](C v) -> C {
      if (cd == DType::bfloat16) return C(float(bfloat16_t(float(v))));
      if (cd == DType::float16) return C(float(float16_t(float(v))));
      return v;
    };
    C s = r(C(start)), e = r(C(stop)), dv = r(C(div));
    return fill_1d(num, dtype, [&](int64_t i) -> C {
      C v;
      if (num == 1)
        v = s;
      else if (endpoint && i == num - 1)
        v = e;
      else {
        C step = r(r(C(i)) / dv);
        v = r(r(s * r(C(1) - step)) + r(e * step));
      }
      return ints ? std::floor(v) : v;
    });
  };
  return dtype == DType::float64 ? fill(0.0) : fill(0.0f);
}

Array eye(int64_t n, std::optional<int64_t> m, int64_t k, DType dtype) {
  int64_t cols = m.value_or(n);
  if (n < 0 || cols < 0) throw ValueError(fmt::format("eye: N={} and M={} must be non-negative", n, cols));
  Array out = fill_value(Shape{n, cols}, dtype, 0);
  visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T one;
    if constexpr (is_half_v<T>)
      one = T(1.0f);
    else
      one = T(1);
    T* p = data_ptr<T>(out);
    for (int64_t i = 0; i < n; ++i) {
      int64_t j = i + k;
      if (j >= 0 && j < cols) p[i * cols + j] = one;
    }
  });
  return out;
}

Array identity(int64_t n, DType dtype) {
  if (n < 0) throw ValueError(fmt::format("identity: n={} must be non-negative", n));
  return eye(n, std::nullopt, 0, dtype);
}

}  // namespace cjax::numpy
