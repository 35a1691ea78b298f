#include "autodiff/ad.h"

#include <fmt/format.h>

#include <unordered_map>

#include "autodiff/partial_eval.h"
#include "cjax/lax.h"
#include "core/lax/rule_support.h"
#include "trace/phase.h"
#include "trace/source_info.h"

namespace cjax {

void raise_missing_rule(const PrimitiveDef& def, std::string_view what) {
  throw ValueError(
      fmt::format("the {} rule for primitive '{}' is not implemented, so it cannot be {}; "
                  "wrap the value in lax::stop_gradient if no derivative is needed",
                  what, def.name,
                  what == "JVP"         ? "differentiated"
                  : what == "transpose" ? "transposed (reverse mode)"
                                        : "vmapped"));
}

Array JVPTracer::concrete_value() const {
  if (primal.impl()->is_concrete()) return primal;
  if (auto* t = dynamic_cast<const Tracer*>(primal.impl())) return t->concrete_value();
  return Array();
}
std::string JVPTracer::provenance() const {
  if (auto* t = dynamic_cast<const Tracer*>(primal.impl())) return t->provenance();
  return "";
}

JVPTrace::JVPTrace(Trace* tangent_ctx) : Trace(current_trace()), tangent_ctx_(tangent_ctx ? tangent_ctx : parent()) {}

Array JVPTrace::make_tracer(Array primal, Array tangent) {
  if (!tangent.defined()) return primal;
  return Array(std::make_shared<JVPTracer>(std::move(primal), std::move(tangent), this, ended_));
}

std::pair<Array, Array> JVPTrace::unpack(const Array& x, const PrimitiveDef* def) const {
  auto* t = dynamic_cast<Tracer*>(x.impl());
  if (!t) return {x, Array()};
  if (auto* jt = dynamic_cast<JVPTracer*>(t); jt && jt->trace == this && jt->is_live())
    return {jt->primal, jt->tangent};
  if (is_ancestor_of(*t, *this)) return {x, Array()};
  if (def) raise_escaped_tracer(x, *def);
  throw EscapedTracerError(fmt::format(
      "a value of type {} from a finished transformation was returned from a differentiated function; a tracer "
      "escaped its trace (for example it was stored in a global or captured by a lambda that outlived grad/jvp).{}",
      x.aval().str(), tracer_origin(x)));
}

std::string JVPTracer::created_at() const {
  for (const Array* a : {&primal, &tangent})
    if (auto* t = a->defined() ? dynamic_cast<const Tracer*>(a->impl()) : nullptr)
      if (std::string s = t->created_at(); !s.empty()) return s;
  return "";
}

std::vector<Array> JVPTrace::process_primitive(const PrimitiveDef& def, std::span<const Array> inputs,
                                               const Params& params) {
  std::vector<Array> primals, tangents;
  primals.reserve(inputs.size());
  tangents.reserve(inputs.size());
  for (const Array& x : inputs) {
    if (!x.defined()) throw ValueError(fmt::format("'{}' received an empty Array handle", def.name));
    auto [p, t] = unpack(x, &def);
    primals.push_back(std::move(p));
    tangents.push_back(std::move(t));
  }
  if (!any_defined(tangents)) {
    TraceScope scope(parent());
    return cjax::bind(def, primals, params);
  }
  const PrimitiveRules* rules = find_rules(def);
  if (!rules || !rules->jvp) raise_missing_rule(def, "JVP");
  JvpOut out;
  {
    TraceScope scope(tangent_ctx_);
    out = rules->jvp(primals, tangents, params);
  }
  if (out.tangents.size() != out.primals.size())
    throw Error(fmt::format("internal: JVP rule of '{}' returned {} primals and {} tangents", def.name,
                            out.primals.size(), out.tangents.size()));
  std::vector<Array> result;
  result.reserve(out.primals.size());
  for (size_t i = 0; i < out.primals.size(); ++i) {
    Array t = is_floating(out.primals[i].dtype()) ? std::move(out.tangents[i]) : Array();
    result.push_back(make_tracer(std::move(out.primals[i]), std::move(t)));
  }
  return result;
}

namespace {

void check_tangent(const Array& p, const Array& t, size_t i) {
  if (!t.defined()) return;
  if (t.shape() != p.shape() || t.dtype() != p.dtype())
    throw ValueError(
        fmt::format("jvp: tangent {} has type {} but its primal has type {}; a tangent must have "
                    "the primal's shape and dtype",
                    i, t.aval().str(), p.aval().str()));
}

}  // namespace

JvpResult jvp_flat(const FlatFn& f, std::span<const Array> primals, std::span<const Array> tangents) {
  if (primals.size() != tangents.size())
    throw ValueError(
        fmt::format("jvp: {} primals but {} tangents; pass one tangent per primal", primals.size(), tangents.size()));
  JVPTrace trace;
  std::vector<Array> in;
  in.reserve(primals.size());
  for (size_t i = 0; i < primals.size(); ++i) {
    check_tangent(primals[i], tangents[i], i);
    in.push_back(trace.make_tracer(primals[i], is_floating(primals[i].dtype()) ? tangents[i] : Array()));
  }
  std::vector<Array> outs;
  {
    TraceScope scope(&trace);
    outs = f(in);
  }
  JvpResult r;
  for (const Array& o : outs) {
    auto [p, t] = trace.unpack(o, nullptr);
    r.tangents_out.push_back(instantiate_zero(t, p.aval()));
    r.primals_out.push_back(std::move(p));
  }
  return r;
}

LinearizeResult linearize_flat(const FlatFn& f, std::span<const Array> primals) {
  JaxprTrace lin(JaxprTrace::Mode::ForwardKnown);
  JVPTrace trace(&lin);
  LinearizeResult r;
  std::vector<Array> in;
  in.reserve(primals.size());
  for (const Array& p : primals) {
    bool diff = is_floating(p.dtype());
    r.diff_inputs.push_back(diff);
    in.push_back(diff ? trace.make_tracer(p, lin.new_arg(p.aval())) : p);
  }
  std::vector<Array> outs;
  {
    TraceScope scope(&trace);
    outs = f(in);
  }
  std::vector<Array> tangents_out;
  for (const Array& o : outs) {
    auto [p, t] = trace.unpack(o, nullptr);
    if (!t.defined()) {
      TraceScope scope(&lin);
      t = zeros_like_aval(p.aval());
    }
    tangents_out.push_back(std::move(t));
    r.primals_out.push_back(std::move(p));
  }
  r.linear = dce_residuals(lin.to_jaxpr(tangents_out));  // residuals of dead tangents are not kept
  return r;
}

namespace {

// Set while linear_transpose runs its backward pass: equations are checked for linearity.
thread_local bool tl_check_linearity = false;

class CheckLinearityScope {
 public:
  explicit CheckLinearityScope(bool on) : saved_(tl_check_linearity) { tl_check_linearity = on; }
  ~CheckLinearityScope() { tl_check_linearity = saved_; }
  CheckLinearityScope(const CheckLinearityScope&) = delete;
  CheckLinearityScope& operator=(const CheckLinearityScope&) = delete;

