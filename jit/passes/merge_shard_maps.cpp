// merge_shard_maps: consecutive shard_maps over the same mesh and manual axes run as one
// (jit/passes/passes.h).
//
// grad of a shard_map, followed by an optimizer written as a shard_map, stages three of them per
// training step: the forward body, which returns its residuals, the backward body, which reads
// them, and the update. Each boundary costs the lockstep runner a full stop of every device: the
// outputs are assembled into global arrays, cut into blocks again for the next body, and the pool
// waits for the slowest device (0.5-0.8 ms of both cores idle per boundary in the sample's fsdp
// step, 4-5% of it). A value that crosses a boundary under the same spec on both sides is the same
// block on every device, so the second body can read the first body's variable directly.
//
// A later shard_map B joins an earlier A when they share mesh, manual axes and check_vma, no
// equation between them reads A's results, and every result of A that B reads is read under the
// spec A returned it with. The merged body is A's equations, then B's (a pvary first where B's
// operand type names axes that A's value does not vary along: a type change only); it returns
// A's results that anything besides B reads, then B's. Operands are deduplicated where B takes a
// value A also takes, under the same spec. Collectives keep their phase for the collective
// recorder: where only one of the bodies is a transposed (backward) one, its collectives are marked
// backward one by one (trace/phase.h), and the merge is skipped where that cannot be done (a
// collective nested in a control-flow body of the backward part).
#include <cstddef>
#include <memory>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "core/spmd/collectives.h"
#include "jit/passes/passes.h"
#include "jit/passes/rewrite.h"
#include "trace/phase.h"
#include "trace/shard_map.h"

