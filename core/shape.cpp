// Shape primitives (broadcast_in_dim, reshape, transpose, squeeze, rev, concatenate, pad, iota),
// their eager CPU kernels and lax wrappers, plus the generic strided-copy kernel (core/shape.h)
// that every data-moving shape/slicing kernel uses. Semantics and params follow JAX/XLA.
#include "core/shape.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "cjax/lax.h"
#include "core/array_impl.h"
#include "core/parallel.h"
#include "core/util.h"
#include "core/visit_dtype.h"

namespace cjax {

// ============================================================================================
// Generic strided copy
// ============================================================================================
namespace {

constexpr int64_t kCopyGrain = 1 << 15;  // elements per parallel chunk (cheap op)
constexpr int64_t kTile = 32;            // transpose tile edge

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

template <class U> inline void copy_run(U* d, int64_t ds, const U* s, int64_t ss, int64_t n) {
  if (ds == 1 && ss == 1) {
    std::memcpy(d, s, size_t(n) * sizeof(U));
  } else if (ss == 0) {
    U v = *s;
    if (ds == 1) std::fill_n(d, n, v);
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

template <class U> void copy_typed(U* dst, const U* src, const Dims& d) {
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
            for (int64_t i = k0; i < k1; ++i) {
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

template <class F> void visit_itemsize(size_t itemsize, F&& f) {
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

std::vector<int64_t> broadcast_source_strides(const Shape& in, size_t out_rank, const std::vector<int64_t>& dims) {
  std::vector<int64_t> ss(out_rank, 0);
  auto ist = row_major_strides(in);
  for (size_t i = 0; i < dims.size(); ++i)
    if (in[i] != 1) ss[size_t(dims[i])] = ist[i];
  return ss;
}
std::vector<int64_t> transpose_source_strides(const Shape& in, const std::vector<int64_t>& perm) {
  auto ist = row_major_strides(in);
  std::vector<int64_t> ss(perm.size());
  for (size_t i = 0; i < perm.size(); ++i) ss[i] = ist[size_t(perm[i])];
  return ss;
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

// ============================================================================================
// Primitives
// ============================================================================================
namespace {

std::string tup(const std::vector<int64_t>& v) { return param_value_str(ParamValue(v)); }
Device device_of(const Array& a) { return concrete(a)->device(); }
char* bytes_of(const Array& a) { return static_cast<char*>(raw_ptr(a)); }

void check_dims_nonneg(std::string_view name, std::string_view what, const Shape& s) {
  for (int64_t d : s)
    if (d < 0)
      throw ShapeError(fmt::format("{}: {} {} has a negative dimension; sizes must be >= 0", name, what, shape_str(s)));
}

// Copies `src` (row-major, shape `shape`) into `dst` (row-major array of shape `dst_shape`),
// starting at element offsets `starts` along each dimension.
void copy_block_into(char* dst, const Shape& dst_shape, const std::vector<int64_t>& starts, const char* src,
                     const Shape& shape, size_t isz) {
  auto dst_st = row_major_strides(dst_shape);
  int64_t off = 0;
  for (size_t i = 0; i < starts.size(); ++i) off += starts[i] * dst_st[i];
  strided_copy(dst + off * int64_t(isz), dst_st, src, row_major_strides(shape), shape, isz);
}

// ---- broadcast_in_dim ----
const PrimitiveDef& g_broadcast_in_dim = register_primitive([] {
  PrimitiveDef def;
  def.name = "broadcast_in_dim";
  def.kind = PrimKind::Broadcast;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const Shape& shape = p.ints("shape");
    const auto& bd = p.ints("broadcast_dimensions");
    const Shape& os = in[0].shape();
    check_dims_nonneg("broadcast_in_dim", "target shape", shape);
    if (os.size() > shape.size())
      throw ShapeError(fmt::format("broadcast_in_dim target broadcast shape must have equal or higher rank to the "
                                   "operand shape; got operand shape {} and target broadcast shape {}",
                                   shape_str(os), shape_str(shape)));
    if (bd.size() != os.size())
      throw ShapeError(fmt::format("broadcast_in_dim broadcast_dimensions must have length equal to operand ndim; "
                                   "got broadcast_dimensions {} for operand shape {}",
                                   tup(bd), shape_str(os)));
    for (size_t i = 0; i < bd.size(); ++i) {
      if (bd[i] < 0 || bd[i] >= int64_t(shape.size()))
        throw ShapeError(fmt::format("broadcast_in_dim broadcast_dimensions must be valid indices into the target "
                                     "shape; got broadcast_dimensions {} for target shape {}",
                                     tup(bd), shape_str(shape)));
      if (i > 0 && bd[i] <= bd[i - 1])
        throw ShapeError(fmt::format("broadcast_in_dim broadcast_dimensions must be strictly increasing; got "
                                     "broadcast_dimensions {}",
                                     tup(bd)));
      if (os[i] != 1 && os[i] != shape[size_t(bd[i])])
        throw ShapeError(fmt::format("broadcast_in_dim operand dimension sizes must either be 1, or be equal to their "
                                     "corresponding dimensions in the target broadcast shape; got operand of shape "
                                     "{}, target broadcast shape {}, broadcast_dimensions {}",
                                     shape_str(os), shape_str(shape), tup(bd)));
    }
    return {AbstractValue{shape, in[0].dtype(), in[0].weak_type(), {}}};
  };
  def.cpu_impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
    const Array& x = in[0];
    const AbstractValue& oa = out_avals[0];
    // Only size-1 dimensions are inserted: the row-major layout is unchanged.
    if (oa.size() == x.size()) return std::vector<Array>{make_view(x, oa)};
    Array out = make_uninitialized(oa, device_of(x));
    std::vector<int64_t> ss = broadcast_source_strides(x.shape(), oa.shape.size(), p.ints("broadcast_dimensions"));
    strided_copy(raw_ptr(out), row_major_strides(oa.shape), raw_ptr(x), ss, oa.shape, itemsize(oa.dtype));
    return std::vector<Array>{out};
  };
  return def;
}());

// ---- reshape ----
const PrimitiveDef& g_reshape = register_primitive([] {
  PrimitiveDef def;
  def.name = "reshape";
  def.kind = PrimKind::Shape;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const Shape& ns = p.ints("new_sizes");
    if (p.has("dimensions") && !std::holds_alternative<std::monostate>(p.at("dimensions")))
      throw ValueError("reshape: the `dimensions` parameter must be None; transpose the operand first");
    check_dims_nonneg("reshape", "new_sizes", ns);
    if (shape_size(ns) != in[0].size())
      throw ShapeError(fmt::format("reshape total size must be unchanged, got new_sizes {} (size {}) for operand "
                                   "shape {} (size {})",
                                   shape_str(ns), shape_size(ns), shape_str(in[0].shape()), in[0].size()));
    return {AbstractValue{ns, in[0].dtype(), in[0].weak_type(), {}}};
  };
  def.cpu_impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params&) {
    return std::vector<Array>{make_view(in[0], out_avals[0])};
  };
  return def;
}());

// ---- transpose ----
const PrimitiveDef& g_transpose = register_primitive([] {
  PrimitiveDef def;
  def.name = "transpose";
  def.kind = PrimKind::Shape;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const auto& perm = p.ints("permutation");
    const Shape& s = in[0].shape();
    std::vector<bool> seen(s.size(), false);
    bool ok = perm.size() == s.size();
    for (int64_t a : perm) {
      if (!ok) break;
      if (a < 0 || a >= int64_t(s.size()) || seen[size_t(a)]) ok = false;
      else seen[size_t(a)] = true;
    }
    if (!ok)
      throw ShapeError(fmt::format("transpose permutation isn't a permutation of operand dimensions, got "
                                   "permutation {} for operand shape {}; pass each axis 0..{} exactly once",
                                   tup(perm), shape_str(s), int64_t(s.size()) - 1));
    Shape out(s.size());
    for (size_t i = 0; i < perm.size(); ++i) out[i] = s[size_t(perm[i])];
    return {AbstractValue{out, in[0].dtype(), in[0].weak_type(), {}}};
  };
  def.cpu_impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
    const Array& x = in[0];
    const AbstractValue& oa = out_avals[0];
    const auto& perm = p.ints("permutation");
    // Moving only size-1 dimensions keeps the layout.
    std::vector<int64_t> kept;
    for (int64_t a : perm)
      if (x.shape()[size_t(a)] != 1) kept.push_back(a);
    if (std::is_sorted(kept.begin(), kept.end())) return std::vector<Array>{make_view(x, oa)};
    Array out = make_uninitialized(oa, device_of(x));
    std::vector<int64_t> ss = transpose_source_strides(x.shape(), perm);
    strided_copy(raw_ptr(out), row_major_strides(oa.shape), raw_ptr(x), ss, oa.shape, itemsize(oa.dtype));
    return std::vector<Array>{out};
  };
  return def;
}());

// ---- squeeze ----
const PrimitiveDef& g_squeeze = register_primitive([] {
  PrimitiveDef def;
  def.name = "squeeze";
  def.kind = PrimKind::Shape;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const auto& dims = p.ints("dimensions");
    const Shape& s = in[0].shape();
    std::vector<bool> drop(s.size(), false);
    for (int64_t d : dims) {
      if (d < 0 || d >= int64_t(s.size()))
        throw ValueError(fmt::format("squeeze: dimension {} is out of bounds for operand shape {} (dimensions {})", d,
                                     shape_str(s), tup(dims)));
      if (drop[size_t(d)]) throw ValueError(fmt::format("squeeze: repeated dimension {} in {}", d, tup(dims)));
      if (s[size_t(d)] != 1)
        throw ShapeError(fmt::format("cannot select an axis to squeeze out which has size not equal to one, got "
                                     "shape={} and dimensions={} (axis {} has size {})",
                                     shape_str(s), tup(dims), d, s[size_t(d)]));
      drop[size_t(d)] = true;
    }
    Shape out;
    for (size_t i = 0; i < s.size(); ++i)
      if (!drop[i]) out.push_back(s[i]);
    return {AbstractValue{out, in[0].dtype(), in[0].weak_type(), {}}};
  };
  def.cpu_impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params&) {
    return std::vector<Array>{make_view(in[0], out_avals[0])};
  };
  return def;
}());

// ---- rev ----
const PrimitiveDef& g_rev = register_primitive([] {
  PrimitiveDef def;
  def.name = "rev";
  def.kind = PrimKind::Shape;
  def.arity = Arity::exactly(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const auto& dims = p.ints("dimensions");
    const Shape& s = in[0].shape();
    std::vector<bool> seen(s.size(), false);
    for (int64_t d : dims) {
      if (d < 0 || d >= int64_t(s.size()))
        throw ValueError(fmt::format("rev dimensions must be valid axes of the operand, got dimensions {} for "
                                     "operand shape {}",
                                     tup(dims), shape_str(s)));
      if (seen[size_t(d)]) throw ValueError(fmt::format("rev dimensions must be unique, got {}", tup(dims)));
      seen[size_t(d)] = true;
    }
    return {AbstractValue{s, in[0].dtype(), in[0].weak_type(), {}}};
  };
  def.cpu_impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
    const Array& x = in[0];
    const AbstractValue& oa = out_avals[0];
    Array out = make_uninitialized(oa, device_of(x));
    if (oa.size() == 0) return std::vector<Array>{out};
    size_t isz = itemsize(oa.dtype);
    auto ss = row_major_strides(x.shape());
    int64_t off = 0;
    for (int64_t d : p.ints("dimensions")) {
      off += (x.shape()[size_t(d)] - 1) * ss[size_t(d)];
      ss[size_t(d)] = -ss[size_t(d)];
    }
    strided_copy(raw_ptr(out), row_major_strides(oa.shape), bytes_of(x) + off * int64_t(isz), ss, oa.shape, isz);
    return std::vector<Array>{out};
  };
  return def;
}());

