// fuse_attention: softmax attention written out by hand becomes flash_attention (jit/passes/passes.h).
//
// The pattern, on 4-d operands with two batch-like dimensions (batch and heads, in any order):
//   logits = dot_general(q, k) contracting the head size        [b0, b1, T, S]
//   scaled = logits * c | logits / c | logits                   (c a scalar literal)
//   masked = select_n(mask, fill, scaled) | select_n(mask, scaled, fill) | scaled
//   p      = softmax over S written as exp(x - max(x)) / sum(exp(x - max(x)))
//   out    = dot_general(p, v) contracting S                     [b0, b1, T, H]
// where `mask` depends on no input (it is evaluated at compile time and must be the causal mask,
// key s kept for query t when s <= t, or all true) and `fill` is a literal of at most -1e9 (its
// exponential is exactly zero, as the fused kernel's skipped keys). Every intermediate must be
// used by the pattern alone: under grad the unfused values are residuals of the backward pass,
// so only forward programs (inference) are rewritten; nn::dot_product_attention is the way to
// the fused backward. The rewrite transposes q, k and v to [b0, T, b1, H] (no-ops for the usual
// [B, T, N, H] layout) and the result back.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <optional>
#include <unordered_map>

#include "cjax/lax.h"
#include "cjax/numpy.h"
#include "core/array/primitive.h"
#include "core/array/trace.h"
#include "core/lax/attention.h"
#include "core/lax/linalg.h"
#include "jit/passes/passes.h"
#include "jit/passes/rewrite.h"
#include "trace/eval_jaxpr.h"

namespace cjax {
using namespace passes_detail;
namespace {

namespace jnp = cjax::numpy;

struct Graph {
  const Jaxpr& jaxpr;
  std::unordered_map<const void*, size_t> def;  // var -> the index of the equation defining it
  std::unordered_map<const void*, int> uses;

