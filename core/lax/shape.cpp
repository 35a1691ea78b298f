// Shape primitives (broadcast_in_dim, reshape, transpose, squeeze, rev, concatenate, pad, iota),
// their eager CPU kernels and lax wrappers, plus the generic strided-copy kernel (core/lax/shape.h)
// that every data-moving shape/slicing kernel uses. Semantics and params follow JAX/XLA.
#include "core/lax/shape.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "cjax/lax.h"
#include "core/array/array_impl.h"
#include "core/array/util.h"
#include "core/array/visit_dtype.h"

namespace cjax {

std::vector<int64_t> broadcast_source_strides(const Shape& in, size_t out_rank, const std::vector<int64_t>& dims) {
  std::vector<int64_t> ss(out_rank, 0);
  auto ist = row_major_strides(in);
  for (size_t i = 0; i < dims.size(); ++i)
    if (in[i] != 1) ss[size_t(dims[i])] = ist[i];
  return ss;
}
std::vector<int64_t> transpose_source_strides(const Shape& in, const std::vector<int64_t>& perm) {
  auto ist = row_major_strides(in);
  std::vector<int64_t> ss(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) ss[i] = ist[size_t(perm[i])];
  return ss;
}

// ============================================================================================
// Primitives
// ============================================================================================
namespace {

std::string tup(const std::vector<int64_t>& v) { return param_value_str(ParamValue(v)); }

void check_dims_nonneg(std::string_view name, std::string_view what, const Shape& s) {
  for (int64_t d : s)
    if (d < 0)
      throw ShapeError(fmt::format("{}: {} {} has a negative dimension; sizes must be >= 0", name, what, shape_str(s)));
}

// ---- broadcast_in_dim ----
const PrimitiveDef& g_broadcast_in_dim = register_primitive([] {
  PrimitiveDef def;
  def.name = "broadcast_in_dim";
  def.kind = PrimKind::Broadcast;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const Shape& shape = p.ints("shape");
    const auto& bd = p.ints("broadcast_dimensions");
    const Shape& os = in[0].shape();
    check_dims_nonneg("broadcast_in_dim", "target shape", shape);
    if (os.size() > shape.size())
      throw ShapeError(
          fmt::format("broadcast_in_dim target broadcast shape must have equal or higher rank to the "
                      "operand shape; got operand shape {} and target broadcast shape {}",
                      shape_str(os), shape_str(shape)));
    if (bd.size() != os.size())
      throw ShapeError(
          fmt::format("broadcast_in_dim broadcast_dimensions must have length equal to operand ndim; "
                      "got broadcast_dimensions {} for operand shape {}",
                      tup(bd), shape_str(os)));
    for (size_t i = 0; i < bd.size(); ++i) {
      if (bd[i] < 0 || bd[i] >= int64_t(shape.size()))
        throw ShapeError(
            fmt::format("broadcast_in_dim broadcast_dimensions must be valid indices into the target "
                        "shape; got broadcast_dimensions {} for target shape {}",
                        tup(bd), shape_str(shape)));
      if (i > 0 && bd[i] <= bd[i - 1])
        throw ShapeError(
            fmt::format("broadcast_in_dim broadcast_dimensions must be strictly increasing; got "
                        "broadcast_dimensions {}",
                        tup(bd)));
      if (os[i] != 1 && os[i] != shape[size_t(bd[i])])
        throw ShapeError(
            fmt::format("broadcast_in_dim operand dimension sizes must either be 1, or be equal to their "
                        "corresponding dimensions in the target broadcast shape; got operand of shape "
                        "{}, target broadcast shape {}, broadcast_dimensions {}",
                        shape_str(os), shape_str(shape), tup(bd)));
    }
    return {AbstractValue{shape, in[0].dtype(), in[0].weak_type(), {}}};
  };
  return def;
}());

// ---- reshape ----
const PrimitiveDef& g_reshape = register_primitive([] {
  PrimitiveDef def;
  def.name = "reshape";
  def.kind = PrimKind::Shape;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const Shape& ns = p.ints("new_sizes");
    if (p.has("dimensions") && !std::holds_alternative<std::monostate>(p.at("dimensions")))
      throw ValueError("reshape: the `dimensions` parameter must be None; transpose the operand first");
    check_dims_nonneg("reshape", "new_sizes", ns);
    if (shape_size(ns) != in[0].size())
      throw ShapeError(
          fmt::format("reshape total size must be unchanged, got new_sizes {} (size {}) for operand "
                      "shape {} (size {})",
                      shape_str(ns), shape_size(ns), shape_str(in[0].shape()), in[0].size()));
    return {AbstractValue{ns, in[0].dtype(), in[0].weak_type(), {}}};
  };
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params&) {
    return std::vector<Array>{make_view(in[0], out_avals[0])};
  };
  return def;
}());

