// What an Array handle points to: concrete data (one buffer per addressable shard) or a tracer.
#pragma once
#include <atomic>
#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "cjax/array.h"
#include "core/backend/buffer.h"

namespace cjax {

class Trace;

// Raises ShapeError for a negative dimension or a shape whose element count or byte size overflows
// 64 bits. Every ArrayImpl checks its aval at construction, so no kernel sees such a shape.
void check_aval(const AbstractValue& a);

class ArrayImpl {
 public:
  explicit ArrayImpl(AbstractValue a) : aval(std::move(a)) { check_aval(aval); }
  virtual ~ArrayImpl() = default;
  virtual bool is_concrete() const { return false; }
  AbstractValue aval;
};

// A value with no data and no trace: used to run abstract evaluation on types alone
// (check_jaxpr, shape inference in the numpy layer).
class ShapedArray final : public ArrayImpl {
 public:
  using ArrayImpl::ArrayImpl;
};

// The ready event of a value computed asynchronously (an output of a dispatched jit call). The
// producer fills the array's buffers (or records its error), then marks it done.
struct PendingValue {
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<bool> done{false};
  std::exception_ptr error;  // rethrown at every read, naming the producer
  int64_t sequence = 0;      // dispatch order of the producing call
  void finish(std::exception_ptr e);
  // Blocks until done (counted in the async statistics), then rethrows the producer's error.
  void wait();
};

// Concrete data. Single-device arrays hold one buffer; sharded arrays one per addressable shard.
// An array with a `pending` event gets its buffers when its producer finishes; every access to
// its data goes through concrete() / buffer(), which wait for it.
class ConcreteArray final : public ArrayImpl {
 public:
  ConcreteArray(AbstractValue a, std::shared_ptr<Buffer> buf) : ArrayImpl(std::move(a)), buffers{std::move(buf)} {}
  // A value still being computed: no buffers until `pending` is done.
  ConcreteArray(AbstractValue a, std::shared_ptr<PendingValue> p) : ArrayImpl(std::move(a)), pending(std::move(p)) {}
  bool is_concrete() const override { return true; }
  // The first buffer this process holds (a replicated global array's local copy; buffers[0]
  // elsewhere).
  const std::shared_ptr<Buffer>& buffer() const {
    await();
    for (const auto& b : buffers)
      if (!b || b->addressable()) return b;
    return buffers[0];
  }
  Device device() const { return buffer()->device(); }
  bool ready() const { return !pending || pending->done.load(std::memory_order_acquire); }
  void await() const {
    if (pending) pending->wait();
  }
  // For a read on the host: raises ValueError naming `what` if the array was deleted by
  // donation (without waiting for it when a dispatched call has yet to take its buffers), else
  // waits for the value.
  void await_live(std::string_view what) const;
  std::vector<std::shared_ptr<Buffer>> buffers;
  // Donated to a dispatched jit call, which takes the buffers when it starts: deleted for the
  // caller from the call on (calls dispatched before it still read the value).
  std::atomic<bool> donated{false};
  std::shared_ptr<const Sharding> sharding;  // null: SingleDeviceSharding(device())
  // A pending value its producer knows will come out on one device (so that reading its layout,
  // as sharded jit does for its arguments, need not wait for it). Set before the value is shared.
  bool unsplit_when_ready = false;
  // Placed explicitly (device_put, or computed from a committed operand), as in JAX. An
  // uncommitted CPU value (a literal, jnp::ones) follows the other operands of a primitive to
  // their device; committed operands on two platforms are an error (core/array/trace.cpp).
  bool committed = false;
  const std::shared_ptr<PendingValue> pending;  // set once at construction (never reassigned)
};

// A tracer is owned by exactly one trace (core/array/trace.h).
class Tracer : public ArrayImpl {
 public:
  Tracer(AbstractValue a, Trace* t) : ArrayImpl(std::move(a)), trace(t) {}
  // False once the tracer's trace has ended (then `trace` must not be dereferenced).
  virtual bool is_live() const = 0;
  // The concrete value this tracer stands for when it is known while tracing (a JVP tracer
  // over a concrete primal: `if (x > 0)` works under eager grad, as in JAX); else undefined.
  virtual Array concrete_value() const { return Array(); }
  // For error messages: what this value depends on and under which transformation, e.g.
  // "while tracing 'step' for jit: it depends on argument 1 (leaf ['w'])"; "" if unknown.
  virtual std::string provenance() const { return ""; }
  // For escaped-tracer errors: "file:line (function)" of the user code that created this value
  // while tracing, when known; "" otherwise.
  virtual std::string created_at() const { return ""; }
  // Text printed for the value (operator<<) when the trace knows it, e.g. one block per device
  // inside an eager shard_map; "" prints the abstract Traced<...> form.
  virtual std::string value_str() const { return ""; }
  Trace* trace;
};

// Async dispatch instrumentation (tests assert on it): calls dispatched, waits that blocked, and
// the largest distance (in dispatched calls) between the newest call and a value waited for.
struct AsyncDispatchStats {
  int64_t dispatched = 0, blocking_waits = 0, max_wait_lag = 0;
};
int64_t next_dispatch_sequence();
AsyncDispatchStats async_dispatch_stats();
void reset_async_dispatch_stats();

// While alive, this thread runs a dispatched jit call: it may read arrays donated to calls
// dispatched after it (those take the buffers only when it has finished: queues are FIFO).
class DispatchedCallScope {
 public:
  DispatchedCallScope();
  ~DispatchedCallScope();
  DispatchedCallScope(const DispatchedCallScope&) = delete;
  DispatchedCallScope& operator=(const DispatchedCallScope&) = delete;

