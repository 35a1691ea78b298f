// gather on the GPU for the layouts of take, x[idx] and embedding lookups (batch dims lead the
// output, no batching dims; core/lax/gather_scatter.h leading_batch_gather): one thread per output
// element, indices clamped (clip, promise_in_bounds) or replaced by the fill value (fill_or_drop)
// exactly as the CPU kernel does. The scatters of the matching layouts (x.at[idx].add(v),
// embedding gradients; leading_batch_scatter): one thread per output element that applies the
// updates landing on it in index order, so repeated indices add up deterministically, in the
// CPU's order. It scans every index, which suits the index counts of a training batch; a
// sort-based plan for very large ones is still to come. Other layouts run on the host (counted).
#include <fmt/format.h>

#include <algorithm>
#include <span>

#include "backends/cuda/kernels/codegen.h"
#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/array/primitive.h"
#include "core/backend/backend.h"
#include "core/lax/gather_scatter.h"

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

struct ScatterArgs {  // mirrors CjScatter
  long long out_ext[kMaxRank];
  long long window[kMaxRank];
  long long update_stride[kMaxRank];
  long long dims[kMaxRank];
  long long hi[kMaxRank];
  long long batches, window_size;
};

// One thread per output element, applying the updates that land on it in index order.
std::string scatter_source(DType d, DType index_dtype, int rank, int K, bool clip, const std::string& combine) {
  return kPrelude + fmt::format(R"(
struct CjScatter {{ long long out_ext[{0}]; long long window[{0}]; long long update_stride[{0}]; long long dims[{0}];
                    long long hi[{0}]; long long batches, window_size; }};
extern "C" __global__ void __launch_bounds__({1}) cj_scatter(const {2}* __restrict__ operand,
    const {3}* __restrict__ idx, const {2}* __restrict__ updates, {2}* __restrict__ out, CjScatter g, long long n) {{
  for (long long i = (long long)blockIdx.x * {1} + threadIdx.x; i < n; i += (long long)gridDim.x * {1}) {{
    long long c[{4}], rem = i, wofs = 0;
    bool in_window = true;
#pragma unroll
    for (int d = {4} - 1; d >= 0; --d) {{
      c[d] = rem % g.out_ext[d];
      rem /= g.out_ext[d];
      in_window = in_window && c[d] < g.window[d];
      wofs += c[d] * g.update_stride[d];
    }}
    {5} acc = {6};
    if (in_window) {{
      for (long long b = 0; b < g.batches; ++b) {{
        bool match = true;
#pragma unroll
        for (int k = 0; k < {7}; ++k) {{
          long long v = (long long)idx[b * {7} + k];
          if (v < 0 || v > g.hi[k]) {{
            if (!{8}) {{ match = false; break; }}
            v = v < 0 ? 0 : g.hi[k];
          }}
          match = match && c[g.dims[k]] == v;
        }}
        if (match) {{
          const {5} x = acc, y = {9};
          acc = {10};
        }}
      }}
    }}
    out[i] = {11};
  }}
}}
)",
                                kMaxRank, kThreads, storage_type(d), storage_type(index_dtype), rank, compute_type(d),
                                load(d, "operand[i]"), K, clip ? "true" : "false",
                                load(d, "updates[b * g.window_size + wofs]"), combine, store(d, "acc"));
}

std::optional<Array> scatter(ScalarOp op, bool overwrite, std::span<const Array> in, const AbstractValue& oa,
                             const Params& p) {
  const Array &operand = in[0], &indices = in[1], &updates = in[2];
  if (indices.dtype() == DType::bool_ || is_float(indices.dtype())) return std::nullopt;
  DType d = operand.dtype();
  std::optional<std::string> combine = overwrite ? std::optional<std::string>("y") : scalar_expression(op, d);
  if (d == DType::bool_ && !overwrite) combine = scalar_expression(op == ScalarOp::Add ? ScalarOp::Or : op, d);
  std::optional<LeadingBatchScatter> plan = leading_batch_scatter(operand, indices, updates, p);
  int rank = int(operand.ndim());
  if (!combine || !plan || plan->K < 1 || plan->K > kMaxRank || rank > kMaxRank || rank < 1) return std::nullopt;
  Device dev = concrete(operand)->device();
  Array out = make_uninitialized(oa, dev);
  long long n = out.size();
  if (n == 0) return out;
  ScatterArgs args{};
  for (int r = 0; r < rank; ++r) {
    args.out_ext[r] = operand.shape()[size_t(r)];
    args.window[r] = plan->window[size_t(r)];
    args.update_stride[r] = plan->update_stride[size_t(r)];
  }
  // Along an indexed dim the index, not the window, places the update: every coordinate can
  // match, and the window coordinate there is 0.
  for (int64_t k = 0; k < plan->K; ++k) {
    int64_t d = plan->dims[size_t(k)];
    args.dims[k] = d;
    args.hi[k] = plan->hi[size_t(k)];
    args.window[d] = args.out_ext[d];
    args.update_stride[d] = 0;
  }
  args.batches = plan->batches;
  args.window_size = plan->window_size;
  void* src = raw_ptr(operand);
  void* idx = raw_ptr(indices);
  void* upd = raw_ptr(updates);
  void* dst = raw_ptr(out);
  unsigned grid = unsigned(std::min<long long>((n + kThreads - 1) / kThreads, 1 << 20));
  launch(dev, scatter_source(d, indices.dtype(), rank, int(plan->K), plan->clip, *combine), "cj_scatter", grid,
         kThreads, {&src, &idx, &upd, &dst, &args, &n});
  return out;
}

const bool g_registered = [] {
  struct Kind {
    const char* name;
    ScalarOp op;
    bool overwrite;
  };
  for (Kind k : {Kind{"scatter", ScalarOp::Add, true}, Kind{"scatter-add", ScalarOp::Add, false},
                 Kind{"scatter-mul", ScalarOp::Mul, false}})
    register_kernel(k.name, Platform::cuda,
                    [k](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
                      if (std::optional<Array> out = scatter(k.op, k.overwrite, in, out_avals[0], p))
                        return std::vector<Array>{*out};
                      return run_on_host(*find_primitive(k.name), Platform::cuda, in, out_avals, p);
                    });
  register_kernel("gather", Platform::cuda,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
                    if (std::optional<Array> out = gather(in, out_avals[0], p)) return std::vector<Array>{*out};
                    return run_on_host(*find_primitive("gather"), Platform::cuda, in, out_avals, p);
                  });
  return true;
}();

}  // namespace
}  // namespace cjax::cuda
