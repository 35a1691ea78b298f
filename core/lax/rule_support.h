// add_any (the sum of tangents) and the helpers every rule file shares: zeros of an aval, tangent
// sums where an undefined handle is zero, batch-dimension moves. Above core/array/rules.h's tables,
// since they bind lax primitives.
#pragma once
#include <span>

#include "core/array/rules.h"

namespace cjax {

// A zero array of `aval`'s shape and dtype, created under the current trace.
Array zeros_like_aval(const AbstractValue& aval);
// `t` if defined, else zeros of `aval`.
Array instantiate_zero(const Array& t, const AbstractValue& aval);
// a + b where an undefined handle is zero (JAX's add_tangents); binds `add_any`.
Array add_tangents(const Array& a, const Array& b);
bool any_defined(std::span<const Array> xs);

// Moves x's batch dimension `from` to position `to`; an unbatched x (from == kNotMapped) is
// broadcast to `size` along `to`.
Array move_bdim(const Array& x, int from, int to, int64_t size);
// The batched aval of an unbatched aval with a batch dimension of `size` at `bdim`.
AbstractValue batched_aval(const AbstractValue& aval, int bdim, int64_t size);

}  // namespace cjax
