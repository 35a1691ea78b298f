// flash_attention and flash_attention_backward (core/lax/attention.h) on the GPU: the
// FlashAttention schedule in three NVRTC kernels, so that a training step's attention is three
// launches instead of the composite's one kernel per primitive (about 30 per layer).
//
// Shapes as in attention.h: q [B,T,N,H], k and v [B,S,K,H], G = N / K query heads per key head.
// A block has 64 threads and each thread owns one row; the head width H is a literal, so a row's
// values live in registers, and keys or queries pass through shared memory in tiles of 64 rows
// (every thread of a warp reads the same shared element: a broadcast, no bank conflicts).
//   forward        one thread per query row: S = (scale q) . k over the key tiles, online softmax
//                  (running max m and sum l, the accumulator rescaled once per 8 keys), O /= l,
//                  lse = m + log l.
//   backward_dq    one thread per query row: P = exp(S - lse) recomputed, dP = dO . v,
//                  dS = P (dP - delta) with delta = dO . O, dQ = scale sum dS k.
//   backward_dkdv  one thread per key row, over the query tiles of its G query heads:
//                  dV = sum P dO, dK = sum dS (scale q).
// No atomics and every sum in a fixed order: bitwise identical run to run. Everything is computed
// in f32 and rounded once to the inputs' dtype, as on the CPU; causal attention stops each row at
// its diagonal (query t keeps keys s <= t), and key tiles past a query block's last row (or query
// tiles before a key block's first row) are never loaded.
//
// Rows up to kMaxAttentionHead (32) wide fit the registers of one thread (the offline test checks
// that ptxas spills nothing); wider heads run the primitives' composite, whose steps are GPU
// kernels too (no host fallback), and say so under CJAX_LOG_FALLBACKS=1.
#include "core/lax/attention.h"

#include <fmt/format.h>

#include <cstdio>
#include <future>
#include <map>
#include <mutex>
#include <tuple>

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/kernels/codegen.h"
#include "backends/cuda/kernels/fused.h"
#include "cjax/errors.h"
#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/array/util.h"

