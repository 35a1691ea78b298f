// Where a shard_map body's collectives run. Every collective is a point at which all devices meet
// (in a lockstep run, a barrier of the thread pool; across processes, a round trip), so a body
// should meet as few times as its data dependencies allow, as XLA's collective combiners and
// latency-hiding scheduler arrange.
#pragma once
#include <cstdint>
#include <vector>

#include "jit/fusion.h"

namespace cjax {

// Reorders `plan.steps`: each collective becomes ready once its operands are computed and runs
// when a later step first needs its result (or at the end); the collectives ready at that point
// run there together, in program order, as one group. Everything else keeps its order. The
// extra memory this may hold is bounded by `max_group_bytes` per group: the results of
// collectives moved earlier (an FSDP all_gather of a weight needed later) count towards the
// group; operands of collectives moved later (a gradient's reduce_scatter) are kept at most
// that many bytes before they run. A group that needs more than the bound runs what it needs.
// Results are the same, bit for bit: only the order of independent steps changes.
void schedule_collectives(FusionPlan& plan, int64_t max_group_bytes);

// CJAX_COLLECTIVE_GROUP_MB (default 32 MiB, as XLA's combiner thresholds), in bytes; 0 keeps
// every collective where the program put it.
int64_t collective_group_bytes();

}  // namespace cjax
