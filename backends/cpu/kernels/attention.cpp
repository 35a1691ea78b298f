// flash_attention and flash_attention_backward (core/lax/attention.h): the CPU kernels.
//
// The FlashAttention schedule with the caches in the role of GPU shared memory: the logits are
// never materialized. One task owns a (batch, key/value head) pair and a block of query rows, for
// all G query heads that share the key head, so K and V are converted to f32 once per task and
// stay in L1/L2. Per key block of kKeys keys:
//   forward : S = scale Q K^T (kQuery x kKeys), online softmax (running row max m and sum l, the
//             output rescaled when m grows), O += P V; finally O /= l and lse = m + log l.
//   backward: P = exp(S - lse) recomputed, dP = dO V^T, dS = P (dP - rowsum(dO o)) scale;
//             dV += P^T dO, dK += dS^T Q, dQ += dS K. A backward task owns a whole (batch, key
//             head), so its dK and dV accumulate without sharing and every sum runs in a fixed
//             order: results are bitwise identical run to run and for any thread count.
// Causal attention skips the key blocks after a query block's last row and stops each row at
// its diagonal: masked probabilities are exactly 0, as the unfused path's.
//
// The products are written as linear combinations of rows (`combine`: y = sum_r a[r] x[r], 16
// lanes held in registers), which the compiler vectorizes for the build's ISA (-march); the
// exponential is a polynomial (`exp_poly`) with 2e-8 relative error that vectorizes too.
#include "core/lax/attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/cpu/llvm_math_coefficients.h"
#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/array/visit_dtype.h"
#include "core/backend/parallel.h"

