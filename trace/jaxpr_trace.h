// JaxprTrace (docs/design.md §2): stages primitives into a jaxpr instead of running them. Its parent is
// the trace current when it starts. It owns only its own tracers (JaxprTracer, one per Var);
// every other value it sees is a constant at its level:
//   * a concrete rank-0 array        -> a Literal, inlined (as JAX inlines scalars),
//   * another concrete array         -> a constvar (one per array, deduplicated by identity),
//   * a tracer of an enclosing trace -> a constvar whose value is that tracer,
//   * any other tracer               -> EscapedTracerError (it outlived its transformation).
// Output avals come from the primitive's abstract_eval on the input tracers' avals.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/array/array_impl.h"
#include "core/array/trace.h"
#include "trace/jaxpr.h"
#include "trace/source_info.h"

namespace cjax {

struct JaxprTraceState;  // the jaxpr under construction (trace/jaxpr_trace.cpp)

// Every jaxpr a JaxprTrace builds is validated with check_jaxpr when this is on: in debug builds,
// and when CJAX_CHECK_JAXPRS=1 (ctest sets it, so CI checks every traced jaxpr).
bool check_jaxprs_enabled();

class JaxprTracer final : public Tracer {
 public:
  JaxprTracer(Var v, Trace* t, std::shared_ptr<JaxprTraceState> s)
      : Tracer(v.aval(), t), var(std::move(v)), state(std::move(s)) {}
  bool is_live() const override;
  std::string provenance() const override;
  std::string created_at() const override { return source ? source->str() : ""; }
  std::shared_ptr<const SourceInfo> source;  // the equation (or traced call) that made it
  Var var;
  // Shared with the trace: outlives it, so a tracer can tell that its trace has ended even if
  // another trace later lives at the same address.
  std::shared_ptr<JaxprTraceState> state;
};

class JaxprTrace final : public Trace {
 public:
  // How a primitive none of whose inputs is this trace's tracer is handled.
  enum class Mode {
    StageAll,     // staged too (make_jaxpr, jit: `zeros(...)` appears in the jaxpr)
    ForwardKnown  // bound under the parent trace instead: partial evaluation, used by linearize
                  // so that primal work runs forward and only tangent work is staged
  };
  explicit JaxprTrace(Mode mode = Mode::StageAll);  // parent: current_trace()
  ~JaxprTrace() override;                           // ends the trace: its tracers are dead from now on
  JaxprTrace(const JaxprTrace&) = delete;
  JaxprTrace& operator=(const JaxprTrace&) = delete;

  // A new input variable of type `aval` and its tracer; `name` describes it in errors.
  Array new_arg(const AbstractValue& aval, std::string name = "");
  // Describes this trace in errors ("jit 'step'", "make_jaxpr").
  void set_purpose(std::string what);
  std::vector<Array> process_primitive(const PrimitiveDef& def, std::span<const Array> inputs,
                                       const Params& params) override;
  std::string name() const override { return "JaxprTrace"; }
  // Builds the closed jaxpr whose outputs are `outputs` and ends the trace.
  ClosedJaxpr to_jaxpr(std::span<const Array> outputs);
  bool ended() const;
  // True if `x` is a live tracer of this trace.
  bool owns(const Array& x) const;
  // Stages one equation (no rules, no forwarding) and returns its output tracers.
  std::vector<Array> stage(const PrimitiveDef& def, std::span<const Array> inputs, const Params& params,
                           std::vector<AbstractValue> out_avals);

 private:
  Mode mode_;
  // The atom for `x` at this level; `what` names the consumer for error messages.
  Atom to_atom(const Array& x, const PrimitiveDef* def, size_t out_index);
  bool is_ancestor(const Tracer& t) const;
  std::shared_ptr<JaxprTraceState> state_;
};

// A jaxpr with the same equations whose constvars come first among its invars.
std::shared_ptr<const Jaxpr> convert_constvars_to_invars(const Jaxpr& jaxpr);

// A staged call of a higher-order primitive (jit, remat2, cond branches, ...): `f` traced on
// fresh inputs of `in_avals` into a jaxpr without constvars, plus the values of its former
// constants, which the caller passes as leading inputs.
struct TracedCall {
  std::shared_ptr<const Jaxpr> jaxpr;  // invars: consts then the inputs
  std::vector<Array> consts;
};
TracedCall trace_to_call(const std::function<std::vector<Array>(const std::vector<Array>&)>& f,
                         const std::vector<AbstractValue>& in_avals);

}  // namespace cjax
