// numpy-style indexing (x[...]), JAX's `.at[...]` updates, numpy::take and take_along_axis.
//
// Rules (numpy's, as JAX implements them in jax/_src/numpy/indexing.py):
//  * Basic indexing (ints, Slices, NewAxis, Ellipsis) lowers to lax::slice / rev / reshape: no
//    gather. A static int out of range raises ValueError naming the index, the axis and its size
//    (also in `.at(...)` updates, where numpy raises too).
//  * Integer arrays are advanced indices: they (and any ints next to them) broadcast together; the
//    broadcast dims replace the indexed dims in place when the advanced indices are adjacent, else
//    they go first. Negative entries wrap once. Advanced indexing lowers to one gather with JAX's
//    dimension numbers; x[idx] clamps out-of-range entries (mode PROMISE_IN_BOUNDS, as JAX's
//    default), `.at(idx).set/add/...` drops them (FILL_OR_DROP).
//  * Boolean masks need a concrete value: they become integer indices (nonzero) on the host; a
//    traced mask raises ConcretizationError (use jnp::where). A 0-d bool adds an axis of length
//    1 (true) or 0 (false), as in numpy.
//  * A 0-d integer Array index is a dynamic int (a gather, clamped).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>

#include "cjax/lax.h"
#include "cjax/numpy.h"
#include "core/array/array_impl.h"
#include "core/array/util.h"
#include "core/array/visit_dtype.h"
#include "core/lax/gather_scatter.h"

