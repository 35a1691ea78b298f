// Shape primitives on the GPU. reshape and squeeze are views (no kernel); broadcast_in_dim,
// transpose, slice, rev and concatenate are one strided copy each (concatenate: one per operand;
// pad: a broadcast of the padding value, then one into the interior):
// out[out_off + sum_k c_k * out_stride_k] = in[in_off + sum_k c_k * in_stride_k] over an index
// space of up to 8 dims. One kernel per (element size, rank); the extents and strides are kernel
// arguments, so a new shape compiles nothing.
#include "core/lax/shape.h"

#include <fmt/format.h>

#include <algorithm>
#include <span>

#include "backends/cuda/kernels/codegen.h"
#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/array/primitive.h"
#include "core/backend/backend.h"

namespace cjax::cuda {
namespace {

constexpr int kMaxRank = 8;
constexpr unsigned kThreads = 256;

struct CopyDims {  // mirrors the kernel's CjDims (passed by value)
  long long ext[kMaxRank];
  long long in_stride[kMaxRank];
  long long out_stride[kMaxRank];
};

}  // namespace

std::string strided_copy_source(size_t itemsize, int rank) {
  const char* t = bits_type(itemsize);
  return fmt::format(R"(
struct CjDims {{ long long ext[{0}]; long long in_stride[{0}]; long long out_stride[{0}]; }};
extern "C" __global__ void __launch_bounds__({1}) cj_strided_copy(const {2}* __restrict__ in, {2}* __restrict__ out,
    long long in_off, long long out_off, CjDims d, long long n) {{
  for (long long i = (long long)blockIdx.x * {1} + threadIdx.x; i < n; i += (long long)gridDim.x * {1}) {{
    long long rem = i, src = in_off, dst = out_off;
#pragma unroll
    for (int k = {3} - 1; k >= 0; --k) {{
      long long c = rem % d.ext[k];
      rem /= d.ext[k];
      src += c * d.in_stride[k];
      dst += c * d.out_stride[k];
    }}
    out[dst] = in[src];
  }}
}}
)",
                     kMaxRank, kThreads, t, rank);
}

