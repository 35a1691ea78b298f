// Forward- and reverse-mode differentiation on flat lists of arrays (docs/design.md §4).
//
//  * JVPTrace carries (primal, tangent) pairs; a symbolic zero tangent is an undefined handle and
//    a value with zero tangent is never wrapped. Each primitive's JVP rule (core/array/rules.h) runs
//    with the current trace set to the tangent context: the parent trace for jvp, the linearize
//    trace for linearize.
//  * linearize runs the JVP with tangents staged into a JaxprTrace in ForwardKnown mode: primal
//    work is bound under the parent trace as it happens (forward pass), tangent work becomes a
//    linear jaxpr whose constvars are the residuals.
//  * backward_pass transposes a linear jaxpr equation by equation, in reverse, accumulating
//    cotangents with add_any; vjp = linearize + backward_pass.
// The public templates over trees (cjax/autodiff.h) sit on these.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "cjax/make_jaxpr.h"
#include "core/array/rules.h"
#include "core/array/trace.h"
#include "trace/jaxpr_trace.h"

namespace cjax {

using FlatFn = std::function<std::vector<Array>(const std::vector<Array>&)>;

class JVPTracer final : public Tracer {
 public:
  JVPTracer(Array p, Array t, Trace* trace, std::shared_ptr<const bool> ended)
      : Tracer(p.aval(), trace), primal(std::move(p)), tangent(std::move(t)), ended_(std::move(ended)) {}
  bool is_live() const override { return !*ended_; }
  Array concrete_value() const override;
  std::string provenance() const override;
  std::string created_at() const override;
  Array primal, tangent;

 private:
  std::shared_ptr<const bool> ended_;
};

class JVPTrace final : public Trace {
 public:
  // Parent: current_trace(). Tangent work runs under `tangent_ctx` (default: the parent).
  explicit JVPTrace(Trace* tangent_ctx = nullptr);
  ~JVPTrace() override { *ended_ = true; }
  JVPTrace(const JVPTrace&) = delete;
  JVPTrace& operator=(const JVPTrace&) = delete;

  // A tracer for (primal, tangent); just `primal` when the tangent is a symbolic zero.
  Array make_tracer(Array primal, Array tangent);
  // (primal, tangent) of `x` at this level: unpacks own tracers; a constant has a zero tangent.
  std::pair<Array, Array> unpack(const Array& x, const PrimitiveDef* def) const;
  std::vector<Array> process_primitive(const PrimitiveDef& def, std::span<const Array> inputs,
                                       const Params& params) override;
  std::string name() const override { return "JVPTrace"; }
  Trace* tangent_ctx() const { return tangent_ctx_; }

 private:
  Trace* tangent_ctx_;
  std::shared_ptr<bool> ended_ = std::make_shared<bool>(false);
};

// Tangents may be undefined (zero); outputs' tangents are instantiated (zeros where symbolic).
struct JvpResult {
  std::vector<Array> primals_out, tangents_out;
};
JvpResult jvp_flat(const FlatFn& f, std::span<const Array> primals, std::span<const Array> tangents);

struct LinearizeResult {
  std::vector<Array> primals_out;
  // Linear in its invars (one per floating primal input, in order: see `diff_inputs`); its
  // consts are residuals computed by the forward pass. One outvar per output (zeros for
  // outputs that do not depend on the inputs or are not floating).
  ClosedJaxpr linear;
  std::vector<bool> diff_inputs;  // input i has a tangent (floating dtype)
};
LinearizeResult linearize_flat(const FlatFn& f, std::span<const Array> primals);

// Cotangents of a linear jaxpr's invars given its outvars' cotangents (undefined: zero). An
// invar nothing flows to gets an undefined handle.
std::vector<Array> backward_pass(const Jaxpr& jaxpr, std::span<const Array> consts, std::span<const Array> cts_out);
// The same where only the invars whose `args` entry is an undefined primal are linear; the
// others take the given values. Non-linear invars get undefined cotangents.
std::vector<Array> backward_pass(const Jaxpr& jaxpr, std::span<const Array> consts, std::span<const Array> args,
                                 std::span<const Array> cts_out);

// linear_transpose: backward_pass over a jaxpr all of whose invars are linear, checking as it
// goes (also inside the bodies of calls and control flow, as they are transposed) that every
// equation reached from the invars is linear in them. A non-linear one (sin x, x * x, a division
// by x, a conversion to an integer type) raises ValueError naming it and where it was traced.
std::vector<Array> transpose_linear(const Jaxpr& jaxpr, std::span<const Array> consts, std::span<const Array> cts_out);

// The transpose of a call-like equation (jit, remat2) over `jaxpr` with inputs `args`, whose
// linear ones are undefined primals: the backward pass traced into a new call taking the
// non-linear args then `cts`, returning one cotangent per linear input (zeros instantiated).
struct TransposedCall {
  TracedCall call;
  std::vector<Array> call_args;  // the call's consts, the non-linear args, then cts
  std::vector<size_t> linear;    // indices of the linear inputs, in the call's output order
};
TransposedCall transpose_call(const Jaxpr& jaxpr, std::span<const Array> cts, std::span<const Array> args);

// vjp: the primal outputs and a function from output cotangents to input cotangents (zeros,
// instantiated, for inputs without a gradient path; integer inputs get integer zeros).
struct VjpResult {
  std::vector<Array> primals_out;
  std::function<std::vector<Array>(std::span<const Array> cts_out)> backward;
};
VjpResult vjp_flat(const FlatFn& f, std::span<const Array> primals);

// Error for a primitive lacking a rule `what` ("JVP", "transpose", "batching").
[[noreturn]] void raise_missing_rule(const PrimitiveDef& def, std::string_view what);

}  // namespace cjax
