// The SPMD partitioner of sharded jit (docs/sharding.md §2): turns a jaxpr over global arrays into
// one per-device program, a shard_map body over every mesh axis, with the collectives that the
// layouts of its values require. Used by jit (jit/jit_api.cpp) when arguments are split over a
// mesh or in/out shardings are given.
//
// The partitioner walks the jaxpr once, in program order (JAX's "sharding in types": each
// equation's result layout follows from its operands' layouts by the primitive's sharding rule).
// A value may be *unreduced* (each device holds a partial sum over some mesh axes, the result of
// a contraction or reduction over split dimensions); the reduction is deferred to the first use
// that needs it, so that it becomes a reduce-scatter where the consumer wants the value split, an
// all-reduce where it wants it whole, and disappears where the consumer is linear (add, mul by a
// non-pending value, transpose, reshape, reduce_sum, dot_general in one operand).
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "cjax/make_jaxpr.h"
#include "cjax/sharding.h"
#include "trace/jaxpr.h"
#include "trace/source_info.h"

namespace cjax::partition {

// How one value of the partitioned program is laid out over the mesh.
struct Layout {
  std::vector<std::vector<std::string>> dims;  // per dimension: the mesh axes splitting it, major first
  std::vector<std::string> unreduced;          // pending sum over these mesh axes (mesh order)

  static Layout replicated(size_t rank) { return Layout{std::vector<std::vector<std::string>>(rank), {}}; }
  static Layout of(const PartitionSpec& spec, size_t rank);
  PartitionSpec spec() const;              // the split dimensions (not the pending sums)
  bool uses(std::string_view axis) const;  // in a dimension or pending
  bool split() const;                      // some dimension is split
  Layout without_pending() const { return Layout{dims, {}}; }
  std::string str() const;  // "P('x', None)", "P(None,){U:x}"
  bool operator==(const Layout&) const = default;
};

// A value of the program being built: this device's block and how blocks make the global value.
struct Value {
  Array local;
  Layout layout;
};

// " at file.cpp:12 (function)" for a call site, "" without one or without debug info. Call sites
// are kept as captured and symbolized only here, when a message or report is written.
std::string at_call_site(const std::shared_ptr<const SourceInfo>& info);

// One collective the partitioner inserted (for the sharding report and CJAX_LOG_RESHARDS=1).
struct InsertedCollective {
  std::string kind;  // all_gather, reduce_scatter, psum, pmax, pmin, all_to_all
  std::vector<std::string> axes;
  Shape in_shape, out_shape;  // per-device blocks
  DType dtype = DType::float32;
  int64_t bytes = 0;                              // per-device operand bytes
  std::string primitive;                          // the equation that needed it
  std::shared_ptr<const SourceInfo> source_info;  // the user's call site of that equation
  std::string why;
  std::string str() const;
};

// The layout of each equation's outputs, for the sharding report.
struct EquationLayout {
  std::string primitive;
  std::shared_ptr<const SourceInfo> source_info;
  std::vector<AbstractValue> global;
  std::vector<Layout> layouts;
};

class Partitioner {
 public:
  explicit Partitioner(Mesh mesh);
  const Mesh& mesh() const { return mesh_; }
  int64_t size_of(const std::vector<std::string>& axes) const;
  // `spec` as a layout of this mesh: axes of size 1 split nothing and are left out (they would
  // only give collectives over one device).
  Layout layout(const PartitionSpec& spec, size_t rank) const;
  Shape local_shape(const Shape& global, const Layout& layout) const;

  // `v` laid out as `target`, by the cheapest collectives: pending sums become reduce-scatters
  // onto dimensions the target splits (else one psum), axes leaving a dimension are all-gathered
  // (or moved to another dimension by all_to_all), axes joining one are local slices. Pending
  // sums the target keeps stay pending; a sum the target has pending and `v` has not is made
  // without moving data (the value on the first device of those axes, zeros elsewhere: a loop
  // carry kept pending). Results are memoized per (value, layout).
  Value reshard(const Value& v, const Layout& target);
  // `v` with no pending sum: the layout it was reduced to before, else its own split by psum.
  Value reduced(const Value& v);
  // `v` unsplit along `dims` (and reduced): for operands a primitive must see whole.
  Value gathered_along(const Value& v, const std::vector<int64_t>& dims);

  // A broadcast_in_dim result, remembered so that a later reshard rebuilds it at the target
  // layout from its (small) operand instead of slicing the broadcast value.
  void remember_broadcast(const Array& result, const Value& operand, const Params& params);

  // True for a value known to be all zeros (a broadcast of a literal 0, or a constant of at most
  // 2^20 elements that holds zeros, such as a traced zeros_like): it may be taken as a pending sum
  // over any axes (every device's zeros add up to zeros).
  bool is_zeros(const Value& v) const;
  // True (a bool scalar) on the device whose coordinate along each of `axes` is 0.
  Array first_device(const std::vector<std::string>& axes) const;
  // Stages one collective (`make`) and records it for the report.
  Array emit(const std::string& kind, const std::vector<std::string>& axes, const Array& in, const std::string& why,
             const std::function<Array()>& make);
  // Raises ShardingError naming the current equation.
  [[noreturn]] void fail(const std::string& what) const;
  std::string where() const;  // "'dot_general' at model.cpp:12 (loss)"

