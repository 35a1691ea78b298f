// Gather / scatter primitives (XLA semantics, JAX's params): definitions, shape rules with their
// geometry, params and lax wrappers. The CPU kernels, and the semantics they implement in detail,
// are in backends/cpu/kernels/gather_scatter.cpp.
#include "core/lax/gather_scatter.h"

#include <absl/hash/hash.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/array/array_impl.h"
#include "core/array/visit_dtype.h"
#include "core/lax/scalar_fns.h"

namespace cjax {
namespace {

using lax::GatherScatterMode;

std::string tuple_str(const std::vector<int64_t>& v) {
  if (v.size() == 1) return fmt::format("({},)", v[0]);
  return fmt::format("({})", fmt::join(v, ", "));
}
bool contains(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Checks that `dims` are sorted (if required), unique and in [0, bound).
void check_dims(std::string_view prim, std::string_view what, const std::vector<int64_t>& dims, int64_t bound,
                bool sorted, std::string_view bound_desc) {
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0 || dims[i] >= bound)
      throw ShapeError(fmt::format("{}: {}={} has an entry {} out of range for {} {} (valid: 0..{})", prim, what,
                                   tuple_str(dims), dims[i], bound_desc, bound, bound - 1));
    for (size_t j = 0; j < i; ++j)
      if (dims[j] == dims[i])
        throw ShapeError(fmt::format("{}: {}={} repeats dimension {}", prim, what, tuple_str(dims), dims[i]));
    if (sorted && i && dims[i - 1] > dims[i])
      throw ShapeError(fmt::format("{}: {}={} must be sorted", prim, what, tuple_str(dims)));
  }
}

void check_index_dtype(std::string_view prim, const Array& indices) {
  if (!is_integer(indices.dtype()))
    throw DTypeError(fmt::format("{}: indices must have an integer dtype, got {} (convert them with astype(int32))",
                                 prim, dtype_name(indices.dtype())));
  if (indices.ndim() < 1)
    throw ShapeError(
        fmt::format("{}: indices must have rank >= 1 (the last dimension is the index vector), got "
                    "shape {}; reshape a scalar index to (1,)",
                    prim, shape_str(indices.shape())));
}

// ---------------------------------------------------------------- gather
}  // namespace

