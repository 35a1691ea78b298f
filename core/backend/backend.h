// The backend seam: what a platform (backends/cpu, backends/cuda) provides to the layers above.
// Each backend registers itself at static initialisation; core/ reaches device memory, copies and
// per-platform primitive kernels only through this header, never through a backend's files.
#pragma once
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cjax/array.h"
#include "cjax/device.h"
#include "cjax/dtype.h"
#include "core/backend/scalar_ops.h"

namespace cjax {

struct KernelSpec;

// An in-order queue of work on one device: what is launched on a stream runs after everything
// launched on it before. A cuda stream is a CUstream, and launching returns before the kernel
// runs. A cpu stream runs each launch to completion on the launching thread (its kernels are host
// code, spread over the intra-op thread pool), so its work is always done when the launch returns;
// the device workers (core/backend/device_worker.h) are the host threads that drive devices, not
// streams.
class Stream {
 public:
  explicit Stream(Device device) : device_(device) {}
  virtual ~Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  const Device& device() const { return device_; }
  // Blocks until the work launched on this stream so far has finished.
  virtual void synchronize() = 0;
  // The platform's handle for launches (a CUstream); nullptr on the cpu.
  virtual void* native_handle() const = 0;

 private:
  Device device_;
};

// The fused kernels of one jit program (core/backend/kernel_spec.h), compiled for one device.
class KernelModule {
 public:
  virtual ~KernelModule() = default;
  // Launches kernel k over `buffers` (the spec's inputs, then its outputs: memory of the module's
  // device) on `stream`, a stream of that device. An output marked in place of an input may be
  // given that input's buffer or a buffer of its own.
  virtual void launch(size_t kernel, std::span<void* const> buffers, Stream& stream) const = 0;
  // False where the generator could not express kernel k: jit then runs its equations one by
  // one, each as its own primitive.
  virtual bool has_kernel(size_t kernel) const = 0;
  bool from_cache = false;  // the compiled code came from the kernel cache
  double compile_ms = 0;
};

// A platform's code generator for fused kernels.
class KernelCompiler {
 public:
  virtual ~KernelCompiler() = default;
  // Compiles `specs` as one module for device d. With a non-empty `dump_base` (CJAX_DUMP), writes
  // what the generator produced next to the program's other dumps (dump_base + suffix).
  virtual std::shared_ptr<const KernelModule> compile(const Device& d, std::span<const KernelSpec* const> specs,
                                                      const std::string& dump_base) = 0;
};

// Collectives over raw buffers between the devices of one group, each device a rank (its index
// in the group). Every member calls an operation with its rank, its own buffers and the same
// sizes, and the call returns once that member's output is written; members may call from
// different threads (CPU virtual devices) or processes. Reductions combine the ranks in rank
// order, so results are identical run to run. A member that does not arrive within the timeout
// makes the others raise CollectiveError naming the operation and the missing ranks.
class BufferCommunicator {
 public:
  virtual ~BufferCommunicator() = default;
  virtual int size() const = 0;
  // recv[i] = op over ranks of send_r[i], `count` elements of `dtype` (recv may be send). Bool
  // reduces as logical or (Sum, Max) and and (Prod, Min); integer sums wrap.
  virtual void all_reduce(int rank, const void* send, void* recv, size_t count, DType dtype, ReduceOp op) = 0;
  // recv = send_0 ++ send_1 ++ ... (`bytes` from each rank).
  virtual void all_gather(int rank, const void* send, void* recv, size_t bytes) = 0;
  // recv[i] = op over ranks of send_r[rank * count + i]: the rank's block of the all_reduce.
  virtual void reduce_scatter(int rank, const void* send, void* recv, size_t count, DType dtype, ReduceOp op) = 0;
  // Block r of recv = block `rank` of send_r (`bytes` per block).
  virtual void all_to_all(int rank, const void* send, void* recv, size_t bytes) = 0;
  // For each (source, destination) pair, the destination's recv = the source's send (`bytes`);
  // a rank that is no pair's destination gets zeros (JAX's ppermute). Destinations are distinct;
  // a source may feed several (a broadcast).
  virtual void permute(int rank, const void* send, void* recv, size_t bytes,
                       std::span<const std::pair<int, int>> pairs) = 0;
  virtual void barrier(int rank) = 0;
  // Makes every member waiting in an operation, and every later call, raise CollectiveError(why):
  // a member failed and will not arrive.
  virtual void abort(const std::string& why) = 0;
};

// A device's work recorded once and run again with one launch (on CUDA, a graph): see
// Backend::begin_recording.
class RecordedWork {
 public:
  virtual ~RecordedWork() = default;
  // Runs the recorded work on the device's compute stream, its copy-in k reading inputs[k] and
  // its copy-out k writing outputs[k] (device memory of the recorded sizes) in place of the
  // buffers recorded.
  virtual void replay(std::span<const void* const> inputs, std::span<void* const> outputs) = 0;
};

// While it lives, what the calling thread issues on one device (launches, library calls,
// allocations and frees) is recorded, not run. Host copies and synchronisations raise
// BackendError: recorded work cannot read device memory on the host.
class WorkRecording {
 public:
  virtual ~WorkRecording() = default;  // without finish(): dropped, nothing of it ran
  // Copies at the boundary, whose far ends a replay replaces: `bytes` from `src` (memory from
  // outside the recording: an argument) into `dst`; and from `src` to `dst` (memory from outside
  // the recording: a result).
  virtual void copy_in(const void* src, void* dst, size_t bytes) = 0;
  virtual void copy_out(const void* src, void* dst, size_t bytes) = 0;
  // Ends the recording. Raises BackendError with the reason where the work cannot be replayed
  // (an operation could not be recorded, memory allocated in the recording outlives it, memory
  // from outside it was freed in it).
  virtual std::unique_ptr<RecordedWork> finish() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Platform platform() const = 0;
  // The platform's devices; empty when the platform cannot run here (then unavailable_reason()
  // says why: no driver, driver too old, library not found).
  virtual std::vector<Device> devices() = 0;
  virtual std::string unavailable_reason() { return {}; }
  // Whether the host can read and write this platform's buffers through their pointers (CPU
  // memory). Host reads of other buffers go through copy_to_host.
  virtual bool host_accessible() const = 0;
  virtual void* allocate(const Device& d, size_t nbytes) = 0;
  virtual void deallocate(const Device& d, void* p, size_t nbytes) = 0;
  virtual MemoryStats memory_stats(const Device& d) = 0;
  virtual void reset_peak_memory(const Device& d) = 0;
  // Synchronous copies between host memory and a buffer of this platform (after the work queued
  // on the device that writes `src` has finished).
  virtual void copy_to_host(const Device& d, const void* src, void* host_dst, size_t nbytes) = 0;
  virtual void copy_from_host(const Device& d, void* dst, const void* host_src, size_t nbytes) = 0;
  // Synchronous copy from a buffer of device `from` to one of device `to`, both of this platform.
  // By default staged through host memory; a backend overrides it with a direct copy.
  virtual void copy_between_devices(const Device& from, const void* src, const Device& to, void* dst, size_t nbytes);
  // Waits until the device's queued work is done.
  virtual void synchronize(const Device& d) = 0;
  // The device's compute stream: kernels (fused and primitive) and frees are ordered on it.
  virtual Stream& stream(const Device& d) = 0;
  // The fused-kernel compiler jit uses for this platform's devices.
  virtual KernelCompiler* kernel_compiler() = 0;
  // The one-time set-up that primitives `names` need before their first run here (the CPU's
  // GEMMs: LIBXSMM's initialization, ~7 ms), as a job that jit runs on a thread of its own while
  // it compiles a program's kernels, so that the program's first run does not wait for it. Empty
  // when there is nothing left to set up. The job must be safe to run concurrently with the
  // primitives themselves (a first run meanwhile waits for the set-up).
  virtual std::function<void()> preparation(std::span<const std::string_view> names) {
    (void)names;
    return {};
  }
  // A communicator between `group`'s devices (rank i = group[i]). Raises BackendError where the
  // platform has none yet (CUDA: NCCL is future work).
  virtual std::shared_ptr<BufferCommunicator> communicator(std::span<const Device> group);
  // Starts recording the calling thread's work on d (WorkRecording); null where the platform
  // cannot record (the cpu).
  virtual std::unique_ptr<WorkRecording> begin_recording(const Device& d) {
    (void)d;
    return nullptr;
  }
};

// Registers the backend of its platform (once, at static initialisation).
bool register_backend(Backend* backend);
// The backend of `platform`; raises BackendError when this build has none.
Backend& backend_for(Platform platform);
Backend* find_backend(Platform platform);
std::string_view platform_name(Platform platform);  // "cpu", "cuda"
// Raises BackendError naming the device and the reason unless `d` is a device of this process.
void check_device(const Device& d);
// The value of environment variable `name`, or `fallback` when it is unset; BackendError naming
// the variable when it is not an integer in [1, 4096].
int positive_env_int(const char* name, int fallback);

}  // namespace cjax
