// The checkpoint primitive (JAX's remat_p, printed `remat2[differentiated=... jaxpr={...}
// policy=... prevent_cse=True]`, jax/_src/ad_checkpoint.py). Its rules:
//  * JVP: remat2 of the JVP jaxpr.
//  * partial eval (linearize): the known part (primal outputs and the residuals the policy saves;
//    inputs are always saved) is evaluated inline under the parent trace; the unknown part is a
//    remat2[differentiated=True] equation that first RECOMPUTES every value the policy did not
//    save from the saved ones, then does the tangent work. backward_pass evaluates equations with
//    no linear input forward, so the recomputation runs again in the backward pass.
//  * transpose: remat2 of the backward pass of its jaxpr; batching: remat2 of the vmapped jaxpr.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <unordered_map>
#include <unordered_set>

#include "autodiff/ad.h"
#include "autodiff/custom_derivatives.h"
#include "autodiff/partial_eval.h"
#include "core/lax/linalg.h"
#include "trace/eval_jaxpr.h"
#include "trace/jaxpr_trace.h"

namespace cjax {

std::string CheckpointPolicy::str() const {
  auto names = [&] {
    std::string s;
    for (const std::string& p : primitives) s += (s.empty() ? "'" : ", '") + p + "'";
    return s;
  };
  switch (kind) {
    case Kind::NothingSaveable: return "None";
    case Kind::EverythingSaveable: return "everything_saveable";
    case Kind::DotsSaveable: return "dots_saveable";
    case Kind::DotsWithNoBatchDimsSaveable: return "dots_with_no_batch_dims_saveable";
    case Kind::SaveEverythingExcept: return "save_everything_except(" + names() + ")";
    case Kind::SaveOnlyThese: return "save_only_these(" + names() + ")";
  }
  return "None";
}

bool CheckpointPolicy::saveable(const std::string& primitive, bool has_batch_dims) const {
  auto listed = [&] { return std::find(primitives.begin(), primitives.end(), primitive) != primitives.end(); };
  switch (kind) {
    case Kind::NothingSaveable: return false;
    case Kind::EverythingSaveable: return true;
    case Kind::DotsSaveable: return primitive == "dot_general" || primitive == "conv_general_dilated";
    case Kind::DotsWithNoBatchDimsSaveable: return primitive == "dot_general" && !has_batch_dims;
    case Kind::SaveEverythingExcept: return !listed();
    case Kind::SaveOnlyThese: return listed();
  }
  return false;
}

namespace custom_detail {
namespace {

struct PolicyParam final : ParamObject {
  explicit PolicyParam(CheckpointPolicy p) : policy(std::move(p)) {}
  CheckpointPolicy policy;
  std::string str() const override { return policy.str(); }
  size_t hash() const override { return std::hash<std::string>()(policy.str()); }
  bool equals(const ParamObject& o) const override {
    auto* p = dynamic_cast<const PolicyParam*>(&o);
    return p && p->policy == policy;
  }
};

std::shared_ptr<const Jaxpr> jaxpr_of(const Params& p) { return p.object<JaxprParam>("jaxpr")->jaxpr; }
const CheckpointPolicy& policy_of(const Params& p) { return p.object<PolicyParam>("policy")->policy; }

const PrimitiveDef& g_remat = register_primitive([] {
  PrimitiveDef def;
  def.name = "remat2";
  def.kind = PrimKind::HigherOrder;
  def.arity = Arity::any();  // checked against the jaxpr
  def.abstract_eval = [](std::span<const Array> in, const Params& p) {
    auto j = jaxpr_of(p);
    if (in.size() != j->invars().size())
      throw Error(fmt::format("internal: remat2 with {} inputs for {} invars", in.size(), j->invars().size()));
    return j->out_avals();
  };
  def.impl = [](std::span<const Array> in, std::span<const AbstractValue>, const Params& p) {
    return eval_jaxpr(*jaxpr_of(p), {}, in);
  };
  return def;
}());

Params remat_params(std::shared_ptr<const Jaxpr> j, const Params& like, bool differentiated) {
  Params p = like;
  p.set("jaxpr", std::make_shared<const JaxprParam>(std::move(j)));
  p.set("differentiated", differentiated);
  return p;
}

// Binds remat2 for a traced call (its consts become leading inputs).
std::vector<Array> bind_remat(const TracedCall& call, std::span<const Array> args, const Params& like,
                              bool differentiated) {
  std::vector<Array> in = call.consts;
  in.insert(in.end(), args.begin(), args.end());
  return cjax::bind(g_remat, in, remat_params(call.jaxpr, like, differentiated));
}

JvpOut remat_jvp(std::span<const Array> primals, std::span<const Array> tangents, const Params& p) {
  auto j = jaxpr_of(p);
  size_t n = primals.size();
  std::vector<size_t> nz;
  for (size_t i = 0; i < n; ++i)
    if (tangents[i].defined()) nz.push_back(i);
  std::vector<Array> args(primals.begin(), primals.end());
  for (size_t i : nz) args.push_back(tangents[i]);
  TracedCall call = trace_to_call(
      [&](const std::vector<Array>& xs) {
        std::vector<Array> ps(xs.begin(), xs.begin() + std::ptrdiff_t(n)), ts(n);
        for (size_t k = 0; k < nz.size(); ++k) ts[nz[k]] = xs[n + k];
        JvpResult r = jvp_flat([&](const std::vector<Array>& a) { return eval_jaxpr(*j, {}, a); }, ps, ts);
        r.primals_out.insert(r.primals_out.end(), r.tangents_out.begin(), r.tangents_out.end());
        return r.primals_out;
      },
      avals_of(args));
  std::vector<Array> outs = bind_remat(call, args, p, p.get<bool>("differentiated"));
  size_t m = outs.size() / 2;
  return JvpOut{std::vector<Array>(outs.begin(), outs.begin() + std::ptrdiff_t(m)),
                std::vector<Array>(outs.begin() + std::ptrdiff_t(m), outs.end())};
}

bool eqn_saveable(const CheckpointPolicy& policy, const JaxprEqn& e) {
  bool batch_dims = false;
  if (e.primitive->name == "dot_general")
    batch_dims = !e.params.object<DotDimsParam>("dimension_numbers")->lhs_batch.empty();
  return policy.saveable(e.primitive->name, batch_dims);
}

using Env = std::unordered_map<const void*, Array>;
Array atom_value(const Env& env, const Atom& a) {
  if (auto* l = std::get_if<Literal>(&a)) return l->value();
  return env.at(std::get<Var>(a).id());
}
// Binds `e` under the current trace on its inputs' values in `env`, recording its outputs there.
void run_eqn(const JaxprEqn& e, Env& env) {
  std::vector<Array> in;
  for (const Atom& a : e.inputs) in.push_back(atom_value(env, a));
  std::vector<Array> out = cjax::bind(*e.primitive, in, e.params);
  for (size_t i = 0; i < out.size(); ++i) env[e.outputs[i].id()] = std::move(out[i]);
}

// The values of `targets` in `jaxpr`, evaluating (under the current trace) only the equations
// they depend on.
std::vector<Array> eval_needed(const Jaxpr& jaxpr, std::span<const Array> consts, std::span<const Array> args,
                               std::span<const Atom> targets) {
  std::unordered_set<const void*> needed;
  for (const Atom& a : targets)
    if (auto* v = std::get_if<Var>(&a)) needed.insert(v->id());
  std::vector<char> run(jaxpr.eqns().size(), 0);
  for (size_t k = jaxpr.eqns().size(); k-- > 0;) {
    const JaxprEqn& e = jaxpr.eqns()[k];
    for (const Var& o : e.outputs) run[k] = run[k] || needed.count(o.id());
    if (run[k])
      for (const Atom& a : e.inputs)
        if (auto* v = std::get_if<Var>(&a)) needed.insert(v->id());
  }
  Env env;
  for (size_t i = 0; i < consts.size(); ++i) env[jaxpr.constvars()[i].id()] = consts[i];
  for (size_t i = 0; i < args.size(); ++i) env[jaxpr.invars()[i].id()] = args[i];
  for (size_t k = 0; k < jaxpr.eqns().size(); ++k)
    if (run[k]) run_eqn(jaxpr.eqns()[k], env);
  std::vector<Array> out;
  for (const Atom& a : targets) out.push_back(atom_value(env, a));
  return out;
}

std::vector<Array> remat_partial_eval(std::span<const Array> inputs, std::span<const bool> known, const Params& p) {
  auto* staging = dynamic_cast<JaxprTrace*>(current_trace());
  if (!staging) throw Error("internal: remat2 partial eval outside a JaxprTrace");
  auto j = jaxpr_of(p);
  const CheckpointPolicy& policy = policy_of(p);

  // 1. Split by re-tracing, as partial_eval_jaxpr does: equations with known inputs are staged
  // into `known_trace`; the others (nested rules splitting mixed ones) into `unknown`, whose
  // constants are the candidate residuals.
  JaxprTrace known_trace;
  std::unique_ptr<JaxprTrace> unknown;
  std::vector<Array> known_in, unknown_in, known_outs, unknown_outs;
  std::vector<bool> out_unknown;
  {
    TraceScope ks(&known_trace);
    unknown = std::make_unique<JaxprTrace>(JaxprTrace::Mode::ForwardKnown);
    std::vector<Array> args;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const AbstractValue& aval = j->invars()[i].aval();
      args.push_back(known[i] ? known_trace.new_arg(aval) : unknown->new_arg(aval));
      (known[i] ? known_in : unknown_in).push_back(inputs[i]);
    }
    std::vector<Array> outs;
    {
      TraceScope us(unknown.get());
      outs = eval_jaxpr(*j, {}, args);
    }
    for (const Array& o : outs) {
      bool u = unknown->owns(o);
      out_unknown.push_back(u);
      (u ? unknown_outs : known_outs).push_back(o);
    }
  }
  ClosedJaxpr uj = dce_residuals(unknown->to_jaxpr(unknown_outs));
  std::vector<Array> known_results = known_outs;
  known_results.insert(known_results.end(), uj.consts.begin(), uj.consts.end());
  ClosedJaxpr kj = known_trace.to_jaxpr(known_results);
  const Jaxpr& K = *kj;
  const size_t n_known_out = known_outs.size();

