// numpy shape manipulation (reshape ... diagonal, trace), tri/tril/triu and the Array methods
// reshape / T. Every function is a composition of lax primitives (so it traces), following
// jax.numpy's lowering where that matters for the jaxpr.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "cjax/lax.h"
#include "cjax/numpy.h"
#include "core/array/array_impl.h"
#include "core/array/primitive.h"
#include "core/array/util.h"

namespace cjax {
namespace {
std::string tup(const std::vector<int64_t>& v) { return param_value_str(ParamValue(v)); }
std::string shapes_str(const std::vector<Shape>& shapes) {
  std::string s = "[";
  for (size_t i = 0; i < shapes.size(); ++i) s += (i ? ", " : "") + shape_str(shapes[i]);
  return s + "]";
}
}  // namespace

Array Array::reshape(Shape shape) const { return numpy::reshape(*this, std::move(shape)); }
Array Array::T() const { return numpy::transpose(*this); }

namespace numpy {

// ---- reshape / ravel / transpose ----
Array reshape(const Array& x, Shape shape) {
  int unknown = -1;
  Shape known_dims;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (unknown >= 0)
        throw ValueError(
            fmt::format("reshape: can only specify one unknown dimension (-1), got new shape {}", shape_str(shape)));
      unknown = int(i);
    } else if (shape[i] < 0) {
      throw ShapeError(fmt::format("reshape: new shape {} has a negative dimension {}; only -1 (inferred) is allowed",
                                   shape_str(shape), shape[i]));
    } else {
      known_dims.push_back(shape[i]);
    }
  }
  int64_t known = shape_size(known_dims);  // ShapeError if the product overflows
  Shape requested = shape;
  if (unknown >= 0) {
    if (known == 0 || x.size() % known != 0)
      throw ShapeError(fmt::format("cannot reshape array of shape {} (size {}) into shape {}", shape_str(x.shape()),
                                   x.size(), shape_str(requested)));
    shape[size_t(unknown)] = x.size() / known;
  }
  if (shape_size(shape) != x.size())
    throw ShapeError(fmt::format("cannot reshape array of shape {} (size {}) into shape {} (size {})",
                                 shape_str(x.shape()), x.size(), shape_str(requested), shape_size(shape)));
  return lax::reshape(x, shape);
}

Array ravel(const Array& x) { return lax::reshape(x, {x.size()}); }

Array transpose(const Array& x, std::vector<int64_t> axes) {
  if (axes.empty()) {
    axes.resize(size_t(x.ndim()));
    std::iota(axes.rbegin(), axes.rend(), 0);
  } else if (int(axes.size()) != x.ndim()) {
    throw ShapeError(fmt::format("transpose: axes {} don't match array of shape {}; give a permutation of all {} axes",
                                 tup(axes), shape_str(x.shape()), x.ndim()));
  }
  return lax::transpose(x, canonicalize_axes(axes, x.ndim(), "transpose"));
}

Array swapaxes(const Array& x, int64_t axis1, int64_t axis2) {
  int64_t a = canonicalize_axis(axis1, x.ndim(), "swapaxes"), b = canonicalize_axis(axis2, x.ndim(), "swapaxes");
  std::vector<int64_t> perm(size_t(x.ndim()));
  std::iota(perm.begin(), perm.end(), 0);
  std::swap(perm[size_t(a)], perm[size_t(b)]);
  return lax::transpose(x, perm);
}

Array moveaxis(const Array& x, std::vector<int64_t> source, std::vector<int64_t> destination) {
  if (source.size() != destination.size())
    throw ValueError(fmt::format("moveaxis: source {} and destination {} must have the same number of elements",
                                 tup(source), tup(destination)));
  auto src = canonicalize_axes(source, x.ndim(), "moveaxis");
  auto dst = canonicalize_axes(destination, x.ndim(), "moveaxis");
  std::vector<int64_t> order;
  for (int64_t i = 0; i < x.ndim(); ++i)
    if (std::find(src.begin(), src.end(), i) == src.end()) order.push_back(i);
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (size_t i = 0; i < src.size(); ++i) pairs.push_back({dst[i], src[i]});
  std::sort(pairs.begin(), pairs.end());
  for (auto [d, s] : pairs) order.insert(order.begin() + d, s);
  return lax::transpose(x, order);
}
Array moveaxis(const Array& x, int64_t source, int64_t destination) {
  return moveaxis(x, std::vector<int64_t>{source}, std::vector<int64_t>{destination});
}

