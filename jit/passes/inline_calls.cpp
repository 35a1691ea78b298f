// inline_calls: nested calls replaced by their bodies (jit/passes/passes.h).
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

// The body of a call equation that, at run time, means just its body: a nested jit, a remat
// (rematerialization is decided when the backward pass is built; what runs is the body), and
// custom_jvp_call / custom_vjp_call (their rules only matter to transformations, which are done
// by now). Inlined, their equations fuse with the rest of the program.
const Jaxpr* inlinable_body(const JaxprEqn& e) {
  const std::string& n = e.primitive->name;
  if (n == "jit" || n == "remat2") return e.params.object<JaxprParam>("jaxpr")->jaxpr.get();
  if (n == "custom_jvp_call" || n == "custom_vjp_call") return e.params.object<JaxprParam>("call_jaxpr")->jaxpr.get();
  return nullptr;
}

// Appends `body`'s equations to `out` with its invars bound to `args`, inlining nested jits;
// `results` receives its outvars.
void inline_into(const Jaxpr& body, const std::vector<Atom>& args, std::vector<JaxprEqn>& out,
                 std::vector<Atom>& results) {
  Subst s;
  for (size_t i = 0; i < body.invars().size(); ++i) s.map[body.invars()[i].id()] = args[i];
  for (const JaxprEqn& e : body.eqns()) {
    std::vector<Atom> ins = s.all(e.inputs);
    if (const Jaxpr* inner = inlinable_body(e)) {
      std::vector<Atom> rs;
      inline_into(*inner, ins, out, rs);
      for (size_t i = 0; i < e.outputs.size(); ++i) s.map[e.outputs[i].id()] = rs[i];
      continue;
    }
    JaxprEqn c = e;
    c.inputs = std::move(ins);
    out.push_back(std::move(c));
  }
  results = s.all(body.outvars());
}

}  // namespace

std::shared_ptr<const Jaxpr> inline_calls(const Jaxpr& jaxpr) {
  bool any = false;
  for (const JaxprEqn& e : jaxpr.eqns()) any = any || inlinable_body(e);
  if (!any) return std::make_shared<const Jaxpr>(jaxpr);
  std::vector<Atom> args(jaxpr.invars().begin(), jaxpr.invars().end());  // bound to themselves
  std::vector<JaxprEqn> eqns;
  std::vector<Atom> results;
  inline_into(jaxpr, args, eqns, results);
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(eqns), std::move(results));
}

}  // namespace cjax
