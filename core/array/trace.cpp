#include "core/array/trace.h"

#include <fmt/format.h>

#include <new>
#include <optional>

#include "cjax/sharding.h"
#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/backend/backend.h"

namespace cjax {
namespace {
EvalTrace g_eval_trace;
thread_local Trace* tl_current = &g_eval_trace;
}  // namespace

Trace* current_trace() { return tl_current; }
EvalTrace* eval_trace() { return &g_eval_trace; }

TraceScope::TraceScope(Trace* t) : saved_(tl_current) { tl_current = t; }
TraceScope::~TraceScope() { tl_current = saved_; }

bool Trace::is_active() const {
  for (Trace* t = tl_current; t; t = t->parent())
    if (t == this) return true;
  return false;
}

bool is_ancestor_of(const Tracer& t, const Trace& me) {
  if (!t.is_live()) return false;
  for (Trace* p = me.parent(); p; p = p->parent())
    if (p == t.trace) return true;
  return false;
}

std::string tracer_origin(const Array& a) {
  auto* t = dynamic_cast<const Tracer*>(a.impl());
  std::string at = t ? t->created_at() : "";
  return at.empty() ? "" : " It was created at " + at + ".";
}

void raise_escaped_tracer(const Array& a, const PrimitiveDef& def) {
  throw EscapedTracerError(
      fmt::format("an intermediate value of type {} from a finished transformation was passed to '{}'. A tracer "
                  "escaped its trace (for example it was stored in a global or captured by a lambda that outlived "
                  "jit/grad); return it from the transformed function instead.{}",
                  a.aval().str(), def.name, tracer_origin(a)));
}

namespace {
SpmdEagerFn& sharded_eager_fn() {
  static SpmdEagerFn fn;
  return fn;
}
}  // namespace

bool set_sharded_eager(SpmdEagerFn fn) {
  sharded_eager_fn() = std::move(fn);
  return true;
}

namespace {
Platform platform_of(const Array& a) { return static_cast<ConcreteArray*>(a.impl())->buffers[0]->device().platform(); }
// An uncommitted CPU value (a literal such as the 2 of x * 2, jnp::ones, a gradient's seed)
// follows the other operands to their device, as in JAX; committed operands must share one
// platform.
bool follows_operands(const Array& a) {
  return platform_of(a) == Platform::cpu && !static_cast<ConcreteArray*>(a.impl())->committed;
}

// The platform of a primitive's operands when it is not the CPU; raises BackendError for operands
// on different platforms.
std::optional<Platform> device_platform(const PrimitiveDef& def, std::span<const Array> inputs) {
  std::optional<Platform> found;
  size_t first = 0;
  bool any_follower = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (follows_operands(inputs[i])) {
      any_follower = true;
      continue;
    }
    Platform p = platform_of(inputs[i]);
    if (!found) {
      found = p;
      first = i;
    } else if (*found != p) {
      throw BackendError(
          fmt::format("'{}' got operand {} on {} and operand {} on {}: operands must live on one "
                      "platform; device_put one of them to the other's device",
                      def.name, first, concrete(inputs[first])->device().str(), i,
                      concrete(inputs[i])->device().str()));
    }
  }
  if (any_follower && !found) return std::nullopt;  // only CPU scalars
  if (!found || *found == Platform::cpu) return std::nullopt;
  return found;
}

// A primitive over device (non-CPU) operands: the platform's kernel, or the def's
// platform-independent impl (a higher-order primitive binds its body's primitives, which dispatch
// here one by one); else a counted host fallback.
std::vector<Array> run_on_platform(const PrimitiveDef& def, Platform platform, std::span<const Array> inputs,
                                   std::span<const AbstractValue> out_avals, const Params& params) {
  std::vector<Array> placed(inputs.begin(), inputs.end());
  Device home;
  for (const Array& a : inputs)
    if (platform_of(a) == platform) home = concrete(a)->device();
  for (Array& a : placed)
    if (platform_of(a) != platform) {
      note_follow_transfer(def.name, a, home);
      a = device_put(a, SingleDeviceSharding(home));
    }
  inputs = placed;
  if (const PrimitiveKernel* k = find_implementation(def, platform)) return (*k)(inputs, out_avals, params);
  return run_on_host(def, platform, inputs, out_avals, params);
}
}  // namespace

std::vector<Array> EvalTrace::process_primitive(const PrimitiveDef& def, std::span<const Array> inputs,
                                                const Params& params) {
  bool sharded = false;
  for (const Array& a : inputs) {
    if (!a.defined()) throw ValueError(fmt::format("'{}' received an empty Array handle", def.name));
    if (dynamic_cast<const ShapedArray*>(a.impl()))
      throw ValueError(
          fmt::format("'{}' received an abstract value {} (a shape_dtype_struct or an eval_shape result) "
                      "that has no data; it can only stand for an argument where types are enough "
                      "(eval_shape, make_jaxpr, jit(f).lower)",
                      def.name, a.aval().str()));
    if (!a.impl()->is_concrete()) raise_escaped_tracer(a, def);
    auto* c = static_cast<ConcreteArray*>(a.impl());
    c->await_live(fmt::format("'{}'", def.name));
    if (c->buffers.size() > 1 && !(c->sharding && is_fully_replicated(*c->sharding))) sharded = true;
  }
  // shard_map takes sharded operands block by block; other primitives run per shard.
  if (sharded && !def.takes_sharded_operands) {
    if (!sharded_eager_fn())
      throw Error(
          fmt::format("internal: '{}' got sharded operands but no eager per-shard handler is registered", def.name));
    return sharded_eager_fn()(def, inputs, params);
  }
  // Concrete values carry no varying axes (those are types of traced shard_map bodies).
  std::vector<AbstractValue> out_avals = def.abstract_eval(inputs, params);
  if (std::optional<Platform> p = device_platform(def, inputs))
    return run_on_platform(def, *p, inputs, out_avals, params);
  const PrimitiveKernel& kernel = implementation_for(def, Platform::cpu);
  try {
    std::vector<Array> outs = kernel(inputs, out_avals, params);
    for (const Array& a : inputs)
      if (static_cast<ConcreteArray*>(a.impl())->committed) {
        for (Array& o : outs)
          if (auto* c = dynamic_cast<ConcreteArray*>(o.impl())) c->committed = true;
        break;
      }
    return outs;
  } catch (const std::bad_alloc&) {
    // Device buffers fail with the allocator's BackendError; this is a kernel's host scratch memory.
    std::string outs;
    for (const AbstractValue& a : out_avals) outs += (outs.empty() ? "" : ", ") + a.str();
    throw BackendError(
        fmt::format("out of host memory running '{}' (outputs {}): a host allocation failed "
                    "(std::bad_alloc)",
                    def.name, outs));
  }
}

std::vector<Array> bind(const PrimitiveDef& def, std::span<const Array> inputs, const Params& params) {
  return tl_current->process_primitive(def, inputs, params);
}
std::vector<Array> bind(const PrimitiveDef& def, std::initializer_list<Array> inputs, const Params& params) {
  return tl_current->process_primitive(def, std::span<const Array>(inputs.begin(), inputs.size()), params);
}
Array bind1(const PrimitiveDef& def, std::span<const Array> inputs, const Params& params) {
  auto outs = tl_current->process_primitive(def, inputs, params);
  return std::move(outs[0]);
}
Array bind1(const PrimitiveDef& def, std::initializer_list<Array> inputs, const Params& params) {
  return bind1(def, std::span<const Array>(inputs.begin(), inputs.size()), params);
}

}  // namespace cjax
