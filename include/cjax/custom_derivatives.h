// Custom derivative rules and rematerialization (JAX's jax.custom_jvp, jax.custom_vjp,
// jax.checkpoint / jax.remat).
//
//   // A numerically stable log(1 + e^x) whose derivative is the logistic function.
//   auto log1pexp = custom_jvp(
//       [](const Array& x) { return jnp::log1p(jnp::exp(x)); },
//       [](const std::tuple<Array>& p, const std::tuple<Array>& t) {
//         auto [x] = p; auto [dx] = t;
//         return std::pair{jnp::log1p(jnp::exp(x)), dx * lax::logistic(x)};
//       }, {.name = "log1pexp", .jvp_name = "log1pexp_jvp"});
//
//   // Gradient clipping: identity forward, clipped cotangent backward.
//   auto clip_gradient = custom_vjp(
//       [](const Array& x) { return x; },
//       [](const Array& x) { return std::pair{x, std::tuple<>{}}; },              // fwd: (out, residuals)
//       [](const std::tuple<>&, const Array& g) { return std::tuple{jnp::clip(g, -1.0, 1.0)}; });  // bwd
//
//   auto layer = checkpoint(f, checkpoint_policies::dots_saveable);   // recompute all but matmuls
//
// custom_jvp(f, jvp_rule): calling the result evaluates f. Under jvp, linearize, grad and vjp the
// rule is used: jvp_rule(std::tuple{primals...}, std::tuple{tangents...}) returns
// std::pair{primal_out, tangent_out} with f's output structure; tangents of inputs that carry no
// perturbation are passed as zeros (JAX's symbolic_zeros=False). Staged, it is one
// `custom_jvp_call[name=f call_jaxpr={...} jvp=f_jvp symbolic_zeros=False]` equation; vmap
// batches both f and the rule.
//
// custom_vjp(f, fwd, bwd): fwd(args...) returns std::pair{out, residuals} (residuals: any tree);
// bwd(residuals, out_cotangent) returns a std::tuple with one cotangent per argument, each of the
// argument's structure (a mismatch raises ValueError naming bwd and both structures). Under
// linearize/grad/vjp, fwd runs in the forward pass and bwd in the backward pass (the tangent
// map is a `custom_lin` equation whose transpose calls bwd). Forward mode (jvp, jacfwd) raises
// ValueError "can't apply forward-mode autodiff (jvp) to a custom_vjp function", as JAX does.
// Staged: `custom_vjp_call[name=f bwd=f_bwd call_jaxpr={...} fwd=f_fwd symbolic_zeros=False]`.
//
// Differentiating a custom_jvp/custom_vjp function with respect to a value it closes over (rather
// than takes as an argument) raises ValueError: the rules only cover the explicit arguments.
// Arguments of both are trees of Arrays (cjax/tree.h). Names are for printing only; C++
// lambdas have no names, so they default to "<lambda>" as JAX prints Python lambdas.
//
// checkpoint(f, policy) / remat: the same function; under reverse-mode differentiation the
// forward pass saves only what `policy` allows (plus the inputs) and the backward pass recomputes
// the rest. Staged as JAX's current primitive, printed
// `remat2[differentiated=False jaxpr={...} policy=None prevent_cse=True]`.
// Non-tree arguments of a checkpointed function are static (passed through unchanged).
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cjax/array.h"
#include "cjax/make_jaxpr.h"
#include "cjax/tree.h"