// ---- transpose ----
const PrimitiveDef& g_transpose = register_primitive([] {
  PrimitiveDef def;
  def.name = "transpose";
  def.kind = PrimKind::Shape;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const auto& perm = p.ints("permutation");
    const Shape& s = in[0].shape();
    std::vector<bool> seen(s.size(), false);
    bool ok = perm.size() == s.size();
    for (int64_t a : perm) {
      if (!ok) break;
      if (a < 0 || a >= int64_t(s.size()) || seen[size_t(a)])
        ok = false;
      else
        seen[size_t(a)] = true;
    }
    if (!ok)
      throw ShapeError(
          fmt::format("transpose permutation isn't a permutation of operand dimensions, got "
                      "permutation {} for operand shape {}; pass each axis 0..{} exactly once",
                      tup(perm), shape_str(s), int64_t(s.size()) - 1));
    Shape out(s.size());
    for (size_t i = 0; i < perm.size(); ++i) out[i] = s[size_t(perm[i])];
    return {AbstractValue{out, in[0].dtype(), in[0].weak_type(), {}}};
  };
  return def;
}());

// ---- squeeze ----
const PrimitiveDef& g_squeeze = register_primitive([] {
  PrimitiveDef def;
  def.name = "squeeze";
  def.kind = PrimKind::Shape;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const auto& dims = p.ints("dimensions");
    const Shape& s = in[0].shape();
    std::vector<bool> drop(s.size(), false);
    for (int64_t d : dims) {
      if (d < 0 || d >= int64_t(s.size()))
        throw ValueError(fmt::format("squeeze: dimension {} is out of bounds for operand shape {} (dimensions {})", d,
                                     shape_str(s), tup(dims)));
      if (drop[size_t(d)]) throw ValueError(fmt::format("squeeze: repeated dimension {} in {}", d, tup(dims)));
      if (s[size_t(d)] != 1)
        throw ShapeError(
            fmt::format("cannot select an axis to squeeze out which has size not equal to one, got "
                        "shape={} and dimensions={} (axis {} has size {})",
                        shape_str(s), tup(dims), d, s[size_t(d)]));
      drop[size_t(d)] = true;
    }
    Shape out;
    for (size_t i = 0; i < s.size(); ++i)
      if (!drop[i]) out.push_back(s[i]);
    return {AbstractValue{out, in[0].dtype(), in[0].weak_type(), {}}};
  };
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params&) {
    return std::vector<Array>{make_view(in[0], out_avals[0])};
  };
  return def;
}());

// ---- rev ----
const PrimitiveDef& g_rev = register_primitive([] {
  PrimitiveDef def;
  def.name = "rev";
  def.kind = PrimKind::Shape;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const auto& dims = p.ints("dimensions");
    const Shape& s = in[0].shape();
    std::vector<bool> seen(s.size(), false);
    for (int64_t d : dims) {
      if (d < 0 || d >= int64_t(s.size()))
        throw ValueError(
            fmt::format("rev dimensions must be valid axes of the operand, got dimensions {} for "
                        "operand shape {}",
                        tup(dims), shape_str(s)));
      if (seen[size_t(d)]) throw ValueError(fmt::format("rev dimensions must be unique, got {}", tup(dims)));
      seen[size_t(d)] = true;
    }
    return {AbstractValue{s, in[0].dtype(), in[0].weak_type(), {}}};
  };
  return def;
}());

// ---- concatenate ----
const PrimitiveDef& g_concatenate = register_primitive([] {
  PrimitiveDef def;
  def.name = "concatenate";
  def.kind = PrimKind::Shape;
  def.arity = Arity::at_least(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    int64_t dim = p.i("dimension");
    const Shape& s0 = in[0].shape();
    bool weak = true;
    for (size_t k = 0; k < in.size(); ++k) {
      if (in[k].dtype() != in[0].dtype())
        throw DTypeError(
            fmt::format("concatenate: cannot concatenate arrays with different dtypes, got {} (operand "
                        "0) and {} (operand {}); use jnp::concatenate to promote, or astype",
                        dtype_name(in[0].dtype()), dtype_name(in[k].dtype()), k));
      if (in[k].ndim() != int(s0.size()))
        throw ShapeError(
            fmt::format("concatenate: arrays must have the same number of dimensions, got shapes {} "
                        "(operand 0) and {} (operand {})",
                        shape_str(s0), shape_str(in[k].shape()), k));
      weak = weak && in[k].weak_type();
    }
    if (s0.empty())
      throw ShapeError("concatenate: zero-dimensional arrays cannot be concatenated; reshape them to (1,) first");
    if (dim < 0 || dim >= int64_t(s0.size()))
      throw ValueError(fmt::format("concatenate dimension out of bounds: dimension {} for operands of shape {}", dim,
                                   shape_str(s0)));
    Shape out = s0;
    for (size_t k = 1; k < in.size(); ++k) {
      const Shape& sk = in[k].shape();
      for (size_t a = 0; a < s0.size(); ++a)
        if (int64_t(a) != dim && sk[a] != s0[a])
          throw ShapeError(
              fmt::format("concatenate: all input array dimensions except for the concatenation axis {} "
                          "must match exactly, but along dimension {} the array at index 0 has size {} "
                          "and the array at index {} has size {} (shapes {} and {})",
                          dim, a, s0[a], k, sk[a], shape_str(s0), shape_str(sk)));
      out[size_t(dim)] += sk[size_t(dim)];
    }
    return {AbstractValue{out, in[0].dtype(), weak, {}}};
  };
  return def;
}());

