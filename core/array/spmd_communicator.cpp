// The communicator of one SPMD run (core/array/spmd.h): a rendezvous of all devices at every
// collective, which checks that they run the same program, plus one buffer communicator per group
// of devices, from their backend, which moves the blocks. Mismatched collectives, a device that
// finishes or fails while others wait, and waits longer than the collective timeout raise
// CollectiveError on every waiting device instead of hanging; a failure also aborts the groups,
// so that no device waits inside a buffer collective for one that will not come.
#include <absl/container/flat_hash_map.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <future>
#include <mutex>

#include "cjax/collectives.h"
#include "cjax/errors.h"
#include "core/array/array_impl.h"
#include "core/array/spmd.h"
#include "core/backend/device_worker.h"
#include "core/distributed/runtime.h"

namespace cjax {

struct Communicator::State {
  explicit State(std::vector<Device> d)
      : devices(std::move(d)), n(int64_t(devices.size())), whats(size_t(n)), done(size_t(n), false) {
    for (const Device& dev : devices) n_local += distributed::is_local(dev) ? 1 : 0;
  }
  std::vector<Device> devices;
  int64_t n;
  // The devices this process runs: the rendezvous waits for them; the devices of other processes
  // meet them inside the group communicators (backends/cpu/process_communicator.cpp).
  int64_t n_local = 0;
  std::mutex m;
  std::condition_variable cv;
  std::vector<std::string> whats;  // the collective each waiting device arrived at
  std::vector<bool> done;
  int64_t arrived = 0;
  uint64_t generation = 0;
  bool failed = false;
  std::string failure;
  absl::flat_hash_map<std::vector<int64_t>, std::shared_ptr<BufferCommunicator>> groups;

  void fail_locked(std::string msg, bool raise = true) {
    failed = true;
    failure = std::move(msg);
    for (auto& [members, g] : groups) g->abort(failure);
    cv.notify_all();
    if (raise) throw CollectiveError(failure);
  }
};

Communicator::Communicator(std::vector<Device> devices) : state_(std::make_unique<State>(std::move(devices))) {}
Communicator::~Communicator() = default;

void Communicator::arrive(int64_t device, const std::string& what) {
  State& s = *state_;
  std::unique_lock lk(s.m);
  if (s.failed) throw CollectiveError(s.failure);
  for (int64_t d = 0; d < s.n; ++d)
    if (s.done[size_t(d)])
      s.fail_locked(
          fmt::format("device {} finished the shard_map body while device {} waits at {}: the devices ran "
                      "different collectives (for example a collective inside a cond branch that only some "
                      "devices took)",
                      d, device, what));
  s.whats[size_t(device)] = what;
  uint64_t gen = s.generation;
  if (++s.arrived == s.n_local) {
    const std::string* first = nullptr;
    for (int64_t d = 0; d < s.n; ++d)
      if (!s.whats[size_t(d)].empty() && (!first || s.whats[size_t(d)] != *first)) {
        if (!first) {
          first = &s.whats[size_t(d)];
          continue;
        }
        std::vector<std::string> lines;
        for (int64_t k = 0; k < s.n; ++k)
          if (!s.whats[size_t(k)].empty()) lines.push_back(fmt::format("  device {}: {}", k, s.whats[size_t(k)]));
        s.fail_locked(
            fmt::format("the devices of a shard_map arrived at different collectives:\n{}\nEvery device must "
                        "run the same collectives in the same order",
                        fmt::join(lines, "\n")));
      }
    s.whats.assign(size_t(s.n), {});
    s.arrived = 0;
    ++s.generation;
    s.cv.notify_all();
    return;
  }
  auto timeout = std::chrono::duration<double>(config::collective_timeout_seconds());
  if (!s.cv.wait_for(lk, timeout, [&] { return s.generation != gen || s.failed; }))
    s.fail_locked(
        fmt::format("timed out after {} s waiting at {}: {} of {} devices arrived (raise the limit with "
                    "config::set_collective_timeout_seconds or CJAX_COLLECTIVE_TIMEOUT_S)",
                    config::collective_timeout_seconds(), what, s.arrived, s.n_local));
  if (s.failed) throw CollectiveError(s.failure);
}

BufferCommunicator& Communicator::group(const std::vector<int64_t>& members) {
  State& s = *state_;
  std::lock_guard lk(s.m);
  if (s.failed) throw CollectiveError(s.failure);
  std::shared_ptr<BufferCommunicator>& g = s.groups[members];
  if (!g) {
    std::vector<Device> devs;
    for (int64_t m : members) devs.push_back(s.devices[size_t(m)]);
    g = backend_for(devs[0].platform()).communicator(devs);
  }
  return *g;
}

void Communicator::device_done(int64_t device) {
  State& s = *state_;
  std::lock_guard lk(s.m);
  s.done[size_t(device)] = true;
  if (s.arrived > 0 && !s.failed) {
    std::string waiting;
    for (int64_t d = 0; d < s.n; ++d)
      if (!s.whats[size_t(d)].empty() && !s.done[size_t(d)]) waiting = s.whats[size_t(d)];
    s.fail_locked(
        fmt::format("device {} finished the shard_map body while {} device(s) wait at {}: the devices ran "
                    "different collectives (for example a collective inside a cond branch that only some "
                    "devices took)",
                    device, s.arrived, waiting));
  }
}

void Communicator::device_failed(int64_t device, const std::string& what) {
  State& s = *state_;
  std::lock_guard lk(s.m);
  if (!s.failed) s.fail_locked(fmt::format("device {} failed: {}", device, what), false);
}

bool in_device_memory(const Mesh& mesh) {
  return !std::all_of(mesh.devices().begin(), mesh.devices().end(), [](const Device& d) { return host_accessible(d); });
}

void run_on_device_workers(const Mesh& mesh, Communicator& comm, bool backward,
                           const std::function<void(int64_t)>& body) {
  size_t n = size_t(mesh.size());
  std::vector<std::exception_ptr> errors(n);
  std::atomic<int64_t> first_failure{-1};  // its error is raised: the others only saw it fail
  std::vector<std::future<void>> done;
  done.reserve(n);
  for (size_t d = 0; d < n; ++d) {
    if (!distributed::is_local(mesh.devices()[d])) continue;  // another process runs it
    done.push_back(submit_to_device(mesh.devices()[d], [&, d] {
      std::string what;
      try {
        SpmdScope spmd({&mesh, int64_t(d), &comm, backward});
        body(int64_t(d));
        comm.device_done(int64_t(d));
        return;
      } catch (const std::exception& e) {
        errors[d] = std::current_exception();
        what = e.what();
      } catch (...) {
        errors[d] = std::current_exception();
        what = "unknown error";
      }
      int64_t none = -1;
      first_failure.compare_exchange_strong(none, int64_t(d));
      comm.device_failed(int64_t(d), what);
    }));
  }
  for (auto& f : done) f.get();
  if (int64_t k = first_failure.load(); k >= 0) std::rethrow_exception(errors[size_t(k)]);
}

}  // namespace cjax
