// The CPU platform: N virtual devices, each with a caching allocator and memory accounting. Their
// kernels share the one intra-op thread pool (core/backend/parallel.cpp).
#include "core/distributed/runtime.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>

#include "backends/cpu/buffer_communicator.h"
#include "backends/cpu/kernels/gemm_xsmm.h"
#include "backends/cpu/llvm_codegen.h"
#include "backends/cpu/process_communicator.h"
#include "backends/cpu/size_classes.h"
#include "cjax/collectives.h"
#include "cjax/device.h"
#include "cjax/errors.h"
#include "core/backend/backend.h"
#include "core/backend/buffer.h"
#include "core/backend/parallel.h"

namespace cjax {
namespace {

constexpr size_t kAlignment = cpu::kBlockAlignment;
size_t round_size(size_t n) { return cpu::block_size_class(n); }

// Physical memory plus swap (sysinfo), read once: the most any allocation could ever get.
size_t host_memory_bytes() {
  static const size_t total = [] {
    struct sysinfo si {};
    if (sysinfo(&si) != 0) return std::numeric_limits<size_t>::max();
    size_t units = size_t(si.totalram) + size_t(si.totalswap), t = 0;
    return __builtin_mul_overflow(units, size_t(si.mem_unit), &t) ? std::numeric_limits<size_t>::max() : t;
  }();
  return total;
}

std::string human_bytes(size_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = double(n);
  int u = 0;
  while (v >= 1024 && u < 6) v /= 1024, ++u;
  return u == 0 ? fmt::format("{} B", n) : fmt::format("{:.1f} {}", v, units[u]);
}

// A caching allocator: freed blocks are kept per rounded size and handed out again, so a loop
// that allocates the same 64 MB temporaries every step never page-faults after the first one.
// The cache holds at most `limit` bytes; beyond that, freed blocks go back to the system.
class CachingAllocator {
 public:
  // Blocks of 2 MB and more are aligned to 2 MB and marked MADV_HUGEPAGE, so that where the
  // kernel's transparent huge pages are on (the default "madvise" mode included) they are backed
  // by huge pages: a kernel streaming through 64 MB then takes no TLB miss every 4 KB. (At
  // 64-byte alignment the madvise failed: it needs a page-aligned start.)
  static constexpr size_t kHugePage = size_t(2) << 20;
  // posix_memalign: C11 aligned_alloc wants the size to be a multiple of the alignment.
  static void* aligned_block(size_t sz) {
    void* p = nullptr;
    return posix_memalign(&p, sz >= kHugePage ? kHugePage : kAlignment, sz) == 0 ? p : nullptr;
  }
  // Raises BackendError "out of host memory: cannot allocate N bytes ..." when the system refuses
  // the block (after the cache was released) or when it is larger than the host's memory and swap
  // together: such a block could only be overcommitted and then killed while it is filled, so it is
  // refused before any page is touched, whatever vm.overcommit_memory says.
  void* allocate(size_t nbytes, const Device& device) {
    if (nbytes > host_memory_bytes())
      throw BackendError(
          fmt::format("out of host memory: cannot allocate {} bytes ({}) on {}: more than this host's "
                      "memory and swap together ({})",
                      nbytes, human_bytes(nbytes), device.str(), human_bytes(host_memory_bytes())));
    size_t sz = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.num_allocs++;
    stats_.bytes_in_use += int64_t(sz);
    stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
    auto it = free_.find(sz);
    if (it != free_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      stats_.bytes_cached -= int64_t(sz);
      stats_.num_cache_hits++;
      return p;
    }
    void* p = aligned_block(sz);
    if (!p) {
      release_cache_locked();
      p = aligned_block(sz);
    }
    if (!p) {
      stats_.bytes_in_use -= int64_t(sz);
      throw BackendError(
          fmt::format("out of host memory: cannot allocate {} bytes ({}) on {}; {} bytes are in use on "
                      "that device",
                      nbytes, human_bytes(nbytes), device.str(), stats_.bytes_in_use));
    }
    if (sz >= kHugePage) madvise(p, sz, MADV_HUGEPAGE);
    return p;
  }
  void deallocate(void* p, size_t nbytes) {
    size_t sz = round_size(nbytes);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.bytes_in_use -= int64_t(sz);
    if (stats_.bytes_cached + int64_t(sz) > limit_) {
      std::free(p);
      return;
    }
    free_[sz].push_back(p);
    stats_.bytes_cached += int64_t(sz);
  }
  MemoryStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_bytes_in_use = stats_.bytes_in_use;
  }
  ~CachingAllocator() { release_cache_locked(); }

