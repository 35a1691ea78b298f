// The CPU platform: N virtual devices, each with a caching allocator and memory accounting, and
// one intra-op thread pool shared by all of them.
#include <cblas.h>
#include <fmt/format.h>
#include <sys/mman.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <thread>

#include "backends/cpu/buffer_communicator.h"
#include "backends/cpu/llvm_codegen.h"
#include "cjax/collectives.h"
#include "cjax/device.h"
#include "cjax/errors.h"
#include "core/backend/backend.h"
#include "core/backend/buffer.h"
#include "core/backend/device_worker.h"
#include "core/backend/parallel.h"

extern "C" {
int openblas_get_num_threads(void);
void openblas_set_num_threads(int);
}

namespace cjax {
namespace {

constexpr size_t kAlignment = 64;
constexpr size_t kSmallLimit = 1 << 20;  // below this, round to a power of two (bins)

size_t round_size(size_t n) {
  if (n == 0) n = 1;
  if (n <= kSmallLimit) return std::max<size_t>(kAlignment, std::bit_ceil(n));
  // Large blocks: round up to 1/8 of the next power of two so similar sizes share a bin.
  size_t p = std::bit_floor(n);
  size_t step = std::max<size_t>(p / 8, 4096);
  return (n + step - 1) / step * step;
}

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

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end || x <= 0 || x > 4096)
    throw BackendError(fmt::format("{}={} is not a positive integer; set it to e.g. 8", name, v));
  return int(x);
}

std::atomic<int> g_requested_devices{0};
std::atomic<int> g_requested_threads{0};

// Spin briefly before blocking: parallel regions often come back to back (a lockstep SPMD body
// meets at every collective, an executable runs kernel after kernel), and waking a thread
// blocked on a futex costs tens of microseconds on a VM. ~2000 pauses are ~20-50 us.
constexpr int kSpinIterations = 2000;
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#else
  std::this_thread::yield();
#endif
}
template <class Done>
void spin_until(Done done) {
  for (int i = 0; i < kSpinIterations && !done(); ++i) cpu_relax();
}

// The thread pool: workers wait for a job (a chunked range); the caller takes part too.
class ThreadPool {
 public:
  explicit ThreadPool(int n) : n_(n) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this] { worker_loop(); });
  }
  ~ThreadPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }
  int size() const { return n_; }

  void run(int64_t n, int64_t nchunks, RangeFn fn) {
    std::unique_lock<std::mutex> run_lock(run_mu_);  // one parallel job at a time
    Job job(fn);
    job.n = n;
    job.nchunks = nchunks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      ++generation_;
      published_.store(generation_, std::memory_order_release);
    }
    cv_.notify_all();
    work_on(job);
    spin_until([&] { return job.settled.load(std::memory_order_acquire); });
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return job.finished == job.nchunks && job.active == 0; });
    job_ = nullptr;
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  struct Job {
    explicit Job(RangeFn f) : fn(f) {}
    RangeFn fn;
    int64_t n = 0, nchunks = 0;
    std::atomic<int64_t> next{0};
    int64_t finished = 0;              // guarded by mu_
    int active = 0;                    // workers inside work_on; guarded by mu_
    std::atomic<bool> settled{false};  // finished == nchunks && active == 0 (for spinning)
    std::exception_ptr error;
  };
  static thread_local bool tl_in_region;
  friend bool cjax::in_parallel_region();

  void work_on(Job& job) {
    bool saved = tl_in_region;
    tl_in_region = true;
    int64_t done = 0;
    for (;;) {
      int64_t c = job.next.fetch_add(1);
      if (c >= job.nchunks) break;
      int64_t b = job.n * c / job.nchunks, e = job.n * (c + 1) / job.nchunks;
      try {
        job.fn(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu_);
        if (!job.error) job.error = std::current_exception();
      }
      ++done;
    }
    tl_in_region = saved;
    if (done) {
      std::lock_guard<std::mutex> lock(mu_);
      job.finished += done;
      if (job.finished == job.nchunks && job.active == 0) job.settled.store(true, std::memory_order_release);
      if (job.finished == job.nchunks) done_cv_.notify_all();
    }
  }
  void worker_loop() {
    uint64_t seen = 0;
    for (;;) {
      Job* job;
      spin_until([&] { return published_.load(std::memory_order_acquire) != seen; });
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || (job_ && generation_ != seen); });
        if (stop_) return;
        seen = generation_;
        job = job_;
        ++job->active;
      }
      work_on(*job);
      std::lock_guard<std::mutex> lock(mu_);
      if (--job->active == 0) {
        if (job->finished == job->nchunks) job->settled.store(true, std::memory_order_release);
        done_cv_.notify_all();
      }
    }
  }
  int n_;
  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  Job* job_ = nullptr;
  uint64_t generation_ = 0;
  std::atomic<uint64_t> published_{0};  // generation_, readable without mu_ (for spinning)
  bool stop_ = false;
};
thread_local bool ThreadPool::tl_in_region = false;

