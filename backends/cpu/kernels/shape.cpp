// The CPU kernels of the shape primitives (core/lax/shape.cpp): broadcast_in_dim, transpose, rev,
// concatenate, pad and iota. Views (reshape, squeeze) need none: their defs' impl serves every platform.
#include "core/lax/shape.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "backends/cpu/kernels/strided_copy.h"
#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/array/primitive.h"
#include "core/array/util.h"
#include "core/array/visit_dtype.h"
#include "core/backend/backend.h"
#include "core/backend/parallel.h"

namespace cjax::cpu {
namespace {

const bool g_registered = [] {
  register_kernel("broadcast_in_dim", Platform::cpu,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
                    const Array& x = in[0];
                    const AbstractValue& oa = out_avals[0];
                    // Only size-1 dimensions are inserted: the row-major layout is unchanged.
                    if (oa.size() == x.size()) return std::vector<Array>{make_view(x, oa)};
                    Array out = make_uninitialized(oa, device_of(x));
                    std::vector<int64_t> ss =
                        broadcast_source_strides(x.shape(), oa.shape.size(), p.ints("broadcast_dimensions"));
                    strided_copy(raw_ptr(out), row_major_strides(oa.shape), raw_ptr(x), ss, oa.shape,
                                 itemsize(oa.dtype));
                    return std::vector<Array>{out};
                  });
  register_kernel("transpose", Platform::cpu,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
                    const Array& x = in[0];
                    const AbstractValue& oa = out_avals[0];
                    const auto& perm = p.ints("permutation");
                    // Moving only size-1 dimensions keeps the layout.
                    std::vector<int64_t> kept;
                    for (int64_t a : perm)
                      if (x.shape()[size_t(a)] != 1) kept.push_back(a);
                    if (std::is_sorted(kept.begin(), kept.end())) return std::vector<Array>{make_view(x, oa)};
                    Array out = make_uninitialized(oa, device_of(x));
                    std::vector<int64_t> ss = transpose_source_strides(x.shape(), perm);
                    strided_copy(raw_ptr(out), row_major_strides(oa.shape), raw_ptr(x), ss, oa.shape,
                                 itemsize(oa.dtype));
                    return std::vector<Array>{out};
                  });
  register_kernel("rev", Platform::cpu,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
                    const Array& x = in[0];
                    const AbstractValue& oa = out_avals[0];
                    Array out = make_uninitialized(oa, device_of(x));
                    if (oa.size() == 0) return std::vector<Array>{out};
                    size_t isz = itemsize(oa.dtype);
                    auto ss = row_major_strides(x.shape());
                    int64_t off = 0;
                    for (int64_t d : p.ints("dimensions")) {
                      off += (x.shape()[size_t(d)] - 1) * ss[size_t(d)];
                      ss[size_t(d)] = -ss[size_t(d)];
                    }
                    strided_copy(raw_ptr(out), row_major_strides(oa.shape), bytes_of(x) + off * int64_t(isz), ss,
                                 oa.shape, isz);
                    return std::vector<Array>{out};
                  });
  register_kernel("concatenate", Platform::cpu,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
                    const AbstractValue& oa = out_avals[0];
                    Array out = make_uninitialized(oa, device_of(in[0]));
                    size_t dim = size_t(p.i("dimension"));
                    size_t isz = itemsize(oa.dtype);
                    std::vector<int64_t> starts(oa.shape.size(), 0);
                    for (const Array& x : in) {
                      if (x.size() > 0) copy_block_into(bytes_of(out), oa.shape, starts, bytes_of(x), x.shape(), isz);
                      starts[dim] += x.shape()[dim];
                    }
                    return std::vector<Array>{out};
                  });
  register_kernel("pad", Platform::cpu,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
                    const Array& x = in[0];
                    const AbstractValue& oa = out_avals[0];
                    const auto& cfg = p.get<std::vector<std::vector<int64_t>>>("padding_config");
                    Array out = make_uninitialized(oa, device_of(x));
                    size_t isz = itemsize(oa.dtype);
                    fill_items(raw_ptr(out), oa.size(), raw_ptr(in[1]), isz);
                    if (oa.size() == 0 || x.size() == 0) return std::vector<Array>{out};
                    auto ost = row_major_strides(oa.shape), ist = row_major_strides(x.shape());
                    size_t r = oa.shape.size();
                    std::vector<int64_t> count(r), dst_st(r);
                    int64_t doff = 0, soff = 0;
                    for (size_t i = 0; i < r; ++i) {
                      int64_t lo = cfg[i][0], step = cfg[i][2] + 1, d = x.shape()[i], od = oa.shape[i];
                      int64_t i0 = lo >= 0 ? 0 : (-lo + step - 1) / step;
                      int64_t room = od - lo;  // positions lo + k*step < od  <=>  k < room / step (ceil)
                      int64_t i1 = room <= 0 ? 0 : std::min(d, (room + step - 1) / step);
                      count[i] = std::max<int64_t>(0, i1 - i0);
                      if (count[i] == 0) return std::vector<Array>{out};
                      dst_st[i] = step * ost[i];
                      doff += (lo + i0 * step) * ost[i];
                      soff += i0 * ist[i];
                    }
                    strided_copy(bytes_of(out) + doff * int64_t(isz), dst_st, bytes_of(x) + soff * int64_t(isz), ist,
                                 count, isz);
                    return std::vector<Array>{out};
                  });
  register_kernel("iota", Platform::cpu,
                  [](std::span<const Array>, std::span<const AbstractValue> out_avals, const Params& p) {
                    const AbstractValue& oa = out_avals[0];
                    Array out = make_uninitialized(oa, host_device());
                    size_t dim = size_t(p.i("dimension"));
                    int64_t n = oa.size();
                    if (n == 0) return std::vector<Array>{out};
                    int64_t inner = 1;
                    for (size_t i = dim + 1; i < oa.shape.size(); ++i) inner *= oa.shape[i];
                    int64_t len = oa.shape[dim];
                    visit_dtype(oa.dtype, [&](auto tag) {
                      using T = typename decltype(tag)::type;
                      if constexpr (!std::is_same_v<T, bool>) {
                        T* y = data_ptr<T>(out);
                        parallel_for(n, kCopyGrain, [&](int64_t b, int64_t e) {
                          int64_t q = b / inner, r = b % inner;
                          int64_t v = q % len;
                          for (int64_t i = b; i < e; ++i) {
                            if constexpr (is_half_v<T>)
                              y[i] = T(float(v));
                            else
                              y[i] = T(v);
                            if (++r == inner) {
                              r = 0;
                              if (++v == len) v = 0;
                            }
                          }
                        });
                      }
                    });
                    return std::vector<Array>{out};
                  });
  return true;
}();

}  // namespace
}  // namespace cjax::cpu