  const JaxprEqn* current = nullptr;  // the equation being partitioned
  std::string context;                // what is being laid out when no equation is (an output)
  std::string region;                 // appended to inserted collectives' `why` (" in a scan body ...")
  std::vector<InsertedCollective> inserted;
  std::vector<EquationLayout> layouts;
  std::vector<std::string> run_whole;  // equations without a rule that gathered split operands (where())
  // Variables (ids) that some elementwise equation needs reduced (a square, a product with
  // itself, a denominator): when one is a pending sum, a linear use reduces it too, so that
  // every use shares one psum and what follows is the same on every device (Adam's moments of
  // a data-parallel gradient: one psum, not one per moment).
  std::unordered_set<const void*> reduced_anyway;
  // For such a variable, the variables of its shape that the elementwise equations reading it (and
  // what they make of it, a few equations on) combine it with: when it is reduced, the layout of
  // the first of them already computed is where it is headed, so the pending sum becomes a
  // reduce-scatter onto that layout instead of a psum and a slice (Adam's moments of an FSDP
  // gradient). `env`: the values computed so far by the run_jaxpr in progress.
  std::unordered_map<const void*, std::vector<const void*>> reduce_peers;
  const std::unordered_map<const void*, Value>* env = nullptr;
  // `v` reduced (no pending sum), to the layout of var's first computed peer when it has one
  // (else as reduced()).
  Value reduced_for(const Value& v, const void* var);
  // The source info of the equation that produced a value (its output reshards are attributed to it).
  void remember_source(const Array& value, std::shared_ptr<const SourceInfo> source);
  std::shared_ptr<const SourceInfo> source_of(const Array& value) const;

 private:
  struct Broadcast {
    Value operand;
    Params params;
  };
  Mesh mesh_;
  std::map<std::pair<const void*, std::string>, Value> memo_;
  std::map<const void*, Broadcast> broadcasts_;
  std::map<const void*, Layout> reduced_to_;
  std::map<const void*, std::shared_ptr<const SourceInfo>> sources_;
  std::vector<Array> keep_alive_;
};

// How one primitive's equation runs on blocks: given its operands (this device's blocks and
// layouts), reshard them as the primitive needs, bind it on the blocks (with parameters made
// local: shapes of blocks) and return the outputs with their layouts.
using ShardingRule = std::function<std::vector<Value>(Partitioner&, const JaxprEqn&, std::vector<Value>&)>;
void define_sharding_rule(std::string_view primitive, ShardingRule rule);
// The rule of `def`: its own, else the elementwise rule for elementwise primitives, else null
// (the partitioner then gathers every operand and runs the equation replicated, with a warning).
const ShardingRule* find_sharding_rule(const PrimitiveDef& def);

// The partitioner's interpreter: `jaxpr`'s equations run on blocks by their sharding rules (the
// control-flow rules run their bodies with it). The jaxpr's constvars take `consts`.
std::vector<Value> run_jaxpr(Partitioner& p, const Jaxpr& jaxpr, const std::vector<Value>& consts,
                             const std::vector<Value>& args);

// Whether the elementwise `eqn` is linear in its operand `i` whatever the layouts (add, sub,
// neg, a float convert, a product with another value, a quotient's numerator): where that
// operand is a pending sum, the sum may pass through (elementwise_rule decides by the layouts).
bool elementwise_linear_in(const JaxprEqn& eqn, size_t i);

// Runs `eqn` whole on every device: every operand gathered (warned about when one was split).
std::vector<Value> run_replicated(Partitioner& p, const JaxprEqn& eqn, std::vector<Value>& ins);

// The partitioned program of `jaxpr`: a closed jaxpr over the same global arguments whose one
// top-level equation is a shard_map over every axis of `mesh` (in_specs as given, out_specs as
// `out_specs` say or as the values come out). `report`, if given, receives the collectives.
struct Partitioned {
  ClosedJaxpr program;
  std::vector<PartitionSpec> out_specs;
  std::vector<InsertedCollective> inserted;
  std::vector<EquationLayout> layouts;
  std::vector<std::string> run_whole;
};
Partitioned partition(const ClosedJaxpr& jaxpr, const Mesh& mesh, const std::vector<PartitionSpec>& in_specs,
                      const std::vector<std::optional<PartitionSpec>>& out_specs, const std::string& name);

// True if `jaxpr` or a sub-jaxpr has an equation of `primitive`. A program with a shard_map is
// manual SPMD: it runs as written (its shard_maps take split operands) and is not partitioned.
bool contains_primitive(const Jaxpr& jaxpr, std::string_view primitive);

// A jit equation run eagerly (by grad or vjp of a jit, JAX's eager impl of pjit) over inputs some
// of which are split: its jaxpr partitioned and compiled once per input layouts, or nullopt when
// no input is split (or the jaxpr is manual SPMD).
std::optional<std::vector<Array>> run_split(const std::shared_ptr<const Jaxpr>& jaxpr, std::span<const Array> inputs,
                                            const std::string& name);

}  // namespace cjax::partition
