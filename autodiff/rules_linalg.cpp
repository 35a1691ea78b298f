// JVP, transpose and batching rules of dot_general and conv_general_dilated (core/lax/linalg.cpp,
// core/lax/conv.cpp), ported from JAX's lax.py (_dot_general_transpose_lhs/_rhs,
// _dot_general_batch_dim_nums) and convolution.py (_conv_general_dilated_transpose_lhs/_rhs,
// _conv_general_dilated_batch_rule). Both primitives are bilinear: the JVP binds the primitive
// once per defined tangent, and each operand's transpose is the primitive applied to the
// cotangent and the other operand.
//
// One deviation: our conv_general_dilated has no batch_group_count (it must be 1), which JAX's
// rhs transpose of a grouped convolution uses. We fold the groups into the transposed lhs's
// feature dimension instead and use feature_group_count, which computes the same sums.
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "autodiff/rule_helpers.h"
#include "core/array/array_impl.h"
#include "core/lax/linalg.h"
#include "core/lax/rule_support.h"

namespace cjax {
namespace {

using Dims = std::vector<int64_t>;

Dims argsort(const Dims& v) {
  Dims idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int64_t a, int64_t b) { return v[size_t(a)] < v[size_t(b)]; });
  return idx;
}
Dims take(const Dims& v, const Dims& idx) {
  Dims out;
  for (int64_t i : idx) out.push_back(v[size_t(i)]);
  return out;
}
bool contains(const Dims& v, int64_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }
// range(n) without the entries of `a` and `b` (JAX's `remaining`).
Dims remaining(int64_t n, const Dims& a, const Dims& b) {
  Dims out;
  for (int64_t d = 0; d < n; ++d)
    if (!contains(a, d) && !contains(b, d)) out.push_back(d);
  return out;
}
Dims range(int64_t start, int64_t count) {
  Dims out(static_cast<size_t>(count));
  std::iota(out.begin(), out.end(), start);
  return out;
}

// lax.transpose: an identity permutation of a concrete array is skipped, while a traced one is
// still bound, as JAX does (so staged jaxprs print `transpose[permutation=(0, 1)]` like JAX's).
Array transpose_like_jax(const Array& x, const Dims& perm) {
  if (concrete(x)) return lax::transpose(x, perm);
  return bind1(*find_primitive("transpose"), {x}, Params{{"permutation", perm}});
}

Array convert_if(const Array& x, DType dtype) { return x.dtype() == dtype ? x : lax::convert_element_type(x, dtype); }

// ---------------------------------------------------------------- dot_general

struct DotDims {
  Dims lc, rc, lb, rb;
};
DotDims dot_dims(const Params& p) {
  auto dn = p.object<DotDimsParam>("dimension_numbers");
  return {dn->lhs_contracting, dn->rhs_contracting, dn->lhs_batch, dn->rhs_batch};
}
Array bind_dot(const Array& lhs, const Array& rhs, const DotDims& d, Params params) {
  auto dn = std::make_shared<DotDimsParam>();
  dn->lhs_contracting = d.lc;
  dn->rhs_contracting = d.rc;
  dn->lhs_batch = d.lb;
  dn->rhs_batch = d.rb;
  params.set("dimension_numbers", std::shared_ptr<const ParamObject>(std::move(dn)));
  return bind1(prims::dot_general(), {lhs, rhs}, params);
}

// The cotangent of x in dot_general(x, y) (or of y in dot_general(y, x) with swap_ans).
Array dot_transpose_lhs(const Array& g, const AbstractValue& x_aval, const Array& y, const DotDims& d,
                        const Params& params, bool swap_ans) {
  const Dims &xc = d.lc, &yc = d.rc, &xb = d.lb, &yb = d.rb;
  Dims x_kept = remaining(int64_t(x_aval.shape.size()), xc, xb);
  Dims y_kept = remaining(y.ndim(), yc, yb);
  int64_t nb = int64_t(xb.size());
  Dims ans_batch = range(0, nb);
  int64_t ans_y_start = swap_ans ? nb : nb + int64_t(x_kept.size());
  Dims ans_y = range(ans_y_start, int64_t(y_kept.size()));
  Dims unsorted = xb;
  unsorted.insert(unsorted.end(), x_kept.begin(), x_kept.end());
  Dims xc_by_y = take(xc, argsort(yc));
  unsorted.insert(unsorted.end(), xc_by_y.begin(), xc_by_y.end());
  // Our dot_general needs equal operand dtypes; a cotangent in preferred_element_type (wider
  // than the inputs) meets the other operand converted up to it.
  Array out = bind_dot(g, convert_if(y, g.dtype()), {ans_y, y_kept, ans_batch, yb}, params);
  return convert_if(transpose_like_jax(out, argsort(unsorted)), x_aval.dtype);
}

