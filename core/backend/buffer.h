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
  ~Buffer() {
    if (addressable_) device_deallocate(device_, data_, nbytes_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  const Device& device() const { return device_; }
  bool addressable() const { return addressable_; }

 private:
  Device device_;
  size_t nbytes_;
  void* data_;
  bool addressable_ = true;
};

}  // namespace cjax
