// recompute_shard_map_residuals: a residual that a forward shard_map returns only for the backward
// shard_map, and that is a short elementwise chain of other residuals it returns for it, is
// computed again in the backward body instead (jit/passes/passes.h).
//
// grad of a shard_map splits its body into a forward body, which returns every value the backward
// needs, and a backward body: a GELU there returns tanh(...), 1 - tanh, 0.5 (1 + tanh) and 3 x^2
// beside x, four more arrays of the activation's size written by the forward's kernel and read by
// the backward's. Within one program recompute_elementwise makes that trade; between the two
// bodies it is made here, where both bodies are visible: the residual is dropped from the forward's
// outputs and the backward's operands, and the backward body starts with the chain, applied to
// its operands that hold the chain's roots (blocks of the same spec, so the same elements).
// Both bodies are read with their calls inlined (inline_calls), as they will run: a remat block of
// the backward body (the sample's fsdp_tp layout) reads its residuals inside the call.
#include <algorithm>
#include <map>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "jit/fusion.h"
#include "jit/passes/passes.h"
#include "jit/passes/rewrite.h"
#include "trace/shard_map.h"

namespace cjax {
using namespace passes_detail;

namespace {

constexpr size_t kMaxChain = 12;  // equations recomputed for one residual

// v without the entries whose index `gone` names.
template <class T, class Gone>
std::vector<T> without(const std::vector<T>& v, const Gone& gone) {
  std::vector<T> kept;
  for (size_t k = 0; k < v.size(); ++k)
    if (!gone(k)) kept.push_back(v[k]);
  return kept;
}

}  // namespace

std::shared_ptr<const Jaxpr> recompute_shard_map_residuals(const Jaxpr& jaxpr) {
  const std::vector<JaxprEqn>& eqns = jaxpr.eqns();
  // Who reads each top-level variable: (equation, operand index); n = an output of the program.
  std::unordered_map<const void*, std::vector<std::pair<size_t, size_t>>> readers;
  for (size_t i = 0; i < eqns.size(); ++i)
    for (size_t k = 0; k < eqns[i].inputs.size(); ++k)
      if (auto* v = std::get_if<Var>(&eqns[i].inputs[k])) readers[v->id()].push_back({i, k});
  for (const Atom& a : jaxpr.outvars())
    if (auto* v = std::get_if<Var>(&a)) readers[v->id()].push_back({eqns.size(), 0});

  // Per forward equation: the outputs dropped; per backward equation: operand index -> the chain
  // that replaces it (the forward's body and, per root, the backward operand that holds it).
  struct Recompute {
    std::shared_ptr<const Jaxpr> forward_body;
    ElementwiseChain chain;
    const void* residual;                                  // the forward body's variable
    std::unordered_map<const void*, size_t> root_operand;  // forward body root -> backward operand
  };
  std::unordered_map<size_t, std::unordered_set<size_t>> dropped_outputs;
  std::unordered_map<size_t, std::map<size_t, Recompute>> recomputed_operands;
  // Per backward equation (by index): its body's operands that a library step reads or that it
  // returns.
  std::unordered_map<size_t, std::unordered_set<const void*>> unfused;
  // Per shard_map equation (by index): its body with calls inlined.
  std::unordered_map<size_t, std::shared_ptr<const Jaxpr>> inlined;
  auto info_of = [&](size_t i) {
    ShardMapInfo info = ShardMapInfo::from(eqns[i].params);
    auto [it, fresh] = inlined.try_emplace(i);
    if (fresh) it->second = inline_calls(*info.body);
    info.body = it->second;
    return info;
  };
  auto unfused_operands = [&](size_t b, const ShardMapInfo& bwd) -> const std::unordered_set<const void*>& {
    auto [it, fresh] = unfused.try_emplace(b);
    if (fresh) {
      for (const JaxprEqn& q : bwd.body->eqns())
        if (classify(q) == EqnClass::Library)
          for (const Atom& x : q.inputs)
            if (auto* w = std::get_if<Var>(&x)) it->second.insert(w->id());
      for (const Atom& x : bwd.body->outvars())
        if (auto* w = std::get_if<Var>(&x)) it->second.insert(w->id());
    }
    return it->second;
  };
  for (size_t a = 0; a < eqns.size(); ++a) {
    if (eqns[a].primitive != &g_shard_map) continue;
    ShardMapInfo fwd = info_of(a);
    const Jaxpr& body = *fwd.body;
    std::unordered_map<const void*, size_t> def_of;
    for (size_t k = 0; k < body.eqns().size(); ++k)
      for (const Var& v : body.eqns()[k].outputs) def_of[v.id()] = k;
    // The single reader of each output, when it is one operand of one later shard_map.
    auto sole_reader = [&](size_t j) -> std::optional<std::pair<size_t, size_t>> {
      auto it = readers.find(eqns[a].outputs[j].id());
      if (it == readers.end() || it->second.size() != 1) return std::nullopt;
      auto [b, k] = it->second[0];
      if (b == eqns.size() || eqns[b].primitive != &g_shard_map) return std::nullopt;
      return it->second[0];
    };
    std::unordered_map<const void*, size_t> output_of;  // body outvar -> output index
    for (size_t j = 0; j < body.outvars().size(); ++j)
      if (auto* v = std::get_if<Var>(&body.outvars()[j])) output_of.emplace(v->id(), j);
    std::unordered_set<size_t> pinned;  // outputs that are roots of a dropped one
    for (size_t j = 0; j < body.outvars().size(); ++j) {
      auto* v = std::get_if<Var>(&body.outvars()[j]);
      auto reader = sole_reader(j);
      if (!v || !reader || pinned.count(j) || output_of.at(v->id()) != j) continue;
      auto [b, operand] = *reader;
      ShardMapInfo bwd = info_of(b);
      if (bwd.mesh != fwd.mesh || bwd.in_specs[operand] != fwd.out_specs[j] ||
          bwd.body->invars()[operand].aval() != v->aval())
        continue;
      // Every reader in the backward body fuses with the recomputation (a GEMM would read it
      // from memory anyway).
      if (unfused_operands(b, bwd).count(bwd.body->invars()[operand].id())) continue;
      std::optional<ElementwiseChain> chain = elementwise_chain(body.eqns(), def_of, *v, kMaxChain, true);
      if (!chain) continue;
      // Each root is returned to the same backward equation under the same spec.
      Recompute r{fwd.body, std::move(*chain), v->id(), {}};
      bool roots_ok = true;
      for (const Var& root_var : r.chain.roots) {
        const void* root = root_var.id();
        auto out = output_of.find(root);
        std::optional<std::pair<size_t, size_t>> rr;
        if (out != output_of.end() && !dropped_outputs[a].count(out->second)) rr = sole_reader(out->second);
        if (!rr || rr->first != b || bwd.in_specs[rr->second] != fwd.out_specs[out->second]) {
          roots_ok = false;
          break;
        }
        r.root_operand[root] = rr->second;
      }
      if (!roots_ok) continue;
      for (const Var& root : r.chain.roots) pinned.insert(output_of.at(root.id()));
      dropped_outputs[a].insert(j);
      recomputed_operands[b].emplace(operand, std::move(r));
    }
  }
  if (recomputed_operands.empty()) return std::make_shared<const Jaxpr>(jaxpr);

  std::vector<JaxprEqn> out;
  out.reserve(eqns.size());
  for (size_t i = 0; i < eqns.size(); ++i) {
    JaxprEqn e = eqns[i];
    auto drop = dropped_outputs.find(i);
    auto rec = recomputed_operands.find(i);
    if ((drop == dropped_outputs.end() || drop->second.empty()) && rec == recomputed_operands.end()) {
      out.push_back(std::move(e));
      continue;
    }
    ShardMapInfo info = ShardMapInfo::from(e.params);
    bool transposed = is_transposed_body(info.body.get());
    info.body = inlined.at(i);
    const Jaxpr& body = *info.body;
    std::vector<Var> invars = body.invars();
    std::vector<JaxprEqn> body_eqns;
    std::vector<Atom> outvars = body.outvars();
    if (rec != recomputed_operands.end()) {
      // The chains first, on the operands that hold their roots, each equation of a forward body
      // cloned once (GELU's residuals share its tanh); then the body, reading them.
      Subst uses;
      std::unordered_map<const Jaxpr*, std::pair<Subst, std::unordered_set<size_t>>> cloned;
      for (const auto& [operand, r] : rec->second) {
        auto& [local, done] = cloned[r.forward_body.get()];
        for (const auto& [root, k] : r.root_operand) local.map.emplace(root, invars[k]);
        for (size_t q : r.chain.eqns) {
          if (!done.insert(q).second) continue;
          JaxprEqn c = r.forward_body->eqns()[q];
          c.inputs = local.all(c.inputs);
          Var fresh(c.outputs[0].aval());
          local.map.emplace(c.outputs[0].id(), fresh);
          c.outputs = {fresh};
          body_eqns.push_back(std::move(c));
        }
        uses.map.emplace(invars[operand].id(), local.map.at(r.residual));
      }
      for (JaxprEqn q : body.eqns()) {
        q.inputs = uses.all(q.inputs);
        body_eqns.push_back(std::move(q));
      }
      auto recomputed = [&](size_t k) { return rec->second.count(k) > 0; };
      invars = without(invars, recomputed);
      info.in_specs = without(info.in_specs, recomputed);
      e.inputs = without(e.inputs, recomputed);
    } else {
      body_eqns = body.eqns();
    }
    if (drop != dropped_outputs.end() && !drop->second.empty()) {
      auto dropped = [&](size_t j) { return drop->second.count(j) > 0; };
      outvars = without(outvars, dropped);
      info.out_specs = without(info.out_specs, dropped);
      e.outputs = without(e.outputs, dropped);
    }
    auto new_body =
        std::make_shared<const Jaxpr>(body.constvars(), std::move(invars), std::move(body_eqns), std::move(outvars));
    if (transposed) mark_transposed_body(new_body);
    info.body = new_body;
    e.params = info.params();
    out.push_back(std::move(e));
  }
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(out), jaxpr.outvars());
}

}  // namespace cjax
