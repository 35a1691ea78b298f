// The intra-op thread pool of core/backend/parallel.h: a host facility shared by every CPU
// kernel and host loop, whatever the platform of the devices (one pool per process, sized to the
// cores or CJAX_NUM_THREADS, started at its first use).
#include "core/backend/parallel.h"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

#include "cjax/device.h"
#include "cjax/errors.h"
#include "core/backend/backend.h"

namespace cjax {

namespace {

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

// Keeps pool workers off the CPU of the thread that hands them a job. Where the kernel sees no
// cache shared between two CPUs (a Firecracker VM's vCPUs each report a last-level cache of their
// own), it does not look for an idle CPU when a thread wakes another: the woken worker lands on
// its waker's CPU, and the load balancer left the two sharing one CPU for tens of milliseconds
// while the other idled. A GEMM then ran at one core's speed in bursty eager code (the GEMM
// benchmark's 256^3 row: 340 us instead of 150 us, in most of its runs).
//
// The caller places the workers before it publishes a job: each may run on any allowed CPU but
// the caller's. This is redone only when the caller runs on another CPU than at the last job, so
// a loop of jobs from one thread makes no system call. The caller must do it, not the worker: a
// worker pinned to one CPU that its next caller then occupies (a jit call's dispatch thread
// placed where the worker was pinned) cannot even run to move itself; it waited behind its own
// caller for a whole time slice (1.5-5 ms), and a row softmax of f32[4096,4096] took 5-6 ms
// instead of 3.3. Only when the pool has fewer threads than allowed CPUs; with more, workers
// share CPUs anyway and are left to the scheduler. The caller's own affinity is never changed.
class CpuSpread {
 public:
  explicit CpuSpread(int workers) : worker_tids_(size_t(std::max(workers, 0))) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) != 0) return;
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) allowed_.push_back(c);
    enabled_ = workers >= 1 && size_t(workers) + 1 <= allowed_.size();
  }
  // On each worker's own thread, before it takes any job.
  void register_worker(int index) { worker_tids_[size_t(index - 1)].store(int(gettid()), std::memory_order_release); }
  std::vector<int> worker_tids() const {
    std::vector<int> out;
    for (const auto& t : worker_tids_) out.push_back(t.load(std::memory_order_acquire));
    return out;
  }
  // On the caller's thread, under the pool's run lock.
  void place_workers() {
    if (!enabled_) return;
    int cpu = sched_getcpu();
    if (cpu < 0 || cpu == placed_for_) return;
    cpu_set_t others;
    CPU_ZERO(&others);
    for (int c : allowed_)
      if (c != cpu) CPU_SET(c, &others);
    bool all = true;
    for (auto& tid : worker_tids_) {
      int t = tid.load(std::memory_order_acquire);
      // Best effort: a worker not started yet, or a failed call, is placed at the next change.
      all = all && t > 0 && sched_setaffinity(t, sizeof others, &others) == 0;
    }
    if (all) placed_for_ = cpu;
  }

 private:
  std::vector<int> allowed_;
  std::vector<std::atomic<int>> worker_tids_;
  bool enabled_ = false;  // fewer pool threads than allowed CPUs
  int placed_for_ = -1;
};

