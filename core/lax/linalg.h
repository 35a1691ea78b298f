// Linear-algebra primitives: dot_general and conv_general_dilated, and the layout analysis that
// maps a dot_general onto a batched GEMM over strided views (used by every platform's kernels).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/array/primitive.h"

namespace cjax {

// dot_general's `dimension_numbers` parameter, printed as JAX does: (([1], [0]), ([], [])).
struct DotDimsParam final : ParamObject {
  std::vector<int64_t> lhs_contracting, rhs_contracting, lhs_batch, rhs_batch;
  std::string str() const override;
  size_t hash() const override;
  bool equals(const ParamObject& other) const override;
};

// conv_general_dilated's `dimension_numbers`: the permutations of (batch/out-feature,
// feature/in-feature, spatial...) for lhs, rhs and out, printed as JAX's
// ConvDimensionNumbers(lhs_spec=(0, 1, 2, 3), rhs_spec=(0, 1, 2, 3), out_spec=(0, 1, 2, 3)).
struct ConvDimsParam final : ParamObject {
  std::vector<int64_t> lhs_spec, rhs_spec, out_spec;
  std::string str() const override;
  size_t hash() const override;
  bool equals(const ParamObject& other) const override;
};

// One operand of a batched GEMM, as a strided matrix view: element (b, r, c) of the logical
// matrix op(X)[b] lives at ptr + batch_offset(b) + (trans ? c * ld + r : r * ld + c).
struct GemmOperand {
  const void* ptr = nullptr;
  bool trans = false;
  int64_t ld = 1;
  int64_t batch_stride = 0;
  // When the batch dims do not form one progression in memory (attention's [b, s, n, h] operands
  // batched over (b, n)): (extent, stride) per batch dim, the first most significant.
  std::vector<std::pair<int64_t, int64_t>> batch_dims = {};
  int64_t batch_offset(int64_t b) const {
    if (batch_dims.empty()) return b * batch_stride;
    int64_t off = 0;
    for (size_t i = batch_dims.size(); i-- > 0;) {
      off += (b % batch_dims[i].first) * batch_dims[i].second;
      b /= batch_dims[i].first;
    }
    return off;
  }
};

// dot_general(lhs, rhs) as a batched GEMM C[b] (M x N) = op(A)[b] op(B)[b] over strided views of
// the operands' buffers (GemmOperand::ptr left null: the offsets are in elements from each
// operand's data), or nullopt when an operand's dims interleave in memory and need a copy.
struct GemmViews {
  int64_t B = 1, M = 1, N = 1, K = 1;
  GemmOperand A, Bop;
};
std::optional<GemmViews> gemm_views(const Shape& lhs, const Shape& rhs, const DotDimsParam& dn);
// The GEMM sizes of dot_general(lhs, rhs) and its free dims (in order) per operand.
struct GemmDims {
  int64_t B = 1, M = 1, N = 1, K = 1;
  std::vector<int64_t> lhs_free, rhs_free;
};
GemmDims gemm_dims(const Shape& lhs, const Shape& rhs, const DotDimsParam& dn);
// One operand viewed in place as a batch of [rows, cols] matrices (trans: stored [cols, rows]),
// or nullopt when its dim groups interleave in memory.
std::optional<GemmOperand> gemm_operand_view(const Shape& shape, const std::vector<int64_t>& batch,
                                             const std::vector<int64_t>& rows, const std::vector<int64_t>& cols);

// conv_general_dilated's sizes: N, C (lhs features), O, I (rhs features), G (feature groups) and
// the spatial extents of input, kernel and output, in rhs_spec order.
struct ConvGeom {
  int64_t nsp = 0;  // number of spatial dims
  int64_t N = 0, C = 0, O = 0, I = 0, G = 1;
  Shape in_sp, k_sp, out_sp;
};
ConvGeom conv_geometry(const Array& lhs, const Array& rhs, const Params& p);
}  // namespace cjax

namespace cjax::prims {
const PrimitiveDef& dot_general();
const PrimitiveDef& conv_general_dilated();
}  // namespace cjax::prims
