// The cuda platform's in-process BufferCommunicator (core/backend/backend.h): the members are
// virtual devices of one GPU (CJAX_NUM_CUDA_VIRTUAL_DEVICES), each driven by its own host thread,
// meeting at the rendezvous of core/backend/rendezvous_communicator.h. Blocks move with
// device-to-device copies; reductions are one kernel per member that combines its share of the
// elements over all ranks in rank order (so results are bitwise the CPU communicator's) and
// writes it into every member's output. Everything is queued on the GPU's compute stream, which
// all virtual devices share, so a member's reads come after the kernels that wrote its inputs
// (queued before it arrived) and before anything that is queued after the second rendezvous.
// Devices of different GPUs, and other processes, go through NCCL (nccl.h).
#include "backends/cuda/buffer_communicator.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/kernels/codegen.h"
#include "cjax/errors.h"
#include "core/backend/rendezvous_communicator.h"

namespace cjax::cuda {
namespace {

constexpr int kMaxMembers = 64;  // the kernel takes every member's pointer as an argument

// out_o[out_off + i] = op over r of in_r[in_off + i], in rank order, rounded per step (bf16/f16:
// as the CPU's reduce_combine on the half type).
std::string rank_reduce_source(DType dtype, ReduceOp op) {
  ScalarOp s = op == ReduceOp::Sum    ? ScalarOp::Add
               : op == ReduceOp::Prod ? ScalarOp::Mul
               : op == ReduceOp::Max  ? ScalarOp::Max
                                      : ScalarOp::Min;
  if (dtype == DType::bool_) s = op == ReduceOp::Sum || op == ReduceOp::Max ? ScalarOp::Or : ScalarOp::And;
  std::optional<std::string> e = scalar_expression(s, dtype);
  if (!e) throw BackendError(fmt::format("no cuda reduction of {} for a collective", dtype_name(dtype)));
  std::string st = storage_type(dtype), ct = compute_type(dtype);
  return std::string(kPrelude) +
         fmt::format(R"(
struct CjMembers {{ const void* in[{0}]; void* out[{0}]; }};
extern "C" __global__ void cj_rank_reduce(CjMembers m, int n_in, int n_out, unsigned long long in_off,
                                          unsigned long long out_off, unsigned long long count) {{
  for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < count;
       i += (unsigned long long)gridDim.x * blockDim.x) {{
    {2} acc = {3};
    for (int r = 1; r < n_in; ++r) {{
      const {2} x = acc, y = {4};
      acc = {5};
    }}
    for (int o = 0; o < n_out; ++o) (({1}*)m.out[o])[out_off + i] = {6};
  }}
}}
)",
                     kMaxMembers, st, ct, load(dtype, fmt::format("((const {}*)m.in[0])[in_off + i]", st)),
                     load(dtype, fmt::format("((const {}*)m.in[r])[in_off + i]", st)),
                     load(dtype, store(dtype, fmt::format("({})({})", ct, *e))), store(dtype, "acc"));
}

class CudaBufferCommunicator final : public RendezvousCommunicator {
 public:
  CudaBufferCommunicator(std::vector<Device> group, std::chrono::milliseconds timeout)
      : RendezvousCommunicator(int(group.size()), timeout), group_(std::move(group)) {}

