// simplify_transposes: identity transposes go; result transposes fold into dot_general (jit/passes/passes.h).
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

std::shared_ptr<const Jaxpr> simplify_transposes(const Jaxpr& jaxpr) {
  std::unordered_map<const void*, int> uses = count_uses(jaxpr);
  std::vector<JaxprEqn> eqns;
  std::unordered_map<const void*, size_t> dot_of;  // dot_general output -> its index in `eqns`
  Subst s;
  for (const JaxprEqn& e : jaxpr.eqns()) {
    JaxprEqn c = e;
    c.inputs = s.all(e.inputs);
    if (c.primitive->name == "transpose") {
      const std::vector<int64_t>& perm = c.params.ints("permutation");
      bool identity = true;
      for (size_t d = 0; d < perm.size(); ++d) identity = identity && perm[d] == int64_t(d);
      if (identity) {
        s.map[c.outputs[0].id()] = c.inputs[0];
        continue;
      }
      auto* v = std::get_if<Var>(&c.inputs[0]);
      auto it = v ? dot_of.find(v->id()) : dot_of.end();
      if (it != dot_of.end() && uses[v->id()] == 1) {
        // dot_general's result is (batch..., lhs free..., rhs free...): a transpose that swaps the
        // two free groups is the dot_general with its operands swapped.
        JaxprEqn& dot = eqns[it->second];
        auto dn = dot.params.object<DotDimsParam>("dimension_numbers");
        int64_t nb = int64_t(dn->lhs_batch.size());
        int64_t fl = atom_aval(dot.inputs[0]).ndim() - nb - int64_t(dn->lhs_contracting.size());
        int64_t fr = atom_aval(dot.inputs[1]).ndim() - nb - int64_t(dn->rhs_contracting.size());
        std::vector<int64_t> swap;
        for (int64_t d = 0; d < nb; ++d) swap.push_back(d);
        for (int64_t d = 0; d < fr; ++d) swap.push_back(nb + fl + d);
        for (int64_t d = 0; d < fl; ++d) swap.push_back(nb + d);
        if (swap == perm) {
          auto swapped = std::make_shared<DotDimsParam>();
          swapped->lhs_contracting = dn->rhs_contracting;
          swapped->rhs_contracting = dn->lhs_contracting;
          swapped->lhs_batch = dn->rhs_batch;
          swapped->rhs_batch = dn->lhs_batch;
          dot.params.set("dimension_numbers", std::shared_ptr<const ParamObject>(std::move(swapped)));
          std::swap(dot.inputs[0], dot.inputs[1]);
          dot.outputs = c.outputs;
          dot_of.erase(it);
          continue;
        }
      }
    }
    if (c.primitive->name == "dot_general") dot_of[c.outputs[0].id()] = eqns.size();
    eqns.push_back(std::move(c));
  }
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(eqns), s.all(jaxpr.outvars()));
}

}  // namespace cjax
