// Causal attention on the CPU: nn::dot_product_attention's fused path (flash_attention) against
// its unfused path (implementation = xla, also jitted: logits materialized, softmax fused by jit)
// and PyTorch's (bench/peers/torch_attention.py: scaled_dot_product_attention where it exists,
// else the matmul + softmax that SDPA's CPU math path computes). Forward alone (inference) and
// forward + backward (the gradient of sum(attention * w) w.r.t. q, k and v), all jitted; and at
// the sample's shape, q, k and v sliced from one projection with jit's pack_attention on and off.
//   build/bench/bench_attention [reps]
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>

#include "bench/harness.h"
#include "cjax/cjax.h"

using namespace cjax;
namespace jnp = cjax::numpy;
using Impl = nn::AttentionImplementation;

namespace {

std::map<std::string, double> torch_peer(int64_t B, int64_t T, int64_t N, int64_t H, const char* dtype, int reps) {
  std::string cmd = fmt::format("{}/usr/bin/python3 {}/peers/torch_attention.py {} {} {} {} {} {} 2>/dev/null",
                                cjax::bench::torch_isa_env(), CJAX_BENCH_DIR, B, T, N, H, dtype, reps);
  std::map<std::string, double> out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char line[256];
  while (std::fgets(line, sizeof line, p)) {
    std::string s(line);
    auto eq = s.find('=');
    if (eq == std::string::npos) continue;
    char* end = nullptr;
    double v = std::strtod(s.c_str() + eq + 1, &end);
    if (end != s.c_str() + eq + 1) out[s.substr(0, eq)] = v;
  }
  pclose(p);
  return out;
}

void bench_shape(int64_t B, int64_t T, int64_t N, int64_t H, DType dt, int reps) {
  auto keys = random::split(random::key(0), 4);
  Array q = random::normal(keys[0], {B, T, N, H}, dt), k = random::normal(keys[1], {B, T, N, H}, dt),
        v = random::normal(keys[2], {B, T, N, H}, dt), w = random::normal(keys[3], {B, T, N, H}, dt);
  auto attend = [](Impl impl) {
    return [impl](const Array& q, const Array& k, const Array& v) {
      return nn::dot_product_attention(q, k, v, {.is_causal = true, .implementation = impl});
    };
  };
  auto loss = [&](Impl impl) {
    return [impl, attend](const Array& q, const Array& k, const Array& v, const Array& w) {
      return jnp::sum(attend(impl)(q, k, v) * w);
    };
  };
  // The same attention written out by hand: jit's fuse_attention pass makes it the fused kernel.
  auto by_hand = [T, H](const Array& q, const Array& k, const Array& v) {
    Array logits = jnp::einsum("btnh,bsnh->bnts", q, k) * float(1.0 / std::sqrt(double(H)));
    Array keep = jnp::tril(jnp::ones({T, T}, DType::bool_));
    return jnp::einsum("bnts,bsnh->btnh", nn::softmax(jnp::where(keep, logits, -1e30f), -1), v);
  };
  auto fwd_fused = jit(attend(Impl::fused)), fwd_unfused = jit(attend(Impl::xla));
  auto fwd_by_hand = jit(by_hand);
  auto bwd_fused = jit(grad(loss(Impl::fused), argnums<0, 1, 2>));
  auto bwd_unfused = jit(grad(loss(Impl::xla), argnums<0, 1, 2>));
  auto t = bench::interleaved_medians({[&] { fwd_fused(q, k, v).block_until_ready(); },
                                       [&] { fwd_unfused(q, k, v).block_until_ready(); },
                                       [&] { std::get<0>(bwd_fused(q, k, v, w)).block_until_ready(); },
                                       [&] { std::get<0>(bwd_unfused(q, k, v, w)).block_until_ready(); },
                                       [&] { fwd_by_hand(q, k, v).block_until_ready(); }},
                                      reps);
  const char* dname = dt == DType::bfloat16 ? "bf16" : "f32";
  auto torch = torch_peer(B, T, N, H, dname, reps);
  std::string shape = fmt::format("[{},{},{},{}] {}", B, T, N, H, dname);
  auto ms = [](double s) { return fmt::format("{:.3f} ms", s * 1e3); };
  bench::row("attention fwd " + shape + " vs unfused", ms(t[0]), ms(t[1]), t[1] / t[0], "> 1");
  bench::row("attention fwd+bwd " + shape + " vs unfused", ms(t[2]), ms(t[3]), t[3] / t[2], "> 1");
  bench::row("attention fwd " + shape + " written by hand, jitted, vs unfused", ms(t[4]), ms(t[1]), t[1] / t[4], "> 1");
  if (torch.count("fwd_ms")) {
    bench::row("attention fwd " + shape + " vs torch", ms(t[0]), ms(torch["fwd_ms"] * 1e-3),
               torch["fwd_ms"] * 1e-3 / t[0], "> 1");
    bench::row("attention fwd+bwd " + shape + " vs torch", ms(t[2]), ms(torch["fwd_bwd_ms"] * 1e-3),
               torch["fwd_bwd_ms"] * 1e-3 / t[2], "> 1");
  }
}

// q, k and v sliced from one fused projection's result x [B, T, 3, N, H], forward and backward
// (the gradient of sum(attention * w) w.r.t. x): jit's pack_attention pass (the kernels read x's
// rows in place and write dx whole) against the same program with the pass off (three slices
// copied out, a concatenate of dq, dk and dv), compiled under CJAX_PACK_ATTENTION=0.
void bench_packed(int64_t B, int64_t T, int64_t N, int64_t H, int reps) {
  auto keys = random::split(random::key(1), 2);
  Array x = random::normal(keys[0], {B, T, 3, N, H}), w = random::normal(keys[1], {B, T, N, H});
  auto loss = [=](const Array& x, const Array& w) {
    auto piece = [&](int64_t i) { return lax::slice_in_dim(x, i, i + 1, 1, 2).reshape({B, T, N, H}); };
    Array o =
        nn::dot_product_attention(piece(0), piece(1), piece(2), {.is_causal = true, .implementation = Impl::fused});
    return jnp::sum(o * w);
  };
  auto packed = jit(grad(loss));
  packed(x, w).block_until_ready();
  setenv("CJAX_PACK_ATTENTION", "0", 1);
  auto unpacked = jit(grad(loss));
  unpacked(x, w).block_until_ready();  // compiled now, with the pass off
  unsetenv("CJAX_PACK_ATTENTION");
  auto t = bench::interleaved_medians({[&] { packed(x, w).block_until_ready(); },
                                       [&] { unpacked(x, w).block_until_ready(); }},
                                      reps);
  auto ms = [](double s) { return fmt::format("{:.3f} ms", s * 1e3); };
  bench::row(fmt::format("attention fwd+bwd [{},{},3,{},{}] f32 packed q/k/v vs sliced", B, T, N, H), ms(t[0]),
             ms(t[1]), t[1] / t[0], ">= 1");
}

}  // namespace

