// make_jaxpr (JAX's jax.make_jaxpr): traces a function into a jaxpr and prints it in JAX's text.
//
//   auto f = [](const Array& x, const Array& y) { return numpy::matmul(x, y); };
//   std::cout << make_jaxpr(f)(numpy::ones({8, 16}), numpy::ones({16, 4}));
//   // { lambda ; a:f32[8,16] b:f32[16,4]. let
//   //     c:f32[8,4] = dot_general[...] a b
//   //   in (c,) }
//
// Arguments that are trees of Arrays (cjax/tree.h: Array, std::vector, std::tuple, std::pair,
// std::map<std::string, T>, Dict, CJAX_TREE structs) are traced: each leaf becomes an input
// variable with the leaf's shape, dtype and weak type. Every other argument (int, float, string,
// a config struct) is passed to `f` unchanged, as a static value; wrap a C++ scalar in `Array(...)`
// to trace it. `f` returns a tree; its leaves are the jaxpr's outputs. Concrete arrays that `f`
// uses (captured or created inside) become constants of the jaxpr: rank-0 ones are inlined as
// literals (`2.0:f32[]`), others become constvars whose values are in `ClosedJaxpr::consts`.
// Under another transformation (make_jaxpr inside make_jaxpr), values of the enclosing trace are
// constants too. A tracer kept after make_jaxpr returns is dead: using it raises
// EscapedTracerError.
#pragma once
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cjax/array.h"
#include "cjax/tree.h"

namespace cjax {

class Jaxpr;  // the IR (trace/jaxpr.h)

// A jaxpr with values for its constvars (JAX's ClosedJaxpr). A const is a concrete array or, for
// a jaxpr traced inside another transformation, a tracer of an enclosing trace.
struct ClosedJaxpr {
  std::shared_ptr<const Jaxpr> jaxpr;
  std::vector<Array> consts;
  const Jaxpr& operator*() const { return *jaxpr; }
  const Jaxpr* operator->() const { return jaxpr.get(); }
  std::vector<AbstractValue> in_avals() const;
  std::vector<AbstractValue> out_avals() const;
  // JAX's text (str(closed_jaxpr)), laid out at `width` columns (80, as JAX); with
  // `source_info`, each equation ends with `  # file:line (function)` where it was traced.
  std::string pretty_print(int width = 80, bool source_info = false) const;
  std::string str() const { return pretty_print(); }
};
std::ostream& operator<<(std::ostream&, const ClosedJaxpr&);

namespace jaxpr_detail {

// Traces `f` on one fresh input tracer per aval under a new JaxprTrace whose parent is the
// current trace; `f` returns the flat outputs.
// `what` ("make_jaxpr", "jit 'step'") and `arg_names` (one per input, e.g. "argument 1 (leaf ['w'])")
// are used in concretization errors.
ClosedJaxpr trace_flat(const std::function<std::vector<Array>(const std::vector<Array>&)>& f,
                       const std::vector<AbstractValue>& in_avals, const std::string& what = "make_jaxpr",
                       const std::vector<std::string>& arg_names = {});
// Names of the flat inputs of a call: "argument i" or "argument i (leaf <path>)".
template <class A>
void append_arg_names(const A& a, size_t index, std::vector<std::string>& out) {
  if constexpr (is_tree_v<A>) {
    auto lp = tree::leaves_with_path(a);
    for (auto& [path, leaf] : lp) {
      std::string p = path.str();
      out.push_back("argument " + std::to_string(index) + (p.empty() ? "" : " (leaf " + p + ")"));
    }
  }
}

template <class A>
void append_avals(const A& a, std::vector<AbstractValue>& out) {
  if constexpr (is_tree_v<A>) {
    for (const Array& leaf : tree::leaves(a)) {
      if (!leaf.defined()) throw ValueError("make_jaxpr: an argument holds an empty Array handle; pass defined Arrays");
      out.push_back(leaf.aval());
    }
  }
}

// The value `f` receives for argument `a`: trees rebuilt from the next tracers, static values as given.
template <class A>
decltype(auto) rebuild(const A& a, const std::vector<Array>& tracers, size_t& pos) {
  if constexpr (is_tree_v<A>) {
    size_t n = tree::structure(a).num_leaves();
    std::vector<Array> mine(tracers.begin() + std::ptrdiff_t(pos), tracers.begin() + std::ptrdiff_t(pos + n));
    pos += n;
    return tree::unflatten(a, mine);
  } else {
    return static_cast<const A&>(a);
  }
}

}  // namespace jaxpr_detail

// make_jaxpr(f)(args...) -> ClosedJaxpr. See the top of this file.
template <class F>
auto make_jaxpr(F f) {
  return [f = std::move(f)](const auto&... args) -> ClosedJaxpr {
    std::vector<AbstractValue> avals;
    (jaxpr_detail::append_avals(args, avals), ...);
    std::vector<std::string> names;
    size_t index = 0;
    ((jaxpr_detail::append_arg_names(args, index++, names)), ...);
    return jaxpr_detail::trace_flat(
        [&](const std::vector<Array>& tracers) -> std::vector<Array> {
          size_t pos = 0;
          // Braced initialization evaluates left to right, so the tracers are handed out in order.
          std::tuple<decltype(jaxpr_detail::rebuild(args, tracers, pos))...> call_args{
              jaxpr_detail::rebuild(args, tracers, pos)...};
          using R = std::remove_cvref_t<decltype(std::apply(f, call_args))>;
          static_assert(is_tree_v<R>,
                        "make_jaxpr: the function must return a tree of Arrays (Array, std::vector, std::tuple, "
                        "std::pair, std::map<std::string, T>, Dict or a CJAX_TREE struct; see cjax/tree.h)");
          return tree::leaves(std::apply(f, call_args));
        },
        avals, "make_jaxpr", names);
  };
}

}  // namespace cjax
