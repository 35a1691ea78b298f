// Reduction, cumulative and sort primitive families (JAX names and params):
//   reduce_sum / reduce_max / reduce_min / reduce_prod / reduce_and / reduce_or  [axes]
//   argmax / argmin                                                   [axes=(axis,), index_dtype]
//   cumsum / cumprod / cummax / cummin / cumlogsumexp                 [axis, reverse]
//   sort                                                              [dimension, is_stable, num_keys]
//   top_k                                                             [k]
// Their CPU kernels are in backends/cpu/kernels/reduce.cpp and sort.cpp.
#pragma once
#include "core/array/primitive.h"

namespace cjax {
// The combining operation of a reduction or cumulative primitive.
enum class RedOp { Sum, Prod, Max, Min, And, Or, LogAddExp };
}  // namespace cjax

namespace cjax::prims {
const PrimitiveDef& reduce_sum();
const PrimitiveDef& reduce_max();
const PrimitiveDef& reduce_min();
const PrimitiveDef& reduce_prod();
const PrimitiveDef& reduce_and();
const PrimitiveDef& reduce_or();
const PrimitiveDef& argmax();
const PrimitiveDef& argmin();
const PrimitiveDef& cumsum();
const PrimitiveDef& cumprod();
const PrimitiveDef& cummax();
const PrimitiveDef& cummin();
const PrimitiveDef& cumlogsumexp();
const PrimitiveDef& sort();
const PrimitiveDef& top_k();
}  // namespace cjax::prims
