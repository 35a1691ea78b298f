// The CPU kernels of the gather / scatter primitives (core/lax/gather_scatter.cpp), XLA semantics.
//
// gather: for every batch position b of the indices (all dims but the last), the start of a
// slice of size `slice_sizes` is built from the index vector indices[b, :] (component k goes to
// operand dim start_index_map[k]) and from b's coordinates along start_indices_batching_dims
// (which select the operand_batching_dims). Out-of-range starts: CLIP and PROMISE_IN_BOUNDS clamp
// them into [0, dim - slice_size]; FILL_OR_DROP returns fill_value for the whole slice (JAX's
// default fill: NaN for floats, the minimum of a signed integer type, the maximum of an unsigned
// one, True for bool).
//
// scatter*: the transpose of gather. Each update window is combined into the operand in index
// order (sequentially, so duplicates accumulate deterministically). CLIP clamps window starts;
// FILL_OR_DROP and PROMISE_IN_BOUNDS drop windows that are not entirely in bounds (XLA).
#include "core/lax/gather_scatter.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/array/primitive.h"
#include "core/array/visit_dtype.h"
#include "core/backend/backend.h"
#include "core/backend/parallel.h"
#include "core/lax/scalar_fns.h"

namespace cjax::cpu {
namespace {

using lax::GatherScatterMode;

bool contains(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Row-major decomposition helpers.
inline void unravel(int64_t lin, const Shape& shape, int64_t* coords) {
  for (size_t d = shape.size(); d-- > 0;) {
    int64_t s = shape[d];
    coords[d] = s ? lin % s : 0;
    lin = s ? lin / s : 0;
  }
}

// Indices converted to int64, row-major.
std::vector<int64_t> load_indices(const Array& idx) {
  int64_t n = idx.size();
  std::vector<int64_t> out(static_cast<size_t>(n));
  visit_dtype(idx.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
      const T* p = data_ptr<const T>(idx);
      parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) out[size_t(i)] = int64_t(p[i]);
      });
    }
  });
  return out;
}

// A box copy plan: the dims of a slice/window with extent > 1, merged where contiguous in both
// source and destination, innermost last.
struct BoxPlan {
  std::vector<int64_t> ext, src_stride, dst_stride;
  int64_t size = 1;
};
BoxPlan make_box(const std::vector<int64_t>& ext, const std::vector<int64_t>& src, const std::vector<int64_t>& dst) {
  BoxPlan p;
  for (size_t d = 0; d < ext.size(); ++d) {
    p.size *= ext[d];
    if (ext[d] == 1) continue;
    if (!p.ext.empty() && p.src_stride.back() == src[d] * ext[d] && p.dst_stride.back() == dst[d] * ext[d]) {
      p.ext.back() *= ext[d];
      p.src_stride.back() = src[d];
      p.dst_stride.back() = dst[d];
      continue;
    }
    p.ext.push_back(ext[d]);
    p.src_stride.push_back(src[d]);
    p.dst_stride.push_back(dst[d]);
  }
  return p;
}

// Calls f(src_offset, dst_offset, run_length, src_step, dst_step) for every innermost run of the
// box; `counter` is scratch of size plan.ext.size().
template <class F>
inline void for_each_run(const BoxPlan& p, int64_t* counter, F&& f) {
  size_t nd = p.ext.size();
  if (nd == 0) {
    f(int64_t(0), int64_t(0), int64_t(1), int64_t(0), int64_t(0));
    return;
  }
  if (p.size == 0) return;
  size_t outer = nd - 1;
  int64_t inner = p.ext[outer], ss = p.src_stride[outer], ds = p.dst_stride[outer];
  for (size_t d = 0; d < outer; ++d) counter[d] = 0;
  int64_t so = 0, doff = 0;
  while (true) {
    f(so, doff, inner, ss, ds);
    size_t d = outer;
    while (d-- > 0) {
      ++counter[d];
      so += p.src_stride[d];
      doff += p.dst_stride[d];
      if (counter[d] < p.ext[d]) break;
      so -= p.src_stride[d] * p.ext[d];
      doff -= p.dst_stride[d] * p.ext[d];
      counter[d] = 0;
      if (d == 0) return;
    }
    if (outer == 0) return;
  }
}