// ---- concatenate ----
const PrimitiveDef& g_concatenate = register_primitive([] {
  PrimitiveDef def;
  def.name = "concatenate";
  def.kind = PrimKind::Shape;
  def.arity = Arity::at_least(1);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    int64_t dim = p.i("dimension");
    const Shape& s0 = in[0].shape();
    bool weak = true;
    for (size_t k = 0; k < in.size(); ++k) {
      if (in[k].dtype() != in[0].dtype())
        throw DTypeError(fmt::format("concatenate: cannot concatenate arrays with different dtypes, got {} (operand "
                                     "0) and {} (operand {}); use jnp::concatenate to promote, or astype",
                                     dtype_name(in[0].dtype()), dtype_name(in[k].dtype()), k));
      if (in[k].ndim() != int(s0.size()))
        throw ShapeError(fmt::format("concatenate: arrays must have the same number of dimensions, got shapes {} "
                                     "(operand 0) and {} (operand {})",
                                     shape_str(s0), shape_str(in[k].shape()), k));
      weak = weak && in[k].weak_type();
    }
    if (s0.empty())
      throw ShapeError("concatenate: zero-dimensional arrays cannot be concatenated; reshape them to (1,) first");
    if (dim < 0 || dim >= int64_t(s0.size()))
      throw ValueError(fmt::format("concatenate dimension out of bounds: dimension {} for operands of shape {}", dim,
                                   shape_str(s0)));
    Shape out = s0;
    for (size_t k = 1; k < in.size(); ++k) {
      const Shape& sk = in[k].shape();
      for (size_t a = 0; a < s0.size(); ++a)
        if (int64_t(a) != dim && sk[a] != s0[a])
          throw ShapeError(fmt::format("concatenate: all input array dimensions except for the concatenation axis {} "
                                       "must match exactly, but along dimension {} the array at index 0 has size {} "
                                       "and the array at index {} has size {} (shapes {} and {})",
                                       dim, a, s0[a], k, sk[a], shape_str(s0), shape_str(sk)));
      out[size_t(dim)] += sk[size_t(dim)];
    }
    return {AbstractValue{out, in[0].dtype(), weak, {}}};
  };
  def.cpu_impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
    const AbstractValue& oa = out_avals[0];
    Array out = make_uninitialized(oa, device_of(in[0]));
    size_t dim = size_t(p.i("dimension"));
    size_t isz = itemsize(oa.dtype);
    std::vector<int64_t> starts(oa.shape.size(), 0);
    for (const Array& x : in) {
      if (x.size() > 0) copy_block_into(bytes_of(out), oa.shape, starts, bytes_of(x), x.shape(), isz);
      starts[dim] += x.shape()[dim];
    }
    return std::vector<Array>{out};
  };
  return def;
}());

