// conv_general_dilated's CPU kernel (core/lax/conv.cpp): im2col + GEMM. For each batch element n the
// patches of the (virtually dilated and padded) input are gathered into a column matrix
// col[(c, k...), p] (one row per input feature and kernel offset, one column per output position),
// and for each feature group g
//   out[n, g-th block of O] = W_g [O/G, I*prod(K)] x col_g [I*prod(K), prod(P)]
// runs through the shared GEMM driver (gemm.h; bf16/f16 computed in f32).
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "backends/cpu/kernels/gemm.h"
#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/array/primitive.h"
#include "core/array/visit_dtype.h"
#include "core/backend/backend.h"
#include "core/backend/parallel.h"
#include "core/lax/elementwise.h"
#include "core/lax/linalg.h"

namespace cjax::cpu {
namespace {

constexpr int64_t kGrain = 1 << 15;

std::vector<std::vector<int64_t>> tap_tables(const ConvGeom& g, const Params& p) {
  auto& ws = p.ints("window_strides");
  auto& ld = p.ints("lhs_dilation");
  auto& rd = p.ints("rhs_dilation");
  auto& pad = p.get<std::vector<std::vector<int64_t>>>("padding");
  std::vector<std::vector<int64_t>> tab(size_t(g.nsp));
  for (size_t i = 0; i < size_t(g.nsp); ++i) {
    int64_t K = g.k_sp[i], P = g.out_sp[i], in = g.in_sp[i];
    tab[i].resize(size_t(K * P));
    for (int64_t k = 0; k < K; ++k)
      for (int64_t q = 0; q < P; ++q) {
        int64_t x = q * ws[i] + k * rd[i] - pad[i][0];  // position in the dilated input
        int64_t src = -1;
        if (x >= 0 && x % ld[i] == 0 && x / ld[i] < in) src = x / ld[i];
        tab[i][size_t(k * P + q)] = src;
      }
  }
  return tab;
}

// The convolution in compute type CT (float, double or int64): lhs and rhs are already CT; the
// result is written to `out` (also CT) in its own layout. Integer convolutions compute in int64
// and are narrowed once at the end: wrapping arithmetic gives the same bits as accumulating in the
// narrow type, and there are 3 instantiations instead of one per (input, output) type pair.
template <class CT>
void conv_kernel(const Array& lhs, const Array& rhs, const Array& out, const Params& p) {
  using S = CT;
  auto dn = p.object<ConvDimsParam>("dimension_numbers");
  ConvGeom g = conv_geometry(lhs, rhs, p);
  const size_t nsp = size_t(g.nsp);
  int64_t Kprod = 1, P = 1;
  for (size_t i = 0; i < nsp; ++i) {
    Kprod *= g.k_sp[i];
    P *= g.out_sp[i];
  }
  const int64_t Og = g.O / g.G, Kc = g.I * Kprod;
  const int64_t Ototal = g.N * g.O * P;
  if (Ototal == 0) return;
  CT* outc;
  std::vector<CT> out_tmp;
  auto ostr = row_major_strides(out.shape());
  bool out_canonical = true;
  for (size_t i = 0; i < dn->out_spec.size(); ++i) out_canonical &= dn->out_spec[i] == int64_t(i);
  bool direct = out_canonical && out.dtype() == dtype_v<CT>;
  if (direct) {
    outc = data_ptr<CT>(out);
  } else {
    out_tmp.resize(size_t(Ototal));
    outc = out_tmp.data();
  }
  if (Kc == 0) {
    std::fill(outc, outc + Ototal, CT(0));
  } else {
    // Weights in canonical [O, I, K...] layout, converted to the compute type.
    std::vector<CT> w(size_t(g.O * Kc));
    {
      auto rstr = row_major_strides(rhs.shape());
      const S* r = data_ptr<const S>(rhs);
      for (int64_t o = 0; o < g.O; ++o)
        for (int64_t c = 0; c < g.I; ++c) {
          int64_t base = o * rstr[size_t(dn->rhs_spec[0])] + c * rstr[size_t(dn->rhs_spec[1])];
          CT* dst = w.data() + (o * g.I + c) * Kprod;
          for (int64_t kk = 0; kk < Kprod; ++kk) {
            int64_t rem = kk, off = base;
            for (size_t i = nsp; i-- > 0;) {
              off += (rem % g.k_sp[i]) * rstr[size_t(dn->rhs_spec[i + 2])];
              rem /= g.k_sp[i];
            }
            dst[kk] = CT(compute_t<S>(r[off]));
          }
        }
    }
    auto tab = tap_tables(g, p);
    auto lstr = row_major_strides(lhs.shape());
    std::vector<int64_t> sstr(nsp);
    for (size_t i = 0; i < nsp; ++i) sstr[i] = lstr[size_t(dn->lhs_spec[i + 2])];
    const int64_t nstride = lstr[size_t(dn->lhs_spec[0])], cstride = lstr[size_t(dn->lhs_spec[1])];
    const S* x = data_ptr<const S>(lhs);
    const int64_t Plast = g.out_sp[nsp - 1], Pouter = P / std::max<int64_t>(Plast, 1);
    std::vector<CT> col(size_t(g.C * Kprod * P));
    for (int64_t n = 0; n < g.N; ++n) {
      // im2col for all features of batch element n: row (c, k...) = one input feature and tap.
      int64_t rows = g.C * Kprod;
      parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(P, 1)), [&](int64_t rs, int64_t re) {
        std::vector<int64_t> kidx(nsp), pidx(nsp);
        for (int64_t row = rs; row < re; ++row) {
          int64_t c = row / Kprod, rem = row % Kprod;
          for (size_t i = nsp; i-- > 0;) {
            kidx[i] = rem % g.k_sp[i];
            rem /= g.k_sp[i];
          }
          const S* base = x + n * nstride + c * cstride;
          CT* dst = col.data() + row * P;
          const int64_t* last = tab[nsp - 1].data() + kidx[nsp - 1] * Plast;
          const int64_t lstride = sstr[nsp - 1];
          for (int64_t po = 0; po < Pouter; ++po) {
            int64_t rem2 = po, off = 0;
            bool valid = true;
            for (size_t i = nsp - 1; i-- > 0;) {
              int64_t q = rem2 % g.out_sp[i];
              rem2 /= g.out_sp[i];
              int64_t s = tab[i][size_t(kidx[i] * g.out_sp[i] + q)];
              if (s < 0) valid = false;
              off += s * sstr[i];
            }
            CT* d = dst + po * Plast;
            if (!valid) {
              std::fill(d, d + Plast, CT(0));
              continue;
            }
            const S* b = base + off;
            for (int64_t q = 0; q < Plast; ++q) {
              int64_t s = last[q];
              d[q] = s < 0 ? CT(0) : CT(compute_t<S>(b[s * lstride]));
            }
          }
        }
      });
      for (int64_t gi = 0; gi < g.G; ++gi) {
        GemmOperand A{w.data() + gi * Og * Kc, false, Kc, 0, {}};
        GemmOperand B{col.data() + gi * Kc * P, false, P, 0, {}};
        cpu_gemm(dtype_v<CT>, dtype_v<CT>, 1, Og, P, Kc, A, B, outc + (n * g.O + gi * Og) * P);
      }
    }
  }
  if (direct) return;
  // Canonical [N, O, P...] -> the output layout.
  CT* o = data_ptr<CT>(out);
  std::vector<int64_t> psr(nsp);
  for (size_t i = 0; i < nsp; ++i) psr[i] = ostr[size_t(dn->out_spec[i + 2])];
  int64_t sn = ostr[size_t(dn->out_spec[0])], so = ostr[size_t(dn->out_spec[1])];
  parallel_for(g.N * g.O, std::max<int64_t>(1, kGrain / std::max<int64_t>(P, 1)), [&](int64_t s, int64_t e) {
    for (int64_t r = s; r < e; ++r) {
      int64_t n = r / g.O, oc = r % g.O;
      const CT* src = outc + r * P;
      int64_t base = n * sn + oc * so;
      for (int64_t q = 0; q < P; ++q) {
        int64_t rem = q, off = base;
        for (size_t i = nsp; i-- > 0;) {
          off += (rem % g.out_sp[i]) * psr[i];
          rem /= g.out_sp[i];
        }
        o[off] = src[q];
      }
    }
  });
}

std::vector<Array> conv_impl(std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
  DType dt = in[0].dtype(), od = out_avals[0].dtype;
  DType ct = (dt == DType::float64 || od == DType::float64) ? DType::float64
             : (is_floating(dt) || is_floating(od))         ? DType::float32
                                                            : DType::int64;
  Array lhs = convert_concrete(in[0], ct), rhs = convert_concrete(in[1], ct);
  AbstractValue ct_aval = out_avals[0];
  ct_aval.dtype = ct;
  Array out = make_uninitialized(ct_aval, concrete(in[0])->device());
  if (ct == DType::float64)
    conv_kernel<double>(lhs, rhs, out, p);
  else if (ct == DType::float32)
    conv_kernel<float>(lhs, rhs, out, p);
  else
    conv_kernel<int64_t>(lhs, rhs, out, p);
  Array result = convert_concrete(out, od);
  if (result.weak_type() != out_avals[0].weak_type) result = make_view(result, out_avals[0]);
  return {result};
}

const bool g_registered = [] {
  register_kernel("conv_general_dilated", Platform::cpu, conv_impl);
  return true;
}();

}  // namespace
}  // namespace cjax::cpu
