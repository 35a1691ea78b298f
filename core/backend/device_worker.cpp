// Per-device workers (core/backend/device_worker.h): host threads, one per device and purpose,
// started at first use. They drive a device of any platform; what runs on the device itself is
// queued on its streams by the kernels the tasks launch.
#include "core/backend/device_worker.h"

#include <absl/container/flat_hash_map.h>

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>

#include "core/backend/backend.h"

namespace cjax {
namespace {

// A device's worker: one thread draining a FIFO queue of tasks.
class DeviceWorker {
 public:
  ~DeviceWorker() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  std::future<void> submit(std::function<void()> task) {
    std::packaged_task<void()> pt(std::move(task));
    std::future<void> f = pt.get_future();
    {
      std::lock_guard<std::mutex> lock(mu_);
      start_locked();
      queue_.push_back(std::move(pt));
    }
    cv_.notify_one();
    return f;
  }
  std::thread::id thread_id() {
    std::lock_guard<std::mutex> lock(mu_);
    start_locked();
    return thread_.get_id();
  }

 private:
  void start_locked() {
    if (!thread_.joinable()) thread_ = std::thread([this] { loop(); });
  }
  void loop() {
    for (;;) {
      std::packaged_task<void()> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stop requested and drained
        task = std::move(queue_.front());
        queue_.pop_front();
      }
      task();  // exceptions are stored in the task's future
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::packaged_task<void()>> queue_;
  std::thread thread_;
  bool stop_ = false;
};

enum class Queue { device, dispatch };

DeviceWorker& worker_for(const Device& d, Queue q) {
  check_device(d);
  static std::mutex mu;
  static absl::flat_hash_map<std::tuple<int, int, int>, std::unique_ptr<DeviceWorker>> workers;
  std::lock_guard lock(mu);
  auto& w = workers[{int(d.platform()), d.id(), int(q)}];
  if (!w) w = std::make_unique<DeviceWorker>();
  return *w;
}
}  // namespace

std::future<void> submit_to_device(const Device& d, std::function<void()> task) {
  return worker_for(d, Queue::device).submit(std::move(task));
}
std::future<void> submit_to_dispatch_queue(const Device& d, std::function<void()> task) {
  return worker_for(d, Queue::dispatch).submit(std::move(task));
}
std::thread::id device_worker_thread(const Device& d) { return worker_for(d, Queue::device).thread_id(); }

}  // namespace cjax
