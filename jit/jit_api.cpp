// The non-template parts of cjax/jit.h: signature cache, retrace explanations, compilation
// (trace -> passes -> Executable) and dispatch.
#include <absl/hash/hash.h>
#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <sstream>
#include <unordered_map>

#include "cjax/jit.h"
#include "core/array_impl.h"
#include "core/util.h"
#include "jit/executable.h"
#include "jit/jit_primitive.h"
#include "trace/trace.h"

namespace cjax {

namespace config {
namespace {
std::atomic<int> g_disable_jit{-1};  // -1: not set, read the environment
std::atomic<bool> g_explain{false};
}  // namespace
void set_disable_jit(bool disabled) { g_disable_jit = disabled ? 1 : 0; }
bool disable_jit() {
  int v = g_disable_jit.load();
  if (v >= 0) return v == 1;
  return env_flag("CJAX_DISABLE_JIT");
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

struct Compiled {
  Signature signature;
  ClosedJaxpr traced;      // as traced (bound under transformations)
  Executable executable;   // the optimized program run eagerly
  std::shared_ptr<const void> result_like;
};

class JitCache {
 public:
  explicit JitCache(JitOptions o) : opts(std::move(o)) {}
  JitOptions opts;
  std::mutex mu;
  std::unordered_multimap<size_t, std::shared_ptr<const Compiled>> entries;
  size_t traces = 0;
  std::string last_miss;
};

std::shared_ptr<JitCache> make_cache(const JitOptions& opts) { return std::make_shared<JitCache>(opts); }
const std::shared_ptr<const void>& result_like(const Compiled& c) { return c.result_like; }
size_t cache_size(const JitCache& c) { return c.entries.size(); }
size_t trace_count(const JitCache& c) { return c.traces; }
std::string last_cache_miss(const JitCache& c) { return c.last_miss; }
std::string lowered_text(const Compiled& c) { return c.executable.jaxpr().pretty_print(); }
bool jit_disabled() { return config::disable_jit(); }

namespace {

// JAX's explanation: the closest previously seen signature and how the new one differs.
std::string explain_miss(const JitCache& cache, const Signature& sig) {
  std::string head = fmt::format("TRACING CACHE MISS for jit '{}'", cache.opts.name);
  if (cache.entries.empty()) return head + " because it was never traced before";
  std::vector<std::string> best;
  size_t best_n = SIZE_MAX;
  for (auto& [h, c] : cache.entries) {
    const Signature& old = c->signature;
    std::vector<std::string> diffs;
    if (old.size() != sig.size()) {
      diffs.push_back(fmt::format("it was called with {} arguments before, now {}", old.size(), sig.size()));
    } else {
      for (size_t i = 0; i < sig.size(); ++i) {
        const ArgSignature &a = old[i], &b = sig[i];
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
            std::string what = a.avals[k].str() != b.avals[k].str()
                                   ? fmt::format("{}, but now given {}", a.avals[k].str(), b.avals[k].str())
                                   : fmt::format("weak_type={}, but now given weak_type={}", a.avals[k].weak_type,
                                                 b.avals[k].weak_type);
            diffs.push_back(fmt::format("at argument {}{}: seen {}", i, b.leaf_paths[k], what));
          }
        }
      }
    }
    if (diffs.size() < best_n) {
      best_n = diffs.size();
      best = diffs;
    }
  }
  std::string s = head + fmt::format(" because:\n  never seen input type signature; closest seen signature has {} "
                                     "mismatch{}, including:",
                                     best.size(), best.size() == 1 ? "" : "es");
  for (const std::string& d : best) s += "\n    * " + d;
  return s;
}

}  // namespace

std::shared_ptr<const Compiled> lookup(JitCache& cache, Signature sig,
                                       const std::function<std::vector<Array>(const std::vector<Array>&)>& flat_fn,
                                       const std::vector<AbstractValue>& in_avals,
                                       const std::function<std::shared_ptr<const void>()>& take_result,
                                       const std::function<void(Signature&)>& fill_paths) {
  size_t h = hash_signature(sig);
  {
    std::lock_guard lock(cache.mu);
    auto [b, e] = cache.entries.equal_range(h);
    for (auto it = b; it != e; ++it)
      if (it->second->signature == sig) return it->second;
  }
  fill_paths(sig);
  std::vector<std::string> arg_names;
  for (size_t i = 0; i < sig.size(); ++i)
    for (const std::string& p : sig[i].leaf_paths)
      arg_names.push_back("argument " + std::to_string(i) + (p.empty() ? "" : " (leaf " + p + ")"));
  {
    std::lock_guard lock(cache.mu);
    auto [b, e] = cache.entries.equal_range(h);
    for (auto it = b; it != e; ++it)
      if (it->second->signature == sig) return it->second;
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
  auto c = std::make_shared<Compiled>(Compiled{std::move(sig), traced, Executable(traced, cache.opts.name), take_result()});
  std::lock_guard lock(cache.mu);
  ++cache.traces;
  cache.entries.emplace(h, c);
  return c;
}

std::vector<Array> call(JitCache& cache, const Compiled& c, const std::vector<Array>& leaves,
                        const std::vector<size_t>& donated_leaves) {
  if (current_trace() != eval_trace()) return bind_jit(c.traced, cache.opts.name, leaves);
  std::vector<Array> outs = c.executable.run(leaves, donated_leaves);
  for (size_t k : donated_leaves) delete_array(leaves[k], cache.opts.name);
  return outs;
}

}  // namespace jit_detail
}  // namespace cjax
