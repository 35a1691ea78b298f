#include "jit/passes/rewrite.h"

#include <absl/hash/hash.h>
#include <fmt/format.h>

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

}  // namespace cjax::passes_detail