namespace {

unsigned grid_for(int64_t n) { return unsigned(std::min<int64_t>((n + kThreads - 1) / kThreads, int64_t(1) << 20)); }

// Copies the index space `ext` (element strides on both sides). Rank above 8: false.
bool strided_copy(const Device& d, const Array& in, int64_t in_off, const std::vector<int64_t>& in_strides,
                  const Array& out, int64_t out_off, const std::vector<int64_t>& out_strides, const Shape& ext) {
  if (ext.size() > size_t(kMaxRank)) return false;
  int64_t n = shape_size(ext);
  if (n == 0) return true;
  CopyDims dims{};
  int rank = std::max<int>(1, int(ext.size()));
  for (int k = 0; k < kMaxRank; ++k) dims.ext[k] = 1;
  for (size_t k = 0; k < ext.size(); ++k) {
    dims.ext[k] = ext[k];
    dims.in_stride[k] = in_strides[k];
    dims.out_stride[k] = out_strides[k];
  }
  void* src = raw_ptr(in);
  void* dst = raw_ptr(out);
  long long ioff = in_off, ooff = out_off, count = n;
  launch(d, strided_copy_source(itemsize(in.dtype()), rank), "cj_strided_copy", grid_for(n), kThreads,
         {&src, &dst, &ioff, &ooff, &dims, &count});
  return true;
}

Device device_of(const Array& a) { return concrete(a)->device(); }

using Kernel = std::function<std::optional<Array>(std::span<const Array>, const AbstractValue&, const Params&)>;

// Registers `k` for `name`; where it returns nullopt the primitive falls back to the host.
void register_copy_kernel(const char* name, Kernel k) {
  register_kernel(name, Platform::cuda,
                  [name, k](std::span<const Array> in, std::span<const AbstractValue> out_avals,
                            const Params& p) -> std::vector<Array> {
                    if (std::optional<Array> out = k(in, out_avals[0], p)) return {*out};
                    return run_on_host(*find_primitive(name), Platform::cuda, in, out_avals, p);
                  });
}

std::optional<Array> broadcast_in_dim(std::span<const Array> in, const AbstractValue& oa, const Params& p) {
  const Array& x = in[0];
  if (oa.size() == x.size()) return make_view(x, oa);
  Array out = make_uninitialized(oa, device_of(x));
  std::vector<int64_t> ss = broadcast_source_strides(x.shape(), oa.shape.size(), p.ints("broadcast_dimensions"));
  if (!strided_copy(device_of(x), x, 0, ss, out, 0, row_major_strides(oa.shape), oa.shape)) return std::nullopt;
  return out;
}

std::optional<Array> transpose(std::span<const Array> in, const AbstractValue& oa, const Params& p) {
  const Array& x = in[0];
  const auto& perm = p.ints("permutation");
  std::vector<int64_t> kept;
  for (int64_t a : perm)
    if (x.shape()[size_t(a)] != 1) kept.push_back(a);
  if (std::is_sorted(kept.begin(), kept.end())) return make_view(x, oa);
  Array out = make_uninitialized(oa, device_of(x));
  std::vector<int64_t> ss = transpose_source_strides(x.shape(), perm);
  if (!strided_copy(device_of(x), x, 0, ss, out, 0, row_major_strides(oa.shape), oa.shape)) return std::nullopt;
  return out;
}

std::optional<Array> slice(std::span<const Array> in, const AbstractValue& oa, const Params& p) {
  const Array& x = in[0];
  const auto& start = p.ints("start_indices");
  std::vector<int64_t> step(start.size(), 1);
  if (!std::holds_alternative<std::monostate>(p.at("strides"))) step = p.ints("strides");
  auto ist = row_major_strides(x.shape());
  int64_t off = 0;
  std::vector<int64_t> ss(start.size());
  for (size_t i = 0; i < start.size(); ++i) {
    off += start[i] * ist[i];
    ss[i] = ist[i] * step[i];
  }
  Array out = make_uninitialized(oa, device_of(x));
  if (!strided_copy(device_of(x), x, off, ss, out, 0, row_major_strides(oa.shape), oa.shape)) return std::nullopt;
  return out;
}

std::optional<Array> rev(std::span<const Array> in, const AbstractValue& oa, const Params& p) {
  const Array& x = in[0];
  auto ss = row_major_strides(x.shape());
  int64_t off = 0;
  for (int64_t d : p.ints("dimensions")) {
    off += (x.shape()[size_t(d)] - 1) * ss[size_t(d)];
    ss[size_t(d)] = -ss[size_t(d)];
  }
  Array out = make_uninitialized(oa, device_of(x));
  if (x.size() == 0) return out;
  if (!strided_copy(device_of(x), x, off, ss, out, 0, row_major_strides(oa.shape), oa.shape)) return std::nullopt;
  return out;
}

std::optional<Array> concatenate(std::span<const Array> in, const AbstractValue& oa, const Params& p) {
  int64_t dim = p.i("dimension");
  Device d = device_of(in[0]);
  Array out = make_uninitialized(oa, d);
  auto os = row_major_strides(oa.shape);
  int64_t at = 0;
  for (const Array& x : in) {
    if (!strided_copy(d, x, 0, row_major_strides(x.shape()), out, at * os[size_t(dim)], os, x.shape()))
      return std::nullopt;
    at += x.shape()[size_t(dim)];
  }
  return out;
}

// pad: the padding value broadcast over the output, then the operand copied into its interior
// positions (low + i * (interior + 1) along each dim). Negative padding (cropping) runs on the host.
std::optional<Array> pad(std::span<const Array> in, const AbstractValue& oa, const Params& p) {
  const Array &x = in[0], &value = in[1];
  const auto& cfg = p.get<std::vector<std::vector<int64_t>>>("padding_config");
  for (const auto& c : cfg)
    if (c[0] < 0 || c[1] < 0) return std::nullopt;
  Device d = device_of(x);
  Array out = make_uninitialized(oa, d);
  auto os = row_major_strides(oa.shape);
  if (!strided_copy(d, value, 0, std::vector<int64_t>(oa.shape.size(), 0), out, 0, os, oa.shape)) return std::nullopt;
  int64_t off = 0;
  std::vector<int64_t> strides(os.size());
  for (size_t k = 0; k < os.size(); ++k) {
    off += cfg[k][0] * os[k];
    strides[k] = os[k] * (cfg[k][2] + 1);
  }
  if (!strided_copy(d, x, 0, row_major_strides(x.shape()), out, off, strides, x.shape())) return std::nullopt;
  return out;
}

const bool g_registered = [] {
  // Views (reshape, squeeze, ...) need no kernel: their defs' impl serves every platform.
  register_copy_kernel("broadcast_in_dim", broadcast_in_dim);
  register_copy_kernel("transpose", transpose);
  register_copy_kernel("slice", slice);
  register_copy_kernel("rev", rev);
  register_copy_kernel("concatenate", concatenate);
  register_copy_kernel("pad", pad);
  return true;
}();

}  // namespace
}  // namespace cjax::cuda