namespace cjax::cuda {

namespace {

constexpr unsigned kRows = 64;  // threads per block = rows per tile (the source's literal 64)

// The kernels' text with $-names for what the configuration fixes.
constexpr const char* kAttentionTemplate = R"(
// flash attention: dtype $DTYPE, head width $H, causal $CAUSAL
__device__ __forceinline__ float $P_ld(const $ST* p, long long i) { return $LOAD; }
__device__ __forceinline__ $ST $P_st(float x) { return $STORE; }
// Keys and values [s0, s0 + 64) of key head kh into shared memory as f32, zeros from s_end on.
__device__ __forceinline__ void $P_load_keys(float (*ks)[$H], float (*vs)[$H], const $ST* k, const $ST* v,
    int b, int kh, int s0, int s_end, int S, int K) {
  for (int i = (int)threadIdx.x; i < 64 * $H; i += 64) {
    const int r = i / $H, h = i % $H, s = s0 + r;
    const long long at = (((long long)b * S + s) * K + kh) * $H + h;
    ks[r][h] = s < s_end ? $P_ld(k, at) : 0.0f;
    vs[r][h] = s < s_end ? $P_ld(v, at) : 0.0f;
  }
}

extern "C" __global__ void __launch_bounds__(64, 4) $P_forward(const $ST* __restrict__ q,
    const $ST* __restrict__ k, const $ST* __restrict__ v, $ST* __restrict__ out, float* __restrict__ lse,
    int T, int S, int N, int K, float scale) {
  const float minus_inf = -__int_as_float(0x7f800000);
  const int blocks = (T + 63) / 64, bn = (int)blockIdx.x / blocks, t0 = ((int)blockIdx.x % blocks) * 64;
  const int n = bn % N, b = bn / N, kh = n / (N / K), t = t0 + (int)threadIdx.x;
  const bool live = t < T;
  const long long row = ((long long)b * T + (live ? t : 0)) * N + n;
  float qr[$H], acc[$H];
#pragma unroll
  for (int h = 0; h < $H; ++h) {
    qr[h] = live ? $P_ld(q, row * $H + h) * scale : 0.0f;
    acc[h] = 0.0f;
  }
  float m = minus_inf, l = 0.0f;
  const int s_end = $CAUSAL ? min(S, t0 + 64) : S, kept_end = live ? ($CAUSAL ? min(S, t + 1) : S) : 0;
  CJ_SHARED(float, ks, [64][$H]);
  CJ_SHARED(float, vs, [64][$H]);
  for (int s0 = 0; s0 < s_end; s0 += 64) {
    __syncthreads();  // the previous tile is consumed
    $P_load_keys(ks, vs, k, v, b, kh, s0, s_end, S, K);
    __syncthreads();
    const int keys = min(64, kept_end - s0);
#pragma unroll 1
    for (int j0 = 0; j0 < keys; j0 += 8) {
      float x[8], chunk_max = minus_inf;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        float d = 0.0f;
#pragma unroll
        for (int h = 0; h < $H; ++h) d += qr[h] * ks[j0 + j][h];
        x[j] = j0 + j < keys ? d : minus_inf;
        chunk_max = fmaxf(chunk_max, x[j]);
      }
      const float m_new = fmaxf(m, chunk_max), correction = expf(m - m_new);
      l *= correction;
#pragma unroll
      for (int h = 0; h < $H; ++h) acc[h] *= correction;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const float p = expf(x[j] - m_new);
        l += p;
#pragma unroll
        for (int h = 0; h < $H; ++h) acc[h] += p * vs[j0 + j][h];
      }
      m = m_new;
    }
  }
  if (!live) return;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int h = 0; h < $H; ++h) out[row * $H + h] = $P_st(acc[h] * inv);
  lse[((long long)b * N + n) * T + t] = m + logf(l);
}

extern "C" __global__ void __launch_bounds__(64, 4) $P_backward_dq(const $ST* __restrict__ q,
    const $ST* __restrict__ k, const $ST* __restrict__ v, const $ST* __restrict__ out,
    const float* __restrict__ lse, const $ST* __restrict__ dout, $ST* __restrict__ dq,
    int T, int S, int N, int K, float scale) {
  const int blocks = (T + 63) / 64, bn = (int)blockIdx.x / blocks, t0 = ((int)blockIdx.x % blocks) * 64;
  const int n = bn % N, b = bn / N, kh = n / (N / K), t = t0 + (int)threadIdx.x;
  const bool live = t < T;
  const long long row = ((long long)b * T + (live ? t : 0)) * N + n;
  float qr[$H], dor[$H], acc[$H], delta = 0.0f;
#pragma unroll
  for (int h = 0; h < $H; ++h) {
    qr[h] = live ? $P_ld(q, row * $H + h) * scale : 0.0f;
    dor[h] = live ? $P_ld(dout, row * $H + h) : 0.0f;
    delta += live ? dor[h] * $P_ld(out, row * $H + h) : 0.0f;
    acc[h] = 0.0f;
  }
  const float row_lse = live ? lse[((long long)b * N + n) * T + t] : 0.0f;
  const int s_end = $CAUSAL ? min(S, t0 + 64) : S, kept_end = live ? ($CAUSAL ? min(S, t + 1) : S) : 0;
  CJ_SHARED(float, ks, [64][$H]);
  CJ_SHARED(float, vs, [64][$H]);
  for (int s0 = 0; s0 < s_end; s0 += 64) {
    __syncthreads();
    $P_load_keys(ks, vs, k, v, b, kh, s0, s_end, S, K);
    __syncthreads();
    const int keys = min(64, kept_end - s0);
    for (int j = 0; j < keys; ++j) {
      float x = 0.0f, dp = 0.0f;
#pragma unroll
      for (int h = 0; h < $H; ++h) {
        x += qr[h] * ks[j][h];
        dp += dor[h] * vs[j][h];
      }
      const float ds = expf(x - row_lse) * (dp - delta);
#pragma unroll
      for (int h = 0; h < $H; ++h) acc[h] += ds * ks[j][h];
    }
  }
  if (!live) return;
#pragma unroll
  for (int h = 0; h < $H; ++h) dq[row * $H + h] = $P_st(acc[h] * scale);
}

