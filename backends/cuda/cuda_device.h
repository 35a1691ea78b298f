// What the CUDA backend's kernel files need from its runtime: the GPU behind a cjax Device, a
// current context, and kernels compiled by NVRTC and loaded once per device.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "backends/cuda/cuda_api.h"
#include "cjax/device.h"

namespace cjax {
class KernelCompiler;
}

namespace cjax::cuda {

struct GpuInfo {
  CUdevice device = 0;
  CUcontext context = nullptr;  // the device's primary context
  int cc_major = 0, cc_minor = 0;
  int multiprocessors = 0;
  size_t total_memory = 0;
  std::string name;
};

// The GPU of a cuda Device; raises BackendError (naming the reason) for a device this process
// does not have.
const GpuInfo& gpu(const Device& d);
// The GPU's compute stream (Backend::stream) as a CUstream: what every kernel is launched on (a
// recording's capture stream on a thread that records a CUDA graph: backends/cuda/graphs.h).
CUstream compute_stream(const Device& d);
// The GPU's own compute stream even while the calling thread records: for state that outlives
// the recording (library workspaces), which must not become graph memory.
CUstream device_stream(const Device& d);
// Makes d's context current on the calling thread and returns the driver.
const Driver& activate(const Device& d);

// NVRTC: CUDA C++ -> CUBIN for sm_<cc_major><cc_minor>. Needs no driver and no GPU. `log`
// receives NVRTC's log (with `--ptxas-options=-v`, ptxas's register and spill report).
std::vector<char> compile_cubin(const std::string& source, int cc_major, int cc_minor, std::string* log = nullptr,
                                bool ptxas_verbose = false);
// The same through the shared kernel cache (core/backend/kernel_cache.h: memory, then disk under
// CJAX_CACHE_DIR), keyed by the source, the architecture and NVRTC's version: a new process loads
// what an earlier one compiled instead of running NVRTC again. `from_cache` says which happened.
std::vector<char> cached_cubin(const std::string& source, int cc_major, int cc_minor, bool* from_cache = nullptr);
std::string cubin_key(const std::string& source, int cc_major, int cc_minor);  // its cache key
// PTX of `source` for compute_<cc> (CJAX_DUMP output).
std::string compile_ptx(const std::string& source, int cc_major, int cc_minor);
// Loads a CUBIN into d's context (modules stay loaded for the process).
CUmodule load_module(const Device& d, const std::vector<char>& cubin);
// The kernel `name` of `source`, compiled for d's GPU (cached_cubin) and loaded into its context;
// the function is kept in memory by (device, source).
CUfunction load_kernel(const Device& d, const std::string& source, const std::string& name);
// Launches a loaded kernel on d's compute stream (`name` for errors); `args` point to its arguments.
void launch(const Device& d, CUfunction fn, const char* name, unsigned grid, unsigned block, std::vector<void*> args);
// jit's fused kernels as CUDA C++ (backends/cuda/kernels/fused_module.cpp).
KernelCompiler& fused_kernel_compiler();

}  // namespace cjax::cuda
