// NCCL communicators for cuda groups (nccl.h). A group's communicator is created once per
// process and kept: NCCL's setup costs tens of milliseconds, and the shard_map runtime asks for a
// group's communicator at every run. Each rank joins (ncclCommInitRank) on its first collective,
// from the thread that drives its device, so ranks of one process join concurrently as NCCL
// requires. The unique id comes from the process that holds rank 0, through the coordinator's
// store on several processes (XLA's NCCL cliques do the same). The design asked for
// ncclCommSplit of a world communicator per mesh-axis group; a split needs every rank of the parent
// to take part, which a mesh over some of the devices, or a group used by only part of a program,
// does not give, so each group gets its own id instead.
//
// Collectives run on the device's compute stream (like every kernel):
// they are ordered after the kernels that wrote their inputs and before those that read their
// outputs; they do not overlap compute yet.
#include "backends/cuda/nccl.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <glob.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_device.h"
#include "cjax/errors.h"
#include "core/distributed/kv_store.h"
#include "core/distributed/runtime.h"

namespace cjax::cuda {
namespace {
std::string group_name(std::span<const Device> group) {
  std::vector<std::string> names;
  for (const Device& d : group) names.push_back(d.str());
  return fmt::format("[{}]", fmt::join(names, ", "));
}
}  // namespace

#if CJAX_HAVE_NCCL
namespace {

constexpr int kMinVersion = 21800;  // 2.18

struct NcclState {
  Nccl api;
  bool ok = false;
  std::string reason;
};

std::vector<std::string> candidates() {
  std::vector<std::string> c;
  if (const char* v = std::getenv("CJAX_NCCL_LIBRARY"); v && *v) c.push_back(v);
  for (const std::string& t : toolkit_library_candidates("libnccl.so.2")) c.push_back(t);
  // Python's nvidia-nccl-cu13 wheel (PyTorch's and JAX's NCCL).
  for (const char* pattern : {"/usr/local/lib/python3*/dist-packages/nvidia/nccl/lib/libnccl.so.2",
                              "/usr/local/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so.2",
                              "/usr/lib/python3/dist-packages/nvidia/nccl/lib/libnccl.so.2"}) {
    glob_t g{};
    if (glob(pattern, 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) c.push_back(g.gl_pathv[i]);
    globfree(&g);
  }
  return c;
}

NcclState load_nccl() {
  NcclState s;
  std::string tried;
  void* lib = open_first_library(candidates(), &s.api.path, &tried);
  if (!lib) {
    s.reason = fmt::format(
        "NCCL (libnccl.so.2) not found; tried {}. Install NCCL (the CUDA toolkit's, or pip's nvidia-nccl-cu13) or "
        "set CJAX_NCCL_LIBRARY to the file",
        tried);
    return s;
  }
#define CJAX_X(f) CJAX_CUDA_LOAD_OR_RETURN(s, lib, f)
  CJAX_NCCL_FUNCTIONS(CJAX_X)
#undef CJAX_X
  s.api.ncclGetVersion(&s.api.version);
  if (s.api.version < kMinVersion) {
    s.reason = fmt::format("{} is NCCL version code {}; cjax needs NCCL 2.18 or newer", s.api.path, s.api.version);
    return s;
  }
  s.ok = true;
  return s;
}

NcclState& nccl_state() {
  static NcclState s = load_nccl();
  return s;
}

std::string nccl_error(ncclResult_t r, ncclComm_t comm) {
  const Nccl& api = nccl_state().api;
  std::string text = api.ncclGetErrorString ? api.ncclGetErrorString(r) : fmt::format("ncclResult {}", int(r));
  const char* last = api.ncclGetLastError ? api.ncclGetLastError(comm) : nullptr;
  if (last && *last) text += fmt::format(" ({})", last);
  return text;
}

// The element type NCCL reduces, and the operation: bool as bytes (or = max, and = min).
std::pair<ncclDataType_t, ncclRedOp_t> nccl_reduction(DType dtype, ReduceOp op) {
  ncclRedOp_t o = op == ReduceOp::Sum    ? ncclSum
                  : op == ReduceOp::Prod ? ncclProd
                  : op == ReduceOp::Max  ? ncclMax
                                         : ncclMin;
  switch (dtype) {
    case DType::bool_: return {ncclUint8, op == ReduceOp::Sum || op == ReduceOp::Max ? ncclMax : ncclMin};
    case DType::int8: return {ncclInt8, o};
    case DType::uint8: return {ncclUint8, o};
    case DType::int32: return {ncclInt32, o};
    case DType::uint32: return {ncclUint32, o};
    case DType::int64: return {ncclInt64, o};
    case DType::float16: return {ncclFloat16, o};
    case DType::bfloat16: return {ncclBfloat16, o};
    case DType::float32: return {ncclFloat32, o};
    case DType::float64: return {ncclFloat64, o};
    default:
      throw BackendError(
          fmt::format("NCCL has no {} reductions; convert the operand (astype(int32)) before the "
                      "collective",
                      dtype_name(dtype)));
  }
}

class NcclCommunicator final : public BufferCommunicator {
 public:
  NcclCommunicator(std::vector<Device> group, std::string key, std::chrono::milliseconds timeout)
      : group_(std::move(group)), key_(std::move(key)), timeout_(timeout), comms_(group_.size(), nullptr) {}
  ~NcclCommunicator() override {
    // After a failure, operations may wait for a rank that will not come: abort rather than
    // destroy (which waits for them).
    bool failed = !failure_.empty();
    for (ncclComm_t c : comms_)
      if (c) failed ? nccl().ncclCommAbort(c) : nccl().ncclCommDestroy(c);
    for (size_t r = 0; r < scratch_.size(); ++r)
      if (scratch_[r] && driver()) driver()->cuMemFreeAsync(scratch_[r], compute_stream(group_[r]));
  }
  bool failed() {
    std::lock_guard lk(mu_);
    return !failure_.empty();
  }

  int size() const override { return int(group_.size()); }

  void all_reduce(int rank, const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    if (count == 0) return;
    auto [type, rop] = nccl_reduction(dtype, op);
    run(rank, "all_reduce", [&](const Nccl& api, ncclComm_t c, CUstream s) {
      return api.ncclAllReduce(send, recv, count, type, rop, c, s);
    });
  }
  void all_gather(int rank, const void* send, void* recv, size_t bytes) override {
    if (bytes == 0) return;
    run(rank, "all_gather", [&](const Nccl& api, ncclComm_t c, CUstream s) {
      return api.ncclAllGather(send, recv, bytes, ncclUint8, c, s);
    });
  }
  void reduce_scatter(int rank, const void* send, void* recv, size_t count, DType dtype, ReduceOp op) override {
    if (count == 0) return;
    auto [type, rop] = nccl_reduction(dtype, op);
    run(rank, "reduce_scatter", [&](const Nccl& api, ncclComm_t c, CUstream s) {
      return api.ncclReduceScatter(send, recv, count, type, rop, c, s);
    });
  }
  void all_to_all(int rank, const void* send, void* recv, size_t bytes) override {
    if (bytes == 0) return;
    run(rank, "all_to_all", [&](const Nccl& api, ncclComm_t c, CUstream s) {
      ncclResult_t r = api.ncclGroupStart();
      for (int peer = 0; peer < size() && r == ncclSuccess; ++peer) {
        r = api.ncclSend(static_cast<const char*>(send) + size_t(peer) * bytes, bytes, ncclUint8, peer, c, s);
        if (r == ncclSuccess)
          r = api.ncclRecv(static_cast<char*>(recv) + size_t(peer) * bytes, bytes, ncclUint8, peer, c, s);
      }
      ncclResult_t end = api.ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
  }
  void permute(int rank, const void* send, void* recv, size_t bytes,
               std::span<const std::pair<int, int>> pairs) override {
    for (const auto& [from, to] : pairs)
      if (from < 0 || from >= size() || to < 0 || to >= size())
        throw ValueError(fmt::format("ppermute pair ({}, {}) names a rank outside the group of {}", from, to, size()));
    if (bytes == 0) return;
    const Device& d = group_[size_t(rank)];
    bool received = false;
    run(rank, "permute", [&](const Nccl& api, ncclComm_t c, CUstream s) {
      for (const auto& [from, to] : pairs)  // to itself: a copy, not a message (before the group opens)
        if (from == rank && to == rank)
          check(activate(d).cuMemcpyDtoDAsync(reinterpret_cast<CUdeviceptr>(recv), reinterpret_cast<CUdeviceptr>(send),
                                              bytes, s),
                "cuMemcpyDtoDAsync (permute)");
      ncclResult_t r = api.ncclGroupStart();
      for (const auto& [from, to] : pairs) {
        received = received || to == rank;
        if (r != ncclSuccess || from == to) continue;
        if (from == rank)
          r = api.ncclSend(send, bytes, ncclUint8, to, c, s);
        else if (to == rank)
          r = api.ncclRecv(recv, bytes, ncclUint8, from, c, s);
      }
      ncclResult_t end = api.ncclGroupEnd();
      return r != ncclSuccess ? r : end;
    });
    if (!received)  // no pair sends to this rank: zeros (JAX's ppermute)
      check(activate(d).cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(recv), 0, bytes, compute_stream(d)),
            "cuMemsetD8Async (permute)");
  }
  void barrier(int rank) override {
    const Device& d = group_[size_t(rank)];
    void* flag = scratch(rank);
    run(rank, "barrier", [&](const Nccl& api, ncclComm_t c, CUstream s) {
      return api.ncclAllReduce(flag, flag, 1, ncclInt32, ncclSum, c, s);
    });
    check(activate(d).cuStreamSynchronize(compute_stream(d)), "cuStreamSynchronize (barrier)");
  }
  void abort(const std::string& why) override {
    std::lock_guard lk(mu_);
    if (failure_.empty()) failure_ = why;
  }

 private:
  template <class F>
  void run(int rank, const char* op, F&& call) {
    {
      std::lock_guard lk(mu_);
      if (!failure_.empty()) throw CollectiveError(failure_);
    }
    ncclComm_t c = comm(rank);
    const Device& d = group_[size_t(rank)];
    activate(d);
    ncclResult_t r = call(nccl(), c, compute_stream(d));
    std::string what = fmt::format("NCCL {} over {} (rank {} of {})", op, group_name(group_), rank, size());
    if (r != ncclSuccess && r != ncclInProgress) {
      // The other ranks may have queued their half of this collective: later ones could pair up
      // wrongly or wait forever, so the communicator is done (and aborted when it goes).
      std::string error = fmt::format("{} failed: {}", what, nccl_error(r, c));
      std::lock_guard lk(mu_);
      if (failure_.empty()) failure_ = error;
      throw CollectiveError(error);
    }
    try {
      wait_ready(c, what, timeout_);  // enqueued: the kernels themselves run on the stream
    } catch (const CollectiveError& e) {
      std::lock_guard lk(mu_);
      comms_[size_t(rank)] = nullptr;  // aborted by wait_ready
      if (failure_.empty()) failure_ = e.what();
      throw;
    }
  }

  ncclComm_t comm(int rank) {
    {
      std::lock_guard lk(mu_);
      if (comms_[size_t(rank)]) return comms_[size_t(rank)];
    }
    std::call_once(id_once_, [&] {
      id_ = share_unique_id(distributed::is_local(group_[0]), distributed::store(), key_, timeout_);
    });
    activate(group_[size_t(rank)]);  // NCCL takes the rank's GPU from the current context
    ncclComm_t c = nullptr;
    try {
      c = init_rank(id_, size(), rank, timeout_);
    } catch (const CollectiveError& e) {
      std::lock_guard lk(mu_);
      if (failure_.empty()) failure_ = e.what();
      throw CollectiveError(
          fmt::format("the NCCL communicator of {} (rank {}): {}", group_name(group_), rank, e.what()));
    } catch (const BackendError& e) {
      throw BackendError(fmt::format("the NCCL communicator of {} (rank {}): {}", group_name(group_), rank, e.what()));
    }
    std::lock_guard lk(mu_);
    comms_[size_t(rank)] = c;
    return c;
  }

  void* scratch(int rank) {
    std::lock_guard lk(mu_);
    if (scratch_.empty()) scratch_.assign(group_.size(), 0);
    CUdeviceptr& p = scratch_[size_t(rank)];
    if (!p) {
      const Device& d = group_[size_t(rank)];
      check(activate(d).cuMemAllocAsync(&p, 16, compute_stream(d)), "cuMemAllocAsync (barrier)");
      check(activate(d).cuMemsetD8Async(p, 0, 16, compute_stream(d)), "cuMemsetD8Async (barrier)");
    }
    return reinterpret_cast<void*>(p);
  }

  const std::vector<Device> group_;
  const std::string key_;
  const std::chrono::milliseconds timeout_;
  std::once_flag id_once_;
  ncclUniqueId id_{};
  std::mutex mu_;
  std::vector<ncclComm_t> comms_;
  std::vector<CUdeviceptr> scratch_;
  std::string failure_;
};

struct Cache {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<NcclCommunicator>> by_key;
  std::map<std::string, int> made;  // communicators made per group: a part of their ids' keys
};
Cache& cache() {
  static Cache* c = [] {
    auto* made = new Cache;  // kept past static destruction: NCCL must not be torn down at exit
    distributed::on_shutdown([] {
      std::lock_guard lk(cache().mu);
      cache().by_key.clear();  // a later initialize() makes new communicators
    });
    return made;
  }();
  return *c;
}

}  // namespace

const Nccl& nccl() {
  if (!nccl_state().ok) throw BackendError(nccl_state().reason);
  return nccl_state().api;
}
bool nccl_available() { return nccl_state().ok; }

#endif  // CJAX_HAVE_NCCL

bool collectives_use_nccl(std::span<const Device> group) {
  const char* v = std::getenv("CJAX_CUDA_COLLECTIVES");
  std::string mode = v ? v : "";
  if (mode != "" && mode != "auto" && mode != "nccl" && mode != "local")
    throw ValueError(fmt::format("CJAX_CUDA_COLLECTIVES={}: expected auto, nccl or local", mode));
  // Over this process's members: two on different GPUs, or two on one GPU (virtual devices).
  bool other_process = false, several_gpus = false, shared_gpu = false;
  for (size_t i = 0; i < group.size(); ++i) {
    if (!distributed::is_local(group[i])) {
      other_process = true;
      continue;
    }
    for (size_t j = 0; j < i; ++j)
      if (distributed::is_local(group[j]))
        (gpu(group[j]).device == gpu(group[i]).device ? shared_gpu : several_gpus) = true;
  }
  if (mode == "nccl") {
    if (shared_gpu)
      throw BackendError(
          fmt::format("CJAX_CUDA_COLLECTIVES=nccl: the group {} has two virtual devices of one GPU, and NCCL takes one "
                      "rank per GPU; unset CJAX_CUDA_COLLECTIVES (virtual devices then use the in-process kernels)",
                      group_name(group)));
    return true;
  }
  if (mode == "local") return false;
  if (shared_gpu && (several_gpus || other_process))
    throw BackendError(
        fmt::format("the group {} mixes virtual devices of one GPU with other GPUs or processes: NCCL takes one rank "
                    "per GPU; use one device per GPU (unset CJAX_NUM_CUDA_VIRTUAL_DEVICES) or a mesh on one GPU",
                    group_name(group)));
  return several_gpus || other_process;
}

#if CJAX_HAVE_NCCL
std::shared_ptr<BufferCommunicator> nccl_communicator(std::span<const Device> group,
                                                      std::chrono::milliseconds timeout) {
  nccl();  // BackendError naming the paths tried, before any rank waits for the others
  std::vector<std::string> ids;
  for (const Device& d : group) ids.push_back(std::to_string(d.id()));
  std::string key = fmt::format("nccl{}/{}", distributed::generation(), fmt::join(ids, ","));
  Cache& c = cache();
  std::lock_guard lk(c.mu);
  std::shared_ptr<NcclCommunicator>& slot = c.by_key[key];
  // A run that failed aborted its communicator (abort() is what the SPMD runtime calls when a
  // device fails): the next run of the group gets new NCCL communicators under a new id.
  if (slot && slot->failed()) slot.reset();
  if (!slot)
    slot = std::make_shared<NcclCommunicator>(std::vector<Device>(group.begin(), group.end()),
                                              fmt::format("{}/{}", key, c.made[key]++), timeout);
  return slot;
}

ncclUniqueId share_unique_id(bool root, distributed::KvStoreClient* store, const std::string& key,
                             std::chrono::milliseconds timeout) {
  const Nccl& api = nccl();
  ncclUniqueId id{};
  if (root) {
    if (ncclResult_t r = api.ncclGetUniqueId(&id); r != ncclSuccess)
      throw BackendError(fmt::format("ncclGetUniqueId: {}", nccl_error(r, nullptr)));
    if (store) store->set(key, std::vector<char>(id.internal, id.internal + sizeof(id.internal)));
    return id;
  }
  if (!store)
    throw Error(fmt::format("internal: the NCCL id '{}' belongs to another process, but there is no coordinator", key));
  std::vector<char> v = store->get(key, timeout);
  if (v.size() != sizeof(id.internal))
    throw CollectiveError(
        fmt::format("the NCCL id under '{}' has {} bytes, not {}", key, v.size(), sizeof(id.internal)));
  std::memcpy(id.internal, v.data(), v.size());
  return id;
}

ncclComm_t init_rank(const ncclUniqueId& id, int nranks, int rank, std::chrono::milliseconds timeout) {
  const Nccl& api = nccl();
  ncclComm_t c = nullptr;
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // joining returns at once; wait_ready bounds the wait for the other ranks
  ncclResult_t r = api.ncclCommInitRankConfig(&c, nranks, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) {
    if (c) api.ncclCommAbort(c);
    throw BackendError(fmt::format("ncclCommInitRank (rank {} of {}): {}", rank, nranks, nccl_error(r, nullptr)));
  }
  wait_ready(c,
             fmt::format("joining the NCCL communicator (rank {} of {}): the other ranks did not all join; a "
                         "process died, never started, or runs a different program",
                         rank, nranks),
             timeout);
  return c;
}

void wait_ready(ncclComm_t comm, const std::string& what, std::chrono::milliseconds timeout) {
  const Nccl& api = nccl();
  auto start = std::chrono::steady_clock::now();
  for (int spins = 0;; ++spins) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t r = api.ncclCommGetAsyncError(comm, &state);
    if (r == ncclSuccess && state == ncclSuccess) return;
    if (r != ncclSuccess || state != ncclInProgress) {
      std::string why = nccl_error(r != ncclSuccess ? r : state, comm);
      api.ncclCommAbort(comm);
      throw CollectiveError(fmt::format("{}: {}", what, why));
    }
    auto waited = std::chrono::steady_clock::now() - start;
    if (waited > timeout) {
      api.ncclCommAbort(comm);
      throw CollectiveError(fmt::format("{} (waited {:.1f} s, the collective timeout)", what,
                                        std::chrono::duration<double>(waited).count()));
    }
    if (spins > 100) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

#else
bool nccl_available() { return false; }

std::shared_ptr<BufferCommunicator> nccl_communicator(std::span<const Device> group, std::chrono::milliseconds) {
  throw BackendError(
      fmt::format("collectives over {} need NCCL, and this build of cjax found no nccl.h beside the CUDA toolkit's "
                  "headers; "
                  "install NCCL's headers (libnccl-dev) and rebuild",
                  group_name(group)));
}
#endif  // CJAX_HAVE_NCCL

}  // namespace cjax::cuda
