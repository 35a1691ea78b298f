// The cuda platform behind the backend seam (core/backend/backend.h): one cjax Device per GPU, memory
// from each GPU's stream-ordered pool, host copies ordered on the compute stream, and NVRTC modules.
//
// Ordering: each GPU has one compute stream of its own (non-blocking: the legacy default stream
// does not wait for it, nor it for the legacy stream). Every kernel, library call, allocation,
// free and copy is issued on it, so a host read (a copy on the stream, then a synchronisation of
// the stream) sees every kernel issued before it, and a freed block is reused only after the
// kernels that used it. Virtual devices share GPU 0's stream. A thread that records a CUDA graph
// (backends/cuda/graphs.h) issues its work on the recording's capture stream instead.
#include <absl/container/flat_hash_map.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <optional>

#include "backends/cuda/buffer_communicator.h"
#include "backends/cuda/cuda_device.h"
#include "backends/cuda/graphs.h"
#include "backends/cuda/nccl.h"
#include "cjax/collectives.h"
#include "cjax/errors.h"
#include "core/backend/backend.h"
#include "core/backend/kernel_cache.h"

namespace cjax::cuda {
namespace {

class CudaStream final : public Stream {
 public:
  CudaStream(Device d, CUcontext context, CUstream stream) : Stream(d), context_(context), stream_(stream) {}
  void synchronize() override {
    check(activate(device()).cuStreamSynchronize(static_cast<CUstream>(native_handle())), "cuStreamSynchronize");
  }
  void* native_handle() const override {
    CUstream recording = recording_stream(context_);
    return recording ? recording : stream_;
  }
  CUstream compute() const { return stream_; }

 private:
  CUcontext context_;
  CUstream stream_;
};

struct Gpu {
  GpuInfo info;
  std::unique_ptr<CudaStream> stream;
  std::mutex mu;
  MemoryStats stats;
  CUmemoryPool pool = nullptr;
};

class CudaBackend final : public Backend {
 public:
  Platform platform() const override { return Platform::cuda; }

  std::vector<Device> devices() override {
    init();
    std::vector<Device> out;
    for (size_t i = 0; i < gpus_.size(); ++i) out.emplace_back(Platform::cuda, int(i));
    return out;
  }
  std::string unavailable_reason() override {
    init();
    return reason_;
  }
  bool host_accessible() const override { return false; }