namespace cjax {
using namespace passes_detail;

namespace {

bool same_type_but_vma(const AbstractValue& a, const AbstractValue& b) {
  return a.shape == b.shape && a.dtype == b.dtype && a.weak_type == b.weak_type;
}

// The body's equations with every collective marked as a backward pass's (trace/phase.h), or
// nullopt where a collective sits in a nested jaxpr, where a mark would not reach the executor.
// Each marked equation gets its own copy of its source info: a forward collective recomputed in
// the backward body (a checkpointed all_gather) shares the forward equation's, which must stay
// unmarked.
std::optional<std::vector<JaxprEqn>> marked_backward(const Jaxpr& body) {
  std::vector<JaxprEqn> eqns = body.eqns();
  for (JaxprEqn& e : eqns) {
    if (contains_collective(e.params)) return std::nullopt;
    if (e.primitive->kind != PrimKind::Collective || is_backward(e.source_info.get())) continue;
    e.source_info = SourceInfo::copy_of(e.source_info.get());
    mark_backward(e.source_info);
  }
  return eqns;
}

// A and B merged into one shard_map equation, or nullopt where they cannot be (see above).
// `uses`: reads of each top-level variable in the whole program.
std::optional<JaxprEqn> merge(const JaxprEqn& a, const JaxprEqn& b, const std::unordered_map<const void*, int>& uses) {
  ShardMapInfo ia = ShardMapInfo::from(a.params), ib = ShardMapInfo::from(b.params);
  if (!(ia.mesh == ib.mesh) || ia.manual_axes != ib.manual_axes || ia.check_vma != ib.check_vma) return std::nullopt;
  // Calls inlined first, as the bodies will run: a remat block of the backward body holds
  // collectives that the phase marks must reach.
  std::shared_ptr<const Jaxpr> inlined_a = inline_calls(*ia.body), inlined_b = inline_calls(*ib.body);
  const Jaxpr &ba = *inlined_a, &bb = *inlined_b;
  if (!ba.constvars().empty() || !bb.constvars().empty()) return std::nullopt;
  bool ta = is_transposed_body(ia.body.get()), tb = is_transposed_body(ib.body.get());
  std::vector<JaxprEqn> eqns_a = ba.eqns(), eqns_b = bb.eqns();
  if (ta != tb) {
    auto marked = marked_backward(ta ? ba : bb);
    if (!marked) return std::nullopt;
    (ta ? eqns_a : eqns_b) = std::move(*marked);
  }

  std::unordered_map<const void*, size_t> output_of_a, input_of_a;  // top-level var -> index
  for (size_t j = 0; j < a.outputs.size(); ++j) output_of_a.emplace(a.outputs[j].id(), j);
  for (size_t k = 0; k < a.inputs.size(); ++k)
    if (auto* v = std::get_if<Var>(&a.inputs[k])) input_of_a.emplace(v->id(), k);

  JaxprEqn c;
  c.primitive = a.primitive;
  c.source_info = a.source_info;
  c.inputs = a.inputs;
  ShardMapInfo ic = ia;
  std::vector<Var> invars = ba.invars();
  std::vector<JaxprEqn> body = std::move(eqns_a);
  Subst into_b;  // B's body variables -> the merged body's
  std::unordered_map<const void*, int> read_by_b;
  for (size_t k = 0; k < b.inputs.size(); ++k) {
    const Var& operand = bb.invars()[k];
    auto* v = std::get_if<Var>(&b.inputs[k]);
    if (v) ++read_by_b[v->id()];
    if (auto out = v ? output_of_a.find(v->id()) : output_of_a.end(); out != output_of_a.end()) {
      size_t j = out->second;
      const Atom& value = ba.outvars()[j];
      if (ia.out_specs[j] != ib.in_specs[k] || !same_type_but_vma(atom_aval(value), operand.aval()))
        return std::nullopt;
      std::vector<std::string> missing = vma_minus(operand.aval().vma, atom_aval(value).vma);
      if (missing.empty()) {
        into_b.map.emplace(operand.id(), value);
      } else {
        JaxprEqn cast;
        cast.primitive = &g_pvary;
        cast.inputs = {value};
        cast.outputs = {Var(operand.aval())};
        cast.params = pvary_params(std::move(missing));
        into_b.map.emplace(operand.id(), cast.outputs[0]);
        body.push_back(std::move(cast));
      }
      continue;
    }
    if (auto in = v ? input_of_a.find(v->id()) : input_of_a.end(); in != input_of_a.end() &&
                                                                   ia.in_specs[in->second] == ib.in_specs[k] &&
                                                                   ba.invars()[in->second].aval() == operand.aval()) {
      into_b.map.emplace(operand.id(), ba.invars()[in->second]);
      continue;
    }
    c.inputs.push_back(b.inputs[k]);
    ic.in_specs.push_back(ib.in_specs[k]);
    invars.push_back(operand);
  }
  for (JaxprEqn e : eqns_b) {
    e.inputs = into_b.all(e.inputs);
    body.push_back(std::move(e));
  }
  // A's results that something besides B reads stay results; then B's.
  std::vector<Atom> outvars;
  ic.out_specs.clear();
  for (size_t j = 0; j < a.outputs.size(); ++j) {
    auto u = uses.find(a.outputs[j].id());
    auto r = read_by_b.find(a.outputs[j].id());
    int others = (u == uses.end() ? 0 : u->second) - (r == read_by_b.end() ? 0 : r->second);
    if (others <= 0) continue;
    c.outputs.push_back(a.outputs[j]);
    outvars.push_back(ba.outvars()[j]);
    ic.out_specs.push_back(ia.out_specs[j]);
  }
  for (size_t j = 0; j < b.outputs.size(); ++j) {
    c.outputs.push_back(b.outputs[j]);
    outvars.push_back(into_b(bb.outvars()[j]));
    ic.out_specs.push_back(ib.out_specs[j]);
  }
  auto merged =
      std::make_shared<const Jaxpr>(std::vector<Var>{}, std::move(invars), std::move(body), std::move(outvars));
  if (ta && tb) mark_transposed_body(merged);
  ic.body = merged;
  c.params = ic.params();
  return c;
}

}  // namespace

std::shared_ptr<const Jaxpr> merge_shard_maps(const Jaxpr& jaxpr) {
  std::unordered_map<const void*, int> uses = count_uses(jaxpr);
  std::vector<JaxprEqn> out;
  out.reserve(jaxpr.eqns().size());
  ptrdiff_t open = -1;  // index in `out` of the shard_map a later one may join
  std::unordered_set<const void*> open_results;
  bool merged_any = false;
  for (const JaxprEqn& e : jaxpr.eqns()) {
    if (e.primitive == &g_shard_map && open >= 0) {
      if (std::optional<JaxprEqn> c = merge(out[size_t(open)], e, uses)) {
        out.erase(out.begin() + open);
        out.push_back(std::move(*c));
        open = ptrdiff_t(out.size()) - 1;
        open_results.clear();
        for (const Var& v : out.back().outputs) open_results.insert(v.id());
        merged_any = true;
        continue;
      }
    }
    bool reads_open = false;
    for (const Atom& x : e.inputs)
      if (auto* v = std::get_if<Var>(&x)) reads_open = reads_open || open_results.count(v->id());
    out.push_back(e);
    if (e.primitive == &g_shard_map || reads_open) {
      open = -1;
      open_results.clear();
    }
    if (e.primitive == &g_shard_map) {
      open = ptrdiff_t(out.size()) - 1;
      for (const Var& v : e.outputs) open_results.insert(v.id());
    }
  }
  if (!merged_any) return std::make_shared<const Jaxpr>(jaxpr);
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(out), jaxpr.outvars());
}

}  // namespace cjax
