// CUDA graphs behind the backend seam's WorkRecording (core/backend/backend.h): a thread's work on
// one GPU is captured on a stream of the recording's own, then replayed with one cuGraphLaunch on
// the GPU's compute stream. docs/cuda.md "CUDA graphs" says when jit uses them.
#pragma once
#include <memory>

#include "backends/cuda/cuda_api.h"
#include "core/backend/backend.h"

namespace cjax::cuda {

// Starts recording the calling thread's work on d, whose compute stream is `compute` (where
// replays run).
std::unique_ptr<WorkRecording> begin_recording(const Device& d, CUcontext context, CUstream compute);

// For the backend's allocator and stream lookup: the stream the calling thread records on for the
// GPU of `context`, else null.
CUstream recording_stream(CUcontext context);
// Allocation and free while the calling thread records on `context`: allocations come from the
// recording (graph memory); a free of memory the recording allocated is recorded, a free of
// memory from outside it is issued on the compute stream once the recording ends (the recording then
// cannot be replayed: it would read memory it does not own). Returns false where the thread does
// not record on `context` (the caller allocates or frees as usual).
bool recording_allocate(CUcontext context, size_t nbytes, CUdeviceptr* out);
bool recording_free(CUcontext context, CUdeviceptr p);
// A copy from host memory while the calling thread records on `context`: the bytes are staged in
// pinned memory the graph keeps, and the copy from there is recorded (every replay copies the
// same bytes: host values a jit program computes come from its literals and shapes, never from
// device memory, which a recording cannot read). Returns false where the thread does not record.
bool recording_copy_from_host(CUcontext context, CUdeviceptr dst, const void* src, size_t nbytes);
// Memory a dropped recording handed out (never backed): frees of it are skipped. True if `p` was
// such memory (it is forgotten).
bool forget_dropped_allocation(CUdeviceptr p);

}  // namespace cjax::cuda
