// JVP, transpose and batching rules of the elementwise primitives (core/lax/elementwise.cpp): the
// scalar-op table, convert_element_type, bitcast_convert_type, select_n, integer_pow,
// threefry2x32 and stop_gradient. The JVP rules mirror jax/_src/lax/lax.py and special.py term
// by term, so staged gradients print the primitives JAX prints. Binary ops accept a rank-0
// operand next to a full one (lax semantics): tangents are broadcast to the output shape and
// cotangents are summed back (unbroadcast) to a rank-0 operand.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "autodiff/rule_helpers.h"
#include "core/lax/elementwise.h"
#include "core/lax/rule_support.h"

namespace cjax {
namespace {

using namespace rule_helpers;
using Args = std::span<const Array>;

// ---- constants, as JAX's _const / _one / full_like ----
// A strongly typed rank-0 constant of x's dtype (JAX's _const).
Array const_like(const Array& x, double v) { return make_scalar(v, x.dtype(), false); }
// A rank-0 constant of x's dtype and weak type (JAX's _one / _zero).
Array scalar_like(const Array& x, double v) { return make_scalar(v, x.dtype(), x.weak_type()); }
// x's shape filled with v (JAX's full_like, hence _zeros / _ones / _twos).
Array full_like(const Array& x, double v) {
  Array s = scalar_like(x, v);
  return x.ndim() == 0 ? s : lax::broadcast_in_dim(s, x.shape(), {});
}
Array full_like_aval(const AbstractValue& aval, double v) {
  Array s = make_scalar(v, aval.dtype, aval.weak_type);
  return aval.shape.empty() ? s : lax::broadcast_in_dim(s, aval.shape, {});
}
// JAX's _replace_zero: ones where x == 0, else x.
Array replace_zero(const Array& x) { return lax::select(lax::eq(x, const_like(x, 0)), full_like(x, 1), x); }
Array reciprocal(const Array& x) { return lax::integer_pow(x, -1); }

const PrimitiveDef& prim(std::string_view name) {
  const PrimitiveDef* def = find_primitive(name);
  if (!def) throw Error(fmt::format("internal: rules for unknown primitive '{}'", name));
  return *def;
}

// ---- JVP rule builders (JAX's defjvp / defjvp2 / defjvp_zero) ----
// The tangent contribution of operand i: deriv(g = its tangent, ans, primals). Null: no
// contribution (that operand's derivative is zero). Each term is broadcast to the output.
using NaryDeriv = std::function<Array(const Array& g, const Array& ans, Args primals)>;

void def_nary_jvp(std::string_view name, std::vector<NaryDeriv> derivs) {
  const PrimitiveDef* def = &prim(name);
  define_rules(name).jvp = [def, derivs = std::move(derivs)](Args p, Args t, const Params& params) {
    Array out = bind1(*def, p, params);
    Array acc;
    for (size_t i = 0; i < p.size(); ++i)
      if (t[i].defined() && derivs[i]) acc = add_tangents(acc, broadcast_to_aval(derivs[i](t[i], out, p), out.aval()));
    return JvpOut{{out}, {acc}};
  };
}

// Primitives whose derivative is zero everywhere it exists (or whose outputs are not floating).
void def_zero_jvp(std::string_view name) {
  const PrimitiveDef* def = &prim(name);
  define_rules(name).jvp = [def](Args p, Args, const Params& params) {
    std::vector<Array> outs = cjax::bind(*def, p, params);
    std::vector<Array> zeros(outs.size());
    return JvpOut{std::move(outs), std::move(zeros)};
  };
}

// ---- digamma, for lgamma's derivative ----
// cjax has no digamma primitive, so lgamma's JVP (JAX: g * digamma(x)) builds digamma from
// existing ops: the recurrence psi(x) = psi(x + 6) - sum_{k<6} 1/(x + k) lifts the argument to
// where the asymptotic series ln z - 1/2z - sum B_2n / (2n z^2n) (six terms) is accurate to
// ~1e-13; x < 0.5 uses the reflection psi(x) = psi(1 - x) - pi / tan(pi x). Being made of
// differentiable ops, it also gives lgamma a second derivative (trigamma).
Array digamma(const Array& x) {
  Array reflect = lax::lt(x, const_like(x, 0.5));
  Array w = lax::select(reflect, lax::sub(const_like(x, 1), x), x);
  Array shift_sum;
  Array z = w;
  for (int k = 0; k < 6; ++k) {
    Array r = lax::div(const_like(x, 1), z);
    shift_sum = shift_sum.defined() ? lax::add(shift_sum, r) : r;
    z = lax::add(z, const_like(x, 1));
  }
  Array zinv2 = lax::div(const_like(x, 1), lax::mul(z, z));
  Array tail = lax::mul(zinv2, const_like(x, 691.0 / 32760));
  for (double c : {1.0 / 132, 1.0 / 240, 1.0 / 252, 1.0 / 120, 1.0 / 12})
    tail = lax::mul(zinv2, lax::sub(const_like(x, c), tail));
  Array psi_w = lax::sub(lax::sub(lax::sub(lax::log(z), lax::div(const_like(x, 0.5), z)), tail), shift_sum);
  // The reflection term is evaluated at a harmless point where it is not selected, so neither
  // it nor its derivative is inf/NaN at integers (JAX's double-where pattern).
  Array safe_x = lax::select(reflect, x, full_like(x, 0.25));
  Array pi = const_like(x, std::numbers::pi);
  Array reflection = lax::div(pi, lax::tan(lax::mul(pi, safe_x)));
  return lax::select(reflect, lax::sub(psi_w, reflection), psi_w);
}

// ---- balanced max/min derivative (JAX's _balanced_eq): ties split the tangent evenly ----
Array balanced_eq(const Array& x, const Array& z, const Array& y) {
  return lax::div(lax::select(lax::eq(x, z), full_like(z, 1), full_like(z, 0)),
                  lax::select(lax::eq(y, z), full_like(z, 2), full_like(z, 1)));
}

void define_unary_jvps() {
  for (const char* name : {"sign", "floor", "ceil", "round", "is_finite", "not"}) def_zero_jvp(name);
  def_unary_jvp("neg", [](const Array&, const Array& g) { return lax::neg(g); });
  def_unary_jvp("abs", [](const Array& x, const Array& g) {
    return lax::select(lax::ge(x, scalar_like(x, 0)), g, lax::neg(g));
  });
  def_unary_jvp("exp", [](const Array&, const Array& g, const Array& ans) { return lax::mul(g, ans); });
  def_unary_jvp("exp2", [](const Array& x, const Array& g, const Array& ans) {
    return lax::mul(lax::log(const_like(x, 2)), lax::mul(g, ans));
  });
  def_unary_jvp("log", [](const Array& x, const Array& g) { return lax::div(g, x); });
  def_unary_jvp("log1p", [](const Array& x, const Array& g) { return lax::div(g, lax::add(x, scalar_like(x, 1))); });
  def_unary_jvp("expm1", [](const Array&, const Array& g, const Array& ans) {
    return lax::mul(g, lax::add(ans, scalar_like(ans, 1)));
  });
  def_unary_jvp("tanh", [](const Array& x, const Array& g, const Array& ans) {
    return lax::mul(lax::add(g, lax::mul(g, ans)), lax::sub(scalar_like(x, 1), ans));
  });
  def_unary_jvp("logistic", [](const Array&, const Array& g, const Array& ans) {
    return lax::mul(g, lax::mul(ans, lax::sub(scalar_like(ans, 1), ans)));
  });
  def_unary_jvp("sin", [](const Array& x, const Array& g) { return lax::mul(g, lax::cos(x)); });
  def_unary_jvp("cos", [](const Array& x, const Array& g) { return lax::neg(lax::mul(g, lax::sin(x))); });
  def_unary_jvp("tan", [](const Array& x, const Array& g, const Array& ans) {
    return lax::mul(g, lax::add(const_like(x, 1), lax::square(ans)));
  });
  def_unary_jvp("asin", [](const Array& x, const Array& g) {
    return lax::mul(g, lax::rsqrt(lax::sub(const_like(x, 1), lax::square(x))));
  });
  def_unary_jvp("acos", [](const Array& x, const Array& g) {
    return lax::mul(g, lax::neg(lax::rsqrt(lax::sub(const_like(x, 1), lax::square(x)))));
  });
  def_unary_jvp("atan",
                [](const Array& x, const Array& g) { return lax::div(g, lax::add(const_like(x, 1), lax::square(x))); });
  def_unary_jvp("sinh", [](const Array& x, const Array& g) { return lax::mul(g, lax::cosh(x)); });
  def_unary_jvp("cosh", [](const Array& x, const Array& g) { return lax::mul(g, lax::sinh(x)); });
  def_unary_jvp("asinh", [](const Array& x, const Array& g) {
    return lax::mul(g, lax::rsqrt(lax::add(lax::square(x), scalar_like(x, 1))));
  });
  def_unary_jvp("acosh", [](const Array& x, const Array& g) {
    return lax::mul(g, lax::rsqrt(lax::sub(lax::square(x), scalar_like(x, 1))));
  });
  def_unary_jvp("atanh", [](const Array& x, const Array& g) {
    return lax::mul(reciprocal(lax::add(scalar_like(x, 1), x)), lax::div(g, lax::sub(scalar_like(x, 1), x)));
  });
  def_unary_jvp("sqrt", [](const Array& x, const Array& g, const Array& ans) {
    return lax::mul(g, lax::div(const_like(x, 0.5), ans));
  });
  def_unary_jvp("rsqrt", [](const Array& x, const Array& g, const Array& ans) {
    return lax::mul(g, lax::mul(const_like(x, -0.5), lax::div(ans, x)));
  });
  def_unary_jvp("cbrt", [](const Array& x, const Array& g, const Array& ans) {
    return lax::mul(g, lax::mul(const_like(x, 1.0 / 3), lax::integer_pow(ans, -2)));
  });
  def_unary_jvp("erf", [](const Array& x, const Array& g) {
    return lax::mul(const_like(x, 2 / std::sqrt(std::numbers::pi)), lax::mul(g, lax::exp(lax::neg(lax::square(x)))));
  });
  def_unary_jvp("erfc", [](const Array& x, const Array& g) {
    return lax::mul(const_like(x, -2 / std::sqrt(std::numbers::pi)), lax::mul(g, lax::exp(lax::neg(lax::square(x)))));
  });
  def_unary_jvp("erf_inv", [](const Array& x, const Array& g, const Array& ans) {
    return lax::mul(const_like(x, std::sqrt(std::numbers::pi) / 2), lax::mul(g, lax::exp(lax::square(ans))));
  });
  def_unary_jvp("lgamma", [](const Array& x, const Array& g) { return lax::mul(g, digamma(x)); });
  def_unary_jvp("square", [](const Array& x, const Array& g) { return lax::mul(g, lax::mul(const_like(x, 2), x)); });
  def_unary_jvp("stop_gradient", [](const Array&, const Array&) { return Array(); });
  define_rules("integer_pow").jvp = [](Args p, Args t, const Params& params) {
    const Array& x = p[0];
    Array out = bind1(prims::integer_pow(), p, params);
    int64_t y = params.i("y");
    Array g = t[0];
    if (!g.defined() || y == 0) return JvpOut{{out}, {Array()}};
    if (y == 1) return JvpOut{{out}, {g}};
    Array dx =
        y == 2 ? lax::mul(const_like(x, 2), x) : lax::mul(const_like(x, double(y)), lax::integer_pow(x, int(y - 1)));
    return JvpOut{{out}, {lax::mul(g, dx)}};
  };
}

void define_binary_jvps() {
  for (const char* name :
       {"nextafter", "and", "or", "xor", "shift_left", "shift_right_logical", "shift_right_arithmetic", "eq", "ne",
        "lt", "le", "gt", "ge", "threefry2x32", "bitcast_convert_type"})
    def_zero_jvp(name);
  auto first = [](const Array& g, const Array&, Args) { return g; };
  // JAX's _add_jvp / _sub_jvp: a single tangent passes through; two are combined by add / sub.
  for (bool is_sub : {false, true}) {
    const PrimitiveDef* def = &prims::elementwise(is_sub ? ScalarOp::Sub : ScalarOp::Add);
    define_rules(def->name).jvp = [def, is_sub](Args p, Args t, const Params& params) {
      Array out = bind1(*def, p, params);
      if (t[0].defined() && t[1].defined())
        return JvpOut{{out}, {broadcast_to_aval(is_sub ? lax::sub(t[0], t[1]) : lax::add(t[0], t[1]), out.aval())}};
      Array g = t[0].defined() ? t[0] : t[1].defined() ? (is_sub ? lax::neg(t[1]) : t[1]) : Array();
      return JvpOut{{out}, {g.defined() ? broadcast_to_aval(g, out.aval()) : Array()}};
    };
  }
  def_nary_jvp("mul", {[](const Array& g, const Array&, Args p) { return lax::mul(g, p[1]); },
                       [](const Array& g, const Array&, Args p) { return lax::mul(p[0], g); }});
  def_nary_jvp("div", {[](const Array& g, const Array&, Args p) { return lax::div(g, p[1]); },
                       [](const Array& g, const Array&, Args p) {
                         return lax::mul(lax::mul(lax::neg(g), p[0]), lax::integer_pow(p[1], -2));
                       }});
  def_nary_jvp("rem", {first, [](const Array& g, const Array&, Args p) {
                         Array q = lax::div(p[0], p[1]);
                         return lax::mul(lax::neg(g), lax::mul(lax::sign(q), lax::floor(lax::abs(q))));
                       }});
  def_nary_jvp("pow", {[](const Array& g, const Array&, Args p) {
                         const Array &x = p[0], &y = p[1];
                         return lax::mul(g, lax::mul(y, lax::pow(x, lax::sub(y, full_like(y, 1)))));
                       },
                       [](const Array& g, const Array& ans, Args p) {
                         return lax::mul(g, lax::mul(lax::log(replace_zero(p[0])), ans));
                       }});
  for (const char* name : {"max", "min"})
    def_nary_jvp(name,
                 {[](const Array& g, const Array& ans, Args p) { return lax::mul(g, balanced_eq(p[0], ans, p[1])); },
                  [](const Array& g, const Array& ans, Args p) { return lax::mul(g, balanced_eq(p[1], ans, p[0])); }});
  def_nary_jvp("atan2", {[](const Array& g, const Array&, Args p) {
                           return lax::mul(g, lax::div(p[1], lax::add(lax::square(p[0]), lax::square(p[1]))));
                         },
                         [](const Array& g, const Array&, Args p) {
                           return lax::mul(g, lax::div(lax::neg(p[0]), lax::add(lax::square(p[0]), lax::square(p[1]))));
                         }});
  // clamp(lo, x, hi): the tangent of whichever operand is selected (lo when lo > x and lo < hi,
  // x strictly inside, hi when hi < x). Cases are taken at the output shape, since lo/hi/x may
  // each be rank-0 here.
  auto clamp_case = [](const Array& pred, const Array& g, const Array& ans) {
    return lax::select(pred, broadcast_to_aval(g, ans.aval()), full_like(ans, 0));
  };
  def_nary_jvp("clamp", {[clamp_case](const Array& g, const Array& ans, Args p) {
                           return clamp_case(lax::bitwise_and(lax::gt(p[0], p[1]), lax::lt(p[0], p[2])), g, ans);
                         },
                         [clamp_case](const Array& g, const Array& ans, Args p) {
                           return clamp_case(lax::bitwise_and(lax::gt(p[1], p[0]), lax::lt(p[1], p[2])), g, ans);
                         },
                         [clamp_case](const Array& g, const Array& ans, Args p) {
                           return clamp_case(lax::lt(p[2], p[1]), g, ans);
                         }});
}

void define_structural_jvps() {
  // select_n: the cases' tangents selected by the same predicate; missing ones are zeros.
  define_rules("select_n").jvp = [](Args p, Args t, const Params& params) {
    Array out = bind1(prims::select_n(), p, params);
    std::vector<Array> cases(t.begin() + 1, t.end());
    if (!any_defined(cases)) return JvpOut{{out}, {Array()}};
    Array zero;
    for (Array& c : cases)
      if (!c.defined()) c = zero.defined() ? zero : (zero = full_like_aval(out.aval(), 0));
    std::vector<Array> in{p[0]};
    in.insert(in.end(), cases.begin(), cases.end());
    return JvpOut{{out}, {bind1(prims::select_n(), in)}};
  };
  // convert_element_type: the tangent is converted the same way (float -> float); a non-floating
  // result has no tangent (JVPTrace drops it).
  define_rules("convert_element_type").jvp = [](Args p, Args t, const Params& params) {
    Array out = bind1(prims::convert_element_type(), p, params);
    if (!t[0].defined() || !is_floating(out.dtype())) return JvpOut{{out}, {Array()}};
    return JvpOut{{out}, {bind1(prims::convert_element_type(), {t[0]}, params)}};
  };
}

// ---- transpose rules of the linear elementwise primitives ----
std::vector<Array> unbroadcast_if_linear(Args args, std::initializer_list<Array> cts) {
  std::vector<Array> out;
  size_t i = 0;
  for (const Array& ct : cts) {
    out.push_back(is_undefined_primal(args[i]) && ct.defined() ? unbroadcast(ct, args[i].aval()) : Array());
    ++i;
  }
  return out;
}

void define_transposes() {
  define_rules("neg").transpose = [](Args cts, Args, const Params&) { return std::vector<Array>{lax::neg(cts[0])}; };
  define_rules("add").transpose = [](Args cts, Args args, const Params&) {
    return unbroadcast_if_linear(args, {cts[0], cts[0]});
  };
  define_rules("sub").transpose = [](Args cts, Args args, const Params&) {
    return unbroadcast_if_linear(args, {cts[0], is_undefined_primal(args[1]) ? lax::neg(cts[0]) : Array()});
  };
  // mul is bilinear: exactly one operand is the linear (undefined) one.
  define_rules("mul").transpose = [](Args cts, Args args, const Params&) {
    bool lhs = is_undefined_primal(args[0]);
    return unbroadcast_if_linear(args, {lhs ? lax::mul(cts[0], args[1]) : Array(),
                                        lhs ? Array() : lax::mul(args[0], cts[0])});
  };
  define_rules("div").transpose = [](Args cts, Args args, const Params&) {
    if (is_undefined_primal(args[1]))
      throw Error("internal: div is not linear in its denominator and cannot be transposed");
    return unbroadcast_if_linear(args, {lax::div(cts[0], args[1]), Array()});
  };
  define_rules("convert_element_type").transpose = [](Args cts, Args args, const Params&) {
    const AbstractValue& in = args[0].aval();
    Params back{{"new_dtype", in.dtype}, {"weak_type", in.weak_type}};
    return std::vector<Array>{bind1(prims::convert_element_type(), {cts[0]}, back)};
  };
  // select_n is linear in its cases (the predicate is a residual): each linear case receives
  // the cotangent where it was selected and zeros elsewhere.
  define_rules("select_n").transpose = [](Args cts, Args args, const Params&) {
    std::vector<Array> out(args.size());
    Array zeros = full_like(cts[0], 0);
    for (size_t i = 1; i < args.size(); ++i) {
      if (!is_undefined_primal(args[i])) continue;
      std::vector<Array> in{args[0]};
      for (size_t j = 1; j < args.size(); ++j) in.push_back(i == j ? cts[0] : zeros);
      out[i] = bind1(prims::select_n(), in);
    }
    return out;
  };
}

// ---- batching ----
// Elementwise ops batch as the same op on the batched operands. When every batched operand has
// its batch dimension at the same position and full unbatched rank, and every unbatched operand
// is rank-0, the op applies as is and the batch dimension stays where it is (JAX's
// defbroadcasting); otherwise batch dimensions move to the front (batch_elementwise).
BatchOut batch_in_place(const PrimitiveDef& def, Args args, std::span<const int> bdims, const BatchAxis& axis,
                        const Params& params) {
  int rank = 0, bdim = kNotMapped;
  bool in_place = true;
  for (size_t i = 0; i < args.size(); ++i) rank = std::max(rank, args[i].ndim() - (bdims[i] == kNotMapped ? 0 : 1));
  for (size_t i = 0; i < args.size(); ++i) {
    if (bdims[i] == kNotMapped) {
      in_place &= args[i].ndim() == 0;
    } else {
      in_place &= args[i].ndim() == rank + 1 && (bdim == kNotMapped || bdim == bdims[i]);
      bdim = bdims[i];
    }
  }
  if (!in_place || bdim == kNotMapped) return batch_elementwise(def, args, bdims, axis, params);
  std::vector<Array> outs = cjax::bind(def, args, params);
  std::vector<int> out_bdims(outs.size(), bdim);
  return BatchOut{std::move(outs), std::move(out_bdims)};
}

// select_n's cases must all have the output's shape, so unbatched cases are broadcast; a rank-0
// unbatched predicate stays scalar, a batched one over scalar cases is broadcast to the cases.
BatchOut batch_select_n(Args args, std::span<const int> bdims, const BatchAxis& axis) {
  const Array& which = args[0];
  int case_bdim = kNotMapped;
  bool same = true;
  for (size_t i = 1; i < args.size(); ++i) {
    same &= bdims[i] != kNotMapped && (case_bdim == kNotMapped || case_bdim == bdims[i]);
    case_bdim = bdims[i];
  }
  if (same && bdims[0] == kNotMapped && which.ndim() == 0)
    return BatchOut{{bind1(prims::select_n(), args)}, {case_bdim}};
  std::vector<Array> in;
  for (size_t i = 1; i < args.size(); ++i) in.push_back(move_bdim(args[i], bdims[i], 0, axis.size));
  Array w = which;
  if (bdims[0] != kNotMapped || which.ndim() != 0) {
    w = move_bdim(which, bdims[0], 0, axis.size);
    if (w.ndim() < in[0].ndim()) w = lax::broadcast_in_dim(w, in[0].shape(), {0});
  }
  in.insert(in.begin(), w);
  return BatchOut{{bind1(prims::select_n(), in)}, {0}};
}

void define_batching() {
  for (const PrimitiveDef* def : all_primitives()) {
    bool elementwise = def->scalar_op || def->name == "stop_gradient" || def->name == "convert_element_type" ||
                       def->name == "bitcast_convert_type" || def->name == "integer_pow" || def->name == "threefry2x32";
    if (!elementwise) continue;
    define_rules(def->name).batch = [def](Args a, std::span<const int> d, const BatchAxis& axis, const Params& p) {
      return batch_in_place(*def, a, d, axis, p);
    };
  }
  define_rules("select_n").batch = [](Args a, std::span<const int> d, const BatchAxis& axis, const Params&) {
    return batch_select_n(a, d, axis);
  };
}

const bool registered = add_rule_initializer([] {
  define_unary_jvps();
  define_binary_jvps();
  define_structural_jvps();
  define_transposes();
  define_batching();
});

}  // namespace
}  // namespace cjax
