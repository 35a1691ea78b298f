// The cuda KernelCompiler (core/backend/backend.h): all fused kernels of one jit program as one NVRTC
// program, compiled to SASS for the device's exact architecture and kept in the shared kernel
// cache (core/backend/kernel_cache.h) under a key of the CUDA source, the architecture and the NVRTC
// version; kernels are named k0, k1, ... so that equal programs share their CUBIN. CJAX_DUMP
// writes the .cu, the PTX and ptxas's register/spill report next to the program's other dumps.
#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <mutex>

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/kernels/fused.h"
#include "cjax/errors.h"
#include "core/backend/backend.h"
#include "core/backend/kernel_cache.h"

namespace cjax::cuda {
namespace {

class FusedModule final : public KernelModule {
 public:
  Device device;
  std::vector<CUfunction> functions;  // null: the kernel runs as its equations
  std::vector<FusedLaunchPlan> plans;

  explicit FusedModule(Device d) : device(d) {}
  bool has_kernel(size_t k) const override { return functions[k] != nullptr; }
  void launch(size_t k, std::span<void* const> buffers, Stream& stream) const override {
    const FusedLaunchPlan& p = plans[k];
    if (stream.device() != device)
      throw BackendError(fmt::format("a fused module compiled for {} was launched on a stream of {}", device.str(),
                                     stream.device().str()));
    if (p.grid == 0) return;
    if (p.grid > 0x7fffffff)
      throw BackendError(fmt::format("a fused kernel of {} blocks exceeds the grid limit", p.grid));
    std::vector<void*> args(buffers.size());
    for (size_t i = 0; i < buffers.size(); ++i) args[i] = const_cast<void**>(&buffers[i]);
    check(activate(device).cuLaunchKernel(functions[k], unsigned(p.grid), 1, 1, p.block, 1, 1, 0,
                                          static_cast<CUstream>(stream.native_handle()), args.data(), nullptr),
          "cuLaunchKernel (fused kernel)");
  }
};

class FusedCompiler final : public KernelCompiler {
 public:
  std::shared_ptr<const KernelModule> compile(const Device& d, std::span<const KernelSpec* const> specs,
                                              const std::string& dump_base) override {
    auto start = std::chrono::steady_clock::now();
    auto module = std::make_shared<FusedModule>(d);
    std::string source = fused_prelude();
    std::vector<std::string> names;
    for (size_t k = 0; k < specs.size(); ++k) {
      module->plans.push_back(fused_launch_plan(*specs[k]));
      std::string name = fmt::format("k{}", k);
      std::optional<std::string> src = fused_kernel_source(*specs[k], name);
      names.push_back(src ? name : "");
      if (src) source += "\n" + *src;
    }
    const GpuInfo& info = gpu(d);
    std::vector<char> cubin;
    if (!dump_base.empty()) {  // the compilation that writes ptxas's report is the one used
      std::ofstream(dump_base + ".cu") << source;
      std::string log;
      cubin = compile_cubin(source, info.cc_major, info.cc_minor, &log, true);
      std::ofstream(dump_base + ".ptxas.txt") << log << "\n";
      std::ofstream(dump_base + ".ptx") << compile_ptx(source, info.cc_major, info.cc_minor);
    }
    if (!cubin.empty()) {
      store_kernel(cubin_key(source, info.cc_major, info.cc_minor), std::string_view(cubin.data(), cubin.size()));
    } else {
      cubin = cached_cubin(source, info.cc_major, info.cc_minor, &module->from_cache);
    }
    std::lock_guard lock(load_mu_);  // one module load at a time per process
    CUmodule m = load_module(d, cubin);
    for (const std::string& name : names) {
      CUfunction fn = nullptr;
      if (!name.empty()) check(activate(d).cuModuleGetFunction(&fn, m, name.c_str()), "cuModuleGetFunction");
      module->functions.push_back(fn);
    }
    module->compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    return module;
  }

 private:
  std::mutex load_mu_;
};

}  // namespace

KernelCompiler& fused_kernel_compiler() {
  static FusedCompiler c;
  return c;
}

}  // namespace cjax::cuda
