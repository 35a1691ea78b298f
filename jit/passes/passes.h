// Jaxpr-to-jaxpr passes run by jit before execution (docs/design.md §5.3):
//   inline_calls   : `jit`, `remat2`, `custom_jvp_call` and `custom_vjp_call` equations are replaced
//                    by their bodies (they run as one program and fuse; remat bodies can then be
//                    CSE'd with identical values outside them, which XLA prevents with
//                    optimization barriers and we do not yet: a memory, not a value, difference),
//   fuse_attention : softmax attention written out by hand (logits = q·k, a scale, an optional
//                    causal mask evaluated at compile time, softmax, ·v) becomes flash_attention
//                    where its intermediates have no other use (forward programs; under grad they
//                    are residuals): jit/passes/fuse_attention.cpp,
//   unbroadcast_shard_map_boundaries : a shard_map output that its body computes as a broadcast
//                    (a softmax's row sums, kept for the backward pass) is returned as the source
//                    and broadcast by the caller; a shard_map operand that is a broadcast is
//                    passed as its source and broadcast in the body. Only where the broadcast
//                    dimensions are unsharded. Row values then cross from the forward body to the
//                    backward one at row size instead of per element; a replicated operand that
//                    broadcasts a scalar literal is dropped and built in the body (recursively),
//                    so neither the caller materializes it nor the body's kernels load it,
//   merge_shard_maps : consecutive shard_maps over the same mesh and manual axes (grad's forward
//                    and backward bodies, an optimizer's shard_map after them) become one, whose
//                    body reads a value that crossed between them under one spec directly: the
//                    lockstep runner no longer stops every device, assembles the results and cuts
//                    them into blocks again at each boundary,
//   sink_broadcasts: an elementwise equation whose operands are all the same broadcast_in_dim
//                    (of equal-shaped sources; scalar literals aside) runs on the sources and is
//                    broadcast after: a softmax's 1 / sum^2, kept for the backward pass, is one
//                    value per row instead of one per element; a reduce_sum over only the size-1
//                    axes a broadcast_in_dim added (the transpose of x[..., None]) is the
//                    broadcast's source, so a normalization's backward is not split there,
//   fold_constants : equations whose inputs are all literals and whose outputs are scalars are
//                    evaluated at compile time and become literals,
//   cse            : an equation identical to an earlier one (primitive, params, inputs) reuses
//                    its outputs,
//   concatenate_pads : a sum (add, add_any) of zero pads along one axis that tile it, what the
//                    transpose of slicing a tensor into pieces emits (the gradient of q, k, v
//                    split from one projection), becomes one concatenate of the pieces: no
//                    zero-filled full-size buffers, no adds,
//   simplify_transposes : identity transposes disappear, and a transpose that only swaps the
//                    free dimensions of a dot_general's result (what the transpose rule of
//                    dot_general emits for weight gradients) becomes the dot_general with its
//                    operands swapped, so no transposed copy is materialized; a slice of a
//                    transpose, and the transpose of a concatenate, move to the other side where
//                    the transposes left over only move dimensions of size 1 (reshapes): a fused
//                    q/k/v projection's three pieces are sliced from the dot_general's result,
//                    and their gradients concatenated into the layout its gradients read,
//   pack_attention : flash attention whose q, k and v are three slices of one value along one axis
//                    (a fused q/k/v projection's result) reads that value's rows in place, and its
//                    backward writes the concatenate of dq, dk and dv that follows it as one
//                    gradient: flash_attention_packed and flash_attention_backward_packed
//                    (core/lax/attention.h), no sliced copies and no concatenate
//                    (CJAX_PACK_ATTENTION=0: off),
//   fuse_gemm_updates : `acc - s * dot_general(a, b)` (an SGD step on a weight gradient; also
//                    `+`, without `s`, either operand order) becomes dot_general_accumulate, one
//                    BLAS call with beta = 1 that the executable runs in place over a dying or
//                    donated acc: the gradient is never materialized (f32/f64, single-use dot),
//   recompute_elementwise : an elementwise value that a kernel after a GEMM (or another library
//                    step) reads is computed again in that kernel from its inputs, where it is a
//                    short chain and that reads fewer bytes (GELU's residuals in a gradient):
//                    one write and one read of it fewer (CJAX_RECOMPUTE_ELEMENTWISE=0: off).
//                    After fuse_gemm_updates: a residual sum folded into a GEMM is in memory
//                    anyway and roots a chain (before, RMSNorm's 2x went back through every
//                    residual add of the network and was kept),
//   recompute_shard_map_residuals : the same between the forward and backward shard_maps that
//                    grad of a shard_map makes: a residual the forward returns only for the
//                    backward, an elementwise chain of other residuals it returns for it, is
//                    dropped and computed again at the start of the backward body (same switch),
//   dce            : equations none of whose outputs is used are dropped.
// splat_constants runs first, with the closed jaxpr's values: a constant whose elements are all
// equal (jnp::zeros, ones, full, full_like evaluated while tracing: an attention mask's fill
// value, an all-true mask) becomes broadcast_in_dim of a scalar literal, which the fusion
// planner folds into the kernels that read it instead of loading the array element by element.
// All passes keep the jaxpr's constvars, invars and output types.
#pragma once
#include <memory>

#include "trace/jaxpr.h"

namespace cjax {

std::shared_ptr<const Jaxpr> splat_constants(const Jaxpr& jaxpr, const std::vector<Array>& consts);
std::shared_ptr<const Jaxpr> inline_calls(const Jaxpr& jaxpr);
std::shared_ptr<const Jaxpr> fuse_attention(const Jaxpr& jaxpr, const std::vector<Array>& consts);
std::shared_ptr<const Jaxpr> unbroadcast_shard_map_boundaries(const Jaxpr& jaxpr);
std::shared_ptr<const Jaxpr> sink_broadcasts(const Jaxpr& jaxpr);
std::shared_ptr<const Jaxpr> fold_constants(const Jaxpr& jaxpr);
std::shared_ptr<const Jaxpr> cse(const Jaxpr& jaxpr);
std::shared_ptr<const Jaxpr> concatenate_pads(const Jaxpr& jaxpr);
// Elementwise values read after a GEMM or other library step by fusible equations are computed
// again there from their inputs, when each is a short elementwise chain (at most 12 equations)
// over variables of its shape and the run of fusible equations that reads them would read fewer
// bytes that way: candidates sharing a root the run does not read anyway are decided together,
// the roots' bytes against the values'. The earlier kernel no longer writes them out, nor the
// later one reads them back (a gradient's forward residuals). Runs after cse, which would merge
// the copies back.
std::shared_ptr<const Jaxpr> recompute_elementwise(const Jaxpr& jaxpr);
std::shared_ptr<const Jaxpr> recompute_shard_map_residuals(const Jaxpr& jaxpr);
std::shared_ptr<const Jaxpr> merge_shard_maps(const Jaxpr& jaxpr);
std::shared_ptr<const Jaxpr> simplify_transposes(const Jaxpr& jaxpr);
std::shared_ptr<const Jaxpr> pack_attention(const Jaxpr& jaxpr);
std::shared_ptr<const Jaxpr> fuse_gemm_updates(const Jaxpr& jaxpr);
// dce: trace/jaxpr.h.
// All of the above, in that order (`consts`: the values of the jaxpr's constvars).
std::shared_ptr<const Jaxpr> optimize(const Jaxpr& jaxpr, const std::vector<Array>& consts = {});

}  // namespace cjax
