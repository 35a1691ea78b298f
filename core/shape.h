// Shape and slicing primitives (broadcast_in_dim, reshape, transpose, squeeze, rev, concatenate,
// pad, iota, slice, dynamic_slice, dynamic_update_slice) and the generic strided-copy kernel they
// share. Names and params follow JAX's jaxpr text.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/primitive.h"

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

// Generic strided copy by item size (one kernel serves every dtype):
//   dst[sum_i k_i * dst_strides[i]] = src[sum_i k_i * src_strides[i]]  for all k < shape.
// Strides are in elements and may be zero (broadcast) or negative (reversal); `src` and `dst`
// point at the element of index (0, ..., 0). Adjacent dimensions are merged, contiguous runs are
// memcpy'd, transposes are cache-blocked, and large copies run on the thread pool.
void strided_copy(void* dst, const std::vector<int64_t>& dst_strides, const void* src,
                  const std::vector<int64_t>& src_strides, const std::vector<int64_t>& shape, size_t itemsize);
// The source strides (elements) per output dim of broadcast_in_dim (0 where broadcast) and of
// transpose, over a row-major operand: the strided copy of either primitive on any platform.
std::vector<int64_t> broadcast_source_strides(const Shape& in, size_t out_rank, const std::vector<int64_t>& dims);
std::vector<int64_t> transpose_source_strides(const Shape& in, const std::vector<int64_t>& perm);
// Fills `n` contiguous items of `itemsize` bytes at `dst` with the item at `value`.
void fill_items(void* dst, int64_t n, const void* value, size_t itemsize);

}  // namespace cjax
