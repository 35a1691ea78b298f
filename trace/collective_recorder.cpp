// debug::collectives: the collective equations of a jaxpr, recursively, with their phase
// (cjax/collective_recorder.h). The runtime recorder lives with the collectives' kernels.
#include "cjax/collective_recorder.h"

#include <functional>

#include "core/spmd/collectives.h"
#include "trace/jaxpr.h"
#include "trace/shard_map.h"

namespace cjax::debug {

std::vector<CollectiveRecord> collectives(const ClosedJaxpr& jaxpr) {
  std::vector<CollectiveRecord> out;
  std::function<void(const Jaxpr&, bool)> walk = [&](const Jaxpr& j, bool backward) {
    for (const JaxprEqn& e : j.eqns()) {
      if (e.primitive->kind == PrimKind::Collective) {
        CollectiveRecord r;
        r.kind = e.primitive->name;
        r.axes = collective_axes(e.params);
        if (!e.inputs.empty()) {
          AbstractValue in = atom_aval(e.inputs[0]);
          r.in_shape = in.shape;
          r.dtype = in.dtype;
          r.bytes = in.size() * int64_t(itemsize(in.dtype));
        } else {
          r.dtype = e.outputs[0].aval().dtype;
        }
        r.out_shape = e.outputs[0].aval().shape;
        r.phase = backward ? Phase::Backward : Phase::Forward;
        r.communicates = e.primitive->name != "pvary" && e.primitive->name != "axis_index";
        out.push_back(std::move(r));
      }
      for (const auto& [name, val] : e.params.items()) {
        auto* obj = std::get_if<std::shared_ptr<const ParamObject>>(&val);
        if (!obj) continue;
        if (auto* jp = dynamic_cast<const JaxprParam*>(obj->get()))
          walk(*jp->jaxpr, backward || (e.primitive == &g_shard_map && is_transposed_body(jp->jaxpr.get())));
        if (auto* jl = dynamic_cast<const JaxprListParam*>(obj->get()))
          for (const auto& sub : jl->jaxprs) walk(*sub, backward);
      }
    }
  };
  walk(*jaxpr.jaxpr, false);
  return out;
}

}  // namespace cjax::debug
