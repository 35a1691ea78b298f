// The CPU kernels of flash_attention and flash_attention_backward (and their packed forms): the
// kernels themselves are attention_kernels.h, built here with the build's vector width and, on
// AVX-512 builds, a second time with 8 lanes (attention_lanes8.cpp).
//
// Which width runs: at head widths up to 16 a 16-lane vector holds at most one row of q, k or v,
// and the 16-lane kernels spend their time on broadcasts (the products' tiles keep one vector per
// row) and 16-lane reductions of 64-key rows; the 8-lane ones hold a row in two vectors. On a
// 2-core Zen 4, the sample's [32,64,8,16] f32 forward+backward ran 11% faster with 8 lanes
// (1.83 vs 2.05 ms; [8,128,8,16]: 1.35 vs 1.48 ms), while at head width 64 the 16-lane kernels were
// 6-10% faster ([8,256,8,64]: 14.9 vs 15.9 ms; [2,1024,8,64]: 45.8 vs 50.9 ms). So AVX-512 builds run
// the 8-lane kernels where H <= 16. The choice follows the shape alone, so a given program runs
// the same kernels, and gives the same bits, on every run.
#include "core/lax/attention.h"

#define CJAX_ATTENTION_NS build_lanes
#ifdef __AVX512F__
#define CJAX_ATTENTION_LANES 16
#else
#define CJAX_ATTENTION_LANES 8
#endif
#include "backends/cpu/kernels/attention_kernels.h"

namespace cjax::cpu {
#ifdef __AVX512F__
namespace lanes8 {  // attention_lanes8.cpp
std::vector<Array> forward_impl(std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p);
std::vector<Array> backward_impl(std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p);
}  // namespace lanes8
#endif

namespace {

#ifdef __AVX512F__
constexpr int64_t kNarrowHeadWidth = 16;  // the widest head the 8-lane kernels take

// Whether a (possibly packed) attention call's heads are narrow: q's last axis.
bool narrow_heads(std::span<const Array> in, const Params& p, bool packed) {
  const Shape q = packed ? attention::packing_of(p).q_shape : in[0].shape();
  return !q.empty() && q.back() <= kNarrowHeadWidth;
}
#endif

std::vector<Array> forward(std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
#ifdef __AVX512F__
  if (narrow_heads(in, p, in.size() == 1)) return lanes8::forward_impl(in, out_avals, p);
#endif
  return build_lanes::forward_impl(in, out_avals, p);
}

std::vector<Array> backward(std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
#ifdef __AVX512F__
  if (narrow_heads(in, p, in.size() == 4)) return lanes8::backward_impl(in, out_avals, p);
#endif
  return build_lanes::backward_impl(in, out_avals, p);
}

const bool g_registered = [] {
  register_kernel("flash_attention", Platform::cpu, forward);
  register_kernel("flash_attention_backward", Platform::cpu, backward);
  register_kernel("flash_attention_packed", Platform::cpu, forward);
  register_kernel("flash_attention_backward_packed", Platform::cpu, backward);
  return true;
}();

}  // namespace
}  // namespace cjax::cpu