 private:
  bool previous_;
};

// Helpers used by kernels and ops.
// (Waits for an asynchronously computed value.)
inline ConcreteArray* concrete(const Array& a) {
  if (!a.impl() || !a.impl()->is_concrete()) return nullptr;
  auto* c = static_cast<ConcreteArray*>(a.impl());
  c->await();
  return c;
}
// The concrete impl of `a`; raises ConcretizationError naming `what` if `a` is a tracer.
ConcreteArray& require_concrete(const Array& a, std::string_view what);
// Raises ValueError naming `what` and process_allgather when some of c's shards live on other
// processes (a global array of a multi-process run, include/cjax/distributed.h).
void require_fully_addressable(const ConcreteArray& c, std::string_view what);
// Raises ValueError: `what` used an Array deleted by donation (its buffers were released).
[[noreturn]] void raise_deleted(std::string_view what);

template <class T>
T* data_ptr(const Array& a) {
  return static_cast<T*>(static_cast<ConcreteArray*>(a.impl())->buffer()->data());
}
inline void* raw_ptr(const Array& a) { return static_cast<ConcreteArray*>(a.impl())->buffer()->data(); }

// Uninitialized concrete array of the given type on `device`.
Array make_uninitialized(AbstractValue aval, Device device);
// Same buffer, new shape (reshape of contiguous data is free).
Array make_view(const Array& base, AbstractValue aval);
// `a`'s value as an array of device `d` of the same host memory (CPU virtual devices), sharing
// `a`'s buffer (Buffer's view constructor): for values that are the same on several devices.
Array shared_on_device(const Array& a, const Device& d);
// Concrete array from host data of the matching dtype.
Array make_from_host(const void* data, AbstractValue aval, Device device);
Array make_abstract(AbstractValue aval);  // a ShapedArray handle
// Whether the host reads `d`'s buffers through their pointers (CPU memory; core/backend/backend.h).
bool host_accessible(const Device& d);
// Copies the first `nbytes` of `from` into `to`, wherever each lives (host memory, a device, two
// devices of one platform), after the work queued on `from`'s device.
void copy_buffer(const Buffer& from, const Buffer& to, size_t nbytes);
// cpu:0: where the host writes values it creates (scalars, creation functions, host fallbacks).
Device host_device();
// A value the host created, moved to the default device (config::set_default_platform) as an
// uncommitted array, as JAX places jnp.ones and friends; `host_value` itself when the default
// device is host memory. Scalars stay on the host: they follow the operands they meet.
Array on_default_device(Array host_value);
// A single-device concrete array whose buffer the host can read: `a` itself, or a copy of it on
// cpu:0 made through its platform's backend (a GPU array). Sharded arrays are gathered first.
Array to_host(const Array& a);
// A concrete scalar of `dtype` holding `value` (converted), weak or not.
Array make_scalar(double value, DType dtype, bool weak = false);

int64_t shape_size(const Shape& s);
std::vector<int64_t> row_major_strides(const Shape& s);  // in elements

}  // namespace cjax
