// Gather / scatter primitives and their eager CPU kernels (XLA semantics, JAX's params).
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
#include "core/gather_scatter.h"

#include <absl/hash/hash.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/array_impl.h"
#include "core/scalar_fns.h"
#include "core/parallel.h"
#include "core/visit_dtype.h"

namespace cjax {
namespace {

using lax::GatherScatterMode;

std::string tuple_str(const std::vector<int64_t>& v) {
  if (v.size() == 1) return fmt::format("({},)", v[0]);
  return fmt::format("({})", fmt::join(v, ", "));
}
bool contains(const std::vector<int64_t>& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }

// Checks that `dims` are sorted (if required), unique and in [0, bound).
void check_dims(std::string_view prim, std::string_view what, const std::vector<int64_t>& dims, int64_t bound,
                bool sorted, std::string_view bound_desc) {
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] < 0 || dims[i] >= bound)
      throw ShapeError(fmt::format("{}: {}={} has an entry {} out of range for {} {} (valid: 0..{})", prim, what,
                                   tuple_str(dims), dims[i], bound_desc, bound, bound - 1));
    for (size_t j = 0; j < i; ++j)
      if (dims[j] == dims[i])
        throw ShapeError(fmt::format("{}: {}={} repeats dimension {}", prim, what, tuple_str(dims), dims[i]));
    if (sorted && i && dims[i - 1] > dims[i])
      throw ShapeError(fmt::format("{}: {}={} must be sorted", prim, what, tuple_str(dims)));
  }
}