GatherGeom gather_geometry(const Array& operand, const Array& indices, const lax::GatherDimensionNumbers& dn,
                           const std::vector<int64_t>& ss) {
  constexpr std::string_view P = "gather";
  check_index_dtype(P, indices);
  const Shape& os = operand.shape();
  const Shape& is = indices.shape();
  int64_t R = operand.ndim(), nb = int64_t(is.size()) - 1;
  GatherGeom g;
  g.K = is.back();
  g.batch_shape.assign(is.begin(), is.end() - 1);
  if (int64_t(ss.size()) != R)
    throw ShapeError(
        fmt::format("gather: slice_sizes={} must have one entry per operand dimension; the operand has "
                    "shape {} (rank {})",
                    tuple_str(ss), shape_str(os), R));
  for (int64_t d = 0; d < R; ++d)
    if (ss[size_t(d)] < 0 || ss[size_t(d)] > os[size_t(d)])
      throw ShapeError(
          fmt::format("gather: slice size {} for operand dimension {} must be in [0, {}] (operand shape "
                      "{}, slice_sizes={})",
                      ss[size_t(d)], d, os[size_t(d)], shape_str(os), tuple_str(ss)));
  check_dims(P, "collapsed_slice_dims", dn.collapsed_slice_dims, R, true, "an operand of rank");
  check_dims(P, "operand_batching_dims", dn.operand_batching_dims, R, true, "an operand of rank");
  check_dims(P, "start_index_map", dn.start_index_map, R, false, "an operand of rank");
  check_dims(P, "start_indices_batching_dims", dn.start_indices_batching_dims, nb, false,
             "the batch dimensions of indices, count");
  for (int64_t d : dn.collapsed_slice_dims) {
    if (ss[size_t(d)] > 1)
      throw ShapeError(fmt::format("gather: collapsed dimension {} must have slice size <= 1, got {} (slice_sizes={})",
                                   d, ss[size_t(d)], tuple_str(ss)));
    if (contains(dn.operand_batching_dims, d))
      throw ShapeError(fmt::format("gather: dimension {} is both collapsed and an operand batching dimension", d));
  }
  for (int64_t d : dn.operand_batching_dims) {
    if (ss[size_t(d)] > 1)
      throw ShapeError(
          fmt::format("gather: operand batching dimension {} must have slice size <= 1, got {}", d, ss[size_t(d)]));
    if (contains(dn.start_index_map, d))
      throw ShapeError(fmt::format("gather: operand batching dimension {} may not appear in start_index_map={}", d,
                                   tuple_str(dn.start_index_map)));
  }
  if (int64_t(dn.start_index_map.size()) != g.K)
    throw ShapeError(
        fmt::format("gather: start_index_map={} has {} entries but the index vector (last dimension of "
                    "indices of shape {}) has length {}",
                    tuple_str(dn.start_index_map), dn.start_index_map.size(), shape_str(is), g.K));
  if (dn.operand_batching_dims.size() != dn.start_indices_batching_dims.size())
    throw ShapeError(
        fmt::format("gather: operand_batching_dims={} and start_indices_batching_dims={} must have the "
                    "same length",
                    tuple_str(dn.operand_batching_dims), tuple_str(dn.start_indices_batching_dims)));
  for (size_t i = 0; i < dn.operand_batching_dims.size(); ++i) {
    int64_t od = dn.operand_batching_dims[i], id = dn.start_indices_batching_dims[i];
    if (os[size_t(od)] != is[size_t(id)])
      throw ShapeError(
          fmt::format("gather: operand batching dimension {} (size {}) and indices batching dimension {} "
                      "(size {}) must have equal sizes (operand {}, indices {})",
                      od, os[size_t(od)], id, is[size_t(id)], shape_str(os), shape_str(is)));
  }
  int64_t n_window = R - int64_t(dn.collapsed_slice_dims.size()) - int64_t(dn.operand_batching_dims.size());
  if (int64_t(dn.offset_dims.size()) != n_window)
    throw ShapeError(
        fmt::format("gather: offset_dims={} must have one entry per operand dimension that is neither "
                    "collapsed nor batching ({} of them for rank {}, collapsed_slice_dims={}, "
                    "operand_batching_dims={})",
                    tuple_str(dn.offset_dims), n_window, R, tuple_str(dn.collapsed_slice_dims),
                    tuple_str(dn.operand_batching_dims)));
  int64_t out_rank = nb + n_window;
  check_dims(P, "offset_dims", dn.offset_dims, out_rank, true, "an output of rank");
  g.out_shape.assign(size_t(out_rank), 0);
  size_t m = 0;
  for (int64_t d = 0; d < R; ++d) {
    if (contains(dn.collapsed_slice_dims, d) || contains(dn.operand_batching_dims, d)) continue;
    g.out_shape[size_t(dn.offset_dims[m++])] = ss[size_t(d)];
  }
  size_t k = 0;
  for (int64_t j = 0; j < out_rank; ++j) {
    if (contains(dn.offset_dims, j)) continue;
    g.batch_out_dims.push_back(j);
    g.out_shape[size_t(j)] = g.batch_shape[k++];
  }
  return g;
}

namespace {

Params make_gather_params(const lax::GatherDimensionNumbers& dn, const std::vector<int64_t>& slice_sizes,
                          GatherScatterMode mode, std::optional<double> fill_value, bool sorted, bool unique) {
  Params p;
  p.set("dimension_numbers", std::make_shared<const GatherDimensionNumbersParam>(dn));
  p.set("fill_value", fill_value ? ParamValue(*fill_value) : ParamValue(std::monostate{}));
  p.set("indices_are_sorted", sorted);
  p.set("mode", std::make_shared<const GatherScatterModeParam>(mode));
  p.set("slice_sizes", slice_sizes);
  p.set("unique_indices", unique);
  return p;
}

const PrimitiveDef& g_gather = register_primitive([] {
  PrimitiveDef def;
  def.name = "gather";
  def.kind = PrimKind::Indexing;
  def.arity = Arity::exactly(2);  // operand, indices
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    GatherGeom g = gather_geometry(in[0], in[1], gather_dimension_numbers(p), p.ints("slice_sizes"));
    return {AbstractValue{g.out_shape, in[0].dtype(), in[0].weak_type(), {}}};
  };
  return def;
}());

// ---------------------------------------------------------------- scatter
}  // namespace

