// JVP, transpose and batching rules of the collectives (core/spmd/collectives.cpp), docs/shard_map.md
// §3.3. Every collective but pmax/pmin/axis_index is linear, so its JVP applies it to the tangent;
// the transposes follow the varying-axes types: psum_invariant <-> pvary, all_gather <->
// reduce_scatter, ppermute -> the inverse permutation, all_to_all -> split and concat swapped,
// all_gather_invariant -> a local slice, pbroadcast -> psum kept at the source. Batching: a
// collective over other axes acts on each example alike, so the batch dimension leads and
// dimension parameters shift past it; a collective over the vmap's own axis_name acts across the
// examples, which are the group's members (JAX's _batched_reduction_collective,
// _all_gather_batched_collective, _reduce_scatter_collective, _ppermute_batcher,
// _all_to_all_batched_collective, axis_index's batcher in jax/_src/lax/parallel.py).
#include <fmt/format.h>

#include "cjax/collectives.h"
#include "cjax/lax.h"
#include "cjax/numpy.h"
#include "core/array/array_impl.h"
#include "core/array/rules.h"
#include "core/array/spmd.h"
#include "core/lax/rule_support.h"
#include "core/spmd/collectives.h"

namespace cjax {
namespace {

using Args = std::span<const Array>;

Params with(Params p, const char* key, ParamValue v) {
  p.set(key, std::move(v));
  return p;
}

// The tangent made to vary over the axes the collective needs (a tangent can vary over fewer
// axes than its primal, e.g. a zero instantiated from nothing).
Array conform(const Array& t, const Params& p) { return pvary_missing(t, collective_axes(p)); }

void def_linear_jvp(const PrimitiveDef& def, bool needs_varying) {
  define_rules(def.name).jvp = [&def, needs_varying](Args primals, Args tangents, const Params& p) {
    std::vector<Array> out = cjax::bind(def, primals, p);
    if (!tangents[0].defined()) return JvpOut{out, {Array()}};
    Array t = needs_varying ? conform(tangents[0], p) : tangents[0];
    return JvpOut{out, {bind1(def, {t}, p)}};
  };
}

// The batch dimension moved to 0 and every dimension parameter shifted past it.
BatchOut batch_each_example(const PrimitiveDef& def, Args args, std::span<const int> bdims, const BatchAxis& axis,
                            const Params& p, const std::vector<const char*>& dim_params) {
  if (bdims[0] == kNotMapped) return BatchOut{{bind1(def, args, p)}, {kNotMapped}};
  Array x = move_bdim(args[0], bdims[0], 0, axis.size);
  Params q = p;
  for (const char* k : dim_params) q.set(k, p.i(k) + 1);
  return BatchOut{{bind1(def, {x}, q)}, {0}};
}

// ---- collectives over the vmapped axis ----

bool over_batch(const BatchAxis& axis, const Params& p) {
  if (axis.name.empty()) return false;
  const auto& a = collective_axes(p);
  return std::find(a.begin(), a.end(), axis.name) != a.end();
}
std::vector<std::string> other_axes(const BatchAxis& axis, const Params& p) {
  std::vector<std::string> out;
  for (const std::string& a : collective_axes(p))
    if (a != axis.name) out.push_back(a);
  return out;
}
// The rules below that move data take the vmapped axis alone (the front end checks; JAX's
// batchers raise NotImplementedError for more).
void require_alone(const PrimitiveDef& def, const BatchAxis& axis, const Params& p) {
  if (collective_axes(p).size() != 1)
    throw ValueError(
        fmt::format("{} over {} names the vmapped axis '{}' together with other axes; over a vmap's "
                    "axis_name it supports one vmapped axis alone: apply it over each axis in turn",
                    def.name, AxisNames(collective_axes(p)).str(), axis.name));
}
// The collective's own checks (shapes, dimensions, sources) on one example's type.
void check_example(const PrimitiveDef& def, const Array& x, int bdim, const Params& p) {
  AbstractValue a = x.aval();
  if (bdim != kNotMapped) a.shape.erase(a.shape.begin() + bdim);
  std::vector<Array> in{make_abstract(a)};
  infer_avals(def, in, p);
}
Array scaled(const Array& x, int64_t n) { return lax::mul(x, make_scalar(double(n), x.dtype())); }
// Every example's value along dimension 0 (an unbatched one broadcast).
Array at_front(const Array& x, int bdim, int64_t size) { return move_bdim(x, bdim, 0, size); }
// Dimensions d and d+1 of `x` merged into one.
Array merge_dims(const Array& x, int64_t d) {
  Shape s = x.shape();
  s[size_t(d)] *= s[size_t(d) + 1];
  s.erase(s.begin() + d + 1);
  return lax::reshape(x, s);
}
// Dimension d of `x` split into (n, size / n).
Array split_dim(const Array& x, int64_t d, int64_t n) {
  Shape s = x.shape();
  s[size_t(d)] /= n;
  s.insert(s.begin() + d, n);
  return lax::reshape(x, s);
}

// psum / pmax / pmin: the batch dimension reduced (an unbatched operand is every member's value);
// the result is the same for every example. Other axes of the group are reduced after.
BatchOut reduction_batch(const PrimitiveDef& def, Args args, std::span<const int> bdims, const BatchAxis& axis,
                         const Params& p) {
  if (!over_batch(axis, p)) return batch_each_example(def, args, bdims, axis, p, {});
  check_example(def, args[0], bdims[0], p);
  const Array& x = args[0];
  int d = bdims[0];
  bool sum = &def == &g_psum || &def == &g_psum_invariant;
  bool is_bool = x.dtype() == DType::bool_;
  Array y;
  if (d == kNotMapped)
    y = sum ? scaled(x, axis.size) : x;
  else if (sum)
    y = lax::reduce_sum(x, {d});
  else if (&def == &g_pmax)
    y = is_bool ? lax::reduce_or(x, {d}) : lax::reduce_max(x, {d});
  else
    y = is_bool ? lax::reduce_and(x, {d}) : lax::reduce_min(x, {d});
  if (std::vector<std::string> rest = other_axes(axis, p); !rest.empty())
    y = bind1(def, {pvary_missing(y, rest)}, with(p, "axes", axes_param(rest)));
  return BatchOut{{y}, {kNotMapped}};
}

// pvary over the vmapped axis: the identity (no varying-axes types over a batch).
BatchOut pvary_batch(Args args, std::span<const int> bdims, const BatchAxis& axis, const Params& p) {
  if (!over_batch(axis, p)) return batch_each_example(g_pvary, args, bdims, axis, p, {});
  std::vector<std::string> rest = other_axes(axis, p);
  if (rest.empty()) return BatchOut{{args[0]}, {bdims[0]}};
  return BatchOut{{bind1(g_pvary, args, with(p, "axes", axes_param(rest)))}, {bdims[0]}};
}

// all_gather: the batch dimension moves to the gathered dimension (stacked) or is merged into it
// (tiled); every example gets the same result.
BatchOut all_gather_batch(const PrimitiveDef& def, Args args, std::span<const int> bdims, const BatchAxis& axis,
                          const Params& p) {
  if (!over_batch(axis, p)) return batch_each_example(def, args, bdims, axis, p, {"all_gather_dimension"});
  require_alone(def, axis, p);
  check_example(def, args[0], bdims[0], p);
  int64_t g = p.i("all_gather_dimension");
  Array y = move_bdim(args[0], bdims[0], int(g), axis.size);
  if (p.get<bool>("tiled")) y = merge_dims(y, g);
  return BatchOut{{y}, {kNotMapped}};
}

// psum_scatter: the batch summed, then member k's chunk of the scatter dimension is example k's
// result (the scatter dimension becomes the batch dimension).
BatchOut reduce_scatter_batch(Args args, std::span<const int> bdims, const BatchAxis& axis, const Params& p) {
  if (!over_batch(axis, p)) return batch_each_example(g_reduce_scatter, args, bdims, axis, p, {"scatter_dimension"});
  require_alone(g_reduce_scatter, axis, p);
  check_example(g_reduce_scatter, args[0], bdims[0], p);
  int d = bdims[0];
  int64_t s = p.i("scatter_dimension");
  Array y = d == kNotMapped ? scaled(args[0], axis.size) : lax::reduce_sum(args[0], {d});
  if (p.get<bool>("tiled")) y = split_dim(y, s, axis.size);
  return BatchOut{{y}, {int(s)}};
}

// ppermute: example k gets the example that sends to k, or zeros.
BatchOut ppermute_batch(Args args, std::span<const int> bdims, const BatchAxis& axis, const Params& p) {
  if (!over_batch(axis, p)) return batch_each_example(g_ppermute, args, bdims, axis, p, {});
  require_alone(g_ppermute, axis, p);
  check_example(g_ppermute, args[0], bdims[0], p);
  std::vector<int32_t> src(size_t(axis.size), -1);
  for (const auto& pr : p.get<std::vector<std::vector<int64_t>>>("perm")) src[size_t(pr[1])] = int32_t(pr[0]);
  bool full = std::find(src.begin(), src.end(), -1) == src.end();
  if (full && bdims[0] == kNotMapped) return BatchOut{{args[0]}, {kNotMapped}};  // every example the same
  Array x = at_front(args[0], bdims[0], axis.size);
  std::vector<int32_t> take_from(src);
  for (int32_t& k : take_from) k = std::max(k, 0);
  Array y = numpy::take(x, numpy::array<int32_t>(take_from, {axis.size}), 0);
  if (!full) {
    Array sends = lax::le(make_scalar(0.0, DType::int32), numpy::array<int32_t>(src, {axis.size}));
    Array mask = lax::broadcast_in_dim(sends, y.shape(), {0});
    y = lax::select(mask, y, lax::broadcast_in_dim(make_scalar(0.0, y.dtype()), y.shape(), {}));
  }
  return BatchOut{{y}, {0}};
}

// all_to_all: example k's result holds chunk k of every example's split dimension, placed along
// the concat dimension in example order — one transpose (and reshapes when tiled).
BatchOut all_to_all_batch(Args args, std::span<const int> bdims, const BatchAxis& axis, const Params& p) {
  if (!over_batch(axis, p))
    return batch_each_example(g_all_to_all, args, bdims, axis, p, {"split_axis", "concat_axis"});
  require_alone(g_all_to_all, axis, p);
  check_example(g_all_to_all, args[0], bdims[0], p);
  Array x = at_front(args[0], bdims[0], axis.size);  // [j] + S, j the sending example
  int64_t r = x.ndim() - 1, s = p.i("split_axis"), c = p.i("concat_axis"), n = axis.size;
  if (!p.get<bool>("tiled")) {
    // S[s] == n holds k, the receiving example: result[k] = S without s, with j inserted at c.
    std::vector<int64_t> perm{1 + s}, rest;
    for (int64_t t = 0; t < r; ++t)
      if (t != s) rest.push_back(1 + t);
    for (int64_t u = 0, next = 0; u < r; ++u) perm.push_back(u == c ? 0 : rest[size_t(next++)]);
    return BatchOut{{lax::transpose(x, perm)}, {0}};
  }
  // S[s] = n * m splits into (k, m); the result's dimension c is (j, T[c]) merged, j major.
  Array x2 = split_dim(x, 1 + s, n);  // [j] + S[:s] + [k, m] + S[s+1:]
  auto dim_of = [&](int64_t t) { return t < s ? 1 + t : (t == s ? 2 + s : 2 + t); };
  std::vector<int64_t> perm{1 + s};
  for (int64_t t = 0; t < r; ++t) {
    if (t == c) perm.push_back(0);
    perm.push_back(dim_of(t));
  }
  return BatchOut{{merge_dims(lax::transpose(x2, perm), 1 + c)}, {0}};
}

// pbroadcast: every example gets example `source`.
BatchOut pbroadcast_batch(Args args, std::span<const int> bdims, const BatchAxis& axis, const Params& p) {
  if (!over_batch(axis, p)) return batch_each_example(g_pbroadcast, args, bdims, axis, p, {});
  require_alone(g_pbroadcast, axis, p);
  check_example(g_pbroadcast, args[0], bdims[0], p);
  if (bdims[0] == kNotMapped) return BatchOut{{args[0]}, {kNotMapped}};
  int d = bdims[0];
  int64_t src = p.i("source");
  return BatchOut{{lax::squeeze(lax::slice_in_dim(args[0], src, src + 1, 1, d), {d})}, {kNotMapped}};
}

// axis_index: the example's index along the vmapped axis (row-major with the other axes).
BatchOut axis_index_batch(const BatchAxis& axis, const Params& p) {
  if (!over_batch(axis, p)) return BatchOut{{bind1(g_axis_index, std::span<const Array>(), p)}, {kNotMapped}};
  Array idx;
  for (const std::string& a : collective_axes(p)) {
    Array k = a == axis.name ? lax::iota(DType::int32, axis.size)
                             : bind1(g_axis_index, std::span<const Array>(), with(p, "axes", axes_param({a})));
    int64_t n = a == axis.name ? axis.size : bound_group_size({a}, "axis_index");
    idx = idx.defined() ? numpy::add(scaled(idx, n), k) : k;
  }
  return BatchOut{{idx}, {0}};
}

std::vector<Array> one(Array a) { return {std::move(a)}; }

const bool g_rules = add_rule_initializer([] {
  for (const PrimitiveDef* d : {&g_psum_invariant, &g_psum, &g_pvary}) def_linear_jvp(*d, d == &g_psum_invariant);
  for (const PrimitiveDef* d :
       {&g_all_gather, &g_all_gather_invariant, &g_reduce_scatter, &g_ppermute, &g_all_to_all, &g_pbroadcast})
    def_linear_jvp(*d, true);
  for (const PrimitiveDef* d : {&g_pmax, &g_pmin})
    define_rules(d->name).jvp = [d](Args, Args, const Params&) -> JvpOut {
      throw Error(
          fmt::format("Differentiation rule for '{}' not implemented: {} has no derivative in JAX either; "
                      "use lax::stop_gradient on its input or compute the max with psum-based ops",
                      d->name, d->name));
    };
  define_rules("axis_index").jvp = [](Args, Args, const Params& p) {
    return JvpOut{{bind1(g_axis_index, std::span<const Array>(), p)}, {Array()}};
  };

  // Transposes (cts[0] undefined: a symbolic zero cotangent stays zero).
  using TrFn = std::function<Array(const Array& ct, const Array& x, const Params&)>;
  auto tr = [](const PrimitiveDef& def, TrFn f) {
    define_rules(def.name).transpose = [f](Args cts, Args args, const Params& p) -> std::vector<Array> {
      if (!cts[0].defined()) return {Array()};
      return one(f(cts[0], args[0], p));
    };
  };
  tr(g_psum_invariant, [](const Array& ct, const Array&, const Params& p) {
    return bind1(g_pvary, {ct}, pvary_params(collective_axes(p)));
  });
  tr(g_pvary, [](const Array& ct, const Array&, const Params& p) { return bind1(g_psum_invariant, {ct}, p); });
  tr(g_psum, [](const Array& ct, const Array&, const Params& p) { return bind1(g_psum, {ct}, p); });
  tr(g_all_gather, [](const Array& ct, const Array&, const Params& p) {
    return bind1(g_reduce_scatter, {ct},
                 {{"axes", axes_param(collective_axes(p))},
                  {"axis_size", p.i("axis_size")},
                  {"scatter_dimension", p.i("all_gather_dimension")},
                  {"tiled", p.get<bool>("tiled")}});
  });
  tr(g_reduce_scatter, [](const Array& ct, const Array&, const Params& p) {
    return bind1(g_all_gather, {conform(ct, p)},
                 {{"axes", axes_param(collective_axes(p))},
                  {"all_gather_dimension", p.i("scatter_dimension")},
                  {"axis_size", p.i("axis_size")},
                  {"tiled", p.get<bool>("tiled")}});
  });
  tr(g_all_gather_invariant, [](const Array& ct, const Array& x, const Params& p) {
    int64_t a = p.i("all_gather_dimension");
    bool tiled = p.get<bool>("tiled");
    int64_t chunk = tiled ? x.aval().shape[size_t(a)] : 1;
    Array idx = bind1(g_axis_index, std::span<const Array>(), {{"axes", axes_param(collective_axes(p))}});
    Array start = lax::mul(idx, make_scalar(double(chunk), DType::int32));
    Array piece = lax::dynamic_slice_in_dim(ct, start, chunk, a);
    return tiled ? piece : lax::squeeze(piece, {a});
  });
  tr(g_ppermute, [](const Array& ct, const Array&, const Params& p) {
    std::vector<std::vector<int64_t>> inverse;
    for (const auto& pr : p.get<std::vector<std::vector<int64_t>>>("perm")) inverse.push_back({pr[1], pr[0]});
    return bind1(g_ppermute, {ct}, with(p, "perm", inverse));
  });
  tr(g_all_to_all, [](const Array& ct, const Array&, const Params& p) {
    Params q = with(p, "split_axis", p.i("concat_axis"));
    q.set("concat_axis", p.i("split_axis"));
    return bind1(g_all_to_all, {ct}, q);
  });
  tr(g_pbroadcast, [](const Array& ct, const Array& x, const Params& p) {
    AxisNames axes(collective_axes(p));
    Array summed = lax::psum(ct, axes);
    Array at_source = lax::eq(lax::axis_index(axes), make_scalar(double(p.i("source")), DType::int32));
    Array zero = lax::broadcast_in_dim(make_scalar(0.0, ct.dtype()), ct.shape(), {});
    Array r = numpy::where(at_source, summed, zero);
    return pvary_missing(r, x.aval().vma);
  });

  // Batching.
  for (const PrimitiveDef* d : {&g_psum_invariant, &g_psum, &g_pmax, &g_pmin})
    define_rules(d->name).batch = [d](Args args, std::span<const int> bdims, const BatchAxis& axis, const Params& p) {
      return reduction_batch(*d, args, bdims, axis, p);
    };
  define_rules("pvary").batch = pvary_batch;
  for (const PrimitiveDef* d : {&g_all_gather, &g_all_gather_invariant})
    define_rules(d->name).batch = [d](Args args, std::span<const int> bdims, const BatchAxis& axis, const Params& p) {
      return all_gather_batch(*d, args, bdims, axis, p);
    };
  define_rules("reduce_scatter").batch = reduce_scatter_batch;
  define_rules("ppermute").batch = ppermute_batch;
  define_rules("all_to_all").batch = all_to_all_batch;
  define_rules("pbroadcast").batch = pbroadcast_batch;
  define_rules("axis_index").batch = [](Args, std::span<const int>, const BatchAxis& axis, const Params& p) {
    return axis_index_batch(axis, p);
  };
});

}  // namespace
}  // namespace cjax
