// jit (JAX's jax.jit): traces a function once per call signature into a jaxpr, optimizes it and
// runs the result; later calls with the same signature reuse it without tracing.
//
//   auto step = jit([](const Params& p, const Array& x) { return loss(p, x); }, {.name = "step"});
//   Array l = step(params, x);      // traces and compiles on the first call
//   step(params, x2);               // same shapes/dtypes: no retrace (step.trace_count() == 1)
//
// Signature (docs/design.md §5.2): for each argument its C++ type; for tree arguments (cjax/tree.h) the
// tree structure and every leaf's shape, dtype and weak type; other arguments are static and
// compared by value (they need operator== and std::hash or a hash() member): a new static value
// retraces. Under another transformation (grad, vmap, make_jaxpr, an enclosing jit) a jitted
// function binds one `jit` equation (printed `jit[name=... jaxpr={ ... }]`) that those
// transformations handle, so grad(jit(f)), jit(grad(f)) and vmap(jit(f)) all work.
//
// config::set_disable_jit(true) or the environment variable CJAX_DISABLE_JIT=1 makes jitted
// functions call `f` directly, op by op, so it can be stepped through in gdb.
// config::set_explain_cache_misses(true) (JAX's jax_explain_cache_misses) prints, on each
// retrace, which argument changed and how; last_cache_miss() returns that text too.
//
// donate_argnums: the listed arguments' buffers are given to the call; afterwards those Arrays
// are deleted and using them raises ValueError (JAX: "Array has been deleted").
//
// Ahead-of-time lowering (JAX's jit(f).lower(args).compile()):
//
//   auto lowered = jit(f).lower(x, y);          // traces and compiles for this signature
//   std::cout << lowered.as_text();             // the traced jaxpr (a stages::Lowered)
//   auto compiled = lowered.compile();          // a stages::Compiled
//   Array out = compiled(x, y);                 // same as jit(f)(x, y); no trace, no cache lookup
//   compiled.as_text();                         // the optimized jaxpr the executable runs
//   CostAnalysis cost = compiled.cost_analysis();   // cost.flops, cost.bytes_accessed, ...
//
// lower(args...) takes what a call takes, Arrays or abstract Arrays (shape_dtype_struct,
// cjax/eval_shape.h) alike, and goes through the function's cache: it traces only on a miss and
// a later call (or lower) with the same signature reuses the entry, so jit(f).lower(x).compile()(x)
// traces f once. cjax compiles when it traces, so compile() does no further work. A Compiled is
// called with arguments of the lowered signature only; anything else (another shape, dtype, weak
// type, tree structure or static value) raises ValueError naming the argument, as JAX's
// TypeError "Computation compiled for input types ... called with ...". Under a transformation a
// Compiled binds the same `jit` equation as the jitted function; config::set_disable_jit does not
// affect it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <vector>

#include "cjax/array.h"
#include "cjax/make_jaxpr.h"
#include "cjax/shard_map.h"
#include "cjax/sharding.h"
#include "cjax/tree.h"

