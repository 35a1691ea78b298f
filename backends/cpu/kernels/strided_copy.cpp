// The host strided copy (strided_copy.h).
#include "backends/cpu/kernels/strided_copy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "backends/cpu/kernels/transpose8.h"
#include "cjax/errors.h"
#include "core/array/util.h"
#include "core/array/visit_dtype.h"
#include "core/backend/parallel.h"

namespace cjax::cpu {
namespace {

constexpr int64_t kTile = 32;  // transpose tile edge

struct Dims {
  std::vector<int64_t> shape, ds, ss;
};

// Drops size-1 dimensions and merges adjacent dimensions that are contiguous in both operands.
Dims collapse(const std::vector<int64_t>& shape, const std::vector<int64_t>& ds, const std::vector<int64_t>& ss) {
  Dims r;
  for (size_t j = 0; j < shape.size(); ++j) {
    if (shape[j] == 1) continue;
    if (!r.shape.empty() && r.ss.back() == ss[j] * shape[j] && r.ds.back() == ds[j] * shape[j]) {
      r.shape.back() *= shape[j];
      r.ss.back() = ss[j];
      r.ds.back() = ds[j];
    } else {
      r.shape.push_back(shape[j]);
      r.ds.push_back(ds[j]);
      r.ss.push_back(ss[j]);
    }
  }
  return r;
}

template <class U>
inline void copy_run(U* d, int64_t ds, const U* s, int64_t ss, int64_t n) {
  if (ds == 1 && ss == 1) {
    std::memcpy(d, s, size_t(n) * sizeof(U));
  } else if (ss == 0) {
    U v = *s;
    if (ds == 1)
      std::fill_n(d, n, v);
    else
      for (int64_t i = 0; i < n; ++i) d[i * ds] = v;
  } else if (ds == 1) {
    for (int64_t i = 0; i < n; ++i) d[i] = s[i * ss];
  } else {
    for (int64_t i = 0; i < n; ++i) d[i * ds] = s[i * ss];
  }
}

// Iterates the multi-index over `dims` (a subset of positions of `d`), starting at linear index
// `start`, keeping the element offsets of both operands.
struct OuterIter {
  const Dims& d;
  const std::vector<int>& dims;
  std::vector<int64_t> idx;
  int64_t doff = 0, soff = 0;
  OuterIter(const Dims& d_, const std::vector<int>& dims_, int64_t start) : d(d_), dims(dims_), idx(dims_.size()) {
    for (size_t q = dims.size(); q-- > 0;) {
      int k = dims[q];
      idx[q] = start % d.shape[size_t(k)];
      start /= d.shape[size_t(k)];
      doff += idx[q] * d.ds[size_t(k)];
      soff += idx[q] * d.ss[size_t(k)];
    }
  }
  void next() {
    for (size_t q = dims.size(); q-- > 0;) {
      size_t k = size_t(dims[q]);
      doff += d.ds[k];
      soff += d.ss[k];
      if (++idx[q] < d.shape[k]) return;
      doff -= d.ds[k] * d.shape[k];
      soff -= d.ss[k] * d.shape[k];
      idx[q] = 0;
    }
  }
};

template <class U>
void copy_typed(U* dst, const U* src, const Dims& d) {
  const int r = int(d.shape.size());
  if (r == 0) {
    *dst = *src;
    return;
  }
  const int last = r - 1;
  const int64_t n_in = d.shape[size_t(last)], dsl = d.ds[size_t(last)], ssl = d.ss[size_t(last)];

  // Cache-blocked transpose: the output is contiguous along `last` but the input is not, and some
  // other dimension `k` is contiguous in the input.
  if (r >= 2 && dsl == 1 && ssl != 1 && ssl != 0 && n_in >= 2 * kTile) {
    int k = -1;
    for (int q = 0; q < last; ++q)
      if (d.ss[size_t(q)] == 1 && d.shape[size_t(q)] >= 2 * kTile) k = q;
    if (k >= 0) {
      std::vector<int> outer;
      for (int q = 0; q < last; ++q)
        if (q != k) outer.push_back(q);
      int64_t n_outer = 1;
      for (int q : outer) n_outer *= d.shape[size_t(q)];
      const int64_t nk = d.shape[size_t(k)], dsk = d.ds[size_t(k)];
      const int64_t k_tiles = (nk + kTile - 1) / kTile;
      const int64_t items = n_outer * k_tiles;
      const int64_t grain = std::max<int64_t>(1, kCopyGrain / (kTile * n_in));
      parallel_for(items, grain, [&](int64_t b, int64_t e) {
        OuterIter it(d, outer, b / k_tiles);
        int64_t kt = b % k_tiles;
        for (int64_t w = b; w < e; ++w) {
          U* dp = dst + it.doff;
          const U* sp = src + it.soff;
          const int64_t k0 = kt * kTile, k1 = std::min(nk, k0 + kTile);
          for (int64_t j0 = 0; j0 < n_in; j0 += kTile) {
            const int64_t j1 = std::min(n_in, j0 + kTile);
            int64_t i = k0;
            if constexpr (sizeof(U) == 4) {
              // Whole 8 x 8 blocks through registers (the scalar loop below ran an FSDP step's
              // weight-gradient transposes, f32[3,8,16,128] -> [3,128,8,16], at ~3 GB/s).
              const int64_t jv = j0 + (j1 - j0) / 8 * 8;
              for (; i + 8 <= k1; i += 8) {
                for (int64_t j = j0; j < jv; j += 8) transpose_block8(dp + i * dsk + j, dsk, sp + i + j * ssl, ssl);
                for (int64_t r = i; r < i + 8; ++r)
                  for (int64_t j = jv; j < j1; ++j) dp[r * dsk + j] = sp[r + j * ssl];
              }
            }
            for (; i < k1; ++i) {
              U* drow = dp + i * dsk;
              const U* scol = sp + i;
              for (int64_t j = j0; j < j1; ++j) drow[j] = scol[j * ssl];
            }
          }
          if (++kt == k_tiles) {
            kt = 0;
            it.next();
          }
        }
      });
      return;
    }
  }

  std::vector<int> outer(static_cast<size_t>(last), 0);
  std::iota(outer.begin(), outer.end(), 0);
  int64_t n_outer = 1;
  for (int q : outer) n_outer *= d.shape[size_t(q)];
  const int64_t grain = std::max<int64_t>(1, kCopyGrain / std::max<int64_t>(1, n_in));
  parallel_for(n_outer, grain, [&](int64_t b, int64_t e) {
    OuterIter it(d, outer, b);
    for (int64_t o = b; o < e; ++o) {
      copy_run(dst + it.doff, dsl, src + it.soff, ssl, n_in);
      it.next();
    }
  });
}

template <class F>
void visit_itemsize(size_t itemsize, F&& f) {
  switch (itemsize) {
    case 1: return f(Tag<uint8_t>{});
    case 2: return f(Tag<uint16_t>{});
    case 4: return f(Tag<uint32_t>{});
    case 8: return f(Tag<uint64_t>{});
  }
  throw Error(fmt::format("internal: strided_copy does not support item size {}", itemsize));
}

}  // namespace

void strided_copy(void* dst, const std::vector<int64_t>& dst_strides, const void* src,
                  const std::vector<int64_t>& src_strides, const std::vector<int64_t>& shape, size_t itemsize) {
  for (int64_t s : shape)
    if (s == 0) return;
  Dims d = collapse(shape, dst_strides, src_strides);
  visit_itemsize(itemsize, [&](auto tag) {
    using U = typename decltype(tag)::type;
    copy_typed<U>(static_cast<U*>(dst), static_cast<const U*>(src), d);
  });
}

void fill_items(void* dst, int64_t n, const void* value, size_t itemsize) {
  if (n <= 0) return;
  visit_itemsize(itemsize, [&](auto tag) {
    using U = typename decltype(tag)::type;
    U v;
    std::memcpy(&v, value, sizeof(U));
    U* p = static_cast<U*>(dst);
    parallel_for(n, kCopyGrain, [&](int64_t b, int64_t e) { std::fill(p + b, p + e, v); });
  });
}

void copy_block_into(char* dst, const Shape& dst_shape, const std::vector<int64_t>& starts, const char* src,
                     const Shape& shape, size_t isz) {
  auto dst_st = row_major_strides(dst_shape);
  int64_t off = 0;
  for (size_t i = 0; i < starts.size(); ++i) off += starts[i] * dst_st[i];
  strided_copy(dst + off * int64_t(isz), dst_st, src, row_major_strides(shape), shape, isz);
}

}  // namespace cjax::cpu
