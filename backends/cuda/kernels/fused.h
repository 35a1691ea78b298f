// jit's fused kernels on the GPU: a KernelSpec (core/backend/kernel_spec.h) emitted as CUDA C++, every
// extent and stride a literal, and the launch plan that goes with it.
//
// Launch plans:
// - Elements (no reduction): 256 threads a block; a thread moves runs of consecutive elements
//   (4 f32, 8 bf16: one 16-byte load or store per operand and run) where the columns and row
//   strides allow, else 4 single elements spaced a block apart. Coalesced either way.
// - BlockPerRow (reductions, C > 32): one block per row. Each pass of the spec is a loop over the
//   row's columns, thread t taking columns t, t + B, ...; a reduction combines the threads'
//   partials in a fixed tree (warp butterfly, then the warps in order), so results are bitwise the
//   same run to run. Full-level values a later pass needs are computed again in that pass (the
//   CPU keeps them in a scratch row). Where a thread's share of the row's loads fits in 32
//   registers (the block grows up to 1024 threads to make it fit), they are loaded once, all
//   at the start (as many loads in flight as the thread has columns), and every pass reads the
//   registers; wider rows re-read their inputs from L1/L2 in each pass.
// - ThreadPerRow (reductions, C <= 32): one thread per row, columns in order.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "core/backend/kernel_spec.h"

namespace cjax::cuda {

struct FusedLaunchPlan {
  enum class Kind { Elements, ThreadPerRow, BlockPerRow };
  Kind kind = Kind::Elements;
  unsigned block = 256;
  int64_t grid = 0;  // blocks (0: nothing to do)
  // Elements: each thread moves `groups` runs of `vector` consecutive elements (16-byte accesses
  // where the extents allow).
  unsigned vector = 1, groups = 4;
  // BlockPerRow: > 0 when each thread holds its `cached_columns` columns of every load in
  // registers (read once; every pass computes from them); 0: each pass reads the row again.
  unsigned cached_columns = 0;
};
FusedLaunchPlan fused_launch_plan(const KernelSpec& spec);

// What every fused-kernel program starts with (the shared prelude and the warp shuffles).
std::string fused_prelude();
// `extern "C" __global__ void <name>(inputs..., outputs...)`; nullopt when a node has no CUDA
// expression (the kernel's equations then run one by one, each as its own primitive).
std::optional<std::string> fused_kernel_source(const KernelSpec& spec, const std::string& name);

}  // namespace cjax::cuda
