// Collective primitives (docs/shard_map.md §1.6, §2.2): definitions, the per-group math shared by
// the eager ShardMapTrace and the SPMD kernels, and parameter helpers for the rule files.
#pragma once
#include <span>
#include <string>
#include <vector>

#include "cjax/sharding.h"
#include "core/array/primitive.h"
#include "core/array/spmd.h"

namespace cjax {

// The `axes` parameter of every collective, printed as a tuple: ('i',), ('i', 'j').
struct AxesParam final : ParamObject {
  std::vector<std::string> names;
  explicit AxesParam(std::vector<std::string> n) : names(std::move(n)) {}
  std::string str() const override;
  size_t hash() const override;
  bool equals(const ParamObject& other) const override;
};
std::shared_ptr<const ParamObject> axes_param(std::vector<std::string> names);
const std::vector<std::string>& collective_axes(const Params& p);

extern const PrimitiveDef& g_psum_invariant;  // varying -> invariant sum (check_vma on)
extern const PrimitiveDef& g_psum;            // plain sum (check_vma off): its own transpose
extern const PrimitiveDef& g_pmax;
extern const PrimitiveDef& g_pmin;
extern const PrimitiveDef& g_pvary;  // invariant -> varying, free
extern const PrimitiveDef& g_all_gather;
extern const PrimitiveDef& g_all_gather_invariant;
extern const PrimitiveDef& g_reduce_scatter;  // lax::psum_scatter
extern const PrimitiveDef& g_ppermute;
extern const PrimitiveDef& g_all_to_all;
extern const PrimitiveDef& g_axis_index;
extern const PrimitiveDef& g_pbroadcast;

// The result for the member at `position` of a group whose members' operands are `group` (in
// group order), on concrete arrays; every member's result is computed in the same order, so
// reductions are deterministic and identical on all members. axis_index has no operands.
Array collective_result(const PrimitiveDef& def, const Params& p, std::span<const Array> group, int64_t position);

// A collective whose result depends on other devices' blocks (every Collective-kind primitive
// but pvary, which only retypes its operand).
bool needs_all_devices(const PrimitiveDef& def);

// Runs the collective `def` for every device of `mesh` at once, on the caller's thread:
// `inputs[d]` are device d's operands, the result's [d] its outputs. Used where all devices'
// blocks are at hand (the eager ShardMapTrace, lockstep SPMD runs). With `record`, the
// collective recorder sees it as one SPMD execution (phase backward when `backward`).
std::vector<std::vector<Array>> run_collective_on_all_devices(const PrimitiveDef& def, const Params& p,
                                                              const std::vector<std::vector<Array>>& inputs,
                                                              std::span<const AbstractValue> out_avals,
                                                              const Mesh& mesh, bool record, bool backward);

// Binds the collective `def` with the front end's auto-pvary: `x` is first made varying over the
// axes of `axes` it does not vary over (when varying axes are checked).
Array pvary_missing(const Array& x, const std::vector<std::string>& axes);

// The union of the operands' varying axes, and whether they differ (the standard rule then
// needs pvary on the operands that vary over fewer axes).
std::vector<std::string> common_vma(std::span<const Array> xs);
bool vmas_differ(std::span<const Array> xs);
Params pvary_params(std::vector<std::string> axes);

// Called for every collective a staged shard_map body executes, on each device, while set: how
// the executed-collective recorder (trace/collective_recorder.cpp, beside its staged twin) sees
// them. One observer at a time; nullptr removes it.
using CollectiveObserver = void (*)(const PrimitiveDef& def, const Params& params, std::span<const Array> in,
                                    std::span<const AbstractValue> outs, const SpmdContext& ctx);
void set_collective_observer(CollectiveObserver observer);
bool collective_observer_set();

}  // namespace cjax
