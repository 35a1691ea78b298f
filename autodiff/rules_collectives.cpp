// JVP, transpose and batching rules of the collectives (core/collectives.cpp), spec/shard_map.md
// §3.3. Every collective but pmax/pmin/axis_index is linear, so its JVP applies it to the tangent;
// the transposes follow the varying-axes types: psum_invariant <-> pvary, all_gather <->
// reduce_scatter, ppermute -> the inverse permutation, all_to_all -> split and concat swapped,
// all_gather_invariant -> a local slice, pbroadcast -> psum kept at the source. Batching: a
// collective acts on each example alike, so the batch dimension leads and dimension parameters
// shift past it.
#include <fmt/format.h>

#include "cjax/collectives.h"
#include "cjax/lax.h"
#include "cjax/numpy.h"
#include "core/array_impl.h"
#include "core/collectives.h"
#include "core/rules.h"
#include "core/spmd.h"

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
void def_batch(const PrimitiveDef& def, std::vector<const char*> dim_params) {
  define_rules(def.name).batch = [&def, dim_params](Args args, std::span<const int> bdims, const BatchAxis& axis,
                                                   const Params& p) {
    if (bdims[0] == kNotMapped) return BatchOut{{bind1(def, args, p)}, {kNotMapped}};
    Array x = move_bdim(args[0], bdims[0], 0, axis.size);
    Params q = p;
    for (const char* k : dim_params) q.set(k, p.i(k) + 1);
    return BatchOut{{bind1(def, {x}, q)}, {0}};
  };
}

std::vector<Array> one(Array a) { return {std::move(a)}; }

const bool g_rules = add_rule_initializer([] {
  for (const PrimitiveDef* d : {&g_psum_invariant, &g_psum, &g_pvary})
    def_linear_jvp(*d, d == &g_psum_invariant);
  for (const PrimitiveDef* d :
       {&g_all_gather, &g_all_gather_invariant, &g_reduce_scatter, &g_ppermute, &g_all_to_all, &g_pbroadcast})
    def_linear_jvp(*d, true);
  for (const PrimitiveDef* d : {&g_pmax, &g_pmin})
    define_rules(d->name).jvp = [d](Args, Args, const Params&) -> JvpOut {
      throw Error(fmt::format("Differentiation rule for '{}' not implemented: {} has no derivative in JAX either; "
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
  for (const PrimitiveDef* d : {&g_psum_invariant, &g_psum, &g_pmax, &g_pmin, &g_pvary, &g_ppermute, &g_pbroadcast})
    def_batch(*d, {});
  def_batch(g_all_gather, {"all_gather_dimension"});
  def_batch(g_all_gather_invariant, {"all_gather_dimension"});
  def_batch(g_reduce_scatter, {"scatter_dimension"});
  def_batch(g_all_to_all, {"split_axis", "concat_axis"});
  define_rules("axis_index").batch = [](Args, std::span<const int>, const BatchAxis&, const Params& p) {
    return BatchOut{{bind1(g_axis_index, std::span<const Array>(), p)}, {kNotMapped}};
  };
});

}  // namespace
}  // namespace cjax
