// Partial evaluation of a jaxpr (JAX's pe.partial_eval_jaxpr_nounits): given which inputs are
// unknown, split it into
//   known:   known inputs            -> known outputs + residuals
//   unknown: residuals + unknown ins -> unknown outputs
// An equation is unknown if any of its inputs is; higher-order equations with mixed inputs are
// split by their own partial-eval rules (core/array/rules.h), so nested jit/cond/scan split too.
// It works by re-tracing: the jaxpr is evaluated under a ForwardKnown JaxprTrace (unknown side)
// whose parent is a staging JaxprTrace (known side), the same machinery linearize uses.
#pragma once
#include <memory>
#include <vector>

#include "cjax/make_jaxpr.h"
#include "trace/jaxpr.h"
#include "trace/jaxpr_trace.h"  // convert_constvars_to_invars

namespace cjax {

struct PartialEvalResult {
  ClosedJaxpr known;                     // its consts: concrete values the known side closed over
  std::shared_ptr<const Jaxpr> unknown;  // no constvars; invars: residuals then unknown inputs
  std::vector<bool> out_unknown;         // per output of the original jaxpr
  size_t num_residuals = 0;
};

// The traced unknown side without its dead equations and without the constvars (residuals) only
// those read: a tangent that dies (one reaching stop_gradient, as softmax's max does) takes its
// residuals with it, as JAX DCEs the unknown jaxpr. Used by every partial-eval rule.
ClosedJaxpr dce_residuals(const ClosedJaxpr& traced);

// `jaxpr` must have no constvars (convert them to inputs first). With `instantiate`, every
// output is made unknown (known values are forwarded through the unknown jaxpr as residuals).
PartialEvalResult partial_eval_jaxpr(const Jaxpr& jaxpr, const std::vector<bool>& unknown_inputs,
                                     bool instantiate = false);

}  // namespace cjax
