// Shape and slicing primitives (broadcast_in_dim, reshape, transpose, squeeze, rev, concatenate,
// pad, iota, slice, dynamic_slice, dynamic_update_slice) and the generic strided-copy kernel they
// share. Names and params follow JAX's jaxpr text.
#pragma once
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/array/primitive.h"

namespace cjax::prims {
const PrimitiveDef& broadcast_in_dim();      // params: shape, broadcast_dimensions, sharding=None
const PrimitiveDef& reshape();               // params: new_sizes, dimensions=None, sharding=None
const PrimitiveDef& transpose();             // params: permutation
const PrimitiveDef& squeeze();               // params: dimensions
const PrimitiveDef& rev();                   // params: dimensions
const PrimitiveDef& concatenate();           // params: dimension
const PrimitiveDef& pad();                   // operands: operand, padding_value; params: padding_config
const PrimitiveDef& iota();                  // params: dtype, shape, dimension, sharding=None
const PrimitiveDef& slice();                 // params: start_indices, limit_indices, strides (None or tuple)
const PrimitiveDef& dynamic_slice();         // operands: operand, *scalar indices; params: slice_sizes
const PrimitiveDef& dynamic_update_slice();  // operands: operand, update, *scalar indices
}  // namespace cjax::prims

namespace cjax {

// The source strides (elements) per output dim of broadcast_in_dim (0 where broadcast) and of
// transpose, over a row-major operand: the strided copy of either primitive on any platform.
std::vector<int64_t> broadcast_source_strides(const Shape& in, size_t out_rank, const std::vector<int64_t>& dims);
std::vector<int64_t> transpose_source_strides(const Shape& in, const std::vector<int64_t>& perm);
// The value of a scalar integer index operand (read on the host).
int64_t read_scalar_index(const Array& a);
// dynamic_slice's starts, clamped as XLA does: each start lands in [0, dim - size].
std::vector<int64_t> clamped_starts(std::span<const Array> idx, const Shape& s, const Shape& sizes);
}  // namespace cjax
