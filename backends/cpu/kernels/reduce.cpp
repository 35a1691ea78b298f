// Reduction primitives (reduce_sum/max/min/prod/and/or, argmax/argmin) and cumulative primitives
// (cumsum/cumprod/cummax/cummin/cumlogsumexp) (core/lax/reduce.cpp): the CPU kernels.
//
// Numerics and determinism:
//  * bfloat16/float16 accumulate in float32; float32 and float64 in their own type; integer sums and
//    products wrap (two's complement) like XLA, computed in unsigned arithmetic.
//  * Every reduction is split into FIXED blocks that depend only on the shape (never on the thread
//    count): a contiguous run of kBlock elements is reduced with K independent accumulators (a
//    vectorizable loop) combined by a fixed pairwise tree, and block results are combined in block
//    order. So results are bit-identical run to run whatever the number of threads.
//  * Reducing an outer axis ([O, R, I] with I > 1) streams rows and adds them into an accumulator
//    row (contiguous, vectorizable) instead of striding through memory.
//  * max/min propagate NaN (like XLA); argmax/argmin treat NaN as the extreme value (first NaN wins,
//    as JAX does) and return the first occurrence on ties.
#include "core/lax/reduce.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <type_traits>

#include "backends/cpu/kernels/scratch.h"
#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/array/primitive.h"
#include "core/array/util.h"
#include "core/array/visit_dtype.h"
#include "core/backend/backend.h"
#include "core/backend/parallel.h"
#include "core/lax/scalar_fns.h"

