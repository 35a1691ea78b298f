// The non-template parts of cjax/jit.h: signature cache, retrace explanations, compilation
// (trace -> passes -> Executable) and dispatch.
#include <absl/hash/hash.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <functional>
#include <iostream>
#include <mutex>
#include <new>
#include <optional>
#include <sstream>
#include <unordered_map>

#include "cjax/jit.h"
#include "core/array/array_impl.h"
#include "core/array/trace.h"
#include "core/array/util.h"
#include "core/backend/device_worker.h"
#include "jit/cost_analysis.h"
#include "jit/executable.h"
#include "jit/jit_primitive.h"
#include "jit/partition/partitioner.h"

namespace cjax {

namespace config {
namespace {
std::atomic<int> g_disable_jit{-1};  // -1: not set, read the environment
std::atomic<bool> g_explain{false};
std::atomic<int64_t> g_cache_capacity{-1};  // -1: not set, read the environment
}  // namespace
void set_jit_cache_capacity(size_t entries) {
  if (entries == 0) throw ValueError("set_jit_cache_capacity: a jit cache must hold at least 1 entry");
  g_cache_capacity = int64_t(entries);
}
size_t jit_cache_capacity() {
  int64_t v = g_cache_capacity.load();
  if (v > 0) return size_t(v);
  static const size_t from_env = [] {
    const char* s = std::getenv("CJAX_JIT_CACHE_CAPACITY");
    char* end = nullptr;
    long long n = s ? std::strtoll(s, &end, 10) : 0;
    return s && *s && end && !*end && n > 0 ? size_t(n) : kDefaultJitCacheCapacity;
  }();
  return from_env;
}
void set_disable_jit(bool disabled) { g_disable_jit = disabled ? 1 : 0; }
bool disable_jit() {
  int v = g_disable_jit.load();
  if (v >= 0) return v == 1;
  return env_flag("CJAX_DISABLE_JIT");
}
std::atomic<int> g_async{-1};  // -1: not set, read the environment
void set_async_dispatch(bool enabled) { g_async = enabled ? 1 : 0; }
bool async_dispatch() {
  int v = g_async.load();
  if (v >= 0) return v == 1;
  return !env_flag("CJAX_SYNC_DISPATCH");
}
void set_explain_cache_misses(bool enabled) { g_explain = enabled; }
bool explain_cache_misses() { return g_explain; }
}  // namespace config

namespace jit_detail {

std::string describe_with_stream(const std::function<void(std::ostream&)>& f) {
  std::ostringstream os;
  f(os);
  return os.str();
}

bool ArgSignature::operator==(const ArgSignature& o) const {
  if (type != o.type || is_tree != o.is_tree) return false;
  if (!is_tree) return static_value == o.static_value;
  return tree == o.tree && avals == o.avals;
}

size_t hash_signature(const Signature& s) {
  size_t h = s.size();
  for (const ArgSignature& a : s) {
    h = absl::HashOf(h, a.type.hash_code(), a.is_tree);
    if (!a.is_tree) {
      h = absl::HashOf(h, a.static_value.hash);
      continue;
    }
    h = absl::HashOf(h, a.tree.hash());
    for (const AbstractValue& v : a.avals) h = absl::HashOf(h, v.shape, int(v.dtype), v.weak_type);
  }
  return h;
}

struct Compiled : std::enable_shared_from_this<Compiled> {
  Compiled(Signature s, ClosedJaxpr t, Executable e, std::shared_ptr<const void> r)
      : signature(std::move(s)), traced(std::move(t)), executable(std::move(e)), result_like(std::move(r)) {}
  Signature signature;
  ClosedJaxpr traced;     // as traced (bound under transformations)
  Executable executable;  // the optimized program run eagerly
  std::shared_ptr<const void> result_like;

