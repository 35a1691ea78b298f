#include "trace/jaxpr_trace.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <unordered_map>

#include "core/array/rules.h"
#include "core/array/spmd.h"
#include "core/array/util.h"
#include "core/spmd/collectives.h"
#include "trace/eval_jaxpr.h"
#include "trace/phase.h"

namespace cjax {

struct JaxprTraceState {
  bool ended = false;
  std::vector<Var> invars, constvars;
  std::vector<Array> consts;  // keeps the constants alive, so their addresses stay unique keys
  std::unordered_map<const ArrayImpl*, Var> const_vars;
  std::vector<JaxprEqn> eqns;
  // Provenance for concretization errors: the input indices each variable depends on.
  std::string purpose = "make_jaxpr";
  std::vector<std::string> arg_names;
  std::unordered_map<const void*, std::vector<int>> deps;
};

JaxprTrace::JaxprTrace(Mode mode) : Trace(current_trace()), mode_(mode), state_(std::make_shared<JaxprTraceState>()) {}
JaxprTrace::~JaxprTrace() { state_->ended = true; }
bool JaxprTrace::ended() const { return state_->ended; }

void JaxprTrace::set_purpose(std::string what) { state_->purpose = std::move(what); }

std::string JaxprTracer::provenance() const {
  auto it = state->deps.find(var.id());
  std::string s = "while tracing for " + state->purpose;
  if (it == state->deps.end() || it->second.empty()) return s + "; it does not depend on the function's arguments";
  s += ": it depends on ";
  for (size_t k = 0; k < it->second.size() && k < 4; ++k) {
    int i = it->second[k];
    std::string n = size_t(i) < state->arg_names.size() && !state->arg_names[size_t(i)].empty()
                        ? state->arg_names[size_t(i)]
                        : "input " + std::to_string(i);
    s += (k ? ", " : "") + n;
  }
  if (it->second.size() > 4) s += fmt::format(" and {} more inputs", it->second.size() - 4);
  return s;
}

Array JaxprTrace::new_arg(const AbstractValue& aval, std::string name) {
  if (state_->ended) throw Error("internal: JaxprTrace::new_arg on a finished trace");
  Var v(aval);
  int index = int(state_->invars.size());
  state_->deps[v.id()] = {index};
  if (state_->arg_names.size() <= size_t(index)) state_->arg_names.resize(size_t(index) + 1);
  state_->arg_names[size_t(index)] = std::move(name);
  state_->invars.push_back(v);
  auto t = std::make_shared<JaxprTracer>(std::move(v), this, state_);
  t->source = SourceInfo::capture();
  return Array(std::move(t));
}

bool check_jaxprs_enabled() {
#ifndef NDEBUG
  return true;
#else
  static const bool on = env_flag("CJAX_CHECK_JAXPRS");
  return on;
#endif
}

bool JaxprTracer::is_live() const { return !state->ended; }

bool JaxprTrace::is_ancestor(const Tracer& t) const { return is_ancestor_of(t, *this); }

Atom JaxprTrace::to_atom(const Array& x, const PrimitiveDef* def, size_t out_index) {
  if (!x.defined()) {
    if (def) throw ValueError(fmt::format("'{}' received an empty Array handle", def->name));
    throw ValueError(
        fmt::format("make_jaxpr: output {} of the function is an empty Array handle; return defined Arrays",
                    out_index));
  }
  ArrayImpl* impl = x.impl();
  if (impl->is_concrete())
    static_cast<ConcreteArray*>(impl)->await_live(def ? fmt::format("'{}'", def->name) : std::string("make_jaxpr"));
  if (impl->is_concrete() && x.ndim() == 0) return Literal(x);
  if (auto* jt = dynamic_cast<JaxprTracer*>(impl); jt && jt->state == state_) return jt->var;
  auto* t = dynamic_cast<Tracer*>(impl);
  if (impl->is_concrete() || (t && is_ancestor(*t))) {
    auto it = state_->const_vars.find(impl);
    if (it != state_->const_vars.end()) return it->second;
    Var v(x.aval());
    state_->constvars.push_back(v);
    state_->consts.push_back(x);
    state_->const_vars.emplace(impl, v);
    return v;
  }
  if (t) {
    if (def) raise_escaped_tracer(x, *def);
    throw EscapedTracerError(
        fmt::
            format("make_jaxpr: output {} of the function is an intermediate value of type {} from a finished "
                   "transformation. A tracer escaped its trace (for example it was stored in a global or captured by a "
                   "lambda that outlived jit/grad/make_jaxpr); return it from the transformed function instead.{}",
                   out_index, x.aval().str(), tracer_origin(x)));
  }
  throw ValueError(
      fmt::format("{} received an abstract value {} that has no data and belongs to no trace; pass a concrete Array or "
                  "a value computed from the traced arguments",
                  def ? fmt::format("'{}'", def->name) : fmt::format("make_jaxpr (output {})", out_index),
                  x.aval().str()));
}

bool JaxprTrace::owns(const Array& x) const {
  auto* jt = dynamic_cast<const JaxprTracer*>(x.impl());
  return jt && jt->state == state_ && !state_->ended;
}

std::vector<Array> JaxprTrace::process_primitive(const PrimitiveDef& def, std::span<const Array> inputs,
                                                 const Params& params) {
  if (state_->ended) throw Error(fmt::format("internal: '{}' bound to a finished JaxprTrace", def.name));
  std::vector<Array> lifted;
  if (has_standard_vma_rule(def) && vmas_differ(inputs)) {  // auto-pvary (docs/shard_map.md §2.3)
    std::vector<std::string> all = common_vma(inputs);
    lifted.assign(inputs.begin(), inputs.end());
    for (Array& x : lifted) {
      std::vector<std::string> missing = vma_minus(all, x.aval().vma);
      if (!missing.empty()) x = process_primitive(g_pvary, std::span<const Array>(&x, 1), pvary_params(missing))[0];
    }
    inputs = lifted;
  }
  if (mode_ == Mode::ForwardKnown) {
    std::vector<bool> known(inputs.size());
    bool all_known = true, any_known = false;
    for (size_t i = 0; i < inputs.size(); ++i) {
      known[i] = !owns(inputs[i]);
      all_known = all_known && known[i];
      any_known = any_known || known[i];
    }
    if (all_known) {
      TraceScope scope(parent());
      return bind(def, inputs, params);
    }
    if (any_known) {
      const PrimitiveRules* rules = find_rules(def);
      if (rules && rules->partial_eval) {
        std::unique_ptr<bool[]> k(new bool[known.size()]);
        for (size_t i = 0; i < known.size(); ++i) k[i] = known[i];
        return rules->partial_eval(inputs, std::span<const bool>(k.get(), known.size()), params);
      }
    }
  }
  return stage(def, inputs, params, infer_avals(def, inputs, params));
}

std::vector<Array> JaxprTrace::stage(const PrimitiveDef& def, std::span<const Array> inputs, const Params& params,
                                     std::vector<AbstractValue> out_avals) {
  JaxprEqn eqn;
  eqn.primitive = &def;
  eqn.inputs.reserve(inputs.size());
  for (const Array& x : inputs) eqn.inputs.push_back(to_atom(x, &def, 0));
  std::vector<Array> outs;
  outs.reserve(out_avals.size());
  eqn.outputs.reserve(out_avals.size());
  std::vector<int> deps;
  for (const Atom& a : eqn.inputs)
    if (auto* v = std::get_if<Var>(&a)) {
      auto it = state_->deps.find(v->id());
      if (it == state_->deps.end()) continue;
      for (int d : it->second)
        if (std::find(deps.begin(), deps.end(), d) == deps.end()) deps.push_back(d);
    }
  std::sort(deps.begin(), deps.end());
  for (AbstractValue& a : out_avals) {
    Var v(std::move(a));
    if (!deps.empty()) state_->deps[v.id()] = deps;
    eqn.outputs.push_back(v);
    outs.emplace_back(std::make_shared<JaxprTracer>(std::move(v), this, state_));
  }
  eqn.params = params;
  eqn.source_info = SourceInfo::capture();
  if (in_backward_pass()) mark_backward(eqn.source_info);
  for (Array& o : outs) static_cast<JaxprTracer*>(o.impl())->source = eqn.source_info;
  state_->eqns.push_back(std::move(eqn));
  return outs;
}

ClosedJaxpr JaxprTrace::to_jaxpr(std::span<const Array> outputs) {
  if (state_->ended) throw Error("internal: JaxprTrace::to_jaxpr on a finished trace");
  std::vector<Atom> outvars;
  outvars.reserve(outputs.size());
  for (size_t i = 0; i < outputs.size(); ++i) outvars.push_back(to_atom(outputs[i], nullptr, i));
  state_->ended = true;
  ClosedJaxpr out;
  out.jaxpr = std::make_shared<const Jaxpr>(std::move(state_->constvars), std::move(state_->invars),
                                            std::move(state_->eqns), std::move(outvars));
  out.consts = std::move(state_->consts);
  state_->const_vars.clear();
  if (check_jaxprs_enabled()) check_jaxpr(*out.jaxpr);
  return out;
}

namespace jaxpr_detail {
ClosedJaxpr trace_flat(const std::function<std::vector<Array>(const std::vector<Array>&)>& f,
                       const std::vector<AbstractValue>& in_avals, const std::string& what,
                       const std::vector<std::string>& arg_names) {
  JaxprTrace trace;
  trace.set_purpose(what);
  std::vector<Array> args;
  args.reserve(in_avals.size());
  for (size_t i = 0; i < in_avals.size(); ++i)
    args.push_back(trace.new_arg(in_avals[i], i < arg_names.size() ? arg_names[i] : ""));
  std::vector<Array> outs;
  {
    TraceScope scope(&trace);
    outs = f(args);
  }
  return trace.to_jaxpr(outs);
}
}  // namespace jaxpr_detail

std::shared_ptr<const Jaxpr> convert_constvars_to_invars(const Jaxpr& jaxpr) {
  std::vector<Var> invars = jaxpr.constvars();
  invars.insert(invars.end(), jaxpr.invars().begin(), jaxpr.invars().end());
  return std::make_shared<const Jaxpr>(std::vector<Var>{}, std::move(invars), jaxpr.eqns(), jaxpr.outvars());
}

TracedCall trace_to_call(const std::function<std::vector<Array>(const std::vector<Array>&)>& f,
                         const std::vector<AbstractValue>& in_avals) {
  ClosedJaxpr cj = jaxpr_detail::trace_flat(f, in_avals);
  return TracedCall{convert_constvars_to_invars(*cj), cj.consts};
}

}  // namespace cjax