namespace cjax {

Index::Index(const Array& a) : v_(std::make_shared<Array>(a)) {}

const std::vector<Slice>& Index::block() const {
  if (const auto* b = std::get_if<std::vector<Slice>>(&v_)) return *b;
  throw ValueError("Index::block(): this index entry is not a block index (a slice per dimension)");
}

namespace {

using lax::GatherScatterMode;

enum class EK { Int, Slc, New, Ell, Arr, BoolScalar };
struct Ent {
  EK k;
  int64_t i = 0;
  Slice s;
  Array a;
  bool b = false;
  int pos = 0;  // position in the user's index (for messages)
};

struct Prepared {
  std::vector<Ent> ents;               // Ellipsis removed, trailing slices added, masks expanded
  bool advanced = false;               // any integer array (numpy advanced indexing)
  bool contiguous = true;              // advanced indices adjacent (numpy placement rule)
  bool dynamic = false;                // some Array index (gather path)
  std::vector<int64_t> inserted_dims;  // x dims inserted for 0-d bool indices
};

std::string index_str(const std::vector<Ent>& e);

DType index_dtype_for(const Shape& s) {
  for (int64_t d : s)
    if (d > int64_t(std::numeric_limits<int32_t>::max())) return DType::int64;
  return DType::int32;
}

template <class T>
Array host_array(const std::vector<int64_t>& v, Shape shape) {
  std::vector<T> t(v.begin(), v.end());
  return numpy::array<T>(t, std::move(shape));
}
Array index_const(const std::vector<int64_t>& v, DType d, Shape shape) {
  return d == DType::int64 ? host_array<int64_t>(v, std::move(shape)) : host_array<int32_t>(v, std::move(shape));
}

// Host nonzero of a concrete bool mask: one index array per mask dim.
std::vector<Array> mask_nonzero(const Array& mask, DType idt) {
  std::vector<uint8_t> m(static_cast<size_t>(mask.size()));
  if (!m.empty()) std::memcpy(m.data(), raw_ptr(to_host(mask)), m.size());
  int nd = mask.ndim();
  std::vector<std::vector<int64_t>> coords(static_cast<size_t>(nd));
  std::vector<int64_t> c(static_cast<size_t>(nd), 0);
  const Shape& s = mask.shape();
  for (size_t lin = 0; lin < m.size(); ++lin) {
    if (m[lin])
      for (int d = 0; d < nd; ++d) coords[size_t(d)].push_back(c[size_t(d)]);
    for (int d = nd - 1; d >= 0; --d) {
      if (++c[size_t(d)] < s[size_t(d)]) break;
      c[size_t(d)] = 0;
    }
  }
  std::vector<Array> out;
  for (int d = 0; d < nd; ++d) {
    int64_t n = int64_t(coords[size_t(d)].size());
    out.push_back(index_const(coords[size_t(d)], idt, Shape{n}));
  }
  return out;
}

// Block indices (a slice per dimension) become their slices.
std::vector<Index> expand_blocks(const std::vector<Index>& idx) {
  std::vector<Index> out;
  out.reserve(idx.size());
  for (const Index& i : idx) {
    if (const auto* block = std::get_if<std::vector<Slice>>(&i.value()))
      out.insert(out.end(), block->begin(), block->end());
    else
      out.push_back(i);
  }
  return out;
}

Prepared prepare(const Shape& xs, const std::vector<Index>& given, std::string_view fn) {
  std::vector<Index> idx = expand_blocks(given);
  int64_t ndim = int64_t(xs.size());
  DType idt = index_dtype_for(xs);
  std::vector<Ent> raw;
  int n_ell = 0;
  for (size_t p = 0; p < idx.size(); ++p) {
    Ent e;
    e.pos = int(p);
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, int64_t>) {
            e.k = EK::Int;
            e.i = v;
          } else if constexpr (std::is_same_v<V, Slice>) {
            e.k = EK::Slc;
            e.s = v;
            if (v.step == 0) throw ValueError(fmt::format("{}: slice step cannot be zero (index position {})", fn, p));
          } else if constexpr (std::is_same_v<V, NewAxisT>) {
            e.k = EK::New;
          } else if constexpr (std::is_same_v<V, EllipsisT>) {
            e.k = EK::Ell;
            ++n_ell;
          } else if constexpr (std::is_same_v<V, std::vector<Slice>>) {
            throw Error("internal: a block index left unexpanded");
          } else {
            if (!v || !v->defined())
              throw ValueError(fmt::format("{}: index position {} is an empty Array handle", fn, p));
            e.a = *v;
            DType d = e.a.dtype();
            if (d == DType::bool_) {
              if (!concrete(e.a))
                throw ConcretizationError(fmt::format(
                    "{}: boolean mask index of type {} at position {} is a tracer, but a mask index needs a concrete "
                    "value (the result's shape depends on how many entries are true). Inside jit/grad/vmap use "
                    "jnp::where(mask, x, fill) instead of x[mask]",
                    fn, e.a.aval().str(), p));
              if (e.a.ndim() == 0) {
                e.k = EK::BoolScalar;
                e.b = e.a.item<bool>();
              } else {
                e.k = EK::Arr;  // expanded below
              }
            } else if (!is_integer(d)) {
              throw DTypeError(
                  fmt::format("{}: indexer must have integer or boolean type, got an index array of dtype {} "
                              "at position {} (shape {}); convert it with astype(int32)",
                              fn, dtype_name(d), p, shape_str(e.a.shape())));
            } else {
              e.k = EK::Arr;
            }
          }
        },
        idx[p].value());
    raw.push_back(std::move(e));
  }
  if (n_ell > 1)
    throw ValueError(fmt::format("{}: an index can only have a single ellipsis (Ellipsis); got {} in {}", fn, n_ell,
                                 index_str(raw)));
  auto consumes = [](const Ent& e) -> int64_t {
    switch (e.k) {
      case EK::Int:
      case EK::Slc: return 1;
      case EK::Arr: return e.a.dtype() == DType::bool_ ? e.a.ndim() : 1;
      default: return 0;
    }
  };
  int64_t consumed = 0;
  for (auto& e : raw) consumed += consumes(e);
  if (consumed > ndim)
    throw ValueError(
        fmt::format("{}: too many indices: a {}-dimensional array of shape {} indexed with {} regular "
                    "{} ({})",
                    fn, ndim, shape_str(xs), consumed, consumed == 1 ? "index" : "indices", index_str(raw)));
  // Expand masks into integer index arrays.
  std::vector<Ent> ents;
  int64_t xpos = 0;
  for (auto& e : raw) {
    if (e.k == EK::Ell) xpos += ndim - consumed;
    if (e.k == EK::Arr && e.a.dtype() == DType::bool_) {
      int64_t m = e.a.ndim();
      Shape expected(xs.begin() + xpos, xs.begin() + xpos + m);
      if (e.a.shape() != expected)
        throw ShapeError(
            fmt::format("{}: boolean index did not match the indexed array at position {}: got a mask "
                        "of shape {}, expected shape {} (dims {}..{} of the array of shape {})",
                        fn, e.pos, shape_str(e.a.shape()), shape_str(expected), xpos, xpos + m - 1, shape_str(xs)));
      for (Array& a : mask_nonzero(e.a, idt)) {
        Ent n;
        n.k = EK::Arr;
        n.a = a;
        n.pos = e.pos;
        ents.push_back(std::move(n));
      }
      xpos += m;
      continue;
    }
    xpos += consumes(e);
    ents.push_back(std::move(e));
  }
  Prepared p;
  // Advanced-index detection and numpy's adjacency rule (computed before removing the Ellipsis).
  std::vector<int> adv_pos;
  for (size_t q = 0; q < ents.size(); ++q) {
    const Ent& e = ents[q];
    if (e.k == EK::Arr || e.k == EK::BoolScalar) p.dynamic = true;
    if ((e.k == EK::Arr && e.a.ndim() > 0) || e.k == EK::BoolScalar) p.advanced = true;
    if (e.k == EK::Int || e.k == EK::Arr || e.k == EK::BoolScalar) adv_pos.push_back(int(q));
  }
  for (size_t q = 1; q < adv_pos.size(); ++q)
    if (adv_pos[q] != adv_pos[q - 1] + 1) p.contiguous = false;
  // Remove the Ellipsis, add trailing full slices.
  int64_t n_cons = 0;
  for (auto& e : ents)
    if (e.k == EK::Int || e.k == EK::Slc || e.k == EK::Arr) ++n_cons;
  for (auto& e : ents) {
    if (e.k == EK::Ell) {
      for (int64_t r = 0; r < ndim - n_cons; ++r) {
        Ent s;
        s.k = EK::Slc;
        s.pos = e.pos;
        p.ents.push_back(s);
      }
      n_cons = ndim;
      continue;
    }
    p.ents.push_back(std::move(e));
  }
  for (int64_t r = n_cons; r < ndim; ++r) {
    Ent s;
    s.k = EK::Slc;
    s.pos = int(idx.size());
    p.ents.push_back(s);
  }
  // 0-d bools: insert an axis of size 1 and index it with [0] (true) or [] (false).
  int64_t xa = 0;
  for (auto& e : p.ents) {
    if (e.k == EK::BoolScalar) {
      p.inserted_dims.push_back(xa);
      e.k = EK::Arr;
      e.a = index_const(e.b ? std::vector<int64_t>{0} : std::vector<int64_t>{}, idt, Shape{e.b ? 1 : 0});
    }
    if (e.k == EK::Int || e.k == EK::Slc || e.k == EK::Arr) ++xa;
  }
  // Static ints: bounds (numpy raises IndexError; cjax raises ValueError).
  Shape xs2 = xs;
  for (int64_t d : p.inserted_dims) xs2.insert(xs2.begin() + d, 1);
  xa = 0;
  for (auto& e : p.ents) {
    if (e.k == EK::Int) {
      int64_t n = xs2[size_t(xa)];
      if (e.i < -n || e.i >= n)
        throw ValueError(fmt::format("{}: index {} is out of bounds for axis {} with size {} (array shape {})", fn, e.i,
                                     xa, n, shape_str(xs)));
      if (e.i < 0) e.i += n;
    }
    if (e.k == EK::Int || e.k == EK::Slc || e.k == EK::Arr) ++xa;
  }
  return p;
}