  // Sharded jit: the options' mesh and flat in/out shardings, and the partitioned programs, one
  // per layout of the arguments (built at the first call with that layout).
  std::optional<Mesh> mesh;
  FlatSpecs in_specs, out_specs;
  bool manual_spmd = false;      // a shard_map program: runs as written, never partitioned
  bool outputs_unsplit = false;  // its outputs come out on one device (known before they are ready)
  std::vector<std::shared_ptr<const Sharding>> out_shardings;  // a partitioned program's, known at dispatch
  // A partitioned program's sharding report, written at the first sharding_report(): its call
  // sites are symbolized from debug info, which costs ~0.5 s the first time in a process.
  std::function<std::string()> make_report;
  mutable std::once_flag report_once;
  mutable std::string report;
  mutable std::mutex partitions_mu;
  mutable std::unordered_map<std::string, std::shared_ptr<const Compiled>> partitions;
};

const SpecTree& in_sharding_entry(const SpecTree& all, size_t index, size_t num_args, const std::string& name) {
  if (!all.is_list()) return all;
  if (all.list().size() != num_args)
    throw ValueError(
        fmt::format("jit '{}': in_shardings has {} entries for {} arguments; give one per argument, or "
                    "one PartitionSpec for all of them",
                    name, all.list().size(), num_args));
  return all.list()[index];
}

// One jitted function's compiled signatures, least recently used evicted beyond
// config::jit_cache_capacity() (a call with an evicted signature traces again).
class JitCache {
 public:
  explicit JitCache(JitOptions o) : opts(std::move(o)) {}
  struct Entry {
    std::shared_ptr<const Compiled> compiled;
    uint64_t last_use = 0;
  };
  JitOptions opts;
  std::mutex mu;
  std::unordered_multimap<size_t, Entry> entries;
  uint64_t uses = 0;
  size_t traces = 0;
  std::string last_miss;