template <class T>
void gather_kernel(const Array& operand, const Array& indices, Array& out, const lax::GatherDimensionNumbers& dn,
                   const std::vector<int64_t>& ss, GatherScatterMode mode, std::optional<double> fill_value,
                   const GatherGeom& g) {
  const Shape& os = operand.shape();
  int64_t R = operand.ndim(), nb = int64_t(g.batch_shape.size()), K = g.K;
  int64_t NB = shape_size(g.batch_shape);
  std::vector<int64_t> istr = row_major_strides(os), ostr = row_major_strides(out.shape());
  // Destination stride of each operand dim inside the output (0 for collapsed / batching dims).
  std::vector<int64_t> dst(size_t(R), 0);
  size_t m = 0;
  for (int64_t d = 0; d < R; ++d) {
    if (contains(dn.collapsed_slice_dims, d) || contains(dn.operand_batching_dims, d)) continue;
    dst[size_t(d)] = ostr[size_t(dn.offset_dims[m++])];
  }
  BoxPlan box = make_box(ss, istr, dst);
  const T* src = data_ptr<const T>(operand);
  T* y = data_ptr<T>(out);
  T fill = gather_fill<T>(fill_value);
  bool fill_mode = mode == GatherScatterMode::fill_or_drop;
  // Fast path (take, x[idx], embedding lookups): no batching dims, the offset dims trail the batch
  // dims, so slice b lands contiguously at y + b * W.
  bool trailing = dn.operand_batching_dims.empty();
  for (int64_t k = 0; trailing && k < nb; ++k) trailing = g.batch_out_dims[size_t(k)] == k;
  if (trailing && shape_size(ss) > 0) {
    int64_t W = box.size;
    std::vector<int64_t> hi(static_cast<size_t>(K)), st(static_cast<size_t>(K));
    for (int64_t k = 0; k < K; ++k) {
      int64_t d = dn.start_index_map[size_t(k)];
      hi[size_t(k)] = os[size_t(d)] - ss[size_t(d)];
      st[size_t(k)] = istr[size_t(d)];
    }
    visit_dtype(indices.dtype(), [&](auto itag) {
      using I = typename decltype(itag)::type;
      if constexpr (std::is_integral_v<I> && !std::is_same_v<I, bool>) {
        const I* ip = data_ptr<const I>(indices);
        int64_t grain = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, W));
        if (K == 1 && box.ext.empty()) {  // one element per index: a tight loop
          int64_t h = hi[0], s0 = st[0];
          parallel_for(NB, 1 << 14, [&](int64_t b0, int64_t b1) {
            for (int64_t b = b0; b < b1; ++b) {
              int64_t v = int64_t(ip[b]);
              bool oob = v < 0 || v > h;
              v = v < 0 ? 0 : (v > h ? h : v);
              y[b] = (fill_mode && oob) ? fill : src[v * s0];
            }
          });
          return;
        }
        parallel_for(NB, grain, [&](int64_t b0, int64_t b1) {
          std::vector<int64_t> counter(box.ext.size() + 1);
          for (int64_t b = b0; b < b1; ++b) {
            int64_t src_base = 0;
            bool in_bounds = true;
            for (int64_t k = 0; k < K; ++k) {
              int64_t v = int64_t(ip[b * K + k]), h = hi[size_t(k)];
              if (v < 0 || v > h) {
                in_bounds = false;
                v = v < 0 ? 0 : h;
              }
              src_base += v * st[size_t(k)];
            }
            T* o = y + b * W;
            if (fill_mode && !in_bounds) {
              std::fill(o, o + W, fill);
            } else if (box.ext.empty()) {
              *o = src[src_base];
            } else if (box.ext.size() == 1 && box.src_stride[0] == 1) {
              std::memcpy(static_cast<void*>(o), src + src_base, size_t(W) * sizeof(T));
            } else {
              for_each_run(box, counter.data(), [&](int64_t s0, int64_t d0, int64_t n, int64_t ssd, int64_t dsd) {
                const T* s = src + src_base + s0;
                for (int64_t i = 0; i < n; ++i) o[d0 + i * dsd] = s[i * ssd];
              });
            }
          }
        });
      }
    });
    return;
  }
  std::vector<int64_t> idx = load_indices(indices);
  if (shape_size(ss) == 0) {  // nothing to read (a zero-size operand dim): every element is the fill
    T v = fill_mode ? fill : T{};
    std::fill(y, y + out.size(), v);
    return;
  }
  int64_t grain = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(1, box.size));
  parallel_for(NB, grain, [&](int64_t b0, int64_t b1) {
    std::vector<int64_t> coords(static_cast<size_t>(nb) + 1), start(static_cast<size_t>(R)),
        counter(box.ext.size() + 1);
    for (int64_t b = b0; b < b1; ++b) {
      unravel(b, g.batch_shape, coords.data());
      int64_t dst_base = 0;
      for (int64_t k = 0; k < nb; ++k) dst_base += coords[size_t(k)] * ostr[size_t(g.batch_out_dims[size_t(k)])];
      std::fill(start.begin(), start.end(), 0);
      bool in_bounds = true;
      for (int64_t k = 0; k < K; ++k) {
        int64_t d = dn.start_index_map[size_t(k)], v = idx[size_t(b * K + k)];
        int64_t hi = os[size_t(d)] - ss[size_t(d)];
        if (v < 0 || v > hi) in_bounds = false;
        start[size_t(d)] = std::clamp<int64_t>(v, 0, std::max<int64_t>(hi, 0));
      }
      for (size_t i = 0; i < dn.operand_batching_dims.size(); ++i)
        start[size_t(dn.operand_batching_dims[i])] = coords[size_t(dn.start_indices_batching_dims[i])];
      if (fill_mode && !in_bounds) {
        for_each_run(box, counter.data(), [&](int64_t, int64_t d0, int64_t n, int64_t, int64_t ds) {
          T* o = y + dst_base + d0;
          for (int64_t i = 0; i < n; ++i) o[i * ds] = fill;
        });
        continue;
      }
      int64_t src_base = 0;
      for (int64_t d = 0; d < R; ++d) src_base += start[size_t(d)] * istr[size_t(d)];
      for_each_run(box, counter.data(), [&](int64_t s0, int64_t d0, int64_t n, int64_t ssd, int64_t dsd) {
        const T* s = src + src_base + s0;
        T* o = y + dst_base + d0;
        if (ssd == 1 && dsd == 1)
          std::memcpy(static_cast<void*>(o), s, size_t(n) * sizeof(T));
        else
          for (int64_t i = 0; i < n; ++i) o[i * dsd] = s[i * ssd];
      });
    }
  });
}