namespace cjax::cpu {
namespace {

constexpr int64_t kQuery = 64;  // query rows per block
constexpr int64_t kKeys = 64;   // keys per block
constexpr int kLanes = 16;

// exp(x) for x <= 0 (softmax arguments), 0 below -87 (where f32 exp underflows to subnormals).
inline float exp_poly(float x) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  float t = std::max(x, -87.0f) * 1.44269504088896341f + kMagic;
  float n = t - kMagic;
  float r = std::fma(n, -0.693145751953125f, std::max(x, -87.0f));
  r = std::fma(n, -1.428606765330187045e-06f, r);
  using math_coefficients::kExpS_f;
  float s = float(kExpS_f[4]);
  for (int i = 3; i >= 0; --i) s = std::fma(s, r, float(kExpS_f[i]));
  float p = 1.0f + r + 0.5f * r * r + r * r * r * s;
  int32_t e = (std::bit_cast<int32_t>(t) - 0x4B400000 + 127) << 23;
  float y = p * std::bit_cast<float>(e);
  return x < -87.0f ? 0.0f : y;
}

// y[0, width) (=|+=) sum_{r < n} a[r * as] x[r * xs + (0, width)].
template <int W>
inline void combine_lanes(float* __restrict y, const float* __restrict a, int64_t as, const float* __restrict x,
                          int64_t xs, int64_t n, bool accumulate) {
  float acc[W];
  for (int w = 0; w < W; ++w) acc[w] = accumulate ? y[w] : 0.0f;
  for (int64_t r = 0; r < n; ++r) {
    const float c = a[r * as];
    const float* xr = x + r * xs;
    for (int w = 0; w < W; ++w) acc[w] = std::fma(c, xr[w], acc[w]);
  }
  for (int w = 0; w < W; ++w) y[w] = acc[w];
}

void combine(float* y, int64_t width, const float* a, int64_t as, const float* x, int64_t xs, int64_t n,
             bool accumulate) {
  int64_t w0 = 0;
  for (; w0 + kLanes <= width; w0 += kLanes) combine_lanes<kLanes>(y + w0, a, as, x + w0, xs, n, accumulate);
  for (; w0 + 4 <= width; w0 += 4) combine_lanes<4>(y + w0, a, as, x + w0, xs, n, accumulate);
  for (; w0 < width; ++w0) combine_lanes<1>(y + w0, a, as, x + w0, xs, n, accumulate);
}

struct Dims {
  int64_t B, T, N, H, S, K, G;
  double scale;
  bool causal;
  int64_t query_blocks() const { return (T + kQuery - 1) / kQuery; }
  // Keys a query block [t0, t0 + rows) reads: all, or up to its last row's diagonal.
  int64_t key_end(int64_t t0, int64_t rows) const { return causal ? std::min(S, t0 + rows) : S; }
  // Keys row t keeps within the key block starting at s0 (0 ... keys).
  int64_t row_keys(int64_t t, int64_t s0, int64_t keys) const {
    return causal ? std::clamp<int64_t>(t - s0 + 1, 0, keys) : keys;
  }
};

Dims dims_of(std::span<const Array> in, const Params& p) {
  attention::Options o = attention::options_of(p);
  const Shape &q = in[0].shape(), &k = in[1].shape();
  return Dims{q[0], q[1], q[2], q[3], k[1], k[2], q[2] / std::max<int64_t>(k[2], 1), o.scale, o.is_causal};
}

// The f32 copies of one (batch, key head)'s keys and values a task works from: rows [S][H], and
// per key block the transposed [H][kKeys] panel that S = Q K^T and dP = dO V^T combine.
struct KeyPanels {
  std::vector<float> rows, panels;
  template <class T>
  void load(const T* x, const Dims& d, int64_t b, int64_t kh, int64_t end) {
    rows.resize(size_t(end * d.H));
    panels.assign(size_t(((end + kKeys - 1) / kKeys) * kKeys * d.H), 0.0f);
    for (int64_t s = 0; s < end; ++s) {
      const T* src = x + ((b * d.S + s) * d.K + kh) * d.H;
      float* row = rows.data() + s * d.H;
      float* panel = panels.data() + (s / kKeys) * kKeys * d.H + s % kKeys;
      for (int64_t h = 0; h < d.H; ++h) {
        row[h] = float(src[h]);
        panel[h * kKeys] = row[h];
      }
    }
  }
  const float* row(int64_t s, const Dims& d) const { return rows.data() + s * d.H; }
  const float* panel(int64_t s0, const Dims& d) const { return panels.data() + (s0 / kKeys) * kKeys * d.H; }
};

// Query-side rows of one (batch, head) block as f32 [rows][H].
template <class T>
void load_rows(std::vector<float>& dst, const T* x, const Dims& d, int64_t b, int64_t n, int64_t t0, int64_t rows) {
  dst.resize(size_t(rows * d.H));
  for (int64_t i = 0; i < rows; ++i) {
    const T* src = x + ((b * d.T + t0 + i) * d.N + n) * d.H;
    for (int64_t h = 0; h < d.H; ++h) dst[size_t(i * d.H + h)] = float(src[h]);
  }
}
template <class T>
void store_rows(T* x, const std::vector<float>& src, const Dims& d, int64_t b, int64_t n, int64_t t0, int64_t rows) {
  for (int64_t i = 0; i < rows; ++i) {
    T* dst = x + ((b * d.T + t0 + i) * d.N + n) * d.H;
    for (int64_t h = 0; h < d.H; ++h) dst[h] = T(src[size_t(i * d.H + h)]);
  }
}

// logits[i][0, keys) = scale * q_i . k_j for the key block at s0.
void block_logits(float* logits, const float* q, int64_t rows, const KeyPanels& k, int64_t s0, int64_t keys,
                  const Dims& d) {
  const float scale = float(d.scale);
  for (int64_t i = 0; i < rows; ++i) {
    float* row = logits + i * kKeys;
    combine(row, keys, q + i * d.H, 1, k.panel(s0, d), kKeys, d.H, false);
    for (int64_t j = 0; j < keys; ++j) row[j] *= scale;
  }
}

template <class T>
void forward_kernel(const T* q, const T* k, const T* v, T* out, float* lse, const Dims& d) {
  const int64_t qb = d.query_blocks();
  parallel_for(d.B * d.K * qb, 1, [&](int64_t begin, int64_t end) {
    KeyPanels kp, vp;
    std::vector<float> qrows, acc, logits(size_t(kQuery * kKeys));
    std::vector<float> m(kQuery), l(kQuery);
    int64_t loaded = -1;
    for (int64_t task = begin; task < end; ++task) {
      const int64_t bk = task / qb, b = bk / d.K, kh = bk % d.K;
      const int64_t t0 = (task % qb) * kQuery, rows = std::min(kQuery, d.T - t0);
      const int64_t s_end = d.key_end(t0, rows);
      if (loaded != bk) {  // the whole needed range of this (batch, key head)'s keys and values
        const int64_t need = d.key_end(0, d.T);
        kp.load(k, d, b, kh, need);
        vp.load(v, d, b, kh, need);
        loaded = bk;
      }
      for (int64_t g = 0; g < d.G; ++g) {
        const int64_t n = kh * d.G + g;
        load_rows(qrows, q, d, b, n, t0, rows);
        acc.assign(size_t(rows * d.H), 0.0f);
        std::fill(m.begin(), m.end(), -std::numeric_limits<float>::infinity());
        std::fill(l.begin(), l.end(), 0.0f);
        for (int64_t s0 = 0; s0 < s_end; s0 += kKeys) {
          const int64_t keys = std::min(kKeys, s_end - s0);
          block_logits(logits.data(), qrows.data(), rows, kp, s0, keys, d);
          for (int64_t i = 0; i < rows; ++i) {
            float* p = logits.data() + i * kKeys;
            const int64_t kept = d.row_keys(t0 + i, s0, keys);
            if (kept == 0) continue;
            float mx = m[size_t(i)];
            for (int64_t j = 0; j < kept; ++j) mx = std::max(mx, p[j]);
            const float correction = exp_poly(m[size_t(i)] - mx);
            float sum = 0.0f;
            for (int64_t j = 0; j < kept; ++j) {
              p[j] = exp_poly(p[j] - mx);
              sum += p[j];
            }
            m[size_t(i)] = mx;
            l[size_t(i)] = l[size_t(i)] * correction + sum;
            float* o = acc.data() + i * d.H;
            for (int64_t h = 0; h < d.H; ++h) o[h] *= correction;
            combine(o, d.H, p, 1, vp.row(s0, d), d.H, kept, true);
          }
        }
        for (int64_t i = 0; i < rows; ++i) {
          const float li = l[size_t(i)], inv = li > 0 ? 1.0f / li : 0.0f;
          for (int64_t h = 0; h < d.H; ++h) acc[size_t(i * d.H + h)] *= inv;
          lse[(b * d.N + n) * d.T + t0 + i] = m[size_t(i)] + std::log(li);
        }
        store_rows(out, acc, d, b, n, t0, rows);
      }
    }
  });
}

template <class T>
void backward_kernel(const T* q, const T* k, const T* v, const T* out, const float* lse, const T* dout, T* dq, T* dk,
                     T* dv, const Dims& d) {
  parallel_for(d.B * d.K, 1, [&](int64_t begin, int64_t end) {
    KeyPanels kp, vp;
    std::vector<float> qrows, orows, dorows, dqrows, dk_acc, dv_acc, delta(kQuery);
    std::vector<float> p(size_t(kQuery * kKeys)), ds(size_t(kQuery * kKeys));
    for (int64_t task = begin; task < end; ++task) {
      const int64_t b = task / d.K, kh = task % d.K;
      const int64_t need = d.key_end(0, d.T);
      kp.load(k, d, b, kh, need);
      vp.load(v, d, b, kh, need);
      dk_acc.assign(size_t(d.S * d.H), 0.0f);
      dv_acc.assign(size_t(d.S * d.H), 0.0f);
      const float scale = float(d.scale);
      for (int64_t g = 0; g < d.G; ++g) {
        const int64_t n = kh * d.G + g;
        for (int64_t t0 = 0; t0 < d.T; t0 += kQuery) {
          const int64_t rows = std::min(kQuery, d.T - t0), s_end = d.key_end(t0, rows);
          load_rows(qrows, q, d, b, n, t0, rows);
          load_rows(orows, out, d, b, n, t0, rows);
          load_rows(dorows, dout, d, b, n, t0, rows);
          dqrows.assign(size_t(rows * d.H), 0.0f);
          for (int64_t i = 0; i < rows; ++i) {
            float s = 0.0f;
            for (int64_t h = 0; h < d.H; ++h) s += dorows[size_t(i * d.H + h)] * orows[size_t(i * d.H + h)];
            delta[size_t(i)] = s;
          }
          const float* row_lse = lse + (b * d.N + n) * d.T + t0;
          for (int64_t s0 = 0; s0 < s_end; s0 += kKeys) {
            const int64_t keys = std::min(kKeys, s_end - s0);
            block_logits(p.data(), qrows.data(), rows, kp, s0, keys, d);
            for (int64_t i = 0; i < rows; ++i) {
              float* pi = p.data() + i * kKeys;
              float* dsi = ds.data() + i * kKeys;
              const int64_t kept = d.row_keys(t0 + i, s0, keys);
              for (int64_t j = 0; j < kept; ++j) pi[j] = exp_poly(pi[j] - row_lse[i]);
              for (int64_t j = kept; j < keys; ++j) pi[j] = 0.0f;
              combine(dsi, keys, dorows.data() + i * d.H, 1, vp.panel(s0, d), kKeys, d.H, false);  // dP
              for (int64_t j = 0; j < keys; ++j) dsi[j] = pi[j] * (dsi[j] - delta[size_t(i)]) * scale;
              combine(dqrows.data() + i * d.H, d.H, dsi, 1, kp.row(s0, d), d.H, keys, true);
            }
            for (int64_t j = 0; j < keys; ++j) {
              combine(dv_acc.data() + (s0 + j) * d.H, d.H, p.data() + j, kKeys, dorows.data(), d.H, rows, true);
              combine(dk_acc.data() + (s0 + j) * d.H, d.H, ds.data() + j, kKeys, qrows.data(), d.H, rows, true);
            }
          }
          store_rows(dq, dqrows, d, b, n, t0, rows);
        }
      }
      for (int64_t s = 0; s < d.S; ++s) {
        T* dks = dk + ((b * d.S + s) * d.K + kh) * d.H;
        T* dvs = dv + ((b * d.S + s) * d.K + kh) * d.H;
        for (int64_t h = 0; h < d.H; ++h) {
          dks[h] = T(dk_acc[size_t(s * d.H + h)]);
          dvs[h] = T(dv_acc[size_t(s * d.H + h)]);
        }
      }
    }
  });
}

template <class F>
void visit_attention_dtype(DType dtype, F&& f) {
  switch (dtype) {
    case DType::float32: return f(float{});
    case DType::bfloat16: return f(bfloat16_t{});
    case DType::float16: return f(float16_t{});
    default: throw DTypeError(fmt::format("flash_attention: no CPU kernel for {}", dtype_name(dtype)));
  }
}

std::vector<Array> forward_impl(std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
  Device dev = concrete(in[0])->device();
  Array out = make_uninitialized(out_avals[0], dev), lse = make_uninitialized(out_avals[1], dev);
  for (const Array& x : in) concrete(x);
  Dims d = dims_of(in, p);
  if (out.size() > 0)
    visit_attention_dtype(in[0].dtype(), [&](auto tag) {
      using T = decltype(tag);
      forward_kernel(data_ptr<const T>(in[0]), data_ptr<const T>(in[1]), data_ptr<const T>(in[2]), data_ptr<T>(out),
                     data_ptr<float>(lse), d);
    });
  return {out, lse};
}

std::vector<Array> backward_impl(std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
  Device dev = concrete(in[0])->device();
  std::vector<Array> outs;
  for (const AbstractValue& a : out_avals) outs.push_back(make_uninitialized(a, dev));
  for (const Array& x : in) concrete(x);
  Dims d = dims_of(in, p);
  visit_attention_dtype(in[0].dtype(), [&](auto tag) {
    using T = decltype(tag);
    if (outs[1].size() == 0) {  // no keys: every gradient is zero
      for (Array& o : outs) std::memset(raw_ptr(o), 0, size_t(o.size()) * sizeof(T));
      return;
    }
    backward_kernel(data_ptr<const T>(in[0]), data_ptr<const T>(in[1]), data_ptr<const T>(in[2]),
                    data_ptr<const T>(in[3]), data_ptr<const float>(in[4]), data_ptr<const T>(in[5]),
                    data_ptr<T>(outs[0]), data_ptr<T>(outs[1]), data_ptr<T>(outs[2]), d);
  });
  return outs;
}

const bool g_registered = [] {
  register_kernel("flash_attention", Platform::cpu, forward_impl);
  register_kernel("flash_attention_backward", Platform::cpu, backward_impl);
  return true;
}();

}  // namespace
}  // namespace cjax::cpu