namespace cjax::cpu {
namespace {

constexpr int64_t kBlock = 1 << 15;  // elements per fixed reduction block (shape-only decomposition)

// Uninitialized scratch memory (std::vector<bool> has no data(); kernels need a plain array),
// from the thread's cache (scratch.h).
template <class T>
using Scratch = ScratchArray<T>;

// ---- accumulator types and scalar ops ----
template <class T>
struct WrapInt {
  using type = std::conditional_t<(sizeof(T) <= 4), uint32_t, uint64_t>;
};
template <RedOp op, class T>
struct AccOf {
  using type = compute_t<T>;
};
template <class T>
struct AccOf<RedOp::Sum, T> {
  using type =
      std::conditional_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, typename WrapInt<T>::type, compute_t<T>>;
};
template <class T>
struct AccOf<RedOp::Prod, T> : AccOf<RedOp::Sum, T> {};
template <RedOp op, class T>
using acc_t = typename AccOf<op, T>::type;

template <class A>
inline bool is_nan(A v) {
  if constexpr (std::is_floating_point_v<A>)
    return v != v;
  else
    return false;
}

template <RedOp op, class A>
struct Red {
  static A identity() {
    if constexpr (op == RedOp::Sum || op == RedOp::Or)
      return A(0);
    else if constexpr (op == RedOp::Prod)
      return A(1);
    else if constexpr (op == RedOp::And) {
      if constexpr (std::is_same_v<A, bool>)
        return true;
      else
        return A(~A(0));
    } else if constexpr (op == RedOp::Max || op == RedOp::LogAddExp) {
      if constexpr (std::is_same_v<A, bool>)
        return false;
      else if constexpr (std::is_floating_point_v<A>)
        return -std::numeric_limits<A>::infinity();
      else
        return std::numeric_limits<A>::lowest();
    } else {  // Min
      if constexpr (std::is_same_v<A, bool>)
        return true;
      else if constexpr (std::is_floating_point_v<A>)
        return std::numeric_limits<A>::infinity();
      else
        return std::numeric_limits<A>::max();
    }
  }
  static inline A apply(A a, A x) {
    if constexpr (op == RedOp::Sum)
      return scalar::wrap_add(a, x);  // integers wrap, as in XLA
    else if constexpr (op == RedOp::Prod)
      return scalar::wrap_mul(a, x);
    else if constexpr (op == RedOp::And) {
      if constexpr (std::is_same_v<A, bool>)
        return a && x;
      else
        return A(a & x);
    } else if constexpr (op == RedOp::Or) {
      if constexpr (std::is_same_v<A, bool>)
        return a || x;
      else
        return A(a | x);
    } else if constexpr (op == RedOp::Max) {
      if constexpr (std::is_same_v<A, bool>)
        return a || x;
      else if constexpr (std::is_floating_point_v<A>)
        return ((x > a) | (x != x)) ? x : a;  // NaN sticks
      else
        return x > a ? x : a;
    } else if constexpr (op == RedOp::Min) {
      if constexpr (std::is_same_v<A, bool>)
        return a && x;
      else if constexpr (std::is_floating_point_v<A>)
        return ((x < a) | (x != x)) ? x : a;
      else
        return x < a ? x : a;
    } else {  // LogAddExp (floating only)
      if (a != a || x != x) return a + x;
      A m = a > x ? a : x, d = a > x ? x - a : a - x;
      if (std::isinf(m)) return m;  // both -inf, or one +inf
      return m + std::log1p(std::exp(d));
    }
  }
};

template <class A, class In>
inline A load_as(const In& v) {
  if constexpr (std::is_same_v<In, bool>)
    return A(v);
  else
    return A(compute_t<In>(v));
}
template <class Out, class A>
inline Out store_as(A v) {
  if constexpr (is_half_v<Out>)
    return Out(float(v));
  else
    return Out(v);
}

// ---- max/min of float/double with explicit 256-bit vectors (GCC -O2 does not if-convert the
// NaN-propagating select in scalar code) ----
template <RedOp op, class A>
constexpr bool kVecMinMax = (op == RedOp::Max || op == RedOp::Min) &&
                            (std::is_same_v<A, float> || std::is_same_v<A, double>);
template <class A>
struct Vec256Of;
template <>
struct Vec256Of<float> {
  typedef float type __attribute__((vector_size(32)));
};
template <>
struct Vec256Of<double> {
  typedef double type __attribute__((vector_size(32)));
};
template <class A>
using Vec256 = typename Vec256Of<A>::type;
template <RedOp op, class V>
inline V vec_apply(V a, V x) {
  if constexpr (op == RedOp::Max)
    return ((x > a) | (x != x)) ? x : a;
  else
    return ((x < a) | (x != x)) ? x : a;
}
template <RedOp op, class A>
A reduce_contig_vec(const A* __restrict x, int64_t n) {
  using R = Red<op, A>;
  using V = Vec256<A>;
  constexpr int W = int(32 / sizeof(A)), NV = 4;
  V acc[NV];
  for (int j = 0; j < NV; ++j)
    for (int l = 0; l < W; ++l) acc[j][l] = R::identity();
  int64_t i = 0;
  for (; i + W * NV <= n; i += W * NV) {
#pragma GCC unroll 4
    for (int j = 0; j < NV; ++j) {
      V v;
      std::memcpy(&v, x + i + j * W, sizeof(V));
      acc[j] = vec_apply<op>(acc[j], v);
    }
  }
  A r = R::identity();
  for (int j = 0; j < NV; ++j)
    for (int l = 0; l < W; ++l) r = R::apply(r, acc[j][l]);
  for (; i < n; ++i) r = R::apply(r, x[i]);
  return r;
}

// ---- contiguous reduction of one run with K independent accumulators ----
template <RedOp op, class In, class A>
A reduce_contig(const In* __restrict x, int64_t n) {
  using R = Red<op, A>;
  if constexpr (kVecMinMax<op, A> && std::is_same_v<In, A>) return reduce_contig_vec<op, A>(x, n);
  constexpr int K = sizeof(A) >= 8 ? 16 : 32;  // 4 (AVX2) / 2 (AVX-512) vector registers of accumulators
  A acc[K];
  for (int j = 0; j < K; ++j) acc[j] = R::identity();
  int64_t i = 0;
  for (; i + K <= n; i += K)
#pragma GCC unroll 32
    for (int j = 0; j < K; ++j) acc[j] = R::apply(acc[j], load_as<A>(x[i + j]));
  A tail = R::identity();
  for (; i < n; ++i) tail = R::apply(tail, load_as<A>(x[i]));
  for (int w = K / 2; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) acc[j] = R::apply(acc[j], acc[j + w]);
  return R::apply(acc[0], tail);
}

// acc[c] = op(acc[c], x[r * stride + c]) for r < rows, c < ncols: rows streamed into an accumulator row.
template <RedOp op, class In, class A>
void reduce_rows(const In* __restrict x, int64_t rows, int64_t stride, int64_t ncols, A* __restrict acc) {
  using R = Red<op, A>;
  constexpr int K = 64 / sizeof(A) < 8 ? 8 : 64 / sizeof(A);
  for (int64_t r = 0; r < rows; ++r) {
    const In* __restrict row = x + r * stride;
    int64_t c = 0;
    if constexpr (kVecMinMax<op, A> && std::is_same_v<In, A>) {
      using V = Vec256<A>;
      constexpr int W = int(32 / sizeof(A));
      for (; c + W <= ncols; c += W) {
        V a, v;
        std::memcpy(&a, acc + c, sizeof(V));
        std::memcpy(&v, row + c, sizeof(V));
        a = vec_apply<op>(a, v);
        std::memcpy(acc + c, &a, sizeof(V));
      }
    }
    for (; c + K <= ncols; c += K)
#pragma GCC unroll 16
      for (int j = 0; j < K; ++j) acc[c + j] = R::apply(acc[c + j], load_as<A>(row[c + j]));
    for (; c < ncols; ++c) acc[c] = R::apply(acc[c], load_as<A>(row[c]));
  }
}

// out[o, i] = reduce_r x[o, r, i]   (out holds O*I accumulators)
template <RedOp op, class In, class A>
void reduce_ori(const In* x, A* out, int64_t O, int64_t R, int64_t I) {
  using Rd = Red<op, A>;
  int64_t n_out = O * I;
  if (n_out == 0) return;
  if (R == 0) {
    std::fill(out, out + n_out, Rd::identity());
    return;
  }
  if (I == 1) {
    int64_t nb = (R + kBlock - 1) / kBlock;
    if (nb == 1) {
      parallel_for(O, std::max<int64_t>(1, kBlock / R), [&](int64_t b, int64_t e) {
        for (int64_t o = b; o < e; ++o) out[o] = reduce_contig<op, In, A>(x + o * R, R);
      });
      return;
    }
    Scratch<A> part(O * nb);
    parallel_for(O * nb, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int64_t o = t / nb, blk = t % nb, s = blk * kBlock;
        part[t] = reduce_contig<op, In, A>(x + o * R + s, std::min(kBlock, R - s));
      }
    });
    for (int64_t o = 0; o < O; ++o) {
      A a = part[o * nb];
      for (int64_t blk = 1; blk < nb; ++blk) a = Rd::apply(a, part[o * nb + blk]);
      out[o] = a;
    }
    return;
  }
  // Outer-axis reduction: blocks of Rb rows (fixed by the shape), column chunks of up to kBlock.
  int64_t Rb = I >= kBlock ? R : std::max<int64_t>(256, kBlock / I);
  int64_t nb = (R + Rb - 1) / Rb;
  int64_t Cc = std::min(I, kBlock), ncc = (I + Cc - 1) / Cc;
  Scratch<A> part(nb > 1 ? O * nb * I : 0);
  int64_t task_cost = std::min(Rb, R) * Cc;
  parallel_for(O * nb * ncc, std::max<int64_t>(1, kBlock / task_cost), [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      int64_t cc = t % ncc, blk = (t / ncc) % nb, o = t / (ncc * nb);
      int64_t c0 = cc * Cc, nc = std::min(Cc, I - c0), r0 = blk * Rb, nr = std::min(Rb, R - r0);
      A* dst = nb > 1 ? part.data() + (o * nb + blk) * I + c0 : out + o * I + c0;
      std::fill(dst, dst + nc, Rd::identity());
      reduce_rows<op, In, A>(x + (o * R + r0) * I + c0, nr, I, nc, dst);
    }
  });
  if (nb > 1) {
    parallel_for(O * ncc, 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        int64_t o = t / ncc, c0 = (t % ncc) * Cc, nc = std::min(Cc, I - c0);
        A* dst = out + o * I + c0;
        std::copy(part.data() + o * nb * I + c0, part.data() + o * nb * I + c0 + nc, dst);
        for (int64_t blk = 1; blk < nb; ++blk) {
          const A* src = part.data() + (o * nb + blk) * I + c0;
          for (int64_t c = 0; c < nc; ++c) dst[c] = Rd::apply(dst[c], src[c]);
        }
      }
    });
  }
}