extern "C" __global__ void __launch_bounds__(64, 4) $P_backward_dkdv(const $ST* __restrict__ q,
    const $ST* __restrict__ k, const $ST* __restrict__ v, const $ST* __restrict__ out,
    const float* __restrict__ lse, const $ST* __restrict__ dout, $ST* __restrict__ dk, $ST* __restrict__ dv,
    int T, int S, int N, int K, float scale) {
  const int blocks = (S + 63) / 64, bk = (int)blockIdx.x / blocks, s0 = ((int)blockIdx.x % blocks) * 64;
  const int kh = bk % K, b = bk / K, G = N / K, s = s0 + (int)threadIdx.x;
  const bool live = s < S;
  const long long row = ((long long)b * S + (live ? s : 0)) * K + kh;
  float kr[$H], vr[$H], dk_acc[$H], dv_acc[$H];
#pragma unroll
  for (int h = 0; h < $H; ++h) {
    kr[h] = live ? $P_ld(k, row * $H + h) : 0.0f;
    vr[h] = live ? $P_ld(v, row * $H + h) : 0.0f;
    dk_acc[h] = dv_acc[h] = 0.0f;
  }
  CJ_SHARED(float, qs, [64][$H]);
  CJ_SHARED(float, dos, [64][$H]);
  CJ_SHARED(float, lses, [64]);
  CJ_SHARED(float, deltas, [64]);
  // Causal: queries before the key block's first key keep none of its keys.
  const int t_begin = $CAUSAL ? min(s0, T) : 0;
  for (int g = 0; g < G; ++g) {
    const int n = kh * G + g;
    for (int t0 = t_begin; t0 < T; t0 += 64) {
      __syncthreads();
      for (int i = (int)threadIdx.x; i < 64 * $H; i += 64) {
        const int r = i / $H, h = i % $H, t = t0 + r;
        const long long at = (((long long)b * T + t) * N + n) * $H + h;
        qs[r][h] = t < T ? $P_ld(q, at) * scale : 0.0f;
        dos[r][h] = t < T ? $P_ld(dout, at) : 0.0f;
      }
      __syncthreads();
      {
        const int t = t0 + (int)threadIdx.x;
        float delta = 0.0f;
        if (t < T) {
          const long long at = (((long long)b * T + t) * N + n) * $H;
#pragma unroll
          for (int h = 0; h < $H; ++h) delta += dos[threadIdx.x][h] * $P_ld(out, at + h);
        }
        deltas[threadIdx.x] = delta;
        lses[threadIdx.x] = t < T ? lse[((long long)b * N + n) * T + t] : 0.0f;
      }
      __syncthreads();
      if (!live) continue;
      const int rows = min(64, T - t0), first = $CAUSAL ? max(0, s - t0) : 0;
      for (int r = first; r < rows; ++r) {
        float x = 0.0f, dp = 0.0f;
#pragma unroll
        for (int h = 0; h < $H; ++h) {
          x += qs[r][h] * kr[h];
          dp += dos[r][h] * vr[h];
        }
        const float p = expf(x - lses[r]), ds = p * (dp - deltas[r]);
#pragma unroll
        for (int h = 0; h < $H; ++h) {
          dv_acc[h] += p * dos[r][h];
          dk_acc[h] += ds * qs[r][h];
        }
      }
    }
  }
  if (!live) return;
#pragma unroll
  for (int h = 0; h < $H; ++h) {
    dk[row * $H + h] = $P_st(dk_acc[h]);
    dv[row * $H + h] = $P_st(dv_acc[h]);
  }
}
)";

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