  // 2. The policy: a candidate is saved if it is an input or constant or the policy saves the
  // equation producing it; otherwise that equation is recomputed, and its inputs become
  // candidates in turn.
  std::unordered_map<const void*, size_t> producer;
  for (size_t k = 0; k < K.eqns().size(); ++k)
    for (const Var& o : K.eqns()[k].outputs) producer[o.id()] = k;
  std::vector<char> recompute(K.eqns().size(), 0);
  std::vector<Atom> saved;
  std::unordered_set<const void*> visited;
  std::function<void(const Var&)> need = [&](const Var& v) {
    if (!visited.insert(v.id()).second) return;
    auto it = producer.find(v.id());
    if (it == producer.end() || eqn_saveable(policy, K.eqns()[it->second])) {
      saved.emplace_back(v);
      return;
    }
    if (recompute[it->second]) return;
    recompute[it->second] = 1;
    for (const Atom& a : K.eqns()[it->second].inputs)
      if (auto* iv = std::get_if<Var>(&a)) need(*iv);
  };
  for (size_t k = n_known_out; k < K.outvars().size(); ++k)
    if (auto* v = std::get_if<Var>(&K.outvars()[k])) need(*v);

  // 3. Known side, inline under the parent: the known outputs and the saved residuals.
  std::vector<Atom> targets(K.outvars().begin(), K.outvars().begin() + std::ptrdiff_t(n_known_out));
  targets.insert(targets.end(), saved.begin(), saved.end());
  std::vector<Array> kvals;
  {
    TraceScope ps(staging->parent());
    kvals = eval_needed(K, kj.consts, known_in, targets);
  }