  explicit Graph(const Jaxpr& j) : jaxpr(j), uses(count_uses(j)) {
    for (size_t i = 0; i < j.eqns().size(); ++i)
      for (const Var& v : j.eqns()[i].outputs) def[v.id()] = i;
  }
  const JaxprEqn* producer(const Atom& a) const {
    auto* v = std::get_if<Var>(&a);
    if (!v) return nullptr;
    auto it = def.find(v->id());
    return it == def.end() ? nullptr : &jaxpr.eqns()[it->second];
  }
  int uses_of(const Atom& a) const {
    auto* v = std::get_if<Var>(&a);
    auto it = v ? uses.find(v->id()) : uses.end();
    return it == uses.end() ? 0 : it->second;
  }
  // The equation defining `a` if it is `primitive` and `a` has `n` uses.
  const JaxprEqn* only(const Atom& a, const char* primitive, int n = 1) const {
    const JaxprEqn* e = producer(a);
    return e && e->primitive->name == primitive && uses_of(a) == n ? e : nullptr;
  }
  // Through a single-use chain of broadcast_in_dim / reshape / stop_gradient (a row value spread
  // over the rows' elements) to the value it starts from.
  Atom row_source(Atom a) const {
    for (const JaxprEqn* e = producer(a); e && uses_of(a) == 1; e = producer(a)) {
      const std::string& n = e->primitive->name;
      if (n != "broadcast_in_dim" && n != "reshape" && n != "stop_gradient") break;
      a = e->inputs[0];
    }
    return a;
  }
  // Whether `a` is computed from constants, iotas and literals only (no input).
  bool constant(const Atom& a) const {
    if (std::holds_alternative<Literal>(a)) return true;
    const Var& v = std::get<Var>(a);
    for (const Var& c : jaxpr.constvars())
      if (c == v) return true;
    const JaxprEqn* e = producer(a);
    if (!e) return false;
    for (const Atom& in : e->inputs)
      if (!constant(in)) return false;
    return true;
  }
  // Evaluates a constant value with the program's constants.
  Array evaluate(const Atom& a, const std::vector<Array>& consts) const {
    if (auto* l = std::get_if<Literal>(&a)) return l->value();
    std::vector<size_t> needed;
    std::function<void(const Atom&)> visit = [&](const Atom& x) {
      auto* v = std::get_if<Var>(&x);
      auto it = v ? def.find(v->id()) : def.end();
      if (it == def.end() || std::find(needed.begin(), needed.end(), it->second) != needed.end()) return;
      for (const Atom& in : jaxpr.eqns()[it->second].inputs) visit(in);
      needed.push_back(it->second);
    };
    visit(a);
    std::sort(needed.begin(), needed.end());
    std::vector<JaxprEqn> eqns;
    for (size_t i : needed) eqns.push_back(jaxpr.eqns()[i]);
    Jaxpr sub(jaxpr.constvars(), {}, std::move(eqns), {a});
    TraceScope eager(eval_trace());
    return eval_jaxpr(sub, consts, {})[0];
  }
};

bool same_var(const Atom& a, const Atom& b) {
  auto *x = std::get_if<Var>(&a), *y = std::get_if<Var>(&b);
  return x && y && *x == *y;
}

std::optional<double> scalar_literal(const Graph& g, const Atom& a) {
  const Literal* l = std::get_if<Literal>(&a);
  if (!l) {  // a splat: broadcast_in_dim of a scalar literal
    const JaxprEqn* e = g.producer(a);
    if (!e || e->primitive->name != "broadcast_in_dim") return std::nullopt;
    l = std::get_if<Literal>(&e->inputs[0]);
  }
  if (!l || l->aval().ndim() != 0) return std::nullopt;
  TraceScope eager(eval_trace());
  return l->value().astype(DType::float64).item<double>();
}

JaxprEqn transpose_eqn(const Atom& in, const std::vector<int64_t>& perm) {
  const AbstractValue& a = atom_aval(in);
  AbstractValue out = a;
  for (size_t d = 0; d < perm.size(); ++d) out.shape[d] = a.shape[size_t(perm[d])];
  JaxprEqn e;
  e.primitive = find_primitive("transpose");
  e.inputs = {in};
  e.outputs = {Var(out)};
  e.params.set("permutation", perm);
  return e;
}

// A match: the operands, the dimensions of each that make [b0, T|S, b1, H], the options, and the
// equation whose output the fused result replaces.
struct Match {
  Atom q, k, v;
  std::vector<int64_t> q_perm, k_perm, v_perm;
  attention::Options options;
};

std::optional<Match> match(const Graph& g, const JaxprEqn& pv, const std::vector<Array>& consts) {
  auto dn2 = pv.params.object<DotDimsParam>("dimension_numbers");
  const AbstractValue& p_aval = atom_aval(pv.inputs[0]);
  if (p_aval.ndim() != 4 || atom_aval(pv.inputs[1]).ndim() != 4 || dn2->lhs_contracting != std::vector<int64_t>{3} ||
      dn2->lhs_batch != std::vector<int64_t>{0, 1} || dn2->rhs_contracting.size() != 1 || dn2->rhs_batch.size() != 2)
    return std::nullopt;
  // p = e / rows(sum(e)), e = exp(x - rows(max(x)))
  const JaxprEqn* div = g.only(pv.inputs[0], "div");
  if (!div) return std::nullopt;
  const JaxprEqn* sum = g.only(g.row_source(div->inputs[1]), "reduce_sum");
  if (!sum || sum->params.ints("axes") != std::vector<int64_t>{3} || !same_var(sum->inputs[0], div->inputs[0]))
    return std::nullopt;
  const JaxprEqn* exp = g.only(div->inputs[0], "exp", 2);
  const JaxprEqn* sub = exp ? g.only(exp->inputs[0], "sub") : nullptr;
  if (!sub) return std::nullopt;
  const JaxprEqn* max = g.only(g.row_source(sub->inputs[1]), "reduce_max");
  if (!max || max->params.ints("axes") != std::vector<int64_t>{3} || !same_var(max->inputs[0], sub->inputs[0]) ||
      g.uses_of(sub->inputs[0]) != 2)
    return std::nullopt;
  // x = select_n(mask, ...) of the scaled logits, or the scaled logits
  Match m;
  Atom scaled = sub->inputs[0];
  if (const JaxprEqn* sel = g.only(scaled, "select_n", 2); sel && sel->inputs.size() == 3) {
    bool keep_when_true = !scalar_literal(g, sel->inputs[2]).has_value();
    Atom fill = keep_when_true ? sel->inputs[1] : sel->inputs[2];
    std::optional<double> f = scalar_literal(g, fill);
    if (!f || *f > -1e9 || !g.constant(sel->inputs[0])) return std::nullopt;
    Array mask = g.evaluate(sel->inputs[0], consts);
    TraceScope eager(eval_trace());
    const Shape& s = p_aval.shape;
    Array t = lax::broadcasted_iota(DType::int32, s, 2), k = lax::broadcasted_iota(DType::int32, s, 3);
    Array causal = keep_when_true ? (k <= t) : (k > t);
    if (!jnp::array_equal(jnp::broadcast_to(mask, s), causal)) return std::nullopt;
    m.options.is_causal = true;
    scaled = keep_when_true ? sel->inputs[2] : sel->inputs[1];
    if (g.uses_of(scaled) != 1) return std::nullopt;
  }
  Atom logits = scaled;
  int logits_uses = g.uses_of(scaled);  // 2 without mask and scale: max and sub read the logits
  if (const JaxprEqn* e = g.producer(scaled); e && (e->primitive->name == "mul" || e->primitive->name == "div")) {
    logits_uses = 1;
    bool first = e->primitive->name == "mul" && scalar_literal(g, e->inputs[0]).has_value();
    std::optional<double> c = scalar_literal(g, e->inputs[first ? 0 : 1]);
    if (!c || *c == 0 || std::get_if<Literal>(&e->inputs[first ? 1 : 0])) return std::nullopt;
    m.options.scale = e->primitive->name == "mul" ? *c : 1.0 / *c;
    logits = e->inputs[first ? 1 : 0];
  }
  const JaxprEqn* qk = g.only(logits, "dot_general", logits_uses);
  if (!qk) return std::nullopt;
  auto dn1 = qk->params.object<DotDimsParam>("dimension_numbers");
  if (atom_aval(qk->inputs[0]).ndim() != 4 || atom_aval(qk->inputs[1]).ndim() != 4 ||
      dn1->lhs_contracting.size() != 1 || dn1->lhs_batch.size() != 2)
    return std::nullopt;
  auto free_dim = [](const std::vector<int64_t>& batch, int64_t contracting) {
    for (int64_t d = 0; d < 4; ++d)
      if (d != contracting && d != batch[0] && d != batch[1]) return d;
    return int64_t(-1);
  };
  m.q = qk->inputs[0];
  m.k = qk->inputs[1];
  m.v = pv.inputs[1];
  m.q_perm = {dn1->lhs_batch[0], free_dim(dn1->lhs_batch, dn1->lhs_contracting[0]), dn1->lhs_batch[1],
              dn1->lhs_contracting[0]};
  m.k_perm = {dn1->rhs_batch[0], free_dim(dn1->rhs_batch, dn1->rhs_contracting[0]), dn1->rhs_batch[1],
              dn1->rhs_contracting[0]};
  m.v_perm = {dn2->rhs_batch[0], dn2->rhs_contracting[0], dn2->rhs_batch[1],
              free_dim(dn2->rhs_batch, dn2->rhs_contracting[0])};
  DType dt = atom_aval(m.q).dtype;
  for (const Atom& a : {m.k, m.v, pv.inputs[0], logits})
    if (atom_aval(a).dtype != dt) return std::nullopt;
  if (!attention::fused_dtype(dt)) return std::nullopt;
  const Shape &qs = atom_aval(m.q).shape, &ks = atom_aval(m.k).shape, &vs = atom_aval(m.v).shape;
  auto at = [](const Shape& s, const std::vector<int64_t>& perm, size_t i) { return s[size_t(perm[i])]; };
  for (size_t i : {0, 2})  // the same batch and heads, no grouped-query heads: one H for q, k and v
    if (at(qs, m.q_perm, i) != at(ks, m.k_perm, i) || at(ks, m.k_perm, i) != at(vs, m.v_perm, i)) return std::nullopt;
  if (at(qs, m.q_perm, 3) != at(vs, m.v_perm, 3) || at(ks, m.k_perm, 1) != at(vs, m.v_perm, 1)) return std::nullopt;
  return m;
}

bool identity(const std::vector<int64_t>& perm) { return perm == std::vector<int64_t>{0, 1, 2, 3}; }

}  // namespace

std::shared_ptr<const Jaxpr> fuse_attention(const Jaxpr& jaxpr, const std::vector<Array>& consts) {
  Graph g(jaxpr);
  std::vector<JaxprEqn> eqns;
  bool changed = false;
  for (const JaxprEqn& e : jaxpr.eqns()) {
    std::optional<Match> m;
    if (e.primitive->name == "dot_general") m = match(g, e, consts);
    if (!m) {
      eqns.push_back(e);
      continue;
    }
    changed = true;
    auto laid_out = [&](const Atom& x, const std::vector<int64_t>& perm) -> Atom {
      if (identity(perm)) return x;
      eqns.push_back(transpose_eqn(x, perm));
      eqns.back().source_info = e.source_info;
      return eqns.back().outputs[0];
    };
    Atom q = laid_out(m->q, m->q_perm), k = laid_out(m->k, m->k_perm), v = laid_out(m->v, m->v_perm);
    JaxprEqn flash;
    flash.primitive = &prims::flash_attention();
    flash.inputs = {q, k, v};
    const Shape& qs = atom_aval(q).shape;
    DType dt = atom_aval(q).dtype;
    flash.outputs = {Var(AbstractValue{qs, dt, false, {}}),
                     Var(AbstractValue{{qs[0], qs[2], qs[1]}, DType::float32, false, {}})};
    flash.params = attention::params_of(m->options);
    flash.source_info = e.source_info;
    eqns.push_back(flash);
    JaxprEqn back = transpose_eqn(flash.outputs[0], {0, 2, 1, 3});  // [b0, T, b1, H] -> [b0, b1, T, H]
    back.outputs = e.outputs;
    back.source_info = e.source_info;
    eqns.push_back(std::move(back));
  }
  if (!changed) return std::make_shared<const Jaxpr>(jaxpr);
  return dce(Jaxpr(jaxpr.constvars(), jaxpr.invars(), std::move(eqns), jaxpr.outvars()));
}

}  // namespace cjax
