// Devices meshes, partition specs and named shardings (JAX's jax.sharding), device_put, and
// debug::visualize_array_sharding.
//
//   Mesh mesh = make_mesh({4, 2}, {"i", "j"});            // Mesh('i': 4, 'j': 2)
//   NamedSharding s(mesh, P("i", None));                   // rows split over i, replicated over j
//   Array y = device_put(x, s);                             // one buffer per mesh device
//   debug::visualize_array_sharding(y);                     // table of device ids per block
//
// A sharded array holds one buffer per mesh device, in the row-major order of mesh.devices();
// devices that differ only along mesh axes the spec does not name hold copies of the same block.
#pragma once
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cjax/array.h"
#include "cjax/device.h"
#include "cjax/tree.h"

namespace cjax {

// A named grid of devices. devices() is the grid flattened row-major (first axis slowest).
class Mesh {
 public:
  Mesh() = default;
  Mesh(std::vector<Device> devices, Shape shape, std::vector<std::string> axis_names);
  const Shape& shape() const { return shape_; }
  const std::vector<std::string>& axis_names() const { return axis_names_; }
  const std::vector<Device>& devices() const { return devices_; }
  int64_t size() const { return int64_t(devices_.size()); }
  int64_t axis_size(std::string_view name) const;                // ShardingError naming the mesh axes if unknown
  int axis_index(std::string_view name) const;                   // position in axis_names(), -1 if absent
  std::vector<int64_t> coords(int64_t flat_device_index) const;  // mesh coordinates, one per axis
  std::string str() const;                                       // "Mesh('x': 4, 'y': 2)"
  bool operator==(const Mesh&) const = default;
  size_t hash() const;

 private:
  std::vector<Device> devices_;
  Shape shape_;
  std::vector<std::string> axis_names_;
};

// A mesh over the first prod(axis_shapes) devices; ShardingError naming both counts if too few.
Mesh make_mesh(Shape axis_shapes, std::vector<std::string> axis_names);

// Several mesh axes splitting one dimension (first name major): P(axes("i", "j"), None).
struct AxisTuple {
  std::vector<std::string> names;
};
template <class... S>
AxisTuple axes(S&&... names) {
  return AxisTuple{{std::string(std::forward<S>(names))...}};
}

// JAX's PartitionSpec. Each entry is None (dimension not split), one axis name, or an axis tuple.
class PartitionSpec {
 public:
  struct Entry {
    std::vector<std::string> names;  // empty: None
    bool is_tuple = false;           // written as a tuple (printing only)
    Entry(NoneT) {}
    Entry(const char* name) : names{name} {}
    Entry(std::string name) : names{std::move(name)} {}
    Entry(AxisTuple t) : names(std::move(t.names)), is_tuple(true) {}
    bool operator==(const Entry& o) const { return names == o.names; }
  };
  PartitionSpec() = default;
  template <class... E>
  requires(sizeof...(E) > 0 && (std::is_constructible_v<Entry, E> && ...)) PartitionSpec(E&&... entries)
      : entries_{Entry(std::forward<E>(entries))...} {}
  explicit PartitionSpec(std::vector<Entry> entries) : entries_(std::move(entries)) {}

  const std::vector<Entry>& entries() const { return entries_; }
  size_t size() const { return entries_.size(); }
  std::vector<std::string> mentioned_axes() const;  // in order of appearance
  std::string str() const;                          // "P('i', None)", "P(('i', 'j'), None)", "P('x',)", "P()"
  bool operator==(const PartitionSpec&) const = default;
  size_t hash() const;

 private:
  std::vector<Entry> entries_;
};
using P = PartitionSpec;

// Which slice of the global array a device holds: mesh + spec. Construction checks the spec
// against the mesh (SpecError: unknown axis, axis used twice); use with an array checks it against
// the shape (ShardingError: spec longer than the rank, dimension not divisible).
class NamedSharding : public Sharding {
 public:
  NamedSharding(Mesh mesh, PartitionSpec spec);
  const Mesh& mesh() const { return mesh_; }
  const PartitionSpec& spec() const { return spec_; }
  std::string str() const override;  // NamedSharding(mesh=Mesh('x': 4), spec=P('x',), memory_kind=device)
  std::vector<Device> device_set() const override { return mesh_.devices(); }
  bool is_fully_replicated() const;  // no dimension split over an axis of size > 1

  void check_shape(const Shape& global_shape) const;
  Shape shard_shape(const Shape& global_shape) const;
  // Per device of mesh().devices(): the block index along each dimension (0 for unsplit dims).
  std::vector<int64_t> block_coords(const Shape& global_shape, int64_t flat_device_index) const;
  // Per device of mesh().devices(): the slice of the global array it holds (JAX's
  // devices_indices_map; unsplit dimensions are Slice(), the whole axis).
  std::vector<std::vector<Slice>> devices_indices(const Shape& global_shape) const;
  int64_t num_blocks(int dim) const;  // product of the mesh axes splitting `dim`

  bool operator==(const NamedSharding& o) const { return mesh_ == o.mesh_ && spec_ == o.spec_; }
  size_t hash() const;

