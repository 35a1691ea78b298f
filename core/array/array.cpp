// Array handle basics: construction of scalars, accessors, host reads, concrete-array helpers.
#include <fmt/format.h>

#include <cstring>
#include <numeric>

#include "cjax/eval_shape.h"
#include "cjax/sharding.h"
#include "core/array/array_impl.h"
#include "core/array/spmd.h"
#include "core/array/visit_dtype.h"
#include "core/backend/backend.h"

namespace cjax {

int64_t shape_size(const Shape& s) {
  int64_t n = 1;
  bool overflow = false;
  for (int64_t d : s) overflow |= __builtin_mul_overflow(n, d, &n);
  if (overflow)
    throw ShapeError(
        fmt::format("shape {} has more elements than a 64-bit count can hold; use smaller dimensions", shape_str(s)));
  return n;
}
void check_aval(const AbstractValue& a) {
  for (int64_t d : a.shape)
    if (d < 0)
      throw ShapeError(fmt::format("shape {} has a negative dimension; sizes must be >= 0", shape_str(a.shape)));
  int64_t bytes = 0;
  if (__builtin_mul_overflow(shape_size(a.shape), int64_t(itemsize(a.dtype)), &bytes))
    throw ShapeError(fmt::format("shape {} of {} needs more bytes than a 64-bit size can hold; use smaller dimensions",
                                 shape_str(a.shape), dtype_name(a.dtype)));
}
std::vector<int64_t> row_major_strides(const Shape& s) {
  std::vector<int64_t> st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= s[i];
  }
  return st;
}
std::string shape_str(const Shape& s) {
  if (s.size() == 1) return fmt::format("({},)", s[0]);
  return fmt::format("({})", fmt::join(s, ", "));
}
int64_t AbstractValue::size() const { return shape_size(shape); }
std::string AbstractValue::str() const {
  std::string s = fmt::format("{}[{}]", dtype_short_name(dtype), fmt::join(shape, ","));
  if (!vma.empty()) s += fmt::format("{{V:{}}}", fmt::join(vma, ","));
  return s;
}

Array make_uninitialized(AbstractValue aval, Device device) {
  // Inside a shard_map body every value belongs to the device running it, whatever the device of
  // the operand an op took its placement from (a collective's result combines all devices' blocks;
  // a literal was made on the default device). Host memory asked for in a body that runs on a
  // device's own memory (a GPU) stays host memory: its maker writes it through its pointer (a
  // literal, a host copy, a host kernel's output), and it follows the body's operands when used.
  if (const SpmdContext* ctx = current_spmd(); ctx && ctx->mesh) {
    const Device& body = ctx->mesh->devices()[size_t(ctx->device)];
    if (host_accessible(body) || !host_accessible(device)) device = body;
  }
  size_t nbytes = size_t(aval.size()) * itemsize(aval.dtype);
  auto buf = std::make_shared<Buffer>(device, nbytes);
  return Array(std::make_shared<ConcreteArray>(std::move(aval), std::move(buf)));
}
Array make_view(const Array& base, AbstractValue aval) {
  auto* c = concrete(base);
  auto impl = std::make_shared<ConcreteArray>(std::move(aval), c->buffer());
  if (c->buffers.size() == 1) impl->sharding = c->sharding;  // a view of one replica is unsharded
  return Array(std::move(impl));
}
Array shared_on_device(const Array& a, const Device& d) {
  auto view = std::make_shared<Buffer>(d, concrete(a)->buffer());
  return Array(std::make_shared<ConcreteArray>(a.aval(), std::move(view)));
}
Array make_from_host(const void* data, AbstractValue aval, Device device) {
  size_t nbytes = size_t(aval.size()) * itemsize(aval.dtype);
  Array a = make_uninitialized(std::move(aval), device);
  if (!nbytes) return a;
  const Device& d = concrete(a)->buffer()->device();
  if (host_accessible(d))
    std::memcpy(raw_ptr(a), data, nbytes);
  else
    backend_for(d.platform()).copy_from_host(d, raw_ptr(a), data, nbytes);
  return a;
}
bool host_accessible(const Device& d) {
  return d.platform() == Platform::cpu || backend_for(d.platform()).host_accessible();
}
void copy_buffer(const Buffer& from, const Buffer& to, size_t nbytes) {
  if (nbytes == 0) return;
  const Device &src = from.device(), &dst = to.device();
  if (host_accessible(src) && host_accessible(dst))
    std::memcpy(to.data(), from.data(), nbytes);
  else if (host_accessible(src))
    backend_for(dst.platform()).copy_from_host(dst, to.data(), from.data(), nbytes);
  else if (host_accessible(dst))
    backend_for(src.platform()).copy_to_host(src, from.data(), to.data(), nbytes);
  else if (src.platform() == dst.platform())
    backend_for(src.platform()).copy_between_devices(src, from.data(), dst, to.data(), nbytes);
  else
    throw BackendError(fmt::format("no direct copy from {} to {}", src.str(), dst.str()));
}

