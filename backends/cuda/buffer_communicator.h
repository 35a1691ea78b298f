// Collectives between virtual devices of one GPU (buffer_communicator.cpp).
#pragma once
#include <chrono>
#include <memory>
#include <span>
#include <string>

#include "core/backend/backend.h"

namespace cjax::cuda {
// `group`: distinct cuda devices of one GPU, each driven by its own thread; a member that does not
// arrive within `timeout` makes the others raise CollectiveError.
std::shared_ptr<BufferCommunicator> make_buffer_communicator(std::span<const Device> group,
                                                             std::chrono::milliseconds timeout);
// The reduction kernel's CUDA C++ (for the offline NVRTC test).
std::string rank_reduce_kernel_source(DType dtype, ReduceOp op);
}  // namespace cjax::cuda