std::string ent_str(const Ent& e) {
  switch (e.k) {
    case EK::Int: return std::to_string(e.i);
    case EK::Slc: {
      auto b = [](const std::optional<int64_t>& v) { return v ? std::to_string(*v) : std::string(); };
      std::string s = fmt::format("{}:{}", b(e.s.start), b(e.s.stop));
      if (e.s.step != 1) s += fmt::format(":{}", e.s.step);
      return s;
    }
    case EK::New: return "NewAxis";
    case EK::Ell: return "...";
    case EK::BoolScalar: return e.b ? "True" : "False";
    case EK::Arr: return fmt::format("Array({})", e.a.aval().str());
  }
  return "?";
}
std::string index_str(const std::vector<Ent>& e) {
  std::string s = "[";
  for (size_t i = 0; i < e.size(); ++i) {
    if (i) s += ", ";
    s += ent_str(e[i]);
  }
  return s + "]";
}

// numpy's slice.indices(n) + element count.
struct SliceInfo {
  int64_t start, step, count;
};
SliceInfo canonical_slice(const Slice& s, int64_t n) {
  int64_t step = s.step;
  int64_t start, stop;
  if (!s.start)
    start = step < 0 ? n - 1 : 0;
  else {
    start = *s.start;
    if (start < 0) {
      start += n;
      if (start < 0) start = step < 0 ? -1 : 0;
    } else if (start >= n) {
      start = step < 0 ? n - 1 : n;
    }
  }
  if (!s.stop)
    stop = step < 0 ? -1 : n;
  else {
    stop = *s.stop;
    if (stop < 0) {
      stop += n;
      if (stop < 0) stop = step < 0 ? -1 : 0;
    } else if (stop >= n) {
      stop = step < 0 ? n - 1 : n;
    }
  }
  int64_t count = 0;
  if (step > 0 && stop > start) count = (stop - start - 1) / step + 1;
  if (step < 0 && start > stop) count = (start - stop - 1) / (-step) + 1;
  return {start, step, count};
}

