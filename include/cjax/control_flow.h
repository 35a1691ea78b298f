// Structured control flow (JAX's jax.lax.cond, switch, while_loop, fori_loop, scan).
//
//   Array y = lax::cond(x > 0, [](const Array& v) { return v * 2; }, [](const Array& v) { return -v; }, x);
//   auto [h, hs] = lax::scan([&](const Array& h, const Array& x) { return std::pair{jnp::tanh(h * w + x), h}; },
//                            h0, xs);
//   Array s = lax::fori_loop(0, 10, [](const Array& i, const Array& acc) { return acc + i; }, Array(0));
//
// Each construct traces its functions once into jaxprs and binds ONE primitive (`cond`, `while`,
// `scan`) holding them as params, so make_jaxpr/jit stage a single equation (never an unrolled
// loop) and every transformation goes through the primitive's rules: jvp and grad (cond, scan and
// fori_loop with int bounds; while_loop is forward-mode only, as in JAX), vmap (a batched
// predicate turns cond into a select over both branches and makes while run until every element
// is done). Eagerly the primitive runs its jaxprs: cond runs only the chosen branch.
//
// Operands, carries and xs are trees of Arrays (cjax/tree.h); functions return trees. Values the
// functions close over (captured Arrays, tracers of enclosing transformations) become leading
// operands of the equation.
//
//  * cond(pred, true_fn, false_fn, operands...): `pred` is a scalar bool (or number: != 0).
//    Both branches must return the same tree structure with the same shapes and dtypes.
//  * switch_(index, branches, operands...): branches[clamp(index, 0, n-1)](operands...). Named
//    with an underscore because `switch` is a C++ keyword. `branches` is a std::vector of one
//    callable type (e.g. std::function<Array(const Array&)>).
//  * while_loop(cond_fn, body_fn, init): `while cond_fn(c): c = body_fn(c)`; body_fn keeps the
//    carry's structure and types.
//  * fori_loop(lo, hi, body_fn(i, carry), init): with int bounds (or concrete Arrays, as in JAX)
//    it is a scan of length max(hi - lo, 0) over the carry (i, init) (reverse-differentiable);
//    with traced Array bounds it is a while_loop over (i, hi, carry).
//  * scan(f, init, xs, ScanOptions{.length, .reverse, .unroll}) -> std::pair{carry, ys}: f(carry,
//    x) returns std::pair{carry, y} (or a std::tuple); x is the leading-axis slice of every leaf
//    of xs; ys stacks the y's. Pass `None` as xs to scan with no inputs (then .length is needed
//    and f takes (carry, NoneT) or just (carry)); a NoneT y gives NoneT ys.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cjax/array.h"
#include "cjax/make_jaxpr.h"
#include "cjax/tree.h"

