// Automatic differentiation (JAX's jax.grad, value_and_grad, vjp, jvp, linearize,
// linear_transpose, jacfwd, jacrev, hessian).
//
//   auto loss = [](const Params& p, const Array& x) { return jnp::sum(jnp::tanh(x * p.w)); };
//   auto g = grad(loss)(params, x);                      // gradient w.r.t. argument 0: a Params
//   auto [l, gs] = value_and_grad(loss, argnums<0, 1>)(params, x);   // gs: std::tuple<Params, Array>
//   auto [out, f_vjp] = vjp(f, x, y);  auto [gx, gy] = f_vjp(ct);
//   auto [out, tangent] = jvp(f, std::tuple{x}, std::tuple{dx});
//   auto [out, f_jvp] = linearize(f, x, y);  Array t = f_jvp(dx, dy);   // = jvp's tangent
//   auto f_t = linear_transpose([&](const Array& v) { return jnp::matmul(A, v); }, v);
//   auto [ct_v] = f_t(ct);                               // = A^T ct
//
// Differentiated arguments are trees of Arrays (cjax/tree.h) with floating leaves; other
// arguments are passed through unchanged. Gradients have the argument's tree type. `grad`
// needs a scalar floating output; with `has_aux` the function returns std::pair{loss, aux} and
// aux (any tree) is returned alongside, undifferentiated. Everything composes: grad of grad,
// grad under make_jaxpr/jit/vmap and those under grad.
//
// Integer and bool leaves have no tangent space: jvp treats their tangents as zero, vjp returns
// zeros of their dtype (JAX returns float0 zeros; cjax has no float0 dtype), and grad with
// respect to them raises DTypeError as JAX does (JAX's allow_int has no counterpart yet).
#pragma once
#include <array>
#include <functional>
#include <optional>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "cjax/array.h"
#include "cjax/tree.h"