 private:
  void release_cache_locked() {
    for (auto& [sz, v] : free_)
      for (void* p : v) std::free(p);
    free_.clear();
    stats_.bytes_cached = 0;
  }
  std::mutex mu_;
  std::map<size_t, std::vector<void*>> free_;
  MemoryStats stats_;
  int64_t limit_ = int64_t(4) << 30;
};

std::atomic<int> g_requested_devices{0};

// A cpu device's stream: launches run to completion on the launching thread (core/backend/backend.h).
class CpuStream final : public Stream {
 public:
  using Stream::Stream;
  void synchronize() override {}
  void* native_handle() const override { return nullptr; }
};

// The devices of this process: ids first_id .. first_id + n - 1 (first_id > 0 on the later processes
// of a multi-process run, include/cjax/distributed.h).
struct CpuRuntime {
  std::vector<std::unique_ptr<CachingAllocator>> allocators;
  std::vector<std::unique_ptr<CpuStream>> streams;
  int first_id = 0;
  CpuRuntime() {
    distributed::mark_runtime_started();
    int ndev = config::num_cpu_devices();
    first_id = distributed::first_local_device_id(Platform::cpu);
    for (int i = 0; i < ndev; ++i) {
      allocators.push_back(std::make_unique<CachingAllocator>());
      streams.push_back(std::make_unique<CpuStream>(Device(Platform::cpu, first_id + i)));
    }
    g_requested_devices = ndev;
  }
};
std::atomic<bool> g_started{false};
CpuRuntime& runtime() {
  static CpuRuntime rt;
  g_started = true;
  return rt;
}

CachingAllocator& allocator_for(const Device& d) {
  auto& rt = runtime();
  int k = d.id() - rt.first_id;
  if (d.platform() != Platform::cpu || k < 0 || k >= int(rt.allocators.size())) check_device(d);
  return *rt.allocators[size_t(k)];
}
}  // namespace

namespace {
// The CPU platform behind the backend seam (core/backend/backend.h).
class CpuBackend final : public Backend {
 public:
  Platform platform() const override { return Platform::cpu; }
  std::vector<Device> devices() override {
    std::vector<Device> out;
    const CpuRuntime& rt = runtime();
    for (int i = 0; i < int(rt.allocators.size()); ++i) out.emplace_back(Platform::cpu, rt.first_id + i);
    return out;
  }
  bool host_accessible() const override { return true; }
  void* allocate(const Device& d, size_t nbytes) override { return allocator_for(d).allocate(nbytes, d); }
  void deallocate(const Device& d, void* p, size_t nbytes) override { allocator_for(d).deallocate(p, nbytes); }
  MemoryStats memory_stats(const Device& d) override { return allocator_for(d).stats(); }
  void reset_peak_memory(const Device& d) override { allocator_for(d).reset_peak(); }
  void copy_to_host(const Device&, const void* src, void* dst, size_t n) override { std::memcpy(dst, src, n); }
  void copy_from_host(const Device&, void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void copy_between_devices(const Device&, const void* src, const Device&, void* dst, size_t n) override {
    std::memcpy(dst, src, n);
  }
  void synchronize(const Device&) override {}
  Stream& stream(const Device& d) override {
    allocator_for(d);  // validates the device
    return *runtime().streams[size_t(d.id() - runtime().first_id)];
  }
  KernelCompiler* kernel_compiler() override { return &llvm_kernel_compiler(); }
  // GEMMs (dot_general, its accumulating form, convolutions) may run on LIBXSMM.
  std::function<void()> preparation(std::span<const std::string_view> names) override {
    bool gemm = std::any_of(names.begin(), names.end(), [](std::string_view n) {
      return n == "dot_general" || n == "dot_general_accumulate" || n == "conv_general_dilated";
    });
    if (!gemm || xsmm_prepared()) return {};
    return [] { prepare_xsmm(); };
  }
  std::shared_ptr<BufferCommunicator> communicator(std::span<const Device> group) override {
    auto timeout = std::chrono::milliseconds(int64_t(config::collective_timeout_seconds() * 1000));
    std::vector<Device> devs(group.begin(), group.end());
    if (distributed::spans_processes(devs)) return cpu::make_process_buffer_communicator(group, timeout);
    return cpu::make_in_process_buffer_communicator(group, timeout);
  }
};
CpuBackend g_cpu_backend;
const bool g_cpu_registered = register_backend(&g_cpu_backend);
}  // namespace

namespace config {
void set_num_cpu_devices(int n) {
  if (n <= 0) throw ValueError(fmt::format("set_num_cpu_devices({}): the count must be positive", n));
  if (g_started && g_requested_devices.load() != n)
    throw BackendError(
        fmt::format("set_num_cpu_devices({}) called after the runtime started with {} devices; "
                    "call it before creating any array, or set CJAX_NUM_CPU_DEVICES",
                    n, g_requested_devices.load()));
  g_requested_devices = n;
}
int num_cpu_devices() {
  return g_requested_devices.load() ? g_requested_devices.load() : positive_env_int("CJAX_NUM_CPU_DEVICES", 1);
}
}  // namespace config

}  // namespace cjax
