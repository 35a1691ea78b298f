// Elementwise primitives: one per row of the scalar-op table, plus convert_element_type,
// bitcast_convert_type, select_n, integer_pow and threefry2x32.
#pragma once
#include "core/array/primitive.h"

namespace cjax::prims {
const PrimitiveDef& elementwise(ScalarOp op);
const PrimitiveDef& convert_element_type();
const PrimitiveDef& bitcast_convert_type();
const PrimitiveDef& select_n();
const PrimitiveDef& integer_pow();
const PrimitiveDef& threefry2x32();
const PrimitiveDef& stop_gradient();
}  // namespace cjax::prims

namespace cjax {
// Kernel-level dtype conversion of a concrete array (runs the convert_element_type kernel directly,
// without bind): for other kernels that compute in a wider type.
Array convert_concrete(const Array& x, DType dtype);
}  // namespace cjax
