// The CPU's BufferCommunicator for groups that span processes (a multi-process run,
// include/cjax/distributed.h): the members of this process meet at an in-process rendezvous, and
// one of them moves the blocks between processes over Gloo (TCP).
#pragma once
#include <chrono>
#include <memory>
#include <span>

#include "core/backend/backend.h"

namespace cjax::cpu {
std::shared_ptr<BufferCommunicator> make_process_buffer_communicator(std::span<const Device> group,
                                                                     std::chrono::milliseconds timeout);
// Drops the Gloo connections (distributed::shutdown).
void close_process_connections();
}  // namespace cjax::cpu
