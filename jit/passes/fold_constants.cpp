// fold_constants: scalar equations of literals evaluated at compile time (jit/passes/passes.h).
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

std::shared_ptr<const Jaxpr> fold_constants(const Jaxpr& jaxpr) {
  std::vector<JaxprEqn> eqns;
  Subst s;
  for (const JaxprEqn& e : jaxpr.eqns()) {
    std::vector<Atom> ins = s.all(e.inputs);
    bool foldable = !ins.empty() && e.primitive->kind != PrimKind::HigherOrder &&
                    e.primitive->kind != PrimKind::Collective && !e.primitive->effectful &&
                    find_implementation(*e.primitive, Platform::cpu);
    for (const Atom& a : ins) foldable = foldable && std::holds_alternative<Literal>(a);
    for (const Var& v : e.outputs) foldable = foldable && v.aval().ndim() == 0;
    if (foldable) {
      std::vector<Array> vals;
      for (const Atom& a : ins) vals.push_back(std::get<Literal>(a).value());
      std::vector<Array> outs;
      {
        TraceScope scope(eval_trace());
        outs = cjax::bind(*e.primitive, vals, e.params);
      }
      for (size_t i = 0; i < outs.size(); ++i) s.map[e.outputs[i].id()] = Literal(outs[i]);
      continue;
    }
    JaxprEqn c = e;
    c.inputs = std::move(ins);
    eqns.push_back(std::move(c));
  }
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(eqns), s.all(jaxpr.outvars()));
}

}  // namespace cjax
