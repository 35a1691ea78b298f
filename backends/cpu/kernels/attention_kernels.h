// flash_attention and flash_attention_backward (core/lax/attention.h): the CPU kernels, also of
// their packed forms (q, k and v as column ranges of one x's rows, read and written in place).
// Written for one vector width, CJAX_ATTENTION_LANES f32 lanes, in the namespace
// cjax::cpu::CJAX_ATTENTION_NS: attention.cpp includes it with the build's width and registers the
// kernels, attention_lanes8.cpp with 8 lanes on AVX-512 builds (attention.cpp says when those run).
//
// The FlashAttention schedule with the caches in the role of GPU shared memory: the logits are
// never materialized. One task owns a (batch, key/value head) pair and a block of query rows, for
// all G query heads that share the key head, so K and V are converted to f32 once per task and
// stay in L1/L2. Per key block of kKeys keys:
//   forward : S = scale Q K^T (kQuery x kKeys), online softmax (running row max m and sum l, the
//             output rescaled when m grows), O += P V; finally O /= l and lse = m + log l.
//   backward: P = exp(S - lse) recomputed, dP = dO V^T, dS = P (dP - rowsum(dO o)) scale;
//             dV += P^T dO, dK += dS^T Q, dQ += dS K. A backward task owns a whole (batch, key
//             head), so its dK and dV accumulate without sharing and every sum runs in a fixed
//             order: results are bitwise identical run to run and for any thread count.
// Causal attention skips the key blocks after a query block's last row and stops each row at
// its diagonal: masked probabilities are exactly 0, as the unfused path's. A block on the
// diagonal goes in groups of 16 rows, each multiplied only up to its last row's diagonal (at
// T = S = 64 every block is diagonal: 37% fewer products and exponentials).
//
// Every f32 buffer is zero padded to whole vectors (H) and blocks (rows, keys), so the
// products are one register-blocked kernel (`tile`, GCC vector extensions: AVX-512 or AVX2 as the
// build's -march gives) with no tails; the exponential is a vector polynomial (`expv`).
//
// At small head widths (the transformer sample's H = 16) staging costs as much as the products:
// each kernel stages only what it reads, straight from the source with vector copies (o is read
// only for rowsum(dO o)), and builds the transposed panels 8 x 8 in registers.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "backends/cpu/kernels/transpose8.h"
#include "backends/cpu/llvm_math_coefficients.h"
#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/array/visit_dtype.h"
#include "core/backend/parallel.h"
#include "core/lax/attention.h"

// Vectors are passed between this file's internal functions (all inlined or local): GCC's note
// that their ABI differs on builds without wide registers concerns calls across binaries only.
#pragma GCC diagnostic ignored "-Wpsabi"

#if !defined(CJAX_ATTENTION_LANES) || !defined(CJAX_ATTENTION_NS)
#error "define CJAX_ATTENTION_LANES (8 or 16) and CJAX_ATTENTION_NS before including attention_kernels.h"
#endif

