#include "trace/eval_jaxpr.h"

#include <fmt/format.h>

#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "core/array/array_impl.h"
#include "core/array/rules.h"

namespace cjax {
namespace {

std::string shape_str(const Shape& s) {
  std::string r = "(";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  if (s.size() == 1) r += ",";
  return r + ")";
}

void check_args(const char* what, const std::vector<Var>& vars, std::span<const Array> vals) {
  if (vars.size() != vals.size())
    throw ValueError(
        fmt::format("eval_jaxpr: the jaxpr has {} {}, but {} values were passed; pass exactly one "
                    "value per {}",
                    vars.size(), what, vals.size(), what == std::string("invars") ? "input" : "constvar"));
  for (size_t i = 0; i < vars.size(); ++i) {
    if (!vals[i].defined())
      throw ValueError(fmt::format("eval_jaxpr: {} {} is an empty Array handle; pass a defined Array", what, i));
    const AbstractValue& want = vars[i].aval();
    const AbstractValue& got = vals[i].aval();
    if (want.shape != got.shape)
      throw ShapeError(
          fmt::format("eval_jaxpr: {} {} has type {} (shape {}), but the jaxpr expects {} (shape {}); "
                      "pass an array of the traced shape",
                      what, i, got.str(), shape_str(got.shape), want.str(), shape_str(want.shape)));
    if (want.dtype != got.dtype)
      throw DTypeError(
          fmt::format("eval_jaxpr: {} {} has type {} (dtype {}), but the jaxpr expects {} (dtype {}); "
                      "convert it with astype",
                      what, i, got.str(), dtype_name(got.dtype), want.str(), dtype_name(want.dtype)));
  }
}

// One equation's text, e.g. "c:f32[3] = add b a" (names local to the equation).
std::string eqn_str(const JaxprEqn& e) {
  std::vector<Var> ins;
  for (const Atom& a : e.inputs)
    if (auto* v = std::get_if<Var>(&a)) {
      bool seen = false;
      for (const Var& w : ins) seen = seen || w == *v;
      if (!seen && v->defined()) ins.push_back(*v);
    }
  std::vector<Atom> outs;
  for (const Var& v : e.outputs) outs.push_back(v);
  std::string t = Jaxpr({}, ins, {e}, outs).pretty_print(1 << 20);
  size_t b = t.find(". let ");
  size_t en = t.rfind(" in (");
  if (b == std::string::npos || en == std::string::npos || en < b + 6) return t;
  return t.substr(b + 6, en - (b + 6));
}

}  // namespace

std::vector<Array> eval_jaxpr(const Jaxpr& jaxpr, std::span<const Array> consts, std::span<const Array> args) {
  check_args("constvars", jaxpr.constvars(), consts);
  check_args("invars", jaxpr.invars(), args);
  std::unordered_map<const void*, Array> env;
  for (size_t i = 0; i < consts.size(); ++i) env[jaxpr.constvars()[i].id()] = consts[i];
  for (size_t i = 0; i < args.size(); ++i) env[jaxpr.invars()[i].id()] = args[i];
  auto read = [&](const Atom& a, const char* where) -> Array {
    if (auto* l = std::get_if<Literal>(&a)) return l->value();
    auto it = env.find(std::get<Var>(a).id());
    if (it == env.end())
      throw Error(
          fmt::format("eval_jaxpr: {} uses a variable of type {} that is not defined before it; "
                      "validate the jaxpr with check_jaxpr",
                      where, std::get<Var>(a).aval().str()));
    return it->second;
  };
  std::vector<Array> ins;
  for (const JaxprEqn& e : jaxpr.eqns()) {
    ins.clear();
    for (const Atom& a : e.inputs) ins.push_back(read(a, e.primitive->name.c_str()));
    std::vector<Array> outs = bind(*e.primitive, std::span<const Array>(ins), e.params);
    if (outs.size() != e.outputs.size())
      throw Error(fmt::format("eval_jaxpr: {} returned {} outputs, but its equation has {}", e.primitive->name,
                              outs.size(), e.outputs.size()));
    for (size_t i = 0; i < outs.size(); ++i) env[e.outputs[i].id()] = std::move(outs[i]);
  }
  std::vector<Array> result;
  result.reserve(jaxpr.outvars().size());
  for (const Atom& a : jaxpr.outvars()) result.push_back(read(a, "an output"));
  return result;
}

std::vector<Array> eval_jaxpr(const ClosedJaxpr& jaxpr, std::span<const Array> args) {
  if (!jaxpr.jaxpr) throw ValueError("eval_jaxpr: the ClosedJaxpr holds no jaxpr");
  return eval_jaxpr(*jaxpr.jaxpr, jaxpr.consts, args);
}

namespace {

void check_rec(const Jaxpr& jaxpr, const std::string& where) {
  std::unordered_set<const void*> defined;
  // `ctx` builds the description only for an error: it may symbolize a source location.
  auto define = [&](const Var& v, const auto& ctx) {
    if (!v.defined()) throw Error(fmt::format("check_jaxpr{}: {} defines an empty variable", where, ctx()));
    if (!defined.insert(v.id()).second)
      throw Error(fmt::format("check_jaxpr{}: {} redefines variable of type {} that is already defined", where, ctx(),
                              v.aval().str()));
  };
  for (size_t i = 0; i < jaxpr.constvars().size(); ++i)
    define(jaxpr.constvars()[i], [&] { return fmt::format("constvar {}", i); });
  for (size_t i = 0; i < jaxpr.invars().size(); ++i)
    define(jaxpr.invars()[i], [&] { return fmt::format("invar {}", i); });
  const auto& eqns = jaxpr.eqns();
  for (size_t k = 0; k < eqns.size(); ++k) {
    const JaxprEqn& e = eqns[k];
    auto ctx = [&] {
      std::string at = e.source_info ? e.source_info->str() : "";
      return fmt::format("equation {} `{}`{}", k, eqn_str(e), at.empty() ? "" : " (traced at " + at + ")");
    };
    if (!e.primitive) throw Error(fmt::format("check_jaxpr{}: equation {} has no primitive", where, k));
    std::vector<Array> ins;
    for (size_t i = 0; i < e.inputs.size(); ++i) {
      const Atom& a = e.inputs[i];
      if (auto* l = std::get_if<Literal>(&a)) {
        ins.push_back(l->value());
        continue;
      }
      const Var& v = std::get<Var>(a);
      if (!v.defined() || !defined.count(v.id()))
        throw Error(fmt::format("check_jaxpr{}: {}: input {} (a variable of type {}) is used before it is defined",
                                where, ctx(), i, v.defined() ? v.aval().str() : "<empty>"));
      ins.push_back(make_abstract(v.aval()));
    }
    std::optional<AxisEnvScope> manual;  // a shard_map body is checked with its manual axes bound
    if (const PrimitiveRules* r = find_rules(*e.primitive); r && r->body_manual_axes)
      manual.emplace(r->body_manual_axes(e.params));
    for (const auto& [name, val] : e.params.items())
      if (auto* obj = std::get_if<std::shared_ptr<const ParamObject>>(&val)) {
        if (auto* jp = dynamic_cast<const JaxprParam*>(obj->get()); jp && jp->jaxpr)
          check_rec(*jp->jaxpr, fmt::format("{} (in param {} of equation {} `{}`)", where, name, k, eqn_str(e)));
        if (auto* jl = dynamic_cast<const JaxprListParam*>(obj->get()))
          for (size_t b = 0; b < jl->jaxprs.size(); ++b)
            if (jl->jaxprs[b])
              check_rec(*jl->jaxprs[b],
                        fmt::format("{} (in param {}[{}] of equation {} `{}`)", where, name, b, k, eqn_str(e)));
      }
    std::vector<AbstractValue> want;
    try {
      want = infer_avals(*e.primitive, std::span<const Array>(ins), e.params);
    } catch (const Error& err) {
      throw Error(fmt::format("check_jaxpr{}: {}: abstract evaluation of {} failed: {}", where, ctx(),
                              e.primitive->name, err.what()));
    }
    if (want.size() != e.outputs.size())
      throw Error(fmt::format("check_jaxpr{}: {}: {} gives {} outputs, but the equation has {}", where, ctx(),
                              e.primitive->name, want.size(), e.outputs.size()));
    for (size_t i = 0; i < want.size(); ++i) {
      const Var& o = e.outputs[i];
      if (!o.defined()) throw Error(fmt::format("check_jaxpr{}: {}: output {} is an empty variable", where, ctx(), i));
      if (!(o.aval() == want[i]))
        throw Error(fmt::format("check_jaxpr{}: {}: output {} has type {}{}, but {} gives {}{}", where, ctx(), i,
                                o.aval().str(), o.aval().weak_type ? " (weak)" : "", e.primitive->name, want[i].str(),
                                want[i].weak_type ? " (weak)" : ""));
    }
    for (size_t i = 0; i < e.outputs.size(); ++i)
      define(e.outputs[i], [&] { return ctx() + fmt::format(" output {}", i); });
  }
  for (size_t i = 0; i < jaxpr.outvars().size(); ++i)
    if (auto* v = std::get_if<Var>(&jaxpr.outvars()[i]); v && (!v->defined() || !defined.count(v->id())))
      throw Error(fmt::format("check_jaxpr{}: outvar {} (a variable of type {}) is not defined", where, i,
                              v->defined() ? v->aval().str() : "<empty>"));
}

}  // namespace

void check_jaxpr(const Jaxpr& jaxpr) { check_rec(jaxpr, ""); }

}  // namespace cjax
