// The CPU kernels of slice, dynamic_slice and dynamic_update_slice (core/lax/slicing.cpp).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "backends/cpu/kernels/strided_copy.h"
#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/array/util.h"
#include "core/array/visit_dtype.h"
#include "core/backend/backend.h"
#include "core/lax/shape.h"

namespace cjax::cpu {
namespace {

const bool g_registered = [] {
  register_kernel("slice", Platform::cpu,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
                    const Array& x = in[0];
                    const AbstractValue& oa = out_avals[0];
                    const auto& start = p.ints("start_indices");
                    bool strided = !std::holds_alternative<std::monostate>(p.at("strides"));
                    auto ist = row_major_strides(x.shape());
                    size_t isz = itemsize(oa.dtype);
                    int64_t off = 0;
                    std::vector<int64_t> ss(ist.size());
                    for (size_t i = 0; i < ist.size(); ++i) {
                      off += start[i] * ist[i];
                      ss[i] = ist[i] * (strided ? p.ints("strides")[i] : 1);
                    }
                    Array out = make_uninitialized(oa, concrete(x)->device());
                    if (oa.size() > 0)
                      strided_copy(raw_ptr(out), row_major_strides(oa.shape), bytes_of(x) + off * int64_t(isz), ss,
                                   oa.shape, isz);
                    return std::vector<Array>{out};
                  });
  register_kernel("dynamic_slice", Platform::cpu,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params&) {
                    const Array& x = in[0];
                    const AbstractValue& oa = out_avals[0];
                    Array out = make_uninitialized(oa, concrete(x)->device());
                    if (oa.size() == 0) return std::vector<Array>{out};
                    auto st = clamped_starts(in.subspan(1), x.shape(), oa.shape);
                    auto ist = row_major_strides(x.shape());
                    int64_t off = 0;
                    for (size_t i = 0; i < st.size(); ++i) off += st[i] * ist[i];
                    size_t isz = itemsize(oa.dtype);
                    strided_copy(raw_ptr(out), row_major_strides(oa.shape), bytes_of(x) + off * int64_t(isz), ist,
                                 oa.shape, isz);
                    return std::vector<Array>{out};
                  });
  register_kernel("dynamic_update_slice", Platform::cpu,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params&) {
                    const Array& x = in[0];
                    const Array& upd = in[1];
                    const AbstractValue& oa = out_avals[0];
                    Array out = make_uninitialized(oa, concrete(x)->device());
                    size_t isz = itemsize(oa.dtype);
                    if (oa.size() == 0) return std::vector<Array>{out};
                    auto ost = row_major_strides(oa.shape);
                    strided_copy(raw_ptr(out), ost, raw_ptr(x), ost, oa.shape, isz);
                    if (upd.size() == 0) return std::vector<Array>{out};
                    auto st = clamped_starts(in.subspan(2), x.shape(), upd.shape());
                    int64_t off = 0;
                    for (size_t i = 0; i < st.size(); ++i) off += st[i] * ost[i];
                    strided_copy(bytes_of(out) + off * int64_t(isz), ost, raw_ptr(upd), row_major_strides(upd.shape()),
                                 upd.shape(), isz);
                    return std::vector<Array>{out};
                  });
  return true;
}();

}  // namespace
}  // namespace cjax::cpu