void check_index_dtype(std::string_view prim, const Array& indices) {
  if (!is_integer(indices.dtype()))
    throw DTypeError(fmt::format("{}: indices must have an integer dtype, got {} (convert them with astype(int32))",
                                 prim, dtype_name(indices.dtype())));
  if (indices.ndim() < 1)
    throw ShapeError(fmt::format("{}: indices must have rank >= 1 (the last dimension is the index vector), got "
                                 "shape {}; reshape a scalar index to (1,)",
                                 prim, shape_str(indices.shape())));
}

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
template <class F> inline void for_each_run(const BoxPlan& p, int64_t* counter, F&& f) {
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

template <class T> T default_fill() {
  if constexpr (std::is_same_v<T, bool>) return true;
  else if constexpr (is_float_like_v<T>) {
    if constexpr (is_half_v<T>) return T(std::numeric_limits<float>::quiet_NaN());
    else return std::numeric_limits<T>::quiet_NaN();
  } else if constexpr (std::is_signed_v<T>) return std::numeric_limits<T>::lowest();
  else return std::numeric_limits<T>::max();
}
template <class T> T fill_of(std::optional<double> v) {
  if (!v) return default_fill<T>();
  if constexpr (std::is_same_v<T, bool>) return *v != 0;
  else if constexpr (is_half_v<T>) return T(float(*v));
  else return T(*v);
}

// ---------------------------------------------------------------- gather
struct GatherGeom {
  Shape batch_shape;             // indices.shape[:-1]
  int64_t K = 0;                 // index vector length
  std::vector<int64_t> batch_out_dims;  // output dim of each batch dim
  Shape out_shape;
};

GatherGeom gather_geometry(const Array& operand, const Array& indices, const lax::GatherDimensionNumbers& dn,
                           const std::vector<int64_t>& ss) {
  constexpr std::string_view P = "gather";
  check_index_dtype(P, indices);
  const Shape& os = operand.shape();
  const Shape& is = indices.shape();
  int64_t R = operand.ndim(), nb = int64_t(is.size()) - 1;
  GatherGeom g;
  g.K = is.back();
  g.batch_shape.assign(is.begin(), is.end() - 1);
  if (int64_t(ss.size()) != R)
    throw ShapeError(fmt::format("gather: slice_sizes={} must have one entry per operand dimension; the operand has "
                                 "shape {} (rank {})",
                                 tuple_str(ss), shape_str(os), R));
  for (int64_t d = 0; d < R; ++d)
    if (ss[size_t(d)] < 0 || ss[size_t(d)] > os[size_t(d)])
      throw ShapeError(fmt::format("gather: slice size {} for operand dimension {} must be in [0, {}] (operand shape "
                                   "{}, slice_sizes={})",
                                   ss[size_t(d)], d, os[size_t(d)], shape_str(os), tuple_str(ss)));
  check_dims(P, "collapsed_slice_dims", dn.collapsed_slice_dims, R, true, "an operand of rank");
  check_dims(P, "operand_batching_dims", dn.operand_batching_dims, R, true, "an operand of rank");
  check_dims(P, "start_index_map", dn.start_index_map, R, false, "an operand of rank");
  check_dims(P, "start_indices_batching_dims", dn.start_indices_batching_dims, nb, false,
             "the batch dimensions of indices, count");
  for (int64_t d : dn.collapsed_slice_dims) {
    if (ss[size_t(d)] > 1)
      throw ShapeError(fmt::format("gather: collapsed dimension {} must have slice size <= 1, got {} (slice_sizes={})",
                                   d, ss[size_t(d)], tuple_str(ss)));
    if (contains(dn.operand_batching_dims, d))
      throw ShapeError(fmt::format("gather: dimension {} is both collapsed and an operand batching dimension", d));
  }
  for (int64_t d : dn.operand_batching_dims) {
    if (ss[size_t(d)] > 1)
      throw ShapeError(fmt::format("gather: operand batching dimension {} must have slice size <= 1, got {}", d,
                                   ss[size_t(d)]));
    if (contains(dn.start_index_map, d))
      throw ShapeError(fmt::format("gather: operand batching dimension {} may not appear in start_index_map={}", d,
                                   tuple_str(dn.start_index_map)));
  }
  if (int64_t(dn.start_index_map.size()) != g.K)
    throw ShapeError(fmt::format("gather: start_index_map={} has {} entries but the index vector (last dimension of "
                                 "indices of shape {}) has length {}",
                                 tuple_str(dn.start_index_map), dn.start_index_map.size(), shape_str(is), g.K));
  if (dn.operand_batching_dims.size() != dn.start_indices_batching_dims.size())
    throw ShapeError(fmt::format("gather: operand_batching_dims={} and start_indices_batching_dims={} must have the "
                                 "same length",
                                 tuple_str(dn.operand_batching_dims), tuple_str(dn.start_indices_batching_dims)));
  for (size_t i = 0; i < dn.operand_batching_dims.size(); ++i) {
    int64_t od = dn.operand_batching_dims[i], id = dn.start_indices_batching_dims[i];
    if (os[size_t(od)] != is[size_t(id)])
      throw ShapeError(fmt::format("gather: operand batching dimension {} (size {}) and indices batching dimension {} "
                                   "(size {}) must have equal sizes (operand {}, indices {})",
                                   od, os[size_t(od)], id, is[size_t(id)], shape_str(os), shape_str(is)));
  }
  int64_t n_window = R - int64_t(dn.collapsed_slice_dims.size()) - int64_t(dn.operand_batching_dims.size());
  if (int64_t(dn.offset_dims.size()) != n_window)
    throw ShapeError(fmt::format("gather: offset_dims={} must have one entry per operand dimension that is neither "
                                 "collapsed nor batching ({} of them for rank {}, collapsed_slice_dims={}, "
                                 "operand_batching_dims={})",
                                 tuple_str(dn.offset_dims), n_window, R, tuple_str(dn.collapsed_slice_dims),
                                 tuple_str(dn.operand_batching_dims)));
  int64_t out_rank = nb + n_window;
  check_dims(P, "offset_dims", dn.offset_dims, out_rank, true, "an output of rank");
  g.out_shape.assign(size_t(out_rank), 0);
  size_t m = 0;
  for (int64_t d = 0; d < R; ++d) {
    if (contains(dn.collapsed_slice_dims, d) || contains(dn.operand_batching_dims, d)) continue;
    g.out_shape[size_t(dn.offset_dims[m++])] = ss[size_t(d)];
  }
  size_t k = 0;
  for (int64_t j = 0; j < out_rank; ++j) {
    if (contains(dn.offset_dims, j)) continue;
    g.batch_out_dims.push_back(j);
    g.out_shape[size_t(j)] = g.batch_shape[k++];
  }
  return g;
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
  T fill = fill_of<T>(fill_value);
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
    std::vector<int64_t> coords(static_cast<size_t>(nb) + 1), start(static_cast<size_t>(R)), counter(box.ext.size() + 1);
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
        if (ssd == 1 && dsd == 1) std::memcpy(static_cast<void*>(o), s, size_t(n) * sizeof(T));
        else
          for (int64_t i = 0; i < n; ++i) o[i * dsd] = s[i * ssd];
      });
    }
  });
}

