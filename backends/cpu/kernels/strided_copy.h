// Host-memory copies shared by the CPU's shape, slicing and indexing kernels.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/array/array_impl.h"

namespace cjax::cpu {

// Elements per parallel chunk of a copy-like kernel (cheap per element).
inline constexpr int64_t kCopyGrain = 1 << 15;

// Generic strided copy by item size (one kernel serves every dtype):
//   dst[sum_i k_i * dst_strides[i]] = src[sum_i k_i * src_strides[i]]  for all k < shape.
// Strides are in elements and may be zero (broadcast) or negative (reversal); `src` and `dst`
// point at the element of index (0, ..., 0). Adjacent dimensions are merged, contiguous runs are
// memcpy'd, transposes are cache-blocked, and large copies run on the thread pool.
void strided_copy(void* dst, const std::vector<int64_t>& dst_strides, const void* src,
                  const std::vector<int64_t>& src_strides, const std::vector<int64_t>& shape, size_t itemsize);
// Fills `n` contiguous items of `itemsize` bytes at `dst` with the item at `value`.
void fill_items(void* dst, int64_t n, const void* value, size_t itemsize);
// Copies `src` (row-major, shape `shape`) into `dst` (row-major array of shape `dst_shape`),
// starting at element offsets `starts` along each dimension.
void copy_block_into(char* dst, const Shape& dst_shape, const std::vector<int64_t>& starts, const char* src,
                     const Shape& shape, size_t isz);

inline Device device_of(const Array& a) { return concrete(a)->device(); }
inline char* bytes_of(const Array& a) { return static_cast<char*>(raw_ptr(a)); }

}  // namespace cjax::cpu
