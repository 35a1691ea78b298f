// Collectives (JAX's jax.lax parallel operators), over the manual mesh axes of an enclosing
// shard_map or the axis_name of an enclosing vmap. Semantics: docs/shard_map.md §1.6;
// varying-axes rules §2.2; transposes §3.3; over a vmapped axis: docs/vmap_collectives.md.
//
//   auto f = shard_map([](const Array& x) { return lax::psum(x, "i"); }, mesh, P("i"), P());
//
// `AxisNames` is one mesh axis ("i") or several ({"i", "j"}): several axes act as one axis of
// size prod(sizes) whose index is row-major in the order written (first name most significant).
// A collective over an axis the operand does not vary over first makes it vary (pvary), so
// psum of an invariant value multiplies it by the group size (decision D2 for mixed sets).
// Over an axis that no enclosing shard_map (as a manual axis) or vmap binds they raise
// AxisNameError. Every collective also accepts a tree of Arrays and applies to each leaf.
//
// Over a vmap's axis_name ("b" in vmap(f, 0, 0, {.axis_name = "b"})) the group's members are the
// batch's examples, as in JAX: psum/pmean/pmax/pmin reduce over the batch, all_gather gives every
// example the whole batch, psum_scatter gives example k chunk k of the sum, ppermute and
// all_to_all move blocks between examples, pbroadcast copies one example, axis_index is the
// example's index and pvary is the identity. Reductions and axis_index may mix vmapped and mesh
// axes ({"i", "b"}); the others take a vmapped axis alone. psum's transpose over a vmapped axis is
// psum (JAX's): vmap(grad(f)) differentiates the sum of every example's output.
#pragma once
#include <initializer_list>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "cjax/array.h"
#include "cjax/tree.h"

namespace cjax {

struct AxisNames {
  std::vector<std::string> names;
  AxisNames(const char* name) : names{name} {}
  AxisNames(std::string name) : names{std::move(name)} {}
  AxisNames(std::initializer_list<std::string> ns) : names(ns) {}
  AxisNames(std::vector<std::string> ns) : names(std::move(ns)) {}
  std::string str() const;  // "('i',)", "('i', 'j')"
};

namespace config {
// How long a device waits at a collective for the others before raising CollectiveError
// (default 300 s, or CJAX_COLLECTIVE_TIMEOUT_S).
double collective_timeout_seconds();
void set_collective_timeout_seconds(double seconds);
}  // namespace config

namespace lax {

struct AllGatherOpts {
  int axis = 0;
  bool tiled = false;         // concatenate (true) or stack along a new axis (false)
  bool to_invariant = false;  // JAX's to='invarying': the result is invariant over the axes
};
struct PsumScatterOpts {
  int scatter_dimension = 0;
  bool tiled = false;
};
struct AllToAllOpts {
  bool tiled = false;
};

// Sum / mean / max / min over the group; the result is invariant over `axes`.
Array psum(const Array& x, const AxisNames& axes);
Array pmean(const Array& x, const AxisNames& axes);
Array pmax(const Array& x, const AxisNames& axes);
Array pmin(const Array& x, const AxisNames& axes);
Array all_gather(const Array& x, const AxisNames& axes, AllGatherOpts opts = {});
Array psum_scatter(const Array& x, const AxisNames& axes, PsumScatterOpts opts = {});
// Member dst receives member src's block for each (src, dst); members that are no destination
// receive zeros. Sources and destinations must each be distinct.
Array ppermute(const Array& x, const AxisNames& axes, std::vector<std::pair<int, int>> perm);
Array all_to_all(const Array& x, const AxisNames& axes, int split_axis, int concat_axis, AllToAllOpts opts = {});
Array axis_index(const AxisNames& axes);  // int32 scalar, varying over `axes`
int axis_size(const AxisNames& axes);     // static group size
// Invariant -> varying over `axes`: free at run time (JAX's pcast(x, axes, to='varying')).
Array pvary(const Array& x, const AxisNames& axes);
// Every member receives member `source`'s block (typed varying).
Array pbroadcast(const Array& x, const AxisNames& axes, int source);

#define CJAX_COLLECTIVE_TREE(name)                                                                         \
  template <class T>                                                                                       \
  requires(is_tree_v<T> && !std::is_same_v<std::remove_cvref_t<T>, Array>) T name(const T& tree,           \
                                                                                  const AxisNames& axes) { \
    return tree::map([&](const Array& leaf) { return name(leaf, axes); }, tree);                           \
  }
CJAX_COLLECTIVE_TREE(psum)
CJAX_COLLECTIVE_TREE(pmean)
CJAX_COLLECTIVE_TREE(pmax)
CJAX_COLLECTIVE_TREE(pmin)
CJAX_COLLECTIVE_TREE(pvary)
#undef CJAX_COLLECTIVE_TREE
template <class T>
requires(is_tree_v<T> && !std::is_same_v<std::remove_cvref_t<T>, Array>) auto all_gather(const T& tree,
                                                                                         const AxisNames& axes,
                                                                                         AllGatherOpts opts = {}) {
  return tree::map([&](const Array& leaf) { return all_gather(leaf, axes, opts); }, tree);
}
template <class T>
requires(is_tree_v<T> && !std::is_same_v<std::remove_cvref_t<T>, Array>) auto psum_scatter(const T& tree,
                                                                                           const AxisNames& axes,
                                                                                           PsumScatterOpts opts = {}) {
  return tree::map([&](const Array& leaf) { return psum_scatter(leaf, axes, opts); }, tree);
}
template <class T>
requires(is_tree_v<T> &&
         !std::is_same_v<std::remove_cvref_t<T>, Array>) auto ppermute(const T& tree, const AxisNames& axes,
                                                                       std::vector<std::pair<int, int>> perm) {
  return tree::map([&](const Array& leaf) { return ppermute(leaf, axes, perm); }, tree);
}
template <class T>
requires(is_tree_v<T> && !std::is_same_v<std::remove_cvref_t<T>, Array>) auto all_to_all(
    const T& tree, const AxisNames& axes, int split_axis, int concat_axis, AllToAllOpts opts = {}) {
  return tree::map([&](const Array& leaf) { return all_to_all(leaf, axes, split_axis, concat_axis, opts); }, tree);
}
template <class T>
requires(is_tree_v<T> && !std::is_same_v<std::remove_cvref_t<T>, Array>) auto pbroadcast(const T& tree,
                                                                                         const AxisNames& axes,
                                                                                         int source) {
  return tree::map([&](const Array& leaf) { return pbroadcast(leaf, axes, source); }, tree);
}

}  // namespace lax
}  // namespace cjax