std::vector<Array> gather_impl(std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
  const auto& dn = gather_dimension_numbers(p);
  const auto& ss = p.ints("slice_sizes");
  GatherGeom g = gather_geometry(in[0], in[1], dn, ss);
  Array out = make_uninitialized(out_avals[0], concrete(in[0])->device());
  if (out.size() == 0) return std::vector<Array>{out};
  visit_dtype(in[0].dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    gather_kernel<T>(in[0], in[1], out, dn, ss, gather_scatter_mode(p), gather_fill_value(p), g);
  });
  return std::vector<Array>{out};
}

template <ScatterKind kind, class T>
inline T combine(T a, T b) {
  if constexpr (kind == ScatterKind::Set)
    return b;
  else if constexpr (std::is_same_v<T, bool>) {
    if constexpr (kind == ScatterKind::Add || kind == ScatterKind::Max)
      return a || b;
    else
      return a && b;
  } else if constexpr (is_float_like_v<T>) {
    using C = compute_t<T>;
    C x = C(a), y = C(b), r;
    if constexpr (kind == ScatterKind::Add)
      r = x + y;
    else if constexpr (kind == ScatterKind::Mul)
      r = x * y;
    else if constexpr (kind == ScatterKind::Min)
      r = (std::isnan(x) || std::isnan(y)) ? x + y : std::min(x, y);
    else
      r = (std::isnan(x) || std::isnan(y)) ? x + y : std::max(x, y);
    if constexpr (is_half_v<T>)
      return T(float(r));
    else
      return r;
  } else {
    if constexpr (kind == ScatterKind::Add)
      return scalar::wrap_add(a, b);
    else if constexpr (kind == ScatterKind::Mul)
      return scalar::wrap_mul(a, b);
    else if constexpr (kind == ScatterKind::Min)
      return std::min(a, b);
    else
      return std::max(a, b);
  }
}

