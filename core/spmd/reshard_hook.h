// How device_put moves an array split over a mesh to another layout over the same mesh: the
// sharded jit layer (jit/partition/eager.cpp) registers a reshard that moves only the blocks
// that must move (all_gather / all_to_all / local slices), at static initialisation.
#pragma once
#include <functional>

#include "cjax/sharding.h"

namespace cjax {
using MeshReshardFn = std::function<Array(const Array& x, const NamedSharding& to)>;
bool set_mesh_reshard(MeshReshardFn fn);
const MeshReshardFn& mesh_reshard();
}  // namespace cjax
