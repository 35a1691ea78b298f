// A CPU emulator for the CUDA C++ that backends/cuda/kernels/fused.cpp generates, so that CI
// (no GPU) runs the generated source itself: compiled as host C++, a block's threads run as
// fibers (ucontext) on one OS thread, switching at __syncthreads() and at warp shuffles, which
// every thread of a block must reach in the same order (a divergent barrier raises). Blocks run
// one after another, so `__shared__` (static storage) is the running block's shared memory; it
// is filled with NaN bytes before each block so that a read before its write shows. Threads run
// in forward or random order between barriers: a missing barrier makes results depend on it.
#pragma once
#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "cjax/dtype.h"

#if defined(__SANITIZE_ADDRESS__)
extern "C" void __sanitizer_start_switch_fiber(void** fake_stack_save, const void* bottom, size_t size);
extern "C" void __sanitizer_finish_switch_fiber(void* fake_stack_save, const void** bottom_old, size_t* size_old);
#endif

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__ static
// A kernel's shared array: static storage, registered (and poisoned) on first use.
#define CJ_SHARED(type, name, dims)                                                  \
  static type name dims;                                                             \
  static const bool name##_registered = cj_emu::register_shared(name, sizeof(name)); \
  (void)name##_registered

namespace cj_emu {

struct Dim3 {
  unsigned x = 0, y = 0, z = 0;
};
inline Dim3 g_thread, g_block, g_block_dim, g_grid_dim;

enum class Wait : uint8_t { None, Barrier, Shuffle, Done };

class Block {
 public:
  static Block*& current() {
    static Block* b = nullptr;
    return b;
  }

  // Runs body() for threads 0..n-1 of block `block`; `random_order` shuffles who runs first
  // between barriers.
  void run(unsigned n, const std::function<void()>& body, std::mt19937* random_order) {
    body_ = &body;
    if (fibers_.size() < n) fibers_.resize(n);
    for (unsigned t = 0; t < n; ++t) {
      Fiber& f = fibers_[t];
      if (!f.stack) f.stack.reset(new char[kStack]);
      getcontext(&f.ctx);
      f.ctx.uc_stack.ss_sp = f.stack.get();
      f.ctx.uc_stack.ss_size = kStack;
      f.ctx.uc_link = &scheduler_;
      makecontext(&f.ctx, &Block::entry, 0);
      f.wait = Wait::None;
    }
    slots_.assign(n, 0);
    current() = this;
    std::vector<unsigned> order(n);
    for (unsigned t = 0; t < n; ++t) order[t] = t;
    for (;;) {
      if (random_order) std::shuffle(order.begin(), order.end(), *random_order);
      for (unsigned t : order) {
        Fiber& f = fibers_[t];
        if (f.wait != Wait::None) continue;
        running_ = t;
        g_thread.x = t;
        switch_to(f);
        if (f.wait == Wait::None) f.wait = Wait::Done;  // returned through uc_link
      }
      unsigned done = 0, barrier = 0;
      for (unsigned t = 0; t < n; ++t) {
        done += fibers_[t].wait == Wait::Done;
        barrier += fibers_[t].wait == Wait::Barrier;
      }
      if (done == n) break;
      // A warp whose lanes all wait at a shuffle goes on; else, when every thread still running
      // waits at __syncthreads, the block goes on; anything else is a divergent barrier.
      bool released = false;
      for (unsigned w = 0; w < n; w += 32) {
        unsigned end_lane = std::min(n, w + 32), at_shuffle = 0;
        for (unsigned t = w; t < end_lane; ++t) at_shuffle += fibers_[t].wait == Wait::Shuffle;
        if (at_shuffle == 0) continue;
        if (at_shuffle != end_lane - w)
          throw std::runtime_error("cuda emulator: a warp shuffle that not every lane of warp " +
                                   std::to_string(w / 32) + " reaches");
        for (unsigned t = w; t < end_lane; ++t) fibers_[t].wait = Wait::None;
        released = true;
      }
      if (released) continue;
      if (barrier + done != n) throw std::runtime_error("cuda emulator: threads of a block wait at different barriers");
      for (unsigned t = 0; t < n; ++t)
        if (fibers_[t].wait == Wait::Barrier) fibers_[t].wait = Wait::None;
    }
    current() = nullptr;
  }

  void wait(Wait kind) {
    fibers_[running_].wait = kind;
    switch_back();
  }
  uint64_t& slot(unsigned t) { return slots_.at(t); }
  unsigned running() const { return running_; }
  size_t threads() const { return slots_.size(); }

