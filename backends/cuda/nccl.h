// NCCL for the cuda platform's collectives between GPUs (one rank per GPU, in this process or in
// others): loaded at run time with dlopen like the driver, so a binary without NCCL still runs
// (collectives between virtual devices of one GPU do not need it).
//
// Which communicator a cuda group gets (CJAX_CUDA_COLLECTIVES):
//   unset or "auto": NCCL when the group's devices are on different GPUs or in different
//                    processes; the in-process kernels (buffer_communicator.cpp) between virtual
//                    devices of one GPU.
//   "nccl":          NCCL for every group, a single device too (nranks = 1: what one GPU can test);
//                    a group with two virtual devices of one GPU raises BackendError (NCCL takes one
//                    rank per GPU).
//   "local":         never NCCL (a group over two GPUs raises BackendError).
#pragma once
#if __has_include(<nccl.h>)  // NCCL's headers come with some CUDA toolkits, as libnccl-dev with others
#include <nccl.h>
#define CJAX_HAVE_NCCL 1
#else
#define CJAX_HAVE_NCCL 0
#endif

#include <chrono>
#include <memory>
#include <span>
#include <string>

#include "core/backend/backend.h"

namespace cjax::distributed {
class KvStoreClient;
}

namespace cjax::cuda {

#if CJAX_HAVE_NCCL
#define CJAX_NCCL_FUNCTIONS(X) \
  X(ncclGetVersion)            \
  X(ncclGetUniqueId)           \
  X(ncclCommInitRank)          \
  X(ncclCommInitRankConfig)    \
  X(ncclCommGetAsyncError)     \
  X(ncclCommDestroy)           \
  X(ncclCommAbort)             \
  X(ncclGetErrorString)        \
  X(ncclGetLastError)          \
  X(ncclAllReduce)             \
  X(ncclAllGather)             \
  X(ncclReduceScatter)         \
  X(ncclSend)                  \
  X(ncclRecv)                  \
  X(ncclGroupStart)            \
  X(ncclGroupEnd)

struct Nccl {
#define CJAX_X(f) decltype(&::f) f = nullptr;
  CJAX_NCCL_FUNCTIONS(CJAX_X)
#undef CJAX_X
  int version = 0;   // ncclGetVersion: 22809 for 2.28.9
  std::string path;  // the file that was loaded
};

// NCCL (>= 2.18), loaded once: CJAX_NCCL_LIBRARY (a file), then libnccl.so.2 on the loader's path,
// the toolkit's lib64, and Python's nvidia-nccl wheels. Raises BackendError naming what was tried.
const Nccl& nccl();
#endif
bool nccl_available();

// Whether a cuda group's collectives go through NCCL (see above); BackendError for a setting that
// cannot hold for this group.
bool collectives_use_nccl(std::span<const Device> group);
// The NCCL communicator of `group` (rank = position), created once per group and kept for the
// process: each member's rank joins on its first collective, from the thread that drives it.
std::shared_ptr<BufferCommunicator> nccl_communicator(std::span<const Device> group, std::chrono::milliseconds timeout);

#if CJAX_HAVE_NCCL
// The unique id of a communicator: made by the process that holds its rank 0 (`root`) and passed to
// the others through the coordinator's store under `key` (store may be null on one process).
ncclUniqueId share_unique_id(bool root, distributed::KvStoreClient* store, const std::string& key,
                             std::chrono::milliseconds timeout);
// Joins rank `rank` of `nranks` on the calling thread's current device, as a non-blocking
// communicator (every later NCCL call on it is waited for with wait_ready). BackendError with
// NCCL's reason; CollectiveError where the other ranks have not all joined within `timeout`
// (a process died, never started, or runs another program): the half-made communicator is
// aborted, never waited for.
ncclComm_t init_rank(const ncclUniqueId& id, int nranks, int rank, std::chrono::milliseconds timeout);
// Waits until `comm` has finished the call just made on it (a non-blocking communicator answers
// ncclInProgress first); raises CollectiveError naming `what` with NCCL's error, or after `timeout`
// (the communicator is then aborted).
void wait_ready(ncclComm_t comm, const std::string& what, std::chrono::milliseconds timeout);

#endif

}  // namespace cjax::cuda
