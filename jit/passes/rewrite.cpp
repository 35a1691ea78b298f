#include "jit/passes/rewrite.h"

#include <absl/hash/hash.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "cjax/lax.h"
#include "core/array/kernel_table.h"
#include "core/array/trace.h"
#include "core/backend/backend.h"
#include "core/lax/linalg.h"
#include "jit/fusion.h"
#include "trace/eval_jaxpr.h"

namespace cjax::passes_detail {

std::unordered_map<const void*, int> count_uses(const Jaxpr& jaxpr) {
  std::unordered_map<const void*, int> uses;
  for (const JaxprEqn& e : jaxpr.eqns())
    for (const Atom& a : e.inputs)
      if (auto* v = std::get_if<Var>(&a)) ++uses[v->id()];
  for (const Atom& a : jaxpr.outvars())
    if (auto* v = std::get_if<Var>(&a)) ++uses[v->id()];
  return uses;
}
JaxprEqn broadcast_eqn(const Atom& src, const Var& out, const std::vector<int64_t>& dims) {
  JaxprEqn b;
  b.primitive = find_primitive("broadcast_in_dim");
  b.inputs = {src};
  b.outputs = {out};
  b.params = Params{{"shape", out.aval().shape}, {"broadcast_dimensions", dims}, {"sharding", std::monostate{}}};
  return b;
}
bool broadcasts_a_var(const JaxprEqn& e) {
  return e.primitive->name == "broadcast_in_dim" && std::holds_alternative<Var>(e.inputs[0]);
}
JaxprEqn splat_eqn(const Literal& value, const Var& out) { return broadcast_eqn(value, out, {}); }
void track_splat(const JaxprEqn& e, std::unordered_map<const void*, Literal>& splat_of) {
  const std::string& name = e.primitive->name;
  if (name == "broadcast_in_dim" && std::holds_alternative<Literal>(e.inputs[0]) && atom_aval(e.inputs[0]).ndim() == 0)
    splat_of.emplace(e.outputs[0].id(), std::get<Literal>(e.inputs[0]));
  if (name == "pvary" && e.inputs.size() == 1 && std::holds_alternative<Var>(e.inputs[0]))
    if (auto it = splat_of.find(std::get<Var>(e.inputs[0]).id()); it != splat_of.end())
      splat_of.emplace(e.outputs[0].id(), it->second);
}

std::optional<ElementwiseChain> elementwise_chain(const std::vector<JaxprEqn>& eqns,
                                                  const std::unordered_map<const void*, size_t>& def_of, const Var& v,
                                                  size_t max_eqns, bool with_scalar_constants) {
  const Shape& shape = v.aval().shape;
  ElementwiseChain chain;
  std::unordered_set<size_t> seen;
  size_t computed = 0;  // elementwise equations in the chain
  std::function<bool(const Var&)> visit = [&](const Var& w) {
    auto it = def_of.find(w.id());
    const JaxprEqn* e = it == def_of.end() ? nullptr : &eqns[it->second];
    if (w.aval().shape.empty() && !shape.empty()) {
      bool constant = e && e->primitive->name == "pvary" && std::holds_alternative<Literal>(e->inputs[0]);
      if (!with_scalar_constants || !constant)
        chain.roots.push_back(w);
      else if (seen.insert(it->second).second)
        chain.eqns.push_back(it->second);
      return true;
    }
    if (w.aval().shape != shape) return false;
    if (!e || e->outputs.size() != 1 || classify(*e) != EqnClass::Elementwise) {
      chain.roots.push_back(w);
      return true;
    }
    if (!seen.insert(it->second).second) return true;
    if (++computed > max_eqns) return false;
    for (const Atom& a : e->inputs)
      if (auto* x = std::get_if<Var>(&a); x && !visit(*x)) return false;
    chain.eqns.push_back(it->second);
    return true;
  };
  if (!visit(v) || computed == 0) return std::nullopt;
  std::sort(chain.eqns.begin(), chain.eqns.end());
  return chain;
}

}  // namespace cjax::passes_detail