  void* allocate(const Device& d, size_t nbytes) override {
    Gpu& g = gpu_of(d);
    const Driver& api = activate(d);
    CUdeviceptr p = 0;
    CUresult r = CUDA_SUCCESS;
    if (!recording_allocate(g.info.context, nbytes ? nbytes : 1, &p)) {
      r = api.cuMemAllocAsync(&p, nbytes ? nbytes : 1, g.stream->compute());
      if (r == CUDA_ERROR_OUT_OF_MEMORY) {  // memory CUDA graphs keep between launches, returned
        api.cuStreamSynchronize(g.stream->compute());
        api.cuDeviceGraphMemTrim(g.info.device);
        r = api.cuMemAllocAsync(&p, nbytes ? nbytes : 1, g.stream->compute());
      }
    }
    if (r == CUDA_ERROR_OUT_OF_MEMORY) {
      size_t free = 0, total = 0;
      api.cuMemGetInfo(&free, &total);
      std::lock_guard lock(g.mu);
      throw BackendError(
          fmt::format("out of memory on {} ({}): allocating {} bytes with {} bytes in use by cjax "
                      "arrays, {} of {} bytes free on the GPU",
                      d.str(), g.info.name, nbytes, g.stats.bytes_in_use, free, total));
    }
    check(r, "cuMemAllocAsync");
    std::lock_guard lock(g.mu);
    g.stats.bytes_in_use += int64_t(nbytes);
    g.stats.peak_bytes_in_use = std::max(g.stats.peak_bytes_in_use, g.stats.bytes_in_use);
    ++g.stats.num_allocs;
    return reinterpret_cast<void*>(p);
  }
  void deallocate(const Device& d, void* p, size_t nbytes) override {
    Gpu& g = gpu_of(d);
    const Driver& api = activate(d);
    auto ptr = reinterpret_cast<CUdeviceptr>(p);
    if (!forget_dropped_allocation(ptr) && !recording_free(g.info.context, ptr))
      api.cuMemFreeAsync(ptr, g.stream->compute());  // destructors do not throw
    std::lock_guard lock(g.mu);
    g.stats.bytes_in_use -= int64_t(nbytes);
  }
  MemoryStats memory_stats(const Device& d) override {
    Gpu& g = gpu_of(d);
    const Driver& api = activate(d);
    cuuint64_t reserved = 0, used = 0, graphs = 0;
    api.cuMemPoolGetAttribute(g.pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved);
    api.cuMemPoolGetAttribute(g.pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used);
    // The memory CUDA graphs keep for their intermediates between launches.
    api.cuDeviceGetGraphMemAttribute(g.info.device, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &graphs);
    std::lock_guard lock(g.mu);
    MemoryStats s = g.stats;
    s.bytes_cached = int64_t(reserved > used ? reserved - used : 0) + int64_t(graphs);
    return s;
  }
  void reset_peak_memory(const Device& d) override {
    Gpu& g = gpu_of(d);
    std::lock_guard lock(g.mu);
    g.stats.peak_bytes_in_use = g.stats.bytes_in_use;
  }
  // Host copies are queued on the compute stream (after the kernels that write `src`), and a read
  // waits for its copy. A pageable source is staged by the driver before the call returns; while
  // the thread records a graph, the graph keeps a pinned copy of the source (graphs.h).
  void copy_to_host(const Device& d, const void* src, void* host_dst, size_t nbytes) override {
    CUstream s = host_copy_stream(d, "a read of device memory on the host");
    const Driver& api = activate(d);
    check(api.cuMemcpyDtoHAsync(host_dst, reinterpret_cast<CUdeviceptr>(src), nbytes, s), "cuMemcpyDtoHAsync");
    check(api.cuStreamSynchronize(s), "cuStreamSynchronize");
  }
  void copy_from_host(const Device& d, void* dst, const void* host_src, size_t nbytes) override {
    Gpu& g = gpu_of(d);
    const Driver& api = activate(d);
    if (recording_copy_from_host(g.info.context, reinterpret_cast<CUdeviceptr>(dst), host_src, nbytes)) return;
    check(api.cuMemcpyHtoDAsync(reinterpret_cast<CUdeviceptr>(dst), host_src, nbytes, g.stream->compute()),
          "cuMemcpyHtoDAsync");
  }
  void copy_between_devices(const Device& from, const void* src, const Device& to, void* dst, size_t nbytes) override {
    if (gpu_of(from).info.context != gpu_of(to).info.context)  // two GPUs: through the host
      return Backend::copy_between_devices(from, src, to, dst, nbytes);
    check(activate(to).cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src), nbytes,
                                         compute_stream(to)),
          "cuMemcpyDtoDAsync");
  }
  void synchronize(const Device& d) override {
    check(activate(d).cuStreamSynchronize(host_copy_stream(d, "a synchronisation")), "cuStreamSynchronize");
  }
  std::unique_ptr<WorkRecording> begin_recording(const Device& d) override {
    Gpu& g = gpu_of(d);
    return cuda::begin_recording(d, g.info.context, g.stream->compute());
  }
  Stream& stream(const Device& d) override { return *gpu_of(d).stream; }
  KernelCompiler* kernel_compiler() override { return &fused_kernel_compiler(); }
  std::shared_ptr<BufferCommunicator> communicator(std::span<const Device> group) override {
    auto timeout = std::chrono::milliseconds(int64_t(config::collective_timeout_seconds() * 1000));
    if (collectives_use_nccl(group)) return nccl_communicator(group, timeout);
    return make_buffer_communicator(group, timeout);
  }

  // The compute stream, for a host copy or a synchronisation: raises BackendError while the
  // calling thread records (the recorded work has not run; its memory holds nothing yet).
  CUstream host_copy_stream(const Device& d, const char* what) {
    Gpu& g = gpu_of(d);
    if (recording_stream(g.info.context))
      throw BackendError(fmt::format("{} on {} while recording a CUDA graph: recorded work cannot be read on the host",
                                     what, d.str()));
    return g.stream->compute();
  }

  Gpu& gpu_of(const Device& d) {
    init();
    if (d.platform() != Platform::cuda || d.id() < 0 || d.id() >= int(gpus_.size()))
      throw BackendError(fmt::format("no such device {}: {}", d.str(),
                                     gpus_.empty() ? "the cuda platform has no devices here (" + reason_ + ")"
                                                   : fmt::format("this process has {} cuda devices", gpus_.size())));
    return *gpus_[size_t(d.id())];
  }