// The thread pool: workers wait for a job (a chunked range); the caller takes part too.
class ThreadPool {
 public:
  explicit ThreadPool(int n) : n_(n), spread_(n - 1) {
    for (int i = 1; i < n; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
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
  std::vector<int> worker_tids() const { return spread_.worker_tids(); }

  void run(int64_t n, int64_t nchunks, RangeFn fn) {
    std::unique_lock<std::mutex> run_lock(run_mu_);  // one parallel job at a time
    Job job(fn);
    job.n = n;
    job.nchunks = nchunks;
    spread_.place_workers();
    {
      std::lock_guard<std::mutex> lock(mu_);
      job_ = &job;
      ++generation_;
      published_.store(generation_, std::memory_order_release);
    }
    cv_.notify_all();
    work_on(job);
    // Waits for the job's other threads, helping with a nested job meanwhile.
    std::unique_lock<std::mutex> lock(mu_, std::defer_lock);
    for (;;) {
      spin_until(
          [&] { return job.settled.load(std::memory_order_acquire) || nested_open_.load(std::memory_order_acquire); });
      lock.lock();
      if (!help_nested(lock)) {
        done_cv_.wait(lock, [&] { return job.done() || nested_has_work(); });
        // Only the job's end ends the wait. Woken for a nested job's chunks, the next round helps
        // with them, if its owner (who takes them without the lock) has left any: leaving when it
        // had not returned the job while its last chunk ran (1 run in 40 of the sharded sample).
        if (job.done()) break;
      }
      lock.unlock();
    }
    job_ = nullptr;
    if (job.error) std::rethrow_exception(job.error);
  }

  // A kernel_parallel_for issued inside a job's chunk. While the job still has chunks nobody has
  // taken, every thread has work of its own and this one runs inline (returns false). In the
  // job's tail, threads that have finished their chunks would idle until the last chunk ends: the
  // range is offered to them as a nested job, in the same chunks as at top level, and the caller
  // works on it too. One nested job at a time.
  bool try_run_nested(int64_t n, int64_t nchunks, RangeFn fn) {
    std::unique_lock<std::mutex> lock(mu_);
    if (nested_ || !job_ || job_->next.load(std::memory_order_relaxed) < job_->nchunks) return false;
    Job nested(fn);
    nested.n = n;
    nested.nchunks = nchunks;
    nested_ = &nested;
    nested_open_.store(true, std::memory_order_release);
    lock.unlock();
    cv_.notify_all();
    done_cv_.notify_all();
    work_on(nested);
    spin_until([&] { return nested.settled.load(std::memory_order_acquire); });
    lock.lock();
    done_cv_.wait(lock, [&] { return nested.done(); });
    nested_ = nullptr;
    nested_open_.store(false, std::memory_order_release);
    lock.unlock();
    if (nested.error) std::rethrow_exception(nested.error);
    return true;
  }

 private:
  struct Job {
    explicit Job(RangeFn f) : fn(f) {}
    RangeFn fn;
    int64_t n = 0, nchunks = 0;
    std::atomic<int64_t> next{0};
    int64_t finished = 0;              // guarded by mu_
    int active = 0;                    // workers inside work_on; guarded by mu_
    std::atomic<bool> settled{false};  // done(), readable without mu_ (for spinning)
    std::exception_ptr error;
    bool done() const { return finished == nchunks && active == 0; }  // under mu_
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
      if (job.done()) job.settled.store(true, std::memory_order_release);
      if (job.finished == job.nchunks) done_cv_.notify_all();
    }
  }
  bool nested_has_work() const { return nested_ && nested_->next.load(std::memory_order_relaxed) < nested_->nchunks; }
  // Works on the nested job's chunks, if it has some left. Called and returns with `lock` (mu_) held.
  bool help_nested(std::unique_lock<std::mutex>& lock) {
    if (!nested_has_work()) return false;
    Job* nested = nested_;
    ++nested->active;
    lock.unlock();
    work_on(*nested);
    lock.lock();
    leave(*nested);
    return true;
  }
  // A helping thread is done with `job`'s chunks (under mu_).
  void leave(Job& job) {
    --job.active;
    if (job.done()) job.settled.store(true, std::memory_order_release);
    done_cv_.notify_all();
  }
  void worker_loop(int index) {
    spread_.register_worker(index);
    uint64_t seen = 0;
    for (;;) {
      Job* job;
      spin_until([&] {
        return published_.load(std::memory_order_acquire) != seen || nested_open_.load(std::memory_order_acquire);
      });
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || (job_ && generation_ != seen) || nested_has_work(); });
        if (stop_) return;
        if (!job_ || generation_ == seen) {
          help_nested(lock);
          continue;
        }
        seen = generation_;
        job = job_;
        ++job->active;
      }
      work_on(*job);
      std::lock_guard<std::mutex> lock(mu_);
      leave(*job);
    }
  }
  int n_;
  CpuSpread spread_;  // before workers_: the workers register with it
  std::vector<std::thread> workers_;
  std::mutex mu_, run_mu_;
  std::condition_variable cv_, done_cv_;
  Job* job_ = nullptr;
  Job* nested_ = nullptr;                 // guarded by mu_
  std::atomic<bool> nested_open_{false};  // nested_ is set (readable without mu_, for spinning)
  uint64_t generation_ = 0;
  std::atomic<uint64_t> published_{0};  // generation_, readable without mu_ (for spinning)
  bool stop_ = false;
};
thread_local bool ThreadPool::tl_in_region = false;

std::atomic<bool> g_pool_started{false};
ThreadPool& pool() {
  static ThreadPool p([] {
    int hw = int(std::max(1u, std::thread::hardware_concurrency()));
    int n = g_requested_threads.load() ? g_requested_threads.load() : positive_env_int("CJAX_NUM_THREADS", hw);
    g_requested_threads = n;
    g_pool_started = true;
    return n;
  }());
  return p;
}
}  // namespace

namespace config {
void set_num_threads(int n) {
  if (n <= 0) throw ValueError(fmt::format("set_num_threads({}): the count must be positive", n));
  if (g_pool_started && g_requested_threads.load() != n)
    throw BackendError(
        fmt::format("set_num_threads({}) called after the thread pool started with {} threads; "
                    "call it before creating any array, or set CJAX_NUM_THREADS",
                    n, g_requested_threads.load()));
  g_requested_threads = n;
}
}  // namespace config

int num_threads() { return pool().size(); }
bool in_parallel_region() { return ThreadPool::tl_in_region; }
std::vector<int> thread_pool_worker_tids() { return pool().worker_tids(); }

void parallel_for_impl(int64_t n, int64_t grain, RangeFn fn, bool shareable) {
  if (n <= 0) return;
  ThreadPool& p = pool();
  grain = std::max<int64_t>(grain, 1);
  int64_t nchunks = std::min<int64_t>((n + grain - 1) / grain, int64_t(p.size()) * 4);
  if (nchunks <= 1 || p.size() == 1) {
    fn(0, n);
    return;
  }
  if (in_parallel_region()) {
    if (!shareable || !p.try_run_nested(n, nchunks, fn)) fn(0, n);
    return;
  }
  p.run(n, nchunks, fn);
}

}  // namespace cjax