struct Group {
  int64_t size;
  bool reduced;
};
// Drops size-1 dims and merges neighbours of the same kind. Empty result: nothing to reduce.
std::vector<Group> collapse(const Shape& shape, const std::vector<int64_t>& axes) {
  std::vector<Group> g;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool red = std::find(axes.begin(), axes.end(), int64_t(d)) != axes.end();
    if (!g.empty() && g.back().reduced == red)
      g.back().size *= shape[d];
    else
      g.push_back({shape[d], red});
  }
  return g;
}

template <class Out, class A>
void store_all(const A* src, Out* dst, int64_t n) {
  parallel_for(n, kBlock, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dst[i] = store_as<Out>(src[i]);
  });
}

// Reduces x (shape) over axes into y (of the same element type as x).
template <RedOp op, class T>
void run_reduce(const T* x, T* y, const Shape& shape, const std::vector<int64_t>& axes) {
  using A = acc_t<op, T>;
  int64_t n_out = 1;
  for (size_t d = 0; d < shape.size(); ++d)
    if (std::find(axes.begin(), axes.end(), int64_t(d)) == axes.end()) n_out *= shape[d];
  if (n_out == 0) return;
  if (shape_size(shape) == 0) {  // a reduced axis has size 0: the identity everywhere
    std::fill(y, y + n_out, store_as<T>(Red<op, A>::identity()));
    return;
  }
  std::vector<Group> g = collapse(shape, axes);
  auto last_reduced = [&]() -> int {
    for (int j = int(g.size()) - 1; j >= 0; --j)
      if (g[size_t(j)].reduced) return j;
    return -1;
  };
  int j = last_reduced();
  if (j < 0) {  // only size-1 axes reduced: a copy
    std::copy(x, x + n_out, y);
    return;
  }
  constexpr bool direct = std::is_same_v<A, T>;
  Scratch<A> cur, next;
  bool first = true;
  while (j >= 0) {
    int64_t O = 1, I = 1;
    for (int k = 0; k < j; ++k) O *= g[size_t(k)].size;
    for (size_t k = size_t(j) + 1; k < g.size(); ++k) I *= g[k].size;
    int64_t R = g[size_t(j)].size;
    // remove the group and merge its (kept) neighbours
    g.erase(g.begin() + j);
    if (j > 0 && size_t(j) < g.size() && g[size_t(j - 1)].reduced == g[size_t(j)].reduced) {
      g[size_t(j - 1)].size *= g[size_t(j)].size;
      g.erase(g.begin() + j);
    }
    int nj = last_reduced();
    A* dst;
    if (nj < 0 && direct)
      dst = reinterpret_cast<A*>(y);
    else {
      next.resize(O * I);
      dst = next.data();
    }
    if (first)
      reduce_ori<op, T, A>(x, dst, O, R, I);
    else
      reduce_ori<op, A, A>(cur.data(), dst, O, R, I);
    first = false;
    if (dst == next.data()) std::swap(cur, next);
    j = nj;
  }
  if constexpr (!direct) store_all<T, A>(cur.data(), y, n_out);
}

