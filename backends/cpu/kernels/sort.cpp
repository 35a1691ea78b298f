// sort (multi-operand, lexicographic over the first num_keys operands) and top_k (core/lax/sort.cpp): the CPU
// kernels.
//
// Order: JAX's sort comparator. Floating keys are canonicalised first (-0.0 -> +0.0, every NaN ->
// +NaN) and then compared in total order, so NaNs sort last and -0.0 / +0.0 compare equal (a stable
// sort keeps their input order) -- exactly what jax.lax.sort / jnp.sort produce. Keys of every dtype
// are mapped to order-preserving uint64 codes once per slice, so the comparator is a plain integer
// compare (no per-element dtype dispatch).
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <numeric>

#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/array/primitive.h"
#include "core/array/util.h"
#include "core/array/visit_dtype.h"
#include "core/backend/backend.h"
#include "core/backend/parallel.h"

namespace cjax::cpu {
namespace {

// Order-preserving code of one key value.
template <class T>
inline uint64_t sort_code(T v) {
  if constexpr (std::is_same_v<T, bool>)
    return v ? 1u : 0u;
  else if constexpr (is_float_like_v<T>) {
    using F = std::conditional_t<std::is_same_v<T, double>, double, float>;
    F f = F(v);
    if (f != f) return ~uint64_t(0);  // canonical NaN: after +inf
    if (f == F(0)) f = F(0);          // -0.0 == +0.0
    if constexpr (std::is_same_v<F, double>) {
      uint64_t u = std::bit_cast<uint64_t>(f);
      return (u >> 63) ? ~u : (u | (uint64_t(1) << 63));
    } else {
      uint32_t u = std::bit_cast<uint32_t>(f);
      return (u >> 31) ? uint64_t(~u) : uint64_t(u | (uint32_t(1) << 31));
    }
  } else if constexpr (std::is_signed_v<T>) {
    return uint64_t(int64_t(v)) ^ (uint64_t(1) << 63);
  } else {
    return uint64_t(v);
  }
}

// Fills codes[r] for one slice (R elements, stride I) of operand `a` starting at element `base`.
void slice_codes(const Array& a, int64_t base, int64_t R, int64_t I, uint64_t* codes) {
  visit_dtype(a.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = data_ptr<const T>(a) + base;
    for (int64_t r = 0; r < R; ++r) codes[r] = sort_code(x[r * I]);
  });
}
// out[base + r*I] = in[base + perm[r]*I]
void slice_gather(const Array& in, Array& out, int64_t base, int64_t R, int64_t I, const int64_t* perm) {
  visit_dtype(in.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* x = data_ptr<const T>(in) + base;
    T* y = data_ptr<T>(out) + base;
    for (int64_t r = 0; r < R; ++r) y[r * I] = x[perm[r] * I];
  });
}

std::vector<Array> sort_impl(std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
  Device dev = concrete(in[0])->device();
  std::vector<Array> outs;
  for (auto& av : out_avals) outs.push_back(make_uninitialized(av, dev));
  const Shape& shape = in[0].shape();
  int64_t dim = p.i("dimension"), nk = p.i("num_keys");
  bool stable = p.get<bool>("is_stable");
  int64_t O = 1, I = 1, R = shape[size_t(dim)];
  for (int64_t d = 0; d < dim; ++d) O *= shape[size_t(d)];
  for (size_t d = size_t(dim) + 1; d < shape.size(); ++d) I *= shape[d];
  int64_t nslices = O * I;
  if (nslices == 0 || R == 0) return outs;
  parallel_for(nslices, std::max<int64_t>(1, 4096 / R), [&](int64_t b, int64_t e) {
    std::vector<uint64_t> codes(size_t(R * nk));
    std::vector<int64_t> perm(static_cast<size_t>(R));
    std::vector<std::pair<uint64_t, int64_t>> pairs(nk == 1 ? size_t(R) : 0);
    for (int64_t s = b; s < e; ++s) {
      int64_t base = (s / I) * R * I + (s % I);
      if (nk == 1) {
        slice_codes(in[0], base, R, I, codes.data());
        for (int64_t r = 0; r < R; ++r) pairs[size_t(r)] = {codes[size_t(r)], r};
        auto lt = [](const auto& a, const auto& c) { return a.first < c.first; };
        if (stable)
          std::stable_sort(pairs.begin(), pairs.end(), lt);
        else
          std::sort(pairs.begin(), pairs.end(), [](const auto& a, const auto& c) { return a < c; });
        for (int64_t r = 0; r < R; ++r) perm[size_t(r)] = pairs[size_t(r)].second;
      } else {
        for (int64_t k = 0; k < nk; ++k) slice_codes(in[size_t(k)], base, R, I, codes.data() + k * R);
        std::iota(perm.begin(), perm.end(), int64_t(0));
        const uint64_t* c = codes.data();
        auto lt = [&](int64_t a, int64_t q) {
          for (int64_t k = 0; k < nk; ++k) {
            uint64_t ca = c[k * R + a], cq = c[k * R + q];
            if (ca != cq) return ca < cq;
          }
          return false;
        };
        // An unstable request still gets a deterministic order (ties by input position).
        if (stable)
          std::stable_sort(perm.begin(), perm.end(), lt);
        else
          std::sort(perm.begin(), perm.end(), [&](int64_t a, int64_t q) { return lt(a, q) || (!lt(q, a) && a < q); });
      }
      for (size_t k = 0; k < in.size(); ++k) slice_gather(in[k], outs[k], base, R, I, perm.data());
    }
  });
  return outs;
}

const bool g_registered = [] {
  register_kernel("sort", Platform::cpu, sort_impl);
  register_kernel("top_k", Platform::cpu,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
                    Device dev = concrete(in[0])->device();
                    Array vals = make_uninitialized(out_avals[0], dev), idx = make_uninitialized(out_avals[1], dev);
                    int64_t k = p.i("k"), R = in[0].shape().back();
                    int64_t rows = R == 0 ? 0 : in[0].size() / R;
                    if (k == 0 || rows == 0) return std::vector<Array>{vals, idx};
                    visit_dtype(in[0].dtype(), [&](auto tag) {
                      using T = typename decltype(tag)::type;
                      const T* x = data_ptr<const T>(in[0]);
                      T* v = data_ptr<T>(vals);
                      int32_t* ix = data_ptr<int32_t>(idx);
                      parallel_for(rows, std::max<int64_t>(1, 4096 / R), [&](int64_t b, int64_t e) {
                        std::vector<uint64_t> codes(static_cast<size_t>(R));
                        std::vector<int64_t> perm(static_cast<size_t>(R));
                        for (int64_t row = b; row < e; ++row) {
                          const T* xr = x + row * R;
                          for (int64_t r = 0; r < R; ++r) codes[size_t(r)] = sort_code(xr[r]);
                          std::iota(perm.begin(), perm.end(), int64_t(0));
                          std::partial_sort(perm.begin(), perm.begin() + k, perm.end(), [&](int64_t a, int64_t c) {
                            uint64_t ca = codes[size_t(a)], cc = codes[size_t(c)];
                            return ca > cc || (ca == cc && a < c);
                          });
                          for (int64_t j = 0; j < k; ++j) {
                            v[row * k + j] = xr[perm[size_t(j)]];
                            ix[row * k + j] = int32_t(perm[size_t(j)]);
                          }
                        }
                      });
                    });
                    return std::vector<Array>{vals, idx};
                  });
  return true;
}();

}  // namespace
}  // namespace cjax::cpu
