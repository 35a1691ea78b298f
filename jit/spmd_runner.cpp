// The SPMD runner (core/array/spmd.h): compiles a shard_map body once into an Executable (cached per
// body) and runs it concurrently on every mesh device's worker, each with its mesh coordinates
// and one shared in-process communicator. The first device to fail decides the error raised; the
// others stop waiting at collectives instead of hanging.
#include <fmt/format.h>

#include <mutex>
#include <unordered_map>

#include "core/array/spmd.h"
#include "core/array/util.h"
#include "core/distributed/runtime.h"
#include "jit/executable.h"
#include "trace/jaxpr.h"
#include "trace/shard_map.h"

namespace cjax {
namespace {

std::shared_ptr<const Executable> executable_for(const std::shared_ptr<const Jaxpr>& body,
                                                 const std::vector<ManualAxis>& axes,
                                                 const std::vector<std::vector<std::string>>& input_axes) {
  static std::mutex mu;
  static std::unordered_map<const Jaxpr*, std::pair<std::shared_ptr<const Jaxpr>, std::shared_ptr<const Executable>>>
      cache;
  {
    std::lock_guard lk(mu);
    auto it = cache.find(body.get());
    if (it != cache.end()) return it->second.second;
  }
  std::shared_ptr<const Executable> exe;
  {
    AxisEnvScope env(axes);
    exe = std::make_shared<const Executable>(ClosedJaxpr{body, {}}, "jit", input_axes);
  }
  std::lock_guard lk(mu);
  if (cache.size() >= 512) cache.clear();  // bodies of eager one-equation programs come and go
  cache.emplace(body.get(), std::make_pair(body, exe));
  return exe;
}

std::vector<std::vector<Array>> run_spmd(const std::shared_ptr<const Jaxpr>& body, const Mesh& mesh,
                                         const std::vector<ManualAxis>& axes,
                                         const std::vector<std::vector<std::string>>& input_axes,
                                         std::vector<std::vector<Array>> inputs) {
  std::shared_ptr<const Executable> exe = executable_for(body, axes, input_axes);
  size_t n = size_t(mesh.size());
  bool backward = is_transposed_body(body.get());
  // At run time values are concrete (their types carry no varying axes): the axes are bound for
  // the collectives' kernels, with the type checks already done when the body was traced.
  std::vector<ManualAxis> run_axes = axes;
  for (ManualAxis& a : run_axes) a.check_vma = false;
  // Lockstep combines collectives on the host; device memory (virtual GPU devices) goes through
  // the platform's buffer communicator, one thread per device.
  // Across processes, each process runs its own devices, one thread each, and the group
  // communicators carry the collectives between processes (outputs of the others' devices stay
  // empty).
  bool device_memory = in_device_memory(mesh);
  bool lockstep = exe->can_run_lockstep() && !env_flag("CJAX_SPMD_THREADS") && !device_memory &&
                  !distributed::spans_processes(mesh.devices());
  count_spmd_run(lockstep);
  if (lockstep) return exe->run_lockstep(mesh, run_axes, backward, !exe->cheap(), std::move(inputs));
  std::unique_lock<std::mutex> turn;
  if (device_memory) turn = std::unique_lock(device_mesh_run_mutex());
  Communicator comm(mesh.devices());
  std::vector<std::vector<Array>> outs(n);
  run_on_device_workers(mesh, comm, backward, [&](int64_t d) {
    AxisEnvScope env(run_axes);
    outs[size_t(d)] = exe->run(inputs[size_t(d)]);
    inputs[size_t(d)].clear();
  });
  return outs;
}

const bool registered = [] {
  set_spmd_runner(&run_spmd);
  return true;
}();

}  // namespace
}  // namespace cjax