 private:
  bool saved_;
};

// "f32[3] = mul f32[3] f32[3]", literals by value.
std::string describe_eqn(const JaxprEqn& e) {
  std::string outs, ins;
  for (const Var& v : e.outputs) outs += (outs.empty() ? "" : " ") + v.aval().str();
  for (const Atom& a : e.inputs) {
    if (auto* l = std::get_if<Literal>(&a))
      ins += " " + l->value_str() + ":" + l->aval().str();
    else
      ins += " " + atom_aval(a).str();
  }
  return outs + " = " + e.primitive->name + ins;
}

// Raises if equation `e`, some of whose inputs are linear (`lin[i]`), is not linear in them.
void check_linear_eqn(const JaxprEqn& e, const std::vector<bool>& lin) {
  const std::string& name = e.primitive->name;
  auto fail = [&](const std::string& why) {
    std::string where = e.source_info ? e.source_info->str() : "";
    throw ValueError(
        fmt::
            format("linear_transpose: the function is not linear in its inputs: {} (equation `{}`{}). linear_transpose "
                   "transposes functions built from linear operations of the inputs: sums and differences, negation, "
                   "products and dot_generals with values that do not depend on the inputs, broadcasts, reshapes, "
                   "slices, concatenations and sums; use vjp for a non-linear function",
                   why, describe_eqn(e), where.empty() ? "" : " at " + where));
  };
  size_t n_lin = 0;
  for (size_t i = 0; i < lin.size(); ++i) {
    if (!lin[i]) continue;
    ++n_lin;
    const AbstractValue& av = atom_aval(e.inputs[i]);
    if (!is_floating(av.dtype))
      fail(fmt::format("'{}' takes operand {} of type {}, computed from the inputs, which is not floating", name, i,
                       av.str()));
  }
  const PrimitiveRules* rules = find_rules(*e.primitive);
  if (!rules || !rules->transpose)
    fail(fmt::format("'{}' is applied to a value computed from the inputs and is not a linear operation", name));
  if (e.primitive->kind != PrimKind::HigherOrder)
    for (const Var& v : e.outputs)
      if (!is_floating(v.aval().dtype))
        fail(fmt::format("'{}' turns a value computed from the inputs into {}, which is not floating", name,
                         v.aval().str()));
  // Bilinear primitives are linear in one operand at a time.
  if ((name == "mul" || name == "dot_general" || name == "conv_general_dilated") && n_lin > 1)
    fail(fmt::format("'{}' multiplies two values that both depend on the inputs", name));
  if (name == "scatter-mul" && lin.size() > 2 && lin[0] && lin[2])
    fail("'scatter-mul' multiplies two values that both depend on the inputs");
  if (name == "div" && lin.size() > 1 && lin[1]) fail("'div' divides by a value that depends on the inputs");
  if (name == "while")
    fail("'while' is a loop whose trip count is not static; use lax::fori_loop with static bounds or lax::scan");
}

}  // namespace

std::vector<Array> transpose_linear(const Jaxpr& jaxpr, std::span<const Array> consts, std::span<const Array> cts_out) {
  CheckLinearityScope scope(true);
  return backward_pass(jaxpr, consts, cts_out);
}

std::vector<Array> backward_pass(const Jaxpr& jaxpr, std::span<const Array> consts, std::span<const Array> cts_out) {
  std::vector<Array> args;
  for (const Var& v : jaxpr.invars()) args.push_back(make_undefined_primal(v.aval()));
  return backward_pass(jaxpr, consts, args, cts_out);
}

std::vector<Array> backward_pass(const Jaxpr& jaxpr, std::span<const Array> consts, std::span<const Array> args,
                                 std::span<const Array> cts_out) {
  BackwardPassScope backward_phase;  // equations traced from here on are the backward pass's
  std::unordered_map<const void*, Array> env;  // values of non-linear variables
  std::unordered_map<const void*, Array> ct;   // accumulated cotangents of linear variables
  std::unordered_map<const void*, bool> linear;
  for (size_t i = 0; i < jaxpr.constvars().size(); ++i) env[jaxpr.constvars()[i].id()] = consts[i];
  for (size_t i = 0; i < jaxpr.invars().size(); ++i) {
    if (is_undefined_primal(args[i]))
      linear[jaxpr.invars()[i].id()] = true;
    else
      env[jaxpr.invars()[i].id()] = args[i];
  }
  auto is_linear = [&](const Atom& a) {
    auto* v = std::get_if<Var>(&a);
    return v && linear.count(v->id());
  };
  auto value = [&](const Atom& a) -> Array {
    if (auto* l = std::get_if<Literal>(&a)) return l->value();
    return env.at(std::get<Var>(a).id());
  };
  // Forward: equations that do not touch the linear inputs are evaluated (JAX does the same);
  // the others are linear and transposed below.
  std::vector<const JaxprEqn*> linear_eqns;
  for (const JaxprEqn& e : jaxpr.eqns()) {
    bool lin = false;
    for (const Atom& a : e.inputs) lin = lin || is_linear(a);
    if (lin) {
      if (tl_check_linearity) {
        std::vector<bool> flags;
        for (const Atom& a : e.inputs) flags.push_back(is_linear(a));
        check_linear_eqn(e, flags);
      }
      for (const Var& v : e.outputs) linear[v.id()] = true;
      linear_eqns.push_back(&e);
      continue;
    }
    std::vector<Array> in;
    for (const Atom& a : e.inputs) in.push_back(value(a));
    std::vector<Array> out = cjax::bind(*e.primitive, in, e.params);
    for (size_t i = 0; i < out.size(); ++i) env[e.outputs[i].id()] = std::move(out[i]);
  }
  auto accumulate = [&](const Var& v, const Array& c) {
    if (!c.defined()) return;
    auto [it, fresh] = ct.try_emplace(v.id(), c);
    if (!fresh) it->second = add_tangents(it->second, c);
  };
  for (size_t i = 0; i < jaxpr.outvars().size(); ++i)
    if (is_linear(jaxpr.outvars()[i]) && i < cts_out.size()) accumulate(std::get<Var>(jaxpr.outvars()[i]), cts_out[i]);

  for (auto it = linear_eqns.rbegin(); it != linear_eqns.rend(); ++it) {
    const JaxprEqn& e = **it;
    std::vector<Array> cts;
    bool any = false;
    for (const Var& v : e.outputs) {
      auto c = ct.find(v.id());
      if (c == ct.end()) {
        cts.emplace_back();
      } else {
        cts.push_back(std::move(c->second));
        ct.erase(c);
        any = true;
      }
    }
    if (!any) continue;
    for (size_t i = 0; i < cts.size(); ++i)
      if (!cts[i].defined()) cts[i] = zeros_like_aval(e.outputs[i].aval());
    std::vector<Array> args;
    for (const Atom& a : e.inputs) args.push_back(is_linear(a) ? make_undefined_primal(atom_aval(a)) : value(a));
    const PrimitiveRules* rules = find_rules(*e.primitive);
    if (!rules || !rules->transpose) raise_missing_rule(*e.primitive, "transpose");
    std::vector<Array> in_cts = rules->transpose(cts, args, e.params);
    if (in_cts.size() != e.inputs.size())
      throw Error(fmt::format("internal: transpose rule of '{}' returned {} cotangents for {} inputs",
                              e.primitive->name, in_cts.size(), e.inputs.size()));
    for (size_t i = 0; i < in_cts.size(); ++i)
      if (is_linear(e.inputs[i])) accumulate(std::get<Var>(e.inputs[i]), in_cts[i]);
  }
  std::vector<Array> out;
  for (const Var& v : jaxpr.invars()) {
    if (!linear.count(v.id())) {
      out.emplace_back();
      continue;
    }
    auto c = ct.find(v.id());
    out.push_back(c == ct.end() ? Array() : c->second);
  }
  return out;
}

TransposedCall transpose_call(const Jaxpr& jaxpr, std::span<const Array> cts, std::span<const Array> args) {
  TransposedCall t;
  std::vector<size_t> nonlin;
  for (size_t i = 0; i < args.size(); ++i) (is_undefined_primal(args[i]) ? t.linear : nonlin).push_back(i);
  std::vector<AbstractValue> in_avals;
  for (size_t i : nonlin) in_avals.push_back(args[i].aval());
  for (const Array& c : cts) in_avals.push_back(c.aval());
  t.call = trace_to_call(
      [&](const std::vector<Array>& xs) {
        std::vector<Array> a(args.size());
        for (size_t k = 0; k < nonlin.size(); ++k) a[nonlin[k]] = xs[k];
        for (size_t i : t.linear) a[i] = make_undefined_primal(args[i].aval());
        std::vector<Array> c(xs.begin() + std::ptrdiff_t(nonlin.size()), xs.end());
        std::vector<Array> res = backward_pass(jaxpr, {}, a, c);
        std::vector<Array> out;
        for (size_t i : t.linear) out.push_back(instantiate_zero(res[i], args[i].aval()));
        return out;
      },
      in_avals);
  t.call_args = t.call.consts;
  for (size_t i : nonlin) t.call_args.push_back(args[i]);
  t.call_args.insert(t.call_args.end(), cts.begin(), cts.end());
  return t;
}

VjpResult vjp_flat(const FlatFn& f, std::span<const Array> primals) {
  auto lin = std::make_shared<LinearizeResult>(linearize_flat(f, primals));
  std::vector<AbstractValue> in_avals;
  for (const Array& p : primals) in_avals.push_back(p.aval());
  VjpResult r;
  r.primals_out = lin->primals_out;
  r.backward = [lin, in_avals](std::span<const Array> cts_out) {
    const auto& outs = lin->primals_out;
    if (cts_out.size() != outs.size())
      throw ValueError(
          fmt::format("vjp: the function has {} outputs but {} cotangents were given", outs.size(), cts_out.size()));
    for (size_t i = 0; i < outs.size(); ++i)
      if (cts_out[i].defined() && (cts_out[i].shape() != outs[i].shape() || cts_out[i].dtype() != outs[i].dtype()))
        throw ValueError(
            fmt::format("vjp: cotangent {} has type {} but the output has type {}; pass a cotangent "
                        "of the output's shape and dtype",
                        i, cts_out[i].aval().str(), outs[i].aval().str()));
    CheckLinearityScope unchecked(false);  // a linearized jaxpr is linear by construction
    std::vector<Array> cts = backward_pass(*lin->linear, lin->linear.consts, cts_out);
    std::vector<Array> result;
    size_t k = 0;
    for (size_t i = 0; i < in_avals.size(); ++i) {
      Array c = lin->diff_inputs[i] ? cts[k++] : Array();
      result.push_back(instantiate_zero(c, in_avals[i]));
    }
    return result;
  };
  return r;
}

}  // namespace cjax
