// The CPU's code generator: KernelSpecs -> LLVM modules -> machine code (llvm_codegen.cpp),
// and the KernelCompiler (core/backend/backend.h) jit reaches it through (kernel_module.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/backend/backend.h"
#include "core/backend/kernel_spec.h"

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

// Compiles all kernels of one jit compilation, as up to 8 modules (object files) compiled in
// parallel on the intra-op pool. With `ir_out`,
// the unoptimized and optimized LLVM IR are appended to it (CJAX_DUMP); this bypasses the cache.
CompiledKernels compile_kernels(std::span<const KernelSpec* const> specs, std::string* ir_out = nullptr);

// The CPU backend's KernelCompiler: modules whose launch splits rows (or columns of elementwise
// kernels with few rows) over the intra-op thread pool.
KernelCompiler& llvm_kernel_compiler();

}  // namespace cjax
