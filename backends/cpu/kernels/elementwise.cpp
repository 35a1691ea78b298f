// The CPU kernels of the elementwise primitives (core/lax/elementwise.cpp): one per row of the scalar-op
// table (the functors of core/lax/scalar_fns.h), convert_element_type, select_n, integer_pow and
// threefry2x32. bitcast_convert_type and stop_gradient are views (their defs' impl).
#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/array/primitive.h"
#include "core/array/visit_dtype.h"
#include "core/backend/backend.h"
#include "core/backend/parallel.h"
#include "core/lax/scalar_fns.h"

namespace cjax::cpu {
namespace {

constexpr int64_t kGrain = 1 << 15;

template <class T>
inline compute_t<T> load(const T& x) {
  return compute_t<T>(x);
}
template <class T, class V>
inline T store(V v) {
  if constexpr (is_half_v<T>)
    return T(float(v));
  else
    return T(v);
}

template <ScalarOp op, int arity>
struct Kernel;

template <ScalarOp op>
struct Kernel<op, 1> {
  template <class T, class O>
  static void run(const T* x, O* y, int64_t n) {
    parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) y[i] = store<O>(scalar::Fn<op>::apply(load(x[i])));
    });
  }
};
template <ScalarOp op>
struct Kernel<op, 2> {
  template <bool XS, bool YS, class T, class O>
  static void loop(const T* x, const T* y, O* z, int64_t n) {
    parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) z[i] = store<O>(scalar::Fn<op>::apply(load(x[XS ? 0 : i]), load(y[YS ? 0 : i])));
    });
  }
  template <class T, class O>
  static void run(const T* x, bool xs, const T* y, bool ys, O* z, int64_t n) {
    if (xs == ys)
      loop<false, false>(x, y, z, n);  // both full (or both scalar with n == 1)
    else if (xs)
      loop<true, false>(x, y, z, n);
    else
      loop<false, true>(x, y, z, n);
  }
};
template <ScalarOp op>
struct Kernel<op, 3> {
  template <class T, class O>
  static void run(const T* a, bool as, const T* b, bool bs, const T* c, bool cs, O* z, int64_t n) {
    parallel_for(n, kGrain, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i)
        z[i] = store<O>(scalar::Fn<op>::apply(load(a[as ? 0 : i]), load(b[bs ? 0 : i]), load(c[cs ? 0 : i])));
    });
  }
};

template <ScalarOp op, int arity>
std::vector<Array> run_elementwise(std::span<const Array> in, std::span<const AbstractValue> out_avals) {
  constexpr ScalarOpInfo info = scalar_op_info(op);
  Array out = make_uninitialized(out_avals[0], concrete(in[0])->device());
  int64_t n = out_avals[0].size();
  visit_dtype(in[0].dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (scalar_domain_accepts<T>(info.domain)) {
      using O = std::conditional_t<(info.domain == ScalarDomain::Cmp || info.domain == ScalarDomain::Pred), bool, T>;
      O* z = data_ptr<O>(out);
      auto p = [&](int k) { return data_ptr<const T>(in[size_t(k)]); };
      auto sc = [&](int k) { return in[size_t(k)].ndim() == 0; };
      if constexpr (arity == 1)
        Kernel<op, 1>::run(p(0), z, n);
      else if constexpr (arity == 2)
        Kernel<op, 2>::run(p(0), sc(0), p(1), sc(1), z, n);
      else
        Kernel<op, 3>::run(p(0), sc(0), p(1), sc(1), p(2), sc(2), z, n);
    }
  });
  return {out};
}

template <class S, class D>
inline D convert_value(S s) {
  if constexpr (std::is_same_v<D, bool>)
    return load(s) != 0;
  else if constexpr (is_float_like_v<D>)
    return store<D>(load(s));
  else if constexpr (is_float_like_v<S>) {
    // float -> int: NaN -> 0, saturating at the integer range (XLA's CPU semantics).
    double v = double(load(s));
    if (std::isnan(v)) return D(0);
    if (v <= double(std::numeric_limits<D>::lowest())) return std::numeric_limits<D>::lowest();
    if (v >= double(std::numeric_limits<D>::max())) return std::numeric_limits<D>::max();
    return D(v);
  } else {
    return D(s);  // integer -> integer wraps (two's complement), bool -> 0/1
  }
}

template <class T>
inline T ipow(T x, int64_t y) {
  bool neg = y < 0;
  uint64_t e = uint64_t(neg ? -y : y);
  T acc = T(1), base = x;
  while (e) {
    if (e & 1) acc = scalar::wrap_mul(acc, base);
    base = scalar::wrap_mul(base, base);
    e >>= 1;
  }
  if constexpr (std::is_floating_point_v<T>)
    return neg ? T(1) / acc : acc;
  else
    return acc;
}
inline uint32_t rotl(uint32_t v, int r) { return (v << r) | (v >> (32 - r)); }
inline void threefry_block(uint32_t k0, uint32_t k1, uint32_t& x0, uint32_t& x1) {
  const uint32_t ks[3] = {k0, k1, k0 ^ k1 ^ 0x1BD11BDAu};
  static constexpr int rot[2][4] = {{13, 15, 26, 6}, {17, 29, 16, 24}};
  x0 += ks[0];
  x1 += ks[1];
  for (int g = 1; g <= 5; ++g) {
    const int* r = rot[(g - 1) & 1];
    for (int j = 0; j < 4; ++j) {
      x0 += x1;
      x1 = rotl(x1, r[j]);
      x1 ^= x0;
    }
    x0 += ks[g % 3];
    x1 += ks[(g + 1) % 3] + uint32_t(g);
  }
}
const bool g_registered_table = [] {
#define CJAX_X(e, n, a, d)                                                                                 \
  register_kernel(n, Platform::cpu,                                                                        \
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params&) { \
                    return run_elementwise<ScalarOp::e, a>(in, out_avals);                                 \
                  });
  CJAX_SCALAR_OPS(CJAX_X)
