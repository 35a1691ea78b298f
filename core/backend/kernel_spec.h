// KernelSpec: the target-independent description of one fused loop kernel (docs/design.md §5.4).
//
// A kernel iterates a two-level domain: R rows × C columns. Rows enumerate the (coalesced) outer
// axes of the group's output shape in row-major order; columns are the coalesced inner axes
// (the reduced axes of a reduction group, else the longest suffix every operand reads either
// contiguously or not at all). Each node is a scalar computation; a node is either
// *full* level (one value per element) or *row* level (one value per row: loads that do not vary
// along the columns, constants, reduction results and what is computed from them).
//
// A row is processed in passes. A reduction accumulates over the columns in the pass where its
// operand is available; what uses its result runs in a later pass. Full-level values needed by
// a later pass are kept in a per-thread scratch row (L1/L2 resident) instead of being recomputed
// or written to memory. Within a row everything happens in a fixed order on one thread, so
// results do not depend on how rows are split over threads: reductions are deterministic.
//
// The generated function has the C signature
//   void name(void** buffers, void* scratch, int64_t row_begin, int64_t row_end,
//             int64_t col_begin, int64_t col_end)
// with `buffers` = inputs then outputs. Kernels with reductions must be given whole rows.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cjax/dtype.h"
#include "core/backend/scalar_ops.h"

namespace cjax {

struct KernelInput {
  DType dtype = DType::float32;
  // Element offset of (row, col) = sum_d idx_d(row) * outer_strides[d] + col * col_stride,
  // idx_d(row) being the row's index along coalesced outer axis d.
  std::vector<int64_t> outer_strides;
  int64_t col_stride = 0;  // 0 (the value is the same along a row) or 1
};

enum class KernelReduce : uint8_t { Sum, Prod, Max, Min };

struct KernelNode {
  enum class Op : uint8_t { Load, Const, Scalar, Convert, Select, IntegerPow, Reduce };
  KernelNode(Op o, DType d) : op(o), dtype(d) {}
  Op op;
  DType dtype;            // result dtype (bf16/f16 are computed in f32 and rounded per op)
  std::vector<int> args;  // node indices (Select: predicate then cases)
  int input = -1;         // Load: index into KernelSpec::inputs
  ScalarOp scalar_op{};   // Scalar
  double fvalue = 0;      // Const (floating / bool)
  int64_t ivalue = 0;     // Const (integers), IntegerPow exponent
  KernelReduce reduce{};  // Reduce
  // Filled by finalize(): level and the pass that computes the node (full level) or after
  // which it is available (row level).
  bool row_level = false;
  int pass = 0;
};

struct KernelOutput {
  int node;
  DType dtype;
  bool full;  // stored per element (row * C + col); else per row
  // >= 0: the output is written through that input's pointer (in place: same type and layout,
  // single pass). The kernel then reads and writes one buffer, which the compiler knows.
  int in_place_of = -1;
};

struct KernelSpec {
  std::string name;            // symbol of the generated function
  std::vector<int64_t> outer;  // coalesced outer extents (product R; empty: R = 1)
  int64_t cols = 1;            // C
  bool has_reduction = false;
  std::vector<KernelInput> inputs;
  std::vector<KernelNode> nodes;  // topologically ordered
  std::vector<KernelOutput> outputs;
  // Computed by finalize():
  int num_passes = 1;
  std::vector<int> scratch_slot;  // per node: index of its scratch row, or -1
  int num_scratch = 0;

  int64_t rows() const;
  // Assigns levels, passes and scratch rows; call once the nodes and outputs are final.
  void finalize();
  // Scratch bytes one thread needs: two sets of num_scratch rows of C values of 8 bytes (a code
  // generator may alternate between them from row to row, to overlap consecutive rows).
  int64_t scratch_bytes() const { return 2 * int64_t(num_scratch) * cols * 8; }
  // Canonical text: equal texts <=> same machine code (the symbol name excluded). Used as the
  // kernel cache key and in CJAX_DUMP output.
  std::string canonical() const;
};

// The compute dtype of a node (bf16/f16 -> f32).
inline DType compute_dtype(DType d) { return d == DType::bfloat16 || d == DType::float16 ? DType::float32 : d; }

}  // namespace cjax