// A device's worker: one thread draining a FIFO queue of tasks.
class DeviceWorker {
 public:
  ~DeviceWorker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  std::future<void> submit(std::function<void()> task) {
    std::packaged_task<void()> pt(std::move(task));
    std::future<void> f = pt.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      start_locked();
      queue_.push_back(std::move(pt));
    }
    cv_.notify_one();
    return f;
  }
  std::thread::id thread_id() {
    std::lock_guard<std::mutex> lock(mu_);
    start_locked();
    return thread_.get_id();
  }

 private:
  void start_locked() {
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  void loop() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop requested and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();  // exceptions are stored in the task's future
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  std::thread thread_;
  bool stop_ = false;
};

struct CpuRuntime {
  std::vector<std::unique_ptr<CachingAllocator>> allocators;
  std::vector<std::unique_ptr<DeviceWorker>> workers;
  // Per-device queues of dispatched jit calls: separate threads from `workers`, because a
  // dispatched program may run a shard_map, whose SPMD bodies need every device worker.
  std::vector<std::unique_ptr<DeviceWorker>> dispatchers;
  std::unique_ptr<ThreadPool> pool;
  CpuRuntime() {
    int ndev = g_requested_devices.load() ? g_requested_devices.load() : env_int("CJAX_NUM_CPU_DEVICES", 1);
    int hw = int(std::max(1u, std::thread::hardware_concurrency()));
    int nthreads = g_requested_threads.load() ? g_requested_threads.load() : env_int("CJAX_NUM_THREADS", hw);
    for (int i = 0; i < ndev; ++i) {
      allocators.push_back(std::make_unique<CachingAllocator>());
      workers.push_back(std::make_unique<DeviceWorker>());
      dispatchers.push_back(std::make_unique<DeviceWorker>());
    }
    pool = std::make_unique<ThreadPool>(nthreads);
    g_requested_devices = ndev;
    g_requested_threads = nthreads;
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
  if (d.platform() != Platform::cpu || d.id() < 0 || d.id() >= int(rt.allocators.size()))
    throw BackendError(fmt::format("no such device {}: this process has {} CPU devices (CJAX_NUM_CPU_DEVICES)", d.str(),
                                   rt.allocators.size()));
  return *rt.allocators[size_t(d.id())];
}
}  // namespace

std::future<void> submit_to_device(const Device& d, std::function<void()> task) {
  allocator_for(d);  // validates the device
  return runtime().workers[size_t(d.id())]->submit(std::move(task));
}
std::future<void> submit_to_dispatch_queue(const Device& d, std::function<void()> task) {
  allocator_for(d);
  return runtime().dispatchers[size_t(d.id())]->submit(std::move(task));
}
std::thread::id device_worker_thread(const Device& d) {
  allocator_for(d);
  return runtime().workers[size_t(d.id())]->thread_id();
}

namespace {
// The CPU platform behind the backend seam (core/backend/backend.h).
class CpuBackend final : public Backend {
 public:
  Platform platform() const override { return Platform::cpu; }
  std::vector<Device> devices() override {
    std::vector<Device> out;
    for (int i = 0; i < int(runtime().allocators.size()); ++i) out.emplace_back(Platform::cpu, i);
    return out;
  }
  bool host_accessible() const override { return true; }
  void* allocate(const Device& d, size_t nbytes) override { return allocator_for(d).allocate(nbytes, d); }
  void deallocate(const Device& d, void* p, size_t nbytes) override { allocator_for(d).deallocate(p, nbytes); }
  MemoryStats memory_stats(const Device& d) override { return allocator_for(d).stats(); }
  void reset_peak_memory(const Device& d) override { allocator_for(d).reset_peak(); }
  void copy_to_host(const Device&, const void* src, void* dst, size_t n) override { std::memcpy(dst, src, n); }
  void copy_from_host(const Device&, void* dst, const void* src, size_t n) override { std::memcpy(dst, src, n); }
  void synchronize(const Device&) override {}
  KernelCompiler* kernel_compiler() override { return &llvm_kernel_compiler(); }
  std::shared_ptr<BufferCommunicator> communicator(std::span<const Device> group) override {
    auto timeout = std::chrono::milliseconds(int64_t(config::collective_timeout_seconds() * 1000));
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
void set_num_threads(int n) {
  if (n <= 0) throw ValueError(fmt::format("set_num_threads({}): the count must be positive", n));
  if (g_started && g_requested_threads.load() != n)
    throw BackendError(
        fmt::format("set_num_threads({}) called after the runtime started with {} threads; "
                    "call it before creating any array, or set CJAX_NUM_THREADS",
                    n, g_requested_threads.load()));
  g_requested_threads = n;
}
}  // namespace config

int num_threads() { return runtime().pool->size(); }
bool in_parallel_region() { return ThreadPool::tl_in_region; }

void parallel_for_impl(int64_t n, int64_t grain, RangeFn fn) {
  if (n <= 0) return;
  auto& pool = *runtime().pool;
  grain = std::max<int64_t>(grain, 1);
  int64_t nchunks = std::min<int64_t>((n + grain - 1) / grain, int64_t(pool.size()) * 4);
  if (nchunks <= 1 || pool.size() == 1 || in_parallel_region()) {
    fn(0, n);
    return;
  }
  pool.run(n, nchunks, fn);
}

BlasSingleThreadScope::BlasSingleThreadScope() : previous_(openblas_get_num_threads()) {
  if (previous_ != 1) openblas_set_num_threads(1);
}
BlasSingleThreadScope::~BlasSingleThreadScope() {
  if (previous_ != 1) openblas_set_num_threads(previous_);
}

}  // namespace cjax
