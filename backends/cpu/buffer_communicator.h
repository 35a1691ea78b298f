// The CPU's in-process BufferCommunicator (buffer_communicator.cpp): `group` is distinct cpu
// devices, each driven by its own thread; a member that does not arrive within `timeout` makes the
// others raise CollectiveError.
#pragma once
#include <chrono>
#include <memory>
#include <span>

#include "core/backend/backend.h"

namespace cjax::cpu {
std::shared_ptr<BufferCommunicator> make_in_process_buffer_communicator(std::span<const Device> group,
                                                                        std::chrono::milliseconds timeout);
}  // namespace cjax::cpu