struct Config {
  DType dtype;
  int64_t head;
  bool causal;
};

// The three kernels of a configuration on one GPU, compiled (or read from the kernel cache) and
// loaded at first use; kept here so that a launch does not look the 10 KB source up again.
struct Kernels {
  CUfunction forward, backward_dq, backward_dkdv;
};
const Kernels& kernels_for(const Device& dev, const Config& c) {
  static std::mutex mu;
  static std::map<std::tuple<CUdevice, int, int64_t, bool>, Kernels> loaded;
  const auto key = std::tuple(gpu(dev).device, int(c.dtype), c.head, c.causal);
  {
    std::lock_guard lock(mu);
    if (auto it = loaded.find(key); it != loaded.end()) return it->second;
  }
  // Each kernel as a program of its own, the three compiled side by side (NVRTC takes ~1.3 s for
  // all three in one program, ~0.6 s for the largest alone); the disk cache keeps them after.
  auto load = [&](const char* kernel) {
    return std::async(std::launch::async, [&dev, &c, kernel] {
      return load_kernel(dev, attention_program(c.dtype, c.head, c.causal, kernel),
                         std::string("cj_attention_") + kernel);
    });
  };
  auto forward = load("forward"), dq = load("backward_dq"), dkdv = load("backward_dkdv");
  Kernels k{forward.get(), dq.get(), dkdv.get()};
  std::lock_guard lock(mu);
  return loaded.try_emplace(key, k).first->second;
}

struct Shapes {
  int T, S, N, K;
  int64_t B;
};
Shapes shapes_of(const Array& q, const Array& k) {
  return Shapes{int(q.shape()[1]), int(k.shape()[1]), int(q.shape()[2]), int(k.shape()[2]), q.shape()[0]};
}

// Whether the kernels take these operands; else why not (for the log).
std::optional<std::string> unsupported(const Array& q, const Array& k) {
  if (q.shape()[3] > kMaxAttentionHead)
    return fmt::format("head width {} > {} (one thread's registers)", q.shape()[3], kMaxAttentionHead);
  if (q.shape()[3] == 0) return std::string("head width 0");
  // Row indices (and a tile past the last) stay within int; the grid within its limit.
  const int64_t most = (int64_t(1) << 31) - 1;
  if (q.shape()[1] > most - 64 || k.shape()[1] > most - 64 || q.shape()[2] > most ||
      q.shape()[0] * q.shape()[2] * attention_blocks(q.shape()[1]) > most ||
      q.shape()[0] * k.shape()[2] * attention_blocks(k.shape()[1]) > most)
    return std::string("more blocks than one launch grid holds");
  return std::nullopt;
}

void log_composite(const char* primitive, const std::string& why) {
  if (env_flag("CJAX_LOG_FALLBACKS"))
    std::fprintf(stderr, "cjax: %s on cuda runs its composite (one kernel per step): %s\n", primitive, why.c_str());
}

std::vector<Array> forward(std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
  const attention::Options o = attention::options_of(p);
  const Array &q = in[0], &k = in[1], &v = in[2];
  if (auto why = unsupported(q, k)) {
    log_composite("flash_attention", *why);
    return attention::composite_forward(q, k, v, o);
  }
  Device dev = concrete(q)->device();
  for (const Array& x : in) concrete(x);
  Array out = make_uninitialized(out_avals[0], dev), lse = make_uninitialized(out_avals[1], dev);
  Shapes s = shapes_of(q, k);
  if (out.size() == 0) return {out, lse};
  void *qp = raw_ptr(q), *kp = raw_ptr(k), *vp = raw_ptr(v), *op = raw_ptr(out), *lp = raw_ptr(lse);
  float scale = float(o.scale);
  launch(dev, kernels_for(dev, {q.dtype(), q.shape()[3], o.is_causal}).forward, "cj_attention_forward",
         unsigned(s.B * s.N * attention_blocks(s.T)), kRows, {&qp, &kp, &vp, &op, &lp, &s.T, &s.S, &s.N, &s.K, &scale});
  return {out, lse};
}

