// The one intra-op thread pool (sized to the cores). Kernels split index ranges over it; a
// parallel_for inside another runs serially on the calling thread (no oversubscription).
#pragma once
#include <cstdint>
#include <functional>

namespace cjax {

int num_threads();
bool in_parallel_region();
// Calls fn(begin, end) over [0, n) in chunks of at least `grain` elements. Runs inline when the
// range is small, when one thread is configured, or when called from inside a parallel region.
// Chunk boundaries depend only on n, grain and the thread count, so reductions that combine
// per-chunk results in chunk order are deterministic.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// BLAS threading: OpenBLAS runs its own threads for one large call from the caller; inside our
// parallel regions it must run on one thread. This guard pins it for the guard's lifetime.
class BlasSingleThreadScope {
 public:
  BlasSingleThreadScope();
  ~BlasSingleThreadScope();

 private:
  int previous_;
};

}  // namespace cjax
