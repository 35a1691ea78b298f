// The rendezvous of an in-process BufferCommunicator (core/backend/backend.h): the members are
// threads of this process, one per (virtual) device. Each operation is two rendezvous: every
// member publishes its buffers, then each computes its share by reading every member's input
// (compute()), then all wait until everyone has read and written (or, on a GPU, queued its reads
// and writes on the stream they share), so no input is released early and no output is read
// unfinished. A member that does not arrive within the timeout makes the others raise
// CollectiveError naming it. The CPU (memcpy, loops) and cuda (copies and kernels on one GPU)
// communicators derive from it and supply the computation.
#pragma once
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/backend/backend.h"

namespace cjax {

class RendezvousCommunicator : public BufferCommunicator {
 public:
  RendezvousCommunicator(int n, std::chrono::milliseconds timeout);
  int size() const override { return n_; }
  void barrier(int rank) override;
  void abort(const std::string& why) override;

 protected:
  // Publishes (send, recv) as `rank`'s, waits for every member, runs compute(), waits again.
  template <class F>
  void exchange(int rank, const void* send, void* recv, const char* op, F&& compute) {
    publish(rank, send, recv, op);
    compute();
    finish(rank, op);
  }
  // Raises ValueError for a pair naming a rank outside the group.
  void check_pairs(std::span<const std::pair<int, int>> pairs) const;
  // Inside a permute's compute(): the send buffer that `rank` receives, or null (it gets zeros).
  const void* permute_source(int rank, std::span<const std::pair<int, int>> pairs) const;
  // The members' buffers of the operation in progress (valid inside compute()).
  const std::vector<const void*>& sends() const { return send_; }
  const std::vector<void*>& recvs() const { return recv_; }

 private:
  void publish(int rank, const void* send, void* recv, const char* op);
  void finish(int rank, const char* op);
  void rendezvous(std::unique_lock<std::mutex>& lk, int rank, const char* op);

  const int n_;
  const std::chrono::milliseconds timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<const void*> send_;
  std::vector<void*> recv_;
  std::vector<uint64_t> arrived_at_;
  int arrived_ = 0;
  uint64_t generation_ = 0;
  bool failed_ = false;
  std::string failure_;
};

}  // namespace cjax
