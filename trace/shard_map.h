// The shard_map primitive and its parameters (docs/design.md §3, docs/shard_map.md), shared by the
// front end (trace/shard_map.cpp), the eager ShardMapTrace and the rule files.
//
//   c:f32[8,4] = shard_map[check_vma=True in_specs=(P('x', 'y'), P('y', None)) jaxpr={ ... }
//                          manual_axes=frozenset({'x', 'y'}) mesh=Mesh('x': 4, 'y': 2)
//                          out_specs=(P('x', None),)] a b
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "cjax/shard_map.h"
#include "core/array/primitive.h"
#include "core/array/spmd.h"
#include "trace/jaxpr.h"

namespace cjax {

struct MeshParam final : ParamObject {
  explicit MeshParam(Mesh m) : mesh(std::move(m)) {}
  Mesh mesh;
  std::string str() const override { return mesh.str(); }
  size_t hash() const override { return mesh.hash(); }
  bool equals(const ParamObject& o) const override;
};
// A tuple of specs, one per input or output: (P('x', 'y'), P('y', None)).
struct SpecsParam final : ParamObject {
  explicit SpecsParam(std::vector<PartitionSpec> s) : specs(std::move(s)) {}
  std::vector<PartitionSpec> specs;
  std::string str() const override;
  size_t hash() const override;
  bool equals(const ParamObject& o) const override;
};
// frozenset({'x', 'y'}), in mesh order.
struct ManualAxesParam final : ParamObject {
  explicit ManualAxesParam(std::vector<std::string> n) : names(std::move(n)) {}
  std::vector<std::string> names;
  std::string str() const override;
  size_t hash() const override;
  bool equals(const ParamObject& o) const override;
};

extern const PrimitiveDef& g_shard_map;

// The parameters of one shard_map equation, unpacked.
struct ShardMapInfo {
  Mesh mesh;
  std::vector<PartitionSpec> in_specs, out_specs;
  std::shared_ptr<const Jaxpr> body;
  bool check_vma = true;
  std::vector<std::string> manual_axes;  // mesh order
  static ShardMapInfo from(const Params& p);
  Params params() const;
  std::vector<ManualAxis> axis_frame() const;  // for AxisEnvScope
  static std::vector<ManualAxis> axis_frame(const Mesh& mesh, const std::vector<std::string>& manual_axes,
                                            bool check_vma);
};

// Shape of one device's block of a value of `global` shape under `spec` (sizes already checked).
Shape block_shape(const Mesh& mesh, const PartitionSpec& spec, const Shape& global);
Shape global_shape(const Mesh& mesh, const PartitionSpec& spec, const Shape& block);
// The axes a spec names, sorted (a block's varying axes).
std::vector<std::string> spec_vma(const PartitionSpec& spec);
// The NamedSharding of each spec over one mesh, made once (a sharding copies its mesh) and shared
// by the arrays a call splits and assembles.
class NamedShardings {
 public:
  explicit NamedShardings(const Mesh& mesh) : mesh_(mesh) {}
  const std::shared_ptr<const NamedSharding>& of(const PartitionSpec& spec);

 private:
  const Mesh& mesh_;
  std::vector<std::shared_ptr<const NamedSharding>> made_;
};
// Per mesh device, its block of `x` under `sharding` (no copy when x is already laid out that way).
std::vector<Array> slice_blocks(const Array& x, const NamedSharding& sharding);
// The global array whose per-device blocks are `blocks` under `sharding`.
Array assemble_blocks(std::vector<Array> blocks, const std::shared_ptr<const NamedSharding>& sharding,
                      AbstractValue global);
// Binds a shard_map equation (the front end after tracing, and the rules).
std::vector<Array> bind_shard_map(const ShardMapInfo& info, std::span<const Array> args);
// True if the primitive's sub-jaxprs contain an equation that needs_communicator (at any depth).
bool contains_collective(const Params& params);
// True if running an equation of `def` inside an SPMD body exchanges blocks between the devices,
// so that it cannot run for each device on its own (a lockstep segment, one bind per device of the
// eager ShardMapTrace): a collective, a nested shard_map whose out_specs name an axis (its outputs
// are all_gathered) or a higher-order primitive whose sub-jaxprs contain either.
bool needs_communicator(const PrimitiveDef& def, const Params& params);
// Out-specs check (docs/shard_map.md §2.4): VmaError when an output varies over an axis its spec does not name.
void check_out_vma(const std::string& fn, const Mesh& mesh, const std::vector<std::string>& manual_axes,
                   const std::vector<PartitionSpec>& out_specs, const std::vector<AbstractValue>& out_avals);

// Bodies built by the shard_map transpose rule (the backward pass), for the collective recorder.
void mark_transposed_body(const std::shared_ptr<const Jaxpr>& body);
bool is_transposed_body(const Jaxpr* body);

// Eager shard_map: runs `f` under a ShardMapTrace (trace/shard_map_trace.cpp).
std::vector<Array> eager_shard_map(const shard_map_detail::FlatFn& f, const Mesh& mesh, const std::vector<Array>& args,
                                   const std::vector<PartitionSpec>& in_specs, std::vector<PartitionSpec>& out_specs,
                                   const ShardMapOptions& opts, const std::vector<std::string>& manual_axes);
// Prepares one output of the body: out-spec rank check and implicit pvary over the named axes.
void check_out_rank(const std::string& fn, size_t index, const PartitionSpec& spec, const AbstractValue& block);

}  // namespace cjax
