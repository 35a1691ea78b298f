// optimize: the pass pipeline jit runs (jit/passes/passes.h).
#include <absl/hash/hash.h>
#include <fmt/format.h>

#include <cstring>
#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "cjax/lax.h"
#include "core/array/kernel_table.h"
#include "core/array/trace.h"
#include "core/array/util.h"
#include "core/backend/backend.h"
#include "core/lax/linalg.h"
#include "jit/passes/passes.h"
#include "jit/passes/rewrite.h"
#include "trace/eval_jaxpr.h"

namespace cjax {
using namespace passes_detail;

std::shared_ptr<const Jaxpr> optimize(const Jaxpr& jaxpr, const std::vector<Array>& consts) {
  auto j = inline_calls(jaxpr);
  j = fuse_attention(*j, consts);
  if (env_not_off("CJAX_MERGE_SHARD_MAPS")) j = merge_shard_maps(*j);  // =0: off (A/B runs)
  j = unbroadcast_shard_map_boundaries(*j);
  if (env_not_off("CJAX_RECOMPUTE_ELEMENTWISE")) j = recompute_shard_map_residuals(*j);
  j = sink_broadcasts(*j);
  j = fold_constants(*j);
  j = cse(*j);
  j = concatenate_pads(*j);
  j = simplify_transposes(*j);
  if (env_not_off("CJAX_PACK_ATTENTION")) j = pack_attention(*j);  // =0: off (A/B runs)
  j = fuse_gemm_updates(*j);
  if (env_not_off("CJAX_RECOMPUTE_ELEMENTWISE")) j = recompute_elementwise(*j);  // =0: off (A/B runs)
  return dce(*j);
}

}  // namespace cjax