JvpOut dot_general_jvp(std::span<const Array> p, std::span<const Array> t, const Params& params) {
  Array out = bind1(prims::dot_general(), p, params);
  Array a = t[0].defined() ? bind1(prims::dot_general(), {t[0], p[1]}, params) : Array();
  Array b = t[1].defined() ? bind1(prims::dot_general(), {p[0], t[1]}, params) : Array();
  return JvpOut{{out}, {add_tangents(a, b)}};
}

std::vector<Array> dot_general_transpose(std::span<const Array> cts, std::span<const Array> args,
                                         const Params& params) {
  DotDims d = dot_dims(params);
  std::vector<Array> r(2);
  if (is_undefined_primal(args[0])) r[0] = dot_transpose_lhs(cts[0], args[0].aval(), args[1], d, params, false);
  if (is_undefined_primal(args[1]))
    r[1] = dot_transpose_lhs(cts[0], args[1].aval(), args[0], {d.rc, d.lc, d.rb, d.lb}, params, true);
  return r;
}

// The mapped dimension becomes a dot_general batch dimension (both mapped) or a free dimension
// (one mapped), whose position in the output is reported rather than moved.
BatchOut dot_general_batch(std::span<const Array> a, std::span<const int> bd, const BatchAxis&, const Params& params) {
  DotDims d = dot_dims(params);
  int lbd = bd[0], rbd = bd[1];
  if (lbd == kNotMapped && rbd == kNotMapped) return {{bind1(prims::dot_general(), a, params)}, {kNotMapped}};
  auto bump = [](const Dims& dims, int64_t b) {
    Dims out;
    for (int64_t x : dims) out.push_back(x + (x >= b ? 1 : 0));
    return out;
  };
  auto count_below = [](const Dims& dims, int64_t b) {
    return int(std::count_if(dims.begin(), dims.end(), [b](int64_t x) { return x < b; }));
  };
  int out_bdim = 0;
  DotDims n = d;
  if (lbd != kNotMapped && rbd != kNotMapped) {
    n.lb = bump(d.lb, lbd);
    n.lb.insert(n.lb.begin(), lbd);
    n.rb = bump(d.rb, rbd);
    n.rb.insert(n.rb.begin(), rbd);
    n.lc = bump(d.lc, lbd);
    n.rc = bump(d.rc, rbd);
  } else if (lbd != kNotMapped) {
    out_bdim = int(d.lb.size()) + count_below(remaining(a[0].ndim(), d.lb, d.lc), lbd);
    n.lb = bump(d.lb, lbd);
    n.lc = bump(d.lc, lbd);
  } else {
    out_bdim = a[0].ndim() - int(d.lc.size()) + count_below(remaining(a[1].ndim(), d.rb, d.rc), rbd);
    n.rb = bump(d.rb, rbd);
    n.rc = bump(d.rc, rbd);
  }
  return {{bind_dot(a[0], a[1], n, params)}, {out_bdim}};
}

// ---------------------------------------------------------------- conv_general_dilated

using Pads = std::vector<std::vector<int64_t>>;

struct ConvSpecs {
  Dims lhs, rhs, out;
};
ConvSpecs conv_specs(const Params& p) {
  auto dn = p.object<ConvDimsParam>("dimension_numbers");
  return {dn->lhs_spec, dn->rhs_spec, dn->out_spec};
}
Dims spatial(const Dims& spec) { return Dims(spec.begin() + 2, spec.end()); }
Dims swap_first_two(Dims spec) {
  std::swap(spec[0], spec[1]);
  return spec;
}
Dims take_shape(const Shape& s, const Dims& idx) {
  Dims out;
  for (int64_t i : idx) out.push_back(s[size_t(i)]);
  return out;
}
int64_t dilate_dim(int64_t d, int64_t dilation) { return d == 0 ? 0 : 1 + dilation * (d - 1); }

