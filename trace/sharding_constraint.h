// The sharding_constraint primitive's parameter, for the passes that read it (the partitioner).
#pragma once
#include "cjax/sharding.h"
#include "core/array/primitive.h"

namespace cjax {
// The sharding a `sharding_constraint` equation asks for.
const Sharding& sharding_constraint_target(const Params& p);
}  // namespace cjax