namespace cjax::cpu::CJAX_ATTENTION_NS {
namespace {

constexpr int64_t kQuery = 64;      // query rows per block
constexpr int64_t kKeys = 64;       // keys per block
constexpr int64_t kGroupRows = 16;  // rows per product on a causal block's diagonal (a multiple of 8)
// One vector register: 16 floats on AVX-512 builds, 8 elsewhere (wider GCC vectors than the
// registers are split by the compiler through the stack, which ran this kernel at 0.2x the
// unfused path on AVX2); 8 on AVX-512 builds too where attention.cpp chooses them.
constexpr int64_t kLanes = CJAX_ATTENTION_LANES;
static_assert(kLanes == 8 || kLanes == 16);
#if CJAX_ATTENTION_LANES == 16 && !defined(__AVX512F__)
#error "16 attention lanes need an AVX-512 build"
#endif

using vf = float __attribute__((vector_size(kLanes * 4)));
using vi = int32_t __attribute__((vector_size(kLanes * 4)));
using vf_unaligned = float __attribute__((vector_size(kLanes * 4), aligned(4), may_alias));

inline vf loadv(const float* p) { return *reinterpret_cast<const vf_unaligned*>(p); }
inline void storev(float* p, vf v) { *reinterpret_cast<vf_unaligned*>(p) = v; }
inline vf splat(float x) {  // a broadcast (element-wise loops here compiled to stack stores)
#if CJAX_ATTENTION_LANES == 16
  return vf{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x};
#else
  return vf{x, x, x, x, x, x, x, x};
#endif
}
inline vi lane_index() {
#if CJAX_ATTENTION_LANES == 16
  return vi{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
#else
  return vi{0, 1, 2, 3, 4, 5, 6, 7};
#endif
}
// Horizontal sum and max by halving shuffles (a fixed order: deterministic).
inline vf fold_halves(vf v, int64_t step) {
#if CJAX_ATTENTION_LANES == 16
  switch (step) {
    case 8: return __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    case 4: return __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    case 2: return __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    default: return __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
  }
#else
  switch (step) {
    case 4: return __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
    case 2: return __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5);
    default: return __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6);
  }
#endif
}
inline float lane_sum(vf v) {
  for (int64_t step = kLanes / 2; step > 0; step /= 2) v += fold_halves(v, step);
  return v[0];
}
inline float lane_max(vf v) {
  for (int64_t step = kLanes / 2; step > 0; step /= 2) {
    vf o = fold_halves(v, step);
    v = o > v ? o : v;
  }
  return v[0];
}
int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// exp(x) for softmax arguments (x <= 0): 0 below -87 (where f32 exp underflows to subnormals),
// relative error 2e-8 elsewhere (the polynomial of the LLVM kernels' f32 exp).
inline vf expv(vf x) {
  using math_coefficients::kExpS_f;
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  constexpr float c0 = float(kExpS_f[0]), c1 = float(kExpS_f[1]), c2 = float(kExpS_f[2]), c3 = float(kExpS_f[3]),
                  c4 = float(kExpS_f[4]);
  const vf low = splat(-87.0f);
  const vf xc = x < low ? low : x;
  const vf t = xc * 1.44269504088896341f + kMagic;
  const vf n = t - kMagic;
  vf r = n * -0.693145751953125f + xc;
  r = n * -1.428606765330187045e-06f + r;
  const vf s = (((c4 * r + c3) * r + c2) * r + c1) * r + c0;
  const vf p = 1.0f + r + 0.5f * r * r + r * r * r * s;
  const vi e = ((std::bit_cast<vi>(t) - 0x4B400000) + 127) << 23;
  const vf y = p * std::bit_cast<vf>(e);
  return x < low ? splat(0.0f) : y;
}
inline float exp1(float x) { return expv(splat(x))[0]; }

// The products, as one register-blocked kernel: C[i][0, kLanes NV) (=|+=) sum_{r < R} A(i, r) X[r][0, kLanes NV)
// for i < MR, A(i, r) = A[i * ars + r * acs] (so A may be read transposed), X rows ldx apart.
template <int MR, int NV>
inline void tile(float* C, int64_t ldc, const float* A, int64_t ars, int64_t acs, const float* X, int64_t ldx,
                 int64_t R, bool accumulate) {
  vf acc[MR][NV];
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = accumulate ? loadv(C + i * ldc + v * kLanes) : splat(0.0f);
  for (int64_t r = 0; r < R; ++r) {
    vf x[NV];
    for (int v = 0; v < NV; ++v) {
      x[v] = loadv(X + r * ldx + v * kLanes);
      // In a register, loaded once: GCC otherwise folded the load into each of the MR FMAs that
      // read it, and the loop waited on the load ports instead of the FMA units.
#if defined(__x86_64__) || defined(__i386__)
      __asm__("" : "+v"(x[v]));  // "v": any SSE/AVX/AVX-512 vector register
#endif
    }
    for (int i = 0; i < MR; ++i) {
      const vf a = splat(A[i * ars + r * acs]);
      for (int v = 0; v < NV; ++v) acc[i][v] += a * x[v];
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int v = 0; v < NV; ++v) storev(C + i * ldc + v * kLanes, acc[i][v]);
}

// Rows per tile (a divisor of 8): as many accumulators as the registers hold beside the NV
// vectors of X and a broadcast (32 AVX-512 registers, 16 AVX2 ones).
#if CJAX_ATTENTION_LANES == 16
template <int NV>
constexpr int kTileRows = NV >= 3 ? 4 : 8;
#else
template <int NV>
constexpr int kTileRows = NV >= 3 ? 2
                          : NV == 2 ? 4
                                    : 8;
#endif

template <int NV>
void tile_rows(float* C, int64_t ldc, int64_t M, const float* A, int64_t ars, int64_t acs, const float* X, int64_t ldx,
               int64_t R, bool accumulate) {
  constexpr int MR = kTileRows<NV>;
  for (int64_t i0 = 0; i0 < M; i0 += MR) tile<MR, NV>(C + i0 * ldc, ldc, A + i0 * ars, ars, acs, X, ldx, R, accumulate);
}

// C [M][N] (=|+=) A(M x R) X[R][N]; M a multiple of 8, N of kLanes.
void gemm(float* C, int64_t ldc, int64_t M, int64_t N, const float* A, int64_t ars, int64_t acs, const float* X,
          int64_t ldx, int64_t R, bool accumulate) {
  for (int64_t n0 = 0; n0 < N; n0 += 4 * kLanes) {
    float* c = C + n0;
    const float* x = X + n0;
    switch (std::min<int64_t>(4, (N - n0) / kLanes)) {
      case 4: tile_rows<4>(c, ldc, M, A, ars, acs, x, ldx, R, accumulate); break;
      case 3: tile_rows<3>(c, ldc, M, A, ars, acs, x, ldx, R, accumulate); break;
      case 2: tile_rows<2>(c, ldc, M, A, ars, acs, x, ldx, R, accumulate); break;
      default: tile_rows<1>(c, ldc, M, A, ars, acs, x, ldx, R, accumulate); break;
    }
  }
}

struct Dims {
  int64_t B, T, N, H, S, K, G;
  double scale;
  bool causal;
  int64_t Hp;  // H rounded up to whole vectors: the width of every f32 buffer (zero padded)
  // Elements from one (batch, position) row of q (and dq) or of k and v (dk, dv) to the next: N H
  // and K H, or the packed operand's row width (flash_attention_packed). o and do are unpacked.
  int64_t ldq, ldkv;
  int64_t query_blocks() const { return (T + kQuery - 1) / kQuery; }
  // Keys a query block [t0, t0 + rows) reads: all, or up to its last row's diagonal.
  int64_t key_end(int64_t t0, int64_t rows) const { return causal ? std::min(S, t0 + rows) : S; }
  // Keys row t keeps within the key block starting at s0 (0 ... keys).
  int64_t row_keys(int64_t t, int64_t s0, int64_t keys) const {
    return causal ? std::clamp<int64_t>(t - s0 + 1, 0, keys) : keys;
  }
  // The rows [i0, i0 + M) of a query block (rows valid of M, t0 its first) and the keys [0, N) of
  // the key block at s0 (`keys` valid) that they read, N a multiple of kLanes: f(i0, M, N). A
  // block on the causal diagonal goes in groups of kGroupRows rows, each up to its last row's
  // diagonal, so that the masked half of the block is neither multiplied nor exponentiated.
  template <class F>
  void for_row_groups(int64_t t0, int64_t rows, int64_t M, int64_t s0, int64_t keys, F&& f) const {
    const bool diagonal = causal && t0 + rows - 1 >= s0 && t0 < s0 + keys - 1;
    const int64_t step = diagonal ? kGroupRows : M;
    for (int64_t i0 = 0; i0 < M; i0 += step) {
      const int64_t m = std::min(step, M - i0), last = std::min(i0 + m, rows) - 1;
      const int64_t kept = last < i0 ? 0 : row_keys(t0 + last, s0, keys);
      f(i0, m, std::clamp<int64_t>(round_up(kept, kLanes), kLanes, kKeys));
    }
  }
};

Dims dims_of(const Shape& q, const Shape& k, const Params& p) {
  attention::Options o = attention::options_of(p);
  return Dims{q[0],
              q[1],
              q[2],
              q[3],
              k[1],
              k[2],
              q[2] / std::max<int64_t>(k[2], 1),
              o.scale,
              o.is_causal,
              round_up(q[3], kLanes),
              q[2] * q[3],
              k[2] * k[3]};
}

// One source row of H elements as f32 times `scale` into `dst`, zero padded to Hp. (Converting,
// then scaling, as the kernels did in two passes: the same bits.)
template <class T>
inline void load_row(float* dst, const T* src, const Dims& d, float scale) {
  if constexpr (std::is_same_v<T, float>) {
    if (d.H % kLanes == 0) {  // whole vectors, inline (a libc memcpy call per 64-byte row cost 10%)
      for (int64_t h = 0; h < d.H; h += kLanes) storev(dst + h, loadv(src + h) * scale);
      return;
    }
  }
  for (int64_t h = 0; h < d.H; ++h) dst[h] = float(src[h]) * scale;
  std::fill(dst + d.H, dst + d.Hp, 0.0f);
}

// Heads [n0, n1) of rows [r0, r0 + rows) of one batch entry of x ([batch][R] rows `ld` elements
// apart, each [heads][H] from its start) as f32,
// [head][padded][Hp] zero padded (only the padding is zeroed: the buffers are reused from call
// to call). Read in address order (each row's heads are adjacent): a task that read one head's
// rows, H elements every heads * H, missed the cache on every row, which cost more than the
// arithmetic at small head widths.
template <class T>
void load_heads(std::vector<float>& dst, const T* x, int64_t R, int64_t ld, const Dims& d, int64_t b, int64_t r0,
                int64_t rows, int64_t n0, int64_t n1, int64_t padded, float scale = 1.0f) {
  dst.resize(size_t((n1 - n0) * padded * d.Hp));
  for (int64_t i = 0; i < rows; ++i) {
    const T* src = x + (b * R + r0 + i) * ld + n0 * d.H;
    for (int64_t n = 0; n < n1 - n0; ++n) load_row(dst.data() + (n * padded + i) * d.Hp, src + n * d.H, d, scale);
  }
  for (int64_t n = 0; n < n1 - n0; ++n)
    std::fill(dst.data() + (n * padded + rows) * d.Hp, dst.data() + (n + 1) * padded * d.Hp, 0.0f);
}
template <class T>
void store_heads(T* x, const std::vector<float>& src, int64_t R, int64_t ld, const Dims& d, int64_t b, int64_t r0,
                 int64_t rows, int64_t n0, int64_t n1, int64_t padded) {
  for (int64_t i = 0; i < rows; ++i) {
    T* dst = x + (b * R + r0 + i) * ld + n0 * d.H;
    for (int64_t n = 0; n < n1 - n0; ++n) {
      const float* row = src.data() + (n * padded + i) * d.Hp;
      if constexpr (std::is_same_v<T, float>) {
        if (d.H % kLanes == 0) {
          for (int64_t h = 0; h < d.H; h += kLanes) storev(dst + n * d.H + h, loadv(row + h));
          continue;
        }
      }
      for (int64_t h = 0; h < d.H; ++h) dst[n * d.H + h] = T(row[h]);
    }
  }
}

// Key heads [kh0, kh1) of one batch entry's keys or values as f32, zero padded: rows
// [head][S'][Hp] (dQ = dS K and O += P V read them), and per block of kKeys keys the transposed
// panel [Hp][kKeys] (S = Q K^T and dP = dO V^T read those). Each kernel stages only what it reads:
// the forward K's panels and V's rows, the backward K's rows and panels and V's panels.
struct KeyPanels {
  std::vector<float> rows, panels;
  int64_t padded = 0;
  enum Want { kRows = 1, kPanels = 2 };
  template <class T>
  void load(const T* x, const Dims& d, int64_t b, int64_t kh0, int64_t kh1, int64_t end, int want) {
    padded = round_up(std::max<int64_t>(end, 1), kKeys);
    if (want & kRows) load_heads(rows, x, d.S, d.ldkv, d, b, 0, end, kh0, kh1, padded);
    if (!(want & kPanels)) return;
    // Straight from the source, in its address order; the padding (keys past `end`, widths past H)
    // stays zero.
    panels.assign(size_t((kh1 - kh0) * padded * d.Hp), 0.0f);
    int64_t s = 0;
    if constexpr (std::is_same_v<T, float>) {  // 8 x 8 blocks through registers (scalar stores cost 5%)
      if (d.H % 8 == 0)
        for (; s + 8 <= end; s += 8) {  // kKeys is a multiple of 8: a group of 8 keys is in one block
          const int64_t s0 = s / kKeys * kKeys, k = s - s0;
          for (int64_t n = 0; n < kh1 - kh0; ++n)
            for (int64_t h = 0; h < d.H; h += 8)
              transpose_block8(panels.data() + (n * padded + s0) * d.Hp + k + h * kKeys, kKeys,
                               x + (b * d.S + s) * d.ldkv + (kh0 + n) * d.H + h, d.ldkv);
        }
    }
    for (; s < end; ++s) {
      const T* src = x + (b * d.S + s) * d.ldkv + kh0 * d.H;
      const int64_t s0 = s / kKeys * kKeys, k = s - s0;
      for (int64_t n = 0; n < kh1 - kh0; ++n) {
        float* panel = panels.data() + (n * padded + s0) * d.Hp + k;
        for (int64_t h = 0; h < d.H; ++h) panel[h * kKeys] = float(src[n * d.H + h]);
      }
    }
  }
  // Of the n-th loaded head.
  const float* row(int64_t n, int64_t s, const Dims& d) const { return rows.data() + (n * padded + s) * d.Hp; }
  const float* panel(int64_t n, int64_t s0, const Dims& d) const { return panels.data() + (n * padded + s0) * d.Hp; }
};

// A thread's buffers, kept from call to call: a training step runs these kernels hundreds of
// times, and fresh vectors of up to ~100 KB each went through malloc (and mmap) every time.
struct Scratch {
  KeyPanels kp, vp;
  std::vector<float> qrows, orows, dorows, dqrows, dk_acc, dv_acc, p, ds, m, l, delta;
};
// Not inlined: where the compiler saw the thread_local behind the references, it recomputed their
// address with a __tls_get_addr call at every use inside the inner loops (3% of the kernels).
[[gnu::noinline]] Scratch& thread_scratch() {
  thread_local Scratch s;
  return s;
}

// Key heads per task: all of them where that leaves every thread several tasks and the staged keys
// and values in L2, else the largest divisor of K that does (at least one).
int64_t heads_per_task(const Dims& d, int64_t tasks_per_head_group) {
  const int64_t want_tasks = 4 * int64_t(num_threads());
  const int64_t staged_per_head = 4 * round_up(std::max<int64_t>(d.S, 1), kKeys) * d.Hp * int64_t(sizeof(float));
  for (int64_t hg = d.K; hg > 1; --hg) {
    if (d.K % hg != 0) continue;
    if (d.B * (d.K / hg) * tasks_per_head_group >= want_tasks && hg * staged_per_head <= (int64_t(1) << 20)) return hg;
  }
  return 1;
}

// Row i of a logits block of `width` keys, masked from key `kept` on (the causal mask, or past the
// last key).
inline void mask_from(float* row, int64_t kept, int64_t width) {
  if (kept >= width) return;
  const vi lane = lane_index();
  const vf minus_inf = splat(-std::numeric_limits<float>::infinity());
  for (int64_t j = 0; j < width; j += kLanes) {
    const vf x = loadv(row + j);
    storev(row + j, lane + int32_t(j) < int32_t(kept) ? x : minus_inf);
  }
}

template <class T>
void forward_kernel(const T* q, const T* k, const T* v, T* out, float* lse, const Dims& d) {
  const int64_t qb = d.query_blocks(), hg = heads_per_task(d, qb), groups = d.K / hg;
  // A task: one query block of the query heads of key heads [kh0, kh0 + hg) of one batch entry.
  kernel_parallel_for(d.B * groups * qb, 1, [&](int64_t begin, int64_t end) {
    Scratch& scratch = thread_scratch();
    KeyPanels &kp = scratch.kp, &vp = scratch.vp;
    std::vector<float>&qrows = scratch.qrows, &orows = scratch.orows, &p = scratch.p, &m = scratch.m, &l = scratch.l;
    p.resize(size_t(kQuery * kKeys));
    m.resize(kQuery);
    l.resize(kQuery);
    int64_t loaded = -1;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bg = task / qb, b = bg / groups, kh0 = (bg % groups) * hg;
      const int64_t n0 = kh0 * d.G, n1 = (kh0 + hg) * d.G;
      const int64_t t0 = (task % qb) * kQuery, rows = std::min(kQuery, d.T - t0), M = round_up(rows, 8);
      const int64_t s_end = d.key_end(t0, rows);
      if (loaded != bg) {  // the whole needed range of these key heads' keys and values
        const int64_t need = d.key_end(0, d.T);
        kp.load(k, d, b, kh0, kh0 + hg, need, KeyPanels::kPanels);
        vp.load(v, d, b, kh0, kh0 + hg, need, KeyPanels::kRows);
        loaded = bg;
      }
      // (scale q) . k = scale (q . k), to within a rounding.
      load_heads(qrows, q, d.T, d.ldq, d, b, t0, rows, n0, n1, kQuery, float(d.scale));
      orows.assign(qrows.size(), 0.0f);
      for (int64_t n = n0; n < n1; ++n) {
        const int64_t kn = n / d.G - kh0;  // its key head, among the loaded ones
        const float* qn = qrows.data() + (n - n0) * kQuery * d.Hp;
        float* acc = orows.data() + (n - n0) * kQuery * d.Hp;
        std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
        std::fill(l.begin(), l.end(), 0.0f);
        for (int64_t s0 = 0; s0 < s_end; s0 += kKeys) {
          const int64_t keys = std::min(kKeys, s_end - s0);
          d.for_row_groups(t0, rows, M, s0, keys, [&](int64_t i0, int64_t gm, int64_t gn) {
            gemm(p.data() + i0 * kKeys, kKeys, gm, gn, qn + i0 * d.Hp, d.Hp, 1, kp.panel(kn, s0, d), kKeys, d.Hp,
                 false);
            for (int64_t i = i0; i < i0 + gm; ++i) {
              float* pi = p.data() + i * kKeys;
              const int64_t kept = i < rows ? d.row_keys(t0 + i, s0, keys) : 0;
              if (kept == 0) {
                std::fill(pi, pi + gn, 0.0f);
                continue;
              }
              mask_from(pi, kept, gn);
              vf mx = splat(m[size_t(i)]);
              for (int64_t j = 0; j < gn; j += kLanes) {
                vf x = loadv(pi + j);
                mx = x > mx ? x : mx;
              }
              const float row_max = lane_max(mx);
              vf sum = splat(0.0f);
              for (int64_t j = 0; j < gn; j += kLanes) {
                vf e = expv(loadv(pi + j) - row_max);
                storev(pi + j, e);
                sum += e;
              }
              // A row's first key block (its only one at S <= kKeys): nothing to rescale. The
              // correction would be exp(-inf) = 0 and l and o are 0: the same bits, without an
              // exponential per row (a third of the forward's at T = S = 64).
              if (m[size_t(i)] == -std::numeric_limits<float>::infinity()) {
                m[size_t(i)] = row_max;
                l[size_t(i)] = lane_sum(sum);
                continue;
              }
              const float correction = exp1(m[size_t(i)] - row_max);
              m[size_t(i)] = row_max;
              l[size_t(i)] = l[size_t(i)] * correction + lane_sum(sum);
              float* o = acc + i * d.Hp;
              for (int64_t h = 0; h < d.Hp; h += kLanes) storev(o + h, loadv(o + h) * correction);
            }
            gemm(acc + i0 * d.Hp, d.Hp, gm, d.Hp, p.data() + i0 * kKeys, kKeys, 1, vp.row(kn, s0, d), d.Hp, gn, true);
          });
        }
        for (int64_t i = 0; i < rows; ++i) {
          const float li = l[size_t(i)], inv = li > 0 ? 1.0f / li : 0.0f;
          float* o = acc + i * d.Hp;
          for (int64_t h = 0; h < d.Hp; h += kLanes) storev(o + h, loadv(o + h) * inv);
          lse[(b * d.N + n) * d.T + t0 + i] = m[size_t(i)] + std::log(li);
        }
      }
      store_heads(out, orows, d.T, d.N * d.H, d, b, t0, rows, n0, n1, kQuery);
    }
  });
}

template <class T>
void backward_kernel(const T* q, const T* k, const T* v, const T* out, const float* lse, const T* dout, T* dq, T* dk,
                     T* dv, const Dims& d) {
  const int64_t hg = heads_per_task(d, 1), groups = d.K / hg;
  // A task owns key heads [kh0, kh0 + hg) of one batch entry, so its dK and dV accumulate without
  // sharing and every sum runs in a fixed order.
  kernel_parallel_for(d.B * groups, 1, [&](int64_t begin, int64_t end) {
    Scratch& scratch = thread_scratch();
    KeyPanels &kp = scratch.kp, &vp = scratch.vp;
    std::vector<float>&qrows = scratch.qrows, &orow = scratch.orows, &dorows = scratch.dorows, &dqrows = scratch.dqrows,
    &dk_acc = scratch.dk_acc, &dv_acc = scratch.dv_acc, &delta = scratch.delta, &p = scratch.p, &ds = scratch.ds;
    delta.resize(size_t(kQuery * d.N));
    orow.resize(size_t(d.Hp));
    p.resize(size_t(kQuery * kKeys));
    ds.resize(size_t(kQuery * kKeys));
    const float scale = float(d.scale);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / groups, kh0 = (task % groups) * hg, n0 = kh0 * d.G, n1 = (kh0 + hg) * d.G;
      const int64_t need = d.key_end(0, d.T);
      kp.load(k, d, b, kh0, kh0 + hg, need, KeyPanels::kRows | KeyPanels::kPanels);
      vp.load(v, d, b, kh0, kh0 + hg, need, KeyPanels::kPanels);
      dk_acc.assign(kp.rows.size(), 0.0f);
      dv_acc.assign(kp.rows.size(), 0.0f);
      for (int64_t t0 = 0; t0 < d.T; t0 += kQuery) {
        const int64_t rows = std::min(kQuery, d.T - t0), M = round_up(rows, 8), s_end = d.key_end(t0, rows);
        load_heads(qrows, q, d.T, d.ldq, d, b, t0, rows, n0, n1, kQuery, scale);
        load_heads(dorows, dout, d.T, d.N * d.H, d, b, t0, rows, n0, n1, kQuery);
        dqrows.assign(qrows.size(), 0.0f);
        // delta = rowsum(dO o) of every head's rows; o is read only here, a row of heads at a time
        // (in address order, as load_heads does).
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t n = n0; n < n1; ++n) {
            load_row(orow.data(), out + ((b * d.T + t0 + i) * d.N + n) * d.H, d, 1.0f);
            const float* don = dorows.data() + ((n - n0) * kQuery + i) * d.Hp;
            vf s = splat(0.0f);
            for (int64_t h = 0; h < d.Hp; h += kLanes) s += loadv(don + h) * loadv(orow.data() + h);
            delta[size_t((n - n0) * kQuery + i)] = lane_sum(s);
          }
        for (int64_t n = n0; n < n1; ++n) {
          const int64_t kn = n / d.G - kh0;
          const size_t at = size_t((n - n0) * kQuery * d.Hp);
          const float *qn = qrows.data() + at, *don = dorows.data() + at;
          float* dqn = dqrows.data() + at;
          float* dkn = dk_acc.data() + kn * kp.padded * d.Hp;
          float* dvn = dv_acc.data() + kn * kp.padded * d.Hp;
          const float* row_delta = delta.data() + (n - n0) * kQuery;
          const float* row_lse = lse + (b * d.N + n) * d.T + t0;
          for (int64_t s0 = 0; s0 < s_end; s0 += kKeys) {
            const int64_t keys = std::min(kKeys, s_end - s0);
            d.for_row_groups(t0, rows, M, s0, keys, [&](int64_t i0, int64_t gm, int64_t gn) {
              float *pg = p.data() + i0 * kKeys, *dsg = ds.data() + i0 * kKeys;
              const float *qg = qn + i0 * d.Hp, *dog = don + i0 * d.Hp;
              gemm(pg, kKeys, gm, gn, qg, d.Hp, 1, kp.panel(kn, s0, d), kKeys, d.Hp, false);
              gemm(dsg, kKeys, gm, gn, dog, d.Hp, 1, vp.panel(kn, s0, d), kKeys, d.Hp, false);  // dP
              for (int64_t i = i0; i < i0 + gm; ++i) {
                float* pi = p.data() + i * kKeys;
                float* dsi = ds.data() + i * kKeys;
                const int64_t kept = i < rows ? d.row_keys(t0 + i, s0, keys) : 0;
                if (kept == 0) {
                  std::fill(pi, pi + gn, 0.0f);
                  std::fill(dsi, dsi + gn, 0.0f);
                  continue;
                }
                mask_from(pi, kept, gn);
                for (int64_t j = 0; j < gn; j += kLanes) {
                  const vf pj = expv(loadv(pi + j) - row_lse[i]);
                  storev(pi + j, pj);
                  storev(dsi + j, pj * (loadv(dsi + j) - row_delta[i]));  // dS / scale
                }
              }
              gemm(dvn + s0 * d.Hp, d.Hp, gn, d.Hp, pg, 1, kKeys, dog, d.Hp, gm, true);
              gemm(dkn + s0 * d.Hp, d.Hp, gn, d.Hp, dsg, 1, kKeys, qg, d.Hp, gm, true);
              gemm(dqn + i0 * d.Hp, d.Hp, gm, d.Hp, dsg, kKeys, 1, kp.row(kn, s0, d), d.Hp, gn, true);
            });
          }
          // dK took dS / scale against scale q; dQ = scale (dS / scale) K.
          for (int64_t i = 0; i < rows * d.Hp; i += kLanes) storev(dqn + i, loadv(dqn + i) * scale);
        }
        store_heads(dq, dqrows, d.T, d.ldq, d, b, t0, rows, n0, n1, kQuery);
      }
      // Keys no query reads (causal, S > T) have zero gradients: the accumulators' rows past `need`
      // are zero, and the rows past the padding are written from a zero block.
      store_heads(dk, dk_acc, d.S, d.ldkv, d, b, 0, need, kh0, kh0 + hg, kp.padded);
      store_heads(dv, dv_acc, d.S, d.ldkv, d, b, 0, need, kh0, kh0 + hg, kp.padded);
      if (need < d.S) {
        std::vector<float> zeros(size_t(hg * (d.S - need) * d.Hp), 0.0f);
        store_heads(dk, zeros, d.S, d.ldkv, d, b, need, d.S - need, kh0, kh0 + hg, d.S - need);
        store_heads(dv, zeros, d.S, d.ldkv, d, b, need, d.S - need, kh0, kh0 + hg, d.S - need);
      }
    }
  });
}