struct ConvConfig {
  Dims window_strides, lhs_dilation, rhs_dilation;
  Pads padding;
  ConvSpecs specs;
  int64_t feature_group_count = 1;
};
ConvConfig conv_config(const Params& p) {
  return {p.ints("window_strides"), p.ints("lhs_dilation"), p.ints("rhs_dilation"),
          p.get<Pads>("padding"),   conv_specs(p),          p.i("feature_group_count")};
}
Array bind_conv(const Array& lhs, const Array& rhs, const ConvConfig& c, Params params) {
  auto dn = std::make_shared<ConvDimsParam>();
  dn->lhs_spec = c.specs.lhs;
  dn->rhs_spec = c.specs.rhs;
  dn->out_spec = c.specs.out;
  params.set("dimension_numbers", std::shared_ptr<const ParamObject>(std::move(dn)));
  params.set("window_strides", c.window_strides);
  params.set("lhs_dilation", c.lhs_dilation);
  params.set("rhs_dilation", c.rhs_dilation);
  params.set("padding", c.padding);
  params.set("feature_group_count", c.feature_group_count);
  return bind1(prims::conv_general_dilated(), {lhs, rhs}, params);
}

// JAX's _reshape_axis_into: merges axis `src` into axis `dst` (numbered after removing src), src
// outermost.
Array reshape_axis_into(int64_t src, int64_t dst, const Array& x) {
  Dims perm;
  for (int64_t i = 0; i < x.ndim(); ++i)
    if (i != src) perm.push_back(i);
  perm.insert(perm.begin() + dst, src);
  Shape shape = x.shape();
  int64_t n = shape[size_t(src)];
  shape.erase(shape.begin() + src);
  shape[size_t(dst)] *= n;
  return lax::reshape(lax::transpose(x, perm), shape);
}
// JAX's _reshape_axis_out_of: splits axis `src` into (size1, rest).
Array reshape_axis_out_of(int64_t src, int64_t size1, const Array& x) {
  Shape shape = x.shape();
  int64_t size2 = shape[size_t(src)] / size1;
  shape[size_t(src)] = size2;
  shape.insert(shape.begin() + src, size1);
  return lax::reshape(x, shape);
}

Array conv_transpose_lhs(const Array& g, const AbstractValue& lhs_aval, Array rhs, const ConvConfig& c,
                         const Params& params) {
  const ConvSpecs& s = c.specs;
  Shape rhs_shape = rhs.shape();
  int64_t groups = c.feature_group_count;
  if (groups > 1) {
    // Move the feature groups from the rhs output features into its input features.
    rhs = reshape_axis_out_of(s.rhs[0], groups, rhs);
    rhs = reshape_axis_into(s.rhs[0], s.rhs[1], rhs);
  }
  Dims in = take_shape(lhs_aval.shape, spatial(s.lhs)), win = take_shape(rhs_shape, spatial(s.rhs)),
       out = take_shape(g.shape(), spatial(s.out));
  Pads pads;
  for (size_t i = 0; i < in.size(); ++i) {
    int64_t ld = dilate_dim(in[i], c.lhs_dilation[i]), rd = dilate_dim(win[i], c.rhs_dilation[i]);
    int64_t od = dilate_dim(out[i], c.window_strides[i]);
    int64_t before = rd - c.padding[i][0] - 1;
    pads.push_back({before, ld + rd - 1 - od - before});
  }
  Array revd = convert_if(lax::rev(rhs, spatial(s.rhs)), g.dtype());
  ConvConfig t{c.lhs_dilation, c.window_strides, c.rhs_dilation, pads, {s.out, swap_first_two(s.rhs), s.lhs}, groups};
  return convert_if(bind_conv(g, revd, t, params), lhs_aval.dtype);
}

Array conv_transpose_rhs(const Array& g, Array lhs, const AbstractValue& rhs_aval, const ConvConfig& c,
                         const Params& params) {
  const ConvSpecs& s = c.specs;
  Dims in = take_shape(lhs.shape(), spatial(s.lhs)), win = take_shape(rhs_aval.shape, spatial(s.rhs)),
       out = take_shape(g.shape(), spatial(s.out));
  Pads pads;
  for (size_t i = 0; i < in.size(); ++i) {
    int64_t ld = dilate_dim(in[i], c.lhs_dilation[i]), rd = dilate_dim(win[i], c.rhs_dilation[i]);
    int64_t od = dilate_dim(out[i], c.window_strides[i]);
    int64_t lo = c.padding[i][0];
    pads.push_back({lo, (od - ld) + (rd - lo - 1)});
  }
  lhs = convert_if(lhs, g.dtype());
  int64_t groups = c.feature_group_count;
  if (groups > 1) {
    // JAX uses batch_group_count here; we move the groups from the lhs features into its batch
    // (the transposed convolution's feature dimension) and keep feature_group_count.
    lhs = reshape_axis_out_of(s.lhs[1], groups, lhs);
    lhs = reshape_axis_into(s.lhs[1], s.lhs[0], lhs);
  }
  ConvConfig t{c.rhs_dilation,
               c.lhs_dilation,
               c.window_strides,
               pads,
               {swap_first_two(s.lhs), swap_first_two(s.out), swap_first_two(s.rhs)},
               groups};
  return convert_if(bind_conv(lhs, g, t, params), rhs_aval.dtype);
}

