// vmap (JAX's jax.vmap): vectorizes a function over a batch axis of its inputs.
//
//   auto f = [](const Array& x, const Array& w) { return jnp::dot(w, x); };
//   auto batched = vmap(f, {0, None});        // map x over axis 0, broadcast w
//   Array ys = batched(xs, w);                // ys[i] == f(xs[i], w)
//
// in_axes: one AxisSpec for every argument (an int or None applies to all its leaves), or a
// braced list with one entry per argument; an entry may itself be a braced list or a map of
// entries that is a tree prefix of that argument (JAX's semantics). Negative axes count from
// the end. Non-tree (static) arguments need None. out_axes: an AxisSpec that is a tree prefix
// of the result; None for an output that does not depend on the mapped inputs. Each batched
// primitive runs once on the whole batch (no loop).
//
// `axis_name` names the batch axis for collectives inside f (JAX's vmap(f, axis_name='b')): the
// examples are the group's members, so x / lax::psum(x, "b") normalizes over the batch and
// lax::axis_index("b") is each example's index (cjax/collectives.h lists them all). A name
// resolves to the innermost enclosing vmap or shard_map that binds it.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "cjax/array.h"
#include "cjax/make_jaxpr.h"
#include "cjax/tree.h"

namespace cjax {

class AxisSpec {
 public:
  AxisSpec(int axis) : kind_(Kind::Axis), axis_(axis) {}
  AxisSpec(NoneT) : kind_(Kind::None) {}
  AxisSpec(std::initializer_list<AxisSpec> items) : kind_(Kind::List), list_(items) {}
  AxisSpec(std::vector<AxisSpec> items) : kind_(Kind::List), list_(std::move(items)) {}
  AxisSpec(std::map<std::string, AxisSpec> items) : kind_(Kind::Dict), dict_(std::move(items)) {}
  bool is_list() const { return kind_ == Kind::List; }
  const std::vector<AxisSpec>& list() const { return list_; }
  // One axis per leaf of `t` (prefix semantics); -1 for None; negative axes stay negative.
  // `what` names the argument in errors.
  void flatten(const TreeDef& t, const std::string& what, std::vector<std::optional<int>>& out) const;
  std::string str() const;

 private:
  // Plain members rather than a std::variant: GCC 12 reports false maybe-uninitialized
  // warnings for a recursive variant copied at -O2, which would break users' -Werror builds.
  enum class Kind : uint8_t { Axis, None, List, Dict };
  Kind kind_;
  int axis_ = 0;
  std::vector<AxisSpec> list_;
  std::map<std::string, AxisSpec> dict_;
};

struct VmapOptions {
  std::string axis_name = "";                       // binds the vmapped axis for collectives (see above)
  std::optional<int64_t> axis_size = std::nullopt;  // required when no input is mapped
  // Inside a shard_map being vmapped, split the batch dimension over this mesh axis (JAX's
  // spmd_axis_name): the specs gain it as their leading entry, P('x') -> P('y', 'x').
  std::string spmd_axis_name = "";
};

namespace vmap_detail {
using FlatFn = std::function<std::vector<Array>(const std::vector<Array>&)>;
// in_axes: per flat input (nullopt: not mapped, negative: from the end); out_axes_for: per
// flat output and its unbatched rank.
std::vector<Array> vmap(const FlatFn& f, const std::vector<Array>& args, const std::vector<std::optional<int>>& in_axes,
                        const std::vector<std::optional<int>>& out_axes, const VmapOptions& opts);
template <class A>
void flatten_arg(const A& a, const AxisSpec& spec, size_t index, std::vector<Array>& leaves,
                 std::vector<std::optional<int>>& axes) {
  std::string what = "argument " + std::to_string(index);
  if constexpr (is_tree_v<A>) {
    for (const Array& l : tree::leaves(a)) leaves.push_back(l);
    spec.flatten(tree::structure(a), what, axes);
  } else {
    std::vector<std::optional<int>> none;
    spec.flatten(TreeDef::none(), what, none);  // raises unless the spec is None
  }
}
// Arguments rebuilt from flat tracers: one rebuild for make_jaxpr, jit and vmap.
using jaxpr_detail::rebuild;
void check_in_axes_arity(const AxisSpec& in_axes, size_t num_args);
}  // namespace vmap_detail

template <class F>
auto vmap(F f, AxisSpec in_axes = 0, AxisSpec out_axes = 0, VmapOptions opts = {}) {
  return [f = std::move(f), in_axes = std::move(in_axes), out_axes = std::move(out_axes),
          opts = std::move(opts)](const auto&... args) {
    vmap_detail::check_in_axes_arity(in_axes, sizeof...(args));
    std::vector<Array> leaves;
    std::vector<std::optional<int>> axes;
    size_t i = 0;
    ((vmap_detail::flatten_arg(args, in_axes.is_list() ? in_axes.list()[i] : in_axes, i, leaves, axes), ++i), ...);
    using R = std::remove_cvref_t<decltype(f(args...))>;
    static_assert(is_tree_v<R>, "vmap: the function must return a tree of Arrays");
    std::optional<R> result;
    std::vector<std::optional<int>> out_flat;
    auto outs = vmap_detail::vmap(
        [&](const std::vector<Array>& xs) {
          size_t pos = 0;
          std::tuple<decltype(vmap_detail::rebuild(args, xs, pos))...> call{vmap_detail::rebuild(args, xs, pos)...};
          result.emplace(std::apply(f, call));
          out_axes.flatten(tree::structure(*result), "the output", out_flat);
          return tree::leaves(*result);
        },
        leaves, axes, out_flat, opts);
    return tree::unflatten(*result, outs);
  };
}

}  // namespace cjax