ScatterGeom scatter_geometry(std::string_view P, const Array& operand, const Array& indices, const Array& updates,
                             const lax::ScatterDimensionNumbers& dn) {
  check_index_dtype(P, indices);
  if (updates.dtype() != operand.dtype())
    throw DTypeError(
        fmt::format("{}: updates must have the operand's dtype, got operand {} and updates {} (convert "
                    "the updates with astype)",
                    P, dtype_name(operand.dtype()), dtype_name(updates.dtype())));
  const Shape& os = operand.shape();
  const Shape& is = indices.shape();
  const Shape& us = updates.shape();
  int64_t R = operand.ndim(), nb = int64_t(is.size()) - 1, UR = updates.ndim();
  ScatterGeom g;
  g.K = is.back();
  g.batch_shape.assign(is.begin(), is.end() - 1);
  check_dims(P, "update_window_dims", dn.update_window_dims, UR, true, "updates of rank");
  check_dims(P, "inserted_window_dims", dn.inserted_window_dims, R, true, "an operand of rank");
  check_dims(P, "operand_batching_dims", dn.operand_batching_dims, R, true, "an operand of rank");
  check_dims(P, "scatter_dims_to_operand_dims", dn.scatter_dims_to_operand_dims, R, false, "an operand of rank");
  check_dims(P, "scatter_indices_batching_dims", dn.scatter_indices_batching_dims, nb, false,
             "the batch dimensions of indices, count");
  if (int64_t(dn.scatter_dims_to_operand_dims.size()) != g.K)
    throw ShapeError(
        fmt::format("{}: scatter_dims_to_operand_dims={} has {} entries but the index vector (last "
                    "dimension of indices of shape {}) has length {}",
                    P, tuple_str(dn.scatter_dims_to_operand_dims), dn.scatter_dims_to_operand_dims.size(),
                    shape_str(is), g.K));
  for (int64_t d : dn.inserted_window_dims)
    if (contains(dn.operand_batching_dims, d))
      throw ShapeError(
          fmt::format("{}: dimension {} is both an inserted window and an operand batching dimension", P, d));
  for (int64_t d : dn.operand_batching_dims)
    if (contains(dn.scatter_dims_to_operand_dims, d))
      throw ShapeError(
          fmt::format("{}: operand batching dimension {} may not appear in scatter_dims_to_operand_dims={}", P, d,
                      tuple_str(dn.scatter_dims_to_operand_dims)));
  if (dn.operand_batching_dims.size() != dn.scatter_indices_batching_dims.size())
    throw ShapeError(
        fmt::format("{}: operand_batching_dims={} and scatter_indices_batching_dims={} must have the same "
                    "length",
                    P, tuple_str(dn.operand_batching_dims), tuple_str(dn.scatter_indices_batching_dims)));
  for (size_t i = 0; i < dn.operand_batching_dims.size(); ++i) {
    int64_t od = dn.operand_batching_dims[i], id = dn.scatter_indices_batching_dims[i];
    if (os[size_t(od)] != is[size_t(id)])
      throw ShapeError(
          fmt::format("{}: operand batching dimension {} (size {}) and indices batching dimension {} (size "
                      "{}) must have equal sizes",
                      P, od, os[size_t(od)], id, is[size_t(id)]));
  }
  int64_t n_window = R - int64_t(dn.inserted_window_dims.size()) - int64_t(dn.operand_batching_dims.size());
  if (int64_t(dn.update_window_dims.size()) != n_window)
    throw ShapeError(
        fmt::format("{}: update_window_dims={} must have one entry per operand dimension that is neither "
                    "inserted nor batching ({} for operand rank {})",
                    P, tuple_str(dn.update_window_dims), n_window, R));
  if (UR != n_window + nb)
    throw ShapeError(
        fmt::format("{}: updates of shape {} must have rank {} ({} window dims + {} scatter dims of "
                    "indices {})",
                    P, shape_str(us), n_window + nb, n_window, nb, shape_str(is)));
  for (int64_t j = 0; j < UR; ++j)
    if (!contains(dn.update_window_dims, j)) g.update_scatter_dims.push_back(j);
  for (int64_t k = 0; k < nb; ++k)
    if (us[size_t(g.update_scatter_dims[size_t(k)])] != is[size_t(k)])
      throw ShapeError(
          fmt::format("{}: updates of shape {} do not match indices of shape {}: update scatter dimension "
                      "{} has size {} but indices dimension {} has size {}",
                      P, shape_str(us), shape_str(is), g.update_scatter_dims[size_t(k)],
                      us[size_t(g.update_scatter_dims[size_t(k)])], k, is[size_t(k)]));
  std::vector<int64_t> ustr = row_major_strides(us);
  g.window.assign(size_t(R), 1);
  g.upd_stride_of_dim.assign(size_t(R), 0);
  size_t m = 0;
  for (int64_t d = 0; d < R; ++d) {
    if (contains(dn.inserted_window_dims, d) || contains(dn.operand_batching_dims, d)) continue;
    int64_t ud = dn.update_window_dims[m++];
    g.window[size_t(d)] = us[size_t(ud)];
    g.upd_stride_of_dim[size_t(d)] = ustr[size_t(ud)];
    if (us[size_t(ud)] > os[size_t(d)])
      throw ShapeError(
          fmt::format("{}: update window dimension {} (size {}) exceeds operand dimension {} (size {}); "
                      "updates {} vs operand {}",
                      P, ud, us[size_t(ud)], d, os[size_t(d)], shape_str(us), shape_str(os)));
  }
  return g;
}