namespace cjax {

// A static estimate of a compiled program's cost (JAX's Compiled.cost_analysis()), from the
// optimized jaxpr and its fusion plan:
//  * flops: one per output element of each elementwise operation (convert, select, integer_pow
//    included; stop_gradient and bitcasts are free), one per input element of each reduction
//    (reduce_*, argmax/argmin, cumulative ops, psum and the other reducing collectives; one per
//    update element for scatter-add/mul/min/max), 2*M*N*K per dot_general (batch included;
//    dot_general_accumulate adds 2 per output element) and 2*out_elements*(kernel size * input
//    features) per convolution; shape, broadcast, slicing and gather operations are free.
//  * transcendentals: output elements of exp, exp2, log, log1p, expm1, tanh, logistic, sin,
//    cos, tan, the inverse and hyperbolic trigonometric functions, sqrt, rsqrt, cbrt, erf, erfc,
//    erf_inv, lgamma, pow and atan2 (also counted in flops, unlike XLA).
//  * bytes_accessed: bytes each step of the program reads and writes: a fused kernel's inputs and
//    outputs (its intermediates stay in registers), a library step's operands and results.
// Bodies of calls count once, cond its costliest branch, scan its body times its length, while
// its body and condition once (the trip count is not known), shard_map its body once per device.
struct CostAnalysis {
  double flops = 0;
  double transcendentals = 0;
  double bytes_accessed = 0;
};

// Memory a compiled program needs (JAX's Compiled.memory_analysis()), in bytes.
struct MemoryAnalysis {
  int64_t argument_size_in_bytes = 0;
  int64_t output_size_in_bytes = 0;
  int64_t alias_size_in_bytes = 0;  // donated arguments (their buffers may hold outputs)
  // The most bytes of intermediates (neither arguments nor outputs) alive at once, walking the
  // program's steps (fused kernels, library calls) in order, each value freed after its last
  // reader. An estimate: an output written in place over a dying input counts as a buffer of its
  // own (overstating), values inside bodies of control flow are not counted (understating).
  int64_t temp_size_in_bytes = 0;
  int64_t constant_size_in_bytes = 0;  // arrays the function captured
};

// Sharded jit (docs/sharding.md §2): when an argument is split over a mesh (a NamedSharding that
// is not fully replicated), or in_shardings / out_shardings are given, jit partitions the program
// into one per-device program over the mesh and inserts the collectives the layouts need:
//
//   Mesh mesh = make_mesh({4}, {"data"});
//   auto step = jit(train_step, {.mesh = mesh, .in_shardings = {P(), P("data")}, .out_shardings = P()});
//
// in_shardings: a tree prefix of the arguments (one entry per argument, or one P for all); None
// (or no entry) keeps an argument's own layout. out_shardings: a tree prefix of the result; None
// lets the partitioner lay the output out as it comes. Shardings are part of the cache key
// (the program is traced once per signature and partitioned once per argument layout).
struct JitOptions {
  std::string name = "<lambda>";  // printed as jit[name=...]; JAX uses the Python function's name
  std::vector<int> donate_argnums = {};
  std::optional<Mesh> mesh = std::nullopt;  // needed when no argument is split but shardings are given
  std::optional<SpecTree> in_shardings = std::nullopt;
  std::optional<SpecTree> out_shardings = std::nullopt;
};

namespace config {
// Async dispatch (default on; CJAX_SYNC_DISPATCH=1 turns it off): an eager jit call queues the
// program on a device's dispatch queue and returns its outputs at once; reading one (item,
// to_vector, printing, an eager op, block_until_ready) waits for it, and raises the call's
// error, if any, prefixed with "jit '<name>': ". At most 8 calls run ahead of the host.
void set_async_dispatch(bool enabled);
bool async_dispatch();
void set_disable_jit(bool disabled);
bool disable_jit();  // also true when CJAX_DISABLE_JIT=1 in the environment
void set_explain_cache_misses(bool enabled);
bool explain_cache_misses();
// How many call signatures each jitted function keeps compiled (default 256, or the environment
// variable CJAX_JIT_CACHE_CAPACITY); beyond it the least recently used one is dropped and traced
// again if called again. Each entry holds a traced and an optimized program (~100 KB).
inline constexpr size_t kDefaultJitCacheCapacity = 256;
void set_jit_cache_capacity(size_t entries);
size_t jit_cache_capacity();
}  // namespace config
inline void explain_cache_misses(bool enabled) { config::set_explain_cache_misses(enabled); }

namespace jit_detail {

// A static argument, type-erased: compared with ==, hashed, printed for explanations.
struct StaticValue {
  std::type_index type = typeid(void);
  size_t hash = 0;
  std::shared_ptr<const void> value;
  bool (*equal)(const void*, const void*) = nullptr;
  std::string (*describe)(const void*) = nullptr;
  bool operator==(const StaticValue& o) const {
    return type == o.type && hash == o.hash && equal(value.get(), o.value.get());
  }
};

template <class T>
concept has_hash_member = requires(const T& t) {
  { t.hash() } -> std::convertible_to<size_t>;
};
template <class T>
concept std_hashable = requires(const T& t) {
  { std::hash<T>{}(t) } -> std::convertible_to<size_t>;
};
template <class T>
concept streamable = requires(std::ostream& os, const T& t) {
  os << t;
};

std::string describe_with_stream(const std::function<void(std::ostream&)>& f);

template <class T>
StaticValue make_static(const T& x) {
  static_assert(std::equality_comparable<T>,
                "jit: a static (non-Array) argument must be ==-comparable; make it a tree of Arrays or add operator==");
  static_assert(has_hash_member<T> || std_hashable<T>,
                "jit: a static (non-Array) argument must be hashable: give it a hash() member or specialize std::hash");
  StaticValue s;
  s.type = typeid(T);
  if constexpr (has_hash_member<T>)
    s.hash = x.hash();
  else
    s.hash = std::hash<T>{}(x);
  s.value = std::make_shared<const T>(x);
  s.equal = [](const void* a, const void* b) { return *static_cast<const T*>(a) == *static_cast<const T*>(b); };
  s.describe = [](const void* a) -> std::string {
    if constexpr (streamable<T>)
      return describe_with_stream([a](std::ostream& os) { os << *static_cast<const T*>(a); });
    else
      return std::string("a value of type ") + typeid(T).name();
  };
  return s;
}

// What one argument contributes to the signature.
struct ArgSignature {
  std::type_index type = typeid(void);
  bool is_tree = false;
  TreeDef tree;                         // trees
  std::vector<AbstractValue> avals;     // trees: one per leaf
  std::vector<std::string> leaf_paths;  // filled only on a cache miss (for explanations)
  StaticValue static_value;             // static arguments
  bool operator==(const ArgSignature& o) const;
};
using Signature = std::vector<ArgSignature>;
size_t hash_signature(const Signature& s);

template <class A>
ArgSignature arg_signature(const A& a, std::vector<Array>& leaves) {
  ArgSignature s;
  s.type = typeid(A);
  if constexpr (is_tree_v<A>) {
    s.is_tree = true;
    s.tree = tree::structure(a);
    size_t before = leaves.size();
    TreeTraits<std::remove_cvref_t<A>>::flatten(a, leaves);
    s.avals.reserve(leaves.size() - before);
    for (size_t i = before; i < leaves.size(); ++i) {
      if (!leaves[i].defined()) throw ValueError("jit: an argument holds an empty Array handle; pass defined Arrays");
      s.avals.push_back(leaves[i].aval());
    }
  } else {
    s.static_value = make_static(a);
  }
  return s;
}

template <class A>
void fill_leaf_paths(const A& a, ArgSignature& s) {
  if constexpr (is_tree_v<A>) {
    s.leaf_paths.clear();
    for (auto& [path, leaf] : tree::leaves_with_path(a)) s.leaf_paths.push_back(path.str());
  }
}

// The cache and compiled programs of one jitted function (jit/jit_api.cpp).
class JitCache;
struct Compiled;
std::shared_ptr<JitCache> make_cache(const JitOptions& opts);
// Per flat argument leaf and per flat result leaf: the PartitionSpec that in_shardings /
// out_shardings give it (nullopt: none), filled after tracing.
using FlatSpecs = std::vector<std::optional<PartitionSpec>>;
using FlatSpecsFn = std::function<void(FlatSpecs& in, FlatSpecs& out)>;
// Looks up `sig`; on a miss calls `trace` (which must trace the function with trace_flat-style
// flat inputs) and compiles. `result_like` receives the type-erased result object of the trace.
std::shared_ptr<const Compiled> lookup(JitCache& cache, Signature sig,
                                       const std::function<std::vector<Array>(const std::vector<Array>&)>& flat_fn,
                                       const std::vector<AbstractValue>& in_avals,
                                       const std::function<std::shared_ptr<const void>()>& take_result,
                                       const std::function<void(Signature&)>& fill_paths,
                                       const FlatSpecsFn& flat_specs = {});
// One argument's in_shardings entry: the argument's entry of a list with one per argument, else
// the whole tree (applies to every argument).
const SpecTree& in_sharding_entry(const SpecTree& all, size_t index, size_t num_args, const std::string& name);
template <class A>
void flatten_in_sharding(const A& a, const SpecTree& spec, size_t index, FlatSpecs& out) {
  std::string what = "in_shardings[" + std::to_string(index) + "]";
  if constexpr (is_tree_v<A>)
    spec.flatten(tree::structure(a), what, out);
  else
    spec.flatten(TreeDef::none(), what, out);
}
const std::shared_ptr<const void>& result_like(const Compiled& c);
// Runs (eagerly) or binds (under a transformation) the compiled function on flat leaves.
std::vector<Array> call(JitCache& cache, const Compiled& c, const std::vector<Array>& leaves,
                        const std::vector<size_t>& donated_leaves);
size_t cache_size(const JitCache& cache);
size_t trace_count(const JitCache& cache);
std::string last_cache_miss(const JitCache& cache);
std::string lowered_text(const Compiled& c);  // the optimized jaxpr's text
std::string sharding_report(const Compiled& c, const std::vector<Array>& leaves, const std::string& name);
const ClosedJaxpr& traced_jaxpr(const Compiled& c);
CostAnalysis cost_analysis(const Compiled& c);
MemoryAnalysis memory_analysis(const Compiled& c, const std::vector<int>& donate_argnums);
// Raises ValueError, naming `name` and each argument that differs, unless `sig` is the signature
// `c` was compiled for. `fill_paths` fills sig's leaf paths (for the message).
void check_compiled_signature(const Compiled& c, const std::string& name, Signature& sig,
                              const std::function<void(Signature&)>& fill_paths);
bool jit_disabled();

// The flat leaves of a call's arguments, its signature and the leaves donated by `donate_argnums`.
struct FlatArgs {
  std::vector<Array> leaves;
  Signature sig;
  std::vector<size_t> donated;
};
template <class... A>
FlatArgs flatten_args(const std::vector<int>& donate_argnums, const A&... args) {
  FlatArgs r;
  size_t index = 0;
  (([&] {
     size_t before = r.leaves.size();
     r.sig.push_back(arg_signature(args, r.leaves));
     for (int d : donate_argnums)
       if (size_t(d) == index)
         for (size_t k = before; k < r.leaves.size(); ++k) r.donated.push_back(k);
     ++index;
   })(),
   ...);
  return r;
}

// Arguments rebuilt from flat tracers: one rebuild for make_jaxpr, jit and vmap.
using jaxpr_detail::rebuild;

}  // namespace jit_detail

// The stages of ahead-of-time lowering, as JAX's jax.stages (see the top of this file).
namespace stages {

// jit(f).lower(args...).compile(): a program compiled for one signature, called with arguments of
// the types A... of that signature.
template <class R, class... A>
class Compiled {
 public:
  Compiled(std::shared_ptr<jit_detail::JitCache> cache, std::shared_ptr<const jit_detail::Compiled> c,
           std::vector<int> donate_argnums, std::string name)
      : cache_(std::move(cache)), c_(std::move(c)), donate_(std::move(donate_argnums)), name_(std::move(name)) {}

