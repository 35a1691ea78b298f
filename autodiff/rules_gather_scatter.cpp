// JVP, transpose and batching rules of gather and the scatters (core/lax/gather_scatter.cpp), ported
// from JAX's slicing.py:
//  * gather is linear in its operand; its transpose is a scatter-add into zeros.
//  * scatter-add is linear in operand and updates (the updates' cotangent is a gather).
//  * scatter (overwrite) uses JAX's _scatter_jvp: with unique_indices the tangents are scattered
//    the same way; otherwise each update gets an id, the ids are scattered to find which update
//    won each slot, and primal and tangent are rebuilt as masked scatter-adds (so no scatter
//    transpose is needed). Its transpose exists for unique_indices only, as in JAX.
//  * scatter-mul: the operand tangent is scatter-mul(t, i, u). For the updates JAX requires
//    unique_indices; we also handle repeated indices: d out[j] / d u_i = x[j] * prod of the other
//    updates to slot j, computed from the product of the non-zero updates and their zero count
//    (exact for zeros too).
//  * scatter-min/max: JAX's _scatter_extremal_jvp (ties share the tangent equally).
//  * batching of all: the mapped dimension becomes an operand/indices batching dimension (both
//    mapped) or an extra window or index dimension (one mapped), as JAX's batching rules.
#include <fmt/format.h>

#include <algorithm>

#include "autodiff/rule_helpers.h"
#include "core/lax/gather_scatter.h"
#include "core/lax/rule_support.h"