 private:
  Mesh mesh_;
  PartitionSpec spec_;
};

// True for SingleDeviceSharding and for a NamedSharding that splits nothing.
bool is_fully_replicated(const Sharding&);
// Kernels read one buffer: raises ShardingError when `x` holds several buffers that are not copies
// of one value (a fully replicated array may be read from its first copy). `what` names the use,
// e.g. "'add' input 0"; for eager dispatch and for any other path that runs kernels (jit).
void require_one_copy(const Array& x, std::string_view what);

// Places `x` as `sharding` says: one buffer per device of a NamedSharding's mesh (each holding its
// block), or one buffer on a SingleDeviceSharding's device (assembling a sharded array).
Array device_put(const Array& x, const Sharding& sharding);
template <class T>
requires(is_tree_v<T> && !std::is_same_v<std::remove_cvref_t<T>, Array>) auto device_put(const T& tree,
                                                                                         const Sharding& sharding) {
  return tree::map([&](const Array& leaf) { return device_put(leaf, sharding); }, tree);
}

// JAX's with_sharding_constraint: `x` laid out as `sharding` says. Eagerly this is device_put.
// Under jit, grad, vmap or make_jaxpr it stages a `sharding_constraint` equation: the identity
// on values, with the sharding recorded in its parameters; when the program runs, the operand is
// resharded to that sharding. Its derivatives constrain tangents and cotangents alike, and vmap
// adds the batch dimension unsplit (or split over vmap's spmd_axis_name). Inside a shard_map body
// it raises ShardingError (the mesh axes are manual there).
Array with_sharding_constraint(const Array& x, const Sharding& sharding);
template <class T>
requires(is_tree_v<T> &&
         !std::is_same_v<std::remove_cvref_t<T>, Array>) auto with_sharding_constraint(const T& tree,
                                                                                       const Sharding& sharding) {
  return tree::map([&](const Array& leaf) { return with_sharding_constraint(leaf, sharding); }, tree);
}

// Rule-based parameter sharding (the GSPMD RFC's and Paddle's "sharding rules", T5X's
// match_partition_rules): each leaf of a tree gets the spec of the first rule whose regular
// expression (ECMAScript, std::regex_search) matches the leaf's dotted path ("layers.0.attn_qkv",
// "embed"); scalars are replicated.
//
//   std::vector<sharding::Rule> rules{{"attn_qkv$", P(None, "fsdp", "tensor", None)},
//                                     {"mlp_in$", P("fsdp", "tensor")}, {".*", P()}};
//   Params placed = sharding::apply_rules(params, mesh, rules, {.strict = true});
//
// A leaf no rule matches is replicated, or with `strict` raises ShardingError naming every such
// leaf. A spec longer than its leaf's rank, or splitting a dimension its axes do not divide,
// raises ShardingError naming the leaf and the rule.
namespace sharding {
struct Rule {
  std::string pattern;
  PartitionSpec spec;
};
struct RuleOptions {
  bool strict = false;
};
// One spec per leaf (paths and shapes in leaf order).
std::vector<PartitionSpec> match_rules(const std::vector<std::string>& paths, const std::vector<Shape>& shapes,
                                       const Mesh& mesh, const std::vector<Rule>& rules, RuleOptions opts = {});
template <class T>
std::vector<PartitionSpec> specs_from_rules(const T& tree, const Mesh& mesh, const std::vector<Rule>& rules,
                                            RuleOptions opts = {}) {
  std::vector<std::string> paths;
  std::vector<Shape> shapes;
  for (auto& [path, leaf] : tree::leaves_with_path(tree)) {
    paths.push_back(path.dotted());
    shapes.push_back(leaf.shape());
  }
  return match_rules(paths, shapes, mesh, rules, opts);
}
// `tree` with every leaf device_put onto `mesh` with its rule's spec.
template <class T>
T apply_rules(const T& tree, const Mesh& mesh, const std::vector<Rule>& rules, RuleOptions opts = {}) {
  std::vector<PartitionSpec> specs = specs_from_rules(tree, mesh, rules, opts);
  std::vector<Array> leaves = tree::leaves(tree);
  for (size_t i = 0; i < leaves.size(); ++i) leaves[i] = device_put(leaves[i], NamedSharding(mesh, specs[i]));
  return tree::unflatten(tree, leaves);
}
}  // namespace sharding

namespace debug {
// A box-drawing table with one cell per block of a 0-D, 1-D or 2-D array, labelled with the
// platform and the ids of the devices holding that block, e.g. for an (8,) array sharded P('i')
// over 4 devices:
//   ┌───────┬───────┬───────┬───────┐
//   │ CPU 0 │ CPU 1 │ CPU 2 │ CPU 3 │
//   └───────┴───────┴───────┴───────┘
// Rows are blocks along dimension 0, columns blocks along dimension 1; every cell has the width of
// the longest label plus one space each side (JAX's rich table also scales cells by the array
// shape; this text does not). ShardingError for rank > 2.
std::string visualize_array_sharding(const Array& x);
}  // namespace debug

}  // namespace cjax

template <>
struct std::hash<cjax::Mesh> {
  size_t operator()(const cjax::Mesh& m) const { return m.hash(); }
};
template <>
struct std::hash<cjax::PartitionSpec> {
  size_t operator()(const cjax::PartitionSpec& p) const { return p.hash(); }
};
template <>
struct std::hash<cjax::NamedSharding> {
  size_t operator()(const cjax::NamedSharding& s) const { return s.hash(); }
};
