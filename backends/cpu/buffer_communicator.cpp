// The CPU's BufferCommunicator (core/backend/backend.h): the members are threads of this process
// (one per virtual device). Each operation is two rendezvous: every member publishes its buffers,
// then each computes its share by reading every member's input, then all wait until everyone
// has read and written, so no input is released early and no output is read unfinished. An
// all_reduce is split: rank k combines its 1/n of the elements over all ranks, in rank order, and
// writes them into every member's output, so each element is computed once.
#include "backends/cpu/buffer_communicator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <span>

#include "cjax/errors.h"
#include "core/array/visit_dtype.h"
#include "core/backend/backend.h"
#include "core/lax/scalar_fns.h"

namespace cjax::cpu {
namespace {

class InProcessBufferCommunicator final : public BufferCommunicator {
 public:
  InProcessBufferCommunicator(int n, std::chrono::milliseconds timeout)
      : n_(n), timeout_(timeout), send_(size_t(n)), recv_(size_t(n)), arrived_at_(size_t(n), 0) {}

  int size() const override { return n_; }

  void all_reduce(int rank, const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    exchange(rank, send, recv, "all_reduce", [&] {
      size_t per = (count + size_t(n_) - 1) / size_t(n_), lo = std::min(count, size_t(rank) * per);
      reduce_block(lo, lo, std::min(count, lo + per) - lo, dtype, op, recv_);
    });
  }
  void reduce_scatter(int rank, const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    exchange(rank, send, recv, "reduce_scatter", [&] {
      reduce_block(size_t(rank) * count, 0, count, dtype, op, std::span<void* const>(&recv_[size_t(rank)], 1));
    });
  }
  void all_gather(int rank, const void* send, void* recv, size_t bytes) override {
    exchange(rank, send, recv, "all_gather", [&] {
      for (int r = 0; r < n_; ++r) std::memcpy(static_cast<char*>(recv) + size_t(r) * bytes, send_[size_t(r)], bytes);
    });
  }
  void all_to_all(int rank, const void* send, void* recv, size_t bytes) override {
    exchange(rank, send, recv, "all_to_all", [&] {
      for (int r = 0; r < n_; ++r)
        std::memcpy(static_cast<char*>(recv) + size_t(r) * bytes,
                    static_cast<const char*>(send_[size_t(r)]) + size_t(rank) * bytes, bytes);
    });
  }
  void permute(int rank, const void* send, void* recv, size_t bytes,
               std::span<const std::pair<int, int>> pairs) override {
    for (const auto& [src, dst] : pairs)
      if (src < 0 || src >= n_ || dst < 0 || dst >= n_)
        throw ValueError(fmt::format("permute: pair ({}, {}) names a rank outside [0, {})", src, dst, n_));
    exchange(rank, send, recv, "permute", [&] {
      const void* from = nullptr;
      for (const auto& [src, dst] : pairs)
        if (dst == rank) from = send_[size_t(src)];
      if (from)
        std::memcpy(recv, from, bytes);
      else
        std::memset(recv, 0, bytes);
    });
  }
  void barrier(int rank) override {
    exchange(rank, nullptr, nullptr, "barrier", [] {});
  }
  void abort(const std::string& why) override {
    std::lock_guard lk(mu_);
    if (failed_) return;
    failed_ = true;
    failure_ = why;
    cv_.notify_all();
  }

 private:
  // outs_k[out_offset + i] = op over ranks of send_r[in_offset + i] for i < count, for every k.
  // Each element's inputs are all read before its outputs are written (in place is safe).
  void reduce_block(size_t in_offset, size_t out_offset, size_t count, DType dtype, ReduceOp op,
                    std::span<void* const> outs) {
    visit_dtype(dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      for (size_t i = 0; i < count; ++i) {
        T acc = static_cast<const T*>(send_[0])[in_offset + i];
        for (int r = 1; r < n_; ++r)
          acc = scalar::reduce_combine(acc, static_cast<const T*>(send_[size_t(r)])[in_offset + i], op);
        for (void* out : outs) static_cast<T*>(out)[out_offset + i] = acc;
      }
    });
  }

  template <class F>
  void exchange(int rank, const void* send, void* recv, const char* op, F&& compute) {
    if (rank < 0 || rank >= n_) throw ValueError(fmt::format("{}: rank {} is outside the group of {}", op, rank, n_));
    std::unique_lock lk(mu_);
    send_[size_t(rank)] = send;
    recv_[size_t(rank)] = recv;
    rendezvous(lk, rank, op);
    lk.unlock();
    compute();
    lk.lock();
    rendezvous(lk, rank, op);
  }

  // Waits until every rank arrives at this rendezvous (a generation count).
  void rendezvous(std::unique_lock<std::mutex>& lk, int rank, const char* op) {
    if (failed_) throw CollectiveError(failure_);
    uint64_t gen = generation_;
    arrived_at_[size_t(rank)] = gen + 1;
    if (++arrived_ == n_) {
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    if (cv_.wait_for(lk, timeout_, [&] { return generation_ != gen || failed_; }) && !failed_) return;
    if (!failed_) {
      std::vector<int> missing;
      for (int r = 0; r < n_; ++r)
        if (arrived_at_[size_t(r)] != gen + 1) missing.push_back(r);
      failed_ = true;
      failure_ = fmt::format("{}: rank(s) {} of {} did not arrive within {} ms", op, fmt::join(missing, ", "), n_,
                             timeout_.count());
      cv_.notify_all();
    }
    throw CollectiveError(failure_);
  }

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

}  // namespace

std::shared_ptr<BufferCommunicator> make_in_process_buffer_communicator(std::span<const Device> group,
                                                                        std::chrono::milliseconds timeout) {
  if (group.empty()) throw ValueError("a communicator needs at least one device");
  for (size_t i = 0; i < group.size(); ++i) {
    if (group[i].platform() != Platform::cpu)
      throw BackendError(fmt::format("the cpu communicator got {}: its group must be cpu devices", group[i].str()));
    for (size_t j = 0; j < i; ++j)
      if (group[j] == group[i]) throw ValueError(fmt::format("a communicator's group names {} twice", group[i].str()));
  }
  return std::make_shared<InProcessBufferCommunicator>(int(group.size()), timeout);
}

}  // namespace cjax::cpu