// numpy broadcasting of shapes; raises ShapeError naming all shapes.
Shape broadcast_shapes_or_throw(const std::vector<Shape>& shapes, std::string_view what) {
  size_t r = 0;
  for (auto& s : shapes) r = std::max(r, s.size());
  Shape out(r, 1);
  for (auto& s : shapes)
    for (size_t i = 0; i < s.size(); ++i) {
      int64_t& o = out[r - s.size() + i];
      int64_t d = s[i];
      if (d == o || d == 1) continue;
      if (o == 1) {
        o = d;
        continue;
      }
      std::string all;
      for (auto& t : shapes) {
        if (!all.empty()) all += ' ';
        all += shape_str(t);
      }
      throw ShapeError(
          fmt::format("{}: shape mismatch: {} could not be broadcast together with shapes {}", what, "arrays", all));
    }
  return out;
}

// Broadcasts `a` to `shape` (numpy rules; the caller checked compatibility).
Array bcast(const Array& a, const Shape& shape) {
  if (a.shape() == shape) return a;
  size_t off = shape.size() - a.shape().size();
  Shape kept;
  std::vector<int64_t> dims;
  for (size_t i = 0; i < a.shape().size(); ++i) {
    if (a.shape()[i] == 1 && shape[off + i] != 1) continue;
    kept.push_back(a.shape()[i]);
    dims.push_back(int64_t(off + i));
  }
  Array r = kept == a.shape() ? a : lax::reshape(a, kept);
  return lax::broadcast_in_dim(r, shape, dims);
}

// Normalizes negative entries of an index array (converted to `idt`) by adding `n` once.
Array normalize_index(const Array& i, int64_t n, DType idt) {
  if (is_unsigned_integer(i.dtype())) return lax::convert_element_type(i, idt);
  Array c = i.dtype() == idt && !i.weak_type() ? i : lax::convert_element_type(i, idt);
  Array zero = make_scalar(0.0, idt), size = make_scalar(double(n), idt);
  return lax::select(lax::lt(c, zero), lax::add(c, size), c);
}

struct Indexer {
  Shape slice_shape;
  std::vector<int64_t> gather_slice_shape;
  Array gather_indices;
  lax::GatherDimensionNumbers dn;
  bool unique = true, sorted = true;
  std::vector<int64_t> newaxis_dims;
};