namespace cjax {
namespace {

using Dims = std::vector<int64_t>;
using lax::GatherDimensionNumbers;
using lax::GatherScatterMode;
using lax::ScatterDimensionNumbers;

bool contains(const Dims& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }
Dims plus_one(const Dims& v) {
  Dims out;
  for (int64_t x : v) out.push_back(x + 1);
  return out;
}
Dims prepend(int64_t x, Dims v) {
  v.insert(v.begin(), x);
  return v;
}
Array scalar_like(double v, const Array& x) { return make_scalar(v, x.dtype()); }
Array full_like_aval(double v, const AbstractValue& aval) {
  return lax::broadcast_in_dim(make_scalar(v, aval.dtype), aval.shape, {});
}

struct ScatterInfo {
  ScatterDimensionNumbers dn;
  GatherScatterMode mode;
  bool sorted, unique;
};
ScatterInfo scatter_info(const Params& p) {
  return {scatter_dimension_numbers(p), gather_scatter_mode(p), p.get<bool>("indices_are_sorted"),
          p.get<bool>("unique_indices")};
}

// The gather that reads back, for every update element, the operand slot it scatters to.
struct InverseGather {
  GatherDimensionNumbers dn;
  Dims slice_sizes;
};
InverseGather inverse_gather(const ScatterDimensionNumbers& s, int64_t operand_rank, const Shape& updates_shape) {
  InverseGather g;
  g.dn = {s.update_window_dims, s.inserted_window_dims, s.scatter_dims_to_operand_dims, s.operand_batching_dims,
          s.scatter_indices_batching_dims};
  size_t pos = 0;
  for (int64_t i = 0; i < operand_rank; ++i) {
    if (contains(s.inserted_window_dims, i) || contains(s.operand_batching_dims, i))
      g.slice_sizes.push_back(1);
    else
      g.slice_sizes.push_back(updates_shape[size_t(s.update_window_dims[pos++])]);
  }
  return g;
}
// Gathers `x` (operand-shaped) at the scatter's indices into the updates' shape; out-of-bounds
// slots (dropped by the scatter) read zero.
Array gather_at_updates(const Array& x, const Array& indices, const ScatterInfo& s, const Shape& updates_shape,
                        bool sorted = false, bool unique = false) {
  InverseGather g = inverse_gather(s.dn, x.ndim(), updates_shape);
  return gather_with(x, indices, g.dn, g.slice_sizes, s.mode, 0.0, sorted, unique);
}
Array scatter_as(ScatterKind kind, const Array& operand, const Array& indices, const Array& updates,
                 const ScatterInfo& s, std::optional<bool> unique = std::nullopt) {
  return scatter_with(kind, operand, indices, updates, s.dn, s.mode, s.sorted, unique.value_or(s.unique));
}

// ---------------------------------------------------------------- gather

JvpOut gather_jvp(std::span<const Array> p, std::span<const Array> t, const Params& params) {
  Array out = bind1(prims::gather(), p, params);
  if (!t[0].defined()) return {{out}, {Array()}};
  Params tp = params;
  tp.set("fill_value", 0.0);
  return {{out}, {bind1(prims::gather(), {t[0], p[1]}, tp)}};
}

std::vector<Array> gather_transpose(std::span<const Array> cts, std::span<const Array> args, const Params& params) {
  if (!is_undefined_primal(args[0])) return {Array(), Array()};
  const GatherDimensionNumbers& g = gather_dimension_numbers(params);
  ScatterDimensionNumbers s{g.offset_dims, g.collapsed_slice_dims, g.start_index_map, g.operand_batching_dims,
                            g.start_indices_batching_dims};
  // The zeros take the cotangent's dtype, which may be wider than the primal's (as in JAX).
  AbstractValue zeros_aval{args[0].aval().shape, cts[0].dtype(), false, {}};
  Array ct =
      scatter_with(ScatterKind::Add, zeros_like_aval(zeros_aval), args[1], cts[0], s, gather_scatter_mode(params),
                   params.get<bool>("indices_are_sorted"), params.get<bool>("unique_indices"));
  return {ct, Array()};
}

BatchOut gather_batch(std::span<const Array> a, std::span<const int> bd, const BatchAxis& axis, const Params& params) {
  const GatherDimensionNumbers& g = gather_dimension_numbers(params);
  Dims slice_sizes = params.ints("slice_sizes");
  GatherScatterMode mode = gather_scatter_mode(params);
  std::optional<double> fill = gather_fill_value(params);
  bool sorted = params.get<bool>("indices_are_sorted"), unique = params.get<bool>("unique_indices");
  int obd = bd[0], ibd = bd[1];
  if (obd == kNotMapped && ibd == kNotMapped) return {{bind1(prims::gather(), a, params)}, {kNotMapped}};
  if (ibd == kNotMapped) {
    // The mapped operand dimension becomes a leading window dimension.
    Array operand = move_bdim(a[0], obd, 0, axis.size);
    GatherDimensionNumbers n{prepend(0, plus_one(g.offset_dims)), plus_one(g.collapsed_slice_dims),
                             plus_one(g.start_index_map), plus_one(g.operand_batching_dims),
                             g.start_indices_batching_dims};
    return {{gather_with(operand, a[1], n, prepend(axis.size, slice_sizes), mode, fill, sorted, unique)}, {0}};
  }
  Array indices = move_bdim(a[1], ibd, 0, axis.size);
  if (obd == kNotMapped) {
    // Mapped indices add a leading batch dimension to the output.
    GatherDimensionNumbers n{plus_one(g.offset_dims), g.collapsed_slice_dims, g.start_index_map,
                             g.operand_batching_dims, plus_one(g.start_indices_batching_dims)};
    return {{gather_with(a[0], indices, n, slice_sizes, mode, fill, false, false)}, {0}};
  }
  Array operand = move_bdim(a[0], obd, 0, axis.size);
  GatherDimensionNumbers n{plus_one(g.offset_dims), plus_one(g.collapsed_slice_dims), plus_one(g.start_index_map),
                           prepend(0, plus_one(g.operand_batching_dims)),
                           prepend(0, plus_one(g.start_indices_batching_dims))};
  Dims sizes = prepend(axis.size == 0 ? 0 : 1, slice_sizes);
  return {{gather_with(operand, indices, n, sizes, mode, fill, sorted, unique)}, {0}};
}

// ---------------------------------------------------------------- scatters

JvpOut scatter_add_jvp(std::span<const Array> p, std::span<const Array> t, const Params& params) {
  Array out = bind1(prims::scatter_add(), p, params);
  if (!t[0].defined() && !t[2].defined()) return {{out}, {Array()}};
  Array t_operand = instantiate_zero(t[0], p[0].aval()), t_updates = instantiate_zero(t[2], p[2].aval());
  return {{out}, {bind1(prims::scatter_add(), {t_operand, p[1], t_updates}, params)}};
}

std::vector<Array> scatter_add_transpose(std::span<const Array> cts, std::span<const Array> args,
                                         const Params& params) {
  std::vector<Array> r(3);
  if (is_undefined_primal(args[0])) r[0] = cts[0];
  if (is_undefined_primal(args[2]))
    r[2] = gather_at_updates(cts[0], args[1], scatter_info(params), args[2].aval().shape,
                             params.get<bool>("indices_are_sorted"), params.get<bool>("unique_indices"));
  return r;
}

JvpOut scatter_jvp(std::span<const Array> p, std::span<const Array> t, const Params& params) {
  const Array &operand = p[0], &indices = p[1], &updates = p[2];
  if (!t[0].defined() && !t[2].defined()) return {{bind1(prims::scatter(), p, params)}, {Array()}};
  Array g_operand = instantiate_zero(t[0], operand.aval()), g_updates = instantiate_zero(t[2], updates.aval());
  ScatterInfo s = scatter_info(params);
  if (s.unique) {
    return {{bind1(prims::scatter(), p, params)}, {bind1(prims::scatter(), {g_operand, indices, g_updates}, params)}};
  }
  // a) a positive id per update (shared across its window), scattered like the updates;
  Shape ids_shape = updates.shape();
  for (int64_t d : s.dn.update_window_dims) ids_shape[size_t(d)] = 1;
  int64_t num_ids = 1;
  for (int64_t d : ids_shape) num_ids *= d;
  DType id_dtype = DType::int32;
  Dims all_dims;
  for (int64_t d = 0; d < updates.ndim(); ++d) all_dims.push_back(d);
  Array update_ids =
      lax::add(lax::broadcast_in_dim(lax::reshape(lax::iota(id_dtype, num_ids), ids_shape), updates.shape(), all_dims),
               full_like_aval(1, AbstractValue{updates.shape(), id_dtype, false, {}}));
  Array no_ids = full_like_aval(0, AbstractValue{operand.shape(), id_dtype, false, {}});
  Array scattered_ids = scatter_as(ScatterKind::Set, no_ids, indices, update_ids, s);
  // b) the id that won each update's slot; c) masks of the surviving operand and update entries;
  Array gathered_ids = gather_at_updates(scattered_ids, indices, s, updates.shape());
  Array operand_kept = lax::eq(scattered_ids, scalar_like(0, scattered_ids));
  Array update_won = lax::eq(update_ids, gathered_ids);
  auto mask = [](const Array& keep, const Array& x) { return lax::select(keep, x, full_like_aval(0, x.aval())); };
  // d) scatter-adds of the masked values.
  Array out = scatter_as(ScatterKind::Add, mask(operand_kept, operand), indices, mask(update_won, updates), s);
  Array tangent = scatter_as(ScatterKind::Add, mask(operand_kept, g_operand), indices, mask(update_won, g_updates), s);
  return {{out}, {tangent}};
}

std::vector<Array> scatter_transpose(std::span<const Array> cts, std::span<const Array> args, const Params& params) {
  ScatterInfo s = scatter_info(params);
  if (!s.unique)
    throw ValueError(
        "scatter transpose is only implemented where unique_indices=True (as in JAX); differentiate "
        "the scatter itself (its JVP handles repeated indices) instead of transposing it");
  std::vector<Array> r(3);
  const AbstractValue& updates_aval = args[2].aval();
  if (is_undefined_primal(args[0]))
    r[0] = scatter_as(ScatterKind::Set, cts[0], args[1],
                      full_like_aval(0, AbstractValue{updates_aval.shape, cts[0].dtype(), false, {}}), s, true);
  if (is_undefined_primal(args[2]))
    r[2] = gather_at_updates(cts[0], args[1], s, updates_aval.shape, s.sorted, s.unique);
  return r;
}

// d(prod of the updates to slot j) / d u_i for every update element i: the product of the other
// updates to the same slot.
Array product_of_others(const Array& x, const Array& indices, const Array& u, const ScatterInfo& s) {
  Array zero = scalar_like(0, u), one = scalar_like(1, u);
  auto full = [&](const Array& v, const Array& like) { return lax::broadcast_in_dim(v, like.shape(), {}); };
  Array is_zero = lax::eq(u, full(zero, u));
  Array nonzero_u = lax::select(is_zero, full(one, u), u);
  Array prod_nonzero = scatter_as(ScatterKind::Mul, full(one, x), indices, nonzero_u, s);
  Array zero_flags = lax::select(is_zero, full(one, u), full(zero, u));
  Array zero_count = scatter_as(ScatterKind::Add, full(zero, x), indices, zero_flags, s);
  Array prod_g = gather_at_updates(prod_nonzero, indices, s, u.shape());
  Array count_g = gather_at_updates(zero_count, indices, s, u.shape());
  Array if_zero = lax::select(lax::eq(count_g, full(one, u)), prod_g, full(zero, u));
  Array if_nonzero = lax::select(lax::eq(count_g, full(zero, u)), lax::div(prod_g, nonzero_u), full(zero, u));
  return lax::select(is_zero, if_zero, if_nonzero);
}

JvpOut scatter_mul_jvp(std::span<const Array> p, std::span<const Array> t, const Params& params) {
  const Array &x = p[0], &indices = p[1], &u = p[2];
  Array out = bind1(prims::scatter_mul(), p, params);
  ScatterInfo s = scatter_info(params);
  Array from_operand = t[0].defined() ? bind1(prims::scatter_mul(), {t[0], indices, u}, params) : Array();
  Array from_updates;
  if (t[2].defined()) {
    Array zeros = zeros_like_aval(x.aval());
    Array scaled = s.unique ? t[2] : lax::mul(t[2], product_of_others(x, indices, u, s));
    from_updates = lax::mul(x, scatter_as(ScatterKind::Add, zeros, indices, scaled, s));
  }
  return {{out}, {add_tangents(from_operand, from_updates)}};
}

std::vector<Array> scatter_mul_transpose(std::span<const Array> cts, std::span<const Array> args,
                                         const Params& params) {
  ScatterInfo s = scatter_info(params);
  std::vector<Array> r(3);
  if (is_undefined_primal(args[0])) {
    if (is_undefined_primal(args[2]))
      throw ValueError("scatter-mul is not linear in operand and updates together; transpose needs the updates known");
    r[0] = scatter_as(ScatterKind::Mul, cts[0], args[1], args[2], s);
  }
  if (is_undefined_primal(args[2])) {
    if (!s.unique)
      throw ValueError(
          "scatter_mul transpose with respect to the updates is only implemented where "
          "unique_indices=True (as in JAX)");
    r[2] = gather_at_updates(lax::mul(cts[0], args[0]), args[1], s, args[2].aval().shape);
  }
  return r;
}

JvpOut scatter_extremal_jvp(const PrimitiveDef& prim, std::span<const Array> p, std::span<const Array> t,
                            const Params& params) {
  const Array &operand = p[0], &indices = p[1], &updates = p[2];
  Array out = bind1(prim, p, params);
  if (!t[0].defined() && !t[2].defined()) return {{out}, {Array()}};
  Array g_operand = instantiate_zero(t[0], operand.aval()), g_updates = instantiate_zero(t[2], updates.aval());
  ScatterInfo s = scatter_info(params);
  auto full = [](double v, const Array& like) { return full_like_aval(v, like.aval()); };
  const Shape& us = updates.shape();
  Array initial_vals = gather_at_updates(operand, indices, s, us);
  Array target_vals = gather_at_updates(out, indices, s, us);
  Array successful = lax::eq(updates, target_vals);
  Array retained = lax::eq(initial_vals, target_vals);
  Array zeros_op = full(0, operand);
  Array num_updates =
      gather_at_updates(scatter_as(ScatterKind::Add, zeros_op, indices,
                                   lax::select(successful, full(1, updates), full(0, updates)), s, false),
                        indices, s, us);
  Array num_refs =
      gather_at_updates(scatter_as(ScatterKind::Add, zeros_op, indices, full(1, updates), s, false), indices, s, us);
  Array one = scalar_like(1, num_updates);
  Array inv_plus_one = lax::div(one, lax::add(num_updates, one)), inv = lax::div(one, num_updates);
  Array updates_coef = lax::select(successful, lax::select(retained, inv_plus_one, inv), full(0, updates));
  Array operand_normalizer = lax::select(retained, inv_plus_one, full(0, num_updates));
  Array operand_coef = lax::div(lax::add(scalar_like(-1, operand_normalizer), operand_normalizer), num_refs);
  Array target_tangents = gather_at_updates(g_operand, indices, s, us);
  Array tangent_updates = lax::add(lax::mul(target_tangents, operand_coef), lax::mul(g_updates, updates_coef));
  return {{out}, {scatter_as(ScatterKind::Add, g_operand, indices, tangent_updates, s)}};
}

BatchOut scatter_batch(const PrimitiveDef& prim, std::span<const Array> a, std::span<const int> bd,
                       const BatchAxis& axis, const Params& params) {
  if (bd[0] == kNotMapped && bd[1] == kNotMapped && bd[2] == kNotMapped)
    return {{bind1(prim, a, params)}, {kNotMapped}};
  ScatterInfo s = scatter_info(params);
  const ScatterDimensionNumbers& d = s.dn;
  Array operand = move_bdim(a[0], bd[0], 0, axis.size);
  Array updates = move_bdim(a[2], bd[2], 0, axis.size);
  ScatterDimensionNumbers n;
  Array indices = a[1];
  if (bd[1] == kNotMapped) {
    n = {prepend(0, plus_one(d.update_window_dims)), plus_one(d.inserted_window_dims),
         plus_one(d.scatter_dims_to_operand_dims), plus_one(d.operand_batching_dims), d.scatter_indices_batching_dims};
  } else {
    indices = move_bdim(a[1], bd[1], 0, axis.size);
    n = {plus_one(d.update_window_dims), plus_one(d.inserted_window_dims), plus_one(d.scatter_dims_to_operand_dims),
         prepend(0, plus_one(d.operand_batching_dims)), prepend(0, plus_one(d.scatter_indices_batching_dims))};
  }
  return {{bind1(prim, {operand, indices, updates}, scatter_params(n, s.mode, s.sorted, s.unique))}, {0}};
}

const bool registered = add_rule_initializer([] {
  PrimitiveRules& gather = define_rules("gather");
  gather.jvp = gather_jvp;
  gather.transpose = gather_transpose;
  gather.batch = gather_batch;

  PrimitiveRules& add = define_rules("scatter-add");
  add.jvp = scatter_add_jvp;
  add.transpose = scatter_add_transpose;
  PrimitiveRules& set = define_rules("scatter");
  set.jvp = scatter_jvp;
  set.transpose = scatter_transpose;
  PrimitiveRules& mul = define_rules("scatter-mul");
  mul.jvp = scatter_mul_jvp;
  mul.transpose = scatter_mul_transpose;
  define_rules("scatter-min").jvp = [](std::span<const Array> p, std::span<const Array> t, const Params& params) {
    return scatter_extremal_jvp(prims::scatter_min(), p, t, params);
  };
  define_rules("scatter-max").jvp = [](std::span<const Array> p, std::span<const Array> t, const Params& params) {
    return scatter_extremal_jvp(prims::scatter_max(), p, t, params);
  };
  for (ScatterKind kind : {ScatterKind::Set, ScatterKind::Add, ScatterKind::Mul, ScatterKind::Min, ScatterKind::Max}) {
    const PrimitiveDef& prim = prims::scatter_kind(kind);
    define_rules(prim.name).batch = [&prim](std::span<const Array> a, std::span<const int> bd, const BatchAxis& axis,
                                            const Params& params) { return scatter_batch(prim, a, bd, axis, params); };
  }
});

}  // namespace
}  // namespace cjax
