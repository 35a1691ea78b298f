// 8 x 8 transposes of 32-bit elements through vector registers (GCC vector extensions: AVX2's
// unpack and lane shuffles on x86-64-v3 builds, SSE pairs below that). Used where a scalar
// transposing loop cost more than the arithmetic around it: the attention kernels' key panels and
// the strided copy's blocked transposes.
#pragma once

#include <cstdint>

namespace cjax::cpu {

using v8 = float __attribute__((vector_size(32)));
using v8_unaligned = float __attribute__((vector_size(32), aligned(4), may_alias));
inline v8 load8(const void* p) { return *reinterpret_cast<const v8_unaligned*>(p); }
inline void store8(void* p, v8 v) { *reinterpret_cast<v8_unaligned*>(p) = v; }

// r[j][i] becomes r[i][j].
inline void transpose8(v8 r[8]) {
  v8 t[8], u[8];
  for (int j = 0; j < 8; j += 2) {
    t[j] = __builtin_shufflevector(r[j], r[j + 1], 0, 8, 1, 9, 4, 12, 5, 13);
    t[j + 1] = __builtin_shufflevector(r[j], r[j + 1], 2, 10, 3, 11, 6, 14, 7, 15);
  }
  for (int j = 0; j < 8; j += 4)
    for (int h = 0; h < 2; ++h) {
      u[j + 2 * h] = __builtin_shufflevector(t[j + h], t[j + h + 2], 0, 1, 8, 9, 4, 5, 12, 13);
      u[j + 2 * h + 1] = __builtin_shufflevector(t[j + h], t[j + h + 2], 2, 3, 10, 11, 6, 7, 14, 15);
    }
  for (int j = 0; j < 4; ++j) {
    r[j] = __builtin_shufflevector(u[j], u[j + 4], 0, 1, 2, 3, 8, 9, 10, 11);
    r[j + 4] = __builtin_shufflevector(u[j], u[j + 4], 4, 5, 6, 7, 12, 13, 14, 15);
  }
}

// The 8 x 8 block of 32-bit elements at src (rows src_ld elements apart), transposed to dst (rows
// dst_ld apart): dst[i * dst_ld + j] = src[j * src_ld + i].
template <class U>
inline void transpose_block8(U* dst, int64_t dst_ld, const U* src, int64_t src_ld) {
  static_assert(sizeof(U) == 4);
  v8 r[8];
  for (int j = 0; j < 8; ++j) r[j] = load8(src + j * src_ld);
  transpose8(r);
  for (int i = 0; i < 8; ++i) store8(dst + i * dst_ld, r[i]);
}

}  // namespace cjax::cpu
