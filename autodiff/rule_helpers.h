// Shared pieces for writing primitive rules (autodiff/rules_<family>.cpp).
#pragma once
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "cjax/lax.h"
#include "core/array/array_impl.h"
#include "core/array/primitive.h"
#include "core/array/rules.h"

namespace cjax::rule_helpers {

// `t` (of `aval`'s dtype, rank 0 or aval's shape) broadcast to `aval`'s shape.
Array broadcast_to_aval(const Array& t, const AbstractValue& aval);
// The transpose of broadcast_to_aval: `ct` summed down to `aval` (rank 0 or the same shape)
// and converted to its dtype.
Array unbroadcast(const Array& ct, const AbstractValue& aval);

// JVP of a unary elementwise primitive: out = bind(x), tangent = deriv(x, t) (t defined), which
// may use `out` through the third argument.
using UnaryDeriv = std::function<Array(const Array& x, const Array& t, const Array& out)>;
void def_unary_jvp(std::string_view name, UnaryDeriv deriv);
inline void def_unary_jvp(std::string_view name, std::function<Array(const Array&, const Array&)> deriv) {
  def_unary_jvp(name, [deriv = std::move(deriv)](const Array& x, const Array& t, const Array&) { return deriv(x, t); });
}

// The batching rule of an elementwise primitive of any arity (rank-0 operands broadcast as lax
// allows): batched operands get their batch dimension moved to 0, the others are broadcast.
BatchOut batch_elementwise(const PrimitiveDef& def, std::span<const Array> args, std::span<const int> bdims,
                           const BatchAxis& axis, const Params& params);

}  // namespace cjax::rule_helpers