 private:
  void init() {
    std::call_once(once_, [&] {
      const Driver* api = driver();
      if (!api) {
        reason_ = driver_unavailable_reason();
        return;
      }
      try {
        int n = 0;
        check(api->cuDeviceGetCount(&n), "cuDeviceGetCount");
        if (n == 0) reason_ = "the NVIDIA driver reports no GPU";
        int virtual_devices = num_virtual_devices();
        if (virtual_devices > 1) n = std::min(n, 1);
        for (int i = 0; i < n; ++i) {
          auto g = std::make_unique<Gpu>();
          GpuInfo& info = g->info;
          check(api->cuDeviceGet(&info.device, i), "cuDeviceGet");
          char name[256] = {};
          api->cuDeviceGetName(name, sizeof(name), info.device);
          info.name = name;
          api->cuDeviceGetAttribute(&info.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, info.device);
          api->cuDeviceGetAttribute(&info.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, info.device);
          api->cuDeviceGetAttribute(&info.multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, info.device);
          api->cuDeviceTotalMem(&info.total_memory, info.device);
          check(api->cuDevicePrimaryCtxRetain(&info.context, info.device), "cuDevicePrimaryCtxRetain");
          check(api->cuCtxSetCurrent(info.context), "cuCtxSetCurrent");
          check(api->cuDeviceGetDefaultMemPool(&g->pool, info.device), "cuDeviceGetDefaultMemPool");
          CUstream stream = nullptr;
          check(api->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
          g->stream = std::make_unique<CudaStream>(Device(Platform::cuda, i), info.context, stream);
          // Keep freed memory in the pool (like the CPU caching allocator) instead of returning it
          // to the driver at every synchronisation.
          cuuint64_t keep = ~cuuint64_t(0);
          check(api->cuMemPoolSetAttribute(g->pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep), "cuMemPoolSetAttribute");
          gpus_.push_back(std::move(g));
        }
        // Virtual devices: cuda:1.. share GPU 0 (its context, pool and stream), each with its own
        // memory accounting.
        for (int i = 1; n == 1 && i < virtual_devices; ++i) {
          auto g = std::make_unique<Gpu>();
          g->info = gpus_[0]->info;
          g->pool = gpus_[0]->pool;
          g->stream =
              std::make_unique<CudaStream>(Device(Platform::cuda, i), g->info.context, gpus_[0]->stream->compute());
          gpus_.push_back(std::move(g));
        }
      } catch (const BackendError& e) {
        gpus_.clear();
        reason_ = e.what();
      }
    });
  }

  // CJAX_NUM_CUDA_VIRTUAL_DEVICES=N (N > 1): N logical devices on GPU 0, as CJAX_NUM_CPU_DEVICES
  // makes virtual CPU devices, so that meshes and shard_map run on one GPU.
  static int num_virtual_devices() {
    const char* v = std::getenv("CJAX_NUM_CUDA_VIRTUAL_DEVICES");
    if (!v || !*v) return 1;
    char* end = nullptr;
    long n = std::strtol(v, &end, 10);
    if (*end != '\0' || n < 1 || n > 64)
      throw BackendError(fmt::format("CJAX_NUM_CUDA_VIRTUAL_DEVICES={}: expected a count from 1 to 64", v));
    return int(n);
  }

  std::once_flag once_;
  std::vector<std::unique_ptr<Gpu>> gpus_;
  std::string reason_;
};

CudaBackend g_backend;
const bool g_registered = register_backend(&g_backend);

struct ModuleCache {
  std::mutex mu;
  absl::flat_hash_map<std::string, CUfunction> functions;                  // key: device id, name, source
  absl::flat_hash_map<std::string, std::shared_future<CUmodule>> modules;  // key: device id, source
};
ModuleCache& module_cache() {
  static ModuleCache c;
  return c;
}
}  // namespace

const GpuInfo& gpu(const Device& d) { return g_backend.gpu_of(d).info; }

CUstream compute_stream(const Device& d) { return static_cast<CUstream>(g_backend.stream(d).native_handle()); }

CUstream device_stream(const Device& d) { return g_backend.gpu_of(d).stream->compute(); }

const Driver& activate(const Device& d) {
  const GpuInfo& info = g_backend.gpu_of(d).info;
  static thread_local CUcontext current = nullptr;
  const Driver& api = *driver();
  if (current != info.context) {
    check(api.cuCtxSetCurrent(info.context), "cuCtxSetCurrent");
    current = info.context;
  }
  return api;
}