namespace cjax {

template <size_t... I>
struct Argnums {};
template <size_t... I>
inline constexpr Argnums<I...> argnums{};
struct HasAux {};
inline constexpr HasAux has_aux{};

namespace ad_detail {
using FlatFn = std::function<std::vector<Array>(const std::vector<Array>&)>;
// Flat entry points (autodiff/api.cpp); tangents/cotangents may be undefined handles (zero).
std::pair<std::vector<Array>, std::vector<Array>> jvp(const FlatFn& f, const std::vector<Array>& primals,
                                                      const std::vector<Array>& tangents);
struct Vjp {
  std::vector<Array> outs;
  std::function<std::vector<Array>(const std::vector<Array>& cts)> backward;
};
Vjp vjp(const FlatFn& f, const std::vector<Array>& primals);
// DTypeError/ShapeError with JAX's messages for grad's requirements.
void check_grad_output(const Array& out, const char* api);
void check_grad_input(const Array& leaf, size_t argnum, const char* api);
Array ones_like(const Array& x);
// linearize: the primal outputs and the linear map from input tangents (one per primal, zero
// handles not allowed) to output tangents, evaluated from the linear jaxpr and its residuals.
struct Linearized {
  std::vector<Array> outs;
  std::function<std::vector<Array>(const std::vector<Array>& tangents)> jvp;
};
Linearized linearize(const FlatFn& f, const std::vector<Array>& primals);
// linear_transpose: traces `f` on inputs of types `in_avals` and returns the map from output
// cotangents to input cotangents (zeros for inputs nothing flows to).
std::function<std::vector<Array>(const std::vector<Array>& cts)> linear_transpose(
    const FlatFn& f, const std::vector<AbstractValue>& in_avals);
// Jacobians of a flat Array -> Array function (shape: out.shape + in.shape).
Array jacfwd(const std::function<Array(const Array&)>& f, const Array& x);
Array jacrev(const std::function<Array(const Array&)>& f, const Array& x);

template <class A>
void append_leaves(const A& a, std::vector<Array>& out) {
  static_assert(is_tree_v<A>, "the differentiated argument must be a tree of Arrays (see cjax/tree.h)");
  for (const Array& l : tree::leaves(a)) out.push_back(l);
}
template <size_t K, size_t... I>
constexpr int position_of() {
  int p = 0;
  for (size_t x : std::initializer_list<size_t>{I...}) {
    if (x == K) return p;
    ++p;
  }
  return -1;
}
// Argument K of the call: rebuilt from `leaves` if K is differentiated, else passed through.
template <size_t K, size_t... I, class A>
decltype(auto) pick(const A& a, const std::vector<Array>& leaves, const std::vector<size_t>& offsets) {
  constexpr int p = position_of<K, I...>();
  if constexpr (p >= 0) {
    size_t n = tree::structure(a).num_leaves();
    std::vector<Array> mine(leaves.begin() + std::ptrdiff_t(offsets[p]),
                            leaves.begin() + std::ptrdiff_t(offsets[p] + n));
    return tree::unflatten(a, mine);
  } else {
    return static_cast<const A&>(a);
  }
}
template <size_t... I, class Tup, size_t... K>
auto substitute(const Tup& t, const std::vector<Array>& leaves, const std::vector<size_t>& offsets,
                std::index_sequence<K...>) {
  return std::tuple<decltype(pick<K, I...>(std::get<K>(t), leaves, offsets))...>{
      pick<K, I...>(std::get<K>(t), leaves, offsets)...};
}

// Runs the vjp of f w.r.t. arguments I... of `args`; returns (f's result, backward from a flat
// output cotangent list to a flat input cotangent list, leaf offsets per argnum).
template <size_t... I, class F, class... A>
auto vjp_of(const F& f, const std::tuple<const A&...>& args) {
  static_assert(sizeof...(I) > 0, "argnums must name at least one argument");
  static_assert(((I < sizeof...(A)) && ...), "argnums names an argument the function is not called with");
  std::vector<Array> primals;
  std::vector<size_t> offsets;
  ((offsets.push_back(primals.size()), append_leaves(std::get<I>(args), primals)), ...);
  using R = std::remove_cvref_t<decltype(std::apply(f, args))>;
  std::optional<R> result;
  Vjp v = ad_detail::vjp(
      [&](const std::vector<Array>& xs) {
        auto call = substitute<I...>(args, xs, offsets, std::index_sequence_for<A...>{});
        result.emplace(std::apply(f, call));
        static_assert(is_tree_v<R>, "the differentiated function must return a tree of Arrays");
        return tree::leaves(*result);
      },
      primals);
  R out = tree::unflatten(*result, v.outs);
  return std::tuple{std::move(out), std::move(v.backward), std::move(offsets)};
}

// The gradients of arguments I... from flat input cotangents: one tree per argnum.
template <size_t... I, class... A>
auto unflatten_grads(const std::tuple<const A&...>& args, const std::vector<Array>& cts,
                     const std::vector<size_t>& offsets) {
  auto one = [&]<size_t K>(std::integral_constant<size_t, K>, size_t p) {
    const auto& a = std::get<K>(args);
    size_t n = tree::structure(a).num_leaves();
    return tree::unflatten(a, std::vector<Array>(cts.begin() + std::ptrdiff_t(offsets[p]),
                                                 cts.begin() + std::ptrdiff_t(offsets[p] + n)));
  };
  if constexpr (sizeof...(I) == 1) {
    return one(std::integral_constant<size_t, I>{}..., 0);
  } else {
    return std::tuple{one(std::integral_constant<size_t, I>{}, size_t(position_of<I, I...>()))...};
  }
}

template <bool Aux, size_t... I, class F, class... A>
auto value_and_grad_call(const F& f, const A&... a) {
  std::tuple<const A&...> args(a...);
  std::vector<Array> diff;
  (append_leaves(std::get<I>(args), diff), ...);
  {
    size_t k = 0;
    (([&] {
       for (const Array& l : tree::leaves(std::get<I>(args))) {
         check_grad_input(l, I, Aux ? "value_and_grad" : "grad");
         ++k;
       }
     })(),
     ...);
  }
  auto [out, backward, offsets] = vjp_of<I...>(f, args);
  const Array* loss;
  if constexpr (Aux) {
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(out.first)>, Array>,
                  "with has_aux the function must return std::pair{scalar loss, aux}");
    loss = &out.first;
  } else {
    static_assert(std::is_same_v<std::remove_cvref_t<decltype(out)>, Array>,
                  "grad: the function must return a scalar Array (use has_aux to return more)");
    loss = &out;
  }
  check_grad_output(*loss, "grad");
  size_t n_out = tree::leaves(out).size();
  std::vector<Array> cts(n_out);  // aux leaves: zero cotangent
  cts[0] = ones_like(*loss);
  std::vector<Array> in_cts = backward(cts);
  return std::pair{std::move(out), unflatten_grads<I...>(args, in_cts, offsets)};
}
}  // namespace ad_detail

