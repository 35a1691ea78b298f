// Slicing primitives (slice, dynamic_slice, dynamic_update_slice), their eager CPU kernels (on
// the strided-copy kernel of core/lax/shape.h) and lax wrappers. Dynamic start indices are clamped
// into range as XLA does; the lax wrappers first map negative indices as jax.lax does.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "cjax/lax.h"
#include "core/array/array_impl.h"
#include "core/array/util.h"
#include "core/array/visit_dtype.h"
#include "core/lax/shape.h"

namespace cjax {
namespace {

std::string tup(const std::vector<int64_t>& v) { return param_value_str(ParamValue(v)); }

// ---- slice ----
const PrimitiveDef& g_slice = register_primitive([] {
  PrimitiveDef def;
  def.name = "slice";
  def.kind = PrimKind::Indexing;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const Shape& s = in[0].shape();
    const auto& start = p.ints("start_indices");
    const auto& limit = p.ints("limit_indices");
    std::vector<int64_t> strides(s.size(), 1);
    if (!std::holds_alternative<std::monostate>(p.at("strides"))) strides = p.ints("strides");
    if (start.size() != s.size() || limit.size() != s.size() || strides.size() != s.size())
      throw ShapeError(
          fmt::format("slice start_indices, limit_indices and strides must have length equal to the "
                      "operand rank; got start_indices {}, limit_indices {}, strides {} for operand "
                      "shape {}",
                      tup(start), tup(limit), tup(strides), shape_str(s)));
    Shape out(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      if (start[i] < 0)
        throw ValueError(
            fmt::format("slice start_indices must be greater than or equal to zero, got start_indices "
                        "{} for operand shape {}",
                        tup(start), shape_str(s)));
      if (limit[i] > s[i])
        throw ValueError(
            fmt::format("slice limit_indices must be less than or equal to operand shape, got "
                        "limit_indices {} for operand shape {}",
                        tup(limit), shape_str(s)));
      if (limit[i] < start[i])
        throw ValueError(
            fmt::format("slice limit_indices must be greater than or equal to start_indices, got "
                        "start_indices {} and limit_indices {} for operand shape {}",
                        tup(start), tup(limit), shape_str(s)));
      if (strides[i] <= 0)
        throw ValueError(
            fmt::format("slice strides must be positive, got {} for operand shape {}", tup(strides), shape_str(s)));
      out[i] = (limit[i] - start[i] + strides[i] - 1) / strides[i];
    }
    return {AbstractValue{out, in[0].dtype(), in[0].weak_type(), {}}};
  };
  return def;
}());

void check_indices(std::string_view name, std::span<const Array> idx, size_t rank, const Shape& s) {
  if (idx.size() != rank)
    throw ShapeError(
        fmt::format("{}: got {} start indices for an operand of shape {}; give one scalar index per "
                    "dimension ({})",
                    name, idx.size(), shape_str(s), rank));
  for (size_t i = 0; i < idx.size(); ++i) {
    if (idx[i].ndim() != 0)
      throw ShapeError(
          fmt::format("{}: start index {} must be a scalar, got shape {}", name, i, shape_str(idx[i].shape())));
    if (!is_integer(idx[i].dtype()))
      throw DTypeError(fmt::format("{}: index arguments must be integers of the same type, got {} for index {}", name,
                                   dtype_name(idx[i].dtype()), i));
    if (idx[i].dtype() != idx[0].dtype())
      throw DTypeError(fmt::format("{}: index arguments must be integers of the same type, got {} and {}", name,
                                   dtype_name(idx[0].dtype()), dtype_name(idx[i].dtype())));
  }
}

// ---- dynamic_slice ----
const PrimitiveDef& g_dynamic_slice = register_primitive([] {
  PrimitiveDef def;
  def.name = "dynamic_slice";
  def.kind = PrimKind::Indexing;
  def.arity = Arity::at_least(1);  // the operand, then one scalar index per dimension
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const Shape& s = in[0].shape();
    const auto& sizes = p.ints("slice_sizes");
    check_indices("dynamic_slice", in.subspan(1), s.size(), s);
    if (sizes.size() != s.size())
      throw ShapeError(
          fmt::format("dynamic_slice slice_sizes must have the same length as the operand rank, got "
                      "slice_sizes {} for operand shape {}",
                      tup(sizes), shape_str(s)));
    for (size_t i = 0; i < s.size(); ++i)
      if (sizes[i] < 0 || sizes[i] > s[i])
        throw ShapeError(
            fmt::format("dynamic_slice slice_sizes must be between 0 and the operand shape, got "
                        "slice_sizes {} for operand shape {} (dimension {})",
                        tup(sizes), shape_str(s), i));
    return {AbstractValue{sizes, in[0].dtype(), in[0].weak_type(), {}}};
  };
  return def;
}());

