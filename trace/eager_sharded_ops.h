// Eager primitives on split arrays (trace/eager_sharded_ops.cpp): those without a per-shard path
// run through the partitioner of sharded jit, which registers itself here at static
// initialisation (it is a layer above).
#pragma once
#include "core/array/trace.h"

namespace cjax {
bool set_partitioned_eager(SpmdEagerFn fn);
}  // namespace cjax
