// Size classes of CPU memory blocks, shared by the device caching allocator (runtime.cpp) and
// kernels' scratch cache (kernels/scratch.h): a freed block is reused by any later request of
// its class.
#pragma once
#include <algorithm>
#include <bit>
#include <cstddef>

namespace cjax::cpu {

constexpr size_t kBlockAlignment = 64;
constexpr size_t kSmallBlockLimit = 1 << 20;  // up to this, classes are powers of two

// The capacity a request of n bytes gets: a power of two up to kSmallBlockLimit, above it a
// multiple of 1/8 of n's power of two (at least 4 KiB), so that similar sizes share a class.
inline size_t block_size_class(size_t n) {
  if (n == 0) n = 1;
  if (n <= kSmallBlockLimit) return std::max<size_t>(kBlockAlignment, std::bit_ceil(n));
  size_t step = std::max<size_t>(std::bit_floor(n) / 8, 4096);
  return (n + step - 1) / step * step;
}

}  // namespace cjax::cpu