// ---- expand_dims / squeeze ----
Array expand_dims(const Array& x, Axis axis) {
  if (axis.is_none()) throw ValueError("expand_dims: axis must be an int or a list of ints, got None");
  return lax::expand_dims(x, axis.axes());
}

Array squeeze(const Array& x, Axis axis) {
  std::vector<int64_t> dims;
  if (axis.is_none()) {
    for (int64_t i = 0; i < x.ndim(); ++i)
      if (x.shape()[size_t(i)] == 1) dims.push_back(i);
  } else {
    dims = canonicalize_axes(axis.axes(), x.ndim(), "squeeze");
    for (int64_t d : dims)
      if (x.shape()[size_t(d)] != 1)
        throw ShapeError(
            fmt::format("squeeze: cannot select an axis to squeeze out which has size not equal to one: "
                        "axis {} of shape {} has size {}",
                        d, shape_str(x.shape()), x.shape()[size_t(d)]));
  }
  return lax::squeeze(x, dims);
}

// ---- broadcasting ----
Shape broadcast_shapes(const std::vector<Shape>& shapes) {
  size_t rank = 0;
  for (const Shape& s : shapes) {
    rank = std::max(rank, s.size());
    for (int64_t d : s)
      if (d < 0) throw ShapeError(fmt::format("broadcast_shapes: shape {} has a negative dimension", shape_str(s)));
  }
  Shape out(rank, 1);
  std::vector<size_t> owner(rank, 0);
  for (size_t k = 0; k < shapes.size(); ++k) {
    const Shape& s = shapes[k];
    size_t lead = rank - s.size();
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t d = s[i], &o = out[lead + i];
      if (d == o || d == 1) continue;
      if (o == 1) {
        o = d;
        owner[lead + i] = k;
        continue;
      }
      const Shape& other = shapes[owner[lead + i]];
      throw ShapeError(
          fmt::format("Incompatible shapes for broadcasting: shapes {} and {} (dimension {} from the "
                      "end has sizes {} and {}); sizes must be equal or 1 (all shapes: {})",
                      shape_str(other), shape_str(s), int64_t(rank - (lead + i)), o, d, shapes_str(shapes)));
    }
  }
  return out;
}

Array broadcast_to(const Array& x, const Shape& shape) {
  const Shape& xs = x.shape();
  if (xs == shape) return x;
  for (int64_t d : shape)
    if (d < 0)
      throw ShapeError(fmt::format("broadcast_to: target shape {} has a negative dimension", shape_str(shape)));
  auto fail = [&] {
    throw ShapeError(
        fmt::format("broadcast_to: cannot broadcast array of shape {} to shape {}: trailing dimensions "
                    "must be equal or 1 (numpy broadcasting rules)",
                    shape_str(xs), shape_str(shape)));
  };
  if (xs.size() > shape.size()) fail();
  size_t nlead = shape.size() - xs.size();
  std::vector<int64_t> diff;  // x's size-1 dimensions that are broadcast
  for (size_t i = 0; i < xs.size(); ++i) {
    if (xs[i] == shape[nlead + i]) continue;
    if (xs[i] != 1) fail();
    diff.push_back(int64_t(i));
  }
  std::vector<int64_t> kept;
  for (size_t i = 0; i < xs.size(); ++i)
    if (std::find(diff.begin(), diff.end(), int64_t(i)) == diff.end()) kept.push_back(int64_t(nlead + i));
  return lax::broadcast_in_dim(lax::squeeze(x, diff), shape, kept);
}

std::vector<Array> broadcast_arrays(const std::vector<Array>& arrays) {
  std::vector<Shape> shapes;
  for (const Array& a : arrays) shapes.push_back(a.shape());
  Shape s = broadcast_shapes(shapes);
  std::vector<Array> out;
  for (const Array& a : arrays) out.push_back(broadcast_to(a, s));
  return out;
}