#undef CJAX_X
  return true;
}();

const bool g_registered = [] {
  register_kernel("convert_element_type", Platform::cpu,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params&) {
                    if (in[0].dtype() == out_avals[0].dtype) return std::vector<Array>{make_view(in[0], out_avals[0])};
                    Array out = make_uninitialized(out_avals[0], concrete(in[0])->device());
                    int64_t n = out.size();
                    visit_dtype(in[0].dtype(), [&](auto st) {
                      using S = typename decltype(st)::type;
                      visit_dtype(out.dtype(), [&](auto dt) {
                        using D = typename decltype(dt)::type;
                        const S* x = data_ptr<const S>(in[0]);
                        D* y = data_ptr<D>(out);
                        parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
                          for (int64_t i = b; i < e; ++i) y[i] = convert_value<S, D>(x[i]);
                        });
                      });
                    });
                    return std::vector<Array>{out};
                  });
  register_kernel("select_n", Platform::cpu,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params&) {
                    Array out = make_uninitialized(out_avals[0], concrete(in[1])->device());
                    int64_t n = out.size();
                    size_t ncases = in.size() - 1;
                    bool scalar_pred = in[0].ndim() == 0;
                    visit_dtype(out.dtype(), [&](auto tag) {
                      using T = typename decltype(tag)::type;
                      std::vector<const T*> cases(ncases);
                      for (size_t c = 0; c < ncases; ++c) cases[c] = data_ptr<const T>(in[c + 1]);
                      T* z = data_ptr<T>(out);
                      visit_dtype(in[0].dtype(), [&](auto ptag) {
                        using P = typename decltype(ptag)::type;
                        if constexpr (std::is_same_v<P, bool> || std::is_same_v<P, int32_t>) {
                          const P* w = data_ptr<const P>(in[0]);
                          parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
                            for (int64_t i = b; i < e; ++i) {
                              int64_t c = int64_t(w[scalar_pred ? 0 : i]);
                              c = std::clamp<int64_t>(c, 0, int64_t(ncases) - 1);
                              z[i] = cases[size_t(c)][i];
                            }
                          });
                        }
                      });
                    });
                    return std::vector<Array>{out};
                  });
  register_kernel("integer_pow", Platform::cpu,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
                    Array out = make_uninitialized(out_avals[0], concrete(in[0])->device());
                    int64_t y = p.i("y"), n = out.size();
                    visit_dtype(out.dtype(), [&](auto tag) {
                      using T = typename decltype(tag)::type;
                      if constexpr (!std::is_same_v<T, bool>) {
                        const T* x = data_ptr<const T>(in[0]);
                        T* z = data_ptr<T>(out);
                        parallel_for(n, kGrain, [&](int64_t b, int64_t e) {
                          for (int64_t i = b; i < e; ++i) z[i] = store<T>(ipow(load(x[i]), y));
                        });
                      }
                    });
                    return std::vector<Array>{out};
                  });
  register_kernel("threefry2x32", Platform::cpu,
                  [](std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params&) {
                    Device dev = concrete(in[0])->device();
                    Array y0 = make_uninitialized(out_avals[0], dev), y1 = make_uninitialized(out_avals[1], dev);
                    int64_t n = y0.size();
                    const uint32_t *k0 = data_ptr<const uint32_t>(in[0]), *k1 = data_ptr<const uint32_t>(in[1]),
                                   *x0 = data_ptr<const uint32_t>(in[2]), *x1 = data_ptr<const uint32_t>(in[3]);
                    bool s0 = in[0].ndim() == 0, s1 = in[1].ndim() == 0, s2 = in[2].ndim() == 0, s3 = in[3].ndim() == 0;
                    uint32_t *o0 = data_ptr<uint32_t>(y0), *o1 = data_ptr<uint32_t>(y1);
                    parallel_for(n, 4096, [&](int64_t b, int64_t e) {
                      for (int64_t i = b; i < e; ++i) {
                        uint32_t a = x0[s2 ? 0 : i], c = x1[s3 ? 0 : i];
                        threefry_block(k0[s0 ? 0 : i], k1[s1 ? 0 : i], a, c);
                        o0[i] = a;
                        o1[i] = c;
                      }
                    });
                    return std::vector<Array>{y0, y1};
                  });
  return true;
}();

}  // namespace
}  // namespace cjax::cpu
