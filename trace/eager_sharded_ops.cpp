// Eager primitives on sharded arrays (docs/sharding.md §1.4), so that data never leaves its
// devices. Fast paths run per block through an eager shard_map over the arrays' mesh, without
// compiling:
//  * elementwise primitives whose non-scalar operands share one NamedSharding (operands that are
//    on one device or fully replicated are split into the same blocks first);
//  * reduce_sum / reduce_max / reduce_min over any axes: per-block reductions, then psum / pmax /
//    pmin over the mesh axes that split reduced dimensions (a fixed member order, so results are
//    deterministic); the result stays split over the dimensions it keeps.
// Everything else is JAX's eager = jit of one op: the partitioner of sharded jit
// (jit/partition/eager.cpp, registered through set_partitioned_eager) runs it with its sharding
// rules. sharding_constraint takes any layout itself (takes_sharded_operands).
#include "trace/eager_sharded_ops.h"

#include <fmt/format.h>

#include <algorithm>

#include "cjax/collectives.h"
#include "cjax/shard_map.h"
#include "core/array/array_impl.h"
#include "core/array/trace.h"

namespace cjax {
namespace {

const NamedSharding* split_sharding(const Array& x) {
  auto* c = concrete(x);
  if (!c || c->buffers.size() <= 1 || !c->sharding) return nullptr;
  auto* ns = dynamic_cast<const NamedSharding*>(c->sharding.get());
  return ns && !ns->is_fully_replicated() ? ns : nullptr;
}

[[noreturn]] void refuse(const PrimitiveDef& def, size_t i, const Array& x, std::string_view why) {
  throw ShardingError(
      fmt::format("'{}' input {}: {} (an array of shape {} with sharding {}). Reshard explicitly: "
                  "device_put(x, NamedSharding(mesh, P())) replicates it, device_put(x, SingleDeviceSharding(device)) "
                  "moves it "
                  "to one device; or compute it per block inside shard_map(f, mesh, in_specs, out_specs) with explicit "
                  "collectives",
                  def.name, i, why, shape_str(x.shape()), x.sharding().str()));
}

std::vector<Array> run_blockwise(const PrimitiveDef& def, const Params& params, const Mesh& mesh,
                                 const std::vector<Array>& args, const std::vector<PartitionSpec>& in_specs,
                                 std::vector<PartitionSpec> out_specs, const std::vector<Array>& scalars,
                                 const std::vector<int>& scalar_pos,
                                 const std::function<std::vector<Array>(std::vector<Array>)>& finish) {
  std::vector<std::string> names;
  for (size_t i = 0; i < args.size(); ++i) names.push_back("args[" + std::to_string(i) + "]");
  shard_map_detail::FlatFn f = [&](const std::vector<Array>& blocks) {
    std::vector<Array> ins;
    size_t b = 0, s = 0;
    for (size_t k = 0; k < scalar_pos.size(); ++k) ins.push_back(scalar_pos[k] >= 0 ? scalars[s++] : blocks[b++]);
    return finish(cjax::bind(def, ins, params));
  };
  ShardMapOptions opts;
  opts.name = def.name;
  return shard_map_detail::shard_map(f, mesh, args, in_specs, names, out_specs, opts);
}

SpmdEagerFn& partitioned_slot() {
  static SpmdEagerFn fn;
  return fn;
}

}  // namespace

bool set_partitioned_eager(SpmdEagerFn fn) {
  partitioned_slot() = std::move(fn);
  return true;
}

namespace {

// Elementwise primitives over operands of one layout and reductions: per block, without compiling.
std::optional<std::vector<Array>> per_shard(const PrimitiveDef& def, std::span<const Array> inputs,
                                            const Params& params) {
  const NamedSharding* s = nullptr;
  size_t first = 0;
  for (size_t i = 0; i < inputs.size() && !s; ++i)
    if ((s = split_sharding(inputs[i]))) first = i;
  const Mesh& mesh = s->mesh();
  const PartitionSpec& spec = s->spec();

  if (def.kind == PrimKind::Elementwise) {
    std::vector<Array> args, scalars;
    std::vector<int> pos;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const Array& x = inputs[i];
      if (x.ndim() == 0) {
        pos.push_back(int(scalars.size()));
        scalars.push_back(x);
        continue;
      }
      if (x.shape() != inputs[first].shape()) return std::nullopt;
      const NamedSharding* xs = split_sharding(x);
      if (xs && !(*xs == *s)) return std::nullopt;
      pos.push_back(-1);
      args.push_back(x);
    }
    std::vector<PartitionSpec> in_specs(args.size(), spec);
    return run_blockwise(def, params, mesh, args, in_specs, {spec}, scalars, pos,
                         [](std::vector<Array> o) { return o; });
  }

  if (def.name == "reduce_sum" || def.name == "reduce_max" || def.name == "reduce_min") {
    const Array& x = inputs[0];
    const auto& axes = params.ints("axes");
    std::vector<std::string> reduced_mesh_axes;
    std::vector<PartitionSpec::Entry> kept;
    for (size_t d = 0; d < size_t(x.ndim()); ++d) {
      PartitionSpec::Entry e = d < spec.size() ? spec.entries()[d] : PartitionSpec::Entry(None);
      if (std::find(axes.begin(), axes.end(), int64_t(d)) != axes.end())
        reduced_mesh_axes.insert(reduced_mesh_axes.end(), e.names.begin(), e.names.end());
      else
        kept.push_back(e);
    }
    while (!kept.empty() && kept.back().names.empty()) kept.pop_back();
    PartitionSpec out_spec(kept);
    std::string which = def.name;
    return run_blockwise(def, params, mesh, {x}, {spec}, {out_spec}, {}, {-1}, [&](std::vector<Array> o) {
      if (reduced_mesh_axes.empty()) return o;
      AxisNames a(reduced_mesh_axes);
      if (which == "reduce_sum") return std::vector<Array>{lax::psum(o[0], a)};
      if (which == "reduce_max") return std::vector<Array>{lax::pmax(o[0], a)};
      return std::vector<Array>{lax::pmin(o[0], a)};
    });
  }
  return std::nullopt;
}

}  // namespace

// JAX's eager op on sharded arrays is a jit of that op: what has no per-shard path runs through
// the partitioner (its sharding rules; gathered with a warning where a primitive has none).
std::vector<Array> process_sharded(const PrimitiveDef& def, std::span<const Array> inputs, const Params& params) {
  if (auto r = per_shard(def, inputs, params)) return *r;
  if (partitioned_slot()) return partitioned_slot()(def, inputs, params);
  size_t first = 0;
  while (first + 1 < inputs.size() && !split_sharding(inputs[first])) ++first;
  refuse(def, first, inputs[first], "no per-shard path, and cjax never gathers a sharded array silently");
}

const bool g_sharded_eager_registered = set_sharded_eager(process_sharded);

}  // namespace cjax
