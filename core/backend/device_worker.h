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
// Enqueues a dispatched program (an async jit call) on the device's dispatch queue: FIFO, one
// thread per device, distinct from the device worker (which runs SPMD bodies for it).
std::future<void> submit_to_dispatch_queue(const Device& device, std::function<void()> task);
// The id of the device's worker thread (starts it if needed).
std::thread::id device_worker_thread(const Device& device);

}  // namespace cjax
