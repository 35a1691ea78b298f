// The process-wide LLVM ORC JIT of the CPU backend and the kernel object cache.
//
// Generated kernels are compiled for the host CPU (all of its features: AVX-512 on Zen 4) with
// LLVM's O2 pipeline (llvm_jit.cpp says why not O3), Aggressive code generation and FMA
// contraction, then linked into one LLJIT. One llvm::Module = one object file = one JitCode (a
// jit compilation makes up to 8, compiled concurrently); the code lives as long as its JitCode.
//
// Object files go through the shared kernel cache (core/backend/kernel_cache.h), keyed by a caller-given
// string (the canonical kernel specs of the module) extended with the host target and the
// LLVM/cjax versions.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/backend/kernel_cache.h"

namespace llvm {
class Module;
class Function;
class MemoryBuffer;
class LLVMContext;
}  // namespace llvm

namespace cjax::cpu {

// Linked machine code; unlinked when the last reference goes.
class JitCode {
 public:
  virtual ~JitCode() = default;
  // Address of a function defined by the module; raises Error if absent.
  virtual void* lookup(std::string_view symbol) const = 0;
};

// "x86_64-pc-linux-gnu znver4 +avx512f,..." plus versions: part of every cache key.
const std::string& host_target_id();
// Sets the host triple and data layout on a new module.
void configure_for_host(llvm::Module& m);
// Sets target-cpu / target-features / vector-width attributes so the vectorizer sees the host.
void set_host_attributes(llvm::Function& f);

// Runs the O2 pipeline for the host and returns the object file. Thread safe: concurrent calls
// (on modules of their own LLVMContexts) compile in parallel.
std::unique_ptr<llvm::MemoryBuffer> compile_to_object(llvm::Module& m);
// Links an object file (from compile_to_object or the cache).
std::shared_ptr<JitCode> link_object(std::unique_ptr<llvm::MemoryBuffer> object);
// How many JIT libraries exist (linked objects live now plus free ones kept for reuse): bounded
// by the most objects ever linked at once, not by how many were linked over time.
size_t jit_library_count();

// The object cache. `key` is the caller's canonical description of the module's contents.
std::unique_ptr<llvm::MemoryBuffer> cached_object(const std::string& key);
void store_object(const std::string& key, const llvm::MemoryBuffer& object);

// The shared kernel cache (core/backend/kernel_cache.h), under this module's names.
using cjax::clear_memory_kernel_cache;
using cjax::kernel_cache_stats;
using cjax::KernelCacheStats;
using cjax::trim_disk_kernel_cache;

}  // namespace cjax::cpu