// ---- dynamic_update_slice ----
const PrimitiveDef& g_dynamic_update_slice = register_primitive([] {
  PrimitiveDef def;
  def.name = "dynamic_update_slice";
  def.kind = PrimKind::Indexing;
  def.arity = Arity::at_least(2);  // the operand, the update, then one scalar index per dimension
  def.abstract_eval = [](std::span<const Array> in, const Params&) -> std::vector<AbstractValue> {
    const Shape& s = in[0].shape();
    const Shape& u = in[1].shape();
    if (in[0].dtype() != in[1].dtype())
      throw DTypeError(
          fmt::format("dynamic_update_slice update dtype must match operand dtype, got operand {} and "
                      "update {}",
                      dtype_name(in[0].dtype()), dtype_name(in[1].dtype())));
    if (s.size() != u.size())
      throw ShapeError(
          fmt::format("dynamic_update_slice update must have the same rank as operand, got update "
                      "shape {} for operand shape {}",
                      shape_str(u), shape_str(s)));
    for (size_t i = 0; i < s.size(); ++i)
      if (u[i] > s[i])
        throw ShapeError(
            fmt::format("dynamic_update_slice update shape must be smaller than operand shape, got "
                        "update shape {} for operand shape {} (dimension {})",
                        shape_str(u), shape_str(s), i));
    check_indices("dynamic_update_slice", in.subspan(2), s.size(), s);
    return {AbstractValue{s, in[0].dtype(), in[0].weak_type() && in[1].weak_type(), {}}};
  };
  return def;
}());

}  // namespace

int64_t read_scalar_index(const Array& a) {
  Array h = to_host(a);
  return visit_dtype(h.dtype(), [&](auto tag) -> int64_t {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_integral_v<T>)
      return int64_t(*data_ptr<const T>(h));
    else
      throw DTypeError("internal: non-integer index");
  });
}

std::vector<int64_t> clamped_starts(std::span<const Array> idx, const Shape& s, const Shape& sizes) {
  std::vector<int64_t> st(s.size());
  for (size_t i = 0; i < s.size(); ++i) st[i] = std::clamp<int64_t>(read_scalar_index(idx[i]), 0, s[i] - sizes[i]);
  return st;
}

namespace prims {
const PrimitiveDef& slice() { return g_slice; }
const PrimitiveDef& dynamic_slice() { return g_dynamic_slice; }
const PrimitiveDef& dynamic_update_slice() { return g_dynamic_update_slice; }
}  // namespace prims