  // Under mu: the entry for `sig` (marked as used now), or null.
  std::shared_ptr<const Compiled> find(size_t h, const Signature& sig) {
    auto [b, e] = entries.equal_range(h);
    for (auto it = b; it != e; ++it)
      if (it->second.compiled->signature == sig) {
        it->second.last_use = ++uses;
        return it->second.compiled;
      }
    return nullptr;
  }
  // Under mu: adds an entry, evicting the least recently used ones beyond the capacity.
  void insert(size_t h, std::shared_ptr<const Compiled> c) {
    entries.emplace(h, Entry{std::move(c), ++uses});
    while (entries.size() > config::jit_cache_capacity()) {
      auto oldest = std::min_element(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
        return a.second.last_use < b.second.last_use;
      });
      entries.erase(oldest);
    }
  }
};

std::shared_ptr<JitCache> make_cache(const JitOptions& opts) { return std::make_shared<JitCache>(opts); }
const std::shared_ptr<const void>& result_like(const Compiled& c) { return c.result_like; }
size_t cache_size(const JitCache& c) { return c.entries.size(); }
size_t trace_count(const JitCache& c) { return c.traces; }
std::string last_cache_miss(const JitCache& c) { return c.last_miss; }
std::string lowered_text(const Compiled& c) { return c.executable.jaxpr().pretty_print(); }
const ClosedJaxpr& traced_jaxpr(const Compiled& c) { return c.traced; }
CostAnalysis cost_analysis(const Compiled& c) { return program_cost(c.executable); }
MemoryAnalysis memory_analysis(const Compiled& c, const std::vector<int>& donate_argnums) {
  std::vector<size_t> donated;
  size_t leaf = 0;
  for (size_t i = 0; i < c.signature.size(); ++i) {
    size_t n = c.signature[i].avals.size();
    if (std::find(donate_argnums.begin(), donate_argnums.end(), int(i)) != donate_argnums.end())
      for (size_t k = 0; k < n; ++k) donated.push_back(leaf + k);
    leaf += n;
  }
  return program_memory(c.executable, c.traced, donated);
}
bool jit_disabled() { return config::disable_jit(); }

namespace {

// How signature `now` differs from `old`, one line per difference. `seen`/`given` word an
// argument's old and new types ("seen", "but now given").
std::vector<std::string> signature_differences(const Signature& old, const Signature& now, std::string_view seen,
                                               std::string_view given) {
  std::vector<std::string> diffs;
  if (old.size() != now.size()) {
    diffs.push_back(fmt::format("it was called with {} arguments before, now {}", old.size(), now.size()));
    return diffs;
  }
  for (size_t i = 0; i < now.size(); ++i) {
    const ArgSignature &a = old[i], &b = now[i];
    if (a == b) continue;
    if (a.type != b.type || a.is_tree != b.is_tree) {
      diffs.push_back(fmt::format("argument {} changed C++ type", i));
    } else if (!b.is_tree) {
      diffs.push_back(fmt::format("argument {} is static and changed from {} to {}", i,
                                  a.static_value.describe(a.static_value.value.get()),
                                  b.static_value.describe(b.static_value.value.get())));
    } else if (!(a.tree == b.tree)) {
      diffs.push_back(fmt::format("argument {} changed tree structure: {}", i, a.tree.difference(b.tree)));
    } else {
      for (size_t k = 0; k < b.avals.size(); ++k) {
        if (a.avals[k] == b.avals[k]) continue;
        std::string what =
            a.avals[k].str() != b.avals[k].str()
                ? fmt::format("{}, {} {}", a.avals[k].str(), given, b.avals[k].str())
                : fmt::format("weak_type={}, {} weak_type={}", a.avals[k].weak_type, given, b.avals[k].weak_type);
        diffs.push_back(
            fmt::format("at argument {}{}: {} {}", i, k < b.leaf_paths.size() ? b.leaf_paths[k] : "", seen, what));
      }
    }
  }
  return diffs;
}

// "(f32[64,32], {f32[3], f32[]}, 5)": one entry per argument, a tree's leaves in braces.
std::string describe_signature(const Signature& sig) {
  std::vector<std::string> args;
  for (const ArgSignature& a : sig) {
    if (!a.is_tree) {
      args.push_back(a.static_value.describe(a.static_value.value.get()));
      continue;
    }
    std::vector<std::string> leaves;
    for (const AbstractValue& v : a.avals) leaves.push_back(v.str() + (v.weak_type ? "{weak}" : ""));
    bool single = a.tree.is_leaf();
    args.push_back(single ? leaves[0] : fmt::format("{{{}}}", fmt::join(leaves, ", ")));
  }
  return fmt::format("({})", fmt::join(args, ", "));
}

// JAX's explanation: the closest previously seen signature and how the new one differs.
std::string explain_miss(const JitCache& cache, const Signature& sig) {
  std::string head = fmt::format("TRACING CACHE MISS for jit '{}'", cache.opts.name);
  if (cache.entries.empty()) return head + " because it was never traced before";
  std::vector<std::string> best;
  size_t best_n = SIZE_MAX;
  for (auto& [h, entry] : cache.entries) {
    std::vector<std::string> diffs = signature_differences(entry.compiled->signature, sig, "seen", "but now given");
    if (diffs.size() < best_n) {
      best_n = diffs.size();
      best = diffs;
    }
  }
  std::string s = head + fmt::format(
                             " because:\n  never seen input type signature; closest seen signature has {} "
                             "mismatch{}, including:",
                             best.size(), best.size() == 1 ? "" : "es");
  for (const std::string& d : best) s += "\n    * " + d;
  return s;
}

}  // namespace

void check_compiled_signature(const Compiled& c, const std::string& name, Signature& sig,
                              const std::function<void(Signature&)>& fill_paths) {
  if (sig == c.signature) return;
  fill_paths(sig);
  std::string s = fmt::format("jit '{}': computation compiled for input types {} called with input types {}:", name,
                              describe_signature(c.signature), describe_signature(sig));
  for (const std::string& d : signature_differences(c.signature, sig, "compiled for", "called with")) s += "\n  * " + d;
  s += "\nCall the jitted function (it compiles each new signature) or lower it again for these arguments";
  throw ValueError(s);
}

std::shared_ptr<const Compiled> lookup(JitCache& cache, Signature sig,
                                       const std::function<std::vector<Array>(const std::vector<Array>&)>& flat_fn,
                                       const std::vector<AbstractValue>& in_avals,
                                       const std::function<std::shared_ptr<const void>()>& take_result,
                                       const std::function<void(Signature&)>& fill_paths,
                                       const FlatSpecsFn& flat_specs) {
  size_t h = hash_signature(sig);
  {
    std::lock_guard lock(cache.mu);
    if (auto hit = cache.find(h, sig)) return hit;
  }
  fill_paths(sig);
  std::vector<std::string> arg_names;
  for (size_t i = 0; i < sig.size(); ++i)
    for (const std::string& p : sig[i].leaf_paths)
      arg_names.push_back("argument " + std::to_string(i) + (p.empty() ? "" : " (leaf " + p + ")"));
  {
    std::lock_guard lock(cache.mu);
    if (auto hit = cache.find(h, sig)) return hit;
    if (config::explain_cache_misses()) {
      cache.last_miss = explain_miss(cache, sig);
      std::cerr << cache.last_miss << "\n";
    }
  }
  // Trace under a fresh JaxprTrace whose parent is the eval trace: the jaxpr depends only on the
  // signature, not on the transformations the call happens under.
  ClosedJaxpr traced;
  {
    TraceScope root(eval_trace());
    traced = jaxpr_detail::trace_flat(flat_fn, in_avals, "jit '" + cache.opts.name + "'", arg_names);
  }
  FlatSpecs in_specs, out_specs;
  if (flat_specs) flat_specs(in_specs, out_specs);  // reads the result, before take_result moves it
  auto c = std::make_shared<Compiled>(std::move(sig), traced, Executable(traced, cache.opts.name), take_result());
  c->in_specs = std::move(in_specs);
  c->out_specs = std::move(out_specs);
  c->mesh = cache.opts.mesh;
  c->manual_spmd = partition::contains_primitive(*traced, "shard_map");
  c->outputs_unsplit = !c->manual_spmd && !partition::contains_primitive(*traced, "sharding_constraint");
  std::lock_guard lock(cache.mu);
  ++cache.traces;
  // Another thread may have traced the same signature meanwhile: keep one entry.
  if (auto other = cache.find(h, c->signature)) return other;
  cache.insert(h, c);
  return c;
}

namespace {

// At most this many dispatched calls are in flight; the next call waits for the oldest.
constexpr size_t kMaxRunAhead = 8;
struct InFlightCall {
  std::shared_ptr<PendingValue> pending;
  int queue;  // the device whose dispatch queue runs it
};
struct InFlight {
  std::mutex mu;
  std::deque<InFlightCall> calls;
};
InFlight& in_flight() {
  static InFlight f;
  return f;
}

// The same exception type, its message prefixed with the call that raised it.
std::exception_ptr with_context(std::exception_ptr e, const std::string& prefix) {
  try {
    std::rethrow_exception(e);
  }
#define CJAX_RETHROW_AS(T)                                \
  catch (const T& x) {                                    \
    return std::make_exception_ptr(T(prefix + x.what())); \
  }
  CJAX_RETHROW_AS(TracerBoolConversionError)
  CJAX_RETHROW_AS(ConcretizationError)
  CJAX_RETHROW_AS(ShapeError)
  CJAX_RETHROW_AS(DTypeError)
  CJAX_RETHROW_AS(ValueError)
  CJAX_RETHROW_AS(EscapedTracerError)
  CJAX_RETHROW_AS(ShardingError)
  CJAX_RETHROW_AS(SpecError)
  CJAX_RETHROW_AS(VmaError)
  CJAX_RETHROW_AS(AxisNameError)
  CJAX_RETHROW_AS(CollectiveError)
  CJAX_RETHROW_AS(BackendError)
  CJAX_RETHROW_AS(IoError)
  CJAX_RETHROW_AS(Error)
#undef CJAX_RETHROW_AS
  catch (const std::bad_alloc&) {  // a host allocation outside the device allocator
    return std::make_exception_ptr(BackendError(prefix + "out of host memory (std::bad_alloc)"));
  }
  catch (const std::exception& x) {
    return std::make_exception_ptr(Error(prefix + x.what()));
  }
  catch (...) {
    return std::current_exception();
  }
}

// Async dispatch (docs/design.md §5.2): the call is queued on a device's dispatch queue and its outputs
// are returned at once, as arrays that become ready when it finishes; reading one waits for it
// (and raises the call's error, prefixed with the jit's name). The host blocks only when
// kMaxRunAhead calls are already in flight, and for donated arguments when calls in flight on
// another queue may still read them. A donated argument is deleted for the caller at once
// (ConcreteArray::donated); the call takes its buffers when it starts, after every call queued
// before it on its queue (FIFO) — in a training loop, after the previous step, without the host
// waiting for it.
// Waits for every call in flight on a queue other than `queue` (-1: every call).
void drain_in_flight(int queue = -1) {
  InFlight& f = in_flight();
  std::unique_lock lk(f.mu);
  for (;;) {
    while (!f.calls.empty() && f.calls.front().pending->done.load()) f.calls.pop_front();
    auto other = std::find_if(f.calls.begin(), f.calls.end(),
                              [&](const InFlightCall& k) { return k.queue != queue && !k.pending->done.load(); });
    if (other == f.calls.end()) return;
    std::shared_ptr<PendingValue> p = other->pending;
    lk.unlock();
    try {
      p->wait();
    } catch (...) {  // its error belongs to its outputs' readers
    }
    lk.lock();
  }
}

// The program's outputs as arrays that get their buffers when `pending` finishes.
std::vector<std::shared_ptr<ConcreteArray>> pending_outputs(const Compiled& c,
                                                            const std::shared_ptr<PendingValue>& pending) {
  std::vector<std::shared_ptr<ConcreteArray>> out;
  for (AbstractValue av : c.executable.jaxpr().out_avals()) {
    av.vma.clear();
    auto a = std::make_shared<ConcreteArray>(std::move(av), pending);
    if (out.size() < c.out_shardings.size()) a->sharding = c.out_shardings[out.size()];
    a->unsplit_when_ready = c.outputs_unsplit;
    out.push_back(std::move(a));
  }
  return out;
}

// On the dispatch queue, when the call starts: a donated argument's buffers move to a fresh array
// that only this call holds (so its kernels may update them in place).
Array take_donated(const Array& a) {
  ConcreteArray* c = concrete(a);  // its producer was queued earlier: normally done already
  auto taken = std::make_shared<ConcreteArray>(c->aval, c->buffers[0]);
  taken->buffers = std::move(c->buffers);
  taken->sharding = c->sharding;
  c->buffers.clear();
  return Array(taken);
}

std::vector<Array> dispatch(const Compiled& c, const std::string& name, const std::vector<Array>& leaves,
                            const std::vector<size_t>& donated) {
  std::optional<Device> device;
  for (size_t k = 0; k < leaves.size(); ++k) {
    auto* a = static_cast<ConcreteArray*>(leaves[k].impl());
    if (!a || !a->is_concrete()) throw Error("internal: jit dispatch of a non-concrete argument");
    if (a->donated.load() || (a->ready() && a->buffers.empty()))
      raise_deleted(fmt::format("jit '{}' argument {}", name, k));
    if (!device && a->ready() && a->buffers.size() == 1) device = a->buffers[0]->device();
  }
  Device queue_device = device.value_or(host_device());
  if (!donated.empty()) {
    // Calls in flight on this queue finish before this one starts; others may still read a
    // donated buffer.
    drain_in_flight(queue_device.id());
    for (size_t k : donated) static_cast<ConcreteArray*>(leaves[k].impl())->donated.store(true);
  }
  auto pending = std::make_shared<PendingValue>();
  {
    InFlight& f = in_flight();
    std::unique_lock lk(f.mu);
    while (!f.calls.empty() && f.calls.front().pending->done.load()) f.calls.pop_front();
    while (f.calls.size() >= kMaxRunAhead) {
      std::shared_ptr<PendingValue> oldest = f.calls.front().pending;
      lk.unlock();
      try {
        oldest->wait();
      } catch (...) {  // its error belongs to its outputs' readers
      }
      lk.lock();
      while (!f.calls.empty() && f.calls.front().pending->done.load()) f.calls.pop_front();
    }
    pending->sequence = next_dispatch_sequence();
    f.calls.push_back({pending, queue_device.id()});
  }
  std::vector<std::shared_ptr<ConcreteArray>> targets = pending_outputs(c, pending);
  std::vector<Array> outs(targets.begin(), targets.end());
  std::shared_ptr<const Compiled> keep = c.shared_from_this();
  submit_to_dispatch_queue(queue_device, [keep, args = leaves, donated, targets, pending, name]() mutable {
    std::exception_ptr err;
    try {
      DispatchedCallScope scope;
      for (size_t k : donated) args[k] = take_donated(args[k]);
      std::vector<Array> res = keep->executable.run(args, donated);
      args.clear();
      for (size_t i = 0; i < res.size(); ++i) {
        ConcreteArray* r = concrete(res[i]);
        targets[i]->buffers = r->buffers;
        targets[i]->sharding = r->sharding;
      }
    } catch (...) {
      err = with_context(std::current_exception(), fmt::format("jit '{}': ", name));
    }
    // Drop what the call held (inputs, the program and its constants) before readers wake:
    // after a wait, memory is as after a sync call.
    args.clear();
    targets.clear();
    keep.reset();
    pending->finish(err);
  });
  return outs;
}

// A cheap program (Executable::cheap) runs on the caller's thread, in order with the calls in
// flight: its pending arguments wait for their producers, and a donated buffer may still be read
// by an earlier call. It behaves as a dispatched call that finished at once: an error it raises
// surfaces when its outputs are read, prefixed with the jit's name.
std::vector<Array> run_inline(const Compiled& c, const std::string& name, const std::vector<Array>& leaves,
                              const std::vector<size_t>& donated) {
  if (!donated.empty()) drain_in_flight();
  try {
    std::vector<Array> outs = c.executable.run(leaves, donated);
    for (size_t k : donated) delete_array(leaves[k], name);
    return outs;
  } catch (...) {
    for (size_t k : donated) delete_array(leaves[k], name);
    auto failed = std::make_shared<PendingValue>();
    failed->sequence = next_dispatch_sequence();
    failed->finish(with_context(std::current_exception(), fmt::format("jit '{}': ", name)));
    std::vector<std::shared_ptr<ConcreteArray>> targets = pending_outputs(c, failed);
    return std::vector<Array>(targets.begin(), targets.end());
  }
}

// The mesh layout of a jit argument: its NamedSharding when split over several devices, else null.
// A value still being computed is waited for unless its layout is known already.
const NamedSharding* split_sharding(const Array& a) {
  auto* c = static_cast<ConcreteArray*>(a.impl());
  if (!c->ready() && !c->sharding) {
    if (c->unsplit_when_ready) return nullptr;
    c->await();
  }
  auto* ns = dynamic_cast<const NamedSharding*>(c->sharding.get());
  return ns && !ns->is_fully_replicated() ? ns : nullptr;
}

std::string report_text(const std::string& name, const Mesh& mesh, const std::vector<PartitionSpec>& in_specs,
                        const partition::Partitioned& part) {
  std::string s = fmt::format("sharded jit '{}' over {}\ninputs:\n", name, mesh.str());
  for (size_t i = 0; i < in_specs.size(); ++i) s += fmt::format("  leaf {}: {}\n", i, in_specs[i].str());
  s += "equations (outputs: global type, layout; {U:axes} = pending sum):\n";
  for (const partition::EquationLayout& e : part.layouts) {
    std::vector<std::string> outs;
    for (size_t k = 0; k < e.global.size(); ++k) outs.push_back(e.global[k].str() + " " + e.layouts[k].str());
    s += fmt::format("  {}{} -> {}\n", e.primitive, partition::at_call_site(e.source_info), fmt::join(outs, ", "));
  }
  int64_t bytes = 0;
  for (const auto& c : part.inserted) bytes += c.bytes;
  s += fmt::format("collectives inserted: {} ({} bytes of operands per device)\n", part.inserted.size(), bytes);
  for (const auto& c : part.inserted) s += "  " + c.str() + "\n";
  s += fmt::format("equations run whole for lack of a sharding rule (their split operands gathered): {}\n",
                   part.run_whole.size());
  for (const std::string& w : part.run_whole) s += "  " + w + "\n";
  s += "outputs:\n";
  for (size_t k = 0; k < part.out_specs.size(); ++k) s += fmt::format("  {}: {}\n", k, part.out_specs[k].str());
  return s;
}

// The partitioned program for the layouts of `leaves` (sharded jit), or null when nothing is
// split and no shardings were asked for.
std::shared_ptr<const Compiled> partitioned_for(const Compiled& c, const std::vector<Array>& leaves,
                                                const std::string& name) {
  if (c.manual_spmd) return nullptr;
  std::optional<Mesh> mesh = c.mesh;
  bool any = std::any_of(c.in_specs.begin(), c.in_specs.end(), [](const auto& s) { return s.has_value(); }) ||
             std::any_of(c.out_specs.begin(), c.out_specs.end(), [](const auto& s) { return s.has_value(); });
  std::vector<PartitionSpec> specs(leaves.size());
  std::optional<size_t> mesh_from;
  for (size_t k = 0; k < leaves.size(); ++k) {
    if (k < c.in_specs.size() && c.in_specs[k]) {
      specs[k] = *c.in_specs[k];
      continue;
    }
    const NamedSharding* ns = split_sharding(leaves[k]);
    if (!ns) continue;
    any = true;
    if (!mesh) {
      mesh = ns->mesh();
      mesh_from = k;
    } else if (!(ns->mesh() == *mesh)) {
      throw ShardingError(
          fmt::format("jit '{}': argument leaf {} is split over {}, but {} over {}; a sharded jit runs over one mesh: "
                      "device_put the arguments onto one mesh",
                      name, k, ns->mesh().str(),
                      mesh_from ? fmt::format("argument leaf {} is split", *mesh_from) : "the options", mesh->str()));
    }
    specs[k] = ns->spec();
  }
  if (!any) return nullptr;
  if (!mesh)
    throw ValueError(
        fmt::format("jit '{}': in_shardings / out_shardings need a mesh: set JitOptions::mesh, or pass "
                    "arguments split over a mesh",
                    name));
  std::string key = mesh->str();
  for (const Device& d : mesh->devices()) key += fmt::format(",{}", d.id());
  for (const PartitionSpec& s : specs) key += "|" + s.str();
  std::lock_guard lock(c.partitions_mu);
  if (auto it = c.partitions.find(key); it != c.partitions.end()) return it->second;
  partition::Partitioned part = partition::partition(c.traced, *mesh, specs, c.out_specs, name);
  auto p = std::make_shared<Compiled>(c.signature, c.traced, Executable(part.program, name), c.result_like);
  p->mesh = mesh;
  for (const PartitionSpec& s : part.out_specs) p->out_shardings.push_back(std::make_shared<NamedSharding>(*mesh, s));
  p->make_report = [name, mesh = *mesh, specs, part = std::make_shared<const partition::Partitioned>(std::move(part))] {
    return report_text(name, mesh, specs, *part);
  };
  c.partitions.emplace(key, p);
  return p;
}

}  // namespace

std::string sharding_report(const Compiled& c, const std::vector<Array>& leaves, const std::string& name) {
  std::shared_ptr<const Compiled> p = partitioned_for(c, leaves, name);
  if (!p)
    return fmt::format("jit '{}' is not partitioned: {}\n", name,
                       c.manual_spmd ? "its program is a shard_map (manual SPMD), run as written"
                                     : "no argument is split over a mesh and no shardings were given");
  std::call_once(p->report_once, [&] { p->report = p->make_report(); });
  return p->report;
}

std::vector<Array> call(JitCache& cache, const Compiled& c0, const std::vector<Array>& leaves,
                        const std::vector<size_t>& donated_leaves) {
  if (current_trace() != eval_trace()) return bind_jit(c0.traced, cache.opts.name, leaves);
  for (size_t k = 0; k < leaves.size(); ++k)
    if (!leaves[k].impl()->is_concrete() && !dynamic_cast<const Tracer*>(leaves[k].impl()))
      throw ValueError(
          fmt::format("jit '{}': argument leaf {} is an abstract value {} (a shape_dtype_struct or an "
                      "eval_shape result) with no data; abstract arguments can be lowered "
                      "(jit(f).lower(...)) but a call needs concrete Arrays",
                      cache.opts.name, k, leaves[k].aval().str()));
  std::shared_ptr<const Compiled> partitioned = partitioned_for(c0, leaves, cache.opts.name);
  const Compiled& c = partitioned ? *partitioned : c0;
  // On a GPU the program's kernels are queued on the device's stream by the calling thread: the
  // call returns once they are queued, without a dispatch thread.
  bool on_device = Executable::device_of_arguments(leaves).has_value();
  if (config::async_dispatch() && !c.executable.has_effects() && !on_device) {
    if (!c.executable.cheap()) return dispatch(c, cache.opts.name, leaves, donated_leaves);
    return run_inline(c, cache.opts.name, leaves, donated_leaves);
  }
  std::vector<Array> outs = c.executable.run(leaves, donated_leaves);
  for (size_t k : donated_leaves) delete_array(leaves[k], cache.opts.name);
  return outs;
}

}  // namespace jit_detail
}  // namespace cjax