// `bench_attention profile [fwd|bwd]`: the fused path alone on the sample's shape, for perf record.
int profile(const std::string& what) {
  auto keys = random::split(random::key(0), 4);
  Shape s{32, 64, 8, 16};
  if (const char* shape = std::getenv("CJAX_BENCH_ATTENTION_SHAPE"))  // B,T,N,H
    std::sscanf(shape, "%ld,%ld,%ld,%ld", &s[0], &s[1], &s[2], &s[3]);
  Array q = random::normal(keys[0], s), k = random::normal(keys[1], s), v = random::normal(keys[2], s),
        w = random::normal(keys[3], s);
  auto attend = [](const Array& q, const Array& k, const Array& v) {
    return nn::dot_product_attention(q, k, v, {.is_causal = true, .implementation = Impl::fused});
  };
  auto fwd = jit(attend);
  auto bwd = jit(grad([&](const Array& q, const Array& k, const Array& v,
                          const Array& w) { return jnp::sum(attend(q, k, v) * w); },
                      argnums<0, 1, 2>));
  for (int i = 0; i < 300; ++i) {
    if (what == "fwd")
      fwd(q, k, v).block_until_ready();
    else
      std::get<0>(bwd(q, k, v, w)).block_until_ready();
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "profile") return profile(argc > 2 ? argv[2] : "bwd");
  int reps = argc > 1 ? std::atoi(argv[1]) : 15;
  bench::print_host();
  std::printf("causal attention, [B,T,N,H]; ratio = peer time / fused time; torch: %s\n",
              "scaled_dot_product_attention if present, else matmul + softmax (PyTorch 1.13)");
  bench_shape(32, 64, 8, 16, DType::float32, reps);  // the transformer sample's attention
  bench_packed(32, 64, 8, 16, reps);
  bench_shape(32, 64, 8, 16, DType::bfloat16, reps);
  bench_shape(8, 128, 8, 16, DType::float32, reps);
  bench_shape(8, 256, 8, 64, DType::float32, reps);
  bench_shape(2, 1024, 8, 64, DType::float32, std::max(3, reps / 3));
  return 0;
}
