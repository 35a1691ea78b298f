// Internals shared by the custom-derivative primitives (custom_jvp_call, custom_vjp_call,
// custom_lin: autodiff/custom_derivatives.cpp) and the checkpoint primitive (remat2:
// autodiff/checkpoint.cpp). The public templates are in cjax/custom_derivatives.h.
#pragma once
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cjax/custom_derivatives.h"
#include "core/array/rules.h"
#include "trace/jaxpr.h"
#include "trace/jaxpr_trace.h"  // TracedCall, trace_to_call

namespace cjax::custom_detail {

std::vector<AbstractValue> avals_of(std::span<const Array> xs);

// Batched inputs moved to batch dimension 0 (unbatched ones left alone), and which are batched.
struct FrontBatched {
  std::vector<Array> args;
  std::vector<int> bdims;  // 0 or kNotMapped
};
FrontBatched move_batch_to_front(std::span<const Array> args, std::span<const int> bdims, int64_t size);

// `f` vmapped over `in_bdims` (0 or kNotMapped) with every output batched at 0.
std::vector<Array> vmap_all_out_front(const FlatFn& f, std::span<const Array> xs, const std::vector<int>& in_bdims,
                                      const BatchAxis& axis);

// The call of `jaxpr` (no constvars) batched as `vmap_all_out_front`, traced for the front-batched
// arguments: its invars are the traced call's consts then `front.args`.
TracedCall batch_jaxpr_call(std::shared_ptr<const Jaxpr> jaxpr, const FrontBatched& front, const BatchAxis& axis);

}  // namespace cjax::custom_detail
