// The one intra-op thread pool (sized to the cores). Kernels split index ranges over it. A
// parallel_for inside another runs on the calling thread (no oversubscription), except in the
// outer one's tail: once the outer range's chunks are all taken, threads that finished theirs join
// the inner range (a lockstep SPMD body's last device segment lends its kernels' chunks to the
// threads that ran the other devices).
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
// range is small, when one thread is configured, or inside a parallel region (see above: the
// inner range is then either one call over [0, n) or the top-level chunks). fn's results must not
// depend on how [0, n) is split or on which thread runs a chunk: kernels give each index a fixed
// piece of work (a tile, a block of rows, a fixed-size partial sum), never a per-chunk partial.
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
