// In-process communicator for the virtual CPU devices (core/array/spmd.h): every device deposits its
// values, the last to arrive publishes the whole set, and each device then reads the others'
// blocks in place (no copy). Mismatched collectives, a device that finishes or fails while others
// wait, and waits longer than the collective timeout raise CollectiveError on every waiting
// device instead of hanging.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "cjax/collectives.h"
#include "cjax/errors.h"
#include "core/array/spmd.h"

namespace cjax {

class InProcessCommunicator final : public Communicator {
 public:
  explicit InProcessCommunicator(int64_t n) : n_(n), slots_(size_t(n)), whats_(size_t(n)), done_(size_t(n), false) {}

  std::vector<std::vector<Array>> exchange(int64_t device, std::vector<Array> values,
                                           const std::string& what) override {
    std::unique_lock lk(m_);
    if (failed_) throw CollectiveError(failure_);
    for (int64_t d = 0; d < n_; ++d)
      if (done_[size_t(d)])
        fail_locked(
            fmt::format("device {} finished the shard_map body while device {} waits at {}: the devices ran "
                        "different collectives (for example a collective inside a cond branch that only some "
                        "devices took)",
                        d, device, what));
    slots_[size_t(device)] = std::move(values);
    whats_[size_t(device)] = what;
    ++arrived_;
    uint64_t gen = generation_;
    if (arrived_ == n_) {
      for (int64_t d = 1; d < n_; ++d)
        if (whats_[size_t(d)] != whats_[0]) {
          std::vector<std::string> lines;
          for (int64_t k = 0; k < n_; ++k) lines.push_back(fmt::format("  device {}: {}", k, whats_[size_t(k)]));
          fail_locked(
              fmt::format("the devices of a shard_map arrived at different collectives:\n{}\nEvery device must "
                          "run the same collectives in the same order",
                          fmt::join(lines, "\n")));
        }
      published_ = std::make_shared<std::vector<std::vector<Array>>>(std::move(slots_));
      slots_.assign(size_t(n_), {});
      whats_.assign(size_t(n_), {});
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return *published_;
    }
    auto timeout = std::chrono::duration<double>(config::collective_timeout_seconds());
    if (!cv_.wait_for(lk, timeout, [&] { return generation_ != gen || failed_; })) {
      fail_locked(
          fmt::format("timed out after {} s waiting at {}: {} of {} devices arrived (raise the limit with "
                      "config::set_collective_timeout_seconds or CJAX_COLLECTIVE_TIMEOUT_S)",
                      config::collective_timeout_seconds(), what, arrived_, n_));
    }
    if (failed_) throw CollectiveError(failure_);
    return *published_;
  }

  void barrier(int64_t device, const std::string& what) override { exchange(device, {}, what + " (barrier)"); }

  void done(int64_t device) {
    std::lock_guard lk(m_);
    done_[size_t(device)] = true;
    if (arrived_ > 0 && !failed_) {
      std::string waiting;
      for (int64_t d = 0; d < n_; ++d)
        if (!whats_[size_t(d)].empty() && !done_[size_t(d)]) waiting = whats_[size_t(d)];
      fail_locked(
          fmt::format("device {} finished the shard_map body while {} device(s) wait at {}: the devices ran "
                      "different collectives (for example a collective inside a cond branch that only some "
                      "devices took)",
                      device, arrived_, waiting));
    }
  }
  void failed(int64_t device, const std::string& what) {
    std::lock_guard lk(m_);
    if (!failed_) fail_locked(fmt::format("device {} failed: {}", device, what), false);
  }

 private:
  void fail_locked(std::string msg, bool raise = true) {
    failed_ = true;
    failure_ = std::move(msg);
    cv_.notify_all();
    if (raise) throw CollectiveError(failure_);
  }
  int64_t n_;
  std::mutex m_;
  std::condition_variable cv_;
  std::vector<std::vector<Array>> slots_;
  std::vector<std::string> whats_;
  std::vector<bool> done_;
  std::shared_ptr<std::vector<std::vector<Array>>> published_;
  int64_t arrived_ = 0;
  uint64_t generation_ = 0;
  bool failed_ = false;
  std::string failure_;
};

std::shared_ptr<Communicator> make_in_process_communicator(int64_t num_devices) {
  return std::make_shared<InProcessCommunicator>(num_devices);
}
void communicator_device_done(Communicator& comm, int64_t device) {
  if (auto* c = dynamic_cast<InProcessCommunicator*>(&comm)) c->done(device);
}
void communicator_device_failed(Communicator& comm, int64_t device, const std::string& what) {
  if (auto* c = dynamic_cast<InProcessCommunicator*>(&comm)) c->failed(device, what);
}

}  // namespace cjax