Params make_gather_params(const lax::GatherDimensionNumbers& dn, const std::vector<int64_t>& slice_sizes,
                          GatherScatterMode mode, std::optional<double> fill_value, bool sorted, bool unique) {
  Params p;
  p.set("dimension_numbers", std::make_shared<const GatherDimensionNumbersParam>(dn));
  p.set("fill_value", fill_value ? ParamValue(*fill_value) : ParamValue(std::monostate{}));
  p.set("indices_are_sorted", sorted);
  p.set("mode", std::make_shared<const GatherScatterModeParam>(mode));
  p.set("slice_sizes", slice_sizes);
  p.set("unique_indices", unique);
  return p;
}

const PrimitiveDef& g_gather = register_primitive([] {
  PrimitiveDef def;
  def.name = "gather";
  def.kind = PrimKind::Indexing;
  def.arity = Arity::exactly(2);  // operand, indices
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    GatherGeom g = gather_geometry(in[0], in[1], gather_dimension_numbers(p), p.ints("slice_sizes"));
    return {AbstractValue{g.out_shape, in[0].dtype(), in[0].weak_type(), {}}};
  };
  def.cpu_impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
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
  };
  return def;
}());

// ---------------------------------------------------------------- scatter
struct ScatterGeom {
  Shape batch_shape;
  int64_t K = 0;
  std::vector<int64_t> update_scatter_dims;  // update dims that are scatter (batch) dims, in order
  std::vector<int64_t> window;               // window extent per operand dim
  std::vector<int64_t> upd_stride_of_dim;    // updates stride per operand dim (0 for inserted/batching)
};

