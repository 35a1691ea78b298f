// optimize: the pass pipeline jit runs (jit/passes/passes.h).
#include <absl/hash/hash.h>
#include <fmt/format.h>

#include <cstdlib>
#include <cstring>
#include <functional>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "cjax/lax.h"
#include "core/array/kernel_table.h"
#include "core/array/trace.h"
#include "core/backend/backend.h"
#include "core/lax/linalg.h"
#include "jit/passes/passes.h"
#include "jit/passes/rewrite.h"
#include "trace/eval_jaxpr.h"

namespace cjax {
using namespace passes_detail;

namespace {
// CJAX_RECOMPUTE_ELEMENTWISE=0 keeps every forward residual (for A/B measurements).
bool recompute_enabled() {
  const char* v = std::getenv("CJAX_RECOMPUTE_ELEMENTWISE");
  return !(v && std::strcmp(v, "0") == 0);
}
}  // namespace

std::shared_ptr<const Jaxpr> optimize(const Jaxpr& jaxpr, const std::vector<Array>& consts) {
  auto j = inline_calls(jaxpr);
  j = fuse_attention(*j, consts);
  j = unbroadcast_shard_map_boundaries(*j);
  j = sink_broadcasts(*j);
  j = fold_constants(*j);
  j = cse(*j);
  j = concatenate_pads(*j);
  if (recompute_enabled()) j = recompute_elementwise(*j);
  j = simplify_transposes(*j);
  j = fuse_gemm_updates(*j);
  return dce(*j);
}

}  // namespace cjax