Array to_host(const Array& a) {
  ConcreteArray& c = require_concrete(a, "a host read");
  a.block_until_ready();
  if (c.buffers.size() != 1)
    return device_put(a, SingleDeviceSharding(c.device().platform() == Platform::cpu ? c.device() : host_device()));
  const Buffer& buf = *c.buffer();
  if (host_accessible(buf.device())) return a;
  Array out = make_uninitialized(a.aval(), host_device());
  if (buf.nbytes())
    backend_for(buf.device().platform()).copy_to_host(buf.device(), buf.data(), raw_ptr(out), buf.nbytes());
  return out;
}
Array on_default_device(Array host_value) {
  Device d = default_device();
  if (host_accessible(d)) return host_value;
  Array moved = device_put(host_value, SingleDeviceSharding(d));
  concrete(moved)->committed = false;
  return moved;
}
Array make_abstract(AbstractValue aval) { return Array(std::make_shared<ShapedArray>(std::move(aval))); }
Array shape_dtype_struct(Shape shape, DType dtype, bool weak_type) {
  for (int64_t d : shape)
    if (d < 0) throw ValueError(fmt::format("shape_dtype_struct: negative dimension in shape {}", shape_str(shape)));
  AbstractValue a;
  a.shape = std::move(shape);
  a.dtype = dtype;
  a.weak_type = weak_type;
  return make_abstract(std::move(a));
}
Array shape_dtype_struct(const AbstractValue& aval) { return make_abstract(aval); }
bool is_abstract(const Array& x) { return dynamic_cast<const ShapedArray*>(x.impl()) != nullptr; }

Array make_scalar(double value, DType dtype, bool weak) {
  Array a = make_uninitialized(AbstractValue{{}, dtype, weak, {}}, host_device());
  visit_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (is_half_v<T>)
      *data_ptr<T>(a) = T(float(value));
    else
      *data_ptr<T>(a) = T(value);
  });
  return a;
}
namespace {
template <class T>
Array exact_scalar(T v, bool weak) {
  Array a = make_uninitialized(AbstractValue{{}, dtype_v<T>, weak, {}}, host_device());
  *data_ptr<T>(a) = v;
  return a;
}
}  // namespace

Array::Array(float v) : Array(exact_scalar<float>(v, true)) {}
Array::Array(double v) : Array(exact_scalar<double>(v, true)) {}
Array::Array(int v) : Array(exact_scalar<int32_t>(v, true)) {}
Array::Array(int64_t v) : Array(exact_scalar<int64_t>(v, true)) {}
Array::Array(bool v) : Array(exact_scalar<bool>(v, false)) {}

namespace {
const ArrayImpl& checked(const std::shared_ptr<ArrayImpl>& p) {
  if (!p) throw ValueError("use of an empty Array handle (default-constructed or moved-from); assign a value first");
  return *p;
}
}  // namespace

const Shape& Array::shape() const { return checked(impl_).aval.shape; }
int Array::ndim() const { return int(checked(impl_).aval.shape.size()); }
int64_t Array::size() const { return checked(impl_).aval.size(); }
DType Array::dtype() const { return checked(impl_).aval.dtype; }
bool Array::weak_type() const { return checked(impl_).aval.weak_type; }
const AbstractValue& Array::aval() const { return checked(impl_).aval; }

namespace {
// The concrete array behind `impl`: itself, or the value a tracer stands for (JVP over a
// concrete primal); null if the value is only known abstractly.
const ArrayImpl* concrete_impl(const ArrayImpl& impl, Array& keep) {
  if (impl.is_concrete()) return &impl;
  if (auto* t = dynamic_cast<const Tracer*>(&impl)) {
    keep = t->concrete_value();
    if (keep.defined() && keep.impl()->is_concrete()) return keep.impl();
  }
  return nullptr;
}
std::string provenance_of(const ArrayImpl& impl) {
  auto* t = dynamic_cast<const Tracer*>(&impl);
  std::string p = t ? t->provenance() : "";
  return p.empty() ? "The value depends on an argument of a transformed function (jit/grad/vmap)"
                   : "This value is not known " + p;
}
}  // namespace