Array atleast_1d(const Array& x) { return x.ndim() >= 1 ? x : lax::expand_dims(x, {0}); }
Array atleast_2d(const Array& x) {
  if (x.ndim() >= 2) return x;
  return x.ndim() == 1 ? lax::expand_dims(x, {0}) : lax::expand_dims(x, {0, 1});
}

// ---- joining ----
Array concatenate(const std::vector<Array>& arrays, int64_t axis) {
  if (arrays.empty()) throw ValueError("concatenate: need at least one array to concatenate");
  for (size_t k = 0; k < arrays.size(); ++k)
    if (arrays[k].ndim() == 0)
      throw ShapeError(
          fmt::format("concatenate: zero-dimensional arrays cannot be concatenated (array at index {} "
                      "has shape ()); use stack, or reshape to (1,)",
                      k));
  int64_t ax = canonicalize_axis(axis, arrays[0].ndim(), "concatenate");
  for (size_t k = 1; k < arrays.size(); ++k) {
    const Shape &s0 = arrays[0].shape(), &sk = arrays[k].shape();
    if (sk.size() != s0.size())
      throw ShapeError(
          fmt::format("concatenate: all the input arrays must have the same number of dimensions, but "
                      "the array at index 0 has shape {} and the array at index {} has shape {}",
                      shape_str(s0), k, shape_str(sk)));
    for (size_t a = 0; a < s0.size(); ++a)
      if (int64_t(a) != ax && s0[a] != sk[a])
        throw ShapeError(
            fmt::format("concatenate: all the input array dimensions except for the concatenation axis "
                        "{} must match exactly, but along dimension {} the array at index 0 has size {} "
                        "and the array at index {} has size {} (shapes {} and {})",
                        ax, a, s0[a], k, sk[a], shape_str(s0), shape_str(sk)));
  }
  std::vector<Array> parts = promote_dtypes("concatenate", arrays);
  // As jax.numpy: concatenate in groups of 16 operands.
  constexpr size_t k = 16;
  while (parts.size() > 1) {
    std::vector<Array> next;
    for (size_t i = 0; i < parts.size(); i += k)
      next.push_back(lax::concatenate(std::vector<Array>(parts.begin() + int64_t(i),
                                                         parts.begin() + int64_t(std::min(parts.size(), i + k))),
                                      ax));
    parts = std::move(next);
  }
  return parts[0];
}

Array stack(const std::vector<Array>& arrays, int64_t axis) {
  if (arrays.empty()) throw ValueError("stack: need at least one array to stack");
  for (size_t k = 1; k < arrays.size(); ++k)
    if (arrays[k].shape() != arrays[0].shape())
      throw ShapeError(
          fmt::format("stack: all input arrays must have the same shape, but the array at index 0 has "
                      "shape {} and the array at index {} has shape {}",
                      shape_str(arrays[0].shape()), k, shape_str(arrays[k].shape())));
  int64_t ax = canonicalize_axis(axis, arrays[0].ndim() + 1, "stack");
  std::vector<Array> parts;
  for (const Array& a : arrays) parts.push_back(lax::expand_dims(a, {ax}));
  return concatenate(parts, ax);
}

Array hstack(const std::vector<Array>& arrays) {
  if (arrays.empty()) throw ValueError("hstack: need at least one array to stack");
  std::vector<Array> parts;
  for (const Array& a : arrays) parts.push_back(atleast_1d(a));
  return concatenate(parts, parts[0].ndim() == 1 ? 0 : 1);
}

Array vstack(const std::vector<Array>& arrays) {
  if (arrays.empty()) throw ValueError("vstack: need at least one array to stack");
  std::vector<Array> parts;
  for (const Array& a : arrays) parts.push_back(atleast_2d(a));
  return concatenate(parts, 0);
}

// ---- splitting ----
namespace {
Array slice_axis(const Array& x, int64_t ax, int64_t start, int64_t stop) {
  std::vector<int64_t> s(size_t(x.ndim()), 0);
  Shape l = x.shape();
  s[size_t(ax)] = start;
  l[size_t(ax)] = stop;
  return lax::slice(x, s, l);
}
std::vector<Array> split_at(const Array& x, int64_t ax, const std::vector<int64_t>& bounds) {
  std::vector<Array> out;
  for (size_t i = 0; i + 1 < bounds.size(); ++i) out.push_back(slice_axis(x, ax, bounds[i], bounds[i + 1]));
  return out;
}
int64_t split_axis(const Array& x, int64_t axis, std::string_view fn) {
  if (x.ndim() == 0) throw ShapeError(fmt::format("{}: cannot split a zero-dimensional array", fn));
  return canonicalize_axis(axis, x.ndim(), fn);
}
}  // namespace

