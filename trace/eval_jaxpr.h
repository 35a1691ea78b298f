// eval_jaxpr and check_jaxpr (JAX's jax.core.eval_jaxpr / jax.core.check_jaxpr).
//
// eval_jaxpr walks a jaxpr's equations and binds each primitive under the CURRENT trace, so it
// composes with every transformation: eagerly it computes values; under make_jaxpr it stages
// the same equations again. Literals are bound as their (concrete, rank-0) arrays.
//
// check_jaxpr validates a jaxpr's typing: every variable is defined once before it is used,
// and each equation's output avals are what its primitive's abstract_eval gives for its input
// avals. Sub-jaxprs held by JaxprParam params are checked recursively.
#pragma once
#include <span>
#include <vector>

#include "cjax/make_jaxpr.h"
#include "trace/jaxpr.h"

namespace cjax {

// Evaluates `jaxpr` on `consts` (one per constvar) and `args` (one per invar), returning one
// Array per outvar. Raises ValueError on a wrong number of consts/args, ShapeError/DTypeError
// naming the argument index and both types when an argument's shape/dtype differs from its
// variable's (weak types are not compared, as they only steer promotion).
std::vector<Array> eval_jaxpr(const Jaxpr& jaxpr, std::span<const Array> consts, std::span<const Array> args);
// The same with the closed jaxpr's consts.
std::vector<Array> eval_jaxpr(const ClosedJaxpr& jaxpr, std::span<const Array> args);

// Raises cjax::Error naming the equation and the problem if `jaxpr` is ill-formed.
void check_jaxpr(const Jaxpr& jaxpr);
inline void check_jaxpr(const ClosedJaxpr& jaxpr) { check_jaxpr(*jaxpr); }

}  // namespace cjax
