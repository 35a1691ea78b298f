// fuse_gemm_updates: SGD updates on a dot_general become dot_general_accumulate (jit/passes/passes.h).
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

const PrimitiveDef& dot_general_accumulate() {
  static const PrimitiveDef& def = *find_primitive("dot_general_accumulate");
  return def;
}

}  // namespace

std::shared_ptr<const Jaxpr> fuse_gemm_updates(const Jaxpr& jaxpr) {
  std::unordered_map<const void*, int> uses = count_uses(jaxpr);
  std::unordered_map<const void*, const JaxprEqn*> producer;
  for (const JaxprEqn& e : jaxpr.eqns())
    for (const Var& v : e.outputs) producer[v.id()] = &e;
  // The single-use equation producing `a`, if it is a `name` equation.
  auto single_use = [&](const Atom& a, const char* name) -> const JaxprEqn* {
    auto* v = std::get_if<Var>(&a);
    if (!v || uses[v->id()] != 1) return nullptr;
    auto it = producer.find(v->id());
    return it != producer.end() && it->second->primitive->name == name ? it->second : nullptr;
  };
  auto scalar_literal = [](const Atom& a, double* value) {
    auto* l = std::get_if<Literal>(&a);
    if (!l || l->aval().ndim() != 0 || !is_floating(l->aval().dtype)) return false;
    *value = l->value().item<double>();
    return true;
  };
  // The dot_general_accumulate equation replacing `e`, if `e` is such an update.
  auto fused_update = [&](const JaxprEqn& e) -> std::optional<JaxprEqn> {
    const std::string& name = e.primitive->name;
    if ((name != "sub" && name != "add") || e.inputs.size() != 2) return std::nullopt;
    // acc -/+ dot, acc -/+ dot * s, acc -/+ s * dot (and dot + acc, dot * s + acc for add).
    for (int side = 0; side < (name == "add" ? 2 : 1); ++side) {
      const Atom& acc = e.inputs[size_t(side)];
      const Atom& term = e.inputs[size_t(1 - side)];
      double scale = 1;
      const JaxprEqn* dot = single_use(term, "dot_general");
      if (!dot) {
        const JaxprEqn* mul = single_use(term, "mul");
        if (!mul) continue;
        for (int k = 0; k < 2 && !dot; ++k)
          if (scalar_literal(mul->inputs[size_t(1 - k)], &scale))
            dot = single_use(mul->inputs[size_t(k)], "dot_general");
        if (!dot) continue;
      }
      // A broadcast accumulator (a bias) stays with the elementwise kernel that reads it
      // through a strided index map instead of materializing it for BLAS.
      if (auto* v = std::get_if<Var>(&acc);
          v && producer.count(v->id()) && producer[v->id()]->primitive->name == "broadcast_in_dim")
        continue;
      const AbstractValue& out = e.outputs[0].aval();
      DType dt = out.dtype;
      if ((dt != DType::float32 && dt != DType::float64) || atom_aval(acc) != out ||
          dot->outputs[0].aval().shape != out.shape || dot->outputs[0].aval().dtype != dt ||
          atom_aval(dot->inputs[0]).dtype != dt || atom_aval(dot->inputs[1]).dtype != dt)
        continue;
      JaxprEqn fused;
      fused.primitive = &dot_general_accumulate();
      fused.inputs = {dot->inputs[0], dot->inputs[1], acc};
      fused.outputs = e.outputs;
      fused.params.set("dimension_numbers", dot->params.at("dimension_numbers"));
      fused.params.set("alpha", name == "sub" ? -scale : scale);
      fused.source_info = e.source_info;
      return fused;
    }
    return std::nullopt;
  };
  std::vector<JaxprEqn> eqns;
  for (const JaxprEqn& e : jaxpr.eqns()) {
    std::optional<JaxprEqn> fused = fused_update(e);
    eqns.push_back(fused ? std::move(*fused) : e);
  }
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(eqns), jaxpr.outvars());
}

}  // namespace cjax
