// Small helpers shared by the op families (axis normalisation, promotion, broadcasting).
#pragma once
#include <fmt/format.h>

#include <cstdlib>
#include <string_view>
#include <vector>

#include "cjax/array.h"

namespace cjax {

// An on/off environment switch: set to anything but "" or "0" means on.
inline bool env_flag(const char* name) {
  const char* e = std::getenv(name);
  return e && *e && std::string_view(e) != "0";
}
// A switch that is on unless set to "0".
inline bool env_not_off(const char* name) {
  const char* e = std::getenv(name);
  return !(e && std::string_view(e) == "0");
}

// The instruction set generated code may use (CJAX_ISA): "native" (default: everything the host
// has) or "avx2" (x86-64-v3: AVX2 + FMA, no AVX-512), to run the AVX2 code paths of the LLVM
// kernels and LIBXSMM on an AVX-512 host. Any other value raises BackendError.
enum class CpuIsa { Native, Avx2 };
inline CpuIsa requested_cpu_isa() {
  const char* e = std::getenv("CJAX_ISA");
  std::string_view v = e ? e : "";
  if (v.empty() || v == "native") return CpuIsa::Native;
  if (v == "avx2") return CpuIsa::Avx2;
  throw BackendError(fmt::format("CJAX_ISA='{}' is not an instruction set cjax knows; use 'native' or 'avx2'", v));
}

// Normalises a possibly negative axis for an array of rank `ndim`; raises ValueError naming
// the function, the axis and the rank otherwise.
inline int64_t canonicalize_axis(int64_t axis, int64_t ndim, std::string_view fn) {
  if (axis < -ndim || axis >= ndim)
    throw ValueError(fmt::format("{}: axis {} is out of bounds for an array of rank {} (valid: {}..{})", fn, axis, ndim,
                                 -ndim, ndim - 1));
  return axis < 0 ? axis + ndim : axis;
}
// Same for a list; also rejects repeated axes.
inline std::vector<int64_t> canonicalize_axes(const std::vector<int64_t>& axes, int64_t ndim, std::string_view fn) {
  std::vector<int64_t> out;
  out.reserve(axes.size());
  for (int64_t a : axes) {
    int64_t c = canonicalize_axis(a, ndim, fn);
    for (int64_t o : out)
      if (o == c) throw ValueError(fmt::format("{}: repeated axis {} in {}", fn, a, fmt::join(axes, ", ")));
    out.push_back(c);
  }
  return out;
}

// numpy-level argument preparation (implemented in core/numpy/elementwise.cpp):
// converts all arrays to their JAX result type (weak scalars yield), keeping weak_type right.
std::vector<Array> promote_dtypes(std::string_view fn, const std::vector<Array>& args);
// Broadcasts to a common shape with numpy rules; raises ShapeError naming fn and the shapes.
std::vector<Array> broadcast_all(std::string_view fn, const std::vector<Array>& args);
// Converts `x` to dtype `d` as an exact new type (used when an op fixes the result dtype).
Array convert_to(const Array& x, DType d, bool weak = false);

}  // namespace cjax
