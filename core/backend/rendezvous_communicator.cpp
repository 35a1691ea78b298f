#include "core/backend/rendezvous_communicator.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cjax/errors.h"

namespace cjax {

RendezvousCommunicator::RendezvousCommunicator(int n, std::chrono::milliseconds timeout)
    : n_(n), timeout_(timeout), send_(size_t(n)), recv_(size_t(n)), arrived_at_(size_t(n), 0) {}

void RendezvousCommunicator::barrier(int rank) {
  exchange(rank, nullptr, nullptr, "barrier", [] {});
}

void RendezvousCommunicator::abort(const std::string& why) {
  std::lock_guard lk(mu_);
  if (failed_) return;
  failed_ = true;
  failure_ = why;
  cv_.notify_all();
}

void RendezvousCommunicator::check_pairs(std::span<const std::pair<int, int>> pairs) const {
  int n = size();  // the group's size (more than the members met here when the group spans processes)
  for (const auto& [src, dst] : pairs)
    if (src < 0 || src >= n || dst < 0 || dst >= n)
      throw ValueError(fmt::format("permute: pair ({}, {}) names a rank outside [0, {})", src, dst, n));
}

const void* RendezvousCommunicator::permute_source(int rank, std::span<const std::pair<int, int>> pairs) const {
  for (const auto& [src, dst] : pairs)
    if (dst == rank) return send_[size_t(src)];
  return nullptr;
}

void RendezvousCommunicator::publish(int rank, const void* send, void* recv, const char* op) {
  if (rank < 0 || rank >= n_) throw ValueError(fmt::format("{}: rank {} is outside the group of {}", op, rank, n_));
  std::unique_lock lk(mu_);
  send_[size_t(rank)] = send;
  recv_[size_t(rank)] = recv;
  rendezvous(lk, rank, op);
}

void RendezvousCommunicator::finish(int rank, const char* op) {
  std::unique_lock lk(mu_);
  rendezvous(lk, rank, op);
}

// Waits until every rank arrives at this rendezvous (a generation count).
void RendezvousCommunicator::rendezvous(std::unique_lock<std::mutex>& lk, int rank, const char* op) {
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

}  // namespace cjax
