// The compiled-kernel cache every code generator shares (LLVM objects on the CPU, CUBINs from
// NVRTC): key -> bytes, in memory (least recently used dropped past 256 MiB) and on disk under
// $CJAX_CACHE_DIR (default: $XDG_CACHE_HOME/cjax or ~/.cache/cjax; CJAX_CACHE_DIR="" turns the
// disk cache off). The key is the caller's complete description of what was compiled, target and
// compiler versions included; it is stored in the file and compared on reading, so a hash
// collision or a damaged file is a miss, never wrong code. Storing a key again replaces its bytes
// (the GEMM library choice updates its measurement records so). Files are written to a temporary
// name and renamed, so concurrent processes never read a partial file. The disk cache is capped at
// CJAX_CACHE_MAX_MB (default 512): past it, the least recently used files go.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace cjax {

std::optional<std::string> cached_kernel(const std::string& key);
void store_kernel(const std::string& key, std::string_view bytes);

struct KernelCacheStats {
  int64_t memory_hits = 0, disk_hits = 0, misses = 0, disk_writes = 0;
};
KernelCacheStats kernel_cache_stats();
// Applies the disk cache's size cap now (store_kernel also does, from time to time).
void trim_disk_kernel_cache();
// Drops the in-memory cache (tests use it to exercise the disk cache within one process).
void clear_memory_kernel_cache();

}  // namespace cjax
