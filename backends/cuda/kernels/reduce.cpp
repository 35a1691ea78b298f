// Reductions on the GPU (reduce_sum/max/min/prod/and/or over any axes): one block per output
// element; its threads stride over the reduced index space (coalesced when the last axis is
// reduced), accumulate in the compute type (f32 for bf16/f16, as on the CPU), then combine in a
// fixed shared-memory tree. No atomics: bitwise identical run to run; differs from the CPU only in
// the order of the float additions. One kernel per (op, dtype, kept rank, reduced rank).
#include <fmt/format.h>

#include <algorithm>
#include <span>

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/kernels/codegen.h"
#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/array/primitive.h"
#include "core/backend/backend.h"

namespace cjax::cuda {
namespace {

constexpr int kMaxRank = 8;
constexpr unsigned kThreads = 256;

struct ReduceDims {  // mirrors CjRed
  long long kept_ext[kMaxRank];
  long long kept_stride[kMaxRank];
  long long red_ext[kMaxRank];
  long long red_stride[kMaxRank];
};

struct Reduction {
  const char* name;
  ScalarOp combine;
  // identity in the compute type
  std::string (*identity)(DType);
};

std::string zero(DType d) { return d == DType::bool_ ? "false" : "0"; }
std::string one(DType d) { return d == DType::bool_ ? "true" : "1"; }
std::string all_ones(DType d) { return d == DType::bool_ ? "true" : fmt::format("(({})~0ull)", storage_type(d)); }

const Reduction kReductions[] = {
    {"reduce_sum", ScalarOp::Add, zero},           {"reduce_prod", ScalarOp::Mul, one},
    {"reduce_max", ScalarOp::Max, lowest_literal}, {"reduce_min", ScalarOp::Min, highest_literal},
    {"reduce_and", ScalarOp::And, all_ones},       {"reduce_or", ScalarOp::Or, zero},
};

// The partial (per chunk) results are kept in the compute type: f32 for bf16/f16.
DType partial_dtype(DType d) { return is_half(d) ? DType::float32 : d; }

// Block b reduces chunk b % chunks of output b / chunks (out has outputs * chunks elements).
std::optional<std::string> reduce_source_of(const Reduction& r, DType in, DType out, int kept_rank, int red_rank) {
  std::optional<std::string> expr = scalar_expression(r.combine, in);
  if (!expr || compute_type(in) != compute_type(out)) return std::nullopt;
  const std::string ct = compute_type(in);
  // One reduced dim: a multiply, no division per element.
  std::string offset = red_rank == 1 ? "off = base + r * d.red_stride[0];"
                                     : fmt::format(R"(long long rr = r;
    off = base;
#pragma unroll
    for (int k = {} - 1; k >= 0; --k) {{
      off += (rr % d.red_ext[k]) * d.red_stride[k];
      rr /= d.red_ext[k];
    }})",
                                                   red_rank);
  return fmt::format(R"({0}
struct CjRed {{ long long kept_ext[{1}]; long long kept_stride[{1}]; long long red_ext[{1}]; long long red_stride[{1}]; }};
__device__ __forceinline__ {2} cj_combine({2} x, {2} y) {{ return {3}; }}
extern "C" __global__ void __launch_bounds__({4}) cj_reduce(const {5}* __restrict__ in, {11}* __restrict__ out,
    CjRed d, long long R, long long chunks) {{
  long long rem = blockIdx.x / chunks, chunk = blockIdx.x % chunks, base = 0, off;
#pragma unroll
  for (int k = {6} - 1; k >= 0; --k) {{
    base += (rem % d.kept_ext[k]) * d.kept_stride[k];
    rem /= d.kept_ext[k];
  }}
  long long span = (R + chunks - 1) / chunks, end = min(R, (chunk + 1) * span);
  {2} acc = {7};
  for (long long r = chunk * span + threadIdx.x; r < end; r += {4}) {{
    {8}
    acc = cj_combine(acc, {9});
  }}
  __shared__ {2} part[{4}];
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int w = {4} / 2; w > 0; w >>= 1) {{
    if (threadIdx.x < w) part[threadIdx.x] = cj_combine(part[threadIdx.x], part[threadIdx.x + w]);
    __syncthreads();
  }}
  if (threadIdx.x == 0) out[blockIdx.x] = {10};
}}
)",
                     kPrelude, kMaxRank, ct, *expr, kThreads, storage_type(in), kept_rank, r.identity(in), offset,
                     load(in, "in[off]"), store(out, "part[0]"), storage_type(out));
}

const Reduction* find_reduction(const std::string& name) {
  for (const Reduction& r : kReductions)
    if (name == r.name) return &r;
  return nullptr;
}