// Port of JAX's index_to_gather.
Indexer index_to_gather(const Shape& xs, const Prepared& p, std::string_view fn) {
  DType idt = index_dtype_for(xs);
  const auto& ents = p.ents;
  std::vector<Array> adv_arrays;
  std::vector<int64_t> adv_x_axes;
  std::vector<size_t> adv_pos;
  if (p.advanced) {
    int64_t j = 0;
    for (size_t q = 0; q < ents.size(); ++q) {
      const Ent& e = ents[q];
      if (e.k == EK::New) continue;
      if (e.k == EK::Int) {
        adv_arrays.push_back(make_scalar(double(e.i), idt));
        adv_x_axes.push_back(j);
        adv_pos.push_back(q);
      } else if (e.k == EK::Arr) {
        adv_arrays.push_back(normalize_index(e.a, xs[size_t(j)], idt));
        adv_x_axes.push_back(j);
        adv_pos.push_back(q);
      }
      ++j;
    }
  }
  Indexer ix;
  ix.unique = ix.sorted = !p.advanced;
  std::vector<std::pair<Array, int64_t>> gidx;
  Shape gshape;
  std::vector<int64_t> collapsed;
  int64_t x_axis = 0, y_axis = 0, cy_axis = 0;
  for (size_t q = 0; q < ents.size(); ++q) {
    if (p.advanced && ((p.contiguous && q == adv_pos[0]) || (!p.contiguous && q == 0))) {
      std::vector<Shape> shapes;
      for (auto& a : adv_arrays) shapes.push_back(a.shape());
      Shape bs = broadcast_shapes_or_throw(shapes, fn);
      int64_t start_dim = int64_t(gshape.size());
      for (auto& a : adv_arrays) gidx.emplace_back(bcast(a, bs), start_dim);
      gshape.insert(gshape.end(), bs.begin(), bs.end());
      for (int64_t ax : adv_x_axes) {
        ix.dn.start_index_map.push_back(ax);
        collapsed.push_back(ax);
      }
      ix.slice_shape.insert(ix.slice_shape.end(), bs.begin(), bs.end());
      y_axis += int64_t(bs.size());
      cy_axis += int64_t(bs.size());
    }
    if (p.advanced && std::find(adv_pos.begin(), adv_pos.end(), q) != adv_pos.end()) {
      ++x_axis;
      ix.gather_slice_shape.push_back(1);
      continue;
    }
    const Ent& e = ents[q];
    switch (e.k) {
      case EK::Int:
      case EK::Arr: {  // a scalar index outside advanced mode (static int or 0-d int Array)
        int64_t n = xs[size_t(x_axis)];
        if (n == 0) throw ValueError(fmt::format("{}: index is out of bounds for axis {} with size 0", fn, x_axis));
        Array g = e.k == EK::Int ? make_scalar(double(e.i), idt) : normalize_index(e.a, n, idt);
        gidx.emplace_back(g, int64_t(gshape.size()));
        collapsed.push_back(x_axis);
        ix.gather_slice_shape.push_back(1);
        ix.dn.start_index_map.push_back(x_axis);
        ++x_axis;
        break;
      }
      case EK::New:
        ix.slice_shape.push_back(1);
        ix.newaxis_dims.push_back(y_axis);
        ++y_axis;
        break;
      case EK::Slc: {
        int64_t n = xs[size_t(x_axis)];
        SliceInfo si = canonical_slice(e.s, n);
        ix.slice_shape.push_back(si.count);
        if (si.step == 1) {
          if (si.count != n) {
            gidx.emplace_back(make_scalar(double(si.start), idt), int64_t(gshape.size()));
            ix.dn.start_index_map.push_back(x_axis);
          }
          ix.gather_slice_shape.push_back(si.count);
          ix.dn.offset_dims.push_back(cy_axis);
        } else {
          std::vector<int64_t> v(size_t(si.count));
          for (int64_t k = 0; k < si.count; ++k) v[size_t(k)] = si.start + k * si.step;
          ix.gather_slice_shape.push_back(1);
          gidx.emplace_back(index_const(v, idt, Shape{si.count}), int64_t(gshape.size()));
          ix.dn.start_index_map.push_back(x_axis);
          gshape.push_back(si.count);
          collapsed.push_back(x_axis);
        }
        ++cy_axis;
        ++y_axis;
        ++x_axis;
        break;
      }
      default: throw Error("internal: unexpected index entry");
    }
  }
  if (gidx.empty()) {
    ix.gather_indices = index_const({}, idt, Shape{0});
  } else if (gidx.size() == 1) {
    const Array& g = gidx[0].first;
    Shape s = g.shape();
    s.push_back(1);
    ix.gather_indices = lax::reshape(g, s);
  } else {
    Shape full = gshape;
    full.push_back(1);
    std::vector<Array> parts;
    for (auto& [g, start] : gidx) {
      std::vector<int64_t> dims(static_cast<size_t>(g.ndim()));
      for (int64_t d = 0; d < g.ndim(); ++d) dims[size_t(d)] = start + d;
      // broadcast_in_dim to gshape + (1,), the index's dims aligned at `start`.
      parts.push_back(lax::broadcast_in_dim(g, full, dims));
    }
    ix.gather_indices = lax::concatenate(parts, int64_t(gshape.size()));
  }
  std::sort(collapsed.begin(), collapsed.end());
  ix.dn.collapsed_slice_dims = collapsed;
  return ix;
}

Array zeros_of(const Shape& shape, DType d, bool weak = false) {
  Array z = make_uninitialized(AbstractValue{shape, d, weak, {}}, host_device());
  size_t nb = size_t(shape_size(shape)) * itemsize(d);
  if (nb) std::memset(raw_ptr(z), 0, nb);
  return z;
}

Array with_inserted_dims(const Array& x, const std::vector<int64_t>& dims) {
  if (dims.empty()) return x;
  return lax::expand_dims(x, dims);
}