// ---- pad ----
int64_t padded_dim(int64_t d, int64_t lo, int64_t hi, int64_t interior) {
  return lo + hi + d + std::max<int64_t>(d - 1, 0) * interior;
}
const PrimitiveDef& g_pad = register_primitive([] {
  PrimitiveDef def;
  def.name = "pad";
  def.kind = PrimKind::Shape;
  def.arity = Arity::exactly(2);
  def.abstract_eval = [](std::span<const Array> in, const Params& p) -> std::vector<AbstractValue> {
    const auto& cfg = p.get<std::vector<std::vector<int64_t>>>("padding_config");
    const Shape& s = in[0].shape();
    if (in[1].ndim() != 0)
      throw ShapeError(fmt::format("pad: padding_value must be a scalar, got shape {}", shape_str(in[1].shape())));
    if (in[1].dtype() != in[0].dtype())
      throw DTypeError(fmt::format("pad: operand and padding_value must have the same dtype, got {} and {}",
                                   dtype_name(in[0].dtype()), dtype_name(in[1].dtype())));
    if (cfg.size() != s.size())
      throw ShapeError(fmt::format("pad: padding_config has {} entries but the operand of shape {} has rank {}; "
                                   "give one (lo, hi, interior) per dimension",
                                   cfg.size(), shape_str(s), s.size()));
    Shape out(s.size());
    for (size_t i = 0; i < s.size(); ++i) {
      if (cfg[i].size() != 3)
        throw ValueError(fmt::format("pad: padding_config entry {} must be (lo, hi, interior)", i));
      if (cfg[i][2] < 0)
        throw ValueError(fmt::format("pad: interior padding must be >= 0, got {} for dimension {}", cfg[i][2], i));
      out[i] = padded_dim(s[i], cfg[i][0], cfg[i][1], cfg[i][2]);
      if (out[i] < 0)
        throw ShapeError(fmt::format("pad: dimension {} of operand shape {} has size {} after padding ({}, {}, {}); "
                                     "the size after padding must be at least 0",
                                     i, shape_str(s), out[i], cfg[i][0], cfg[i][1], cfg[i][2]));
    }
    return {AbstractValue{out, in[0].dtype(), in[0].weak_type() && in[1].weak_type(), {}}};
  };
  def.cpu_impl = [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
    const Array& x = in[0];
    const AbstractValue& oa = out_avals[0];
    const auto& cfg = p.get<std::vector<std::vector<int64_t>>>("padding_config");
    Array out = make_uninitialized(oa, device_of(x));
    size_t isz = itemsize(oa.dtype);
    fill_items(raw_ptr(out), oa.size(), raw_ptr(in[1]), isz);
    if (oa.size() == 0 || x.size() == 0) return std::vector<Array>{out};
    auto ost = row_major_strides(oa.shape), ist = row_major_strides(x.shape());
    size_t r = oa.shape.size();
    std::vector<int64_t> count(r), dst_st(r);
    int64_t doff = 0, soff = 0;
    for (size_t i = 0; i < r; ++i) {
      int64_t lo = cfg[i][0], step = cfg[i][2] + 1, d = x.shape()[i], od = oa.shape[i];
      int64_t i0 = lo >= 0 ? 0 : (-lo + step - 1) / step;
      int64_t room = od - lo;  // positions lo + k*step < od  <=>  k < room / step (ceil)
      int64_t i1 = room <= 0 ? 0 : std::min(d, (room + step - 1) / step);
      count[i] = std::max<int64_t>(0, i1 - i0);
      if (count[i] == 0) return std::vector<Array>{out};
      dst_st[i] = step * ost[i];
      doff += (lo + i0 * step) * ost[i];
      soff += i0 * ist[i];
    }
    strided_copy(bytes_of(out) + doff * int64_t(isz), dst_st, bytes_of(x) + soff * int64_t(isz), ist, count, isz);
    return std::vector<Array>{out};
  };
  return def;
}());