template <class F>
void visit_attention_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::float32: return f(float{});
    case DType::bfloat16: return f(bfloat16_t{});
    case DType::float16: return f(float16_t{});
    default: throw DTypeError(fmt::format("flash_attention: no CPU kernel for {}", dtype_name(dtype)));
  }
}

// The kernels' operands: q, k and v (and dq, dk, dv) as three arrays, or packed as column ranges
// of one x's rows (and of dx's): their Dims, and where each starts.
struct Operands {
  Dims d;
  bool packed;
  int64_t offset[3] = {0, 0, 0};
  // q, k, v (or dq, dk, dv): the data of a[0], a[1], a[2], or three column ranges of a[0]'s.
  template <class P, class Arrays>
  std::array<P*, 3> of(const Arrays& a) const {
    P* first = data_ptr<P>(a[0]);
    if (packed) return {first + offset[0], first + offset[1], first + offset[2]};
    return {first, data_ptr<P>(a[1]), data_ptr<P>(a[2])};
  }
};
Operands operands_of(std::span<const Array> in, const Params& p, bool packed) {
  if (!packed) return Operands{dims_of(in[0].shape(), in[1].shape(), p), false};
  attention::Packing pk = attention::packing_of(p);
  const Shape& xs = in[0].shape();
  Operands o{dims_of(pk.q_shape, pk.kv_shape, p), true, {pk.offset(xs, 0), pk.offset(xs, 1), pk.offset(xs, 2)}};
  o.d.ldq = o.d.ldkv = pk.row_width(xs);
  return o;
}

}  // namespace

