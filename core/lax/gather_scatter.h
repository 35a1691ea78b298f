// Gather and scatter primitives (XLA/JAX semantics): `gather`, `scatter`, `scatter-add`,
// `scatter-mul`, `scatter-min`, `scatter-max`. Their params are stored with JAX's names and print
// as JAX prints them:
//   gather[dimension_numbers=GatherDimensionNumbers(offset_dims=(1,), collapsed_slice_dims=(0,),
//          start_index_map=(0,), operand_batching_dims=(), start_indices_batching_dims=())
//          fill_value=None indices_are_sorted=False mode=GatherScatterMode.PROMISE_IN_BOUNDS
//          slice_sizes=(1, 4) unique_indices=False]
//   scatter-add[dimension_numbers=ScatterDimensionNumbers(update_window_dims=(1,), ...)
//          indices_are_sorted=False mode=GatherScatterMode.FILL_OR_DROP unique_indices=False
//          update_consts=() update_jaxpr=None]
// The index vector is always the last dimension of the indices.
#pragma once
#include <limits>
#include <optional>
#include <string_view>

#include "cjax/lax.h"
#include "core/array/primitive.h"
#include "core/array/visit_dtype.h"

namespace cjax {

struct GatherDimensionNumbersParam final : ParamObject {
  lax::GatherDimensionNumbers dn;
  explicit GatherDimensionNumbersParam(lax::GatherDimensionNumbers d) : dn(std::move(d)) {}
  std::string str() const override;
  size_t hash() const override;
  bool equals(const ParamObject& other) const override;
};
struct ScatterDimensionNumbersParam final : ParamObject {
  lax::ScatterDimensionNumbers dn;
  explicit ScatterDimensionNumbersParam(lax::ScatterDimensionNumbers d) : dn(std::move(d)) {}
  std::string str() const override;
  size_t hash() const override;
  bool equals(const ParamObject& other) const override;
};
// Prints as GatherScatterMode.CLIP / FILL_OR_DROP / PROMISE_IN_BOUNDS.
struct GatherScatterModeParam final : ParamObject {
  lax::GatherScatterMode mode;
  explicit GatherScatterModeParam(lax::GatherScatterMode m) : mode(m) {}
  std::string str() const override;
  size_t hash() const override;
  bool equals(const ParamObject& other) const override;
};
std::string gather_scatter_mode_str(lax::GatherScatterMode);

// Param readers (for rules of later layers: transpose of gather is scatter-add, etc.).
const lax::GatherDimensionNumbers& gather_dimension_numbers(const Params&);
const lax::ScatterDimensionNumbers& scatter_dimension_numbers(const Params&);
lax::GatherScatterMode gather_scatter_mode(const Params&);
std::optional<double> gather_fill_value(const Params&);  // nullopt: JAX's default for the dtype

// Param builders with every param JAX prints.
Params gather_params(const lax::GatherDimensionNumbers& dn, const std::vector<int64_t>& slice_sizes,
                     lax::GatherScatterMode mode, std::optional<double> fill_value = std::nullopt,
                     bool indices_are_sorted = false, bool unique_indices = false);
Params scatter_params(const lax::ScatterDimensionNumbers& dn, lax::GatherScatterMode mode,
                      bool indices_are_sorted = false, bool unique_indices = false);

// A gather whose batch dims lead the output and that has no batching dims (take, x[idx],
// embedding lookups), as index arithmetic a device kernel can run: output element (b, w) reads
// operand[sum_k clamp(indices[b, k], 0, hi[k]) * start_stride[k] + window offset of w], where w
// runs row-major over `window` (the slice sizes) with `window_strides`; in fill mode an index out
// of [0, hi[k]] writes `fill` (the element's bytes) instead. nullopt for other layouts.
struct LeadingBatchGather {
  int64_t batches = 0, window_size = 0, K = 0;
  std::vector<int64_t> hi, start_stride;
  Shape window;
  std::vector<int64_t> window_strides;
  bool fill_mode = false;
  uint64_t fill_bits = 0;
};
std::optional<LeadingBatchGather> leading_batch_gather(const Array& operand, const Array& indices, const Params& p);

// A scatter whose scatter dims lead the updates, with no batching dims and windows one element
// wide along every indexed operand dim (x.at[idx].add(v), embedding gradients): windows of two
// updates then coincide or are disjoint, so a device kernel can give each output element its own
// thread, which applies the matching updates in index order, as the CPU kernel does. Output
// element o (coordinates c) takes update b when c[dims[k]] == index k of b for every k (an index
// outside [0, hi[k]] is dropped, or clamped in clip mode) and c[d] < window[d] elsewhere; the
// update element read is b * window_size + sum_d c[d] * update_stride[d].
struct LeadingBatchScatter {
  int64_t batches = 0, window_size = 0, K = 0;
  std::vector<int64_t> dims, hi;               // per index component
  std::vector<int64_t> window, update_stride;  // per operand dim
  bool clip = false;
};
std::optional<LeadingBatchScatter> leading_batch_scatter(const Array& operand, const Array& indices,
                                                         const Array& updates, const Params& p);

// Binds with the sortedness/uniqueness hints (lax::gather / lax::scatter_* pass false).
Array gather_with(const Array& operand, const Array& indices, const lax::GatherDimensionNumbers& dn,
                  const std::vector<int64_t>& slice_sizes, lax::GatherScatterMode mode,
                  std::optional<double> fill_value, bool indices_are_sorted, bool unique_indices);
enum class ScatterKind { Set, Add, Mul, Min, Max };
Array scatter_with(ScatterKind kind, const Array& operand, const Array& indices, const Array& updates,
                   const lax::ScatterDimensionNumbers& dn, lax::GatherScatterMode mode, bool indices_are_sorted,
                   bool unique_indices);

// gather's and scatter's shapes, checked against their dimension numbers (the shape rules'
// ShapeError/DTypeError), as the kernels of every platform read them.
struct GatherGeom {
  Shape batch_shape;                    // indices.shape[:-1]
  int64_t K = 0;                        // index vector length
  std::vector<int64_t> batch_out_dims;  // output dim of each batch dim
  Shape out_shape;
};

GatherGeom gather_geometry(const Array& operand, const Array& indices, const lax::GatherDimensionNumbers& dn,
                           const std::vector<int64_t>& slice_sizes);
struct ScatterGeom {
  Shape batch_shape;
  int64_t K = 0;
  std::vector<int64_t> update_scatter_dims;  // update dims that are scatter (batch) dims, in order
  std::vector<int64_t> window;               // window extent per operand dim
  std::vector<int64_t> upd_stride_of_dim;    // updates stride per operand dim (0 for inserted/batching)
};

ScatterGeom scatter_geometry(std::string_view primitive, const Array& operand, const Array& indices,
                             const Array& updates, const lax::ScatterDimensionNumbers& dn);
const char* scatter_name(ScatterKind k);  // "scatter", "scatter-add", ...

// gather's fill value for FILL_OR_DROP in T: `v`, or JAX's default (NaN for floats, the minimum of
// a signed integer type, the maximum of an unsigned one, True for bool).
template <class T>
T default_gather_fill() {
  if constexpr (std::is_same_v<T, bool>)
    return true;
  else if constexpr (is_float_like_v<T>) {
    if constexpr (is_half_v<T>)
      return T(std::numeric_limits<float>::quiet_NaN());
    else
      return std::numeric_limits<T>::quiet_NaN();
  } else if constexpr (std::is_signed_v<T>)
    return std::numeric_limits<T>::lowest();
  else
    return std::numeric_limits<T>::max();
}
template <class T>
T gather_fill(std::optional<double> v) {
  if (!v) return default_gather_fill<T>();
  if constexpr (std::is_same_v<T, bool>)
    return *v != 0;
  else if constexpr (is_half_v<T>)
    return T(float(*v));
  else
    return T(*v);
}

}  // namespace cjax

namespace cjax::prims {
const PrimitiveDef& gather();
const PrimitiveDef& scatter();      // "scatter" (overwrite)
const PrimitiveDef& scatter_add();  // "scatter-add"
const PrimitiveDef& scatter_mul();  // "scatter-mul"
const PrimitiveDef& scatter_min();  // "scatter-min"
const PrimitiveDef& scatter_max();  // "scatter-max"
const PrimitiveDef& scatter_kind(ScatterKind);
}  // namespace cjax::prims