// ---- pad ----
int64_t padded_dim(int64_t d, int64_t lo, int64_t hi, int64_t interior) {
  return lo + hi + d + std::max<int64_t>(d - 1, 0) * interior;
}
const PrimitiveDef& g_pad = register_primitive([] {
  PrimitiveDef def;
  def.name = "pad";
  def.kind = PrimKind::Shape;
  def.arity = Arity::exactly(2);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const auto& cfg = p.get<std::vector<std::vector<int64_t>>>("padding_config");
    const Shape& s = in[0].shape();
    if (in[1].ndim() != 0)
      throw ShapeError(fmt::format("pad: padding_value must be a scalar, got shape {}", shape_str(in[1].shape())));
    if (in[1].dtype() != in[0].dtype())
      throw DTypeError(fmt::format("pad: operand and padding_value must have the same dtype, got {} and {}",
                                   dtype_name(in[0].dtype()), dtype_name(in[1].dtype())));
    if (cfg.size() != s.size())
      throw ShapeError(
          fmt::format("pad: padding_config has {} entries but the operand of shape {} has rank {}; "
                      "give one (lo, hi, interior) per dimension",
                      cfg.size(), shape_str(s), s.size()));
    Shape out(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      if (cfg[i].size() != 3)
        throw ValueError(fmt::format("pad: padding_config entry {} must be (lo, hi, interior)", i));
      if (cfg[i][2] < 0)
        throw ValueError(fmt::format("pad: interior padding must be >= 0, got {} for dimension {}", cfg[i][2], i));
      out[i] = padded_dim(s[i], cfg[i][0], cfg[i][1], cfg[i][2]);
      if (out[i] < 0)
        throw ShapeError(
            fmt::format("pad: dimension {} of operand shape {} has size {} after padding ({}, {}, {}); "
                        "the size after padding must be at least 0",
                        i, shape_str(s), out[i], cfg[i][0], cfg[i][1], cfg[i][2]));
    }
    return {AbstractValue{out, in[0].dtype(), in[0].weak_type() && in[1].weak_type(), {}}};
  };
  return def;
}());

// ---- iota ----
const PrimitiveDef& g_iota = register_primitive([] {
  PrimitiveDef def;
  def.name = "iota";
  def.kind = PrimKind::Broadcast;
  def.arity = Arity::exactly(0);
  def.abstract_eval = [](std::span<const Array>, const Params& p) -> std::vector<AbstractValue> {
    DType dt = p.get<DType>("dtype");
    const Shape& s = p.ints("shape");
    int64_t dim = p.i("dimension");
    if (dt == DType::bool_)
      throw DTypeError("iota: dtype bool is not supported; use an integer or floating-point dtype");
    if (s.empty()) throw ShapeError("iota shape must have positive rank, got shape=()");
    check_dims_nonneg("iota", "shape", s);
    if (dim < 0 || dim >= int64_t(s.size()))
      throw ValueError(fmt::format("iota dimension must be between 0 and len(shape), got dimension={} for shape={}",
                                   dim, shape_str(s)));
    return {AbstractValue{s, dt, false, {}}};
  };
  return def;
}());

}  // namespace

namespace prims {
const PrimitiveDef& broadcast_in_dim() { return g_broadcast_in_dim; }
const PrimitiveDef& reshape() { return g_reshape; }
const PrimitiveDef& transpose() { return g_transpose; }
const PrimitiveDef& squeeze() { return g_squeeze; }
const PrimitiveDef& rev() { return g_rev; }
const PrimitiveDef& concatenate() { return g_concatenate; }
const PrimitiveDef& pad() { return g_pad; }
const PrimitiveDef& iota() { return g_iota; }
}  // namespace prims

