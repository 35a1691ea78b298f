// WorkRecording on CUDA: stream capture into a graph, replayed with cuGraphLaunch.
//
// The recording thread's work goes to a capture stream of the recording's own (the GPU's compute
// stream stays free for other threads, whose work must not land in the graph); its allocations
// become the graph's memory nodes, so intermediates are allocated and freed inside the graph and
// the graph owns no memory between launches. The copies at the boundary are memcpy nodes found
// again after capture by their (source, destination) pair; a replay points them at the call's
// arguments and results (cuGraphExecMemcpyNodeSetParams) and launches the graph on the compute
// stream, where it is ordered with everything else on the GPU.
#include "backends/cuda/graphs.h"

#include <absl/container/flat_hash_set.h>
#include <fmt/format.h>

#include <atomic>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "backends/cuda/cuda_device.h"
#include "cjax/errors.h"

namespace cjax::cuda {
namespace {

struct Copy {
  CUdeviceptr src = 0, dst = 0;
  size_t bytes = 0;
};

// The calling thread's recording (one at a time per thread).
struct ThreadRecording {
  CUcontext context = nullptr;
  CUstream stream = nullptr;
  absl::flat_hash_set<CUdeviceptr> allocated;  // live allocations made in the recording
  std::vector<CUdeviceptr> freed_outside;      // frees of memory from outside, issued at the end
  std::vector<void*> pinned;                   // staged host copies, which the graph keeps
  std::string failure;                         // why the recording cannot be replayed
};
thread_local ThreadRecording* t_recording = nullptr;

struct Dropped {
  std::mutex mu;
  absl::flat_hash_set<CUdeviceptr> pointers;
};
Dropped& dropped() {
  static Dropped d;
  return d;
}
std::atomic<bool> g_any_dropped{false};

class CudaGraph final : public RecordedWork {
 public:
  CudaGraph(Device device, CUcontext context, CUstream compute, CUgraph graph, CUgraphExec exec)
      : device_(device), context_(context), compute_(compute), graph_(graph), exec_(exec) {}
  ~CudaGraph() override {
    const Driver& api = activate(device_);
    api.cuGraphExecDestroy(exec_);  // a launch still running finishes first (the driver defers it)
    api.cuGraphDestroy(graph_);
    if (!pinned.empty()) api.cuStreamSynchronize(compute_);  // a launch may still copy from them
    for (void* p : pinned) api.cuMemFreeHost(p);
  }
  std::vector<void*> pinned;  // host bytes the graph copies to the device
  struct Node {
    CUgraphNode node = nullptr;  // null: a copy of 0 bytes (nothing recorded)
    CUDA_MEMCPY3D params{};
  };
  std::vector<Node> ins, outs;

  void replay(std::span<const void* const> inputs, std::span<void* const> outputs) override {
    if (inputs.size() != ins.size() || outputs.size() != outs.size())
      throw BackendError(fmt::format("a CUDA graph recorded with {} inputs and {} outputs was replayed with {} and {}",
                                     ins.size(), outs.size(), inputs.size(), outputs.size()));
    const Driver& api = activate(device_);
    for (size_t k = 0; k < ins.size(); ++k) retarget(ins[k], &CUDA_MEMCPY3D::srcDevice, inputs[k]);
    for (size_t k = 0; k < outs.size(); ++k) retarget(outs[k], &CUDA_MEMCPY3D::dstDevice, outputs[k]);
    check(api.cuGraphLaunch(exec_, compute_), "cuGraphLaunch");
  }