std::optional<Array> reduce(const Reduction& r, const Array& x, const AbstractValue& oa, const Params& p) {
  const auto& axes = p.ints("axes");
  std::vector<bool> reduced(size_t(x.ndim()), false);
  for (int64_t a : axes) reduced[size_t(a)] = true;
  auto strides = row_major_strides(x.shape());
  // Adjacent dims of the same kind merge (the operand is row-major), so the common cases index
  // with one multiply instead of a division per dim; size-1 dims drop out.
  std::vector<std::pair<int64_t, int64_t>> kept_dims, red_dims;  // (extent, stride)
  int last = -1;                                                 // kind of the previous dim kept: 0 kept, 1 reduced
  for (size_t i = 0; i < reduced.size(); ++i) {
    if (x.shape()[i] == 1) continue;
    auto& group = reduced[i] ? red_dims : kept_dims;
    if (last == int(reduced[i]) && !group.empty()) {
      group.back().first *= x.shape()[i];
      group.back().second = strides[i];
    } else {
      group.emplace_back(x.shape()[i], strides[i]);
    }
    last = int(reduced[i]);
  }
  if (kept_dims.size() > size_t(kMaxRank) || red_dims.size() > size_t(kMaxRank)) return std::nullopt;
  ReduceDims dims{};
  for (int k = 0; k < kMaxRank; ++k) dims.kept_ext[k] = dims.red_ext[k] = 1;
  int kept = int(kept_dims.size()), red = int(red_dims.size());
  for (int k = 0; k < kept; ++k)
    dims.kept_ext[k] = kept_dims[size_t(k)].first, dims.kept_stride[k] = kept_dims[size_t(k)].second;
  for (int k = 0; k < red; ++k)
    dims.red_ext[k] = red_dims[size_t(k)].first, dims.red_stride[k] = red_dims[size_t(k)].second;
  int64_t outputs = oa.size(), R = 1;
  for (int k = 0; k < red; ++k) R *= dims.red_ext[k];
  Device dev = concrete(x)->device();
  // Few outputs over many elements (a loss's mean): split each reduction into chunks, reduced
  // again in a second pass, so the whole GPU works. The split depends on the shape only:
  // deterministic.
  int64_t sms = gpu(dev).multiprocessors;
  int64_t chunks =
      outputs >= 2 * sms
          ? 1
          : std::clamp<int64_t>(R / 4096, 1, std::max<int64_t>(1, 4 * sms / std::max<int64_t>(outputs, 1)));
  if (outputs * chunks > (int64_t(1) << 31) - 1) return std::nullopt;
  DType pd = chunks > 1 ? partial_dtype(x.dtype()) : oa.dtype;
  std::optional<std::string> src = reduce_source_of(r, x.dtype(), pd, std::max(kept, 1), std::max(red, 1));
  if (!src) return std::nullopt;
  Array out = make_uninitialized(oa, dev);
  if (outputs == 0) return out;
  Array first = chunks > 1 ? make_uninitialized(AbstractValue{Shape{outputs, chunks}, pd, false, {}}, dev) : out;
  void* in_ptr = raw_ptr(x);
  void* out_ptr = raw_ptr(first);
  long long n_red = R, n_chunks = chunks;
  launch(dev, *src, "cj_reduce", unsigned(outputs * chunks), kThreads, {&in_ptr, &out_ptr, &dims, &n_red, &n_chunks});
  if (chunks > 1) {
    ReduceDims second{};
    for (int k = 0; k < kMaxRank; ++k) second.kept_ext[k] = second.red_ext[k] = 1;
    second.kept_ext[0] = outputs, second.kept_stride[0] = chunks;
    second.red_ext[0] = chunks, second.red_stride[0] = 1;
    std::optional<std::string> src2 = reduce_source_of(r, pd, oa.dtype, 1, 1);
    if (!src2) return std::nullopt;
    void* p_ptr = raw_ptr(first);
    void* o_ptr = raw_ptr(out);
    long long one = 1;
    launch(dev, *src2, "cj_reduce", unsigned(outputs), kThreads, {&p_ptr, &o_ptr, &second, &n_chunks, &one});
  }
  return out;
}

}  // namespace

std::optional<std::string> reduce_source(const std::string& primitive, DType in, DType out, int kept_rank,
                                         int reduced_rank) {
  const Reduction* r = find_reduction(primitive);
  return r ? reduce_source_of(*r, in, out, kept_rank, reduced_rank) : std::nullopt;
}

namespace {
const bool g_registered = [] {
  for (const Reduction& r : kReductions)
    register_kernel(r.name, Platform::cuda,
                    [&r](std::span<const Array> in, std::span<const AbstractValue> out_avals,
                         const Params& p) -> std::vector<Array> {
                      if (std::optional<Array> out = reduce(r, in[0], out_avals[0], p)) return {*out};
                      return run_on_host(*find_primitive(r.name), Platform::cuda, in, out_avals, p);
                    });
  return true;
}();

}  // namespace
}  // namespace cjax::cuda
