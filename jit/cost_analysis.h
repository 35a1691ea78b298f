// Static cost and memory estimates of a compiled program: what jit(f).lower(...).compile()
// reports through cost_analysis() and memory_analysis() (cjax/jit.h documents what is counted).
#pragma once
#include <cstdint>
#include <vector>

#include "cjax/jit.h"
#include "jit/executable.h"

namespace cjax {

// Flops, transcendentals and bytes accessed of the executable's optimized jaxpr, fused kernels
// counted by their inputs and outputs.
CostAnalysis program_cost(const Executable& exe);
// Argument, output, donated, constant and peak intermediate bytes. `donated_args`: the flat
// argument indices donated to the call.
MemoryAnalysis program_memory(const Executable& exe, const ClosedJaxpr& traced,
                              const std::vector<size_t>& donated_args);

}  // namespace cjax