namespace {}  // namespace

const char* scatter_name(ScatterKind k) {
  switch (k) {
    case ScatterKind::Set: return "scatter";
    case ScatterKind::Add: return "scatter-add";
    case ScatterKind::Mul: return "scatter-mul";
    case ScatterKind::Min: return "scatter-min";
    case ScatterKind::Max: return "scatter-max";
  }
  return "scatter";
}

namespace {

template <ScatterKind kind>
PrimitiveDef make_scatter_def() {
  PrimitiveDef def;
  def.name = scatter_name(kind);
  def.kind = PrimKind::Indexing;
  def.arity = Arity::exactly(3);  // operand, indices, updates
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const char* name = scatter_name(kind);
    scatter_geometry(name, in[0], in[1], in[2], scatter_dimension_numbers(p));
    return {AbstractValue{in[0].shape(), in[0].dtype(), in[0].weak_type(), {}}};
  };
  return def;
}

const PrimitiveDef& g_scatter = register_primitive(make_scatter_def<ScatterKind::Set>());
const PrimitiveDef& g_scatter_add = register_primitive(make_scatter_def<ScatterKind::Add>());
const PrimitiveDef& g_scatter_mul = register_primitive(make_scatter_def<ScatterKind::Mul>());
const PrimitiveDef& g_scatter_min = register_primitive(make_scatter_def<ScatterKind::Min>());
const PrimitiveDef& g_scatter_max = register_primitive(make_scatter_def<ScatterKind::Max>());

}  // namespace

// ---------------------------------------------------------------- params
std::string gather_scatter_mode_str(lax::GatherScatterMode m) {
  switch (m) {
    case GatherScatterMode::clip: return "GatherScatterMode.CLIP";
    case GatherScatterMode::fill_or_drop: return "GatherScatterMode.FILL_OR_DROP";
    case GatherScatterMode::promise_in_bounds: return "GatherScatterMode.PROMISE_IN_BOUNDS";
  }
  return "GatherScatterMode.FILL_OR_DROP";
}

std::string GatherDimensionNumbersParam::str() const {
  return fmt::format(
      "GatherDimensionNumbers(offset_dims={}, collapsed_slice_dims={}, start_index_map={}, "
      "operand_batching_dims={}, start_indices_batching_dims={})",
      tuple_str(dn.offset_dims), tuple_str(dn.collapsed_slice_dims), tuple_str(dn.start_index_map),
      tuple_str(dn.operand_batching_dims), tuple_str(dn.start_indices_batching_dims));
}
size_t GatherDimensionNumbersParam::hash() const {
  return absl::HashOf(std::string_view("gdn"), dn.offset_dims, dn.collapsed_slice_dims, dn.start_index_map,
                      dn.operand_batching_dims, dn.start_indices_batching_dims);
}
bool GatherDimensionNumbersParam::equals(const ParamObject& other) const {
  auto* o = dynamic_cast<const GatherDimensionNumbersParam*>(&other);
  return o && o->dn.offset_dims == dn.offset_dims && o->dn.collapsed_slice_dims == dn.collapsed_slice_dims &&
         o->dn.start_index_map == dn.start_index_map && o->dn.operand_batching_dims == dn.operand_batching_dims &&
         o->dn.start_indices_batching_dims == dn.start_indices_batching_dims;
}
std::string ScatterDimensionNumbersParam::str() const {
  return fmt::format(
      "ScatterDimensionNumbers(update_window_dims={}, inserted_window_dims={}, "
      "scatter_dims_to_operand_dims={}, operand_batching_dims={}, scatter_indices_batching_dims={})",
      tuple_str(dn.update_window_dims), tuple_str(dn.inserted_window_dims), tuple_str(dn.scatter_dims_to_operand_dims),
      tuple_str(dn.operand_batching_dims), tuple_str(dn.scatter_indices_batching_dims));
}
size_t ScatterDimensionNumbersParam::hash() const {
  return absl::HashOf(std::string_view("sdn"), dn.update_window_dims, dn.inserted_window_dims,
                      dn.scatter_dims_to_operand_dims, dn.operand_batching_dims, dn.scatter_indices_batching_dims);
}
bool ScatterDimensionNumbersParam::equals(const ParamObject& other) const {
  auto* o = dynamic_cast<const ScatterDimensionNumbersParam*>(&other);
  return o && o->dn.update_window_dims == dn.update_window_dims &&
         o->dn.inserted_window_dims == dn.inserted_window_dims &&
         o->dn.scatter_dims_to_operand_dims == dn.scatter_dims_to_operand_dims &&
         o->dn.operand_batching_dims == dn.operand_batching_dims &&
         o->dn.scatter_indices_batching_dims == dn.scatter_indices_batching_dims;
}
std::string GatherScatterModeParam::str() const { return gather_scatter_mode_str(mode); }
size_t GatherScatterModeParam::hash() const { return absl::HashOf(std::string_view("gsm"), int(mode)); }
bool GatherScatterModeParam::equals(const ParamObject& other) const {
  auto* o = dynamic_cast<const GatherScatterModeParam*>(&other);
  return o && o->mode == mode;
}

