#include "backends/cpu/kernels/scratch.h"

#include <new>
#include <utility>
#include <vector>

#include "backends/cpu/size_classes.h"

namespace cjax::cpu {
namespace {

constexpr std::align_val_t kAlign{kBlockAlignment};

struct ThreadCache {
  std::vector<std::pair<size_t, std::byte*>> blocks;  // (capacity, block), unordered
  size_t bytes = 0;
  ~ThreadCache() {
    for (auto& [cap, p] : blocks) ::operator delete(p, kAlign);
    gone = true;
  }
  // Set once the thread's cache is destroyed (thread exit): later releases free directly.
  static thread_local bool gone;

  // The smallest cached block that holds n bytes and is at most twice the block n would get new,
  // removed from the cache; of equal ones the last given back (its lines may still be in cache).
  std::byte* take(size_t n, size_t& capacity) {
    size_t best = blocks.size(), most = 2 * block_size_class(n);
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
    capacity_ = block_size_class(nbytes);
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