std::vector<Array> split(const Array& x, int64_t sections, int64_t axis) {
  int64_t ax = split_axis(x, axis, "split");
  int64_t n = x.shape()[size_t(ax)];
  if (sections <= 0) throw ValueError(fmt::format("split: number of sections must be larger than 0, got {}", sections));
  if (n % sections != 0)
    throw ValueError(
        fmt::format("split: array split does not result in an equal division: axis {} of size {} into {} "
                    "sections (use array_split for unequal parts)",
                    ax, n, sections));
  std::vector<int64_t> bounds;
  for (int64_t i = 0; i <= sections; ++i) bounds.push_back(i * (n / sections));
  return split_at(x, ax, bounds);
}

std::vector<Array> split(const Array& x, const std::vector<int64_t>& indices, int64_t axis) {
  int64_t ax = split_axis(x, axis, "split");
  int64_t n = x.shape()[size_t(ax)];
  // numpy semantics: piece i is x[indices[i-1]:indices[i]] with Python slice bounds.
  auto norm = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  std::vector<Array> out;
  int64_t prev = 0;
  for (size_t i = 0; i <= indices.size(); ++i) {
    int64_t st = prev, en = i < indices.size() ? norm(indices[i]) : n;
    out.push_back(slice_axis(x, ax, st, std::max(st, en)));
    if (i < indices.size()) prev = norm(indices[i]);
  }
  return out;
}

std::vector<Array> array_split(const Array& x, int64_t sections, int64_t axis) {
  int64_t ax = split_axis(x, axis, "array_split");
  if (sections <= 0)
    throw ValueError(fmt::format("array_split: number of sections must be larger than 0, got {}", sections));
  int64_t n = x.shape()[size_t(ax)], each = n / sections, extras = n % sections;
  std::vector<int64_t> bounds{0};
  for (int64_t i = 0; i < sections; ++i) bounds.push_back(bounds.back() + each + (i < extras ? 1 : 0));
  return split_at(x, ax, bounds);
}

// ---- tile / repeat ----
Array tile(const Array& x, const std::vector<int64_t>& reps) {
  for (int64_t r : reps)
    if (r < 0) throw ValueError(fmt::format("tile: reps {} must be non-negative", tup(reps)));
  size_t rank = std::max(reps.size(), size_t(x.ndim()));
  Shape a_shape(rank - size_t(x.ndim()), 1);
  a_shape.insert(a_shape.end(), x.shape().begin(), x.shape().end());
  std::vector<int64_t> r(rank - reps.size(), 1);
  r.insert(r.end(), reps.begin(), reps.end());
  Shape inter, target, final_shape;
  for (size_t i = 0; i < rank; ++i) {
    inter.push_back(1);
    inter.push_back(a_shape[i]);
    target.push_back(r[i]);
    target.push_back(a_shape[i]);
    final_shape.push_back(a_shape[i] * r[i]);
  }
  return lax::reshape(broadcast_to(lax::reshape(x, inter), target), final_shape);
}

Array repeat(const Array& x, int64_t repeats, std::optional<int64_t> axis) {
  if (repeats < 0) throw ValueError(fmt::format("repeat: repeats must be non-negative, got {}", repeats));
  Array a = x;
  int64_t ax = 0;
  if (!axis)
    a = ravel(x);
  else
    ax = canonicalize_axis(*axis, x.ndim(), "repeat");
  Shape target = a.shape();
  target.insert(target.begin() + ax + 1, repeats);
  Shape out = a.shape();
  out[size_t(ax)] *= repeats;
  return lax::reshape(broadcast_to(lax::expand_dims(a, {ax + 1}), target), out);
}