  R operator()(const A&... args) const {
    jit_detail::FlatArgs flat = jit_detail::flatten_args(donate_, args...);
    jit_detail::check_compiled_signature(*c_, name_, flat.sig, [&](jit_detail::Signature& s) {
      size_t i = 0;
      ((jit_detail::fill_leaf_paths(args, s[i++])), ...);
    });
    std::vector<Array> outs = jit_detail::call(*cache_, *c_, flat.leaves, flat.donated);
    return tree::unflatten(*static_cast<const R*>(jit_detail::result_like(*c_).get()), outs);
  }
  // The optimized jaxpr the executable runs (after inlining, folding, CSE, DCE; before fusion).
  std::string as_text() const { return jit_detail::lowered_text(*c_); }
  CostAnalysis cost_analysis() const { return jit_detail::cost_analysis(*c_); }
  MemoryAnalysis memory_analysis() const { return jit_detail::memory_analysis(*c_, donate_); }

 private:
  std::shared_ptr<jit_detail::JitCache> cache_;
  std::shared_ptr<const jit_detail::Compiled> c_;
  std::vector<int> donate_;
  std::string name_;
};

// jit(f).lower(args...): the traced program for one signature.
template <class R, class... A>
class Lowered {
 public:
  Lowered(std::shared_ptr<jit_detail::JitCache> cache, std::shared_ptr<const jit_detail::Compiled> c,
          std::vector<int> donate_argnums, std::string name)
      : cache_(std::move(cache)), c_(std::move(c)), donate_(std::move(donate_argnums)), name_(std::move(name)) {}
  // The traced jaxpr in JAX's text (what make_jaxpr(f)(args...) prints).
  std::string as_text() const { return jaxpr().pretty_print(); }
  const ClosedJaxpr& jaxpr() const { return jit_detail::traced_jaxpr(*c_); }
  Compiled<R, A...> compile() const { return Compiled<R, A...>(cache_, c_, donate_, name_); }

