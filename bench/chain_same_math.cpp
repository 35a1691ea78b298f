// The 10-op chain of bench_compiler written by hand with the same approximations cjax emits
// (backends/cpu/llvm_math.cpp: tanh through expm1 with a small-argument polynomial, logistic
// through exp, both with denormal-safe scaling and NaN propagation), compiled with -O3 for the
// host (GCC vectorizes it) and without -ffast-math, as cjax's kernels are. The peer: it
// measures what fusion and code generation cost, apart from the choice of approximations.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "backends/cpu/llvm_math_coefficients.h"

namespace cjax::bench {
namespace {
namespace mc = cjax::cpu::math_coefficients;

// c[0] + x (c[1] + x (c[2] + ...)), unrolled at compile time (GCC does not vectorize a loop
// containing a loop).
template <size_t I, size_t N>
inline float horner_from(float x, const double (&c)[N]) {
  if constexpr (I == N - 1) {
    return float(c[I]);
  } else {
    return std::fma(horner_from<I + 1>(x, c), x, float(c[I]));
  }
}
template <size_t N>
inline float horner(float x, const double (&c)[N]) {
  return horner_from<0>(x, c);
}
inline float minf(float a, float c) { return a < c ? a : c; }
inline float maxf(float a, float c) { return a > c ? a : c; }
inline float pow2i(int32_t k) { return std::bit_cast<float>((k + 127) << 23); }

struct Reduced {
  float kf, r, tail;
};
inline Reduced exp_reduce(float xh) {
  const float L1 = 0x1.62e4p-1f, L2 = 0x1.7f7d1cp-20f, log2e = 0x1.715476p+0f;
  float kf = std::rint(xh * log2e);
  float rh = std::fma(kf, -L1, xh);
  float r = std::fma(kf, -L2, rh);
  float c = std::fma(kf, -L2, rh - r);
  float q = std::fma(r, horner(r, mc::kExpS_f), 0.5f);
  return {kf, r, std::fma(r * r, q, std::fma(c, r, c))};
}
inline float expm1_core(float xc) {
  Reduced e = exp_reduce(xc);
  int32_t k = int32_t(e.kf);
  bool big = k > 127;
  float s = pow2i(big ? 127 : k);
  float res = std::fma(s, e.r + e.tail, s - 1.f);
  return big ? res * 2.f : res;
}
inline float tanh_same(float x) {
  float a = std::fabs(x), ac = minf(a, 9.5f);
  float t = expm1_core(ac + ac);
  float yb = t / (t + 2.f);
  float z = ac * ac;
  float ys = std::fma(ac * z, horner(z, mc::kTanhU_f), ac);
  float y = a < 0.55f ? ys : yb;
  return std::isnan(x) ? x + x : std::copysign(y, x);
}
inline float logistic_same(float x) {
  float xn = maxf(-std::fabs(x), -104.f);
  Reduced e = exp_reduce(xn);
  bool zero = xn < -103.98f;
  int32_t k = zero ? 0 : int32_t(e.kf), k1 = k >> 1, k2 = k - k1;
  float ex = zero ? 0.f : (1.f + (e.r + e.tail)) * pow2i(k1) * pow2i(k2);
  float num = x < 0.f ? ex : 1.f;
  return std::isnan(x) ? x + x : num / (1.f + ex);
}
}  // namespace

void chain_loop_same_math(const float* __restrict x, float* __restrict y, int64_t b, int64_t e) {
  for (int64_t i = b; i < e; ++i) {
    float v = x[i];
    float c = tanh_same(v * 1.5f + 0.5f);
    float g = maxf(c * v - 0.25f, 0.f) * 2.f;
    y[i] = (logistic_same(g) + v) * 0.5f;
  }
}

}  // namespace cjax::bench