ScatterGeom scatter_geometry(std::string_view P, const Array& operand, const Array& indices, const Array& updates,
                             const lax::ScatterDimensionNumbers& dn) {
  check_index_dtype(P, indices);
  if (updates.dtype() != operand.dtype())
    throw DTypeError(fmt::format("{}: updates must have the operand's dtype, got operand {} and updates {} (convert "
                                 "the updates with astype)",
                                 P, dtype_name(operand.dtype()), dtype_name(updates.dtype())));
  const Shape& os = operand.shape();
  const Shape& is = indices.shape();
  const Shape& us = updates.shape();
  int64_t R = operand.ndim(), nb = int64_t(is.size()) - 1, UR = updates.ndim();
  ScatterGeom g;
  g.K = is.back();
  g.batch_shape.assign(is.begin(), is.end() - 1);
  check_dims(P, "update_window_dims", dn.update_window_dims, UR, true, "updates of rank");
  check_dims(P, "inserted_window_dims", dn.inserted_window_dims, R, true, "an operand of rank");
  check_dims(P, "operand_batching_dims", dn.operand_batching_dims, R, true, "an operand of rank");
  check_dims(P, "scatter_dims_to_operand_dims", dn.scatter_dims_to_operand_dims, R, false, "an operand of rank");
  check_dims(P, "scatter_indices_batching_dims", dn.scatter_indices_batching_dims, nb, false,
             "the batch dimensions of indices, count");
  if (int64_t(dn.scatter_dims_to_operand_dims.size()) != g.K)
    throw ShapeError(fmt::format("{}: scatter_dims_to_operand_dims={} has {} entries but the index vector (last "
                                 "dimension of indices of shape {}) has length {}",
                                 P, tuple_str(dn.scatter_dims_to_operand_dims), dn.scatter_dims_to_operand_dims.size(),
                                 shape_str(is), g.K));
  for (int64_t d : dn.inserted_window_dims)
    if (contains(dn.operand_batching_dims, d))
      throw ShapeError(fmt::format("{}: dimension {} is both an inserted window and an operand batching dimension", P,
                                   d));
  for (int64_t d : dn.operand_batching_dims)
    if (contains(dn.scatter_dims_to_operand_dims, d))
      throw ShapeError(fmt::format("{}: operand batching dimension {} may not appear in scatter_dims_to_operand_dims={}",
                                   P, d, tuple_str(dn.scatter_dims_to_operand_dims)));
  if (dn.operand_batching_dims.size() != dn.scatter_indices_batching_dims.size())
    throw ShapeError(fmt::format("{}: operand_batching_dims={} and scatter_indices_batching_dims={} must have the same "
                                 "length",
                                 P, tuple_str(dn.operand_batching_dims), tuple_str(dn.scatter_indices_batching_dims)));
  for (size_t i = 0; i < dn.operand_batching_dims.size(); ++i) {
    int64_t od = dn.operand_batching_dims[i], id = dn.scatter_indices_batching_dims[i];
    if (os[size_t(od)] != is[size_t(id)])
      throw ShapeError(fmt::format("{}: operand batching dimension {} (size {}) and indices batching dimension {} (size "
                                   "{}) must have equal sizes",
                                   P, od, os[size_t(od)], id, is[size_t(id)]));
  }
  int64_t n_window = R - int64_t(dn.inserted_window_dims.size()) - int64_t(dn.operand_batching_dims.size());
  if (int64_t(dn.update_window_dims.size()) != n_window)
    throw ShapeError(fmt::format("{}: update_window_dims={} must have one entry per operand dimension that is neither "
                                 "inserted nor batching ({} for operand rank {})",
                                 P, tuple_str(dn.update_window_dims), n_window, R));
  if (UR != n_window + nb)
    throw ShapeError(fmt::format("{}: updates of shape {} must have rank {} ({} window dims + {} scatter dims of "
                                 "indices {})",
                                 P, shape_str(us), n_window + nb, n_window, nb, shape_str(is)));
  for (int64_t j = 0; j < UR; ++j)
    if (!contains(dn.update_window_dims, j)) g.update_scatter_dims.push_back(j);
  for (int64_t k = 0; k < nb; ++k)
    if (us[size_t(g.update_scatter_dims[size_t(k)])] != is[size_t(k)])
      throw ShapeError(fmt::format("{}: updates of shape {} do not match indices of shape {}: update scatter dimension "
                                   "{} has size {} but indices dimension {} has size {}",
                                   P, shape_str(us), shape_str(is), g.update_scatter_dims[size_t(k)],
                                   us[size_t(g.update_scatter_dims[size_t(k)])], k, is[size_t(k)]));
  std::vector<int64_t> ustr = row_major_strides(us);
  g.window.assign(size_t(R), 1);
  g.upd_stride_of_dim.assign(size_t(R), 0);
  size_t m = 0;
  for (int64_t d = 0; d < R; ++d) {
    if (contains(dn.inserted_window_dims, d) || contains(dn.operand_batching_dims, d)) continue;
    int64_t ud = dn.update_window_dims[m++];
    g.window[size_t(d)] = us[size_t(ud)];
    g.upd_stride_of_dim[size_t(d)] = ustr[size_t(ud)];
    if (us[size_t(ud)] > os[size_t(d)])
      throw ShapeError(fmt::format("{}: update window dimension {} (size {}) exceeds operand dimension {} (size {}); "
                                   "updates {} vs operand {}",
                                   P, ud, us[size_t(ud)], d, os[size_t(d)], shape_str(us), shape_str(os)));
  }
  return g;
}