void require_fully_addressable(const ConcreteArray& c, std::string_view what) {
  int64_t remote = 0;
  for (const auto& b : c.buffers) remote += b && !b->addressable() ? 1 : 0;
  if (remote == 0) return;
  throw ValueError(
      fmt::
          format("{}: this {} array spans processes ({} of its {} shards live on other processes), so no process holds "
                 "its whole value; gather it with process_allgather(x), or read this process's blocks with "
                 "x.addressable_shards()",
                 what, c.aval.str(), remote, c.buffers.size()));
}

ConcreteArray& require_concrete(const Array& a, std::string_view what) {
  const ArrayImpl& impl = checked(a.impl_ptr());
  Array keep;
  const ArrayImpl* ci = concrete_impl(impl, keep);
  if (!ci && dynamic_cast<const ShapedArray*>(&impl))
    throw ConcretizationError(
        fmt::format("{} needs a concrete value, but got an abstract value {} (a shape_dtype_struct "
                    "or an eval_shape result), which has no data",
                    what, impl.aval.str()));
  if (!ci)
    throw ConcretizationError(fmt::format(
        "{} needs a concrete value, but got an abstract tracer of type {}. {}. Use lax::cond / lax::select / "
        "jnp::where for data-dependent choices, compute shapes from static (non-Array) arguments, or make the "
        "argument static by passing it as a C++ value instead of an Array",
        what, impl.aval.str(), provenance_of(impl)));
  // A JVP tracer's primal outlives this call through the tracer that holds it.
  auto& c = const_cast<ConcreteArray&>(static_cast<const ConcreteArray&>(*ci));
  c.await_live(what);
  return c;
}

namespace {
thread_local bool tl_in_dispatched_call = false;
}
DispatchedCallScope::DispatchedCallScope() : previous_(tl_in_dispatched_call) { tl_in_dispatched_call = true; }
DispatchedCallScope::~DispatchedCallScope() { tl_in_dispatched_call = previous_; }

void ConcreteArray::await_live(std::string_view what) const {
  if (!tl_in_dispatched_call && donated.load(std::memory_order_acquire)) raise_deleted(what);
  await();
  if (buffers.empty()) raise_deleted(what);
}

void raise_deleted(std::string_view what) {
  throw ValueError(
      fmt::format("{}: the Array has been deleted: it was donated to a jit call (donate_argnums) "
                  "and its buffer reused; use the call's outputs instead",
                  what));
}

template <class T>
std::vector<T> Array::to_vector() const {
  ConcreteArray& c = require_concrete(*this, "to_vector()");
  block_until_ready();
  if (c.buffers.size() != 1) return device_put(*this, SingleDeviceSharding(c.device())).to_vector<T>();
  if (!host_accessible(c.device())) return to_host(*this).to_vector<T>();
  int64_t n = size();
  std::vector<T> out(static_cast<size_t>(n));
  visit_dtype(dtype(), [&](auto tag) {
    using S = typename decltype(tag)::type;
    const S* src = static_cast<const S*>(c.buffer()->data());
    for (int64_t i = 0; i < n; ++i) {
      if constexpr (is_half_v<S> || is_half_v<T>)
        out[size_t(i)] = T(float(src[i]));
      else
        out[size_t(i)] = static_cast<T>(src[i]);
    }
  });
  return out;
}
template <class T>
T Array::item() const {
  require_concrete(*this, "item()");
  if (size() != 1)
    throw ShapeError(
        fmt::format("item() needs an array of size 1, got shape {}; index or reduce it first", shape_str(shape())));
  return to_vector<T>()[0];
}
#define CJAX_INSTANTIATE(T)                            \
  template std::vector<T> Array::to_vector<T>() const; \
  template T Array::item<T>() const;