// ---- pad ----
namespace {
// Source index along an axis of size n for output position p (relative to the first original
// element) in the non-constant modes.
int64_t pad_source(const std::string& mode, int64_t p, int64_t n) {
  if (p >= 0 && p < n) return p;
  if (mode == "edge") return p < 0 ? 0 : n - 1;
  if (mode == "wrap") return ((p % n) + n) % n;
  if (mode == "symmetric") {
    int64_t m = ((p % (2 * n)) + 2 * n) % (2 * n);
    return m < n ? m : 2 * n - 1 - m;
  }
  // reflect
  if (n == 1) return 0;
  int64_t period = 2 * (n - 1);
  int64_t m = ((p % period) + period) % period;
  return m < n ? m : period - m;
}
}  // namespace

Array pad(const Array& x, const std::vector<std::pair<int64_t, int64_t>>& pad_width, const std::string& mode,
          const Array& constant_values) {
  static const char* kModes = "'constant', 'edge', 'reflect', 'symmetric' or 'wrap'";
  if (mode != "constant" && mode != "edge" && mode != "reflect" && mode != "symmetric" && mode != "wrap")
    throw ValueError(fmt::format("pad: unsupported mode '{}'; use {}", mode, kModes));
  size_t r = size_t(x.ndim());
  std::vector<std::pair<int64_t, int64_t>> pw;
  if (pad_width.size() == 1)
    pw.assign(r, pad_width[0]);
  else if (pad_width.size() == r)
    pw = pad_width;
  else
    throw ShapeError(
        fmt::format("pad: pad_width has {} (before, after) pairs for an array of shape {}; give one pair, "
                    "or one per axis ({})",
                    pad_width.size(), shape_str(x.shape()), r));
  for (auto [lo, hi] : pw)
    if (lo < 0 || hi < 0) throw ValueError(fmt::format("pad: pad widths must be non-negative, got ({}, {})", lo, hi));
  if (mode == "constant") {
    if (constant_values.ndim() != 0)
      throw ShapeError(
          fmt::format("pad: constant_values must be a scalar, got shape {}", shape_str(constant_values.shape())));
    Array cv = constant_values.dtype() == x.dtype() && constant_values.weak_type() == x.weak_type()
                   ? constant_values
                   : convert_to(constant_values, x.dtype(), x.weak_type());
    std::vector<lax::PadConfig> cfg;
    for (auto [lo, hi] : pw) cfg.push_back({lo, hi, 0});
    return lax::pad(x, cv, cfg);
  }
  Array a = x;
  for (size_t ax = 0; ax < r; ++ax) {
    auto [lo, hi] = pw[ax];
    if (lo == 0 && hi == 0) continue;
    int64_t n = a.shape()[ax];
    if (n == 0)
      throw ValueError(
          fmt::format("pad: can't extend empty axis {} of shape {} using mode '{}'; only 'constant' can "
                      "pad an empty axis",
                      ax, shape_str(x.shape()), mode));
    // Runs of consecutive source indices (step +1 or -1) become slices (+ rev), then one concatenate.
    std::vector<Array> pieces;
    int64_t total = lo + n + hi;
    int64_t p = 0;
    while (p < total) {
      int64_t s0 = pad_source(mode, p - lo, n);
      int64_t len = 1, step = 0;
      if (p + 1 < total) {
        int64_t s1 = pad_source(mode, p + 1 - lo, n);
        if (s1 == s0 + 1 || s1 == s0 - 1) {
          step = s1 - s0;
          len = 2;
          while (p + len < total && pad_source(mode, p + len - lo, n) == s0 + step * len) ++len;
        }
      }
      if (step >= 0) {
        pieces.push_back(len == n && s0 == 0 ? a : slice_axis(a, int64_t(ax), s0, s0 + len));
      } else {
        int64_t first = s0 - (len - 1);
        pieces.push_back(lax::rev(slice_axis(a, int64_t(ax), first, s0 + 1), {int64_t(ax)}));
      }
      p += len;
    }
    a = lax::concatenate(pieces, int64_t(ax));
  }
  return a;
}

Array pad(const Array& x, int64_t pad_width) { return pad(x, {{pad_width, pad_width}}); }

// ---- flip / roll ----
Array flip(const Array& x, Axis axis) {
  std::vector<int64_t> dims;
  if (axis.is_none()) {
    dims.resize(size_t(x.ndim()));
    std::iota(dims.begin(), dims.end(), 0);
  } else {
    dims = canonicalize_axes(axis.axes(), x.ndim(), "flip");
  }
  return lax::rev(x, dims);
}