// ============================================================================================
// lax wrappers
// ============================================================================================
namespace lax {
namespace {

// jax.lax._dynamic_slice_indices: a negative index i counts from the end (i + dim); the
// primitive then clamps. Mixed index dtypes are converted to one (int64 if any is int64).
std::vector<Array> dynamic_slice_indices(std::string_view fn, const Array& x, const std::vector<Array>& idx) {
  if (int(idx.size()) != x.ndim())
    throw ShapeError(
        fmt::format("{}: got {} start indices for an operand of shape {}; give one scalar index per "
                    "dimension ({})",
                    fn, idx.size(), shape_str(x.shape()), x.ndim()));
  bool same = true, any64 = false;
  for (const Array& i : idx) {
    if (!is_integer(i.dtype()))
      throw DTypeError(fmt::format("{}: start indices must be integers, got {}", fn, dtype_name(i.dtype())));
    if (i.ndim() != 0)
      throw ShapeError(fmt::format("{}: start indices must be scalars, got shape {}", fn, shape_str(i.shape())));
    same = same && i.dtype() == idx[0].dtype();
    any64 = any64 || i.dtype() == DType::int64 || i.dtype() == DType::uint32;
  }
  std::vector<Array> out;
  out.reserve(idx.size());
  for (size_t k = 0; k < idx.size(); ++k) {
    Array i = idx[k];
    if (!same) i = convert_element_type(i, any64 ? DType::int64 : DType::int32);
    if (is_unsigned_integer(i.dtype())) {
      out.push_back(i);
      continue;
    }
    int64_t d = x.shape()[k];
    if (ConcreteArray* c = concrete(i); c && c->buffers.size() == 1) {
      int64_t v = read_scalar_index(i);
      out.push_back(v < 0 ? make_scalar(double(v + d), i.dtype(), i.weak_type()) : i);
      continue;
    }
    Array dd = make_scalar(double(d), i.dtype(), i.weak_type());
    Array zero = make_scalar(0.0, i.dtype(), i.weak_type());
    out.push_back(select(lt(i, zero), add(i, dd), i));
  }
  return out;
}

}  // namespace

Array slice(const Array& x, const std::vector<int64_t>& start, const std::vector<int64_t>& limit,
            const std::vector<int64_t>& strides) {
  ParamValue st = std::monostate{};
  if (!strides.empty()) st = strides;
  return bind1(prims::slice(), {x}, Params{{"start_indices", start}, {"limit_indices", limit}, {"strides", st}});
}

Array slice_in_dim(const Array& x, int64_t start, int64_t limit, int64_t stride, int64_t axis) {
  axis = canonicalize_axis(axis, x.ndim(), "lax::slice_in_dim");
  int64_t len = x.shape()[size_t(axis)];
  if (start < 0) start += len;
  if (limit < 0) limit += len;
  std::vector<int64_t> starts(size_t(x.ndim()), 0), limits = x.shape(), strides(size_t(x.ndim()), 1);
  starts[size_t(axis)] = start;
  limits[size_t(axis)] = limit;
  strides[size_t(axis)] = stride;
  return slice(x, starts, limits, strides);
}

Array dynamic_slice(const Array& x, const std::vector<Array>& start_indices, const std::vector<int64_t>& sizes) {
  std::vector<Array> ops{x};
  for (Array& i : dynamic_slice_indices("lax::dynamic_slice", x, start_indices)) ops.push_back(std::move(i));
  return bind1(prims::dynamic_slice(), std::span<const Array>(ops), Params{{"slice_sizes", sizes}});
}

Array dynamic_update_slice(const Array& x, const Array& update, const std::vector<Array>& start_indices) {
  std::vector<Array> ops{x, update};
  for (Array& i : dynamic_slice_indices("lax::dynamic_update_slice", x, start_indices)) ops.push_back(std::move(i));
  return bind1(prims::dynamic_update_slice(), std::span<const Array>(ops));
}

namespace {
std::vector<Array> zero_indices(const Array& x, const Array& start, int64_t axis) {
  if (!is_integer(start.dtype()))
    throw DTypeError(fmt::format("dynamic slice start index must be an integer, got {}", dtype_name(start.dtype())));
  std::vector<Array> idx;
  for (int64_t i = 0; i < x.ndim(); ++i)
    idx.push_back(i == axis ? start : make_scalar(0.0, start.dtype(), start.weak_type()));
  return idx;
}
}  // namespace

Array dynamic_slice_in_dim(const Array& x, const Array& start, int64_t size, int64_t axis) {
  axis = canonicalize_axis(axis, x.ndim(), "lax::dynamic_slice_in_dim");
  Shape sizes = x.shape();
  sizes[size_t(axis)] = size;
  return dynamic_slice(x, zero_indices(x, start, axis), sizes);
}

Array dynamic_update_slice_in_dim(const Array& x, const Array& update, const Array& start, int64_t axis) {
  axis = canonicalize_axis(axis, x.ndim(), "lax::dynamic_update_slice_in_dim");
  return dynamic_update_slice(x, update, zero_indices(x, start, axis));
}

Array dynamic_index_in_dim(const Array& x, const Array& index, int64_t axis, bool keepdims) {
  axis = canonicalize_axis(axis, x.ndim(), "lax::dynamic_index_in_dim");
  Array r = dynamic_slice_in_dim(x, index, 1, axis);
  return keepdims ? r : squeeze(r, {axis});
}

}  // namespace lax
}  // namespace cjax