CJAX_INSTANTIATE(bool)
CJAX_INSTANTIATE(int8_t)
CJAX_INSTANTIATE(int16_t)
CJAX_INSTANTIATE(int32_t)
CJAX_INSTANTIATE(int64_t)
CJAX_INSTANTIATE(uint8_t)
CJAX_INSTANTIATE(uint16_t)
CJAX_INSTANTIATE(uint32_t)
CJAX_INSTANTIATE(uint64_t)
CJAX_INSTANTIATE(float)
CJAX_INSTANTIATE(double)
CJAX_INSTANTIATE(bfloat16_t)
CJAX_INSTANTIATE(float16_t)
#undef CJAX_INSTANTIATE

Array::operator bool() const {
  const ArrayImpl& impl = checked(impl_);
  Array keep;
  if (!concrete_impl(impl, keep))
    throw TracerBoolConversionError(fmt::format(
        "attempted boolean conversion of a traced array of type {} (an `if`, `while`, `&&` or `!` on it). {}. "
        "Use lax::cond or lax::select (or jnp::where) instead of `if`, or make the argument static by passing "
        "it as a C++ value instead of an Array",
        impl.aval.str(), provenance_of(impl)));
  if (size() != 1)
    throw ValueError(fmt::format("the truth value of an array of shape {} is ambiguous; use jnp::any or jnp::all",
                                 shape_str(shape())));
  return item<bool>();
}

std::string SingleDeviceSharding::str() const { return fmt::format("SingleDeviceSharding(device={})", device_.repr()); }

const Sharding& Array::sharding() const {
  ConcreteArray& c = require_concrete(*this, "sharding()");
  if (!c.sharding) c.sharding = std::make_shared<SingleDeviceSharding>(c.device());
  return *c.sharding;
}
std::vector<Shard> Array::addressable_shards() const {
  ConcreteArray& c = require_concrete(*this, "addressable_shards()");
  auto* ns = dynamic_cast<const NamedSharding*>(c.sharding.get());
  if (!ns || int64_t(c.buffers.size()) != ns->mesh().size()) {
    std::vector<Slice> idx(static_cast<size_t>(ndim()), Slice());
    return {Shard{c.device(), idx, *this}};
  }
  std::vector<std::vector<Slice>> indices = ns->devices_indices(shape());
  AbstractValue block{ns->shard_shape(shape()), dtype(), weak_type(), {}};
  std::vector<Shard> out;
  for (size_t k = 0; k < c.buffers.size(); ++k)
    if (c.buffers[k]->addressable())
      out.push_back(
          Shard{c.buffers[k]->device(), indices[k], Array(std::make_shared<ConcreteArray>(block, c.buffers[k]))});
  return out;
}
// Eager results are ready when returned; outputs of dispatched jit calls when their producer is
// done (block_until_ready then rethrows the producer's error, if any).
void Array::block_until_ready() const {
  const ArrayImpl& impl = checked(impl_);
  if (!impl.is_concrete()) return;
  const auto& c = static_cast<const ConcreteArray&>(impl);
  c.await();
  // A device buffer is ready once the work queued on its device has run.
  for (const auto& b : c.buffers)
    if (b && !host_accessible(b->device())) backend_for(b->device().platform()).synchronize(b->device());
}
bool Array::is_ready() const {
  const ArrayImpl& impl = checked(impl_);
  return impl.is_concrete() && static_cast<const ConcreteArray&>(impl).ready();
}

namespace {
std::atomic<int64_t> g_host_waits{0}, g_max_wait_lag{0}, g_dispatched{0};
}  // namespace

int64_t next_dispatch_sequence() { return ++g_dispatched; }
AsyncDispatchStats async_dispatch_stats() { return {g_dispatched.load(), g_host_waits.load(), g_max_wait_lag.load()}; }
void reset_async_dispatch_stats() {
  g_host_waits = 0;
  g_max_wait_lag = 0;
}

void PendingValue::finish(std::exception_ptr e) {
  {
    std::lock_guard lk(mu);
    error = std::move(e);
    done.store(true, std::memory_order_release);
  }
  cv.notify_all();
}

void PendingValue::wait() {
  if (!done.load(std::memory_order_acquire)) {
    // A blocking wait: record how far behind the newest dispatched call its producer is.
    ++g_host_waits;
    int64_t lag = g_dispatched.load() - sequence;
    for (int64_t m = g_max_wait_lag.load(); lag > m && !g_max_wait_lag.compare_exchange_weak(m, lag);) {}
    std::unique_lock lk(mu);
    cv.wait(lk, [&] { return done.load(std::memory_order_acquire); });
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace cjax