namespace cjax {

struct CustomJvpOptions {
  std::string name = "<lambda>";      // printed as custom_jvp_call[name=...]
  std::string jvp_name = "<lambda>";  // printed as jvp=...
};
struct CustomVjpOptions {
  std::string name = "<lambda>";
  std::string fwd_name = "<lambda>";
  std::string bwd_name = "<lambda>";
};

// What a checkpointed function may save for the backward pass (JAX's jax.checkpoint_policies).
// A policy is asked about each primitive application whose inputs are all known in the forward
// pass; values it does not save are recomputed in the backward pass. Inputs are always saved.
struct CheckpointPolicy {
  enum class Kind {
    NothingSaveable,              // save only the inputs (the default; printed policy=None)
    EverythingSaveable,           // as if checkpoint were not used
    DotsSaveable,                 // outputs of dot_general and conv_general_dilated
    DotsWithNoBatchDimsSaveable,  // outputs of dot_general without batch dimensions
    SaveEverythingExcept,         // everything but the outputs of the named primitives
    SaveOnlyThese,                // only the outputs of the named primitives
  };
  Kind kind = Kind::NothingSaveable;
  std::vector<std::string> primitives;  // for SaveEverythingExcept / SaveOnlyThese
  std::string str() const;              // as printed in the jaxpr's policy= param
  // Whether the output of an application of `primitive` is saved; `has_batch_dims` describes a
  // dot_general (ignored otherwise).
  bool saveable(const std::string& primitive, bool has_batch_dims) const;
  bool operator==(const CheckpointPolicy&) const = default;
};

namespace checkpoint_policies {
inline const CheckpointPolicy nothing_saveable{CheckpointPolicy::Kind::NothingSaveable, {}};
inline const CheckpointPolicy everything_saveable{CheckpointPolicy::Kind::EverythingSaveable, {}};
inline const CheckpointPolicy dots_saveable{CheckpointPolicy::Kind::DotsSaveable, {}};
inline const CheckpointPolicy checkpoint_dots = dots_saveable;
inline const CheckpointPolicy dots_with_no_batch_dims_saveable{CheckpointPolicy::Kind::DotsWithNoBatchDimsSaveable, {}};
inline const CheckpointPolicy checkpoint_dots_with_no_batch_dims = dots_with_no_batch_dims_saveable;
// Saves everything except the outputs of the named primitives, e.g. {"all_gather"}.
inline CheckpointPolicy save_everything_except(std::vector<std::string> primitives) {
  return {CheckpointPolicy::Kind::SaveEverythingExcept, std::move(primitives)};
}
inline CheckpointPolicy save_only_these(std::vector<std::string> primitives) {
  return {CheckpointPolicy::Kind::SaveOnlyThese, std::move(primitives)};
}
}  // namespace checkpoint_policies

namespace custom_detail {
using FlatFn = std::function<std::vector<Array>(const std::vector<Array>&)>;
// (primals, tangents) -> (primal outputs, tangent outputs)
using JvpFn = std::function<std::pair<std::vector<Array>, std::vector<Array>>(const std::vector<Array>&,
                                                                              const std::vector<Array>&)>;
// (residuals, output cotangents) -> one cotangent per argument leaf
using BwdFn = std::function<std::vector<Array>(const std::vector<Array>& res, const std::vector<Array>& cts)>;
struct FwdOut {
  std::vector<Array> outs, residuals;
  BwdFn bwd;  // bwd specialized to this call's residual structure
};
using FwdFn = std::function<FwdOut(const std::vector<Array>&)>;

// Flat entry points (autodiff/custom_derivatives.cpp, autodiff/checkpoint.cpp). `f` is only
// traced (or, eagerly, not used: the templates call the user's function directly).
bool is_eager();
std::vector<Array> custom_jvp_call(const FlatFn& f, JvpFn jvp, const std::vector<Array>& args,
                                   const CustomJvpOptions& opts);
std::vector<Array> custom_vjp_call(const FlatFn& f, FwdFn fwd, const std::vector<Array>& args,
                                   const CustomVjpOptions& opts);
std::vector<Array> checkpoint_call(const FlatFn& f, const std::vector<Array>& args, const CheckpointPolicy& policy,
                                   bool prevent_cse);
[[noreturn]] void raise_bwd_structure(const std::string& bwd_name, const std::string& f_name, const TreeDef& expected,
                                      const TreeDef& got);
[[noreturn]] void raise_rule_structure(const std::string& what, const std::string& rule_name, const std::string& f_name,
                                       const TreeDef& expected, const TreeDef& got);

template <class T>
T skeleton(const T& t) {  // t's structure, leaves empty (keeps no values alive)
  return tree::unflatten(t, std::vector<Array>(tree::structure(t).num_leaves()));
}
// f on flat leaves rebuilt as `skel`'s trees; records f's output structure in `out_skel`.
template <class F, class Args, class R>
FlatFn primal_fn(const F& f, const std::shared_ptr<const Args>& skel,
                 const std::shared_ptr<std::optional<R>>& out_skel) {
  return [&f, skel, out_skel](const std::vector<Array>& xs) {
    R r = std::apply(f, tree::unflatten(*skel, xs));
    if (!*out_skel) *out_skel = skeleton(r);
    return tree::leaves(r);
  };
}
template <class... A>
void check_tree_args() {
  static_assert((is_tree_v<A> && ...),
                "custom_jvp/custom_vjp: every argument must be a tree of Arrays (see cjax/tree.h); close over "
                "static values instead");
}
}  // namespace custom_detail

template <class F, class J>
auto custom_jvp(F f, J jvp_rule, CustomJvpOptions opts = {}) {
  return [f = std::move(f), jvp_rule = std::move(jvp_rule), opts = std::move(opts)](const auto&... args) {
    custom_detail::check_tree_args<std::remove_cvref_t<decltype(args)>...>();
    using R = std::remove_cvref_t<decltype(f(args...))>;
    static_assert(is_tree_v<R>, "custom_jvp: the function must return a tree of Arrays");
    if (custom_detail::is_eager()) return R(f(args...));  // JAX evaluates f itself
    using Args = std::tuple<std::remove_cvref_t<decltype(args)>...>;
    Args like{args...};
    auto skel = std::make_shared<const Args>(custom_detail::skeleton(like));
    auto out_skel = std::make_shared<std::optional<R>>();
    custom_detail::JvpFn flat_jvp = [jvp_rule, skel, out_skel, opts](const std::vector<Array>& ps,
                                                                     const std::vector<Array>& ts) {
      auto [out, tangent] = jvp_rule(tree::unflatten(*skel, ps), tree::unflatten(*skel, ts));
      TreeDef want = tree::structure(**out_skel);
      if (!(tree::structure(out) == want))
        custom_detail::raise_rule_structure("primal output", opts.jvp_name, opts.name, want, tree::structure(out));
      if (!(tree::structure(tangent) == want))
        custom_detail::raise_rule_structure("tangent output", opts.jvp_name, opts.name, want, tree::structure(tangent));
      return std::pair{tree::leaves(out), tree::leaves(tangent)};
    };
    std::vector<Array> outs = custom_detail::custom_jvp_call(custom_detail::primal_fn(f, skel, out_skel),
                                                             std::move(flat_jvp), tree::leaves(like), opts);
    return tree::unflatten(**out_skel, outs);
  };
}

template <class F, class Fwd, class Bwd>
auto custom_vjp(F f, Fwd fwd, Bwd bwd, CustomVjpOptions opts = {}) {
  return [f = std::move(f), fwd = std::move(fwd), bwd = std::move(bwd), opts = std::move(opts)](const auto&... args) {
    custom_detail::check_tree_args<std::remove_cvref_t<decltype(args)>...>();
    using R = std::remove_cvref_t<decltype(f(args...))>;
    static_assert(is_tree_v<R>, "custom_vjp: the function must return a tree of Arrays");
    if (custom_detail::is_eager()) return R(f(args...));
    using Args = std::tuple<std::remove_cvref_t<decltype(args)>...>;
    Args like{args...};
    auto skel = std::make_shared<const Args>(custom_detail::skeleton(like));
    auto out_skel = std::make_shared<std::optional<R>>();
    custom_detail::FwdFn flat_fwd = [fwd, bwd, skel, out_skel, opts](const std::vector<Array>& ps) {
      auto [out, res] = std::apply(fwd, tree::unflatten(*skel, ps));
      using Res = std::remove_cvref_t<decltype(res)>;
      static_assert(is_tree_v<Res>, "custom_vjp: fwd must return std::pair{output, residuals (a tree)}");
      TreeDef want = tree::structure(**out_skel);
      if (!(tree::structure(out) == want))
        custom_detail::raise_rule_structure("primal output", opts.fwd_name, opts.name, want, tree::structure(out));
      custom_detail::FwdOut o{tree::leaves(out), tree::leaves(res), {}};
      auto res_skel = std::make_shared<const Res>(custom_detail::skeleton(res));
      o.bwd = [bwd, skel, out_skel, res_skel, opts](const std::vector<Array>& r, const std::vector<Array>& cts) {
        auto in_cts = bwd(tree::unflatten(*res_skel, r), tree::unflatten(**out_skel, cts));
        static_assert(is_tree_v<decltype(in_cts)>,
                      "custom_vjp: bwd must return a std::tuple with one cotangent per argument");
        TreeDef want_in = tree::structure(*skel), got = tree::structure(in_cts);
        if (!(got == want_in)) custom_detail::raise_bwd_structure(opts.bwd_name, opts.name, want_in, got);
        return tree::leaves(in_cts);
      };
      return o;
    };
    std::vector<Array> outs = custom_detail::custom_vjp_call(custom_detail::primal_fn(f, skel, out_skel),
                                                             std::move(flat_fwd), tree::leaves(like), opts);
    return tree::unflatten(**out_skel, outs);
  };
}

template <class F>
auto checkpoint(F f, CheckpointPolicy policy = checkpoint_policies::nothing_saveable, bool prevent_cse = true) {
  return [f = std::move(f), policy = std::move(policy), prevent_cse](const auto&... args) {
    using R = std::remove_cvref_t<decltype(f(args...))>;
    static_assert(is_tree_v<R>, "checkpoint: the function must return a tree of Arrays");
    if (custom_detail::is_eager()) return R(f(args...));
    std::vector<Array> leaves;
    auto add = [&](const auto& a) {
      if constexpr (is_tree_v<std::remove_cvref_t<decltype(a)>>)
        for (const Array& l : tree::leaves(a)) leaves.push_back(l);
    };
    (add(args), ...);
    std::optional<R> result;
    std::vector<Array> outs = custom_detail::checkpoint_call(
        [&](const std::vector<Array>& xs) {
          size_t pos = 0;
          // Braced initialization evaluates left to right, so the leaves are handed out in order.
          std::tuple<decltype(jaxpr_detail::rebuild(args, xs, pos))...> call{jaxpr_detail::rebuild(args, xs, pos)...};
          result.emplace(std::apply(f, call));
          return tree::leaves(*result);
        },
        leaves, policy, prevent_cse);
    return tree::unflatten(*result, outs);
  };
}
// JAX's jax.remat: an alias of checkpoint.
template <class F>
auto remat(F f, CheckpointPolicy policy = checkpoint_policies::nothing_saveable, bool prevent_cse = true) {
  return checkpoint(std::move(f), std::move(policy), prevent_cse);
}

}  // namespace cjax
