// JVP, transpose and batching rules of the reduction, cumulative and sort primitives
// (core/lax/reduce.cpp, core/lax/sort.cpp), after jax/_src/lax/lax.py and lax/control_flow/loops.py:
//  * reduce_sum and cumsum are linear (transposes: broadcast_in_dim, reversed cumsum);
//  * reduce_max/min take the tangent at the chosen locations, ties sharing it equally;
//  * reduce_prod differentiates a pairwise multiplication tree (JAX's _reduce_jvp), exact with
//    zeros in the input; cumprod/cummax/cummin/cumlogsumexp differentiate JAX's associative
//    scan, so they are exact with zeros (cumprod) and, like JAX, split ties between the two
//    operands of each max/min combine;
//  * sort and top_k gather the tangents at the positions their outputs came from;
//  * argmax/argmin/reduce_and/reduce_or have zero derivative.
// The primal outputs of reduce_prod and the scanned cumulative ops come from the tree/scan (as
// in JAX), so under jvp/grad they can differ from the eager kernels in the last bits.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <limits>
#include <numeric>

#include "autodiff/rule_helpers.h"
#include "core/lax/reduce.h"
#include "core/lax/rule_support.h"

namespace cjax {
namespace {

using Ints = std::vector<int64_t>;
using Args = std::span<const Array>;
using Bdims = std::span<const int>;

bool contains(const Ints& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }
// The dimensions of a rank-`rank` array that are not in `axes`.
Ints kept_dims(int64_t rank, const Ints& axes) {
  Ints kept;
  for (int64_t d = 0; d < rank; ++d)
    if (!contains(axes, d)) kept.push_back(d);
  return kept;
}
Array const_of(DType dtype, double v) { return make_scalar(v, dtype, false); }
// `shape` filled with v (strongly typed; a rank-0 constant for an empty shape).
Array full_of(const Shape& shape, DType dtype, double v) {
  Array s = const_of(dtype, v);
  return shape.empty() ? s : lax::broadcast_in_dim(s, shape, {});
}
Array full_like(const Array& x, double v) { return full_of(x.shape(), x.dtype(), v); }

// ---- (primal, tangent) pairs: the forward-mode arithmetic of the tree and scan JVPs ----
// The tangent is always defined: these run only when the operand has a tangent.
struct Dual {
  Array p, t;
};
using Combine = std::function<Dual(const Dual&, const Dual&)>;

Dual slice_dual(const Dual& x, int64_t start, int64_t limit, int64_t stride, int64_t axis) {
  return {lax::slice_in_dim(x.p, start, limit, stride, axis), lax::slice_in_dim(x.t, start, limit, stride, axis)};
}
Dual rev_dual(const Dual& x, int64_t axis) { return {lax::rev(x.p, {axis}), lax::rev(x.t, {axis})}; }

// JAX's mul JVP: mul(ta, b) + mul(a, tb).
Dual mul_dual(const Dual& a, const Dual& b) {
  return {lax::mul(a.p, b.p), add_tangents(lax::mul(a.t, b.p), lax::mul(a.p, b.t))};
}

// JAX's _balanced_eq: 1 where x == z, halved where y == z too, so ties split the tangent.
Array balanced_eq(const Array& x, const Array& z, const Array& y) {
  return lax::div(lax::select(lax::eq(x, z), full_like(z, 1), full_like(z, 0)),
                  lax::select(lax::eq(y, z), full_like(z, 2), full_like(z, 1)));
}
// JAX's max/min JVP (defjvp2 with _balanced_eq).
Combine chooser_dual(bool is_max) {
  return [is_max](const Dual& a, const Dual& b) {
    Array out = is_max ? lax::max(a.p, b.p) : lax::min(a.p, b.p);
    Array t = add_tangents(lax::mul(a.t, balanced_eq(a.p, out, b.p)), lax::mul(b.t, balanced_eq(b.p, out, a.p)));
    return Dual{out, t};
  };
}

// JAX's logaddexp with its custom JVP: t1 exp(x1 - out) + t2 exp(x2 - out), +inf replaced by 0.
// The larger operand is picked with select(x1 >= x2) rather than max so that differentiating the
// primal again (second order) is exact at ties: abs's JVP picks the same branch at 0.
Dual logaddexp_dual(const Dual& a, const Dual& b) {
  const Array &x1 = a.p, &x2 = b.p;
  Array amax = lax::select(lax::ge(x1, x2), x1, x2);
  Array delta = lax::sub(x1, x2);
  Array out = lax::select(lax::ne(delta, delta), lax::add(x1, x2),
                          lax::add(amax, lax::log1p(lax::exp(lax::neg(lax::abs(delta))))));
  auto replace_inf = [](const Array& x) {
    return lax::select(lax::eq(x, const_of(x.dtype(), std::numeric_limits<double>::infinity())), full_like(x, 0), x);
  };
  Array out_r = replace_inf(out);
  Array t = add_tangents(lax::mul(a.t, lax::exp(lax::sub(replace_inf(x1), out_r))),
                         lax::mul(b.t, lax::exp(lax::sub(replace_inf(x2), out_r))));
  return {out, t};
}

// JAX's _interleave: a[0], b[0], a[1], b[1], ... along `axis` (a has as many elements as b or one more).
Array interleave(const Array& a, const Array& b, int64_t axis) {
  int64_t na = a.shape()[size_t(axis)], nb = b.shape()[size_t(axis)];
  std::vector<lax::PadConfig> pa(size_t(a.ndim())), pb(size_t(b.ndim()));
  pa[size_t(axis)] = {0, na == nb ? 1 : 0, 1};
  pb[size_t(axis)] = {1, na == nb ? 0 : 1, 1};
  return lax::add(lax::pad(a, const_of(a.dtype(), 0), pa), lax::pad(b, const_of(b.dtype(), 0), pb));
}
Dual interleave_dual(const Dual& a, const Dual& b, int64_t axis) {
  return {interleave(a.p, b.p, axis), interleave(a.t, b.t, axis)};
}

// JAX's associative_scan (the parallel prefix scan of lax/control_flow/loops.py) on pairs.
Dual associative_scan(const Combine& combine, const Dual& elems, int64_t axis) {
  int64_t n = elems.p.shape()[size_t(axis)];
  if (n < 2) return elems;
  Dual reduced = combine(slice_dual(elems, 0, n - 1, 2, axis), slice_dual(elems, 1, n, 2, axis));
  Dual odd = associative_scan(combine, reduced, axis);
  int64_t n_odd = odd.p.shape()[size_t(axis)];
  Dual even = n % 2 == 0 ? combine(slice_dual(odd, 0, n_odd - 1, 1, axis), slice_dual(elems, 2, n, 2, axis))
                         : combine(odd, slice_dual(elems, 2, n, 2, axis));
  Dual first = slice_dual(elems, 0, 1, 1, axis);
  even = {lax::concatenate({first.p, even.p}, axis), lax::concatenate({first.t, even.t}, axis)};
  return interleave_dual(even, odd, axis);
}

// ---- reductions ----

// Linear primitives whose tangent is the primitive applied to the tangent (JAX's deflinear2).
void def_unary_linear_jvp(const PrimitiveDef& def) {
  define_rules(def.name).jvp = [&def](Args p, Args t, const Params& params) {
    Array out = bind1(def, p, params);
    return JvpOut{{out}, {t[0].defined() ? bind1(def, t, params) : Array()}};
  };
}

// Primitives with zero derivative (integer or bool outputs, or piecewise-constant ones).
void def_zero_jvp(const PrimitiveDef& def) {
  define_rules(def.name).jvp = [&def](Args p, Args, const Params& params) {
    std::vector<Array> outs = cjax::bind(def, p, params);
    return JvpOut{outs, std::vector<Array>(outs.size())};
  };
}

std::vector<Array> reduce_sum_transpose(Args cts, Args args, const Params& params) {
  const Shape& in_shape = args[0].shape();
  return {lax::broadcast_in_dim(cts[0], in_shape, kept_dims(int64_t(in_shape.size()), params.ints("axes")))};
}

// JAX's _reduce_chooser_jvp_rule: the mean of the tangent over the locations equal to the result.
// (JAX reshapes the result to keep the reduced dims as 1 and relies on lax's size-1 broadcasting;
// cjax's lax needs equal shapes, so the result is broadcast_in_dim'ed to the operand's shape.)
void def_chooser_jvp(const PrimitiveDef& def) {
  define_rules(def.name).jvp = [&def](Args p, Args t, const Params& params) {
    Array ans = bind1(def, p, params);
    if (!t[0].defined()) return JvpOut{{ans}, {Array()}};
    const Array& x = p[0];
    const Ints& axes = params.ints("axes");
    Array at_ans = lax::broadcast_in_dim(ans, x.shape(), kept_dims(x.ndim(), axes));
    Array location = lax::convert_element_type(lax::eq(x, at_ans), t[0].dtype());
    Array counts = lax::reduce_sum(location, axes);
    return JvpOut{{ans}, {lax::div(lax::reduce_sum(lax::mul(t[0], location), axes), counts)}};
  };
}

// JAX's _reduce_prod_jvp_rule (_reduce_jvp): the reduced axes moved to the front and flattened,
// then halves multiplied pairwise until one row is left; odd halves are padded with 1 (tangent 0).
JvpOut reduce_prod_jvp(Args p, Args t, const Params& params) {
  if (!t[0].defined()) return JvpOut{{bind1(prims::reduce_prod(), p, params)}, {Array()}};
  const Array& x = p[0];
  const Ints& axes = params.ints("axes");
  Ints non_axes = kept_dims(x.ndim(), axes);
  Ints perm = axes;
  perm.insert(perm.end(), non_axes.begin(), non_axes.end());
  int64_t n = 1;
  for (int64_t a : axes) n *= x.shape()[size_t(a)];
  Shape out_shape;
  for (int64_t d : non_axes) out_shape.push_back(x.shape()[size_t(d)]);
  if (n == 0) return JvpOut{{full_of(out_shape, x.dtype(), 1)}, {Array()}};
  Shape flat = out_shape;
  flat.insert(flat.begin(), n);
  auto to_rows = [&](const Array& v) { return lax::reshape(lax::transpose(v, perm), flat); };
  Dual xs{to_rows(x), to_rows(t[0])};
  while (xs.p.shape()[0] > 1) {
    int64_t m = xs.p.shape()[0], n1 = (m + 1) / 2;
    Dual lo = slice_dual(xs, 0, n1, 1, 0), hi = slice_dual(xs, n1, m, 1, 0);
    if (m - n1 != n1) {
      std::vector<lax::PadConfig> cfg(size_t(hi.p.ndim()));
      cfg[0] = {0, 1, 0};
      hi = {lax::pad(hi.p, const_of(x.dtype(), 1), cfg), lax::pad(hi.t, const_of(x.dtype(), 0), cfg)};
    }
    xs = mul_dual(lo, hi);
  }
  return JvpOut{{lax::squeeze(xs.p, {0})}, {lax::squeeze(xs.t, {0})}};
}

// JAX's batching.defreducer: reduced axes shift past the batch dimension, which then moves
// left by the number of reduced axes before it.
BatchOut reduce_batch(const PrimitiveDef& def, Args a, Bdims d, const Params& params) {
  int bdim = d[0];
  Ints axes;
  int out_bdim = bdim;
  for (int64_t ax : params.ints("axes")) {
    axes.push_back(ax >= bdim ? ax + 1 : ax);
    if (ax < bdim) --out_bdim;
  }
  Params batched = params;
  batched.set("axes", axes);
  return {{bind1(def, a, batched)}, {out_bdim}};
}

// ---- cumulative ops ----

// JAX's _cumulative_jvp_rule: the JVP of associative_scan(combine) along the axis.
void def_scan_jvp(const PrimitiveDef& def, Combine combine) {
  define_rules(def.name).jvp = [&def, combine = std::move(combine)](Args p, Args t, const Params& params) {
    if (!t[0].defined()) return JvpOut{{bind1(def, p, params)}, {Array()}};
    int64_t axis = params.i("axis");
    bool reverse = params.get<bool>("reverse");
    Dual x{p[0], t[0]};
    if (reverse) x = rev_dual(x, axis);
    Dual y = associative_scan(combine, x, axis);
    if (reverse) y = rev_dual(y, axis);
    return JvpOut{{y.p}, {y.t}};
  };
}

BatchOut cumulative_batch(const PrimitiveDef& def, Args a, Bdims d, const Params& params) {
  int64_t axis = params.i("axis");
  Params batched = params;
  batched.set("axis", axis >= d[0] ? axis + 1 : axis);
  return {{bind1(def, a, batched)}, {d[0]}};
}

// ---- sort and top_k ----

// Gathers `t` along `dim` at `idx` (idx of the output's shape plus a trailing 1), every other
// dimension being a batch dimension of the gather (JAX's gather in _sort_jvp / _top_k_jvp).
Array take_along(const Array& t, const Array& idx, int64_t dim, lax::GatherScatterMode mode) {
  Ints batch = kept_dims(t.ndim(), {dim});
  lax::GatherDimensionNumbers dn;
  dn.collapsed_slice_dims = {dim};
  dn.start_index_map = {dim};
  dn.operand_batching_dims = batch;
  dn.start_indices_batching_dims = batch;
  return lax::gather(t, idx, dn, Ints(size_t(t.ndim()), 1), mode);
}

// JAX's _sort_jvp: an iota sorted alongside the operands tells where each output came from.
JvpOut sort_jvp(Args p, Args t, const Params& params) {
  const Shape& shape = p[0].shape();
  int64_t dim = params.i("dimension");
  std::vector<Array> operands(p.begin(), p.end());
  operands.push_back(lax::broadcasted_iota(DType::uint32, shape, dim));
  std::vector<Array> sorted = cjax::bind(prims::sort(), operands, params);
  Array idx = lax::expand_dims(sorted.back(), {int64_t(shape.size())});
  sorted.pop_back();
  std::vector<Array> tangents;
  for (const Array& ti : t)
    tangents.push_back(ti.defined() ? take_along(ti, idx, dim, lax::GatherScatterMode::promise_in_bounds) : Array());
  return JvpOut{std::move(sorted), std::move(tangents)};
}

// JAX's _sort_batch_rule: unbatched operands are broadcast to the first batched one's shape.
BatchOut sort_batch(Args a, Bdims d, const BatchAxis&, const Params& params) {
  size_t proto = 0;
  while (d[proto] == kNotMapped) ++proto;
  int new_bdim = d[proto];
  const Shape& shape = a[proto].shape();
  std::vector<Array> args;
  for (size_t i = 0; i < a.size(); ++i) {
    if (d[i] == kNotMapped)
      args.push_back(lax::broadcast_in_dim(a[i], shape, kept_dims(int64_t(shape.size()), {new_bdim})));
    else
      args.push_back(move_bdim(a[i], d[i], new_bdim, 0));
  }
  int64_t dim = params.i("dimension");
  Params batched = params;
  batched.set("dimension", dim + (new_bdim <= dim ? 1 : 0));
  std::vector<Array> outs = cjax::bind(prims::sort(), args, batched);
  return {outs, std::vector<int>(outs.size(), new_bdim)};
}

// JAX's _top_k_jvp: the tangent gathered at the returned indices.
JvpOut top_k_jvp(Args p, Args t, const Params& params) {
  std::vector<Array> outs = cjax::bind(prims::top_k(), p, params);
  if (!t[0].defined()) return JvpOut{outs, {Array(), Array()}};
  const Array& k_idxs = outs[1];
  Shape idx_shape = k_idxs.shape();
  idx_shape.push_back(1);
  Array tangent =
      take_along(t[0], lax::reshape(k_idxs, idx_shape), k_idxs.ndim() - 1, lax::GatherScatterMode::fill_or_drop);
  return JvpOut{outs, {tangent, Array()}};
}

// top_k works on the last axis: a batch dimension there moves to the front.
BatchOut top_k_batch(Args a, Bdims d, const BatchAxis& axis, const Params& params) {
  int bdim = d[0] == a[0].ndim() - 1 ? 0 : d[0];
  Array x = move_bdim(a[0], d[0], bdim, axis.size);
  return {cjax::bind(prims::top_k(), {x}, params), {bdim, bdim}};
}

const bool registered = add_rule_initializer([] {
  auto batch_with = [](BatchOut (*rule)(const PrimitiveDef&, Args, Bdims, const Params&), const PrimitiveDef& def) {
    define_rules(def.name).batch = [rule, &def](Args a, Bdims d, const BatchAxis&, const Params& params) {
      return rule(def, a, d, params);
    };
  };

  def_unary_linear_jvp(prims::reduce_sum());
  define_rules("reduce_sum").transpose = reduce_sum_transpose;
  def_chooser_jvp(prims::reduce_max());
  def_chooser_jvp(prims::reduce_min());
  define_rules("reduce_prod").jvp = reduce_prod_jvp;
  for (const PrimitiveDef* def : {&prims::argmax(), &prims::argmin(), &prims::reduce_and(), &prims::reduce_or()})
    def_zero_jvp(*def);
  for (const PrimitiveDef* def :
       {&prims::reduce_sum(), &prims::reduce_max(), &prims::reduce_min(), &prims::reduce_prod(), &prims::reduce_and(),
        &prims::reduce_or(), &prims::argmax(), &prims::argmin()})
    batch_with(reduce_batch, *def);

  def_unary_linear_jvp(prims::cumsum());
  define_rules("cumsum").transpose = [](Args cts, Args, const Params& params) {
    return std::vector<Array>{lax::cumsum(cts[0], params.i("axis"), !params.get<bool>("reverse"))};
  };
  def_scan_jvp(prims::cumprod(), mul_dual);
  def_scan_jvp(prims::cummax(), chooser_dual(true));
  def_scan_jvp(prims::cummin(), chooser_dual(false));
  def_scan_jvp(prims::cumlogsumexp(), logaddexp_dual);
  for (const PrimitiveDef* def :
       {&prims::cumsum(), &prims::cumprod(), &prims::cummax(), &prims::cummin(), &prims::cumlogsumexp()})
    batch_with(cumulative_batch, *def);

  define_rules("sort").jvp = sort_jvp;
  define_rules("sort").batch = sort_batch;
  define_rules("top_k").jvp = top_k_jvp;
  define_rules("top_k").batch = top_k_batch;
});

}  // namespace
}  // namespace cjax