const lax::GatherDimensionNumbers& gather_dimension_numbers(const Params& p) {
  return p.object<GatherDimensionNumbersParam>("dimension_numbers")->dn;
}
const lax::ScatterDimensionNumbers& scatter_dimension_numbers(const Params& p) {
  return p.object<ScatterDimensionNumbersParam>("dimension_numbers")->dn;
}
std::optional<LeadingBatchGather> leading_batch_gather(const Array& operand, const Array& indices, const Params& p) {
  const auto& dn = gather_dimension_numbers(p);
  const auto& ss = p.ints("slice_sizes");
  GatherGeom g = gather_geometry(operand, indices, dn, ss);
  if (!dn.operand_batching_dims.empty()) return std::nullopt;
  for (size_t k = 0; k < g.batch_out_dims.size(); ++k)
    if (g.batch_out_dims[k] != int64_t(k)) return std::nullopt;
  const Shape& os = operand.shape();
  std::vector<int64_t> istr = row_major_strides(os);
  LeadingBatchGather out;
  out.batches = shape_size(g.batch_shape);
  out.window = ss;
  out.window_size = shape_size(ss);
  out.window_strides = istr;
  out.K = g.K;
  for (int64_t k = 0; k < g.K; ++k) {
    int64_t d = dn.start_index_map[size_t(k)];
    out.hi.push_back(os[size_t(d)] - ss[size_t(d)]);
    out.start_stride.push_back(istr[size_t(d)]);
  }
  out.fill_mode = gather_scatter_mode(p) == lax::GatherScatterMode::fill_or_drop;
  visit_dtype(operand.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T fill = gather_fill<T>(gather_fill_value(p));
    std::memcpy(&out.fill_bits, &fill, sizeof(T));
  });
  return out;
}

std::optional<LeadingBatchScatter> leading_batch_scatter(const Array& operand, const Array& indices,
                                                         const Array& updates, const Params& p) {
  const auto& dn = scatter_dimension_numbers(p);
  ScatterGeom g = scatter_geometry("scatter", operand, indices, updates, dn);
  if (!dn.operand_batching_dims.empty()) return std::nullopt;
  for (size_t k = 0; k < g.update_scatter_dims.size(); ++k)
    if (g.update_scatter_dims[k] != int64_t(k)) return std::nullopt;
  LeadingBatchScatter out;
  out.batches = shape_size(g.batch_shape);
  out.K = g.K;
  out.window = g.window;
  out.update_stride = g.upd_stride_of_dim;
  out.window_size = 1;
  for (int64_t w : g.window) out.window_size *= w;
  for (int64_t k = 0; k < g.K; ++k) {
    int64_t d = dn.scatter_dims_to_operand_dims[size_t(k)];
    if (g.window[size_t(d)] != 1) return std::nullopt;
    out.dims.push_back(d);
    out.hi.push_back(operand.shape()[size_t(d)] - 1);
  }
  out.clip = gather_scatter_mode(p) == lax::GatherScatterMode::clip;
  return out;
}

