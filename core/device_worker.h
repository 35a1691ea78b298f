// Per-device workers. Every device owns one worker thread that runs submitted tasks in
// submission order (FIFO). Eager ops run on the caller's thread; staged executables, SPMD
// shard_map bodies and async dispatch run on the workers, one per device, concurrently.
#pragma once
#include <functional>
#include <future>
#include <thread>

#include "cjax/device.h"

namespace cjax {

// Enqueues `task` on the device's worker; the future completes (or rethrows the task's
// exception) when it has run. Workers start on first use.
std::future<void> submit_to_device(const Device& device, std::function<void()> task);
// The id of the device's worker thread (starts it if needed).
std::thread::id device_worker_thread(const Device& device);

}  // namespace cjax
