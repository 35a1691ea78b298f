// cjax/collective_recorder.h: debug::collectives, the collective equations of a jaxpr,
// recursively, with their phase (staged), and CollectiveRecorder, the collectives that staged
// shard_map bodies execute (seen through core/spmd/collectives.h's observer).
#include "cjax/collective_recorder.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <optional>

#include "cjax/collectives.h"
#include "core/spmd/collectives.h"
#include "trace/jaxpr.h"
#include "trace/shard_map.h"

namespace cjax::debug {
namespace {
// One collective: its operand's type (null for axis_index, which has none) and result type.
CollectiveRecord make_record(const PrimitiveDef& def, const Params& p, const AbstractValue* in,
                             const AbstractValue& out, bool backward) {
  CollectiveRecord r;
  r.kind = def.name;
  r.axes = collective_axes(p);
  if (in) {
    r.in_shape = in->shape;
    r.dtype = in->dtype;
    r.bytes = in->size() * int64_t(itemsize(in->dtype));
  } else {
    r.dtype = out.dtype;
  }
  r.out_shape = out.shape;
  r.phase = backward ? Phase::Backward : Phase::Forward;
  r.communicates = def.name != "pvary" && def.name != "axis_index";
  return r;
}

std::atomic<bool> g_recording{false};
std::mutex g_record_mu;
std::vector<CollectiveRecord> g_records;

void record(const PrimitiveDef& def, const Params& p, std::span<const Array> in, std::span<const AbstractValue> outs,
            const SpmdContext& ctx) {
  if (!g_recording.load(std::memory_order_relaxed) || ctx.device != 0) return;
  CollectiveRecord r = make_record(def, p, in.empty() ? nullptr : &in[0].aval(), outs[0], ctx.backward);
  std::lock_guard lk(g_record_mu);
  g_records.push_back(std::move(r));
}
}  // namespace

CollectiveRecorder::CollectiveRecorder() {
  if (g_recording.exchange(true)) throw ValueError("a CollectiveRecorder is already recording; use one at a time");
  clear();
  set_collective_observer(record);
}
CollectiveRecorder::~CollectiveRecorder() {
  set_collective_observer(nullptr);
  g_recording.store(false);
}
std::vector<CollectiveRecord> CollectiveRecorder::records() const {
  std::lock_guard lk(g_record_mu);
  return g_records;
}
void CollectiveRecorder::clear() {
  std::lock_guard lk(g_record_mu);
  g_records.clear();
}
std::string CollectiveRecord::str() const {
  auto type = [&](const Shape& s) { return fmt::format("{}[{}]", dtype_short_name(dtype), fmt::join(s, ",")); };
  return fmt::format("{} {} over {} {} -> {} ({} bytes{})", phase == Phase::Backward ? "backward" : "forward", kind,
                     AxisNames(axes).str(), type(in_shape), type(out_shape), bytes,
                     communicates ? "" : ", no communication");
}

std::vector<CollectiveRecord> collectives(const ClosedJaxpr& jaxpr) {
  std::vector<CollectiveRecord> out;
  std::function<void(const Jaxpr&, bool)> walk = [&](const Jaxpr& j, bool backward) {
    for (const JaxprEqn& e : j.eqns()) {
      if (e.primitive->kind == PrimKind::Collective) {
        std::optional<AbstractValue> in;
        if (!e.inputs.empty()) in = atom_aval(e.inputs[0]);
        CollectiveRecord r = make_record(*e.primitive, e.params, in ? &*in : nullptr, e.outputs[0].aval(), backward);
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
