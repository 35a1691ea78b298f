// cjax::nn — activations, normalisation, attention and parameter initializers, with the exact
// formulas of jax.nn (compositions of lax/jnp ops, so they trace, differentiate and vmap).
#pragma once
#include <functional>
#include <optional>
#include <string>

#include "cjax/array.h"
#include "cjax/numpy.h"

namespace cjax::nn {

// max(x, 0).
Array relu(const Array& x);
// GELU: tanh approximation 0.5x(1 + tanh(sqrt(2/pi)(x + 0.044715x^3))) or, approximate=false, x(1 + erf(x/sqrt2))/2.
Array gelu(const Array& x, bool approximate = true);
// x * sigmoid(x) (a.k.a. swish).
Array silu(const Array& x);
// 1 / (1 + exp(-x)) (lax.logistic).
Array sigmoid(const Array& x);
// log(1 + exp(x)), computed stably as logaddexp(x, 0).
Array softplus(const Array& x);
// exp(x - max) / sum(exp(x - max)) along `axis`.
Array softmax(const Array& x, numpy::Axis axis = -1);
// x - max - log(sum(exp(x - max))) along `axis` (max-subtracted form).
Array log_softmax(const Array& x, numpy::Axis axis = -1);
// log(sum(exp(x))) along `axis` (None: all axes), stable for infinite maxima as jax.nn.logsumexp.
Array logsumexp(const Array& x, numpy::Axis axis = {}, bool keepdims = false);
// One-hot encoding of integer ids along a new last axis of size num_classes (out-of-range ids give all zeros).
Array one_hot(const Array& ids, int64_t num_classes, DType dtype = DType::float32, int64_t axis = -1);
// (x - mean) * rsqrt(var + epsilon) along `axis`, var = mean(x^2) - mean(x)^2 as in jax.nn.standardize.
Array standardize(const Array& x, numpy::Axis axis = -1, double epsilon = 1e-5);
// RMSNorm over the last axis, computed in f32: x * rsqrt(mean(x^2) + eps) * gain, cast back to x's dtype.
Array rms_norm(const Array& x, const Array& gain, double eps = 1e-6);

// How dot_product_attention computes (JAX's `implementation` argument):
//  automatic: fused where it applies (no bias or mask, float16/bfloat16/float32), else unfused;
//  xla:       the unfused program (logits [B,N,T,S] materialized, softmax, two products);
//  fused:     the fused primitives (flash_attention, one pass per query block with an online softmax;
//             its backward recomputes the probabilities), or ValueError naming what prevents it.
// Both give the same values up to f32 rounding; the fused path keeps the probabilities in f32 for
// the second product where the unfused one rounds them to the inputs' dtype first.
enum class AttentionImplementation { automatic, xla, fused };
struct AttentionOptions {
  bool is_causal = false;                      // keep keys s <= query t (lower-triangular T x S mask)
  std::optional<double> scale = std::nullopt;  // default 1/sqrt(H)
  std::optional<Array> bias = std::nullopt;    // added to the f32 logits, broadcastable to [B, N, T, S]
  std::optional<Array> mask = std::nullopt;    // bool, broadcastable to [B, N, T, S]; false entries are masked
  AttentionImplementation implementation = AttentionImplementation::automatic;
};
// jax.nn.dot_product_attention: q [B,T,N,H], k/v [B,S,K,H] (N a multiple of K, grouped-query
// attention), or the same without B; logits in f32, masked entries -0.7*finfo.max, softmax in f32.
Array dot_product_attention(const Array& q, const Array& k, const Array& v, const AttentionOptions& options = {});

namespace initializers {
// A parameter initializer: (key, shape, dtype) -> array, like jax.nn.initializers.
using Initializer = std::function<Array(Array key, Shape shape, DType dtype)>;

// Every element = value (the key is unused).
Initializer constant(double value);
// Zeros.
Initializer zeros();
// Ones.
Initializer ones();
// normal(key) * stddev.
Initializer normal(double stddev = 1e-2);
// truncated_normal(key, lower, upper) * stddev (no variance correction, as jax.nn.initializers.truncated_normal).
Initializer truncated_normal(double stddev = 1e-2, double lower = -2.0, double upper = 2.0);
// uniform(key) * scale, i.e. in [0, scale).
Initializer uniform(double scale = 1e-2);
// jax.nn.initializers.variance_scaling: mode "fan_in" | "fan_out" | "fan_avg", distribution
// "truncated_normal" | "normal" | "uniform"; fans from in_axis/out_axis times the receptive field.
Initializer variance_scaling(double scale, const std::string& mode, const std::string& distribution,
                             int64_t in_axis = -2, int64_t out_axis = -1);
// variance_scaling(1, "fan_avg", "truncated_normal").
Initializer glorot_normal(int64_t in_axis = -2, int64_t out_axis = -1);
// variance_scaling(1, "fan_avg", "uniform").
Initializer glorot_uniform(int64_t in_axis = -2, int64_t out_axis = -1);
// variance_scaling(1, "fan_in", "truncated_normal").
Initializer lecun_normal(int64_t in_axis = -2, int64_t out_axis = -1);
// variance_scaling(1, "fan_in", "uniform").
Initializer lecun_uniform(int64_t in_axis = -2, int64_t out_axis = -1);
// variance_scaling(2, "fan_in", "truncated_normal").
Initializer he_normal(int64_t in_axis = -2, int64_t out_axis = -1);
// variance_scaling(2, "fan_in", "uniform").
Initializer he_uniform(int64_t in_axis = -2, int64_t out_axis = -1);
// Aliases used by JAX: xavier_* = glorot_*, kaiming_* = he_*.
inline Initializer xavier_normal(int64_t in_axis = -2, int64_t out_axis = -1) {
  return glorot_normal(in_axis, out_axis);
}
// Alias of glorot_uniform.
inline Initializer xavier_uniform(int64_t in_axis = -2, int64_t out_axis = -1) {
  return glorot_uniform(in_axis, out_axis);
}
// Alias of he_normal.
inline Initializer kaiming_normal(int64_t in_axis = -2, int64_t out_axis = -1) { return he_normal(in_axis, out_axis); }
// Alias of he_uniform.
inline Initializer kaiming_uniform(int64_t in_axis = -2, int64_t out_axis = -1) {
  return he_uniform(in_axis, out_axis);
}
}  // namespace initializers

using initializers::Initializer;

}  // namespace cjax::nn
