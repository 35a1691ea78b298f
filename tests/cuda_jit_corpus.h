// Programs whose fused kernels the cuda tests compile (offline, NVRTC) and run (on a GPU, against
// the CPU's LLVM kernels): every launch plan (elements, thread per row, block per row, one wide
// row), tails and odd extents, broadcasts, every node kind (loads, constants, scalar ops,
// conversions, select, integer_pow, the four reductions), bf16/f16/f64/int/bool, in-place pairs,
// and an MLP training step.
#pragma once
#include <cjax/cjax.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

namespace cuda_corpus {

using cjax::Array;
namespace jnp = cjax::numpy;
namespace nn = cjax::nn;
namespace lax = cjax::lax;

struct Program {
  std::string name;
  std::function<std::vector<Array>(const std::vector<Array>&)> fn;
  std::vector<Array> args;  // on the CPU
  double rtol = 2e-5;       // GPU vs CPU
};

inline Array normal(uint32_t seed, const cjax::Shape& shape, cjax::DType d = cjax::DType::float32) {
  return cjax::random::normal(cjax::random::key(seed), shape).astype(d);
}

inline Array chain10(const Array& x) {
  Array y = x * 1.5f + 0.25f;
  y = jnp::tanh(y) * x - 0.5f;
  y = jnp::exp(y * 0.125f) + jnp::square(x);
  return jnp::sqrt(jnp::abs(y) + 1.0f) / (y * y + 2.0f);
}

inline std::vector<Program> programs() {
  using cjax::DType;
  std::vector<Program> p;
  auto one = [](auto f) { return [f](const std::vector<Array>& a) { return std::vector<Array>{f(a)}; }; };
  p.push_back({"chain10 f32 (tail)", one([](const auto& a) { return chain10(a[0]); }), {normal(1, {1000, 37})}});
  p.push_back({"chain10 bf16",
               one([](const auto& a) { return chain10(a[0]); }),
               {normal(2, {333, 65}, DType::bfloat16)},
               1e-2});
  p.push_back({"chain10 bf16 (16-byte runs)",
               one([](const auto& a) { return chain10(a[0]); }),
               {normal(41, {96, 256}, DType::bfloat16)},
               1e-2});
  p.push_back({"bf16 in, f32 out, row broadcast (8-byte loads, 16-byte stores)",
               one([](const auto& a) { return a[0].astype(DType::float32) * a[1] + 1.0f; }),
               {normal(42, {40, 96}, DType::bfloat16), normal(43, {96})}});
  p.push_back(
      {"chain10 f16", one([](const auto& a) { return chain10(a[0]); }), {normal(3, {4099}, DType::float16)}, 1e-2});
  p.push_back(
      {"chain10 f64", one([](const auto& a) { return chain10(a[0]); }), {normal(4, {77, 3}, DType::float64)}, 1e-12});
  p.push_back({"bias add relu (broadcast rows)",
               one([](const auto& a) { return jnp::maximum(a[0] + a[1], 0.0f) * a[2]; }),
               {normal(5, {64, 100}), normal(6, {100}), normal(7, {64, 1})}});
  p.push_back({"outer product broadcast",
               one([](const auto& a) { return a[0] * a[1] - 1.0f; }),
               {normal(8, {50, 1}), normal(9, {1, 70})}});
  p.push_back({"softmax rows (block per row)",
               one([](const auto& a) { return nn::softmax(a[0], -1); }),
               {normal(10, {67, 129})}});
  p.push_back({"softmax rows of 1024 (registers, exact columns)",
               one([](const auto& a) { return nn::softmax(a[0], -1); }),
               {normal(44, {20, 1024})}});
  p.push_back({"softmax rows of 8192 (registers, 512 threads)",
               one([](const auto& a) { return nn::softmax(a[0], -1); }),
               {normal(45, {6, 8192})}});
  p.push_back({"softmax short rows (thread per row)",
               one([](const auto& a) { return nn::softmax(a[0], -1); }),
               {normal(11, {300, 7})}});
  p.push_back({"softmax bf16 rows",
               one([](const auto& a) { return nn::softmax(a[0], -1); }),
               {normal(12, {300, 513}, DType::bfloat16)},
               1e-2});
  p.push_back({"layer norm",
               one([](const auto& a) {
                 Array mu = jnp::mean(a[0], -1, true);
                 Array var = jnp::mean(jnp::square(a[0] - mu), -1, true);
                 return (a[0] - mu) / jnp::sqrt(var + 1e-5f) * a[1] + a[2];
               }),
               {normal(13, {33, 200}), normal(14, {200}), normal(15, {200})}});
  p.push_back({"rms norm (few wide rows)",
               one([](const auto& a) { return nn::rms_norm(a[0], a[1]); }),
               {normal(16, {16, 4096}), normal(17, {4096})}});
  p.push_back(
      {"sum over the first axis", one([](const auto& a) { return jnp::sum(a[0], 0); }), {normal(18, {129, 65})}});
  p.push_back({"mean of everything (one wide row)",
               one([](const auto& a) { return jnp::mean(jnp::square(a[0])); }),
               {normal(19, {1000, 301})}});
  p.push_back(
      {"max, min and prod of rows",
       [](const auto& a) {
         return std::vector<Array>{jnp::max(a[0], -1), jnp::min(a[0] * 2.0f, -1), jnp::prod(a[0] * 0.1f + 1.0f, -1)};
       },
       {normal(20, {40, 90})}});
  p.push_back({"logsumexp cross entropy",
               one([](const auto& a) {
                 Array logp = a[0] - nn::logsumexp(a[0], -1, true);
                 return -jnp::mean(jnp::sum(logp * a[1], -1));
               }),
               {normal(21, {128, 10}), jnp::full({128, 10}, 0.1)}});
  p.push_back({"integer arithmetic, shifts and masks",
               one([](const auto& a) {
                 Array i = a[0].astype(DType::int32);
                 Array y = jnp::right_shift(i * 3 + 7, jnp::full({}, int64_t(1)).astype(DType::int32));
                 return jnp::where(jnp::bitwise_and(y, jnp::full({}, int64_t(4)).astype(DType::int32)) > 0, y, -y);
               }),
               {normal(22, {4000}) * 1000.0f}});
  p.push_back({"saturating float -> int conversions",
               [](const auto& a) {
                 Array x = a[0] * 1e10f;
                 return std::vector<Array>{x.astype(DType::int32), x.astype(DType::int8), x.astype(DType::uint8),
                                           x.astype(DType::int64), x.astype(DType::bool_)};
               },
               {jnp::concatenate({normal(23, {1000}), jnp::array({std::numeric_limits<float>::quiet_NaN(), 0.0f,
                                                                  std::numeric_limits<float>::infinity()})})}});
  p.push_back({"any / all over rows",
               [](const auto& a) {
                 return std::vector<Array>{jnp::any(a[0] > 1.5f, -1), jnp::all(a[0] > -2.0f, -1)};
               },
               {normal(24, {100, 50})}});
  p.push_back({"integer_pow and select_n",
               one([](const auto& a) {
                 Array which = (a[0] > 0.0f).astype(DType::int32) + (a[0] > 1.0f).astype(DType::int32);
                 return lax::select_n(which, {lax::integer_pow(a[0], 3), lax::integer_pow(a[0], -2), a[0] * 0.5f});
               }),
               {normal(25, {2000})}});
  p.push_back({"transcendental and rounding scalar ops",
               one([](const auto& a) {
                 const Array& x = a[0];
                 Array ax = jnp::abs(x) + 0.5f;
                 Array y = jnp::sin(x) + jnp::cos(x) * jnp::log1p(ax) + lax::expm1(x * 0.25f) + jnp::sinh(x * 0.5f);
                 y = y + jnp::arctan2(x, ax) + lax::erf(x) + jnp::floor(x * 3.0f) - jnp::ceil(x * 2.0f);
                 y = y + lax::round(x * 5.0f) * jnp::sign(x) + lax::rsqrt(ax) + jnp::cbrt(x) + jnp::fmod(x * 7.0f, ax);
                 y = y + jnp::power(ax, jnp::full({}, 1.5)) + jnp::arcsinh(x) + jnp::log2(ax) - jnp::exp2(x * 0.5f);
                 return jnp::where(x > 1.0f, jnp::minimum(y, x), jnp::maximum(y, -x));
               }),
               {normal(31, {3001})},
               1e-4});
  p.push_back(
      {"gelu (tanh approximation)", one([](const auto& a) { return nn::gelu(a[0]); }), {normal(26, {512, 384})}});
  p.push_back({"MLP training step",
               [](const auto& a) {
                 auto loss = [](const std::vector<Array>& w, const Array& x, const Array& labels) {
                   Array h = jnp::tanh(jnp::matmul(x, w[0]) + w[1]);
                   Array logits = jnp::matmul(h, w[2]);
                   Array logp = logits - nn::logsumexp(logits, -1, true);
                   return -jnp::mean(jnp::sum(logp * labels, -1));
                 };
                 std::vector<Array> w = {a[0], a[1], a[2]};
                 auto [l, g] = cjax::value_and_grad(loss)(w, a[3], a[4]);
                 std::vector<Array> out{l};
                 for (size_t i = 0; i < w.size(); ++i) out.push_back(w[i] - 0.1f * g[i]);
                 return out;
               },
               {normal(27, {32, 64}) * 0.2f, normal(28, {64}) * 0.1f, normal(29, {64, 10}) * 0.2f,
                normal(30, {256, 32}), jnp::full({256, 10}, 0.1)},
               1e-4});
  return p;
}

}  // namespace cuda_corpus
