// Eager operations on arrays split over a mesh, through the partitioner (JAX's eager = jit of one
// op): a primitive without a per-shard fast path (trace/eager_sharded_ops.cpp), and device_put
// from one layout to another over the same mesh, which moves only the blocks that must move.
// Each distinct (primitive, parameters, operand types and layouts) is partitioned and compiled
// once and kept (up to kCapacity programs, then the cache starts over).
#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "core/array/array_impl.h"
#include "core/spmd/reshard_hook.h"
#include "jit/executable.h"
#include "jit/partition/partitioner.h"
#include "trace/eager_sharded_ops.h"
#include "trace/eval_jaxpr.h"

namespace cjax::partition {
namespace {

constexpr size_t kCapacity = 512;

const NamedSharding* split_of(const Array& x) {
  auto* c = concrete(x);
  if (!c || !c->sharding) return nullptr;
  auto* ns = dynamic_cast<const NamedSharding*>(c->sharding.get());
  return ns && !ns->is_fully_replicated() ? ns : nullptr;
}

struct ProgramCache {
  std::mutex mu;
  struct Entry {
    std::shared_ptr<const Executable> exe;
    std::shared_ptr<const void> keep;  // a jaxpr whose address is part of the key
  };
  std::unordered_map<std::string, Entry> programs;
};
ProgramCache& cache() {
  static ProgramCache c;
  return c;
}

// The compiled partition of `f` over `inputs` (their layouts as they are), memoized under `key`,
// over the mesh of the split inputs (`mesh` where none is split: replicated over it).
std::vector<Array> run_partitioned(const std::string& what, const std::string& key, std::span<const Array> inputs,
                                   const std::function<std::vector<Array>(const std::vector<Array>&)>& f,
                                   const std::vector<std::optional<PartitionSpec>>& out_specs,
                                   const Mesh* mesh = nullptr, std::shared_ptr<const void> keep = nullptr) {
  std::vector<PartitionSpec> specs(inputs.size());
  std::vector<AbstractValue> avals;
  std::string full = key;
  for (size_t i = 0; i < inputs.size(); ++i) {
    avals.push_back(inputs[i].aval());
    full += "|" + inputs[i].aval().str();
    if (const NamedSharding* s = split_of(inputs[i])) {
      if (mesh && !(s->mesh() == *mesh))
        throw ShardingError(
            fmt::format("{}: operand {} is split over {}, another operand over {}; device_put them "
                        "onto one mesh",
                        what, i, s->mesh().str(), mesh->str()));
      mesh = &s->mesh();
    }
  }
  if (!mesh) throw Error(fmt::format("internal: {} on operands split over no mesh", what));
  // Every operand placed on the mesh enters with its own spec (also a trivial split over axes of
  // size 1), so that the program's shard_map takes its blocks as they are.
  for (size_t i = 0; i < inputs.size(); ++i)
    if (auto* c = concrete(inputs[i]); c && c->sharding)
      if (auto* ns = dynamic_cast<const NamedSharding*>(c->sharding.get()); ns && ns->mesh() == *mesh) {
        specs[i] = ns->spec();
        full += std::to_string(i) + ":" + ns->spec().str();
      }
  full += mesh->str();
  for (const Device& d : mesh->devices()) full += fmt::format(",{}", d.id());
  std::shared_ptr<const Executable> exe;
  {
    std::lock_guard lock(cache().mu);
    if (auto it = cache().programs.find(full); it != cache().programs.end()) exe = it->second.exe;
  }
  if (!exe) {
    ClosedJaxpr traced;
    {
      TraceScope root(eval_trace());
      traced = jaxpr_detail::trace_flat(f, avals, what);
    }
    Partitioned part = partition(traced, *mesh, specs, out_specs, what);
    exe = std::make_shared<const Executable>(part.program, what);
    std::lock_guard lock(cache().mu);
    if (cache().programs.size() >= kCapacity) cache().programs.clear();
    cache().programs.emplace(full, ProgramCache::Entry{exe, std::move(keep)});
  }
  return exe->run(inputs);
}

std::vector<Array> eager_primitive(const PrimitiveDef& def, std::span<const Array> inputs, const Params& params) {
  std::string key = fmt::format("{}#{}", def.name, params.hash());
  for (const auto& [name, value] : params.items()) key += name + "=" + param_value_str(value) + ";";
  return run_partitioned(fmt::format("'{}' on sharded operands", def.name), key, inputs,
                         [&](const std::vector<Array>& xs) { return cjax::bind(def, xs, params); }, {});
}

Array reshard(const Array& x, const NamedSharding& to) {
  std::vector<Array> in{x};
  return run_partitioned(
      "device_put", "device_put->" + to.spec().str(), in, [](const std::vector<Array>& xs) { return xs; }, {to.spec()},
      &to.mesh())[0];
}

const bool g_registered = set_partitioned_eager(eager_primitive) && set_mesh_reshard(reshard);

}  // namespace

std::optional<std::vector<Array>> run_split(const std::shared_ptr<const Jaxpr>& jaxpr, std::span<const Array> inputs,
                                            const std::string& name) {
  if (std::none_of(inputs.begin(), inputs.end(), [](const Array& x) { return split_of(x) != nullptr; }) ||
      contains_primitive(*jaxpr, "shard_map"))
    return std::nullopt;
  return run_partitioned(
      fmt::format("jit '{}' (run eagerly by a transformation)", name), fmt::format("jit@{}", (const void*)jaxpr.get()),
      inputs, [&](const std::vector<Array>& xs) { return eval_jaxpr(*jaxpr, {}, xs); }, {}, nullptr, jaxpr);
}
}  // namespace cjax::partition