  // 4. Unknown side: recompute what was not saved, then the unknown equations.
  std::vector<AbstractValue> in_avals;
  for (const Atom& a : saved) in_avals.push_back(atom_aval(a));
  for (const Array& x : unknown_in) in_avals.push_back(x.aval());
  const size_t ns = saved.size();
  TracedCall call = trace_to_call(
      [&](const std::vector<Array>& xs) {
        Env env;
        for (size_t k = 0; k < ns; ++k) env[std::get<Var>(saved[k]).id()] = xs[k];
        for (size_t k = 0; k < K.eqns().size(); ++k)
          if (recompute[k]) run_eqn(K.eqns()[k], env);
        std::vector<Array> consts;
        for (size_t k = n_known_out; k < K.outvars().size(); ++k) consts.push_back(atom_value(env, K.outvars()[k]));
        return eval_jaxpr(*uj, consts, std::vector<Array>(xs.begin() + std::ptrdiff_t(ns), xs.end()));
      },
      in_avals);

  // 5. Stage the unknown side as one remat2 equation and merge the outputs.
  std::vector<Array> staged_in = call.consts;
  staged_in.insert(staged_in.end(), kvals.begin() + std::ptrdiff_t(n_known_out), kvals.end());
  staged_in.insert(staged_in.end(), unknown_in.begin(), unknown_in.end());
  std::vector<Array> uouts;
  if (!call.jaxpr->outvars().empty())
    uouts = staging->stage(g_remat, staged_in, remat_params(call.jaxpr, p, true), call.jaxpr->out_avals());
  std::vector<Array> out;
  size_t ki = 0, ui = 0;
  for (bool u : out_unknown) out.push_back(u ? uouts[ui++] : kvals[ki++]);
  return out;
}

std::vector<Array> remat_transpose(std::span<const Array> cts, std::span<const Array> args, const Params& p) {
  TransposedCall t = transpose_call(*jaxpr_of(p), cts, args);
  // bind_remat prepends the call's consts itself.
  std::span<const Array> non_const(t.call_args.data() + t.call.consts.size(),
                                   t.call_args.size() - t.call.consts.size());
  std::vector<Array> outs = bind_remat(t.call, non_const, p, p.get<bool>("differentiated"));
  std::vector<Array> result(args.size());
  for (size_t k = 0; k < t.linear.size(); ++k) result[t.linear[k]] = outs[k];
  return result;
}

BatchOut remat_batch(std::span<const Array> args, std::span<const int> bdims, const BatchAxis& axis, const Params& p) {
  FrontBatched front = move_batch_to_front(args, bdims, axis.size);
  TracedCall call = batch_jaxpr_call(jaxpr_of(p), front, axis);
  std::vector<Array> outs = bind_remat(call, front.args, p, p.get<bool>("differentiated"));
  return BatchOut{outs, std::vector<int>(outs.size(), 0)};
}

const bool g_rules = add_rule_initializer([] {
  PrimitiveRules& r = define_rules("remat2");
  r.jvp = remat_jvp;
  r.partial_eval = remat_partial_eval;
  r.transpose = remat_transpose;
  r.batch = remat_batch;
});

}  // namespace

std::vector<Array> checkpoint_call(const FlatFn& f, const std::vector<Array>& args, const CheckpointPolicy& policy,
                                   bool prevent_cse) {
  TracedCall call = trace_to_call(f, avals_of(args));
  Params p;
  p.set("policy", std::make_shared<const PolicyParam>(policy));
  p.set("prevent_cse", prevent_cse);
  return bind_remat(call, args, p, false);
}

}  // namespace custom_detail
}  // namespace cjax
