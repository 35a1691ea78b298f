// Traces (docs/design.md §2): `bind` hands a primitive to the current trace. The current trace is a
// thread-local pointer; each trace links to its parent. A trace owns only its own tracers; any
// other value is a constant at its level. EvalTrace, the root, runs kernels synchronously on the
// caller's thread. The tracing layer adds JaxprTrace, JVPTrace, BatchTrace and ShardMapTrace.
#pragma once
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "core/array/array_impl.h"
#include "core/array/primitive.h"

namespace cjax {

class Trace {
 public:
  explicit Trace(Trace* parent) : parent_(parent), level_(parent ? parent->level_ + 1 : 0) {}
  virtual ~Trace() = default;
  virtual std::vector<Array> process_primitive(const PrimitiveDef& def, std::span<const Array> inputs,
                                               const Params& params) = 0;
  virtual std::string name() const = 0;
  Trace* parent() const { return parent_; }
  int level() const { return level_; }
  // True while this trace is on the current thread's chain of traces.
  bool is_active() const;

 private:
  Trace* parent_;
  int level_;
};

class EvalTrace final : public Trace {
 public:
  EvalTrace() : Trace(nullptr) {}
  std::vector<Array> process_primitive(const PrimitiveDef& def, std::span<const Array> inputs,
                                       const Params& params) override;
  std::string name() const override { return "EvalTrace"; }
};

Trace* current_trace();
EvalTrace* eval_trace();

// Makes `t` the current trace for the scope's lifetime.
class TraceScope {
 public:
  explicit TraceScope(Trace* t);
  ~TraceScope();
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Trace* saved_;
};

// True if `t` is live and belongs to a trace on `me`'s chain of parents (not `me` itself): such
// a value is a constant at `me`'s level.
bool is_ancestor_of(const Tracer& t, const Trace& me);

// " It was created at file:line (function)." for a tracer whose origin is known, else "".
std::string tracer_origin(const Array& a);

// Raises EscapedTracerError for a tracer used outside the transformation that created it.
[[noreturn]] void raise_escaped_tracer(const Array& a, const PrimitiveDef& def);

// How EvalTrace runs a primitive whose operands are sharded over several devices (per shard, or
// its ShardingError): trace/eager_sharded_ops.cpp registers it at static initialisation, since it
// needs shard_map, a layer above this one.
using SpmdEagerFn =
    std::function<std::vector<Array>(const PrimitiveDef& def, std::span<const Array> inputs, const Params& params)>;
bool set_sharded_eager(SpmdEagerFn fn);

}  // namespace cjax