template <ScatterKind kind, class T>
void scatter_kernel(const Array& indices, const Array& updates, Array& out, const lax::ScatterDimensionNumbers& dn,
                    GatherScatterMode mode, bool unique, const ScatterGeom& g) {
  const Shape& os = out.shape();
  int64_t R = out.ndim(), nb = int64_t(g.batch_shape.size()), K = g.K, NB = shape_size(g.batch_shape);
  std::vector<int64_t> ostr = row_major_strides(os), ustr = row_major_strides(updates.shape());
  BoxPlan box = make_box(g.window, g.upd_stride_of_dim, ostr);
  if (box.size == 0 || NB == 0) return;
  std::vector<int64_t> idx = load_indices(indices);
  const T* u = data_ptr<const T>(updates);
  T* y = data_ptr<T>(out);
  bool clip = mode == GatherScatterMode::clip;
  // Returns false when the window is dropped; else the operand / updates offsets of window b.
  auto locate = [&](int64_t b, int64_t* coords, int64_t* start, int64_t& dst_base, int64_t& src_base) {
    unravel(b, g.batch_shape, coords);
    src_base = 0;
    for (int64_t k = 0; k < nb; ++k) src_base += coords[k] * ustr[size_t(g.update_scatter_dims[size_t(k)])];
    std::fill(start, start + R, 0);
    for (int64_t k = 0; k < K; ++k) {
      int64_t d = dn.scatter_dims_to_operand_dims[size_t(k)], v = idx[size_t(b * K + k)];
      int64_t hi = os[size_t(d)] - g.window[size_t(d)];
      if (v < 0 || v > hi) {
        if (!clip) return false;
        v = std::clamp<int64_t>(v, 0, hi);
      }
      start[d] = v;
    }
    for (size_t i = 0; i < dn.operand_batching_dims.size(); ++i)
      start[dn.operand_batching_dims[i]] = coords[dn.scatter_indices_batching_dims[i]];
    dst_base = 0;
    for (int64_t d = 0; d < R; ++d) dst_base += start[d] * ostr[size_t(d)];
    return true;
  };
  auto apply_run = [&](int64_t src_base, int64_t dst_base, int64_t s0, int64_t d0, int64_t n, int64_t ss, int64_t ds) {
    const T* s = u + src_base + s0;
    T* o = y + dst_base + d0;
    for (int64_t i = 0; i < n; ++i) o[i * ds] = combine<kind, T>(o[i * ds], s[i * ss]);
  };
  if (unique || NB == 1) {
    // Windows are disjoint (promised by unique_indices): parallel over windows.
    int64_t grain = std::max<int64_t>(1, (1 << 15) / box.size);
    if (NB == 1) grain = 1;
    parallel_for(NB, grain, [&](int64_t b0, int64_t b1) {
      std::vector<int64_t> coords(static_cast<size_t>(nb) + 1), start(static_cast<size_t>(R) + 1),
          counter(box.ext.size() + 1);
      for (int64_t b = b0; b < b1; ++b) {
        int64_t dst_base, src_base;
        if (!locate(b, coords.data(), start.data(), dst_base, src_base)) continue;
        if (NB == 1 && box.size >= (1 << 16) && box.ext.size() >= 1) {
          // One big window: split its outermost dimension over threads.
          BoxPlan inner = box;
          int64_t outer_n = inner.ext[0], sst = inner.src_stride[0], dst = inner.dst_stride[0];
          inner.ext[0] = 1;
          inner.size = box.size / std::max<int64_t>(outer_n, 1);
          parallel_for(outer_n, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(inner.size, 1)),
                       [&](int64_t o0, int64_t o1) {
                         std::vector<int64_t> cnt(inner.ext.size() + 1);
                         for (int64_t o = o0; o < o1; ++o)
                           for_each_run(inner, cnt.data(),
                                        [&](int64_t s0, int64_t d0, int64_t n, int64_t ss, int64_t ds) {
                                          apply_run(src_base + o * sst, dst_base + o * dst, s0, d0, n, ss, ds);
                                        });
                       });
          continue;
        }
        for_each_run(box, counter.data(), [&](int64_t s0, int64_t d0, int64_t n, int64_t ss, int64_t ds) {
          apply_run(src_base, dst_base, s0, d0, n, ss, ds);
        });
      }
    });
    return;
  }
  // Possibly repeated indices: windows in index order, one after the other (deterministic).
  bool trailing = dn.operand_batching_dims.empty();
  for (int64_t k = 0; trailing && k < nb; ++k) trailing = g.update_scatter_dims[size_t(k)] == k;
  if (trailing && K == 1 && box.ext.empty()) {  // one element per index (x.at[idx].add(v)): a tight loop
    int64_t d = dn.scatter_dims_to_operand_dims[0];
    int64_t h = os[size_t(d)] - 1, s0 = ostr[size_t(d)];
    for (int64_t b = 0; b < NB; ++b) {
      int64_t v = idx[size_t(b)];
      if (v < 0 || v > h) {
        if (!clip) continue;
        v = v < 0 ? 0 : h;
      }
      T& o = y[v * s0];
      o = combine<kind, T>(o, u[b]);
    }
    return;
  }
  std::vector<int64_t> coords(static_cast<size_t>(nb) + 1), start(static_cast<size_t>(R) + 1),
      counter(box.ext.size() + 1);
  for (int64_t b = 0; b < NB; ++b) {
    int64_t dst_base, src_base;
    if (!locate(b, coords.data(), start.data(), dst_base, src_base)) continue;
    for_each_run(box, counter.data(), [&](int64_t s0, int64_t d0, int64_t n, int64_t ss, int64_t ds) {
      apply_run(src_base, dst_base, s0, d0, n, ss, ds);
    });
  }
}