// ---- iota ----
const PrimitiveDef& g_iota = register_primitive([] {
  PrimitiveDef def;
  def.name = "iota";
  def.kind = PrimKind::Broadcast;
  def.arity = Arity::exactly(0);
  def.abstract_eval = [](std::span<const Array>, const Params& p) -> std::vector<AbstractValue> {
    DType dt = p.get<DType>("dtype");
    const Shape& s = p.ints("shape");
    int64_t dim = p.i("dimension");
    if (dt == DType::bool_)
      throw DTypeError("iota: dtype bool is not supported; use an integer or floating-point dtype");
    if (s.empty()) throw ShapeError("iota shape must have positive rank, got shape=()");
    check_dims_nonneg("iota", "shape", s);
    if (dim < 0 || dim >= int64_t(s.size()))
      throw ValueError(fmt::format("iota dimension must be between 0 and len(shape), got dimension={} for shape={}",
                                   dim, shape_str(s)));
    return {AbstractValue{s, dt, false, {}}};
  };
  def.cpu_impl = [](std::span<const Array>, std::span<const AbstractValue> out_avals, const Params& p) {
    const AbstractValue& oa = out_avals[0];
    Array out = make_uninitialized(oa, host_device());
    size_t dim = size_t(p.i("dimension"));
    int64_t n = oa.size();
    if (n == 0) return std::vector<Array>{out};
    int64_t inner = 1;
    for (size_t i = dim + 1; i < oa.shape.size(); ++i) inner *= oa.shape[i];
    int64_t len = oa.shape[dim];
    visit_dtype(oa.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (!std::is_same_v<T, bool>) {
        T* y = data_ptr<T>(out);
        parallel_for(n, kCopyGrain, [&](int64_t b, int64_t e) {
          int64_t q = b / inner, r = b % inner;
          int64_t v = q % len;
          for (int64_t i = b; i < e; ++i) {
            if constexpr (is_half_v<T>) y[i] = T(float(v));
            else y[i] = T(v);
            if (++r == inner) {
              r = 0;
              if (++v == len) v = 0;
            }
          }
        });
      }
    });
    return std::vector<Array>{out};
  };
  return def;
}());

}  // namespace