 private:
  std::shared_ptr<jit_detail::JitCache> cache_;
  std::shared_ptr<const jit_detail::Compiled> c_;
  std::vector<int> donate_;
  std::string name_;
};

}  // namespace stages

template <class F>
class Jitted {
 public:
  Jitted(F f, JitOptions opts) : f_(std::move(f)), opts_(std::move(opts)), cache_(jit_detail::make_cache(opts_)) {}

  template <class... A>
  auto operator()(const A&... args) const {
    using R = std::remove_cvref_t<std::invoke_result_t<const F&, const A&...>>;
    static_assert(is_tree_v<R>, "jit: the function must return a tree of Arrays");
    if (jit_detail::jit_disabled()) return R(f_(args...));
    jit_detail::FlatArgs flat = jit_detail::flatten_args(opts_.donate_argnums, args...);
    auto compiled = lookup<R>(std::move(flat.sig), flat.leaves, args...);
    std::vector<Array> outs = jit_detail::call(*cache_, *compiled, flat.leaves, flat.donated);
    return tree::unflatten(*static_cast<const R*>(jit_detail::result_like(*compiled).get()), outs);
  }

  // Ahead-of-time lowering for the signature of `args` (see the top of this file).
  template <class... A>
  auto lower(const A&... args) const {
    using R = std::remove_cvref_t<std::invoke_result_t<const F&, const A&...>>;
    static_assert(is_tree_v<R>, "jit: the function must return a tree of Arrays");
    jit_detail::FlatArgs flat = jit_detail::flatten_args({}, args...);
    return stages::Lowered<R, A...>(cache_, lookup<R>(std::move(flat.sig), flat.leaves, args...), opts_.donate_argnums,
                                    opts_.name);
  }

