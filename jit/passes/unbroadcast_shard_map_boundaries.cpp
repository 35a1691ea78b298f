// unbroadcast_shard_map_boundaries: broadcasts cross shard_map boundaries at source size (jit/passes/passes.h).
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
#include "trace/shard_map.h"

namespace cjax {
using namespace passes_detail;
namespace {

// The spec of a broadcast_in_dim operand (shape `src`, dims `dims` into shape `dst`) whose result
// has spec `spec`, when every sharded result dimension is one of the operand's (not expanded):
// the operand's blocks then broadcast to the result's blocks. nullopt otherwise.
std::optional<PartitionSpec> spec_through_broadcast(const PartitionSpec& spec, const Shape& src, const Shape& dst,
                                                    const std::vector<int64_t>& dims) {
  auto entry = [&](size_t d) { return d < spec.size() ? spec.entries()[d] : PartitionSpec::Entry(None); };
  std::vector<PartitionSpec::Entry> out;
  for (size_t k = 0; k < src.size(); ++k) out.push_back(src[k] == dst[size_t(dims[k])] ? entry(size_t(dims[k])) : None);
  for (size_t d = 0; d < dst.size(); ++d) {
    if (entry(d).names.empty()) continue;
    auto k = std::find(dims.begin(), dims.end(), int64_t(d));
    if (k == dims.end() || src[size_t(k - dims.begin())] != dst[d]) return std::nullopt;
  }
  return PartitionSpec(std::move(out));
}

}  // namespace

std::shared_ptr<const Jaxpr> unbroadcast_shard_map_boundaries(const Jaxpr& jaxpr) {
  std::unordered_map<const void*, JaxprEqn> broadcast_of;  // top-level var -> its broadcast_in_dim of a var
  std::unordered_map<const void*, Literal> splat_of;       // top-level var -> the scalar literal it broadcasts
  std::vector<JaxprEqn> eqns;
  bool changed = false;
  for (const JaxprEqn& e0 : jaxpr.eqns()) {
    if (broadcasts_a_var(e0)) broadcast_of[e0.outputs[0].id()] = e0;
    track_splat(e0, splat_of);
    if (e0.primitive != &g_shard_map) {
      eqns.push_back(e0);
      continue;
    }
    JaxprEqn e = e0;
    ShardMapInfo info = ShardMapInfo::from(e.params);
    std::shared_ptr<const Jaxpr> sunk = sink_broadcasts(*info.body);  // broadcasts last, where they can be
    const Jaxpr& body = *sunk;
    std::vector<Var> invars = body.invars();
    std::vector<JaxprEqn> prologue;  // body: broadcasts of the operands' sources
    std::vector<bool> dropped(e.inputs.size(), false);
    // Operands that are broadcasts: the body takes the source's blocks and broadcasts them; a
    // replicated broadcast scalar literal is built in the body and the operand dropped.
    for (size_t i = 0; i < e.inputs.size(); ++i) {
      auto* v = std::get_if<Var>(&e.inputs[i]);
      if (auto splat = v ? splat_of.find(v->id()) : splat_of.end();
          splat != splat_of.end() && spec_vma(info.in_specs[i]).empty() && invars[i].aval().vma.empty()) {
        prologue.push_back(splat_eqn(splat->second, invars[i]));
        dropped[i] = true;
        continue;
      }
      auto it = v ? broadcast_of.find(v->id()) : broadcast_of.end();
      if (it == broadcast_of.end()) continue;
      const JaxprEqn& b = it->second;
      const Var& src = std::get<Var>(b.inputs[0]);
      const auto& dims = b.params.ints("broadcast_dimensions");
      auto src_spec = spec_through_broadcast(info.in_specs[i], src.aval().shape, v->aval().shape, dims);
      if (!src_spec) continue;
      AbstractValue block = invars[i].aval();
      block.shape = block_shape(info.mesh, *src_spec, src.aval().shape);
      block.dtype = src.aval().dtype;
      Var src_block(block);
      prologue.push_back(broadcast_eqn(src_block, invars[i], dims));
      invars[i] = src_block;
      info.in_specs[i] = *src_spec;
      e.inputs[i] = src;
    }
    // Outputs that are broadcasts in the body: the body returns the source; the caller broadcasts.
    std::unordered_map<const void*, const JaxprEqn*> body_broadcast;
    for (const JaxprEqn& be : body.eqns())
      if (broadcasts_a_var(be)) body_broadcast[be.outputs[0].id()] = &be;
    std::vector<Atom> outvars = body.outvars();
    std::vector<JaxprEqn> epilogue;  // caller: broadcasts of the returned sources
    for (size_t j = 0; j < outvars.size(); ++j) {
      auto* o = std::get_if<Var>(&outvars[j]);
      auto it = o ? body_broadcast.find(o->id()) : body_broadcast.end();
      if (it == body_broadcast.end()) continue;
      const Var& src = std::get<Var>(it->second->inputs[0]);
      const auto& dims = it->second->params.ints("broadcast_dimensions");
      auto src_spec = spec_through_broadcast(info.out_specs[j], src.aval().shape, o->aval().shape, dims);
      if (!src_spec) continue;
      std::vector<std::string> named = spec_vma(*src_spec);
      bool covered = true;
      for (const std::string& a : src.aval().vma) covered = covered && std::count(named.begin(), named.end(), a);
      if (!covered) continue;  // the source varies over an axis its spec would not name
      AbstractValue global = e.outputs[j].aval();
      global.shape = global_shape(info.mesh, *src_spec, src.aval().shape);
      global.dtype = src.aval().dtype;
      Var returned(global);
      epilogue.push_back(broadcast_eqn(returned, e.outputs[j], dims));
      e.outputs[j] = returned;
      outvars[j] = src;
      info.out_specs[j] = *src_spec;
    }
    if (prologue.empty() && epilogue.empty()) {
      eqns.push_back(e0);
      continue;
    }
    std::vector<Var> kept_invars;
    std::vector<PartitionSpec> kept_specs;
    std::vector<Atom> kept_inputs;
    for (size_t i = 0; i < e.inputs.size(); ++i)
      if (!dropped[i]) {
        kept_invars.push_back(invars[i]);
        kept_specs.push_back(info.in_specs[i]);
        kept_inputs.push_back(e.inputs[i]);
      }
    std::vector<JaxprEqn> body_eqns = std::move(prologue);
    body_eqns.insert(body_eqns.end(), body.eqns().begin(), body.eqns().end());
    // Nested shard_maps in the body get the same treatment (the splats just built reach them).
    std::shared_ptr<const Jaxpr> new_body = unbroadcast_shard_map_boundaries(
        Jaxpr(body.constvars(), std::move(kept_invars), std::move(body_eqns), std::move(outvars)));
    if (is_transposed_body(info.body.get())) mark_transposed_body(new_body);
    info.body = new_body;
    info.in_specs = std::move(kept_specs);
    e.inputs = std::move(kept_inputs);
    e.params = info.params();
    eqns.push_back(std::move(e));
    for (JaxprEqn& b : epilogue) {
      broadcast_of[b.outputs[0].id()] = b;
      eqns.push_back(std::move(b));
    }
    changed = true;
  }
  if (!changed) return std::make_shared<const Jaxpr>(jaxpr);
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(eqns), jaxpr.outvars());
}

}  // namespace cjax
