// cjax::nn — jax.nn's activations, normalisation, dot_product_attention (XLA path) and
// initializers, written with the same formulas as JAX so values agree to rounding.
#include "cjax/nn.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <limits>

#include "cjax/lax.h"
#include "cjax/random.h"
#include "core/array/array_impl.h"
#include "core/array/util.h"
#include "core/lax/attention.h"

namespace cjax::nn {
namespace {

namespace jnp = cjax::numpy;

void check_defined(std::string_view fn, const Array& x, std::string_view what = "x") {
  if (!x.defined()) throw ValueError(fmt::format("nn.{}: {} is an empty Array handle", fn, what));
}

// promote_args_inexact: integer / bool inputs become float32 (JAX's default float), floats stay.
Array inexact(std::string_view fn, const Array& x) {
  check_defined(fn, x);
  return is_floating(x.dtype()) ? x : lax::convert_element_type(x, DType::float32);
}

// The dtype computations are done in for "f32 at least": f32, or f64 for f64 inputs.
DType at_least_f32(DType d) { return d == DType::float64 ? DType::float64 : DType::float32; }

double finfo_max(DType d) {
  switch (d) {
    case DType::float64: return std::numeric_limits<double>::max();
    case DType::float32: return double(std::numeric_limits<float>::max());
    case DType::float16: return 65504.0;
    case DType::bfloat16: return 3.3895313892515355e38;
    default: throw DTypeError(fmt::format("internal: finfo of {}", dtype_name(d)));
  }
}

}  // namespace

Array relu(const Array& x) {
  check_defined("relu", x);
  return jnp::maximum(x, Array(0));
}

Array sigmoid(const Array& x) { return lax::logistic(inexact("sigmoid", x)); }

Array silu(const Array& x) {
  Array xf = inexact("silu", x);
  return xf * lax::logistic(xf);
}

Array gelu(const Array& x, bool approximate) {
  Array xf = inexact("gelu", x);
  if (approximate) {
    // sqrt(2/pi) rounded to x's dtype; 0.5, 1.0 and 0.044715 are weak (Python) scalars.
    Array c = make_scalar(std::sqrt(2.0 / M_PI), xf.dtype());
    Array cdf = 0.5 * (1.0 + jnp::tanh(c * (xf + 0.044715 * lax::integer_pow(xf, 3))));
    return xf * cdf;
  }
  // x * (erf(x / np.sqrt(2)) + 1) / 2: np.sqrt(2) is a strongly typed float32 (x32 mode), so half
  // types compute in f32 and the result is cast back to x's dtype.
  DType d = xf.dtype();
  Array xc = lax::convert_element_type(xf, at_least_f32(d));
  Array s2 = make_scalar(std::sqrt(2.0), xc.dtype());
  Array y = xc * (lax::erf(lax::div(xc, s2)) + 1.0) / 2.0;
  return lax::convert_element_type(y, d);
}

Array softplus(const Array& x) {
  // logaddexp(x, 0) as JAX: max(x, 0) + log1p(exp(-|x - 0|)), NaN where x - 0 is NaN.
  Array xf = inexact("softplus", x);
  Array amax = jnp::maximum(xf, Array(0.0));
  Array r = amax + jnp::log1p(jnp::exp(-jnp::abs(xf)));
  return jnp::where(jnp::isnan(xf), xf, r);
}

Array softmax(const Array& x, numpy::Axis axis) {
  Array xf = inexact("softmax", x);
  Array x_max = lax::stop_gradient(jnp::max(xf, axis, /*keepdims=*/true));
  Array unnormalized = jnp::exp(xf - x_max);
  return unnormalized / jnp::sum(unnormalized, axis, /*keepdims=*/true);
}

Array log_softmax(const Array& x, numpy::Axis axis) {
  Array xf = inexact("log_softmax", x);
  Array shifted = xf - lax::stop_gradient(jnp::max(xf, axis, /*keepdims=*/true));
  Array shifted_logsumexp = jnp::log(jnp::sum(jnp::exp(shifted), axis, /*keepdims=*/true));
  return shifted - shifted_logsumexp;
}

Array logsumexp(const Array& x, numpy::Axis axis, bool keepdims) {
  Array a = inexact("logsumexp", x);
  Array amax = jnp::max(a, axis, /*keepdims=*/true);
  amax = lax::stop_gradient(jnp::where(jnp::isfinite(amax), amax, jnp::zeros_like(amax)));
  Array sumexp = jnp::sum(jnp::exp(a - amax), axis, /*keepdims=*/true);
  Array out = jnp::log(sumexp) + amax;
  if (keepdims) return out;
  return axis.is_none() ? jnp::reshape(out, {}) : jnp::squeeze(out, axis);
}

Array one_hot(const Array& ids, int64_t num_classes, DType dtype, int64_t axis) {
  check_defined("one_hot", ids, "ids");
  if (!is_integer(ids.dtype()))
    throw DTypeError(
        fmt::format("nn.one_hot: ids must be integers, got {} {}; convert class indices with "
                    ".astype(int32)",
                    dtype_name(ids.dtype()), shape_str(ids.shape())));
  if (num_classes < 0)
    throw ValueError(fmt::format("nn.one_hot: num_classes must be non-negative, got {}", num_classes));
  int64_t pos = canonicalize_axis(axis, ids.ndim() + 1, "nn.one_hot");
  Array lhs = lax::expand_dims(ids, {pos});
  Shape rhs_shape(size_t(ids.ndim()), 1);
  rhs_shape.insert(rhs_shape.begin() + pos, num_classes);
  Array rhs = lax::broadcasted_iota(ids.dtype(), rhs_shape, pos);
  return lax::convert_element_type(jnp::equal(lhs, rhs), dtype);
}

Array standardize(const Array& x, numpy::Axis axis, double epsilon) {
  Array xf = inexact("standardize", x);
  Array mean = jnp::mean(xf, axis, /*keepdims=*/true);
  Array variance = jnp::mean(jnp::square(xf), axis, /*keepdims=*/true) - jnp::square(mean);
  return (xf - mean) * lax::rsqrt(variance + epsilon);
}

Array rms_norm(const Array& x, const Array& gain, double eps) {
  check_defined("rms_norm", x);
  check_defined("rms_norm", gain, "gain");
  if (x.ndim() == 0)
    throw ShapeError("nn.rms_norm: x must have at least one dimension (the normalised axis), got a scalar");
  Shape b;
  try {
    b = jnp::broadcast_shapes({x.shape(), gain.shape()});
  } catch (const Error&) {
    b.clear();
  }
  if (b != x.shape())
    throw ShapeError(
        fmt::format("nn.rms_norm: gain of shape {} does not broadcast to x's shape {} (use a gain of "
                    "shape ({},))",
                    shape_str(gain.shape()), shape_str(x.shape()), x.shape().back()));
  DType d = is_floating(x.dtype()) ? x.dtype() : DType::float32;
  DType c = at_least_f32(d);
  Array xf = lax::convert_element_type(x, c);
  Array ms = jnp::mean(jnp::square(xf), -1, /*keepdims=*/true);
  Array y = xf * lax::rsqrt(ms + eps) * lax::convert_element_type(gain, c);
  return lax::convert_element_type(y, d);
}

namespace {
// Whether a call with nothing that prevents fusion runs fused: an explicit choice, else
// CJAX_ATTENTION (fused | xla: A/B comparisons of whole programs), else yes.
bool fused_requested(const AttentionOptions& o) {
  if (o.implementation != AttentionImplementation::automatic) return o.implementation == AttentionImplementation::fused;
  static const std::string from_env = [] {
    const char* v = std::getenv("CJAX_ATTENTION");
    std::string s = v ? v : "";
    if (s != "" && s != "automatic" && s != "fused" && s != "xla")
      throw ValueError(fmt::format("CJAX_ATTENTION={}: expected fused, xla or automatic", s));
    return s;
  }();
  if (from_env == "fused" || from_env == "xla") return from_env == "fused";
  return true;
}
}  // namespace

Array dot_product_attention(const Array& q_in, const Array& k_in, const Array& v_in, const AttentionOptions& o) {
  check_defined("dot_product_attention", q_in, "query");
  check_defined("dot_product_attention", k_in, "key");
  check_defined("dot_product_attention", v_in, "value");
  const std::string shapes = fmt::format("query {}, key {}, value {}", shape_str(q_in.shape()), shape_str(k_in.shape()),
                                         shape_str(v_in.shape()));
  int nd = q_in.ndim();
  if ((nd != 3 && nd != 4) || k_in.ndim() != nd || v_in.ndim() != nd)
    throw ShapeError(
        fmt::format("nn.dot_product_attention: query, key and value must all be [B, T, N, H] (or "
                    "[T, N, H]), got {}",
                    shapes));
  auto ensure4 = [&](const Array& t) { return nd == 3 ? lax::expand_dims(t, {0}) : t; };
  Array q = ensure4(q_in), k = ensure4(k_in), v = ensure4(v_in);
  const int64_t B = k.shape()[0], S = k.shape()[1], K = k.shape()[2], H = k.shape()[3];
  const int64_t T = q.shape()[1], N = q.shape()[2];
  if (v.shape() != k.shape())
    throw ShapeError(
        fmt::format("nn.dot_product_attention: value must have the shape of key [B, S, K, H], got {}", shapes));
  if (q.shape()[0] != B || q.shape()[3] != H)
    throw ShapeError(
        fmt::format("nn.dot_product_attention: query must be [B, T, N, H] with the batch size and head "
                    "dim H of key, got {}",
                    shapes));
  if (K == 0 || N % K != 0)
    throw ShapeError(
        fmt::format("nn.dot_product_attention: the number of query heads N must be a multiple of the "
                    "number of key/value heads K (grouped-query attention), got {}",
                    shapes));
  if (q.dtype() != k.dtype() || v.dtype() != k.dtype())
    throw DTypeError(
        fmt::format("nn.dot_product_attention: query, key and value must share one dtype, got {}, {} "
                    "and {}",
                    dtype_name(q.dtype()), dtype_name(k.dtype()), dtype_name(v.dtype())));
  if (!is_floating(q.dtype()))
    throw DTypeError(
        fmt::format("nn.dot_product_attention: inputs must be floating-point, got {}", dtype_name(q.dtype())));
  const int64_t G = N / K;
  const Shape logits_shape{B, N, T, S};
  auto check_bcast = [&](const Array& t, std::string_view what) {
    Array t4 = nd == 3 && t.ndim() == 3 ? lax::expand_dims(t, {0}) : t;
    Shape b;
    try {
      b = jnp::broadcast_shapes({logits_shape, t4.shape()});
    } catch (const Error&) {
      b.clear();
    }
    if (b != logits_shape)
      throw ShapeError(
          fmt::format("nn.dot_product_attention: {} of shape {} does not broadcast to the logits' "
                      "shape [B, N, T, S] = {}",
                      what, shape_str(t.shape()), shape_str(logits_shape)));
    return jnp::broadcast_to(t4, logits_shape);
  };

  double scale = o.scale ? *o.scale : 1.0 / std::sqrt(double(H));
  std::string fused_blocker = o.bias                               ? "a bias"
                              : o.mask                             ? "a mask"
                              : !attention::fused_dtype(q.dtype()) ? fmt::format("dtype {}", dtype_name(q.dtype()))
                                                                   : "";
  if (o.implementation == AttentionImplementation::fused && !fused_blocker.empty())
    throw ValueError(
        fmt::format("nn.dot_product_attention: implementation=fused does not take {} (it takes "
                    "float16, bfloat16 or float32 and is_causal); use implementation=automatic or xla",
                    fused_blocker));
  if (fused_blocker.empty() && fused_requested(o)) {
    Array enc = attention::forward(q, k, v, {.scale = scale, .is_causal = o.is_causal})[0];
    return nd == 3 ? lax::reshape(enc, {T, N, H}) : enc;
  }
  DType ldt = at_least_f32(q.dtype());
  // logits[b, k, t, g, s] = sum_h q[b, t, k, g, h] k[b, s, k, h], accumulated in f32.
  Array qg = lax::reshape(q, {B, T, K, G, H});
  lax::DotDimensionNumbers dn1{{{4}, {3}}, {{0, 2}, {0, 2}}};
  Array logits = lax::dot_general(qg, k, dn1, ldt);                              // [B, K, T, G, S]
  logits = lax::reshape(lax::transpose(logits, {0, 1, 3, 2, 4}), logits_shape);  // [B, N, T, S]
  logits = lax::mul(logits, make_scalar(scale, ldt));
  if (o.bias) logits = lax::convert_element_type(logits + check_bcast(*o.bias, "bias"), ldt);
  if (o.mask || o.is_causal) {
    Array combined = jnp::ones(logits_shape, DType::bool_);
    if (o.mask) {
      if (o.mask->dtype() != DType::bool_)
        throw DTypeError(
            fmt::format("nn.dot_product_attention: mask must be bool, got {}", dtype_name(o.mask->dtype())));
      combined = check_bcast(*o.mask, "mask");
    }
    if (o.is_causal) {
      Array t_idx = lax::broadcasted_iota(DType::int32, {T, S}, 0),
            s_idx = lax::broadcasted_iota(DType::int32, {T, S}, 1);
      Array causal = lax::broadcast_in_dim(lax::ge(t_idx, s_idx), logits_shape, {2, 3});
      combined = lax::bitwise_and(combined, causal);
    }
    Array large_negative = jnp::full_like(logits, make_scalar(-0.7 * finfo_max(ldt), ldt));
    logits = lax::select(combined, logits, large_negative);
  }
  Array probs = lax::convert_element_type(softmax(lax::convert_element_type(logits, DType::float32), -1), k.dtype());
  // encoded[b, t, n, h] = sum_s probs[b, n, t, s] v[b, s, k, h].
  Array pg = lax::reshape(probs, {B, K, G, T, S});
  lax::DotDimensionNumbers dn2{{{4}, {1}}, {{0, 1}, {0, 2}}};
  Array enc = lax::dot_general(pg, v, dn2);  // [B, K, G, T, H]
  enc = lax::reshape(lax::transpose(enc, {0, 3, 1, 2, 4}), {B, T, N, H});
  return nd == 3 ? lax::reshape(enc, {T, N, H}) : enc;
}

namespace initializers {
namespace {

void check_float_init(std::string_view fn, DType d) {
  if (!is_floating(d))
    throw DTypeError(fmt::format("nn.initializers.{}: dtype must be floating-point, got {}", fn, dtype_name(d)));
}

std::pair<double, double> compute_fans(const Shape& shape, int64_t in_axis, int64_t out_axis) {
  if (shape.size() < 2)
    throw ShapeError(
        fmt::format("nn.initializers.variance_scaling: can't compute input and output sizes of a "
                    "{}-dimensional weights tensor of shape {}; it must be at least 2-D",
                    shape.size(), shape_str(shape)));
  int64_t nd = int64_t(shape.size());
  double in_size = double(shape[size_t(canonicalize_axis(in_axis, nd, "nn.initializers.variance_scaling"))]);
  double out_size = double(shape[size_t(canonicalize_axis(out_axis, nd, "nn.initializers.variance_scaling"))]);
  double total = 1;
  for (int64_t d : shape) total *= double(d);
  double receptive = total / in_size / out_size;
  return {in_size * receptive, out_size * receptive};
}

}  // namespace

Initializer constant(double value) {
  return [value](Array, Shape shape, DType dtype) { return jnp::full(shape, Array(value), dtype); };
}
Initializer zeros() {
  return [](Array, Shape shape, DType dtype) { return jnp::zeros(shape, dtype); };
}
Initializer ones() {
  return [](Array, Shape shape, DType dtype) { return jnp::ones(shape, dtype); };
}

Initializer normal(double stddev) {
  return [stddev](Array key, Shape shape, DType dtype) { return random::normal(key, shape, dtype) * stddev; };
}

Initializer truncated_normal(double stddev, double lower, double upper) {
  return [=](Array key, Shape shape, DType dtype) {
    check_float_init("truncated_normal", dtype);
    return random::truncated_normal(key, lower, upper, shape, dtype) * stddev;
  };
}

Initializer uniform(double scale) {
  return [scale](Array key, Shape shape, DType dtype) { return random::uniform(key, shape, dtype) * scale; };
}

Initializer variance_scaling(double scale, const std::string& mode, const std::string& distribution, int64_t in_axis,
                             int64_t out_axis) {
  if (scale <= 0)
    throw ValueError(fmt::format("nn.initializers.variance_scaling: scale must be positive, got {}", scale));
  if (mode != "fan_in" && mode != "fan_out" && mode != "fan_avg")
    throw ValueError(
        fmt::format("nn.initializers.variance_scaling: invalid mode '{}' (use fan_in, fan_out or "
                    "fan_avg)",
                    mode));
  if (distribution != "truncated_normal" && distribution != "normal" && distribution != "uniform")
    throw ValueError(
        fmt::format("nn.initializers.variance_scaling: invalid distribution '{}' (use "
                    "truncated_normal, normal or uniform)",
                    distribution));
  return [=](Array key, Shape shape, DType dtype) -> Array {
    check_float_init("variance_scaling", dtype);
    auto [fan_in, fan_out] = compute_fans(shape, in_axis, out_axis);
    double denominator = mode == "fan_in" ? fan_in : mode == "fan_out" ? fan_out : (fan_in + fan_out) / 2;
    Array variance = make_scalar(scale / denominator, dtype);  // jnp.array(scale / denominator, dtype)
    if (distribution == "truncated_normal") {
      // 0.87962566103423978 is the stddev of a standard normal truncated to (-2, 2).
      Array stddev = lax::div(lax::sqrt(variance), make_scalar(0.87962566103423978, dtype));
      return random::truncated_normal(key, -2.0, 2.0, shape, dtype) * stddev;
    }
    if (distribution == "normal") return random::normal(key, shape, dtype) * lax::sqrt(variance);
    return random::uniform(key, shape, dtype, -1.0) * lax::sqrt(3.0 * variance);
  };
}

Initializer glorot_normal(int64_t in_axis, int64_t out_axis) {
  return variance_scaling(1.0, "fan_avg", "truncated_normal", in_axis, out_axis);
}
Initializer glorot_uniform(int64_t in_axis, int64_t out_axis) {
  return variance_scaling(1.0, "fan_avg", "uniform", in_axis, out_axis);
}
Initializer lecun_normal(int64_t in_axis, int64_t out_axis) {
  return variance_scaling(1.0, "fan_in", "truncated_normal", in_axis, out_axis);
}
Initializer lecun_uniform(int64_t in_axis, int64_t out_axis) {
  return variance_scaling(1.0, "fan_in", "uniform", in_axis, out_axis);
}
Initializer he_normal(int64_t in_axis, int64_t out_axis) {
  return variance_scaling(2.0, "fan_in", "truncated_normal", in_axis, out_axis);
}
Initializer he_uniform(int64_t in_axis, int64_t out_axis) {
  return variance_scaling(2.0, "fan_in", "uniform", in_axis, out_axis);
}

}  // namespace initializers
}  // namespace cjax::nn
