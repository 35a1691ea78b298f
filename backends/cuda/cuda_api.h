// The CUDA driver and NVRTC, loaded at run time with dlopen: the library links no CUDA library,
// so one binary runs on machines with and without a GPU. The toolkit's headers give the types.
#pragma once
#include <cuda.h>
#include <nvrtc.h>

#include <string>
#include <vector>

namespace cjax::cuda {

// X(name): looked up under the versioned export that cuda.h's macros give the name (cuMemAlloc_v2).
#define CJAX_CUDA_DRIVER_FUNCTIONS(X)  \
  X(cuInit)                            \
  X(cuDriverGetVersion)                \
  X(cuGetErrorName)                    \
  X(cuGetErrorString)                  \
  X(cuDeviceGetCount)                  \
  X(cuDeviceGet)                       \
  X(cuDeviceGetName)                   \
  X(cuDeviceGetAttribute)              \
  X(cuDeviceTotalMem)                  \
  X(cuDevicePrimaryCtxRetain)          \
  X(cuCtxSetCurrent)                   \
  X(cuCtxSynchronize)                  \
  X(cuDeviceGetDefaultMemPool)         \
  X(cuMemPoolSetAttribute)             \
  X(cuMemPoolGetAttribute)             \
  X(cuMemAllocAsync)                   \
  X(cuMemFreeAsync)                    \
  X(cuMemcpyHtoD)                      \
  X(cuMemcpyDtoH)                      \
  X(cuMemcpyDtoD)                      \
  X(cuMemcpyDtoDAsync)                 \
  X(cuMemsetD8Async)                   \
  X(cuMemGetInfo)                      \
  X(cuModuleLoadData)                  \
  X(cuModuleGetFunction)               \
  X(cuLaunchKernel)                    \
  X(cuStreamCreate)                    \
  X(cuStreamDestroy)                   \
  X(cuStreamSynchronize)               \
  X(cuMemcpyHtoDAsync)                 \
  X(cuMemcpyDtoHAsync)                 \
  X(cuStreamBeginCapture)              \
  X(cuStreamEndCapture)                \
  X(cuGraphInstantiateWithFlags)       \
  X(cuGraphLaunch)                     \
  X(cuGraphDestroy)                    \
  X(cuGraphExecDestroy)                \
  X(cuGraphGetNodes)                   \
  X(cuGraphNodeGetType)                \
  X(cuGraphMemcpyNodeGetParams)        \
  X(cuGraphExecMemcpyNodeSetParams)    \
  X(cuDeviceGetGraphMemAttribute)      \
  X(cuThreadExchangeStreamCaptureMode) \
  X(cuMemAllocHost)                    \
  X(cuMemFreeHost)                     \
  X(cuDeviceGraphMemTrim)

#define CJAX_NVRTC_FUNCTIONS(X) \
  X(nvrtcVersion)               \
  X(nvrtcGetErrorString)        \
  X(nvrtcCreateProgram)         \
  X(nvrtcDestroyProgram)        \
  X(nvrtcCompileProgram)        \
  X(nvrtcGetProgramLogSize)     \
  X(nvrtcGetProgramLog)         \
  X(nvrtcGetCUBINSize)          \
  X(nvrtcGetCUBIN)              \
  X(nvrtcGetPTXSize)            \
  X(nvrtcGetPTX)

struct Driver {
#define CJAX_X(f) decltype(&::f) f = nullptr;
  CJAX_CUDA_DRIVER_FUNCTIONS(CJAX_X)
#undef CJAX_X
  int version = 0;  // cuDriverGetVersion, e.g. 13000
};

struct Nvrtc {
#define CJAX_X(f) decltype(&::f) f = nullptr;
  CJAX_NVRTC_FUNCTIONS(CJAX_X)
#undef CJAX_X
  int major = 0, minor = 0;
  std::string path;  // the file that was loaded
};

// The driver, loaded and initialised once (cuInit); null when it cannot be, with the reason in
// driver_unavailable_reason() ("libcuda.so.1: cannot open shared object file", "cuInit failed:
// CUDA_ERROR_NO_DEVICE", "driver 12.2 is older than CUDA 13.0, which this build needs").
const Driver* driver();
std::string driver_unavailable_reason();
// NVRTC (works without a driver and without a GPU); raises BackendError naming the paths tried.
const Nvrtc& nvrtc();
bool nvrtc_available();

// Where a CUDA library other than the driver is looked for, in order: `soname` on the loader's
// path, $CUDA_HOME/lib64, $CUDA_PATH/lib64, the toolkit found at build time, /usr/local/cuda/lib64.
std::vector<std::string> toolkit_library_candidates(const std::string& soname);
// dlopens the first candidate that opens; null if none does. `loaded` gets its path, `tried` the
// others, comma-separated.
void* open_first_library(const std::vector<std::string>& candidates, std::string* loaded, std::string* tried);
// Inside a loader that returns its state `s` (with s.api, s.api.path and s.reason): looks function
// `f` up in `lib` under its macro-expanded name, or returns s with the reason "<path> lacks <f>".
#define CJAX_CUDA_STR2(x) #x
#define CJAX_CUDA_STR(x) CJAX_CUDA_STR2(x)
#define CJAX_CUDA_LOAD_OR_RETURN(s, lib, f)                                    \
  s.api.f = reinterpret_cast<decltype(s.api.f)>(dlsym(lib, CJAX_CUDA_STR(f))); \
  if (!s.api.f) {                                                              \
    s.reason = fmt::format("{} lacks {}", s.api.path, CJAX_CUDA_STR(f));       \
    return s;                                                                  \
  }
// Raises BackendError "<what>: CUDA_ERROR_... (description)" unless r is CUDA_SUCCESS.
void check(CUresult r, const char* what);
void check_nvrtc(nvrtcResult r, const char* what);

}  // namespace cjax::cuda