// ---- value_and_grad / grad ----
template <class F, size_t... I>
auto value_and_grad(F f, Argnums<I...>) {
  return [f = std::move(f)](const auto&... args) { return ad_detail::value_and_grad_call<false, I...>(f, args...); };
}
template <class F, size_t... I>
auto value_and_grad(F f, Argnums<I...>, HasAux) {
  return [f = std::move(f)](const auto&... args) { return ad_detail::value_and_grad_call<true, I...>(f, args...); };
}
template <class F>
auto value_and_grad(F f) {
  return value_and_grad(std::move(f), argnums<0>);
}
template <class F>
auto value_and_grad(F f, HasAux) {
  return value_and_grad(std::move(f), argnums<0>, has_aux);
}

template <class F, size_t... I>
auto grad(F f, Argnums<I...>) {
  return [f = std::move(f)](const auto&... args) {
    return ad_detail::value_and_grad_call<false, I...>(f, args...).second;
  };
}
// With has_aux: returns std::pair{grads, aux}, as JAX's grad(f, has_aux=True).
template <class F, size_t... I>
auto grad(F f, Argnums<I...>, HasAux) {
  return [f = std::move(f)](const auto&... args) {
    auto [out, g] = ad_detail::value_and_grad_call<true, I...>(f, args...);
    return std::pair{std::move(g), std::move(out.second)};
  };
}
template <class F>
auto grad(F f) {
  return grad(std::move(f), argnums<0>);
}
template <class F>
auto grad(F f, HasAux) {
  return grad(std::move(f), argnums<0>, has_aux);
}

// ---- vjp: every argument is differentiated (each must be a tree) ----
// Returns std::pair{f(args...), f_vjp}; f_vjp(cotangent of f's result) -> std::tuple of one
// cotangent per argument, each of the argument's tree type.
template <class F, class... A>
auto vjp(const F& f, const A&... a) {
  std::tuple<const A&...> args(a...);
  return [&]<size_t... I>(std::index_sequence<I...>) {
    auto [out, backward, offsets] = ad_detail::vjp_of<I...>(f, args);
    using R = std::remove_cvref_t<decltype(out)>;
    std::tuple<A...> like(a...);
    auto f_vjp = [backward = std::move(backward), offsets = std::move(offsets), like = std::move(like)](const R& ct) {
      std::vector<Array> cts = backward(tree::leaves(ct));
      std::tuple<const A&...> l = std::apply([](const auto&... x) { return std::tuple<const A&...>(x...); }, like);
      auto g = ad_detail::unflatten_grads<I...>(l, cts, offsets);
      if constexpr (sizeof...(I) == 1)
        return std::tuple{std::move(g)};
      else
        return g;
    };
    return std::pair{std::move(out), std::move(f_vjp)};
  }
  (std::index_sequence_for<A...>{});
}