// ---- argmax / argmin ----
template <bool is_max, class V>
inline bool better(V v, V best) {
  if constexpr (is_max)
    return v > best || (is_nan(v) && !is_nan(best));
  else
    return v < best || (is_nan(v) && !is_nan(best));
}
template <bool is_max, class T, class Idx>
void run_argminmax(const T* x, Idx* out, int64_t O, int64_t R, int64_t I) {
  using V = compute_t<T>;
  if (O * I == 0) return;
  if (I == 1) {
    parallel_for(O, std::max<int64_t>(1, kBlock / R), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        const T* row = x + o * R;
        V best = V(row[0]);
        int64_t bi = 0;
        if (!is_nan(best))
          for (int64_t r = 1; r < R; ++r) {
            V v = V(row[r]);
            if (better<is_max>(v, best)) {
              best = v;
              bi = r;
              if (is_nan(v)) break;
            }
          }
        out[o] = Idx(bi);
      }
    });
    return;
  }
  int64_t Cc = std::min<int64_t>(I, 4096), ncc = (I + Cc - 1) / Cc;
  parallel_for(O * ncc, std::max<int64_t>(1, kBlock / (R * Cc)), [&](int64_t b, int64_t e) {
    Scratch<V> best(Cc);
    Scratch<Idx> idx(Cc);
    for (int64_t t = b; t < e; ++t) {
      int64_t o = t / ncc, c0 = (t % ncc) * Cc, nc = std::min(Cc, I - c0);
      const T* base = x + o * R * I + c0;
      for (int64_t c = 0; c < nc; ++c) {
        best[c] = V(base[c]);
        idx[c] = Idx(0);
      }
      for (int64_t r = 1; r < R; ++r) {
        const T* row = base + r * I;
        for (int64_t c = 0; c < nc; ++c) {
          V v = V(row[c]);
          if (better<is_max>(v, best[c])) {
            best[c] = v;
            idx[c] = Idx(r);
          }
        }
      }
      std::copy(idx.data(), idx.data() + nc, out + o * I + c0);
    }
  });
}

