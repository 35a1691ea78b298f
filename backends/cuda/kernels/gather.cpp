// gather on the GPU for the layouts of take, x[idx] and embedding lookups (batch dims lead the
// output, no batching dims; core/gather_scatter.h leading_batch_gather): one thread per output
// element, indices clamped (clip, promise_in_bounds) or replaced by the fill value (fill_or_drop)
// exactly as the CPU kernel does. Other layouts run on the host (counted).
#include <fmt/format.h>

#include <algorithm>
#include <span>

#include "backends/cuda/kernels/codegen.h"
#include "core/array_impl.h"
#include "core/backend.h"
#include "core/gather_scatter.h"
#include "core/primitive.h"

namespace cjax::cuda {
namespace {

constexpr int kMaxRank = 8;
constexpr unsigned kThreads = 256;

struct GatherArgs {  // mirrors CjGather
  long long hi[kMaxRank];
  long long start_stride[kMaxRank];
  long long window[kMaxRank];
  long long window_stride[kMaxRank];
  long long batches, window_size;
  unsigned long long fill_bits;
};

}  // namespace

std::string gather_source(size_t itemsize, DType index_dtype, int K, int window_rank, bool fill_mode) {
  return fmt::format(R"(
struct CjGather {{ long long hi[{0}]; long long start_stride[{0}]; long long window[{0}]; long long window_stride[{0}];
                   long long batches, window_size; unsigned long long fill_bits; }};
extern "C" __global__ void __launch_bounds__({1}) cj_gather(const {2}* __restrict__ src, const {3}* __restrict__ idx,
    {2}* __restrict__ out, CjGather g, long long n) {{
  for (long long i = (long long)blockIdx.x * {1} + threadIdx.x; i < n; i += (long long)gridDim.x * {1}) {{
    long long b = i / g.window_size, w = i - b * g.window_size, base = 0;
    bool in_bounds = true;
#pragma unroll
    for (int k = 0; k < {4}; ++k) {{
      long long v = (long long)idx[b * {4} + k];
      if (v < 0 || v > g.hi[k]) {{
        in_bounds = false;
        v = v < 0 ? 0 : g.hi[k];
      }}
      base += v * g.start_stride[k];
    }}
#pragma unroll
    for (int d = {5} - 1; d >= 0; --d) {{
      base += (w % g.window[d]) * g.window_stride[d];
      w /= g.window[d];
    }}
    out[i] = {6} ? ({2})g.fill_bits : src[base];
  }}
}}
)",
                     kMaxRank, kThreads, bits_type(itemsize), storage_type(index_dtype), K, window_rank,
                     fill_mode ? "!in_bounds" : "false");
}

namespace {

std::optional<Array> gather(std::span<const Array> in, const AbstractValue& oa, const Params& p) {
  const Array &operand = in[0], &indices = in[1];
  if (indices.dtype() == DType::bool_ || is_float(indices.dtype())) return std::nullopt;
  std::optional<LeadingBatchGather> plan = leading_batch_gather(operand, indices, p);
  if (!plan || plan->K > kMaxRank || plan->K < 1 || plan->window.size() > size_t(kMaxRank)) return std::nullopt;
  Device dev = concrete(operand)->device();
  Array out = make_uninitialized(oa, dev);
  long long n = out.size();
  if (n == 0) return out;
  GatherArgs args{};
  for (int k = 0; k < kMaxRank; ++k) args.window[k] = 1;
  for (size_t k = 0; k < size_t(plan->K); ++k) args.hi[k] = plan->hi[k], args.start_stride[k] = plan->start_stride[k];
  for (size_t d = 0; d < plan->window.size(); ++d)
    args.window[d] = plan->window[d], args.window_stride[d] = plan->window_strides[d];
  args.batches = plan->batches;
  args.window_size = std::max<int64_t>(plan->window_size, 1);
  args.fill_bits = plan->fill_bits;
  void* src = raw_ptr(operand);
  void* idx = raw_ptr(indices);
  void* dst = raw_ptr(out);
  int window_rank = std::max<int>(1, int(plan->window.size()));
  unsigned grid = unsigned(std::min<long long>((n + kThreads - 1) / kThreads, 1 << 20));
  launch(dev, gather_source(itemsize(operand.dtype()), indices.dtype(), int(plan->K), window_rank, plan->fill_mode),
         "cj_gather", grid, kThreads, {&src, &idx, &dst, &args, &n});
  return out;
}

const bool g_registered = [] {
  register_kernel("gather", Platform::cuda,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
                    if (std::optional<Array> out = gather(in, out_avals[0], p)) return std::vector<Array>{*out};
                    return run_on_host(*find_primitive("gather"), Platform::cuda, in, out_avals, p);
                  });
  return true;
}();

}  // namespace
}  // namespace cjax::cuda