std::vector<Array> backward(std::span<const Array> in, std::span<const AbstractValue> out_avals, const Params& p) {
  const attention::Options o = attention::options_of(p);
  const Array &q = in[0], &k = in[1];
  if (auto why = unsupported(q, k)) {
    log_composite("flash_attention_backward", *why);
    return attention::composite_backward(in[0], in[1], in[2], in[3], in[4], in[5], o);
  }
  Device dev = concrete(q)->device();
  for (const Array& x : in) concrete(x);
  Array dq = make_uninitialized(out_avals[0], dev), dk = make_uninitialized(out_avals[1], dev),
        dv = make_uninitialized(out_avals[2], dev);
  Shapes s = shapes_of(q, k);
  std::vector<void*> ptr;
  for (const Array& x : in) ptr.push_back(raw_ptr(x));
  void *dqp = raw_ptr(dq), *dkp = raw_ptr(dk), *dvp = raw_ptr(dv);
  float scale = float(o.scale);
  const Kernels& kernels = kernels_for(dev, {q.dtype(), q.shape()[3], o.is_causal});
  if (dq.size() > 0)
    launch(dev, kernels.backward_dq, "cj_attention_backward_dq", unsigned(s.B * s.N * attention_blocks(s.T)), kRows,
           {&ptr[0], &ptr[1], &ptr[2], &ptr[3], &ptr[4], &ptr[5], &dqp, &s.T, &s.S, &s.N, &s.K, &scale});
  if (dk.size() > 0)
    launch(dev, kernels.backward_dkdv, "cj_attention_backward_dkdv", unsigned(s.B * s.K * attention_blocks(s.S)), kRows,
           {&ptr[0], &ptr[1], &ptr[2], &ptr[3], &ptr[4], &ptr[5], &dkp, &dvp, &s.T, &s.S, &s.N, &s.K, &scale});
  return {dq, dk, dv};
}

const bool g_registered = [] {
  register_kernel("flash_attention", Platform::cuda, forward);
  register_kernel("flash_attention_backward", Platform::cuda, backward);
  return true;
}();

}  // namespace

int64_t attention_blocks(int64_t rows) { return (rows + kRows - 1) / kRows; }

std::string attention_program(DType dtype, int64_t head, bool causal, const std::string& kernel) {
  const std::string source = attention_source(dtype, head, causal, "cj_attention");
  const size_t helpers_end = source.find("extern \"C\"");
  const size_t at = source.find(" cj_attention_" + kernel + "(");
  if (at == std::string::npos) throw Error(fmt::format("internal: no attention kernel '{}'", kernel));
  const size_t begin = source.rfind("extern \"C\"", at), end = source.find("extern \"C\"", at);
  return fused_prelude() + source.substr(0, helpers_end) + source.substr(begin, end - begin);
}

std::string attention_source(DType dtype, int64_t head, bool causal, const std::string& prefix) {
  std::string text = kAttentionTemplate;
  text = replace_all(text, "$LOAD", load(dtype, "p[i]"));
  text = replace_all(text, "$STORE", store(dtype, "x"));
  text = replace_all(text, "$ST", storage_type(dtype));
  text = replace_all(text, "$DTYPE", std::string(dtype_name(dtype)));
  text = replace_all(text, "$H", std::to_string(head));
  text = replace_all(text, "$CAUSAL", causal ? "true" : "false");
  return replace_all(text, "$P", prefix);
}

}  // namespace cjax::cuda
