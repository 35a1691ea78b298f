// The control-flow primitives (JAX's cond, while and scan; public API in cjax/control_flow.h):
// their params, binders and the tracing helpers their rules share.
//
//   cond[branches=(j0 j1 ...)] index consts... ops...      index: i32 scalar in [0, n)
//   while[body_jaxpr body_nconsts cond_jaxpr cond_nconsts] cond_consts... body_consts... carry...
//   scan[_split_transpose jaxpr length linear num_carry num_consts reverse unroll] consts... carry... xs...
//
// Sub-jaxprs have no constvars: closed-over values are leading inputs (consts), as JAX's
// initial-style primitives. scan's body maps (consts, carry, x) -> (carry, y); its xs and ys
// have the scan axis first. The rules (autodiff/rules_control_flow.cpp,
// trace/control_flow_batching.cpp) transform the sub-jaxprs and bind new equations.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cjax/control_flow.h"
#include "trace/jaxpr.h"
#include "trace/jaxpr_trace.h"  // TracedCall, trace_to_call

namespace cjax {

using JaxprPtr = std::shared_ptr<const Jaxpr>;
using FlatFn = std::function<std::vector<Array>(const std::vector<Array>&)>;

const PrimitiveDef& cond_primitive();
const PrimitiveDef& while_primitive();
const PrimitiveDef& scan_primitive();

std::vector<AbstractValue> avals_of(std::span<const Array> xs);
// xs[lo, hi) as a vector.
std::vector<Array> slice_of(std::span<const Array> xs, size_t lo, size_t hi);

// Traces each function on `in_avals`; the jaxprs all take (every function's consts..., inputs...)
// (JAX's _initial_style_jaxprs_with_common_consts) so they can be branches of one cond.
struct TracedBranches {
  std::vector<JaxprPtr> jaxprs;
  std::vector<Array> consts;
};
TracedBranches trace_branches(const std::vector<FlatFn>& fns, const std::vector<AbstractValue>& in_avals,
                              const std::vector<std::string>& what = {});

// ---- cond ----
std::vector<JaxprPtr> cond_branches(const Params& p);
Params cond_param_map(std::vector<JaxprPtr> branches);
std::vector<Array> bind_cond(const Array& index, std::vector<JaxprPtr> branches, std::span<const Array> ops);

// ---- while ----
struct WhileParams {
  JaxprPtr cond_jaxpr, body_jaxpr;
  int64_t cond_nconsts = 0, body_nconsts = 0;
};
WhileParams while_params(const Params& p);
std::vector<Array> bind_while(const WhileParams& wp, std::span<const Array> args);

// ---- scan ----
struct ScanParams {
  JaxprPtr jaxpr;
  int64_t length = 0, num_consts = 0, num_carry = 0, unroll = 1;
  bool reverse = false;
  size_t num_xs() const { return jaxpr->invars().size() - size_t(num_consts + num_carry); }
  size_t num_ys() const { return jaxpr->outvars().size() - size_t(num_carry); }
};
ScanParams scan_params(const Params& p);
Params scan_param_map(const ScanParams& sp, size_t num_args);
std::vector<Array> bind_scan(const ScanParams& sp, std::span<const Array> args);

// ValueError for reverse-mode differentiation of while (JAX's message, naming the alternatives).
[[noreturn]] void raise_while_not_reverse_differentiable();

}  // namespace cjax
