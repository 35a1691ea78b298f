// jit's fused kernels on the GPU: a KernelSpec (core/backend/kernel_spec.h) emitted as CUDA C++, every
// extent and stride a literal, and the launch plan that goes with it.
//
// Launch plans:
// - Elements (no reduction): one thread per element of the R x C domain, 4 elements per thread
//   spaced a block apart (coalesced), 256 threads a block.
// - BlockPerRow (reductions, C > 32): one block per row. Each pass of the spec is a loop over the
//   row's columns, thread t taking columns t, t + B, ...; a reduction combines the threads'
//   partials in a fixed tree (warp butterfly, then the warps in order), so results are bitwise the
//   same run to run. Full-level values a later pass needs are computed again in that pass (the
//   CPU keeps them in a scratch row); their inputs are re-read from L1/L2.
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
};
FusedLaunchPlan fused_launch_plan(const KernelSpec& spec);

// What every fused-kernel program starts with (the shared prelude and the warp shuffles).
std::string fused_prelude();
// `extern "C" __global__ void <name>(inputs..., outputs...)`; nullopt when a node has no CUDA
// expression (the kernel's equations then run one by one, each as its own primitive).
std::optional<std::string> fused_kernel_source(const KernelSpec& spec, const std::string& name);

}  // namespace cjax::cuda
