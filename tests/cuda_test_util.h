// Helpers of the GPU test programs: they exit with 77 (ctest: skipped) where no GPU exists.
#pragma once
#include <cjax/cjax.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "backends/cuda/cuda_api.h"
#include "core/array/array_impl.h"

namespace cuda_test {

inline const bool g_gpu_or_skip = [] {
  if (cjax::devices("cuda").empty()) {
    std::printf("skipped: no cuda device (%s)\n", cjax::cuda::driver_unavailable_reason().c_str());
    std::fflush(stdout);
    std::_Exit(77);
  }
  return true;
}();

inline const cjax::Device kGpu(cjax::Platform::cuda, 0);
inline cjax::Array on_gpu(const cjax::Array& x) { return cjax::device_put(x, cjax::SingleDeviceSharding(kGpu)); }
inline cjax::Device device_of(const cjax::Array& x) { return cjax::concrete(x)->device(); }

// |a - b| <= atol + rtol * max(|a|, |b|); NaNs equal NaNs, infinities must match.
inline bool close(double a, double b, double rtol, double atol) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::abs(a - b) <= atol + rtol * std::max(std::abs(a), std::abs(b));
}

}  // namespace cuda_test