template <ScatterKind kind>
std::vector<Array> scatter_impl(std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
  const auto& dn = scatter_dimension_numbers(p);
  ScatterGeom g = scatter_geometry(scatter_name(kind), in[0], in[1], in[2], dn);
  Array out = make_uninitialized(out_avals[0], concrete(in[0])->device());
  size_t nbytes = size_t(out.size()) * itemsize(out.dtype());
  if (nbytes) {
    const char* s = static_cast<const char*>(raw_ptr(in[0]));
    char* d = static_cast<char*>(raw_ptr(out));
    parallel_for(int64_t(nbytes), 1 << 18, [&](int64_t b, int64_t e) { std::memcpy(d + b, s + b, size_t(e - b)); });
  }
  if (out.size() == 0) return std::vector<Array>{out};
  visit_dtype(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    scatter_kernel<kind, T>(in[1], in[2], out, dn, gather_scatter_mode(p), p.get<bool>("unique_indices"), g);
  });
  return std::vector<Array>{out};
}

const bool g_registered = [] {
  register_kernel("gather", Platform::cpu, gather_impl);
  register_kernel(scatter_name(ScatterKind::Set), Platform::cpu, scatter_impl<ScatterKind::Set>);
  register_kernel(scatter_name(ScatterKind::Add), Platform::cpu, scatter_impl<ScatterKind::Add>);
  register_kernel(scatter_name(ScatterKind::Mul), Platform::cpu, scatter_impl<ScatterKind::Mul>);
  register_kernel(scatter_name(ScatterKind::Min), Platform::cpu, scatter_impl<ScatterKind::Min>);
  register_kernel(scatter_name(ScatterKind::Max), Platform::cpu, scatter_impl<ScatterKind::Max>);
  return true;
}();

}  // namespace
}  // namespace cjax::cpu