// Basic indexing: slice + rev + reshape.
Array static_index(const Array& x, const Prepared& p) {
  int64_t R = x.ndim();
  std::vector<int64_t> start(static_cast<size_t>(R)), limit(static_cast<size_t>(R)), stride(static_cast<size_t>(R), 1),
      revd;
  Shape final_shape;
  bool need_slice = false, strided = false;
  int64_t xa = 0;
  for (const Ent& e : p.ents) {
    if (e.k == EK::New) {
      final_shape.push_back(1);
      continue;
    }
    int64_t n = x.shape()[size_t(xa)];
    if (e.k == EK::Int) {
      start[size_t(xa)] = e.i;
      limit[size_t(xa)] = e.i + 1;
      need_slice |= n != 1;
    } else {
      SliceInfo si = canonical_slice(e.s, n);
      int64_t c = si.count;
      final_shape.push_back(c);
      if (c == 0) {
        start[size_t(xa)] = limit[size_t(xa)] = 0;
      } else if (si.step > 0) {
        start[size_t(xa)] = si.start;
        limit[size_t(xa)] = si.start + (c - 1) * si.step + 1;
        stride[size_t(xa)] = si.step;
      } else {
        int64_t lo = si.start + (c - 1) * si.step;
        start[size_t(xa)] = lo;
        limit[size_t(xa)] = si.start + 1;
        stride[size_t(xa)] = -si.step;
        if (c > 1) revd.push_back(xa);
      }
      if (stride[size_t(xa)] != 1 && c > 1) strided = true;
      if (start[size_t(xa)] != 0 || limit[size_t(xa)] != n || (stride[size_t(xa)] != 1 && c > 1)) need_slice = true;
    }
    ++xa;
  }
  Array y = x;
  if (need_slice) {
    if (!strided)
      stride.clear();
    else
      for (int64_t d = 0; d < R; ++d)
        if (limit[size_t(d)] - start[size_t(d)] <= 1) stride[size_t(d)] = 1;
    y = lax::slice(y, start, limit, stride);
  }
  if (!revd.empty()) y = lax::rev(y, revd);
  if (y.shape() != final_shape) y = lax::reshape(y, final_shape);
  return y;
}

Array getitem(const Array& x0, const std::vector<Index>& idx, GatherScatterMode mode, std::string_view fn) {
  Prepared p = prepare(x0.shape(), idx, fn);
  Array x = with_inserted_dims(x0, p.inserted_dims);
  if (!p.dynamic) return static_index(x, p);
  Indexer ix = index_to_gather(x.shape(), p, fn);
  if (shape_size(ix.slice_shape) == 0) return zeros_of(ix.slice_shape, x.dtype(), x.weak_type());
  Array y = x;
  if (shape_size(ix.gather_indices.shape()) != 0)
    y = gather_with(y, ix.gather_indices, ix.dn, ix.gather_slice_shape, mode, std::nullopt, ix.sorted, ix.unique);
  if (y.shape() != ix.slice_shape) y = lax::reshape(y, ix.slice_shape);  // adds the NewAxis dims
  return y;
}

Array scatter_update(const Array& x0, const std::vector<Index>& idx, const Array& v, ScatterKind kind,
                     std::string_view fn) {
  if (!v.defined()) throw ValueError(fmt::format("{}: the update value is an empty Array handle", fn));
  Prepared p = prepare(x0.shape(), idx, fn);
  Array x = with_inserted_dims(x0, p.inserted_dims);
  Indexer ix = index_to_gather(x.shape(), p, fn);
  if (shape_size(ix.slice_shape) == 0) return x0;
  std::vector<Array> xy = promote_dtypes(fn, {x, v});
  Array xc = xy[0], y = xy[1];
  // Broadcast the update to the indexed shape.
  {
    const Shape& ys = y.shape();
    const Shape& ts = ix.slice_shape;
    bool ok = ys.size() <= ts.size();
    for (size_t i = 0; ok && i < ys.size(); ++i) {
      int64_t d = ys[i], t = ts[ts.size() - ys.size() + i];
      ok = d == t || d == 1;
    }
    if (!ok)
      throw ShapeError(
          fmt::format("{}: the update of shape {} cannot be broadcast to the indexed shape {} (x of shape "
                      "{} indexed with {})",
                      fn, shape_str(ys), shape_str(ts), shape_str(x0.shape()), index_str(p.ents)));
    y = bcast(y, ts);
  }
  // Drop the NewAxis dims (all of size 1).
  if (!ix.newaxis_dims.empty()) {
    Shape s;
    for (size_t d = 0; d < ix.slice_shape.size(); ++d)
      if (std::find(ix.newaxis_dims.begin(), ix.newaxis_dims.end(), int64_t(d)) == ix.newaxis_dims.end())
        s.push_back(ix.slice_shape[d]);
    y = lax::reshape(y, s);
  }
  lax::ScatterDimensionNumbers sdn{ix.dn.offset_dims, ix.dn.collapsed_slice_dims, ix.dn.start_index_map, {}, {}};
  Array out = scatter_with(kind, xc, ix.gather_indices, y, sdn, GatherScatterMode::fill_or_drop, ix.sorted, ix.unique);
  out = convert_to(out, x0.dtype(), x0.weak_type());
  if (!p.inserted_dims.empty()) out = lax::reshape(out, x0.shape());
  return out;
}

}  // namespace

