// The one intra-op thread pool (sized to the cores). Kernels split index ranges over it; a
// parallel_for inside another runs serially on the calling thread (no oversubscription).
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
void parallel_for_impl(int64_t n, int64_t grain, RangeFn fn);

// Calls fn(begin, end) over [0, n) in chunks of at least `grain` elements. Runs inline when the
// range is small, when one thread is configured, or when called from inside a parallel region.
// Chunk boundaries depend only on n, grain and the thread count, so reductions that combine
// per-chunk results in chunk order are deterministic.
template <class F>
inline void parallel_for(int64_t n, int64_t grain, F&& fn) {
  if (n <= 0) return;
  if (n <= grain) {
    fn(int64_t(0), n);
    return;
  }
  parallel_for_impl(n, grain, RangeFn(fn));
}

}  // namespace cjax
