// sink_broadcasts: elementwise work on broadcasts moves before the broadcast (jit/passes/passes.h).
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
#include "jit/passes/passes.h"
#include "jit/passes/rewrite.h"
#include "trace/eval_jaxpr.h"

namespace cjax {
using namespace passes_detail;

namespace {

// Whether `e` is reduce_sum over only size-1 axes that the broadcast_in_dim `b` added to its source
// (in order, no other change): the sum of one element per row is the source itself.
bool sums_added_unit_axes(const JaxprEqn& e, const JaxprEqn& b) {
  auto unsharded = [](const JaxprEqn& q, const char* param) {
    return !q.params.has(param) || std::holds_alternative<std::monostate>(q.params.at(param));
  };
  if (e.primitive->name != "reduce_sum" || !unsharded(e, "out_sharding") || !unsharded(b, "sharding")) return false;
  const AbstractValue &src = atom_aval(b.inputs[0]), &out = e.outputs[0].aval();
  if (src.shape != out.shape || src.dtype != out.dtype) return false;
  const Shape& wide = b.params.ints("shape");
  const std::vector<int64_t>& kept = b.params.ints("broadcast_dimensions");
  const std::vector<int64_t>& axes = e.params.ints("axes");
  if (!std::is_sorted(kept.begin(), kept.end()) || kept.size() + axes.size() != wide.size()) return false;
  for (int64_t a : axes)
    if (wide[size_t(a)] != 1 || std::find(kept.begin(), kept.end(), a) != kept.end()) return false;
  return true;
}

}  // namespace

std::shared_ptr<const Jaxpr> sink_broadcasts(const Jaxpr& jaxpr) {
  auto elementwise = [](const JaxprEqn& e) {
    const std::string& n = e.primitive->name;
    return e.outputs.size() == 1 && (e.primitive->scalar_op || n == "integer_pow" || n == "convert_element_type" ||
                                     n == "select_n" || n == "add_any");
  };
  std::unordered_map<const void*, JaxprEqn> broadcast_of;  // a var -> the broadcast_in_dim defining it
  std::unordered_map<const void*, Literal> splat_of;       // a var -> the scalar literal it broadcasts
  std::vector<JaxprEqn> eqns;
  Subst renamed;  // the outputs of dropped sums -> their broadcasts' sources
  std::function<void(JaxprEqn)> emit = [&](JaxprEqn e) {
    e.inputs = renamed.all(e.inputs);
    if (broadcasts_a_var(e)) broadcast_of[e.outputs[0].id()] = e;
    // The transpose of an expand_dims (x[..., None] * y) sums a row value broadcast to [..., 1]
    // back over that axis: the row value itself, which then stays in the fused kernel of its
    // reduction (a split there cost RMSNorm's backward a kernel and a full-size round trip).
    if (auto* v = e.inputs.empty() ? nullptr : std::get_if<Var>(&e.inputs[0]))
      if (auto it = broadcast_of.find(v->id()); it != broadcast_of.end() && sums_added_unit_axes(e, it->second)) {
        renamed.map.emplace(e.outputs[0].id(), it->second.inputs[0]);
        return;
      }
    track_splat(e, splat_of);
    if (elementwise(e)) {
      const JaxprEqn* first = nullptr;
      bool ok = true;
      for (const Atom& a : e.inputs) {
        if (auto* l = std::get_if<Literal>(&a)) {
          ok = ok && l->aval().ndim() == 0;
          continue;
        }
        if (splat_of.count(std::get<Var>(a).id())) continue;
        auto it = broadcast_of.find(std::get<Var>(a).id());
        if (it == broadcast_of.end()) {
          ok = false;
          break;
        }
        const JaxprEqn& b = it->second;
        if (!first)
          first = &b;
        else
          ok = ok && b.params == first->params && atom_aval(b.inputs[0]).shape == atom_aval(first->inputs[0]).shape;
      }
      if (ok && first && atom_aval(first->inputs[0]).shape != e.outputs[0].aval().shape) {
        JaxprEqn inner = e;
        for (Atom& a : inner.inputs)
          if (auto* v = std::get_if<Var>(&a)) {
            auto splat = splat_of.find(v->id());
            a = splat != splat_of.end() ? Atom(splat->second) : broadcast_of.at(v->id()).inputs[0];
          }
        AbstractValue av = e.outputs[0].aval();
        av.shape = atom_aval(first->inputs[0]).shape;
        inner.outputs = {Var(av)};
        JaxprEqn outer = *first;
        outer.inputs = {inner.outputs[0]};
        outer.outputs = e.outputs;
        outer.source_info = e.source_info;
        emit(std::move(inner));
        emit(std::move(outer));
        return;
      }
    }
    eqns.push_back(std::move(e));
  };
  for (const JaxprEqn& e : jaxpr.eqns()) emit(e);
  return std::make_shared<const Jaxpr>(jaxpr.constvars(), jaxpr.invars(), std::move(eqns),
                                       renamed.all(jaxpr.outvars()));
}

}  // namespace cjax