// ---------------------------------------------------------------- Array / AtProxy
Array Array::operator[](Index i) const {
  return getitem(*this, {std::move(i)}, GatherScatterMode::promise_in_bounds, "Array[]");
}
Array Array::operator[](std::initializer_list<Index> l) const {
  return getitem(*this, std::vector<Index>(l), GatherScatterMode::promise_in_bounds, "Array[]");
}
AtProxy Array::at(Index i) const { return AtProxy(*this, {std::move(i)}); }
AtProxy Array::at(std::initializer_list<Index> l) const { return AtProxy(*this, std::vector<Index>(l)); }

Array AtProxy::get() const { return getitem(x_, idx_, GatherScatterMode::promise_in_bounds, "Array.at(...).get"); }
Array AtProxy::set(const Array& v) const { return scatter_update(x_, idx_, v, ScatterKind::Set, "Array.at(...).set"); }
Array AtProxy::add(const Array& v) const { return scatter_update(x_, idx_, v, ScatterKind::Add, "Array.at(...).add"); }
Array AtProxy::multiply(const Array& v) const {
  return scatter_update(x_, idx_, v, ScatterKind::Mul, "Array.at(...).multiply");
}
Array AtProxy::min(const Array& v) const { return scatter_update(x_, idx_, v, ScatterKind::Min, "Array.at(...).min"); }
Array AtProxy::max(const Array& v) const { return scatter_update(x_, idx_, v, ScatterKind::Max, "Array.at(...).max"); }