  void all_reduce(int rank, const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    exchange(rank, send, recv, "all_reduce", [&] {
      size_t n = size_t(size()), per = (count + n - 1) / n, lo = std::min(count, size_t(rank) * per);
      reduce(rank, lo, lo, std::min(count, lo + per) - lo, dtype, op, recvs());
    });
  }
  void reduce_scatter(int rank, const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    exchange(rank, send, recv, "reduce_scatter",
             [&] { reduce(rank, size_t(rank) * count, 0, count, dtype, op, std::vector<void*>{recv}); });
  }
  void all_gather(int rank, const void* send, void* recv, size_t bytes) override {
    exchange(rank, send, recv, "all_gather", [&] {
      for (int r = 0; r < size(); ++r)
        copy(rank, static_cast<char*>(recv) + size_t(r) * bytes, sends()[size_t(r)], bytes);
    });
  }
  void all_to_all(int rank, const void* send, void* recv, size_t bytes) override {
    exchange(rank, send, recv, "all_to_all", [&] {
      for (int r = 0; r < size(); ++r)
        copy(rank, static_cast<char*>(recv) + size_t(r) * bytes,
             static_cast<const char*>(sends()[size_t(r)]) + size_t(rank) * bytes, bytes);
    });
  }
  void permute(int rank, const void* send, void* recv, size_t bytes,
               std::span<const std::pair<int, int>> pairs) override {
    check_pairs(pairs);
    exchange(rank, send, recv, "permute", [&] {
      if (const void* from = permute_source(rank, pairs)) {
        copy(rank, recv, from, bytes);
      } else if (bytes > 0) {
        const Device& d = group_[size_t(rank)];
        check(activate(d).cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(recv), 0, bytes, compute_stream(d)),
              "cuMemsetD8Async (permute)");
      }
    });
  }

 private:
  void copy(int rank, void* to, const void* from, size_t bytes) const {
    if (bytes == 0 || to == from) return;
    const Device& d = group_[size_t(rank)];
    check(activate(d).cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(to), reinterpret_cast<CUdeviceptr>(from), bytes,
                                        compute_stream(d)),
          "cuMemcpyDtoDAsync (collective)");
  }

  void reduce(int rank, size_t in_offset, size_t out_offset, size_t count, DType dtype, ReduceOp op,
              const std::vector<void*>& outs) const {
    if (count == 0) return;
    struct Members {
      const void* in[kMaxMembers];
      void* out[kMaxMembers];
    } m{};
    const std::vector<const void*>& in = sends();
    std::copy(in.begin(), in.end(), m.in);
    std::copy(outs.begin(), outs.end(), m.out);
    int n_in = int(in.size()), n_out = int(outs.size());
    unsigned long long in_off = in_offset, out_off = out_offset, n = count;
    auto grid = unsigned(std::min<size_t>((count + 255) / 256, 4096));
    launch(group_[size_t(rank)], rank_reduce_source(dtype, op), "cj_rank_reduce", grid, 256,
           {&m, &n_in, &n_out, &in_off, &out_off, &n});
  }

  std::vector<Device> group_;
};

}  // namespace

std::string rank_reduce_kernel_source(DType dtype, ReduceOp op) { return rank_reduce_source(dtype, op); }

std::shared_ptr<BufferCommunicator> make_buffer_communicator(std::span<const Device> group,
                                                             std::chrono::milliseconds timeout) {
  if (group.empty()) throw ValueError("a communicator needs at least one device");
  if (group.size() > size_t(kMaxMembers))
    throw BackendError(fmt::format("a cuda communicator of {} devices: at most {} virtual devices share one GPU",
                                   group.size(), kMaxMembers));
  for (size_t i = 0; i < group.size(); ++i) {
    if (group[i].platform() != Platform::cuda)
      throw BackendError(fmt::format("the cuda communicator got {}: its group must be cuda devices", group[i].str()));
    for (size_t j = 0; j < i; ++j)
      if (group[j] == group[i]) throw ValueError(fmt::format("a communicator's group names {} twice", group[i].str()));
    if (gpu(group[i]).device != gpu(group[0]).device)
      throw BackendError(
          fmt::format("collectives between {} and {}: they are different GPUs, which need NCCL, and "
                      "CJAX_CUDA_COLLECTIVES=local turned it off; unset it",
                      group[0].str(), group[i].str()));
  }
  return std::make_shared<CudaBufferCommunicator>(std::vector<Device>(group.begin(), group.end()), timeout);
}

}  // namespace cjax::cuda