JvpOut conv_jvp(std::span<const Array> p, std::span<const Array> t, const Params& params) {
  const PrimitiveDef& conv = prims::conv_general_dilated();
  Array out = bind1(conv, p, params);
  Array a = t[0].defined() ? bind1(conv, {t[0], p[1]}, params) : Array();
  Array b = t[1].defined() ? bind1(conv, {p[0], t[1]}, params) : Array();
  return JvpOut{{out}, {add_tangents(a, b)}};
}

std::vector<Array> conv_transpose(std::span<const Array> cts, std::span<const Array> args, const Params& params) {
  ConvConfig c = conv_config(params);
  std::vector<Array> r(2);
  if (is_undefined_primal(args[0])) r[0] = conv_transpose_lhs(cts[0], args[0].aval(), args[1], c, params);
  if (is_undefined_primal(args[1]) && cts[0].size() > 0)
    r[1] = conv_transpose_rhs(cts[0], args[0], args[1].aval(), c, params);
  return r;
}

// The mapped dimension folds into the lhs batch (lhs mapped), the rhs output features (rhs
// mapped) or, with one feature group per example, into both feature dimensions.
BatchOut conv_batch(std::span<const Array> a, std::span<const int> bd, const BatchAxis& axis, const Params& params) {
  const PrimitiveDef& conv = prims::conv_general_dilated();
  int lbd = bd[0], rbd = bd[1];
  if (lbd == kNotMapped && rbd == kNotMapped) return {{bind1(conv, a, params)}, {kNotMapped}};
  ConvConfig c = conv_config(params);
  const ConvSpecs& s = c.specs;
  int64_t B = axis.size;
  if (B == 0) {
    // Folding a size-0 axis into another loses the other's size; JAX returns zeros too.
    auto unbatched = [](const Array& x, int b) {
      AbstractValue v = x.aval();
      if (b != kNotMapped) v.shape.erase(v.shape.begin() + b);
      return make_undefined_primal(v);
    };
    Array l = unbatched(a[0], lbd), r = unbatched(a[1], rbd);
    AbstractValue aval = batched_aval(conv.abstract_eval(std::vector<Array>{l, r}, params)[0], 0, 0);
    return {{zeros_like_aval(aval)}, {0}};
  }
  if (lbd != kNotMapped && rbd != kNotMapped) {
    Array lhs = reshape_axis_into(lbd, s.lhs[1], a[0]);
    Array rhs = reshape_axis_into(rbd, s.rhs[0], a[1]);
    c.feature_group_count *= B;
    Array out = reshape_axis_out_of(s.out[1], B, bind_conv(lhs, rhs, c, params));
    return {{out}, {int(s.out[1])}};
  }
  if (lbd != kNotMapped) {
    Array out = bind1(conv, {reshape_axis_into(lbd, s.lhs[0], a[0]), a[1]}, params);
    return {{reshape_axis_out_of(s.out[0], B, out)}, {int(s.out[0])}};
  }
  int64_t G = c.feature_group_count;
  if (G == 1) {
    Array out = bind1(conv, {a[0], reshape_axis_into(rbd, s.rhs[0], a[1])}, params);
    return {{reshape_axis_out_of(s.out[1], B, out)}, {int(s.out[1])}};
  }
  // Groups stay outermost in the output features: (G, O/G) -> (G, B, O/G) -> back out as (B, G*O/G).
  int64_t o = s.rhs[0];
  Array rhs = reshape_axis_out_of(o + (rbd <= o ? 1 : 0), G, a[1]);
  rhs = reshape_axis_into(rbd + (o < rbd ? 1 : 0), o + 1, rhs);
  rhs = reshape_axis_into(o, o, rhs);
  Array out = bind1(conv, {a[0], rhs}, params);
  int64_t of = s.out[1];
  out = reshape_axis_out_of(of, G, out);
  out = reshape_axis_out_of(of + 1, B, out);
  out = reshape_axis_into(of, of + 1, out);
  return {{out}, {int(of)}};
}