// ---- cumulative ops ----
template <RedOp op, class T>
using cum_acc_t = std::conditional_t<op == RedOp::LogAddExp, compute_t<T>, acc_t<op, T>>;

template <RedOp op, class T>
void run_cumulative(const T* x, T* y, int64_t O, int64_t R, int64_t I, bool reverse) {
  using A = cum_acc_t<op, T>;
  using Rd = Red<op, A>;
  if (O * R * I == 0) return;
  auto rix = [&](int64_t k) { return reverse ? R - 1 - k : k; };
  if (I == 1) {
    parallel_for(O, std::max<int64_t>(1, kBlock / R), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) {
        const T* xr = x + o * R;
        T* yr = y + o * R;
        A acc = Rd::identity();
        for (int64_t k = 0; k < R; ++k) {
          int64_t r = rix(k);
          acc = Rd::apply(acc, load_as<A>(xr[r]));
          yr[r] = store_as<T>(acc);
        }
      }
    });
    return;
  }
  int64_t Cc = std::min<int64_t>(I, 4096), ncc = (I + Cc - 1) / Cc;
  parallel_for(O * ncc, std::max<int64_t>(1, kBlock / (R * Cc)), [&](int64_t b, int64_t e) {
    Scratch<A> acc(Cc);
    for (int64_t t = b; t < e; ++t) {
      int64_t o = t / ncc, c0 = (t % ncc) * Cc, nc = std::min(Cc, I - c0);
      std::fill(acc.data(), acc.data() + nc, Rd::identity());
      A* __restrict a = acc.data();
      for (int64_t k = 0; k < R; ++k) {
        int64_t r = rix(k);
        const T* __restrict xr = x + (o * R + r) * I + c0;
        T* __restrict yr = y + (o * R + r) * I + c0;
        for (int64_t c = 0; c < nc; ++c) {
          a[c] = Rd::apply(a[c], load_as<A>(xr[c]));
          yr[c] = store_as<T>(a[c]);
        }
      }
    }
  });
}

