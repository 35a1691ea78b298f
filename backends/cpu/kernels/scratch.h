// Temporary memory of one CPU kernel call (a GEMM's packed operands, a reduction's partial sums),
// taken from a cache of the calling thread.
//
// A training step asks for the same temporaries every time. From malloc, every large one goes back
// to the system when it is freed (glibc unmaps blocks above its mmap threshold and trims the free
// top of a heap), so the next step faults on each of its pages again: ~700 page faults per step of
// the transformer sample's FSDP layout, ~5% of its time on 2 cores. A ScratchBuffer returns its
// block to its thread's cache instead, where the next request of a size it fits takes it again.
// Each thread keeps at most kMaxCachedBytes; beyond that, freed blocks go back to malloc.
#pragma once
#include <cstddef>
#include <cstdint>

namespace cjax::cpu {

class ScratchBuffer {
 public:
  static constexpr size_t kMaxCachedBytes = size_t(256) << 20;
  ScratchBuffer() = default;
  explicit ScratchBuffer(size_t nbytes) { reserve(nbytes); }
  ~ScratchBuffer() { release(); }
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;
  ScratchBuffer(ScratchBuffer&& o) noexcept : p_(o.p_), capacity_(o.capacity_) { o.p_ = nullptr, o.capacity_ = 0; }
  ScratchBuffer& operator=(ScratchBuffer&& o) noexcept;

  // At least nbytes, 64-byte aligned; the contents are not kept when the block must grow.
  void reserve(size_t nbytes);
  std::byte* data() const { return p_; }
  template <class T>
  T* as() const {
    return reinterpret_cast<T*>(p_);
  }
  explicit operator bool() const { return p_ != nullptr; }

 private:
  void release();
  std::byte* p_ = nullptr;
  size_t capacity_ = 0;
};

// The same for n elements of T.
template <class T>
class ScratchArray {
 public:
  ScratchArray() = default;
  explicit ScratchArray(int64_t n) : buf_(size_t(n) * sizeof(T)) {}
  void resize(int64_t n) { buf_.reserve(size_t(n) * sizeof(T)); }
  T* data() const { return buf_.as<T>(); }
  T& operator[](int64_t i) const { return data()[i]; }
  explicit operator bool() const { return bool(buf_); }

 private:
  ScratchBuffer buf_;
};

}  // namespace cjax::cpu
