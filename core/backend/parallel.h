// The one intra-op thread pool (sized to the cores). Kernels split index ranges over it; a
// parallel_for inside another runs on the calling thread (no oversubscription). A kernel over raw
// memory uses kernel_parallel_for instead: inside another range's tail (once the outer chunks are
// all taken) its chunks are shared with the threads that finished theirs, so a lockstep SPMD
// body's last device segment lends its GEMM, attention and fused-kernel chunks to the threads
// that ran the other devices.
#pragma once
#include <cstdint>
#include <type_traits>
#include <vector>

namespace cjax {

int num_threads();
bool in_parallel_region();
// The kernel thread ids of the pool's workers (the caller of a job is not one of them), for tests
// of their placement: each may run on every allowed CPU except the one its last caller ran on.
std::vector<int> thread_pool_worker_tids();
// A non-owning reference to a callable taking (begin, end): no allocation, unlike std::function.
class RangeFn {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, RangeFn>>>
  RangeFn(F& f)
      : obj_(static_cast<void*>(&f)), call_([](void* o, int64_t b, int64_t e) { (*static_cast<F*>(o))(b, e); }) {}
  void operator()(int64_t b, int64_t e) const { call_(obj_, b, e); }

 private:
  void* obj_;
  void (*call_)(void*, int64_t, int64_t);
};
void parallel_for_impl(int64_t n, int64_t grain, RangeFn fn, bool shareable);

namespace detail {
template <class F>
inline void split_range(int64_t n, int64_t grain, F& fn, bool shareable) {
  if (n <= 0) return;
  if (n <= grain) {
    fn(int64_t(0), n);
    return;
  }
  parallel_for_impl(n, grain, RangeFn(fn), shareable);
}
}  // namespace detail

// Calls fn(begin, end) over [0, n) in chunks of at least `grain` elements. Runs inline when the
// range is small, when one thread is configured, or when called from inside a parallel region.
// Chunk boundaries depend only on n, grain and the thread count.
template <class F>
inline void parallel_for(int64_t n, int64_t grain, F&& fn) {
  detail::split_range(n, grain, fn, false);
}

// parallel_for for a kernel whose chunks only read and write the memory they are given: no
// arrays, traces, scopes or other thread-local state of the caller (a thread_local scratch
// buffer of the kernel's own is fine), and results that do not depend on how [0, n) is split
// (each index a fixed piece of work: a tile, a block of rows), since inside another range the
// chunks run either as one call over [0, n) or, in that range's tail, on the idle threads.
template <class F>
inline void kernel_parallel_for(int64_t n, int64_t grain, F&& fn) {
  detail::split_range(n, grain, fn, true);
}

}  // namespace cjax
