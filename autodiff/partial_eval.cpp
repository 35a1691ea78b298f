#include "autodiff/partial_eval.h"

#include <fmt/format.h>

#include <unordered_set>

#include "trace/eval_jaxpr.h"
#include "trace/jaxpr_trace.h"

namespace cjax {
ClosedJaxpr dce_residuals(const ClosedJaxpr& traced) {
  std::shared_ptr<const Jaxpr> live = dce(*traced.jaxpr);
  const Jaxpr& j = *live;
  std::unordered_set<const void*> read;
  auto note = [&](const Atom& a) {
    if (auto* v = std::get_if<Var>(&a)) read.insert(v->id());
  };
  for (const JaxprEqn& e : j.eqns())
    for (const Atom& a : e.inputs) note(a);
  for (const Atom& a : j.outvars()) note(a);
  ClosedJaxpr out;
  std::vector<Var> constvars;
  for (size_t i = 0; i < j.constvars().size(); ++i)
    if (read.count(j.constvars()[i].id())) {
      constvars.push_back(j.constvars()[i]);
      out.consts.push_back(traced.consts[i]);
    }
  out.jaxpr = std::make_shared<const Jaxpr>(std::move(constvars), j.invars(), j.eqns(), j.outvars());
  return out;
}

PartialEvalResult partial_eval_jaxpr(const Jaxpr& jaxpr, const std::vector<bool>& unknown_inputs, bool instantiate) {
  if (!jaxpr.constvars().empty()) throw Error("internal: partial_eval_jaxpr of a jaxpr with constvars");
  if (unknown_inputs.size() != jaxpr.invars().size()) throw Error("internal: partial_eval_jaxpr input mask size");
  PartialEvalResult r;
  JaxprTrace known;  // stages the known side
  std::vector<Array> known_args, args;
  std::vector<Array> outs;
  std::unique_ptr<JaxprTrace> unknown;
  std::vector<Array> known_outs, unknown_outs;
  {
    TraceScope ks(&known);
    unknown = std::make_unique<JaxprTrace>(JaxprTrace::Mode::ForwardKnown);  // parent: `known`
    std::vector<Array> unknown_args;
    for (size_t i = 0; i < unknown_inputs.size(); ++i) {
      const AbstractValue& aval = jaxpr.invars()[i].aval();
      if (unknown_inputs[i]) {
        args.push_back(unknown->new_arg(aval));
      } else {
        Array a = known.new_arg(aval);
        known_args.push_back(a);
        args.push_back(a);
      }
    }
    {
      TraceScope us(unknown.get());
      outs = eval_jaxpr(jaxpr, {}, args);
    }
    for (const Array& o : outs) {
      bool unk = unknown->owns(o);
      if (!unk && instantiate) {
        // Forward the known value through the unknown side (it becomes a residual).
        TraceScope us(unknown.get());
        r.out_unknown.push_back(true);
        unknown_outs.push_back(o);
        continue;
      }
      r.out_unknown.push_back(unk);
      (unk ? unknown_outs : known_outs).push_back(o);
    }
  }
  // The unknown side's constants (known-side tracers or concrete values) are the residuals.
  ClosedJaxpr uj = dce_residuals(unknown->to_jaxpr(unknown_outs));
  r.num_residuals = uj.consts.size();
  std::vector<Array> known_results = known_outs;
  known_results.insert(known_results.end(), uj.consts.begin(), uj.consts.end());
  ClosedJaxpr kj = known.to_jaxpr(known_results);
  r.unknown = convert_constvars_to_invars(*uj);
  r.known = ClosedJaxpr{dce(*kj.jaxpr), std::move(kj.consts)};
  return r;
}

}  // namespace cjax