// ---------------------------------------------------------------- take / take_along_axis
namespace numpy {

Array take(const Array& a0, const Array& indices0, std::optional<int64_t> axis, const std::string& mode) {
  if (!is_integer(indices0.dtype()))
    throw DTypeError(
        fmt::format("take: indices must have an integer dtype, got {} (shape {}); convert them with "
                    "astype(int32)",
                    dtype_name(indices0.dtype()), shape_str(indices0.shape())));
  Array a = a0;
  int64_t ax;
  if (!axis) {
    a = lax::reshape(a0, Shape{a0.size()});
    ax = 0;
  } else {
    ax = canonicalize_axis(*axis, a0.ndim(), "take");
  }
  int64_t n = a.shape()[size_t(ax)];
  Array indices = indices0;
  DType idt = is_unsigned_integer(indices.dtype()) || itemsize(indices.dtype()) >= 4 ? indices.dtype() : DType::int32;
  GatherScatterMode gm;
  if (mode == "fill") {
    gm = GatherScatterMode::fill_or_drop;
    indices = normalize_index(indices, n, idt);
  } else if (mode == "clip") {
    gm = GatherScatterMode::clip;
  } else if (mode == "wrap") {
    gm = GatherScatterMode::promise_in_bounds;
    if (n > 0) {
      Array c = lax::convert_element_type(indices, idt);
      Array nn = make_scalar(double(n), idt), zero = make_scalar(0.0, idt);
      Array r = lax::rem(c, nn);
      indices = is_unsigned_integer(idt) ? r : lax::select(lax::lt(r, zero), lax::add(r, nn), r);
    }
  } else {
    throw ValueError(fmt::format("take: invalid mode '{}'; use \"fill\" (default), \"clip\" or \"wrap\"", mode));
  }
  Shape out_shape(a.shape().begin(), a.shape().begin() + ax);
  out_shape.insert(out_shape.end(), indices.shape().begin(), indices.shape().end());
  out_shape.insert(out_shape.end(), a.shape().begin() + ax + 1, a.shape().end());
  if (n == 0 && indices.size() != 0)
    throw ValueError(
        fmt::format("take: cannot take a non-empty set of indices (shape {}) from the empty axis {} of "
                    "an array of shape {}",
                    shape_str(indices.shape()), ax, shape_str(a.shape())));
  if (indices.size() == 0 || shape_size(out_shape) == 0) return zeros_of(out_shape, a.dtype(), a.weak_type());
  int64_t index_dims = indices.ndim();
  std::vector<int64_t> ss = a.shape();
  ss[size_t(ax)] = 1;
  lax::GatherDimensionNumbers dn;
  for (int64_t d = 0; d < ax; ++d) dn.offset_dims.push_back(d);
  for (int64_t d = ax + index_dims; d < a.ndim() + index_dims - 1; ++d) dn.offset_dims.push_back(d);
  dn.collapsed_slice_dims = {ax};
  dn.start_index_map = {ax};
  Shape is = indices.shape();
  is.push_back(1);
  return gather_with(a, lax::reshape(indices, is), dn, ss, gm, std::nullopt, false, false);
}

Array take_along_axis(const Array& a0, const Array& indices0, int64_t axis) {
  if (!is_integer(indices0.dtype()))
    throw DTypeError(fmt::format("take_along_axis: indices must have an integer dtype, got {} (shape {})",
                                 dtype_name(indices0.dtype()), shape_str(indices0.shape())));
  int64_t rank = a0.ndim();
  if (indices0.ndim() != rank)
    throw ShapeError(
        fmt::format("take_along_axis: indices and arr must have the same number of dimensions; got "
                    "indices of shape {} (rank {}) and arr of shape {} (rank {})",
                    shape_str(indices0.shape()), indices0.ndim(), shape_str(a0.shape()), rank));
  int64_t ax = canonicalize_axis(axis, rank, "take_along_axis");
  DType idt = index_dtype_for(a0.shape());
  Array indices = lax::convert_element_type(indices0, idt);
  const Shape& idx_shape = indices.shape();
  int64_t axis_size = a0.shape()[size_t(ax)];
  Shape arr_shape = a0.shape();
  arr_shape[size_t(ax)] = 1;
  Shape out_shape;
  try {
    out_shape = broadcast_shapes_or_throw({idx_shape, arr_shape}, "take_along_axis");
  } catch (const ShapeError&) {
    throw ShapeError(
        fmt::format("take_along_axis: indices of shape {} are not broadcast-compatible with arr of shape "
                    "{} outside axis {}",
                    shape_str(idx_shape), shape_str(a0.shape()), ax));
  }
  // JAX returns zeros when the axis is empty (nothing to take from).
  if (axis_size == 0 || shape_size(out_shape) == 0) return zeros_of(out_shape, a0.dtype(), a0.weak_type());
  Shape gshape;
  for (int64_t i = 0; i < rank; ++i)
    if (i == ax || idx_shape[size_t(i)] != 1) gshape.push_back(out_shape[size_t(i)]);
  gshape.push_back(1);
  lax::GatherDimensionNumbers dn;
  std::vector<int64_t> ss, squeeze_dims;
  Array gidx;
  int64_t new_i = 0, j = 0;
  for (int64_t i = 0; i < rank; ++i) {
    if (i == ax) {
      gidx = lax::reshape(normalize_index(indices, axis_size, idt), gshape);
      ss.push_back(1);
      dn.start_index_map.push_back(new_i);
      dn.collapsed_slice_dims.push_back(new_i);
      ++new_i;
      ++j;
    } else if (idx_shape[size_t(i)] == 1) {
      dn.offset_dims.push_back(i);
      ss.push_back(arr_shape[size_t(i)]);
      ++new_i;
    } else if (arr_shape[size_t(i)] == 1) {
      squeeze_dims.push_back(i);
      ++j;
    } else {
      ss.push_back(arr_shape[size_t(i)] == 0 ? 0 : 1);
      dn.operand_batching_dims.push_back(new_i);
      dn.start_indices_batching_dims.push_back(j);
      ++new_i;
      ++j;
    }
  }
  Array a = squeeze_dims.empty() ? a0 : lax::squeeze(a0, squeeze_dims);
  return gather_with(a, gidx, dn, ss, GatherScatterMode::fill_or_drop, std::nullopt, false, false);
}

}  // namespace numpy
}  // namespace cjax