// ============================================================================================
// lax wrappers (as jax.lax: shortcuts that return the operand bind nothing)
// ============================================================================================
namespace lax {

Array broadcast_in_dim(const Array& x, const Shape& shape, const std::vector<int64_t>& broadcast_dimensions) {
  if (x.shape() == shape && x.ndim() == int(broadcast_dimensions.size())) {
    bool identity = true;
    for (size_t i = 0; i < broadcast_dimensions.size(); ++i)
      identity = identity && broadcast_dimensions[i] == int64_t(i);
    if (identity) return x;
  }
  return bind1(prims::broadcast_in_dim(), {x},
               Params{{"shape", shape},
                      {"broadcast_dimensions", broadcast_dimensions},
                      {"sharding", std::monostate{}}});
}

Array broadcast(const Array& x, const Shape& sizes) {
  if (sizes.empty()) return x;
  Shape shape = sizes;
  shape.insert(shape.end(), x.shape().begin(), x.shape().end());
  std::vector<int64_t> dims(size_t(x.ndim()));
  std::iota(dims.begin(), dims.end(), int64_t(sizes.size()));
  return broadcast_in_dim(x, shape, dims);
}

Array reshape(const Array& x, const Shape& new_sizes) {
  if (x.shape() == new_sizes) return x;
  return bind1(prims::reshape(), {x},
               Params{{"new_sizes", new_sizes}, {"dimensions", std::monostate{}}, {"sharding", std::monostate{}}});
}

Array transpose(const Array& x, const std::vector<int64_t>& permutation) {
  bool identity = int(permutation.size()) == x.ndim();
  for (size_t i = 0; identity && i < permutation.size(); ++i) identity = permutation[i] == int64_t(i);
  if (identity) return x;
  return bind1(prims::transpose(), {x}, Params{{"permutation", permutation}});
}

Array squeeze(const Array& x, const std::vector<int64_t>& dimensions) {
  std::vector<int64_t> dims = canonicalize_axes(dimensions, x.ndim(), "lax::squeeze");
  std::sort(dims.begin(), dims.end());
  if (dims.empty()) return x;
  return bind1(prims::squeeze(), {x}, Params{{"dimensions", dims}});
}

Array expand_dims(const Array& x, const std::vector<int64_t>& dimensions) {
  int64_t ndim_out = x.ndim() + int64_t(dimensions.size());
  std::vector<int64_t> dims = canonicalize_axes(dimensions, ndim_out, "lax::expand_dims");
  std::vector<bool> is_new(size_t(ndim_out), false);
  for (int64_t d : dims) is_new[size_t(d)] = true;
  Shape shape;
  std::vector<int64_t> bdims;
  size_t k = 0;
  for (int64_t i = 0; i < ndim_out; ++i) {
    if (is_new[size_t(i)]) {
      shape.push_back(1);
    } else {
      shape.push_back(x.shape()[k++]);
      bdims.push_back(i);
    }
  }
  return broadcast_in_dim(x, shape, bdims);
}

Array rev(const Array& x, const std::vector<int64_t>& dimensions) {
  if (dimensions.empty() || x.ndim() == 0) return x;
  return bind1(prims::rev(), {x}, Params{{"dimensions", canonicalize_axes(dimensions, x.ndim(), "lax::rev")}});
}

Array concatenate(const std::vector<Array>& operands, int64_t dimension) {
  if (operands.empty()) throw ValueError("lax::concatenate requires a non-empty sequence of arrays");
  if (operands.size() == 1) return operands[0];
  if (operands[0].ndim() > 0) dimension = canonicalize_axis(dimension, operands[0].ndim(), "lax::concatenate");
  return bind1(prims::concatenate(), std::span<const Array>(operands), Params{{"dimension", dimension}});
}

Array pad(const Array& x, const Array& padding_value, const std::vector<PadConfig>& config) {
  std::vector<std::vector<int64_t>> cfg;
  cfg.reserve(config.size());
  for (const PadConfig& c : config) cfg.push_back({c.lo, c.hi, c.interior});
  return bind1(prims::pad(), {x, padding_value}, Params{{"padding_config", cfg}});
}

Array broadcasted_iota(DType dtype, const Shape& shape, int64_t dimension) {
  (void)itemsize(dtype);  // validates (DTypeError "invalid dtype value N")
  if (!shape.empty()) dimension = canonicalize_axis(dimension, int64_t(shape.size()), "lax::broadcasted_iota");
  return bind1(prims::iota(), std::span<const Array>(),
               Params{{"dtype", dtype}, {"shape", shape}, {"dimension", dimension}, {"sharding", std::monostate{}}});
}

Array iota(DType dtype, int64_t size) { return broadcasted_iota(dtype, Shape{size}, 0); }

}  // namespace lax
}  // namespace cjax
