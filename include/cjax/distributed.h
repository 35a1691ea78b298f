// Multi-process runs: one program started on several processes (JAX's jax.distributed). Every
// process calls distributed::initialize() before creating any array; the processes then share one
// global device list, meshes span processes, and shard_map and sharded jit run across them, the
// collectives between processes going through Gloo over TCP (docs/distributed.md).
//
//   distributed::initialize();  // reads CJAX_COORDINATOR_ADDRESS, CJAX_NUM_PROCESSES, CJAX_PROCESS_ID
//   Mesh mesh = make_mesh({8}, {"x"});  // the 8 devices of 4 processes × 2 local devices
//   Array x = make_array_from_process_local_data(NamedSharding(mesh, P("x")), local_rows);
//   Array y = jit(shard_map(f, mesh, {P("x")}, P()))(x);
//   Array all = process_allgather(y);  // the global value on every process
//   distributed::shutdown();
//
// `scripts/launch.sh -n 4 -- program args` starts such a run on this machine.
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "cjax/array.h"
#include "cjax/device.h"

namespace cjax {
class Sharding;

namespace distributed {
struct Options {
  // "host:port" of process 0, which runs the coordinator (a key-value store for rendezvous).
  // Empty: CJAX_COORDINATOR_ADDRESS.
  std::string coordinator_address = {};
  int num_processes = 0;  // 0: CJAX_NUM_PROCESSES
  int process_id = -1;    // -1: CJAX_PROCESS_ID
  // Which GPUs this process drives (JAX's local_device_ids). CPU devices are the process's
  // CJAX_NUM_CPU_DEVICES virtual devices: a non-empty list raises ValueError until the NCCL path
  // lands (docs/distributed.md §5).
  std::vector<int> local_device_ids = {};
  // How long to wait for every process to join (and, later, at shutdown): CollectiveError naming
  // the processes that did not. Default 300 s, or CJAX_DISTRIBUTED_TIMEOUT_S.
  double initialization_timeout_s = 0;
};

// Connects this process to the others. Must run before the first array is created (BackendError
// otherwise); raises CollectiveError naming the processes that did not join in time, and
// ValueError for an inconsistent configuration (a process id outside [0, num_processes), a
// malformed address).
void initialize(const Options& options = {});
// Waits for every process to reach shutdown, then closes the connections. Without it a process
// that exits looks to the others like one that crashed.
void shutdown();
bool is_initialized();
}  // namespace distributed

// This process's index and the number of processes (0 and 1 without distributed::initialize).
int process_index();
int process_count();
// The devices this process drives (cjax::devices() lists every process's devices).
std::vector<Device> local_devices(std::string_view platform = "");
int local_device_count();
// Which process drives device d.
int process_index_of(const Device& d);

// A global array from this process's rows: `local` is the concatenation, along the dimensions the
// sharding splits, of the blocks of this process's devices, in device order (JAX's
// make_array_from_process_local_data). On one process it is device_put(local, sharding).
Array make_array_from_process_local_data(const Sharding& sharding, const Array& local);
// A global array of `shape` and `dtype` whose blocks come from cb(index) for each of this
// process's devices, `index` the block's slice of the global array (as Shard::index). A callback
// may take `const Index&` instead (it converts): [&](const Index& idx) { return data[idx]; }.
Array make_array_from_callback(const Shape& shape, const Sharding& sharding,
                               const std::function<Array(const std::vector<Slice>& index)>& cb);
// Whether every block of x is held by this process (a value computed by one process always is).
bool is_fully_addressable(const Array& x);
// The global value of x on every process, gathered over the processes (JAX's
// multihost_utils.process_allgather); x itself when fully addressable.
Array process_allgather(const Array& x);

}  // namespace cjax
