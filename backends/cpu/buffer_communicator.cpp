// The CPU's BufferCommunicator (core/backend/backend.h): the members are threads of this process
// (one per virtual device), meeting at the rendezvous of core/backend/rendezvous_communicator.h.
// An all_reduce is split: rank k combines its 1/n of the elements over all ranks, in rank order,
// and writes them into every member's output, so each element is computed once.
#include "backends/cpu/buffer_communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <span>

#include "cjax/errors.h"
#include "core/array/visit_dtype.h"
#include "core/backend/backend.h"
#include "core/backend/rendezvous_communicator.h"
#include "core/lax/scalar_fns.h"

namespace cjax::cpu {
namespace {

class InProcessBufferCommunicator final : public RendezvousCommunicator {
 public:
  using RendezvousCommunicator::RendezvousCommunicator;

  void all_reduce(int rank, const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    exchange(rank, send, recv, "all_reduce", [&] {
      size_t n = size_t(size()), per = (count + n - 1) / n, lo = std::min(count, size_t(rank) * per);
      reduce_block(lo, lo, std::min(count, lo + per) - lo, dtype, op, recvs());
    });
  }
  void reduce_scatter(int rank, const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    exchange(rank, send, recv, "reduce_scatter", [&] {
      reduce_block(size_t(rank) * count, 0, count, dtype, op, std::span<void* const>(&recvs()[size_t(rank)], 1));
    });
  }
  void all_gather(int rank, const void* send, void* recv, size_t bytes) override {
    exchange(rank, send, recv, "all_gather", [&] {
      for (int r = 0; r < size(); ++r)
        std::memcpy(static_cast<char*>(recv) + size_t(r) * bytes, sends()[size_t(r)], bytes);
    });
  }
  void all_to_all(int rank, const void* send, void* recv, size_t bytes) override {
    exchange(rank, send, recv, "all_to_all", [&] {
      for (int r = 0; r < size(); ++r)
        std::memcpy(static_cast<char*>(recv) + size_t(r) * bytes,
                    static_cast<const char*>(sends()[size_t(r)]) + size_t(rank) * bytes, bytes);
    });
  }
  void permute(int rank, const void* send, void* recv, size_t bytes,
               std::span<const std::pair<int, int>> pairs) override {
    check_pairs(pairs);
    exchange(rank, send, recv, "permute", [&] {
      if (const void* from = permute_source(rank, pairs))
        std::memcpy(recv, from, bytes);
      else
        std::memset(recv, 0, bytes);
    });
  }

 private:
  // outs_k[out_offset + i] = op over ranks of send_r[in_offset + i] for i < count, for every k.
  // Each element's inputs are all read before its outputs are written (in place is safe).
  void reduce_block(size_t in_offset, size_t out_offset, size_t count, DType dtype, ReduceOp op,
                    std::span<void* const> outs) {
    const std::vector<const void*>& in = sends();
    visit_dtype(dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      for (size_t i = 0; i < count; ++i) {
        T acc = static_cast<const T*>(in[0])[in_offset + i];
        for (size_t r = 1; r < in.size(); ++r)
          acc = scalar::reduce_combine(acc, static_cast<const T*>(in[r])[in_offset + i], op);
        for (void* out : outs) static_cast<T*>(out)[out_offset + i] = acc;
      }
    });
  }
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
