// shard_map (JAX's jax.shard_map): runs `f` once per device of a mesh on that device's blocks of
// the arguments (manual SPMD), with explicit collectives (cjax/collectives.h) between devices.
// Semantics: docs/shard_map.md.
//
//   Mesh mesh = make_mesh({4, 2}, {"i", "j"});
//   auto matmul = shard_map([](const Array& a, const Array& b) {
//                             return lax::psum(jnp::dot(a, b), "j");     // blocks f32[2,8] x f32[8,32]
//                           }, mesh, {P("i", "j"), P("j", None)}, P("i", None));
//   Array c = matmul(a, b);                                              // == dot(a, b), rows split over i
//
// in_specs / out_specs: a P applies to every leaf below it; a braced list gives one entry per
// argument (or per element of a tuple/vector result) and may nest, as a tree prefix. None marks a
// static argument (not a tree of Arrays: passed to f unchanged).
//
// Each device receives, per argument, the block its mesh coordinates select (dimensions split over
// the axes the spec names; copies along the axes it does not name). f's results are blocks that
// out_specs concatenates into global arrays. With check_vma (the default) every value in the body
// carries the set of mesh axes it may vary over (printed {V:i} in jaxprs); an out_spec that does
// not name an axis the value varies over raises VmaError (§2.4), and gradients need no
// defensive collectives (§3). `axis_names` makes only those mesh axes manual (default: all).
//
// Outside any transformation the body runs eagerly, one primitive at a time on every device:
// printing a value in the body prints each device's block. Under jit, grad, vmap or make_jaxpr,
// the body is staged as one `shard_map` equation whose body runs concurrently on every device's
// worker. Errors (§1.7) are SpecError (specs vs mesh and arguments), VmaError (out_specs
// check), AxisNameError (collective over an axis that is not manual) and CollectiveError.
#pragma once
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cjax/array.h"
#include "cjax/make_jaxpr.h"
#include "cjax/sharding.h"
#include "cjax/tree.h"

namespace cjax {

// A tree prefix of PartitionSpecs (JAX's in_specs / out_specs pytrees).
class SpecTree {
 public:
  SpecTree() : kind_(Kind::List) {}  // {}: no arguments / no results
  SpecTree(PartitionSpec p) : kind_(Kind::Spec), spec_(std::move(p)) {}
  SpecTree(NoneT) : kind_(Kind::None) {}
  SpecTree(std::initializer_list<SpecTree> items) : kind_(Kind::List), list_(items) {}
  SpecTree(std::vector<SpecTree> items) : kind_(Kind::List), list_(std::move(items)) {}
  bool is_list() const { return kind_ == Kind::List; }
  bool is_none() const { return kind_ == Kind::None; }
  const std::vector<SpecTree>& list() const { return list_; }
  // One spec per leaf of `t` (prefix semantics); nullopt for None. `what` ("in_specs[0]") names
  // the entry in errors.
  void flatten(const TreeDef& t, const std::string& what, std::vector<std::optional<PartitionSpec>>& out) const;
  // Every spec in the tree (for validation at construction).
  void all_specs(std::vector<PartitionSpec>& out) const;
  std::string str() const;

 private:
  enum class Kind : uint8_t { Spec, None, List };
  Kind kind_;
  PartitionSpec spec_;
  std::vector<SpecTree> list_;
};

struct ShardMapOptions {
  bool check_vma = true;
  std::vector<std::string> axis_names = {};  // manual axes; empty: every mesh axis
  std::string name = "f";                    // the function's name in error messages and jaxprs
};

namespace shard_map_detail {
using FlatFn = std::function<std::vector<Array>(const std::vector<Array>&)>;
// Checks the specs against the mesh (SpecError for an unknown or repeated axis, D4) once, when
// shard_map is constructed.
void validate_specs(const Mesh& mesh, const SpecTree& in_specs, const SpecTree& out_specs, const ShardMapOptions& opts);
// in_specs: one per flat input. f fills `out_specs` (one per flat output) when it returns.
std::vector<Array> shard_map(const FlatFn& f, const Mesh& mesh, const std::vector<Array>& args,
                             const std::vector<PartitionSpec>& in_specs, const std::vector<std::string>& arg_names,
                             std::vector<PartitionSpec>& out_specs, const ShardMapOptions& opts);
void check_in_specs_arity(const SpecTree& in_specs, size_t num_args, const std::string& fn);
template <class A>
void flatten_arg(const A& a, const SpecTree& spec, size_t index, std::vector<Array>& leaves,
                 std::vector<PartitionSpec>& specs, std::vector<std::string>& names) {
  std::string what = "in_specs[" + std::to_string(index) + "]";
  std::vector<std::optional<PartitionSpec>> flat;
  if constexpr (is_tree_v<A>) {
    spec.flatten(tree::structure(a), what, flat);
    auto lp = tree::leaves_with_path(a);
    for (size_t k = 0; k < lp.size(); ++k) {
      leaves.push_back(lp[k].second);
      specs.push_back(flat[k] ? *flat[k] : PartitionSpec());  // None on an Array leaf: replicated
      std::string p = lp[k].first.str();
      names.push_back("args[" + std::to_string(index) + "]" + p);
    }
  } else {
    spec.flatten(TreeDef::none(), what, flat);  // raises unless the spec is None
  }
}
}  // namespace shard_map_detail

template <class F>
auto shard_map(F f, Mesh mesh, SpecTree in_specs, SpecTree out_specs, ShardMapOptions opts = {}) {
  shard_map_detail::validate_specs(mesh, in_specs, out_specs, opts);
  return [f = std::move(f), mesh = std::move(mesh), in_specs = std::move(in_specs), out_specs = std::move(out_specs),
          opts = std::move(opts)](const auto&... args) {
    shard_map_detail::check_in_specs_arity(in_specs, sizeof...(args), opts.name);
    std::vector<Array> leaves;
    std::vector<PartitionSpec> specs;
    std::vector<std::string> names;
    size_t i = 0;
    ((shard_map_detail::flatten_arg(args, in_specs.is_list() ? in_specs.list()[i] : in_specs, i, leaves, specs, names),
      ++i),
     ...);
    using R = std::remove_cvref_t<decltype(f(args...))>;
    static_assert(is_tree_v<R>, "shard_map: the function must return a tree of Arrays");
    std::optional<R> result;
    std::vector<PartitionSpec> out_flat;
    auto outs = shard_map_detail::shard_map(
        [&](const std::vector<Array>& xs) {
          size_t pos = 0;
          std::tuple<decltype(jaxpr_detail::rebuild(args, xs, pos))...> call{jaxpr_detail::rebuild(args, xs, pos)...};
          result.emplace(std::apply(f, call));
          std::vector<std::optional<PartitionSpec>> flat;
          out_specs.flatten(tree::structure(*result), "out_specs", flat);
          out_flat.clear();
          for (auto& s : flat) out_flat.push_back(s ? *s : PartitionSpec());
          return tree::leaves(*result);
        },
        mesh, leaves, specs, names, out_flat, opts);
    return tree::unflatten(*result, outs);
  };
}

}  // namespace cjax