namespace cjax::lax {

struct ScanOptions {
  std::optional<int64_t> length = std::nullopt;  // required when xs has no leaves; else must match their leading axis
  bool reverse = false;                          // iterate from the last slice to the first (ys keep their positions)
  int64_t unroll = 1;                            // iterations per loop step in compiled code (a param; >= 1)
};

namespace control_flow_detail {

using FlatFn = std::function<std::vector<Array>(const std::vector<Array>&)>;

// Flat entry points (trace/control_flow.cpp). Each function records the tree structure of its
// output in `trees` when traced, so structure mismatches are reported with both structures.
std::vector<Array> cond_flat(const Array& pred, const std::vector<FlatFn>& branches,
                             const std::vector<std::string>& names, const std::vector<Array>& operands,
                             const std::vector<TreeDef>& trees, bool is_switch);
std::vector<Array> while_flat(const FlatFn& cond_fn, const FlatFn& body_fn, const std::vector<Array>& init);
// `body` maps (i, carry...) to carry...; lo/hi are static ints (scan) unless `dynamic`.
std::vector<Array> fori_flat(const Array& lo, const Array& hi, bool static_bounds, const FlatFn& body,
                             const std::vector<Array>& init);
bool is_concrete_scalar(const Array& x);
// `body` maps (carry..., x...) to (carry..., y...).
std::vector<Array> scan_flat(const FlatFn& body, const std::vector<Array>& init, const std::vector<Array>& xs,
                             const ScanOptions& opts);
// ValueError naming the API, both structures and where they differ.
void check_same_structure(const char* what, const TreeDef& a, const TreeDef& b, const char* a_name, const char* b_name);

template <class... Ops>
std::vector<Array> leaves_of(const Ops&... ops) {
  std::vector<Array> out;
  auto add = [&](const auto& op) {
    if constexpr (is_tree_v<std::remove_cvref_t<decltype(op)>>)
      for (const Array& l : tree::leaves(op)) out.push_back(l);
  };
  (add(ops), ...);
  return out;
}

// Calls fn(operands rebuilt from `xs`) (static, non-tree operands are passed as given).
template <class Fn, class... Ops>
decltype(auto) call_rebuilt(Fn& fn, const std::vector<Array>& xs, const Ops&... ops) {
  size_t pos = 0;
  std::tuple<decltype(jaxpr_detail::rebuild(ops, xs, pos))...> args{jaxpr_detail::rebuild(ops, xs, pos)...};
  return std::apply(fn, args);
}

template <class R>
constexpr void check_tree_result(const char* what) {
  static_assert(is_tree_v<R>, "lax control flow: functions must return a tree of Arrays (see cjax/tree.h)");
  (void)what;
}

template <class T>
struct IsPairLike : std::false_type {};
template <class A, class B>
struct IsPairLike<std::pair<A, B>> : std::true_type {};
template <class A, class B>
struct IsPairLike<std::tuple<A, B>> : std::true_type {};

template <class BodyFn, class T>
T fori_loop_impl(const Array& lo, const Array& hi, bool static_bounds, BodyFn& body_fn, const T& init) {
  static_assert(is_tree_v<T>, "fori_loop: init must be a tree of Arrays (see cjax/tree.h)");
  TreeDef in_tree = tree::structure(init);
  FlatFn b = [&](const std::vector<Array>& xs) {
    std::vector<Array> carry(xs.begin() + 1, xs.end());
    auto r = body_fn(xs[0], tree::unflatten(init, carry));
    check_same_structure("fori_loop body_fn", in_tree, tree::structure(r), "the input carry", "the output carry");
    return tree::leaves(r);
  };
  return tree::unflatten(init, fori_flat(lo, hi, static_bounds, b, tree::leaves(init)));
}

}  // namespace control_flow_detail

// ---- cond / switch_ ----

template <class Fn, class... Ops>
auto switch_(const Array& index, const std::vector<Fn>& branches, const Ops&... operands) {
  namespace d = control_flow_detail;
  using R = std::remove_cvref_t<std::invoke_result_t<const Fn&, const Ops&...>>;
  d::check_tree_result<R>("switch_");
  std::vector<Array> ops = d::leaves_of(operands...);
  std::optional<R> like;
  std::vector<TreeDef> trees(branches.size());
  std::vector<d::FlatFn> fns;
  std::vector<std::string> names;
  for (size_t k = 0; k < branches.size(); ++k) {
    names.push_back("branch " + std::to_string(k));
    fns.push_back([&, k](const std::vector<Array>& xs) {
      R r = d::call_rebuilt(branches[k], xs, operands...);
      trees[k] = tree::structure(r);
      if (!like) like.emplace(r);
      return tree::leaves(r);
    });
  }
  std::vector<Array> outs = d::cond_flat(index, fns, names, ops, trees, /*is_switch=*/true);
  return tree::unflatten(*like, outs);
}

template <class TrueFn, class FalseFn, class... Ops>
auto cond(const Array& pred, TrueFn&& true_fn, FalseFn&& false_fn, const Ops&... operands) {
  namespace d = control_flow_detail;
  using R = std::remove_cvref_t<std::invoke_result_t<TrueFn&, const Ops&...>>;
  using RF = std::remove_cvref_t<std::invoke_result_t<FalseFn&, const Ops&...>>;
  d::check_tree_result<R>("cond");
  d::check_tree_result<RF>("cond");
  std::vector<Array> ops = d::leaves_of(operands...);
  std::optional<R> like;
  std::vector<TreeDef> trees(2);
  // JAX's order: branches=(false_fn, true_fn), indexed by the predicate as an int32.
  std::vector<d::FlatFn> fns{[&](const std::vector<Array>& xs) {
                               RF r = d::call_rebuilt(false_fn, xs, operands...);
                               trees[0] = tree::structure(r);
                               return tree::leaves(r);
                             },
                             [&](const std::vector<Array>& xs) {
                               R r = d::call_rebuilt(true_fn, xs, operands...);
                               trees[1] = tree::structure(r);
                               like.emplace(r);
                               return tree::leaves(r);
                             }};
  std::vector<Array> outs = d::cond_flat(pred, fns, {"false_fn", "true_fn"}, ops, trees, /*is_switch=*/false);
  return tree::unflatten(*like, outs);
}

// ---- while_loop / fori_loop ----

template <class CondFn, class BodyFn, class T>
T while_loop(CondFn&& cond_fn, BodyFn&& body_fn, const T& init) {
  namespace d = control_flow_detail;
  static_assert(is_tree_v<T>, "while_loop: init must be a tree of Arrays (see cjax/tree.h)");
  TreeDef in_tree = tree::structure(init);
  d::FlatFn c = [&](const std::vector<Array>& xs) {
    return std::vector<Array>{Array(cond_fn(tree::unflatten(init, xs)))};
  };
  d::FlatFn b = [&](const std::vector<Array>& xs) {
    auto r = body_fn(tree::unflatten(init, xs));
    d::check_same_structure("while_loop body_fn", in_tree, tree::structure(r), "the input carry", "the output carry");
    return tree::leaves(r);
  };
  return tree::unflatten(init, d::while_flat(c, b, tree::leaves(init)));
}

// Static bounds: a scan of length max(hi - lo, 0) (reverse-differentiable), i is a weak i32 (i64
// if the bounds need it).
template <class BodyFn, class T>
T fori_loop(int64_t lo, int64_t hi, BodyFn&& body_fn, const T& init) {
  bool fits = lo >= INT32_MIN && lo <= INT32_MAX && hi >= INT32_MIN && hi <= INT32_MAX;
  Array l = fits ? Array(int(lo)) : Array(lo), h = fits ? Array(int(hi)) : Array(hi);
  return control_flow_detail::fori_loop_impl(l, h, true, body_fn, init);
}
// Array bounds: concrete ones are treated as static (as JAX does); traced ones give a while_loop.
template <class BodyFn, class T>
T fori_loop(const Array& lo, const Array& hi, BodyFn&& body_fn, const T& init) {
  namespace d = control_flow_detail;
  bool static_bounds = d::is_concrete_scalar(lo) && d::is_concrete_scalar(hi);
  return d::fori_loop_impl(lo, hi, static_bounds, body_fn, init);
}

// ---- scan ----

template <class F, class C, class X>
auto scan(F&& f, const C& init, const X& xs, ScanOptions opts = {}) {
  namespace d = control_flow_detail;
  static_assert(is_tree_v<C>, "scan: init must be a tree of Arrays (see cjax/tree.h)");
  constexpr bool no_xs = std::is_same_v<std::remove_cvref_t<X>, NoneT>;
  static_assert(no_xs || is_tree_v<X>, "scan: xs must be a tree of Arrays or None");
  auto call = [&](const C& c, const std::vector<Array>& x_leaves) {
    if constexpr (no_xs) {
      (void)x_leaves;
      if constexpr (std::is_invocable_v<F&, const C&, NoneT>)
        return f(c, None);
      else
        return f(c);
    } else {
      return f(c, tree::unflatten(xs, x_leaves));
    }
  };
  using R = std::remove_cvref_t<decltype(call(init, {}))>;
  static_assert(d::IsPairLike<R>::value, "scan: f must return std::pair{carry, y} (or a 2-tuple)");
  using Y = std::remove_cvref_t<std::tuple_element_t<1, R>>;
  constexpr bool no_ys = std::is_same_v<Y, NoneT>;
  static_assert(no_ys || is_tree_v<Y>, "scan: f's y must be a tree of Arrays or None");
  TreeDef in_tree = tree::structure(init);
  size_t num_carry = in_tree.num_leaves();
  std::vector<Array> xs_leaves;
  if constexpr (!no_xs) xs_leaves = tree::leaves(xs);
  std::optional<Y> like_y;
  d::FlatFn body = [&](const std::vector<Array>& in) {
    auto mid = in.begin() + std::ptrdiff_t(num_carry);
    std::vector<Array> c(in.begin(), mid), x(mid, in.end());
    R r = call(tree::unflatten(init, c), x);
    const auto& new_c = std::get<0>(r);
    d::check_same_structure("scan f", in_tree, tree::structure(new_c), "the input carry", "the output carry");
    std::vector<Array> out = tree::leaves(new_c);
    if constexpr (!no_ys) {
      like_y.emplace(std::get<1>(r));
      for (const Array& y : tree::leaves(std::get<1>(r))) out.push_back(y);
    }
    return out;
  };
  std::vector<Array> outs = d::scan_flat(body, tree::leaves(init), xs_leaves, opts);
  std::vector<Array> carry(outs.begin(), outs.begin() + std::ptrdiff_t(num_carry));
  if constexpr (no_ys) {
    return std::pair<C, NoneT>{tree::unflatten(init, carry), None};
  } else {
    std::vector<Array> ys(outs.begin() + std::ptrdiff_t(num_carry), outs.end());
    return std::pair<C, Y>{tree::unflatten(init, carry), tree::unflatten(*like_y, ys)};
  }
}

}  // namespace cjax::lax