 private:
  static constexpr size_t kStack = size_t(256) << 10;
  struct Fiber {
    ucontext_t ctx;
    std::unique_ptr<char[]> stack;
    Wait wait = Wait::None;
  };
  static void entry() {
    Block* b = current();
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_finish_switch_fiber(nullptr, &b->sched_bottom_, &b->sched_size_);  // came from the scheduler
#endif
    (*b->body_)();
    b->fibers_[b->running_].wait = Wait::Done;
#if defined(__SANITIZE_ADDRESS__)
    __sanitizer_start_switch_fiber(nullptr, b->sched_bottom_, b->sched_size_);
#endif
  }
  void switch_to(Fiber& f) {
#if defined(__SANITIZE_ADDRESS__)
    void* save = nullptr;
    __sanitizer_start_switch_fiber(&save, f.stack.get(), kStack);
    swapcontext(&scheduler_, &f.ctx);
    __sanitizer_finish_switch_fiber(save, nullptr, nullptr);
#else
    swapcontext(&scheduler_, &f.ctx);
#endif
  }
  void switch_back() {
#if defined(__SANITIZE_ADDRESS__)
    void* save = nullptr;
    __sanitizer_start_switch_fiber(&save, sched_bottom_, sched_size_);
    swapcontext(&fibers_[running_].ctx, &scheduler_);
    __sanitizer_finish_switch_fiber(save, &sched_bottom_, &sched_size_);
#else
    swapcontext(&fibers_[running_].ctx, &scheduler_);
#endif
  }

  const std::function<void()>* body_ = nullptr;
  std::vector<Fiber> fibers_;
  std::vector<uint64_t> slots_;
  ucontext_t scheduler_;
  unsigned running_ = 0;
  const void* sched_bottom_ = nullptr;
  size_t sched_size_ = 0;
};

// Shared arrays of the running kernel, poisoned (NaN bytes) before each block.
struct SharedRegistry {
  std::vector<std::pair<void*, size_t>> areas;
  void poison() {
    for (auto [p, n] : areas) std::memset(p, 0xff, n);
  }
};
inline SharedRegistry& shared_registry() {
  static SharedRegistry r;
  return r;
}
inline bool register_shared(void* p, size_t n) {
  shared_registry().areas.emplace_back(p, n);
  std::memset(p, 0xff, n);
  return true;
}

template <class T>
T shfl_xor(T v, int lane_mask) {
  Block& b = *Block::current();
  unsigned t = b.running();
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  b.slot(t) = bits;
  b.wait(Wait::Shuffle);  // every lane of the warp has written
  unsigned warp_base = t & ~31u, partner = warp_base | ((t & 31u) ^ unsigned(lane_mask));
  uint64_t other = partner < b.threads() ? b.slot(partner) : bits;
  b.wait(Wait::Shuffle);  // every lane has read before the next shuffle writes
  T r;
  std::memcpy(&r, &other, sizeof(T));
  return r;
}

// Launches `kernel(args)` over grid x block threads, blocks in order.
inline void launch(unsigned grid, unsigned block, const std::function<void()>& kernel, std::mt19937* random_order) {
  static Block b;
  g_block_dim.x = block;
  g_grid_dim.x = grid;
  for (unsigned g = 0; g < grid; ++g) {
    g_block.x = g;
    shared_registry().poison();
    b.run(block, kernel, random_order);
  }
}

}  // namespace cj_emu

#define threadIdx (cj_emu::g_thread)
#define blockIdx (cj_emu::g_block)
#define blockDim (cj_emu::g_block_dim)
#define gridDim (cj_emu::g_grid_dim)

inline void __syncthreads() { cj_emu::Block::current()->wait(cj_emu::Wait::Barrier); }
template <class T>
T __shfl_xor_sync(unsigned, T v, int lane_mask) {
  return cj_emu::shfl_xor(v, lane_mask);
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline double __longlong_as_double(long long i) {
  double d;
  std::memcpy(&d, &i, 8);
  return d;
}

// The prelude of backends/cuda/kernels/codegen.cpp and fused.cpp, on the host.
inline float cj_from_bf16(unsigned short h) { return __uint_as_float(unsigned(h) << 16); }
inline unsigned short cj_to_bf16(float f) { return cjax::bfloat16_t::from_float(f); }
inline float cj_from_f16(unsigned short h) { return cjax::float16_t::to_float(h); }
inline unsigned short cj_to_f16(float f) { return cjax::float16_t::from_float(f); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
template <class T>
T cj_fmax(T x, T y) {
  return x != x ? x : y != y ? y : (x > y ? x : y);
}
template <class T>
T cj_fmin(T x, T y) {
  return x != x ? x : y != y ? y : (x < y ? x : y);
}
template <class T>
T cj_max(T x, T y) {
  return x > y ? x : y;
}
template <class T>
T cj_min(T x, T y) {
  return x < y ? x : y;
}
template <class T>
T cj_shfl_xor(T v, int o) {
  return cj_emu::shfl_xor(v, o);
}
template <int N>
void cj_vcopy(void* to, const void* from) {
  std::memcpy(to, from, N);
}
inline void cj_round2_bf16(float& a, float& b) {
  a = cj_from_bf16(cj_to_bf16(a));
  b = cj_from_bf16(cj_to_bf16(b));
}
