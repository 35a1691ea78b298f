#include "backends/cpu/kernels/scratch.h"

#include <algorithm>
#include <bit>
#include <new>
#include <utility>
#include <vector>

namespace cjax::cpu {
namespace {

constexpr std::align_val_t kAlign{64};

// Sizes rounded up to 1/8 of their power of two (4 KiB at least), so that requests of similar
// sizes share blocks.
size_t round_capacity(size_t n) {
  size_t step = std::max<size_t>(std::bit_floor(std::max<size_t>(n, 1)) / 8, 4096);
  return (n + step - 1) / step * step;
}

struct ThreadCache {
  std::vector<std::pair<size_t, std::byte*>> blocks;  // (capacity, block), unordered
  size_t bytes = 0;
  ~ThreadCache() {
    for (auto& [cap, p] : blocks) ::operator delete(p, kAlign);
    blocks.clear();
    bytes = 0;
    gone = true;
  }
  // Set once the thread's cache is destroyed (thread exit): later releases free directly.
  static thread_local bool gone;

  // The smallest cached block that holds n bytes and is at most twice the block n would get new,
  // removed from the cache; of equal ones the last given back (its lines may still be in cache).
  std::byte* take(size_t n, size_t& capacity) {
    size_t best = blocks.size(), most = 2 * round_capacity(n);
    for (size_t i = blocks.size(); i-- > 0;)
      if (blocks[i].first >= n && blocks[i].first <= most &&
          (best == blocks.size() || blocks[i].first < blocks[best].first))
        best = i;
    if (best == blocks.size()) return nullptr;
    auto [cap, p] = blocks[best];
    blocks.erase(blocks.begin() + std::ptrdiff_t(best));
    bytes -= cap;
    capacity = cap;
    return p;
  }
  void give(std::byte* p, size_t capacity) {
    if (bytes + capacity > ScratchBuffer::kMaxCachedBytes) {
      ::operator delete(p, kAlign);
      return;
    }
    blocks.emplace_back(capacity, p);
    bytes += capacity;
  }
};
thread_local bool ThreadCache::gone = false;

ThreadCache& thread_cache() {
  thread_local ThreadCache cache;
  return cache;
}

}  // namespace

void ScratchBuffer::reserve(size_t nbytes) {
  if (p_ && capacity_ >= nbytes) return;
  release();
  if (nbytes == 0) return;
  if (!ThreadCache::gone) p_ = thread_cache().take(nbytes, capacity_);
  if (!p_) {
    capacity_ = round_capacity(nbytes);
    p_ = static_cast<std::byte*>(::operator new(capacity_, kAlign));
  }
}

void ScratchBuffer::release() {
  if (!p_) return;
  if (ThreadCache::gone)
    ::operator delete(p_, kAlign);
  else
    thread_cache().give(p_, capacity_);
  p_ = nullptr;
  capacity_ = 0;
}

ScratchBuffer& ScratchBuffer::operator=(ScratchBuffer&& o) noexcept {
  if (this != &o) {
    release();
    p_ = std::exchange(o.p_, nullptr);
    capacity_ = std::exchange(o.capacity_, 0);
  }
  return *this;
}

}  // namespace cjax::cpu