// [O, R, I] view of `shape` around `axis`.
void ori(const Shape& shape, int64_t axis, int64_t& O, int64_t& R, int64_t& I) {
  O = 1;
  I = 1;
  for (int64_t d = 0; d < axis; ++d) O *= shape[size_t(d)];
  R = shape[size_t(axis)];
  for (size_t d = size_t(axis) + 1; d < shape.size(); ++d) I *= shape[d];
}

template <RedOp op>
std::vector<Array> reduce_kernel(std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
  Array out = make_uninitialized(out_avals[0], concrete(in[0])->device());
  visit_dtype(in[0].dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr bool ok = (op == RedOp::Sum || op == RedOp::Prod) ? !std::is_same_v<T, bool>
                        : (op == RedOp::And || op == RedOp::Or) ? !is_float_like_v<T>
                                                                : true;
    if constexpr (ok) run_reduce<op, T>(data_ptr<const T>(in[0]), data_ptr<T>(out), in[0].shape(), p.ints("axes"));
  });
  return std::vector<Array>{out};
}

template <bool is_max>
std::vector<Array> arg_kernel(std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
  Array out = make_uninitialized(out_avals[0], concrete(in[0])->device());
  int64_t O, R, I;
  ori(in[0].shape(), p.ints("axes")[0], O, R, I);
  visit_dtype(in[0].dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    visit_dtype(out.dtype(), [&](auto itag) {
      using Idx = typename decltype(itag)::type;
      if constexpr (std::is_integral_v<Idx> && !std::is_same_v<Idx, bool>)
        run_argminmax<is_max, T, Idx>(data_ptr<const T>(in[0]), data_ptr<Idx>(out), O, R, I);
    });
  });
  return std::vector<Array>{out};
}

template <RedOp op>
std::vector<Array> cumulative_kernel(std::span<const Array> in, std::span<const AbstractValue> out_avals,
                                     const Params& p) {
  Array out = make_uninitialized(out_avals[0], concrete(in[0])->device());
  int64_t O, R, I;
  ori(in[0].shape(), p.i("axis"), O, R, I);
  bool reverse = p.get<bool>("reverse");
  visit_dtype(in[0].dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    constexpr bool ok = op == RedOp::LogAddExp ? is_float_like_v<T> : !std::is_same_v<T, bool>;
    if constexpr (ok) run_cumulative<op, T>(data_ptr<const T>(in[0]), data_ptr<T>(out), O, R, I, reverse);
  });
  return std::vector<Array>{out};
}

const bool g_registered = [] {
  register_kernel("reduce_sum", Platform::cpu, reduce_kernel<RedOp::Sum>);
  register_kernel("reduce_max", Platform::cpu, reduce_kernel<RedOp::Max>);
  register_kernel("reduce_min", Platform::cpu, reduce_kernel<RedOp::Min>);
  register_kernel("reduce_prod", Platform::cpu, reduce_kernel<RedOp::Prod>);
  register_kernel("reduce_and", Platform::cpu, reduce_kernel<RedOp::And>);
  register_kernel("reduce_or", Platform::cpu, reduce_kernel<RedOp::Or>);
  register_kernel("argmax", Platform::cpu, arg_kernel<true>);
  register_kernel("argmin", Platform::cpu, arg_kernel<false>);
  register_kernel("cumsum", Platform::cpu, cumulative_kernel<RedOp::Sum>);
  register_kernel("cumprod", Platform::cpu, cumulative_kernel<RedOp::Prod>);
  register_kernel("cummax", Platform::cpu, cumulative_kernel<RedOp::Max>);
  register_kernel("cummin", Platform::cpu, cumulative_kernel<RedOp::Min>);
  register_kernel("cumlogsumexp", Platform::cpu, cumulative_kernel<RedOp::LogAddExp>);
  return true;
}();

}  // namespace
}  // namespace cjax::cpu