// The kernel-table entries of flash_attention and flash_attention_packed (one input: packed).
std::vector<Array> forward_impl(std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
  Device dev = concrete(in[0])->device();
  Array out = make_uninitialized(out_avals[0], dev), lse = make_uninitialized(out_avals[1], dev);
  for (const Array& x : in) concrete(x);
  const Operands ops = operands_of(in, p, in.size() == 1);
  if (out.size() > 0)
    visit_attention_dtype(in[0].dtype(), [&](auto tag) {
      using T = decltype(tag);
      auto [q, k, v] = ops.of<const T>(in);
      forward_kernel(q, k, v, data_ptr<T>(out), data_ptr<float>(lse), ops.d);
    });
  return {out, lse};
}

// Of flash_attention_backward and flash_attention_backward_packed (four inputs: packed).
std::vector<Array> backward_impl(std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
  Device dev = concrete(in[0])->device();
  std::vector<Array> outs;
  for (const AbstractValue& a : out_avals) outs.push_back(make_uninitialized(a, dev));
  for (const Array& x : in) concrete(x);
  // Packed: (x, o, lse, do) -> dx; else (q, k, v, o, lse, do) -> (dq, dk, dv).
  const bool packed = in.size() == 4;
  const size_t res = packed ? 1 : 3;  // where o, lse and do start
  const Operands ops = operands_of(in, p, packed);
  const Dims& d = ops.d;
  visit_attention_dtype(in[0].dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (d.B * d.S * d.K * d.H == 0) {  // no keys: every gradient is zero
      for (Array& o : outs) std::memset(raw_ptr(o), 0, size_t(o.size()) * sizeof(T));
      return;
    }
    auto [q, k, v] = ops.of<const T>(in);
    auto [dq, dk, dv] = ops.of<T>(outs);
    backward_kernel(q, k, v, data_ptr<const T>(in[res]), data_ptr<const float>(in[res + 1]),
                    data_ptr<const T>(in[res + 2]), dq, dk, dv, d);
  });
  return outs;
}

}  // namespace cjax::cpu::CJAX_ATTENTION_NS