  // Sharded jit, before running anything: the layout of every equation's outputs and every
  // collective the partitioner inserts for these arguments (kind, axes, per-device shapes, bytes,
  // the equation and the user's source line that needed it). Partitions (and caches) the program.
  template <class... A>
  std::string sharding_report(const A&... args) const {
    using R = std::remove_cvref_t<std::invoke_result_t<const F&, const A&...>>;
    jit_detail::FlatArgs flat = jit_detail::flatten_args({}, args...);
    auto c = lookup<R>(std::move(flat.sig), flat.leaves, args...);
    return jit_detail::sharding_report(*c, flat.leaves, opts_.name);
  }

  size_t cache_size() const { return jit_detail::cache_size(*cache_); }
  size_t trace_count() const { return jit_detail::trace_count(*cache_); }
  // Why the last retrace happened ("" if there was none or explanations are off).
  std::string last_cache_miss() const { return jit_detail::last_cache_miss(*cache_); }
  const JitOptions& options() const { return opts_; }

 private:
  // The cache entry for `sig`, tracing and compiling `f_` on a miss.
  template <class R, class... A>
  std::shared_ptr<const jit_detail::Compiled> lookup(jit_detail::Signature sig, const std::vector<Array>& leaves,
                                                     const A&... args) const {
    std::vector<AbstractValue> avals;
    for (const Array& l : leaves) avals.push_back(l.aval());
    std::optional<R> result;
    return jit_detail::lookup(
        *cache_, std::move(sig),
        [&](const std::vector<Array>& xs) {
          size_t pos = 0;
          std::tuple<decltype(jit_detail::rebuild(args, xs, pos))...> call{jit_detail::rebuild(args, xs, pos)...};
          result.emplace(std::apply(f_, call));
          return tree::leaves(*result);
        },
        avals, [&]() -> std::shared_ptr<const void> { return std::make_shared<const R>(std::move(*result)); },
        [&](jit_detail::Signature& s) {
          size_t i = 0;
          ((jit_detail::fill_leaf_paths(args, s[i++])), ...);
        },
        [&](jit_detail::FlatSpecs& in, jit_detail::FlatSpecs& out) {
          if (opts_.in_shardings) {
            size_t i = 0;
            ((jit_detail::flatten_in_sharding(args,
                                              jit_detail::in_sharding_entry(*opts_.in_shardings, i, sizeof...(A),
                                                                            opts_.name),
                                              i, in),
              ++i),
             ...);
          }
          if (opts_.out_shardings) opts_.out_shardings->flatten(tree::structure(*result), "out_shardings", out);
        });
  }

  F f_;
  JitOptions opts_;
  std::shared_ptr<jit_detail::JitCache> cache_;
};

template <class F>
Jitted<F> jit(F f, JitOptions opts = {}) {
  return Jitted<F>(std::move(f), std::move(opts));
}

}  // namespace cjax