lax::GatherScatterMode gather_scatter_mode(const Params& p) { return p.object<GatherScatterModeParam>("mode")->mode; }
std::optional<double> gather_fill_value(const Params& p) {
  if (!p.has("fill_value")) return std::nullopt;
  const ParamValue& v = p.at("fill_value");
  if (auto* d = std::get_if<double>(&v)) return *d;
  if (auto* i = std::get_if<int64_t>(&v)) return double(*i);
  if (auto* b = std::get_if<bool>(&v)) return *b ? 1.0 : 0.0;
  return std::nullopt;
}

Params gather_params(const lax::GatherDimensionNumbers& dn, const std::vector<int64_t>& slice_sizes,
                     lax::GatherScatterMode mode, std::optional<double> fill_value, bool indices_are_sorted,
                     bool unique_indices) {
  return make_gather_params(dn, slice_sizes, mode, fill_value, indices_are_sorted, unique_indices);
}
Params scatter_params(const lax::ScatterDimensionNumbers& dn, lax::GatherScatterMode mode, bool indices_are_sorted,
                      bool unique_indices) {
  Params p;
  p.set("dimension_numbers", std::make_shared<const ScatterDimensionNumbersParam>(dn));
  p.set("indices_are_sorted", indices_are_sorted);
  p.set("mode", std::make_shared<const GatherScatterModeParam>(mode));
  p.set("unique_indices", unique_indices);
  p.set("update_consts", std::vector<int64_t>{});
  p.set("update_jaxpr", std::monostate{});
  return p;
}

Array gather_with(const Array& operand, const Array& indices, const lax::GatherDimensionNumbers& dn,
                  const std::vector<int64_t>& slice_sizes, lax::GatherScatterMode mode,
                  std::optional<double> fill_value, bool indices_are_sorted, bool unique_indices) {
  return bind1(prims::gather(), {operand, indices},
               gather_params(dn, slice_sizes, mode, fill_value, indices_are_sorted, unique_indices));
}
Array scatter_with(ScatterKind kind, const Array& operand, const Array& indices, const Array& updates,
                   const lax::ScatterDimensionNumbers& dn, lax::GatherScatterMode mode, bool indices_are_sorted,
                   bool unique_indices) {
  return bind1(prims::scatter_kind(kind), {operand, indices, updates},
               scatter_params(dn, mode, indices_are_sorted, unique_indices));
}

namespace prims {
const PrimitiveDef& gather() { return g_gather; }
const PrimitiveDef& scatter() { return g_scatter; }
const PrimitiveDef& scatter_add() { return g_scatter_add; }
const PrimitiveDef& scatter_mul() { return g_scatter_mul; }
const PrimitiveDef& scatter_min() { return g_scatter_min; }
const PrimitiveDef& scatter_max() { return g_scatter_max; }
const PrimitiveDef& scatter_kind(ScatterKind k) {
  switch (k) {
    case ScatterKind::Set: return g_scatter;
    case ScatterKind::Add: return g_scatter_add;
    case ScatterKind::Mul: return g_scatter_mul;
    case ScatterKind::Min: return g_scatter_min;
    case ScatterKind::Max: return g_scatter_max;
  }
  return g_scatter;
}
}  // namespace prims

namespace lax {
Array gather(const Array& operand, const Array& start_indices, const GatherDimensionNumbers& dimension_numbers,
             const std::vector<int64_t>& slice_sizes, GatherScatterMode mode, std::optional<double> fill_value) {
  return gather_with(operand, start_indices, dimension_numbers, slice_sizes, mode, fill_value, false, false);
}
#define CJAX_LAX_SCATTER(fn, K)                                                                                    \
  Array fn(const Array& operand, const Array& scatter_indices, const Array& updates,                               \
           const ScatterDimensionNumbers& dimension_numbers, GatherScatterMode mode) {                             \
    return scatter_with(ScatterKind::K, operand, scatter_indices, updates, dimension_numbers, mode, false, false); \
  }
CJAX_LAX_SCATTER(scatter_add, Add)
CJAX_LAX_SCATTER(scatter, Set)
CJAX_LAX_SCATTER(scatter_mul, Mul)
CJAX_LAX_SCATTER(scatter_min, Min)
CJAX_LAX_SCATTER(scatter_max, Max)
#undef CJAX_LAX_SCATTER
}  // namespace lax

}  // namespace cjax
