// Device memory. A Buffer owns one allocation on one device, taken from (and returned to) that
// device's caching allocator, so memory stats and reuse work for every array.
#pragma once
#include <cstddef>
#include <memory>

#include "cjax/device.h"

namespace cjax {

// Implemented by the backend of the device's platform (backends/cpu/runtime.cpp).
void* device_allocate(const Device& d, size_t nbytes);
void device_deallocate(const Device& d, void* p, size_t nbytes);

class Buffer {
 public:
  Buffer(Device device, size_t nbytes) : device_(device), nbytes_(nbytes), data_(device_allocate(device, nbytes)) {}
  // The shard of a device of another process (a multi-process run): a size and a device, no data
  // here. Readers check addressable() first (core/distributed/global_arrays.cpp raises for them).
  struct Remote {};
  Buffer(Remote, Device device, size_t nbytes)
      : device_(device), nbytes_(nbytes), data_(nullptr), addressable_(false) {}
  // Another device's handle on `base`'s memory, for results that are the same on several devices
  // of one host (an all_gather or psum over CPU virtual devices): one copy instead of one per
  // device. Neither handle may then be written in place (exclusively_held).
  Buffer(Device device, std::shared_ptr<Buffer> base)
      : device_(device), nbytes_(base->nbytes()), data_(base->data()), base_(std::move(base)) {}
  ~Buffer() {
    if (addressable_ && !base_) device_deallocate(device_, data_, nbytes_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  const Device& device() const { return device_; }
  bool addressable() const { return addressable_; }
  bool shares_memory() const { return base_ != nullptr; }

 private:
  Device device_;
  size_t nbytes_;
  void* data_;
  bool addressable_ = true;
  std::shared_ptr<Buffer> base_;  // set: a view of base_'s memory
};

// No other array (on this device or another) reads `b`'s memory: a kernel may write over it.
inline bool exclusively_held(const std::shared_ptr<Buffer>& b) { return b.use_count() == 1 && !b->shares_memory(); }

}  // namespace cjax