namespace {
// NVRTC over `source` for `arch` ("sm_90": CUBIN; "compute_90": PTX); returns the output.
std::vector<char> run_nvrtc(const std::string& source, const std::string& arch, std::string* log, bool ptxas_verbose) {
  const Nvrtc& rtc = nvrtc();
  nvrtcProgram prog = nullptr;
  check_nvrtc(rtc.nvrtcCreateProgram(&prog, source.c_str(), "cjax_kernels.cu", 0, nullptr, nullptr),
              "nvrtcCreateProgram");
  std::string arch_opt = "--gpu-architecture=" + arch;
  std::vector<const char*> opts = {arch_opt.c_str(), "--std=c++17", "-default-device"};
  if (ptxas_verbose) opts.push_back("--ptxas-options=-v");
  nvrtcResult r = rtc.nvrtcCompileProgram(prog, int(opts.size()), opts.data());
  size_t log_size = 0;
  rtc.nvrtcGetProgramLogSize(prog, &log_size);
  std::string text(log_size, '\0');
  if (log_size) rtc.nvrtcGetProgramLog(prog, text.data());
  while (!text.empty() && (text.back() == '\0' || text.back() == '\n')) text.pop_back();
  if (log) *log = text;
  if (r != NVRTC_SUCCESS) {
    rtc.nvrtcDestroyProgram(&prog);
    throw BackendError(fmt::format("NVRTC could not compile a generated kernel for {} ({}):\n{}\n--- source ---\n{}",
                                   arch, rtc.nvrtcGetErrorString(r), text, source));
  }
  bool ptx = arch.rfind("compute_", 0) == 0;
  size_t size = 0;
  check_nvrtc(ptx ? rtc.nvrtcGetPTXSize(prog, &size) : rtc.nvrtcGetCUBINSize(prog, &size), "nvrtcGet*Size");
  std::vector<char> out(size);
  check_nvrtc(ptx ? rtc.nvrtcGetPTX(prog, out.data()) : rtc.nvrtcGetCUBIN(prog, out.data()), "nvrtcGet*");
  rtc.nvrtcDestroyProgram(&prog);
  return out;
}
}  // namespace

std::vector<char> compile_cubin(const std::string& source, int cc_major, int cc_minor, std::string* log,
                                bool ptxas_verbose) {
  return run_nvrtc(source, fmt::format("sm_{}{}", cc_major, cc_minor), log, ptxas_verbose);
}

std::string compile_ptx(const std::string& source, int cc_major, int cc_minor) {
  std::vector<char> ptx = run_nvrtc(source, fmt::format("compute_{}{}", cc_major, cc_minor), nullptr, false);
  return std::string(ptx.data(), strnlen(ptx.data(), ptx.size()));
}

std::string cubin_key(const std::string& source, int cc_major, int cc_minor) {
  const Nvrtc& rtc = nvrtc();
  return fmt::format("cuda sm_{}{} nvrtc {}.{}\n{}", cc_major, cc_minor, rtc.major, rtc.minor, source);
}

std::vector<char> cached_cubin(const std::string& source, int cc_major, int cc_minor, bool* from_cache) {
  const std::string key = cubin_key(source, cc_major, cc_minor);
  if (std::optional<std::string> hit = cached_kernel(key)) {
    if (from_cache) *from_cache = true;
    return std::vector<char>(hit->begin(), hit->end());
  }
  std::vector<char> cubin = compile_cubin(source, cc_major, cc_minor);
  store_kernel(key, std::string_view(cubin.data(), cubin.size()));
  if (from_cache) *from_cache = false;
  return cubin;
}

CUmodule load_module(const Device& d, const std::vector<char>& cubin) {
  const Driver& api = activate(d);
  CUmodule module = nullptr;
  check(api.cuModuleLoadData(&module, cubin.data()), "cuModuleLoadData");
  return module;
}

CUfunction load_kernel(const Device& d, const std::string& source, const std::string& name) {
  const GpuInfo& info = gpu(d);
  std::string key = fmt::format("{}\n{}\n{}", info.device, name, source);  // virtual devices share modules
  ModuleCache& cache = module_cache();
  std::shared_future<CUmodule> module;
  std::optional<std::promise<CUmodule>> loading;  // this thread compiles and loads the module
  std::string module_key;
  {
    std::lock_guard lock(cache.mu);
    if (auto it = cache.functions.find(key); it != cache.functions.end()) return it->second;
    // A program's kernels (one program may hold several) share its module, compiled and loaded
    // once: threads that want it meanwhile (the virtual devices of one GPU) wait for it.
    module_key = fmt::format("{}\n{}", info.device, source);
    if (auto it = cache.modules.find(module_key); it != cache.modules.end()) {
      module = it->second;
    } else {
      loading.emplace();
      module = loading->get_future().share();
      cache.modules.emplace(module_key, module);
    }
  }
  if (loading) {  // NVRTC runs outside the lock: other threads' launches go on meanwhile
    try {
      loading->set_value(load_module(d, cached_cubin(source, info.cc_major, info.cc_minor)));
    } catch (...) {
      loading->set_exception(std::current_exception());
      std::lock_guard lock(cache.mu);
      cache.modules.erase(module_key);  // the next call tries again
    }
  }
  CUfunction fn = nullptr;
  check(activate(d).cuModuleGetFunction(&fn, module.get(), name.c_str()), "cuModuleGetFunction");
  std::lock_guard lock(cache.mu);
  cache.functions.emplace(std::move(key), fn);  // modules stay loaded for the process
  return fn;
}

}  // namespace cjax::cuda
