// Reductions on the GPU (reduce_sum/max/min/prod/and/or over any axes): one block per output
// element; its threads stride over the reduced index space (coalesced when the last axis is
// reduced), accumulate in the compute type (f32 for bf16/f16, as on the CPU), then combine in a
// fixed shared-memory tree. No atomics: bitwise identical run to run; differs from the CPU only in
// the order of the float additions. One kernel per (op, dtype, kept rank, reduced rank).
#include <fmt/format.h>

#include <algorithm>
#include <span>

#include "backends/cuda/kernels/codegen.h"
#include "core/array_impl.h"
#include "core/backend.h"
#include "core/primitive.h"

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
    {"reduce_sum", ScalarOp::Add, zero},          {"reduce_prod", ScalarOp::Mul, one},
    {"reduce_max", ScalarOp::Max, lowest_literal}, {"reduce_min", ScalarOp::Min, highest_literal},
    {"reduce_and", ScalarOp::And, all_ones},      {"reduce_or", ScalarOp::Or, zero},
};

std::optional<std::string> reduce_source_of(const Reduction& r, DType d, int kept_rank, int red_rank) {
  std::optional<std::string> expr = scalar_expression(r.combine, d);
  if (!expr) return std::nullopt;
  const std::string ct = compute_type(d);
  return fmt::format(R"({0}
struct CjRed {{ long long kept_ext[{1}]; long long kept_stride[{1}]; long long red_ext[{1}]; long long red_stride[{1}]; }};
__device__ __forceinline__ {2} cj_combine({2} x, {2} y) {{ return {3}; }}
extern "C" __global__ void __launch_bounds__({4}) cj_reduce(const {5}* __restrict__ in, {5}* __restrict__ out,
    CjRed d, long long R) {{
  long long rem = blockIdx.x, base = 0;
#pragma unroll
  for (int k = {6} - 1; k >= 0; --k) {{
    base += (rem % d.kept_ext[k]) * d.kept_stride[k];
    rem /= d.kept_ext[k];
  }}
  {2} acc = {7};
  for (long long r = threadIdx.x; r < R; r += {4}) {{
    long long rr = r, off = base;
#pragma unroll
    for (int k = {8} - 1; k >= 0; --k) {{
      off += (rr % d.red_ext[k]) * d.red_stride[k];
      rr /= d.red_ext[k];
    }}
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
                     kPrelude, kMaxRank, ct, *expr, kThreads, storage_type(d), kept_rank, r.identity(d), red_rank,
                     load(d, "in[off]"), store(d, "part[0]"));
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
  ReduceDims dims{};
  for (int k = 0; k < kMaxRank; ++k) dims.kept_ext[k] = dims.red_ext[k] = 1;
  int kept = 0, red = 0;
  for (size_t i = 0; i < reduced.size(); ++i) {
    if (reduced[i]) {
      if (red == kMaxRank) return std::nullopt;
      dims.red_ext[red] = x.shape()[i], dims.red_stride[red++] = strides[i];
    } else {
      if (kept == kMaxRank) return std::nullopt;
      dims.kept_ext[kept] = x.shape()[i], dims.kept_stride[kept++] = strides[i];
    }
  }
  std::optional<std::string> src = reduce_source_of(r, x.dtype(), std::max(kept, 1), std::max(red, 1));
  if (!src || oa.size() > (int64_t(1) << 31) - 1) return std::nullopt;
  Device dev = concrete(x)->device();
  Array out = make_uninitialized(oa, dev);
  void* in_ptr = raw_ptr(x);
  void* out_ptr = raw_ptr(out);
  long long R = 1;
  for (int k = 0; k < red; ++k) R *= dims.red_ext[k];
  launch(dev, *src, "cj_reduce", unsigned(oa.size()), kThreads, {&in_ptr, &out_ptr, &dims, &R});
  return out;
}

}  // namespace

std::optional<std::string> reduce_source(const std::string& primitive, DType d, int kept_rank, int reduced_rank) {
  const Reduction* r = find_reduction(primitive);
  return r ? reduce_source_of(*r, d, kept_rank, reduced_rank) : std::nullopt;
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
