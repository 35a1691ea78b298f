// The `jit` primitive (JAX's pjit, printed `jit[name=f jaxpr={ ... }]`): a call of a staged
// function. It is what `jit(f)` binds when called under another transformation, so grad(jit f),
// vmap(jit f) and make_jaxpr(jit f) keep the call as one equation. Params: `name` (string) and
// `jaxpr` (a JaxprParam holding a Jaxpr without constvars: constants are passed as leading
// inputs). Its rules transform the sub-jaxpr and bind a new `jit`:
//   JVP: jit of the JVP jaxpr; partial eval: known jit (primal + residuals) and unknown jit;
//   transpose: jit of the backward pass; batching: jit of the vmapped jaxpr.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cjax/make_jaxpr.h"
#include "trace/jaxpr.h"
#include "trace/jaxpr_trace.h"  // TracedCall, trace_to_call

namespace cjax {

const PrimitiveDef& jit_primitive();

// Binds `jit` under the current trace for `jaxpr` (its consts become leading inputs).
std::vector<Array> bind_jit(const ClosedJaxpr& jaxpr, const std::string& name, std::span<const Array> args);
// The same for a jaxpr without constvars.
std::vector<Array> bind_jit(std::shared_ptr<const Jaxpr> jaxpr, const std::string& name, std::span<const Array> args);

}  // namespace cjax
