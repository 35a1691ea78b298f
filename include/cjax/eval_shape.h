// eval_shape (JAX's jax.eval_shape) and abstract arrays (JAX's jax.ShapeDtypeStruct).
//
//   auto f = [](const Array& a, const Array& b) { return std::pair{jnp::matmul(a, b), jnp::sum(a)}; };
//   Array big = shape_dtype_struct({1 << 20, 1 << 20}, f32);    // 4 TiB if it existed: it does not
//   auto [c, s] = eval_shape(f, big, big);
//   c.shape();   // {1048576, 1048576}     c.dtype() == f32     s.shape() == Shape{}
//
// eval_shape(f, args...) traces `f` into a jaxpr (as make_jaxpr does) and returns f's result
// tree with every leaf replaced by an abstract Array of the leaf's shape, dtype and weak type:
// nothing is computed and no buffer is allocated. Arguments are as for make_jaxpr: trees of
// Arrays (concrete or abstract) are traced by their types, other arguments are static values.
// As under make_jaxpr, arrays `f` builds from host values alone (jnp::zeros(shape), jnp::array)
// are created eagerly; what `f` computes from its arguments is only traced.
//
// An abstract Array (shape_dtype_struct, or a leaf eval_shape returned) has a type and no data:
// shape(), dtype(), weak_type(), aval() and printing work (it prints as JAX's repr,
// `ShapeDtypeStruct(shape=(2, 3), dtype=float32)`); reading values (item, to_vector) or an
// eager operation on it raises. It can stand for an argument wherever only types matter:
// eval_shape, make_jaxpr, linear_transpose's primals and jit(f).lower(...).
#pragma once
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "cjax/array.h"
#include "cjax/make_jaxpr.h"
#include "cjax/tree.h"

namespace cjax {

// An abstract Array of the given type (JAX's jax.ShapeDtypeStruct(shape, dtype)).
Array shape_dtype_struct(Shape shape, DType dtype, bool weak_type = false);
Array shape_dtype_struct(const AbstractValue& aval);
// True for an abstract Array: it has a type and no data and belongs to no trace.
bool is_abstract(const Array& x);

// eval_shape(f, args...): f's result tree with abstract leaves. See the top of this file.
template <class F, class... A>
auto eval_shape(const F& f, const A&... args) {
  std::vector<AbstractValue> avals;
  (jaxpr_detail::append_avals(args, avals), ...);
  std::vector<std::string> names;
  size_t index = 0;
  ((jaxpr_detail::append_arg_names(args, index++, names)), ...);
  using R = std::remove_cvref_t<std::invoke_result_t<const F&, const A&...>>;
  static_assert(is_tree_v<R>,
                "eval_shape: the function must return a tree of Arrays (Array, std::vector, std::tuple, std::pair, "
                "std::map<std::string, T>, Dict or a CJAX_TREE struct; see cjax/tree.h)");
  std::optional<R> result;
  ClosedJaxpr traced = jaxpr_detail::trace_flat(
      [&](const std::vector<Array>& tracers) -> std::vector<Array> {
        size_t pos = 0;
        // Braced initialization evaluates left to right, so the tracers are handed out in order.
        std::tuple<decltype(jaxpr_detail::rebuild(args, tracers, pos))...> call_args{
            jaxpr_detail::rebuild(args, tracers, pos)...};
        result.emplace(std::apply(f, call_args));
        return tree::leaves(*result);
      },
      avals, "eval_shape", names);
  std::vector<Array> outs;
  for (const AbstractValue& a : traced.out_avals()) outs.push_back(shape_dtype_struct(a));
  return tree::unflatten(*result, outs);
}

}  // namespace cjax