template <ScatterKind kind, class T> inline T combine(T a, T b) {
  if constexpr (kind == ScatterKind::Set) return b;
  else if constexpr (std::is_same_v<T, bool>) {
    if constexpr (kind == ScatterKind::Add || kind == ScatterKind::Max) return a || b;
    else return a && b;
  } else if constexpr (is_float_like_v<T>) {
    using C = compute_t<T>;
    C x = C(a), y = C(b), r;
    if constexpr (kind == ScatterKind::Add) r = x + y;
    else if constexpr (kind == ScatterKind::Mul) r = x * y;
    else if constexpr (kind == ScatterKind::Min) r = (std::isnan(x) || std::isnan(y)) ? x + y : std::min(x, y);
    else r = (std::isnan(x) || std::isnan(y)) ? x + y : std::max(x, y);
    if constexpr (is_half_v<T>) return T(float(r));
    else return r;
  } else {
    if constexpr (kind == ScatterKind::Add) return scalar::wrap_add(a, b);
    else if constexpr (kind == ScatterKind::Mul) return scalar::wrap_mul(a, b);
    else if constexpr (kind == ScatterKind::Min) return std::min(a, b);
    else return std::max(a, b);
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
  auto apply_run = [&](int64_t src_base, int64_t dst_base, int64_t s0, int64_t d0, int64_t n, int64_t ss,
                       int64_t ds) {
    const T* s = u + src_base + s0;
    T* o = y + dst_base + d0;
    for (int64_t i = 0; i < n; ++i) o[i * ds] = combine<kind, T>(o[i * ds], s[i * ss]);
  };
  if (unique || NB == 1) {
    // Windows are disjoint (promised by unique_indices): parallel over windows.
    int64_t grain = std::max<int64_t>(1, (1 << 15) / box.size);
    if (NB == 1) grain = 1;
    parallel_for(NB, grain, [&](int64_t b0, int64_t b1) {
      std::vector<int64_t> coords(static_cast<size_t>(nb) + 1), start(static_cast<size_t>(R) + 1), counter(box.ext.size() + 1);
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
                           for_each_run(inner, cnt.data(), [&](int64_t s0, int64_t d0, int64_t n, int64_t ss,
                                                                 int64_t ds) {
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
  std::vector<int64_t> coords(static_cast<size_t>(nb) + 1), start(static_cast<size_t>(R) + 1), counter(box.ext.size() + 1);
  for (int64_t b = 0; b < NB; ++b) {
    int64_t dst_base, src_base;
    if (!locate(b, coords.data(), start.data(), dst_base, src_base)) continue;
    for_each_run(box, counter.data(), [&](int64_t s0, int64_t d0, int64_t n, int64_t ss, int64_t ds) {
      apply_run(src_base, dst_base, s0, d0, n, ss, ds);
    });
  }
}

const char* scatter_name(ScatterKind k) {
  switch (k) {
    case ScatterKind::Set: return "scatter";
    case ScatterKind::Add: return "scatter-add";
    case ScatterKind::Mul: return "scatter-mul";
    case ScatterKind::Min: return "scatter-min";
    case ScatterKind::Max: return "scatter-max";
  }
  return "scatter";
}

template <ScatterKind kind> PrimitiveDef make_scatter_def() {
  PrimitiveDef def;
  def.name = scatter_name(kind);
  def.kind = PrimKind::Indexing;
  def.arity = Arity::exactly(3);  // operand, indices, updates
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const char* name = scatter_name(kind);
    scatter_geometry(name, in[0], in[1], in[2], scatter_dimension_numbers(p));
    return {AbstractValue{in[0].shape(), in[0].dtype(), in[0].weak_type(), {}}};
  };
  def.cpu_impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
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
  };
  return def;
}

const PrimitiveDef& g_scatter = register_primitive(make_scatter_def<ScatterKind::Set>());
const PrimitiveDef& g_scatter_add = register_primitive(make_scatter_def<ScatterKind::Add>());
const PrimitiveDef& g_scatter_mul = register_primitive(make_scatter_def<ScatterKind::Mul>());
const PrimitiveDef& g_scatter_min = register_primitive(make_scatter_def<ScatterKind::Min>());
const PrimitiveDef& g_scatter_max = register_primitive(make_scatter_def<ScatterKind::Max>());

}  // namespace

// ---------------------------------------------------------------- params
std::string gather_scatter_mode_str(lax::GatherScatterMode m) {
  switch (m) {
    case GatherScatterMode::clip: return "GatherScatterMode.CLIP";
    case GatherScatterMode::fill_or_drop: return "GatherScatterMode.FILL_OR_DROP";
    case GatherScatterMode::promise_in_bounds: return "GatherScatterMode.PROMISE_IN_BOUNDS";
  }
  return "GatherScatterMode.FILL_OR_DROP";
}

std::string GatherDimensionNumbersParam::str() const {
  return fmt::format("GatherDimensionNumbers(offset_dims={}, collapsed_slice_dims={}, start_index_map={}, "
                     "operand_batching_dims={}, start_indices_batching_dims={})",
                     tuple_str(dn.offset_dims), tuple_str(dn.collapsed_slice_dims), tuple_str(dn.start_index_map),
                     tuple_str(dn.operand_batching_dims), tuple_str(dn.start_indices_batching_dims));
}
size_t GatherDimensionNumbersParam::hash() const {
  return absl::HashOf(std::string_view("gdn"), dn.offset_dims, dn.collapsed_slice_dims, dn.start_index_map,
                      dn.operand_batching_dims, dn.start_indices_batching_dims);
}
bool GatherDimensionNumbersParam::equals(const ParamObject& other) const {
  auto* o = dynamic_cast<const GatherDimensionNumbersParam*>(&other);
  return o && o->dn.offset_dims == dn.offset_dims && o->dn.collapsed_slice_dims == dn.collapsed_slice_dims &&
         o->dn.start_index_map == dn.start_index_map && o->dn.operand_batching_dims == dn.operand_batching_dims &&
         o->dn.start_indices_batching_dims == dn.start_indices_batching_dims;
}
std::string ScatterDimensionNumbersParam::str() const {
  return fmt::format("ScatterDimensionNumbers(update_window_dims={}, inserted_window_dims={}, "
                     "scatter_dims_to_operand_dims={}, operand_batching_dims={}, scatter_indices_batching_dims={})",
                     tuple_str(dn.update_window_dims), tuple_str(dn.inserted_window_dims),
                     tuple_str(dn.scatter_dims_to_operand_dims), tuple_str(dn.operand_batching_dims),
                     tuple_str(dn.scatter_indices_batching_dims));
}
size_t ScatterDimensionNumbersParam::hash() const {
  return absl::HashOf(std::string_view("sdn"), dn.update_window_dims, dn.inserted_window_dims,
                      dn.scatter_dims_to_operand_dims, dn.operand_batching_dims, dn.scatter_indices_batching_dims);
}
bool ScatterDimensionNumbersParam::equals(const ParamObject& other) const {
  auto* o = dynamic_cast<const ScatterDimensionNumbersParam*>(&other);
  return o && o->dn.update_window_dims == dn.update_window_dims &&
         o->dn.inserted_window_dims == dn.inserted_window_dims &&
         o->dn.scatter_dims_to_operand_dims == dn.scatter_dims_to_operand_dims &&
         o->dn.operand_batching_dims == dn.operand_batching_dims &&
         o->dn.scatter_indices_batching_dims == dn.scatter_indices_batching_dims;
}
std::string GatherScatterModeParam::str() const { return gather_scatter_mode_str(mode); }
size_t GatherScatterModeParam::hash() const { return absl::HashOf(std::string_view("gsm"), int(mode)); }
bool GatherScatterModeParam::equals(const ParamObject& other) const {
  auto* o = dynamic_cast<const GatherScatterModeParam*>(&other);
  return o && o->mode == mode;
}

const lax::GatherDimensionNumbers& gather_dimension_numbers(const Params& p) {
  return p.object<GatherDimensionNumbersParam>("dimension_numbers")->dn;
}
const lax::ScatterDimensionNumbers& scatter_dimension_numbers(const Params& p) {
  return p.object<ScatterDimensionNumbersParam>("dimension_numbers")->dn;
}
std::optional<LeadingBatchGather> leading_batch_gather(const Array& operand, const Array& indices, const Params& p) {
  const auto& dn = gather_dimension_numbers(p);
  const auto& ss = p.ints("slice_sizes");
  GatherGeom g = gather_geometry(operand, indices, dn, ss);
  if (!dn.operand_batching_dims.empty()) return std::nullopt;
  for (size_t k = 0; k < g.batch_out_dims.size(); ++k)
    if (g.batch_out_dims[k] != int64_t(k)) return std::nullopt;
  const Shape& os = operand.shape();
  std::vector<int64_t> istr = row_major_strides(os);
  LeadingBatchGather out;
  out.batches = shape_size(g.batch_shape);
  out.window = ss;
  out.window_size = shape_size(ss);
  out.window_strides = istr;
  out.K = g.K;
  for (int64_t k = 0; k < g.K; ++k) {
    int64_t d = dn.start_index_map[size_t(k)];
    out.hi.push_back(os[size_t(d)] - ss[size_t(d)]);
    out.start_stride.push_back(istr[size_t(d)]);
  }
  out.fill_mode = gather_scatter_mode(p) == lax::GatherScatterMode::fill_or_drop;
  visit_dtype(operand.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T fill = fill_of<T>(gather_fill_value(p));
    std::memcpy(&out.fill_bits, &fill, sizeof(T));
  });
  return out;
}

std::optional<LeadingBatchScatter> leading_batch_scatter(const Array& operand, const Array& indices,
                                                         const Array& updates, const Params& p) {
  const auto& dn = scatter_dimension_numbers(p);
  ScatterGeom g = scatter_geometry("scatter", operand, indices, updates, dn);
  if (!dn.operand_batching_dims.empty()) return std::nullopt;
  for (size_t k = 0; k < g.update_scatter_dims.size(); ++k)
    if (g.update_scatter_dims[k] != int64_t(k)) return std::nullopt;
  LeadingBatchScatter out;
  out.batches = shape_size(g.batch_shape);
  out.K = g.K;
  out.window = g.window;
  out.update_stride = g.upd_stride_of_dim;
  out.window_size = 1;
  for (int64_t w : g.window) out.window_size *= w;
  for (int64_t k = 0; k < g.K; ++k) {
    int64_t d = dn.scatter_dims_to_operand_dims[size_t(k)];
    if (g.window[size_t(d)] != 1) return std::nullopt;
    out.dims.push_back(d);
    out.hi.push_back(operand.shape()[size_t(d)] - 1);
  }
  out.clip = gather_scatter_mode(p) == lax::GatherScatterMode::clip;
  return out;
}

lax::GatherScatterMode gather_scatter_mode(const Params& p) { return p.object<GatherScatterModeParam>("mode")->mode; }
std::optional<double> gather_fill_value(const Params& p) {
  if (!p.has("fill_value")) return std::nullopt;
  const ParamValue& v = p.at("fill_value");
  if (auto* d = std::get_if<double>(&v)) return *d;
  if (auto* i = std::get_if<int64_t>(&v)) return double(*i);
  if (auto* b = std::get_if<bool>(&v)) return *b ? 1.0 : 0.0;
  return std::nullopt;
}

Params gather_params(const lax::GatherDimensionNumbers& dn, const std::vector<int64_t>& slice_sizes,
                     lax::GatherScatterMode mode, std::optional<double> fill_value, bool indices_are_sorted,
                     bool unique_indices) {
  return make_gather_params(dn, slice_sizes, mode, fill_value, indices_are_sorted, unique_indices);
}
Params scatter_params(const lax::ScatterDimensionNumbers& dn, lax::GatherScatterMode mode, bool indices_are_sorted,
                      bool unique_indices) {
  Params p;
  p.set("dimension_numbers", std::make_shared<const ScatterDimensionNumbersParam>(dn));
  p.set("indices_are_sorted", indices_are_sorted);
  p.set("mode", std::make_shared<const GatherScatterModeParam>(mode));
  p.set("unique_indices", unique_indices);
  p.set("update_consts", std::vector<int64_t>{});
  p.set("update_jaxpr", std::monostate{});
  return p;
}

Array gather_with(const Array& operand, const Array& indices, const lax::GatherDimensionNumbers& dn,
                  const std::vector<int64_t>& slice_sizes, lax::GatherScatterMode mode,
                  std::optional<double> fill_value, bool indices_are_sorted, bool unique_indices) {
  return bind1(prims::gather(), {operand, indices},
               gather_params(dn, slice_sizes, mode, fill_value, indices_are_sorted, unique_indices));
}
Array scatter_with(ScatterKind kind, const Array& operand, const Array& indices, const Array& updates,
                   const lax::ScatterDimensionNumbers& dn, lax::GatherScatterMode mode, bool indices_are_sorted,
                   bool unique_indices) {
  return bind1(prims::scatter_kind(kind), {operand, indices, updates},
               scatter_params(dn, mode, indices_are_sorted, unique_indices));
}

namespace prims {
const PrimitiveDef& gather() { return g_gather; }
const PrimitiveDef& scatter() { return g_scatter; }
const PrimitiveDef& scatter_add() { return g_scatter_add; }
const PrimitiveDef& scatter_mul() { return g_scatter_mul; }
const PrimitiveDef& scatter_min() { return g_scatter_min; }
const PrimitiveDef& scatter_max() { return g_scatter_max; }
const PrimitiveDef& scatter_kind(ScatterKind k) {
  switch (k) {
    case ScatterKind::Set: return g_scatter;
    case ScatterKind::Add: return g_scatter_add;
    case ScatterKind::Mul: return g_scatter_mul;
    case ScatterKind::Min: return g_scatter_min;
    case ScatterKind::Max: return g_scatter_max;
  }
  return g_scatter;
}
}  // namespace prims

namespace lax {
Array gather(const Array& operand, const Array& start_indices, const GatherDimensionNumbers& dimension_numbers,
             const std::vector<int64_t>& slice_sizes, GatherScatterMode mode, std::optional<double> fill_value) {
  return gather_with(operand, start_indices, dimension_numbers, slice_sizes, mode, fill_value, false, false);
}
#define CJAX_LAX_SCATTER(fn, K)                                                                        \
  Array fn(const Array& operand, const Array& scatter_indices, const Array& updates,                     \
           const ScatterDimensionNumbers& dimension_numbers, GatherScatterMode mode) {                  \
    return scatter_with(ScatterKind::K, operand, scatter_indices, updates, dimension_numbers, mode, false, \
                        false);                                                                         \
  }
CJAX_LAX_SCATTER(scatter_add, Add)
CJAX_LAX_SCATTER(scatter, Set)
CJAX_LAX_SCATTER(scatter_mul, Mul)
CJAX_LAX_SCATTER(scatter_min, Min)
CJAX_LAX_SCATTER(scatter_max, Max)
#undef CJAX_LAX_SCATTER
}  // namespace lax

}  // namespace cjax