// dot_general_accumulate: jit's fused `acc + alpha * dot_general(lhs, rhs)` (jit/passes.h
// fuse_gemm_updates), found only in optimized jaxprs. Its rules are those of that expansion,
// built on dot_general's.
Params dot_params_of(const Params& p) {
  return Params{{"dimension_numbers", p.at("dimension_numbers")},
                {"out_sharding", std::monostate{}},
                {"precision", std::monostate{}},
                {"preferred_element_type", std::monostate{}}};
}
Array scaled(const Array& x, double alpha) { return x * make_scalar(alpha, x.dtype(), true); }

JvpOut dot_accumulate_jvp(std::span<const Array> p, std::span<const Array> t, const Params& params) {
  Array out = bind1(*find_primitive("dot_general_accumulate"), p, params);
  Params dp = dot_params_of(params);
  Array a = t[0].defined() ? bind1(prims::dot_general(), {t[0], p[1]}, dp) : Array();
  Array b = t[1].defined() ? bind1(prims::dot_general(), {p[0], t[1]}, dp) : Array();
  Array d = add_tangents(a, b);
  return JvpOut{{out}, {add_tangents(t[2], d.defined() ? scaled(d, params.get<double>("alpha")) : Array())}};
}

std::vector<Array> dot_accumulate_transpose(std::span<const Array> cts, std::span<const Array> args,
                                            const Params& params) {
  std::vector<Array> r(3);
  if (!cts[0].defined()) return r;
  if (is_undefined_primal(args[2])) r[2] = cts[0];
  if (is_undefined_primal(args[0]) || is_undefined_primal(args[1])) {
    Array ct = scaled(cts[0], params.get<double>("alpha"));
    std::vector<Array> ab = dot_general_transpose(std::span<const Array>(&ct, 1), args.first(2), dot_params_of(params));
    r[0] = ab[0];
    r[1] = ab[1];
  }
  return r;
}

// Every operand batched at 0; the new leading dim is one more batch dim of the contraction,
// and the output's batch dims come first, so acc's dim 0 lines up.
BatchOut dot_accumulate_batch(std::span<const Array> args, std::span<const int> bdims, const BatchAxis& axis,
                              const Params& params) {
  std::vector<Array> moved;
  for (size_t i = 0; i < 3; ++i) moved.push_back(move_bdim(args[i], bdims[i], 0, axis.size));
  auto dn = params.object<DotDimsParam>("dimension_numbers");
  auto shifted = std::make_shared<DotDimsParam>();
  auto shift = [](const std::vector<int64_t>& v) {
    std::vector<int64_t> out;
    for (int64_t d : v) out.push_back(d + 1);
    return out;
  };
  shifted->lhs_contracting = shift(dn->lhs_contracting);
  shifted->rhs_contracting = shift(dn->rhs_contracting);
  shifted->lhs_batch = shift(dn->lhs_batch);
  shifted->rhs_batch = shift(dn->rhs_batch);
  shifted->lhs_batch.insert(shifted->lhs_batch.begin(), 0);
  shifted->rhs_batch.insert(shifted->rhs_batch.begin(), 0);
  Params p = params;
  p.set("dimension_numbers", std::shared_ptr<const ParamObject>(std::move(shifted)));
  return BatchOut{{bind1(*find_primitive("dot_general_accumulate"), moved, p)}, {0}};
}

const bool registered = add_rule_initializer([] {
  PrimitiveRules& dot = define_rules("dot_general");
  dot.jvp = dot_general_jvp;
  dot.transpose = dot_general_transpose;
  dot.batch = dot_general_batch;
  PrimitiveRules& acc = define_rules("dot_general_accumulate");
  acc.jvp = dot_accumulate_jvp;
  acc.transpose = dot_accumulate_transpose;
  acc.batch = dot_accumulate_batch;
  PrimitiveRules& conv = define_rules("conv_general_dilated");
  conv.jvp = conv_jvp;
  conv.transpose = conv_transpose;
  conv.batch = conv_batch;
});

}  // namespace
}  // namespace cjax