namespace prims {
const PrimitiveDef& broadcast_in_dim() { return g_broadcast_in_dim; }
const PrimitiveDef& reshape() { return g_reshape; }
const PrimitiveDef& transpose() { return g_transpose; }
const PrimitiveDef& squeeze() { return g_squeeze; }
const PrimitiveDef& rev() { return g_rev; }
const PrimitiveDef& concatenate() { return g_concatenate; }
const PrimitiveDef& pad() { return g_pad; }
const PrimitiveDef& iota() { return g_iota; }
}  // namespace prims

// ============================================================================================
// lax wrappers (as jax.lax: shortcuts that return the operand bind nothing)
// ============================================================================================
namespace lax {

Array broadcast_in_dim(const Array& x, const Shape& shape, const std::vector<int64_t>& broadcast_dimensions) {
  if (x.shape() == shape && x.ndim() == int(broadcast_dimensions.size())) {
    bool identity = true;
    for (size_t i = 0; i < broadcast_dimensions.size(); ++i) identity = identity && broadcast_dimensions[i] == int64_t(i);
    if (identity) return x;
  }
  return bind1(prims::broadcast_in_dim(), {x},
               Params{{"shape", shape}, {"broadcast_dimensions", broadcast_dimensions}, {"sharding", std::monostate{}}});
}

Array broadcast(const Array& x, const Shape& sizes) {
  if (sizes.empty()) return x;
  Shape shape = sizes;
  shape.insert(shape.end(), x.shape().begin(), x.shape().end());
  std::vector<int64_t> dims(size_t(x.ndim()));
  std::iota(dims.begin(), dims.end(), int64_t(sizes.size()));
  return broadcast_in_dim(x, shape, dims);
}

Array reshape(const Array& x, const Shape& new_sizes) {
  if (x.shape() == new_sizes) return x;
  return bind1(prims::reshape(), {x},
               Params{{"new_sizes", new_sizes}, {"dimensions", std::monostate{}}, {"sharding", std::monostate{}}});
}

Array transpose(const Array& x, const std::vector<int64_t>& permutation) {
  bool identity = int(permutation.size()) == x.ndim();
  for (size_t i = 0; identity && i < permutation.size(); ++i) identity = permutation[i] == int64_t(i);
  if (identity) return x;
  return bind1(prims::transpose(), {x}, Params{{"permutation", permutation}});
}

Array squeeze(const Array& x, const std::vector<int64_t>& dimensions) {
  std::vector<int64_t> dims = canonicalize_axes(dimensions, x.ndim(), "lax::squeeze");
  std::sort(dims.begin(), dims.end());
  if (dims.empty()) return x;
  return bind1(prims::squeeze(), {x}, Params{{"dimensions", dims}});
}

Array expand_dims(const Array& x, const std::vector<int64_t>& dimensions) {
  int64_t ndim_out = x.ndim() + int64_t(dimensions.size());
  std::vector<int64_t> dims = canonicalize_axes(dimensions, ndim_out, "lax::expand_dims");
  std::vector<bool> is_new(size_t(ndim_out), false);
  for (int64_t d : dims) is_new[size_t(d)] = true;
  Shape shape;
  std::vector<int64_t> bdims;
  size_t k = 0;
  for (int64_t i = 0; i < ndim_out; ++i) {
    if (is_new[size_t(i)]) {
      shape.push_back(1);
    } else {
      shape.push_back(x.shape()[k++]);
      bdims.push_back(i);
    }
  }
  return broadcast_in_dim(x, shape, bdims);
}

Array rev(const Array& x, const std::vector<int64_t>& dimensions) {
  if (dimensions.empty() || x.ndim() == 0) return x;
  return bind1(prims::rev(), {x}, Params{{"dimensions", canonicalize_axes(dimensions, x.ndim(), "lax::rev")}});
}

Array concatenate(const std::vector<Array>& operands, int64_t dimension) {
  if (operands.empty()) throw ValueError("lax::concatenate requires a non-empty sequence of arrays");
  if (operands.size() == 1) return operands[0];
  if (operands[0].ndim() > 0) dimension = canonicalize_axis(dimension, operands[0].ndim(), "lax::concatenate");
  return bind1(prims::concatenate(), std::span<const Array>(operands), Params{{"dimension", dimension}});
}

Array pad(const Array& x, const Array& padding_value, const std::vector<PadConfig>& config) {
  std::vector<std::vector<int64_t>> cfg;
  cfg.reserve(config.size());
  for (const PadConfig& c : config) cfg.push_back({c.lo, c.hi, c.interior});
  return bind1(prims::pad(), {x, padding_value}, Params{{"padding_config", cfg}});
}

Array broadcasted_iota(DType dtype, const Shape& shape, int64_t dimension) {
  (void)itemsize(dtype);  // validates (DTypeError "invalid dtype value N")
  if (!shape.empty()) dimension = canonicalize_axis(dimension, int64_t(shape.size()), "lax::broadcasted_iota");
  return bind1(prims::iota(), std::span<const Array>(),
               Params{{"dtype", dtype}, {"shape", shape}, {"dimension", dimension}, {"sharding", std::monostate{}}});
}

Array iota(DType dtype, int64_t size) { return broadcasted_iota(dtype, Shape{size}, 0); }

}  // namespace lax
}  // namespace cjax
