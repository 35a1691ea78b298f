// cse: common subexpression elimination (jit/passes/passes.h).
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
#include "jit/passes/passes.h"
#include "jit/passes/rewrite.h"
#include "trace/eval_jaxpr.h"

namespace cjax {
using namespace passes_detail;
namespace {

size_t atom_hash(const Atom& a) {
  if (auto* v = std::get_if<Var>(&a)) return std::hash<const void*>()(v->id());
  const Literal& l = std::get<Literal>(a);
  return absl::HashOf(l.value_str(), int(l.aval().dtype));
}
bool atom_eq(const Atom& a, const Atom& b) {
  auto* va = std::get_if<Var>(&a);
  auto* vb = std::get_if<Var>(&b);
  if (va || vb) return va && vb && *va == *vb;
  const Literal &la = std::get<Literal>(a), &lb = std::get<Literal>(b);
  return la.aval() == lb.aval() && la.value_str() == lb.value_str();
}

}  // namespace

std::shared_ptr<const Jaxpr> cse(const Jaxpr& jaxpr) {
  struct Key {
    const JaxprEqn* e;
  };
  auto hash = [](const Key& k) {
    size_t h = absl::HashOf(k.e->primitive, k.e->params.hash());
    for (const Atom& a : k.e->inputs) h = absl::HashOf(h, atom_hash(a));
    return h;
  };
  auto eq = [](const Key& a, const Key& b) {
    if (a.e->primitive != b.e->primitive || a.e->inputs.size() != b.e->inputs.size()) return false;
    for (size_t i = 0; i < a.e->inputs.size(); ++i)
      if (!atom_eq(a.e->inputs[i], b.e->inputs[i])) return false;
    return a.e->params == b.e->params;
  };
  std::unordered_map<Key, const JaxprEqn*, decltype(hash), decltype(eq)> seen(16, hash, eq);
  std::vector<JaxprEqn> eqns;
  eqns.reserve(jaxpr.eqns().size());
  Subst s;
  for (const JaxprEqn& e : jaxpr.eqns()) {
    JaxprEqn c = e;
    c.inputs = s.all(e.inputs);
    eqns.push_back(std::move(c));
  }
  std::vector<JaxprEqn> kept;
  for (JaxprEqn& e : eqns) {
    e.inputs = s.all(e.inputs);
    bool pure = e.primitive->kind != PrimKind::Collective && !e.primitive->effectful;
    if (pure) {
      auto [it, fresh] = seen.try_emplace(Key{&e}, &e);
      if (!fresh) {
        for (size_t i = 0; i < e.outputs.size(); ++i) s.map[e.outputs[i].id()] = it->second->outputs[i];
        continue;
      }
    }
    kept.push_back(e);
  }
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(kept), s.all(jaxpr.outvars()));
}

}  // namespace cjax
