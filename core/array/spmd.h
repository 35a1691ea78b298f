// Manual axes in scope and the SPMD runtime context (docs/design.md §5.6, docs/shard_map.md §1.2).
//
// * The axis environment is a thread-local stack of the manual mesh axes bound by enclosing
//   shard_maps while their bodies are traced or run, and of the axis names of enclosing vmaps
//   (batch axes) while their functions are traced. Collectives look their axes up here: an axis
//   that is not bound raises AxisNameError ("Found an unbound axis name ..."), and the frame says
//   whether varying-axes types are checked (check_vma; never for a batch axis).
// * The SPMD context tells a collective's kernel which device of which mesh it runs on and which
//   communicator connects it to the other devices; it is set on each device's worker while a
//   staged shard_map body runs there.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "cjax/array.h"
#include "cjax/sharding.h"
#include "core/backend/backend.h"

namespace cjax {

struct ManualAxis {
  std::string name;
  int64_t size = 1;
  bool check_vma = true;
  // A vmap's axis_name (trace/batching.cpp), not a mesh axis: collectives over it are batching
  // rules over the batch dimension, resolved while tracing, never at run time.
  bool batch = false;
};

// Binds `axes` for the scope's lifetime on this thread (inner frames shadow outer ones).
class AxisEnvScope {
 public:
  explicit AxisEnvScope(std::vector<ManualAxis> axes);
  ~AxisEnvScope();
  AxisEnvScope(const AxisEnvScope&) = delete;
  AxisEnvScope& operator=(const AxisEnvScope&) = delete;

 private:
  size_t saved_size_;
};

const ManualAxis* find_manual_axis(std::string_view name);
// The mesh axes in scope (batch axes left out).
std::vector<ManualAxis> manual_axes_in_scope();
// True when the innermost binding of `name` is a vmap's batch axis.
bool is_batch_axis(std::string_view name);
// Product of the sizes of `axes` for collective `op`; AxisNameError naming the first unbound
// axis and the fix (call `op` inside shard_map over a mesh with that axis).
int64_t bound_group_size(const std::vector<std::string>& axes, std::string_view op);
// True when every axis of `axes` is bound with check_vma on (false when the list is empty).
bool vma_checked(const std::vector<std::string>& axes);

// Sorted-set helpers for varying-manual-axes sets (kept sorted by name).
std::vector<std::string> vma_union(const std::vector<std::string>& a, const std::vector<std::string>& b);
std::vector<std::string> vma_minus(const std::vector<std::string>& a, const std::vector<std::string>& b);
bool vma_subset(const std::vector<std::string>& a, const std::vector<std::string>& b);
std::vector<std::string> sorted_axes(std::vector<std::string> a);

// Connects the devices of one SPMD program (core/array/spmd_communicator.cpp). Every device
// arrives at the collectives in the same program order (that is what SPMD means) and then moves
// its blocks through the buffer communicator of its group, made by the devices' backend. A device
// that arrives at a different collective, or finishes or fails while others wait, makes every
// waiting device raise CollectiveError, and so does a wait longer than
// config::collective_timeout_seconds().
class Communicator {
 public:
  explicit Communicator(std::vector<Device> devices);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  // Returns once every device has arrived at the collective `what` ("psum over ('i',) of f32[4]"),
  // which must be the same on every device.
  void arrive(int64_t device, const std::string& what);
  // The buffer communicator of the devices `members` (flat indices into the devices; rank k is
  // members[k]), made by their backend on first use and shared by the members.
  BufferCommunicator& group(const std::vector<int64_t>& members);
  // The runner reports a device that finished its body or failed, so that no device waits for it.
  void device_done(int64_t device);
  void device_failed(int64_t device, const std::string& what);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

struct SpmdContext {
  const Mesh* mesh = nullptr;
  int64_t device = 0;  // flat index into mesh->devices()
  Communicator* comm = nullptr;
  bool backward = false;  // the body is the transpose of a shard_map (collective recorder phase)
};
class SpmdScope {
 public:
  explicit SpmdScope(const SpmdContext& ctx);
  ~SpmdScope();
  SpmdScope(const SpmdScope&) = delete;
  SpmdScope& operator=(const SpmdScope&) = delete;

 private:
  const SpmdContext* saved_;
  SpmdContext ctx_;
};
const SpmdContext* current_spmd();

// The members of `device`'s group for a collective over `axes` (flat mesh device indices, ordered
// row-major over `axes` as written, the first name most significant) and `device`'s position in it.
std::vector<int64_t> axis_group(const Mesh& mesh, const std::vector<std::string>& axes, int64_t device,
                                int64_t* position = nullptr);
// Row-major index of `device` over `axes` (axis_index).
int64_t axis_position(const Mesh& mesh, const std::vector<std::string>& axes, int64_t device);

}  // namespace cjax

namespace cjax {
class Jaxpr;

// Runs `body` (no constvars) once per device of `mesh`, device d on inputs[d]; returns each
// device's outputs. Implemented by the jit layer (it compiles the body once); the shard_map
// primitive calls it. Bodies without effects and without collectives inside control flow run in
// lockstep (Executable::run_lockstep): the instructions between two collectives for every device,
// on the thread pool, then the collective once for all devices. The others run concurrently on every device's worker
// thread, their collectives meeting through one communicator (with a timeout instead of a hang). CJAX_SPMD_THREADS=1
// runs every body on the device workers.
// `input_axes`, where known: per body input, the mesh axes its block varies along (the axes its
// in_spec names; a block is the same on devices that differ only along the others), which lets
// the lockstep run share work between devices also where the body's types are unchecked; empty:
// the body's input types say.
using SpmdRunner = std::vector<std::vector<Array>> (*)(const std::shared_ptr<const Jaxpr>& body, const Mesh& mesh,
                                                       const std::vector<ManualAxis>& axes,
                                                       const std::vector<std::vector<std::string>>& input_axes,
                                                       std::vector<std::vector<Array>> inputs);
void set_spmd_runner(SpmdRunner runner);
SpmdRunner spmd_runner();  // raises BackendError if no runner was linked in
struct SpmdRunStats {
  int64_t lockstep = 0, threaded = 0;
};
SpmdRunStats spmd_run_stats();  // counts of runs by kind so far (for tests)
void count_spmd_run(bool lockstep);
// Whether the mesh's devices keep their data in device memory (virtual GPU devices), where
// collectives must go through the backend's buffer communicator rather than host loops.
bool in_device_memory(const Mesh& mesh);
// Runs body(d) for every mesh device d on that device's worker thread, inside
// SpmdScope{&mesh, d, &comm, backward}; reports each device to `comm` as done or failed (so that
// no device waits at a collective for one that will not come) and raises the first failure.
void run_on_device_workers(const Mesh& mesh, Communicator& comm, bool backward,
                           const std::function<void(int64_t)>& body);
// Held by every run of one thread per device over a mesh in device memory (virtual GPU devices):
// two such runs at once could each hold some device workers while waiting at a collective for a
// worker the other holds, so they take turns.
std::mutex& device_mesh_run_mutex();
}  // namespace cjax
