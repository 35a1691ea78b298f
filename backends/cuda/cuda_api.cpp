#include "backends/cuda/cuda_api.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <mutex>
#include <vector>

#include "cjax/errors.h"

namespace cjax::cuda {
namespace {

struct DriverState {
  Driver api;
  bool ok = false;
  std::string reason;
};

DriverState load_driver() {
  DriverState s;
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = dlerror();
    s.reason = fmt::format("no NVIDIA driver: {}", e ? e : "libcuda.so.1 not found");
    return s;
  }
  // The symbol string is the macro-expanded name (cuMemAlloc -> "cuMemAlloc_v2").
#define CJAX_X(f)                                                                                    \
  s.api.f = reinterpret_cast<decltype(s.api.f)>(dlsym(lib, CJAX_CUDA_STR(f)));                       \
  if (!s.api.f) {                                                                                    \
    s.reason = fmt::format("the NVIDIA driver lacks {} (too old for this build)", CJAX_CUDA_STR(f)); \
    return s;                                                                                        \
  }
  CJAX_CUDA_DRIVER_FUNCTIONS(CJAX_X)
#undef CJAX_X
  CUresult r = s.api.cuInit(0);
  if (r != CUDA_SUCCESS) {
    const char* name = nullptr;
    s.api.cuGetErrorName(r, &name);
    s.reason =
        fmt::format("cuInit failed: {}{}", name ? name : "unknown error",
                    r == CUDA_ERROR_STUB_LIBRARY ? " (the toolkit's stub libcuda was loaded, not a driver)" : "");
    return s;
  }
  s.api.cuDriverGetVersion(&s.api.version);
  if (s.api.version < CUDA_VERSION) {
    s.reason =
        fmt::format("the NVIDIA driver supports CUDA {}.{}, older than the CUDA {}.{} this build needs",
                    s.api.version / 1000, s.api.version % 1000 / 10, CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);
    return s;
  }
  s.ok = true;
  return s;
}

DriverState& driver_state() {
  static DriverState s = load_driver();
  return s;
}

struct NvrtcState {
  Nvrtc api;
  bool ok = false;
  std::string reason;
};

NvrtcState load_nvrtc() {
  NvrtcState s;
  std::string tried;
  void* lib = open_first_library(toolkit_library_candidates("libnvrtc.so.13"), &s.api.path, &tried);
  if (!lib) {
    s.reason =
        fmt::format("NVRTC (libnvrtc.so.13) not found; tried {}. Install the CUDA 13 toolkit or set CUDA_HOME", tried);
    return s;
  }
#define CJAX_X(f) CJAX_CUDA_LOAD_OR_RETURN(s, lib, f)
  CJAX_NVRTC_FUNCTIONS(CJAX_X)
#undef CJAX_X
  s.api.nvrtcVersion(&s.api.major, &s.api.minor);
  s.ok = true;
  return s;
}

NvrtcState& nvrtc_state() {
  static NvrtcState s = load_nvrtc();
  return s;
}
}  // namespace

std::vector<std::string> toolkit_library_candidates(const std::string& soname) {
  std::vector<std::string> c = {soname};
  for (const char* env : {"CUDA_HOME", "CUDA_PATH"})
    if (const char* v = std::getenv(env)) c.push_back(std::string(v) + "/lib64/" + soname);
#ifdef CJAX_CUDA_LIBRARY_DIR
  c.push_back(CJAX_CUDA_LIBRARY_DIR "/" + soname);
#endif
  c.push_back("/usr/local/cuda/lib64/" + soname);
  return c;
}

void* open_first_library(const std::vector<std::string>& candidates, std::string* loaded, std::string* tried) {
  for (const std::string& c : candidates) {
    if (void* lib = dlopen(c.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      *loaded = c;
      return lib;
    }
    *tried += (tried->empty() ? "" : ", ") + c;
  }
  return nullptr;
}

const Driver* driver() { return driver_state().ok ? &driver_state().api : nullptr; }
std::string driver_unavailable_reason() { return driver_state().ok ? "" : driver_state().reason; }

const Nvrtc& nvrtc() {
  if (!nvrtc_state().ok) throw BackendError(nvrtc_state().reason);
  return nvrtc_state().api;
}
bool nvrtc_available() { return nvrtc_state().ok; }

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* desc = nullptr;
  if (const Driver* d = driver()) {
    d->cuGetErrorName(r, &name);
    d->cuGetErrorString(r, &desc);
  }
  throw BackendError(fmt::format("{}: {} ({})", what, name ? name : fmt::format("CUresult {}", int(r)),
                                 desc ? desc : "no description"));
}

void check_nvrtc(nvrtcResult r, const char* what) {
  if (r == NVRTC_SUCCESS) return;
  const char* desc = nvrtc_state().ok ? nvrtc_state().api.nvrtcGetErrorString(r) : "NVRTC not loaded";
  throw BackendError(fmt::format("{}: {}", what, desc));
}

}  // namespace cjax::cuda
