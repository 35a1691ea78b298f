// JVP, transpose and batching rules of the shape and slicing primitives (core/lax/shape.cpp,
// core/lax/slicing.cpp), after jax/_src/lax/lax.py and slicing.py. All of them are linear in their
// array operands (pad jointly in operand and padding_value); the start indices of dynamic_slice
// and dynamic_update_slice are non-linear integer inputs. iota has no inputs, so it is never
// differentiated or batched: it is a constant to every transformation.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "autodiff/rule_helpers.h"
#include "core/lax/rule_support.h"
#include "core/lax/shape.h"

namespace cjax {
namespace {

using Ints = std::vector<int64_t>;

Ints range(int64_t lo, int64_t hi) {
  Ints r(size_t(std::max<int64_t>(hi - lo, 0)));
  std::iota(r.begin(), r.end(), lo);
  return r;
}
Ints plus_one(const Ints& v) {
  Ints r = v;
  for (int64_t& x : r) ++x;
  return r;
}
Ints inserted(Ints v, int64_t at, int64_t value) {
  v.insert(v.begin() + at, value);
  return v;
}

// JAX's deflinear for a primitive linear in its first `n_linear` inputs (all when -1): the tangent
// is the primitive applied to the tangents (zeros instantiated where only some are defined) and
// to the unchanged non-linear inputs.
void def_linear_jvp(const PrimitiveDef& def, int n_linear = -1) {
  define_rules(def.name).jvp = [&def, n_linear](std::span<const Array> p, std::span<const Array> t,
                                                const Params& params) {
    Array out = bind1(def, p, params);
    size_t n = n_linear < 0 ? p.size() : size_t(n_linear);
    if (!any_defined(t.first(n))) return JvpOut{{out}, {Array()}};
    std::vector<Array> args;
    for (size_t i = 0; i < p.size(); ++i) args.push_back(i < n ? instantiate_zero(t[i], p[i].aval()) : p[i]);
    return JvpOut{{out}, {bind1(def, args, params)}};
  };
}

Array zero_scalar(DType dtype) { return make_scalar(0.0, dtype, false); }

// ---- transpose rules ----

std::vector<Array> broadcast_in_dim_transpose(std::span<const Array> cts, std::span<const Array> args,
                                              const Params& params) {
  if (!is_undefined_primal(args[0])) return {Array()};
  const Shape& in_shape = args[0].shape();
  const Ints& bdims = params.ints("broadcast_dimensions");
  // Dimensions the operand had as size 1 were expanded (summed over, then re-inserted); the
  // others map one-to-one; every other output dimension was added and is summed over.
  Ints unit_dims, kept;
  for (size_t i = 0; i < in_shape.size(); ++i) {
    if (in_shape[i] == 1)
      unit_dims.push_back(int64_t(i));
    else
      kept.push_back(bdims[i]);
  }
  Ints axes;
  for (int64_t d = 0; d < cts[0].ndim(); ++d)
    if (std::find(kept.begin(), kept.end(), d) == kept.end()) axes.push_back(d);
  return {lax::expand_dims(lax::reduce_sum(cts[0], axes), unit_dims)};
}

std::vector<Array> transpose_transpose(std::span<const Array> cts, std::span<const Array>, const Params& params) {
  const Ints& perm = params.ints("permutation");
  Ints inverse(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) inverse[size_t(perm[i])] = int64_t(i);
  return {lax::transpose(cts[0], inverse)};
}

std::vector<Array> concatenate_transpose(std::span<const Array> cts, std::span<const Array> args,
                                         const Params& params) {
  const Array& ct = cts[0];
  size_t dim = size_t(params.i("dimension"));
  std::vector<Array> out;
  Ints start(size_t(ct.ndim()), 0), limit = ct.shape();
  for (const Array& a : args) {
    limit[dim] = start[dim] + a.shape()[dim];
    out.push_back(is_undefined_primal(a) ? lax::slice(ct, start, limit) : Array());
    start[dim] = limit[dim];
  }
  return out;
}

std::vector<Array> pad_transpose(std::span<const Array> cts, std::span<const Array> args, const Params& params) {
  const Array& ct = cts[0];
  const auto& cfg = params.get<std::vector<std::vector<int64_t>>>("padding_config");
  // Undo lo/hi with negated edge padding (cropping where they were positive), then step over
  // the interior padding with a strided slice.
  std::vector<lax::PadConfig> unpad;
  Ints strides;
  for (const auto& c : cfg) {
    unpad.push_back({-c[0], -c[1], 0});
    strides.push_back(c[2] + 1);
  }
  Array unpadded = lax::pad(ct, zero_scalar(ct.dtype()), unpad);
  Array t_operand = lax::slice(unpadded, Ints(cfg.size(), 0), unpadded.shape(), strides);
  Array t_padding_value;
  if (is_undefined_primal(args[1])) {
    auto total = [](const Array& x) { return lax::reduce_sum(x, range(0, x.ndim())); };
    t_padding_value = lax::sub(total(ct), total(t_operand));
  }
  return {is_undefined_primal(args[0]) ? t_operand : Array(), t_padding_value};
}

std::vector<Array> slice_transpose(std::span<const Array> cts, std::span<const Array> args, const Params& params) {
  const Array& ct = cts[0];
  const Shape& in_shape = args[0].shape();
  const Ints& start = params.ints("start_indices");
  bool strided = !std::holds_alternative<std::monostate>(params.at("strides"));
  std::vector<lax::PadConfig> pads;
  for (size_t i = 0; i < in_shape.size(); ++i) {
    int64_t stride = strided ? params.ints("strides")[i] : 1;
    int64_t n = ct.shape()[i];
    // The last element the slice read, plus one (the given limit may lie past it when strided).
    int64_t real_limit = start[i] + (n == 0 ? 0 : 1 + (n - 1) * stride);
    pads.push_back({start[i], in_shape[i] - real_limit, stride - 1});
  }
  return {lax::pad(ct, zero_scalar(ct.dtype()), pads)};
}

std::vector<Array> dynamic_slice_transpose(std::span<const Array> cts, std::span<const Array> args, const Params&) {
  std::vector<Array> dus_args{zeros_like_aval(args[0].aval()), cts[0]};
  dus_args.insert(dus_args.end(), args.begin() + 1, args.end());
  std::vector<Array> out(args.size());
  out[0] = bind1(prims::dynamic_update_slice(), dus_args);
  return out;
}

std::vector<Array> dynamic_update_slice_transpose(std::span<const Array> cts, std::span<const Array> args,
                                                  const Params&) {
  const Array& ct = cts[0];
  std::span<const Array> indices = args.subspan(2);
  std::vector<Array> out(args.size());
  if (is_undefined_primal(args[0])) {
    std::vector<Array> dus_args{ct, zeros_like_aval(args[1].aval())};
    dus_args.insert(dus_args.end(), indices.begin(), indices.end());
    out[0] = bind1(prims::dynamic_update_slice(), dus_args);
  }
  if (is_undefined_primal(args[1])) {
    std::vector<Array> ds_args{ct};
    ds_args.insert(ds_args.end(), indices.begin(), indices.end());
    out[1] = bind1(prims::dynamic_slice(), ds_args, Params{{"slice_sizes", args[1].shape()}});
  }
  return out;
}

// ---- batching rules ----

BatchOut broadcast_in_dim_batch(std::span<const Array> a, std::span<const int> d, const BatchAxis& axis,
                                const Params& params) {
  Array x = move_bdim(a[0], d[0], 0, axis.size);
  Shape shape = inserted(params.ints("shape"), 0, axis.size);
  return {{lax::broadcast_in_dim(x, shape, inserted(plus_one(params.ints("broadcast_dimensions")), 0, 0))}, {0}};
}

BatchOut reshape_batch(std::span<const Array> a, std::span<const int> d, const BatchAxis& axis, const Params& params) {
  Array x = move_bdim(a[0], d[0], 0, axis.size);
  return {{lax::reshape(x, inserted(params.ints("new_sizes"), 0, axis.size))}, {0}};
}

BatchOut transpose_batch(std::span<const Array> a, std::span<const int> d, const BatchAxis&, const Params& params) {
  int64_t bdim = d[0];
  Ints perm{bdim};
  for (int64_t i : params.ints("permutation")) perm.push_back(i < bdim ? i : i + 1);
  return {{lax::transpose(a[0], perm)}, {0}};
}

BatchOut squeeze_batch(std::span<const Array> a, std::span<const int> d, const BatchAxis& axis, const Params& params) {
  Array x = move_bdim(a[0], d[0], 0, axis.size);
  return {{lax::squeeze(x, plus_one(params.ints("dimensions")))}, {0}};
}

BatchOut rev_batch(std::span<const Array> a, std::span<const int> d, const BatchAxis&, const Params& params) {
  Ints dims;
  for (int64_t i : params.ints("dimensions")) dims.push_back(i >= d[0] ? i + 1 : i);
  return {{lax::rev(a[0], dims)}, {d[0]}};
}

BatchOut concatenate_batch(std::span<const Array> a, std::span<const int> d, const BatchAxis& axis,
                           const Params& params) {
  std::vector<Array> moved;
  for (size_t i = 0; i < a.size(); ++i) moved.push_back(move_bdim(a[i], d[i], 0, axis.size));
  return {{bind1(prims::concatenate(), moved, Params{{"dimension", params.i("dimension") + 1}})}, {0}};
}

BatchOut pad_batch(std::span<const Array> a, std::span<const int> d, const BatchAxis& axis, const Params& params) {
  Array operand = a[0];
  int operand_bdim = d[0];
  if (operand_bdim == kNotMapped) {
    operand_bdim = 0;
    operand = move_bdim(operand, kNotMapped, 0, axis.size);
  }
  auto cfg = params.get<std::vector<std::vector<int64_t>>>("padding_config");
  cfg.insert(cfg.begin() + operand_bdim, {0, 0, 0});
  Params batched{{"padding_config", cfg}};
  if (d[1] == kNotMapped) return {{bind1(prims::pad(), {operand, a[1]}, batched)}, {operand_bdim}};
  // A padding value per example: pad with zeros, then select the padding value where a padded
  // mask is false.
  Array x = bind1(prims::pad(), {operand, zero_scalar(operand.dtype())}, batched);
  Array ones = lax::broadcast_in_dim(make_scalar(1.0, DType::bool_, false), operand.shape(), {});
  Array mask = bind1(prims::pad(), {ones, make_scalar(0.0, DType::bool_, false)}, batched);
  Array padding = lax::broadcast_in_dim(a[1], x.shape(), {operand_bdim});
  return {{lax::select(mask, x, padding)}, {operand_bdim}};
}

BatchOut slice_batch(std::span<const Array> a, std::span<const int> d, const BatchAxis&, const Params& params) {
  int bdim = d[0];
  Ints start = inserted(params.ints("start_indices"), bdim, 0);
  Ints limit = inserted(params.ints("limit_indices"), bdim, a[0].shape()[size_t(bdim)]);
  Ints strides;
  if (!std::holds_alternative<std::monostate>(params.at("strides")))
    strides = inserted(params.ints("strides"), bdim, 1);
  return {{lax::slice(a[0], start, limit, strides)}, {bdim}};
}

// The start indices of one example as a (batch, rank) index array (JAX's _batch_dynamic_slice_indices):
// batched indices (rank 1) fill their column per example, unbatched ones are broadcast.
Array batched_start_indices(std::span<const Array> idx, std::span<const int> bdims, int64_t size) {
  std::vector<Array> columns;
  for (size_t i = 0; i < idx.size(); ++i)
    columns.push_back(lax::broadcast_in_dim(idx[i], {size, 1}, bdims[i] == kNotMapped ? Ints{} : Ints{0}));
  return lax::concatenate(columns, 1);
}

bool any_mapped(std::span<const int> bdims) {
  return std::any_of(bdims.begin(), bdims.end(), [](int b) { return b != kNotMapped; });
}

BatchOut dynamic_slice_batch(std::span<const Array> a, std::span<const int> d, const BatchAxis& axis,
                             const Params& params) {
  const Ints& sizes = params.ints("slice_sizes");
  std::span<const Array> idx = a.subspan(1);
  std::span<const int> idx_bdims = d.subspan(1);
  if (!any_mapped(idx_bdims)) {
    // One window for every example: a dynamic_slice that keeps the whole batch dimension.
    std::vector<Array> args{a[0]};
    args.insert(args.end(), idx.begin(), idx.end());
    args.insert(args.begin() + 1 + d[0], zero_scalar(idx.empty() ? DType::int32 : idx[0].dtype()));
    return {{bind1(prims::dynamic_slice(), args, Params{{"slice_sizes", inserted(sizes, d[0], axis.size)}})}, {d[0]}};
  }
  // Per-example starts: a gather of one window per example, clamped as dynamic_slice clamps.
  Array starts = batched_start_indices(idx, idx_bdims, axis.size);
  int64_t rank = int64_t(sizes.size());
  lax::GatherDimensionNumbers dn;
  dn.offset_dims = range(1, rank + 1);
  if (d[0] == kNotMapped) {
    dn.start_index_map = range(0, rank);
    return {{lax::gather(a[0], starts, dn, sizes, lax::GatherScatterMode::clip)}, {0}};
  }
  Array operand = move_bdim(a[0], d[0], 0, axis.size);
  dn.start_index_map = range(1, rank + 1);
  dn.operand_batching_dims = {0};
  dn.start_indices_batching_dims = {0};
  return {{lax::gather(operand, starts, dn, inserted(sizes, 0, 1), lax::GatherScatterMode::clip)}, {0}};
}

BatchOut dynamic_update_slice_batch(std::span<const Array> a, std::span<const int> d, const BatchAxis& axis,
                                    const Params&) {
  Array operand = move_bdim(a[0], d[0], 0, axis.size);
  Array update = move_bdim(a[1], d[1], 0, axis.size);
  std::span<const Array> idx = a.subspan(2);
  std::span<const int> idx_bdims = d.subspan(2);
  if (!any_mapped(idx_bdims)) {
    std::vector<Array> args{operand, update, zero_scalar(idx.empty() ? DType::int32 : idx[0].dtype())};
    args.insert(args.end(), idx.begin(), idx.end());
    return {{bind1(prims::dynamic_update_slice(), args)}, {0}};
  }
  // Per-example starts: a scatter of one window per example, clamped as dynamic_update_slice clamps.
  Array starts = batched_start_indices(idx, idx_bdims, axis.size);
  int64_t rank = operand.ndim() - 1;
  lax::ScatterDimensionNumbers dn;
  dn.update_window_dims = range(1, rank + 1);
  dn.scatter_dims_to_operand_dims = range(1, rank + 1);
  dn.operand_batching_dims = {0};
  dn.scatter_indices_batching_dims = {0};
  return {{lax::scatter(operand, starts, update, dn, lax::GatherScatterMode::clip)}, {0}};
}

const bool registered = add_rule_initializer([] {
  for (const PrimitiveDef* def : {&prims::broadcast_in_dim(), &prims::reshape(), &prims::transpose(), &prims::squeeze(),
                                  &prims::rev(), &prims::concatenate(), &prims::pad(), &prims::slice()})
    def_linear_jvp(*def);
  def_linear_jvp(prims::dynamic_slice(), 1);
  def_linear_jvp(prims::dynamic_update_slice(), 2);

  define_rules("broadcast_in_dim").transpose = broadcast_in_dim_transpose;
  define_rules("reshape").transpose = [](std::span<const Array> cts, std::span<const Array> args, const Params&) {
    return std::vector<Array>{lax::reshape(cts[0], args[0].shape())};
  };
  define_rules("transpose").transpose = transpose_transpose;
  define_rules("squeeze").transpose = [](std::span<const Array> cts, std::span<const Array>, const Params& p) {
    return std::vector<Array>{lax::expand_dims(cts[0], p.ints("dimensions"))};
  };
  define_rules("rev").transpose = [](std::span<const Array> cts, std::span<const Array>, const Params& p) {
    return std::vector<Array>{lax::rev(cts[0], p.ints("dimensions"))};
  };
  define_rules("concatenate").transpose = concatenate_transpose;
  define_rules("pad").transpose = pad_transpose;
  define_rules("slice").transpose = slice_transpose;
  define_rules("dynamic_slice").transpose = dynamic_slice_transpose;
  define_rules("dynamic_update_slice").transpose = dynamic_update_slice_transpose;

  define_rules("broadcast_in_dim").batch = broadcast_in_dim_batch;
  define_rules("reshape").batch = reshape_batch;
  define_rules("transpose").batch = transpose_batch;
  define_rules("squeeze").batch = squeeze_batch;
  define_rules("rev").batch = rev_batch;
  define_rules("concatenate").batch = concatenate_batch;
  define_rules("pad").batch = pad_batch;
  define_rules("slice").batch = slice_batch;
  define_rules("dynamic_slice").batch = dynamic_slice_batch;
  define_rules("dynamic_update_slice").batch = dynamic_update_slice_batch;
});

}  // namespace
}  // namespace cjax