// ---- jvp: primals and tangents are tuples with one tree per argument ----
template <class F, class... A, class... T>
auto jvp(const F& f, const std::tuple<A...>& primals, const std::tuple<T...>& tangents) {
  static_assert(sizeof...(A) == sizeof...(T), "jvp: pass one tangent per primal");
  std::vector<Array> p, t;
  std::apply([&](const auto&... x) { (ad_detail::append_leaves(x, p), ...); }, primals);
  std::apply([&](const auto&... x) { (ad_detail::append_leaves(x, t), ...); }, tangents);
  using R = std::remove_cvref_t<decltype(std::apply(f, primals))>;
  std::optional<R> result;
  auto [outs, touts] = ad_detail::jvp(
      [&](const std::vector<Array>& xs) {
        std::vector<size_t> offsets;
        size_t pos = 0;
        std::apply([&](const auto&... x) { ((offsets.push_back(pos), pos += tree::leaves(x).size()), ...); }, primals);
        std::tuple<const A&...> args =
            std::apply([](const auto&... x) { return std::tuple<const A&...>(x...); }, primals);
        auto call = [&]<size_t... K>(std::index_sequence<K...>) {
          return ad_detail::substitute<K...>(args, xs, offsets, std::index_sequence_for<A...>{});
        }
        (std::index_sequence_for<A...>{});
        result.emplace(std::apply(f, call));
        return tree::leaves(*result);
      },
      p, t);
  return std::pair{tree::unflatten(*result, outs), tree::unflatten(*result, touts)};
}

// ---- linearize (JAX's jax.linearize): every argument is a primal (each must be a tree) ----
// Returns std::pair{f(args...), f_jvp}. f_jvp(tangents...) takes one tangent per argument, of
// the argument's tree type, shapes and dtypes, and returns the output tangent (f's result type):
// the same as jvp(f, {args...}, {tangents...}).second, but f runs once, in linearize. The
// forward pass and the residuals the linear map needs are computed then; each f_jvp call
// evaluates only the linear part (a jaxpr of tangent operations). Tangents of integer and bool
// leaves are ignored (JAX wants float0 tangents there); their output tangents are zeros.
//
//   auto [y, f_jvp] = linearize([](const Array& x) { return jnp::sin(x) * x; }, x);
//   Array t1 = f_jvp(dx1), t2 = f_jvp(dx2);     // sin is evaluated once, above
template <class F, class... A>
auto linearize(const F& f, const A&... a) {
  static_assert(sizeof...(A) > 0, "linearize: pass at least one primal");
  std::tuple<const A&...> args(a...);
  return [&]<size_t... I>(std::index_sequence<I...>) {
    std::vector<Array> primals;
    std::vector<size_t> offsets;
    ((offsets.push_back(primals.size()), ad_detail::append_leaves(std::get<I>(args), primals)), ...);
    using R = std::remove_cvref_t<decltype(std::apply(f, args))>;
    static_assert(is_tree_v<R>, "linearize: the function must return a tree of Arrays");
    std::optional<R> result;
    ad_detail::Linearized lin = ad_detail::linearize(
        [&](const std::vector<Array>& xs) {
          auto call = ad_detail::substitute<I...>(args, xs, offsets, std::index_sequence_for<A...>{});
          result.emplace(std::apply(f, call));
          return tree::leaves(*result);
        },
        primals);
    R out = tree::unflatten(*result, lin.outs);
    std::array<TreeDef, sizeof...(A)> defs{tree::structure(a)...};
    auto f_jvp = [jvp = std::move(lin.jvp), like = out, defs](const A&... t) -> R {
      std::vector<Array> ts;
      size_t i = 0;
      (([&] {
         if (!(tree::structure(t) == defs[i]))
           throw ValueError("linearize: the tangent of argument " + std::to_string(i) +
                            " has another tree structure than its primal: " + defs[i].difference(tree::structure(t)));
         ad_detail::append_leaves(t, ts);
         ++i;
       })(),
       ...);
      return tree::unflatten(like, jvp(ts));
    };
    return std::pair{std::move(out), std::move(f_jvp)};
  }
  (std::index_sequence_for<A...>{});
}

