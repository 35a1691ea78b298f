// Hand-written peers of bench_compiler, compiled in their own translation unit with
// -ffast-math -fopenmp-simd (bench/CMakeLists.txt): glibc's <math.h> declares the vector variants
// of tanhf/expf (libmvec, `_ZGVeN16v_tanhf`...) only under __FAST_MATH__, and `#pragma omp simd`
// lets GCC call them from the vectorized loop. -fno-tree-loop-distribute-patterns keeps the
// STREAM store loop a loop (GCC would otherwise turn it into a memcpy call).
#include <algorithm>
#include <cmath>
#include <cstdint>

namespace cjax::bench {

// y[i] = the 10-op chain of bench_compiler.cpp on x[i], for i in [b, e).
void chain_loop(const float* __restrict x, float* __restrict y, int64_t b, int64_t e) {
#pragma omp simd
  for (int64_t i = b; i < e; ++i) {
    float v = x[i];
    float a = v * 1.5f;                    // mul
    float c = std::tanh(a + 0.5f);         // add, tanh
    float d = c * v - 0.25f;               // mul, sub
    float g = std::max(d, 0.f) * 2.f;      // relu, mul
    float s = 1.f / (1.f + std::exp(-g));  // sigmoid
    y[i] = (s + v) * 0.5f;                 // add, mul
  }
}

// dst[i] = src[i] with ordinary (write-allocate) vector stores, for i in [b, e).
void copy_loop(const float* __restrict src, float* __restrict dst, int64_t b, int64_t e) {
#pragma omp simd
  for (int64_t i = b; i < e; ++i) dst[i] = src[i];
}

}  // namespace cjax::bench