Array roll(const Array& x, int64_t shift, std::optional<int64_t> axis) {
  if (!axis) return lax::reshape(roll(ravel(x), shift, 0), x.shape());
  int64_t ax = canonicalize_axis(*axis, x.ndim(), "roll");
  int64_t n = x.shape()[size_t(ax)];
  if (n == 0) return x;
  int64_t i = ((-shift % n) + n) % n;
  return lax::concatenate({lax::slice_in_dim(x, i, n, 1, ax), lax::slice_in_dim(x, 0, i, 1, ax)}, ax);
}

// ---- diagonal / trace ----
Array diagonal(const Array& x, int64_t offset, int64_t axis1, int64_t axis2) {
  if (x.ndim() < 2)
    throw ShapeError(
        fmt::format("diagonal requires an array of at least two dimensions, got shape {}", shape_str(x.shape())));
  int64_t a1 = canonicalize_axis(axis1, x.ndim(), "diagonal"), a2 = canonicalize_axis(axis2, x.ndim(), "diagonal");
  if (a1 == a2) throw ValueError(fmt::format("diagonal: axis1 and axis2 cannot be the same (both {})", a1));
  std::vector<int64_t> perm;
  for (int64_t i = 0; i < x.ndim(); ++i)
    if (i != a1 && i != a2) perm.push_back(i);
  perm.push_back(a1);
  perm.push_back(a2);
  Array y = lax::transpose(x, perm);
  int64_t n = x.shape()[size_t(a1)], m = x.shape()[size_t(a2)];
  Shape lead(y.shape().begin(), y.shape().end() - 2);
  Shape flat = lead;
  flat.push_back(n * m);
  y = lax::reshape(y, flat);
  int64_t len = offset >= 0 ? std::min(n, m - offset) : std::min(n + offset, m);
  len = std::max<int64_t>(len, 0);
  int64_t start = 0, limit = 0;
  if (len > 0) {
    start = offset >= 0 ? offset : -offset * m;
    limit = start + (len - 1) * (m + 1) + 1;
  }
  std::vector<int64_t> st(lead.size(), 0), li = lead, strides(lead.size(), 1);
  st.push_back(start);
  li.push_back(limit);
  strides.push_back(m + 1);
  return lax::slice(y, st, li, strides);
}

Array trace(const Array& x, int64_t offset) { return sum(diagonal(x, offset, 0, 1), Axis(int64_t(-1))); }

// ---- tri / tril / triu ----
namespace {
Array bool_tri(int64_t n, int64_t m, int64_t k) {
  Shape s{n, m};
  Array rows = lax::broadcasted_iota(DType::int32, s, 0), cols = lax::broadcasted_iota(DType::int32, s, 1);
  return lax::ge(lax::add(rows, make_scalar(double(k), DType::int32)), cols);
}
Array masked(const Array& x, int64_t k, bool lower, std::string_view fn) {
  if (x.ndim() < 2)
    throw ShapeError(fmt::format("{}: argument must be at least 2-D, got shape {}", fn, shape_str(x.shape())));
  const Shape& s = x.shape();
  int64_t n = s[s.size() - 2], m = s[s.size() - 1];
  Array mask = lax::broadcast(bool_tri(n, m, lower ? k : k - 1), Shape(s.begin(), s.end() - 2));
  Array zeros = lax::broadcast_in_dim(make_scalar(0.0, x.dtype(), x.weak_type()), s, {});
  return lower ? lax::select(mask, x, zeros) : lax::select(mask, zeros, x);
}
}  // namespace

Array tri(int64_t n, std::optional<int64_t> m, int64_t k, DType dtype) {
  int64_t mm = m.value_or(n);
  if (n < 0 || mm < 0) throw ValueError(fmt::format("tri: negative dimensions are not allowed, got N={} M={}", n, mm));
  return lax::convert_element_type(bool_tri(n, mm, k), dtype);
}
Array tril(const Array& x, int64_t k) { return masked(x, k, true, "tril"); }
Array triu(const Array& x, int64_t k) { return masked(x, k, false, "triu"); }

}  // namespace numpy
}  // namespace cjax