 private:
  void retarget(Node& n, CUdeviceptr CUDA_MEMCPY3D::*end, const void* p) {
    auto ptr = reinterpret_cast<CUdeviceptr>(p);
    if (!n.node || n.params.*end == ptr) return;
    n.params.*end = ptr;
    check(driver()->cuGraphExecMemcpyNodeSetParams(exec_, n.node, &n.params, context_),
          "cuGraphExecMemcpyNodeSetParams");
  }
  Device device_;
  CUcontext context_;
  CUstream compute_;
  CUgraph graph_;
  CUgraphExec exec_;
};

class CudaRecording final : public WorkRecording {
 public:
  CudaRecording(const Device& d, CUcontext context, CUstream compute) : device_(d), compute_(compute) {
    if (t_recording) throw BackendError("this thread is already recording work on a GPU");
    const Driver& api = activate(d);
    state_.context = context;
    check(api.cuStreamCreate(&state_.stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate (graph capture)");
    // Thread-local mode: this thread's calls that cannot be captured (synchronous copies, context
    // synchronisation) fail instead of running, and other threads are not affected.
    CUresult r = api.cuStreamBeginCapture(state_.stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
    if (r != CUDA_SUCCESS) {
      api.cuStreamDestroy(state_.stream);
      check(r, "cuStreamBeginCapture");
    }
    t_recording = &state_;
  }
  ~CudaRecording() override {
    if (capturing_) {
      CUgraph g = nullptr;
      end_capture(&g);
      if (g) driver()->cuGraphDestroy(g);
    }
    for (void* p : pinned_) driver()->cuMemFreeHost(p);  // what no graph took
  }

  void copy_in(const void* src, void* dst, size_t bytes) override { copy(ins_, src, dst, bytes); }
  void copy_out(const void* src, void* dst, size_t bytes) override { copy(outs_, src, dst, bytes); }

  std::unique_ptr<RecordedWork> finish() override {
    CUgraph graph = nullptr;
    CUresult r = end_capture(&graph);
    const Driver& api = *driver();
    auto fail = [&](const std::string& why) {
      if (graph) api.cuGraphDestroy(graph);
      throw BackendError(fmt::format("the work on {} could not be recorded as a CUDA graph: {}", device_.str(), why));
    };
    if (!failure_.empty()) fail(failure_);
    if (r != CUDA_SUCCESS || !graph) fail(fmt::format("cuStreamEndCapture returned {}", error_name(r)));
    if (allocated_live_) fail(fmt::format("{} buffers allocated in the recording outlive it", allocated_live_));
    // The boundary copies, found again among the graph's memcpy nodes by their (source,
    // destination) pair.
    std::vector<CudaGraph::Node> in_nodes(ins_.size()), out_nodes(outs_.size());
    size_t n = 0;
    check(api.cuGraphGetNodes(graph, nullptr, &n), "cuGraphGetNodes");
    std::vector<CUgraphNode> nodes(n);
    check(api.cuGraphGetNodes(graph, nodes.data(), &n), "cuGraphGetNodes");
    size_t found = 0, wanted = 0;
    for (const std::vector<Copy>* side : {&ins_, &outs_})
      for (const Copy& c : *side) wanted += c.bytes > 0;
    for (CUgraphNode node : nodes) {
      CUgraphNodeType type{};
      check(api.cuGraphNodeGetType(node, &type), "cuGraphNodeGetType");
      if (type != CU_GRAPH_NODE_TYPE_MEMCPY) continue;
      CUDA_MEMCPY3D p{};
      check(api.cuGraphMemcpyNodeGetParams(node, &p), "cuGraphMemcpyNodeGetParams");
      auto match = [&](const std::vector<Copy>& copies, std::vector<CudaGraph::Node>& into) {
        for (size_t k = 0; k < copies.size(); ++k)
          if (!into[k].node && copies[k].bytes > 0 && copies[k].src == p.srcDevice && copies[k].dst == p.dstDevice) {
            into[k] = {node, p};
            ++found;
            return true;
          }
        return false;
      };
      if (!match(ins_, in_nodes)) match(outs_, out_nodes);
    }
    if (found != wanted)
      fail(fmt::format("{} of the {} boundary copies were not found in the captured graph", wanted - found, wanted));
    CUgraphExec exec = nullptr;
    if (CUresult ri = api.cuGraphInstantiateWithFlags(&exec, graph, 0); ri != CUDA_SUCCESS)
      fail(fmt::format("cuGraphInstantiate returned {}", error_name(ri)));
    auto work = std::make_unique<CudaGraph>(device_, state_.context, compute_, graph, exec);
    work->ins = std::move(in_nodes);
    work->outs = std::move(out_nodes);
    work->pinned = std::move(pinned_);
    graph = nullptr;  // the CudaGraph owns it now
    return work;
  }

 private:
  void copy(std::vector<Copy>& side, const void* src, void* dst, size_t bytes) {
    Copy c{reinterpret_cast<CUdeviceptr>(src), reinterpret_cast<CUdeviceptr>(dst), bytes};
    if (bytes > 0) check(activate(device_).cuMemcpyDtoDAsync(c.dst, c.src, bytes, state_.stream), "cuMemcpyDtoDAsync");
    side.push_back(c);
  }
  CUresult end_capture(CUgraph* graph) {
    capturing_ = false;
    t_recording = nullptr;
    const Driver& api = *driver();
    CUresult r = api.cuStreamEndCapture(state_.stream, graph);
    failure_ = state_.failure;
    allocated_live_ = state_.allocated.size();
    if (!state_.allocated.empty()) {  // never backed: frees of them later are skipped
      std::lock_guard lock(dropped().mu);
      dropped().pointers.insert(state_.allocated.begin(), state_.allocated.end());
      g_any_dropped = true;
    }
    for (CUdeviceptr p : state_.freed_outside) api.cuMemFreeAsync(p, compute_);
    api.cuStreamDestroy(state_.stream);
    pinned_ = std::move(state_.pinned);
    return r;
  }
  static std::string error_name(CUresult r) {
    const char* name = nullptr;
    driver()->cuGetErrorName(r, &name);
    return name ? name : fmt::format("error {}", int(r));
  }

  Device device_;
  CUstream compute_;
  ThreadRecording state_;
  bool capturing_ = true;
  std::string failure_;
  size_t allocated_live_ = 0;
  std::vector<void*> pinned_;
  std::vector<Copy> ins_, outs_;
};

ThreadRecording* recording_on(CUcontext context) {
  return t_recording && t_recording->context == context ? t_recording : nullptr;
}

}  // namespace

std::unique_ptr<WorkRecording> begin_recording(const Device& d, CUcontext context, CUstream compute) {
  return std::make_unique<CudaRecording>(d, context, compute);
}

CUstream recording_stream(CUcontext context) {
  ThreadRecording* r = recording_on(context);
  return r ? r->stream : nullptr;
}

bool recording_allocate(CUcontext context, size_t nbytes, CUdeviceptr* out) {
  ThreadRecording* r = recording_on(context);
  if (!r) return false;
  check(driver()->cuMemAllocAsync(out, nbytes, r->stream), "cuMemAllocAsync (recorded)");
  r->allocated.insert(*out);
  return true;
}

bool recording_free(CUcontext context, CUdeviceptr p) {
  ThreadRecording* r = recording_on(context);
  if (!r) return false;
  if (r->allocated.erase(p)) {
    driver()->cuMemFreeAsync(p, r->stream);
  } else {
    r->freed_outside.push_back(p);
    if (r->failure.empty()) r->failure = "it frees memory allocated outside it, which a replay would read";
  }
  return true;
}

bool recording_copy_from_host(CUcontext context, CUdeviceptr dst, const void* src, size_t nbytes) {
  ThreadRecording* r = recording_on(context);
  if (!r) return false;
  const Driver& api = *driver();
  // Pinned allocation is not a stream operation: allowed while capturing in relaxed mode only.
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  check(api.cuThreadExchangeStreamCaptureMode(&mode), "cuThreadExchangeStreamCaptureMode");
  void* staged = nullptr;
  CUresult res = api.cuMemAllocHost(&staged, nbytes ? nbytes : 1);
  api.cuThreadExchangeStreamCaptureMode(&mode);
  check(res, "cuMemAllocHost (a recorded copy from host memory)");
  r->pinned.push_back(staged);
  if (nbytes > 0) std::memcpy(staged, src, nbytes);
  check(api.cuMemcpyHtoDAsync(dst, staged, nbytes, r->stream), "cuMemcpyHtoDAsync (recorded)");
  return true;
}

bool forget_dropped_allocation(CUdeviceptr p) {
  if (!g_any_dropped.load(std::memory_order_relaxed)) return false;
  std::lock_guard lock(dropped().mu);
  return dropped().pointers.erase(p) > 0;
}

}  // namespace cjax::cuda
