// The code-generation target interface of the compiler (implemented by backends/cpu/llvm_codegen.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/kernel_spec.h"

namespace cjax {

// See kernel_spec.h for the calling convention.
using KernelFn = void (*)(void** buffers, void* scratch, int64_t row_begin, int64_t row_end, int64_t col_begin,
                          int64_t col_end);

struct CompiledKernels {
  std::shared_ptr<const void> code;  // keeps the machine code alive
  std::vector<KernelFn> fns;         // one per spec, in order
  bool from_cache = false;           // the object code came from the kernel cache
  double compile_ms = 0;             // IR generation + optimization + codegen + link
};

// Compiles all kernels of one jit compilation as one module (one object file). With `ir_out`,
// the unoptimized and optimized LLVM IR are appended to it (CJAX_DUMP); this bypasses the cache.
CompiledKernels compile_kernels(std::span<const KernelSpec* const> specs, std::string* ir_out = nullptr);

}  // namespace cjax