// ---- linear_transpose (JAX's jax.linear_transpose) ----
// linear_transpose(f, primals...) -> f_transpose, where f_transpose(ct) takes a cotangent of f's
// result type and returns std::tuple of one cotangent per primal, each of the primal's tree type
// (the same shapes and dtypes). `f` must be linear in its arguments; the primals only give their
// types (Arrays or shape_dtype_struct values, cjax/eval_shape.h). `f` is traced once, here, into a
// jaxpr that each f_transpose call runs backwards. For f(x) = A x, f_transpose(ct) = A^T ct, and
// in general <f_transpose(ct), x> = <ct, f(x)>. A non-linear f (x * x, sin(x), a division by x, a
// conversion to an integer type) raises ValueError naming the equation; constant offsets
// (f(x) = x + 1) are not detected and are dropped, as in JAX. Inputs and outputs must be floating
// (DTypeError otherwise).
//
//   auto f_t = linear_transpose([](const Array& x) { return jnp::sum(x, 0); }, shape_dtype_struct({3, 4}, f32));
//   auto [ct_x] = f_t(jnp::ones({4}));           // f32[3,4] of ones: the broadcast back
template <class F, class... A>
auto linear_transpose(const F& f, const A&... a) {
  static_assert(sizeof...(A) > 0, "linear_transpose: pass at least one primal");
  std::tuple<const A&...> args(a...);
  return [&]<size_t... I>(std::index_sequence<I...>) {
    std::vector<Array> primals;
    std::vector<size_t> offsets;
    ((offsets.push_back(primals.size()), ad_detail::append_leaves(std::get<I>(args), primals)), ...);
    std::vector<AbstractValue> in_avals;
    for (size_t i = 0; i < primals.size(); ++i) {
      if (!primals[i].defined())
        throw ValueError("linear_transpose: primal leaf " + std::to_string(i) + " is an empty Array handle");
      in_avals.push_back(primals[i].aval());
    }
    using R = std::remove_cvref_t<decltype(std::apply(f, args))>;
    static_assert(is_tree_v<R>, "linear_transpose: the function must return a tree of Arrays");
    auto transpose = ad_detail::linear_transpose(
        [&](const std::vector<Array>& xs) {
          auto call = ad_detail::substitute<I...>(args, xs, offsets, std::index_sequence_for<A...>{});
          return tree::leaves(std::apply(f, call));
        },
        in_avals);
    std::tuple<A...> like(a...);
    return [transpose = std::move(transpose), offsets = std::move(offsets), like = std::move(like)](const R& ct) {
      std::vector<Array> cts = transpose(tree::leaves(ct));
      std::tuple<const A&...> l = std::apply([](const auto&... x) { return std::tuple<const A&...>(x...); }, like);
      auto g = ad_detail::unflatten_grads<I...>(l, cts, offsets);
      if constexpr (sizeof...(I) == 1)
        return std::tuple{std::move(g)};
      else
        return g;
    };
  }
  (std::index_sequence_for<A...>{});
}

// ---- Jacobians and Hessian of a function of one Array returning one Array ----
// Shape: f(x).shape + x.shape (JAX's convention).
template <class F>
auto jacfwd(F f) {
  return
      [f = std::move(f)](const Array& x) { return ad_detail::jacfwd([&](const Array& y) { return Array(f(y)); }, x); };
}
template <class F>
auto jacrev(F f) {
  return
      [f = std::move(f)](const Array& x) { return ad_detail::jacrev([&](const Array& y) { return Array(f(y)); }, x); };
}
template <class F>
auto hessian(F f) {
  return jacfwd(jacrev(std::move(f)));
}

}  // namespace cjax
