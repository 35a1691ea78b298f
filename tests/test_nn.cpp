// cjax::nn: values against numpy-computed literals (offline numpy, pasted here), attention
// semantics of docs/examples.md §5.4, initializer statistics and misuse errors.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "cjax/cjax.h"

using namespace cjax;
namespace jnp = cjax::numpy;

namespace {

void check_close(const Array& a, const std::vector<float>& want, double rtol = 1e-5, double atol = 1e-6) {
  auto got = a.to_vector<float>();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i])) {
      CHECK_MESSAGE(std::isnan(got[i]), "element ", i);
    } else if (std::isinf(want[i])) {
      CHECK_MESSAGE(got[i] == want[i], "element ", i, ": ", got[i], " vs ", want[i]);
    } else {
      CHECK_MESSAGE(std::abs(double(got[i]) - want[i]) <= atol + rtol * std::abs(want[i]), "element ", i, ": ", got[i],
                    " vs ", want[i]);
    }
  }
}

Array X23() { return jnp::array<float>({1.f, 2.f, 3.f, 0.5f, -1.f, 2.f}, {2, 3}); }

const std::vector<float> kQ = {0.13f,  -0.13f, 0.64f,  0.10f, -0.54f, 0.36f,  1.30f,  0.95f,
                               -0.70f, -1.27f, -0.62f, 0.04f, -2.33f, -0.22f, -1.25f, -0.73f,
                               -0.54f, -0.32f, 0.41f,  1.04f, -0.13f, 1.37f,  -0.67f, 0.35f};
const std::vector<float> kK = {0.90f,  0.09f, -0.74f, -0.92f, -0.46f, 0.22f,  -1.01f, -0.21f,
                               -0.16f, 0.54f, 0.21f,  0.36f,  -0.65f, -0.13f, 0.78f,  1.49f,
                               -1.26f, 1.51f, 1.35f,  0.78f,  0.26f,  -0.31f, 1.46f,  1.96f};
const std::vector<float> kV = {1.80f, 1.32f,  0.36f,  -1.21f, -0.00f, 0.66f,  -1.29f, 0.40f,
                               0.43f, 0.70f,  -1.18f, -0.66f, -0.44f, -1.17f, 1.74f,  -0.50f,
                               0.33f, -0.26f, 1.58f,  1.32f,  0.63f,  -2.20f, 0.05f,  0.68f};
// numpy: einsum in f64, /sqrt(3), tril mask with -0.7 * finfo(float32).max, softmax, einsum.
const std::vector<float> kCausal =
    {1.7999999523162842f,   1.3200000524520874f,   0.36000001430511475f, -1.2100000381469727f, 0.0f,
     0.6600000262260437f,   1.3737666606903076f,   1.1930956840515137f,  0.3696557879447937f,  -0.8032292723655701f,
     -0.25130340456962585f, 0.37888094782829285f,  -0.8614001274108887f, 0.13069601356983185f, 0.7096912264823914f,
     -0.609920859336853f,   -0.21380311250686646f, 0.1576351523399353f,  0.9337568879127502f,  0.8170201778411865f,
     0.6935384273529053f,   -0.4727289080619812f,  0.06107315793633461f, -0.20293626189231873f};
const std::vector<float> kFull = {0.3781362473964691f,  0.3482890725135803f,   0.8790993094444275f,
                                  -0.7167165875434875f, -0.08492645621299744f, 0.024601174518465996f,
                                  1.3775134086608887f,  1.1255877017974854f,   0.579289972782135f,
                                  -1.0187585353851318f, -0.12242896109819412f, 0.3522886335849762f,
                                  -0.8155199289321899f, 0.15304608643054962f,  0.7081936597824097f,
                                  -0.8430591225624084f, -0.1751241534948349f,  0.2342245727777481f,
                                  0.9337568879127502f,  0.8170201778411865f,   0.6935384273529053f,
                                  -0.4727289080619812f, 0.06107315793633461f,  -0.20293626189231873f};

}  // namespace

TEST_CASE("softmax / log_softmax / logsumexp") {
  Array x = X23();
  Array s = nn::softmax(x);
  CHECK(s.dtype() == f32);
  check_close(s, {0.09003057330846786f, 0.2447284609079361f, 0.6652409434318542f, 0.17529037594795227f,
                  0.03911257162690163f, 0.785597026348114f});
  check_close(jnp::sum(s, -1), {1.f, 1.f});
  check_close(nn::softmax(x, 0), {0.622459352016449f, 0.9525741338729858f, 0.7310585975646973f, 0.3775406777858734f,
                                  0.04742587357759476f, 0.26894140243530273f});
  check_close(nn::log_softmax(x), {-2.4076061248779297f, -1.4076060056686401f, -0.40760600566864014f,
                                   -1.7413113117218018f, -3.2413113117218018f, -0.24131132662296295f});
  // -inf entries: probability 0, log-probability -inf, the rest unaffected.
  Array y = jnp::array<float>({0.f, -INFINITY, 1.f});
  check_close(nn::log_softmax(y), {-1.31326162815094f, -INFINITY, -0.31326165795326233f});
  check_close(nn::softmax(y), {0.2689414322376251f, 0.f, 0.7310585975646973f});
  // Large values do not overflow (max-subtracted form).
  check_close(nn::softmax(jnp::array<float>({1000.f, 1000.f})), {0.5f, 0.5f});
  // NaN propagates.
  CHECK(jnp::all(jnp::isnan(nn::softmax(jnp::array<float>({1.f, NAN})))).item<bool>());
  // logsumexp over all axes, one axis, keepdims, and infinities.
  check_close(nn::logsumexp(x), {3.6787919998168945f});
  CHECK(nn::logsumexp(x).shape() == Shape{});
  check_close(nn::logsumexp(x, 1), {3.4076058864593506f, 2.2413113117218018f});
  CHECK(nn::logsumexp(x, 1, true).shape() == Shape{2, 1});
  check_close(nn::logsumexp(jnp::array<float>({-INFINITY, -INFINITY})), {-INFINITY});
  check_close(nn::logsumexp(jnp::array<float>({INFINITY, 1.f})), {INFINITY});
  // Other dtypes: f64 exact-ish, bf16 / f16 within half precision, ints promoted to float32.
  check_close(nn::softmax(x.astype(f64)).astype(f32), s.to_vector<float>(), 1e-7);
  for (DType dt : {bf16, f16}) {
    Array h = nn::softmax(x.astype(dt));
    CHECK(h.dtype() == dt);
    check_close(h.astype(f32), s.to_vector<float>(), 1e-2, 1e-3);
  }
  Array si = nn::softmax(jnp::array<int32_t>({1, 2, 3}));
  CHECK(si.dtype() == f32);
  check_close(si, {0.09003057330846786f, 0.2447284609079361f, 0.6652409434318542f});
  // Zero-size batch.
  CHECK(nn::softmax(jnp::zeros({0, 3})).shape() == Shape{0, 3});
}

TEST_CASE("activations") {
  Array g = jnp::array<float>({-3.f, -1.f, 0.f, 0.5f, 2.f});
  check_close(nn::gelu(g),
              {-0.003637343645095825f, -0.15880799293518066f, 0.0f, 0.3457140326499939f, 1.9545977115631104f});
  check_close(nn::gelu(g, false),
              {-0.004049694165587425f, -0.15865525603294373f, 0.0f, 0.3457312285900116f, 1.9544997215270996f});
  for (DType dt : {bf16, f16, f64}) {
    Array h = nn::gelu(g.astype(dt));
    CHECK(h.dtype() == dt);
    check_close(h.astype(f32), nn::gelu(g).to_vector<float>(), 1e-2, 1e-2);
    Array he = nn::gelu(g.astype(dt), false);
    CHECK(he.dtype() == dt);
    check_close(he.astype(f32), nn::gelu(g, false).to_vector<float>(), 1e-2, 1e-2);
  }
  Array a = jnp::array<float>({-30.f, -1.f, 0.f, 1.f, 30.f});
  check_close(nn::sigmoid(a), {9.357622912219837e-14f, 0.2689414322376251f, 0.5f, 0.7310585975646973f, 1.0f});
  check_close(nn::silu(a), {-2.807286954981114e-12f, -0.2689414322376251f, 0.0f, 0.7310585975646973f, 30.0f});
  check_close(nn::softplus(a),
              {9.357622912219837e-14f, 0.3132616877555847f, 0.6931471824645996f, 1.31326162815094f, 30.0f});
  // softplus is stable at the extremes and keeps infinities / NaN.
  check_close(nn::softplus(jnp::array<float>({1000.f, -1000.f, INFINITY, -INFINITY, NAN})),
              {1000.f, 0.f, INFINITY, 0.f, NAN});
  check_close(nn::relu(jnp::array<float>({-2.f, 0.f, 3.f, NAN})), {0.f, 0.f, 3.f, NAN});
  Array ri = nn::relu(jnp::array<int32_t>({-2, 0, 3}));
  CHECK(ri.dtype() == i32);
  CHECK(ri.to_vector<int32_t>() == std::vector<int32_t>{0, 0, 3});
  Array r8 = nn::relu(jnp::array<int8_t>({-2, 5}));
  CHECK(r8.dtype() == i8);
  CHECK(nn::relu(Array(-1.5f)).item<float>() == 0.f);  // 0-d
  CHECK(nn::sigmoid(jnp::array<int32_t>({0})).dtype() == f32);
  CHECK(nn::silu(jnp::zeros({0})).size() == 0);
}

TEST_CASE("one_hot") {
  Array ids = jnp::array<int32_t>({0, 2, 1, 3, -1});
  Array oh = nn::one_hot(ids, 3);
  CHECK(oh.dtype() == f32);
  CHECK(oh.shape() == Shape{5, 3});
  CHECK(oh.to_vector<float>() == std::vector<float>{1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0});
  Array oh0 = nn::one_hot(jnp::array<int32_t>({1, 0}), 2, bf16, 0);
  CHECK(oh0.dtype() == bf16);
  CHECK(oh0.astype(f32).to_vector<float>() == std::vector<float>{0, 1, 1, 0});
  Array oh2 = nn::one_hot(jnp::array<uint8_t>({1, 0, 2, 2}, {2, 2}), 3, i32);
  CHECK(oh2.shape() == Shape{2, 2, 3});
  CHECK(oh2.to_vector<int32_t>() == std::vector<int32_t>{0, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 1});
  CHECK(nn::one_hot(Array(2), 4).to_vector<float>() == std::vector<float>{0, 0, 1, 0});
  CHECK(nn::one_hot(jnp::array<int64_t>({5}), 4).to_vector<float>() == std::vector<float>{0, 0, 0, 0});
}

TEST_CASE("standardize and rms_norm") {
  Array z = jnp::array<float>({1.f, 2.f, 3.f, 4.f, 2.f, 2.f, 2.f, 10.f}, {2, 4});
  check_close(nn::standardize(z),
              {-1.3416354656219482f, -0.4472118318080902f, 0.4472118318080902f, 1.3416354656219482f,
               -0.5773500204086304f, -0.5773500204086304f, -0.5773500204086304f, 1.7320501804351807f});
  Array gain = jnp::array<float>({1.f, 0.5f, 2.f, -1.f});
  std::vector<float> rms = {0.3651483654975891f,  0.3651483654975891f,  2.190890073776245f,  -1.4605934619903564f,
                            0.37796443700790405f, 0.18898221850395203f, 0.7559288740158081f, -1.889822244644165f};
  check_close(nn::rms_norm(z, gain), rms);
  Array rb = nn::rms_norm(z.astype(bf16), gain.astype(bf16));
  CHECK(rb.dtype() == bf16);
  check_close(rb.astype(f32), rms, 1e-2, 1e-2);
  CHECK(nn::rms_norm(z.astype(f64), gain).dtype() == f64);
}

TEST_CASE("dot_product_attention: causal [1,4,2,3] vs numpy (docs/examples.md §5.4)") {
  Array q = jnp::array<float>(kQ, {1, 4, 2, 3}), k = jnp::array<float>(kK, {1, 4, 2, 3}),
        v = jnp::array<float>(kV, {1, 4, 2, 3});
  Array out = nn::dot_product_attention(q, k, v, {.is_causal = true});
  CHECK(out.shape() == Shape{1, 4, 2, 3});
  CHECK(out.dtype() == f32);
  check_close(out, kCausal, 1e-5, 1e-6);
  check_close(nn::dot_product_attention(q, k, v), kFull, 1e-5, 1e-6);
  // The first query attends only to the first key: output = v[0].
  check_close(out[{0, 0}], {1.8f, 1.32f, 0.36f, -1.21f, 0.f, 0.66f});
  // Future positions do not affect earlier outputs.
  Array k2 = k.at({Slice(), 3}).set(100.f), v2 = v.at({Slice(), 3}).set(-50.f);
  Array out2 = nn::dot_product_attention(q, k2, v2, {.is_causal = true});
  check_close(out2[{Slice(), Slice(0, 3)}], out[{Slice(), Slice(0, 3)}].to_vector<float>(), 0, 0);
  CHECK(!jnp::allclose(out2[{Slice(), 3}], out[{Slice(), 3}]));
  // An explicit lower-triangular mask is the causal mask.
  Array tril = jnp::tril(jnp::ones({4, 4}, bool_));
  check_close(nn::dot_product_attention(q, k, v, {.mask = tril}), kCausal, 1e-6, 1e-7);
  // Scale and bias: scale s equals pre-scaling q by s * sqrt(H); zero bias changes nothing.
  Array scaled = nn::dot_product_attention(q, k, v, {.scale = 0.25});
  check_close(scaled, nn::dot_product_attention(q * float(0.25 * std::sqrt(3.0)), k, v).to_vector<float>(), 1e-5, 1e-6);
  check_close(nn::dot_product_attention(q, k, v, {.is_causal = true, .bias = jnp::zeros({1, 1, 4, 4})}), kCausal, 1e-6,
              1e-7);
  // No batch axis: [T, N, H].
  check_close(nn::dot_product_attention(q[0], k[0], v[0], {.is_causal = true}), kCausal, 1e-6, 1e-7);
  // bf16 inputs: f32 logits and softmax, bf16 result close to the f32 one.
  Array ob = nn::dot_product_attention(q.astype(bf16), k.astype(bf16), v.astype(bf16), {.is_causal = true});
  CHECK(ob.dtype() == bf16);
  check_close(ob.astype(f32), kCausal, 3e-2, 3e-2);
  // Grouped-query attention: K=1 key/value head shared by N=2 query heads == repeating it.
  Array k1 = k[{Slice(), Slice(), Slice(0, 1)}], v1 = v[{Slice(), Slice(), Slice(0, 1)}];
  Array gqa = nn::dot_product_attention(q, k1, v1, {.is_causal = true});
  Array rep =
      nn::dot_product_attention(q, jnp::concatenate({k1, k1}, 2), jnp::concatenate({v1, v1}, 2), {.is_causal = true});
  check_close(gqa, rep.to_vector<float>(), 1e-6, 1e-7);
}

TEST_CASE("initializers") {
  Array key = random::key(0);
  using namespace nn::initializers;
  // he_normal = variance_scaling(2, fan_in, truncated_normal): stddev sqrt(2/fan_in)/0.8796...
  Array w = he_normal()(key, {64, 32}, f32);
  CHECK(w.shape() == Shape{64, 32});
  float stddev = std::sqrt(float(2.0 / 64)) / float(0.87962566103423978);
  CHECK(jnp::array_equal(w, random::truncated_normal(key, -2.0, 2.0, Shape{64, 32}) * stddev));
  // Empirical stddevs on large draws.
  auto sd = [](const Array& a) { return jnp::std(a.astype(f32)).item<double>(); };
  CHECK(std::abs(sd(he_normal()(key, {512, 256}, f32)) / std::sqrt(2.0 / 512) - 1) < 0.02);
  CHECK(std::abs(sd(lecun_normal()(key, {512, 256}, f32)) / std::sqrt(1.0 / 512) - 1) < 0.02);
  // Conv kernel HWIO: receptive field 9, fan_in 576, fan_out 1152.
  CHECK(std::abs(sd(glorot_normal()(key, {3, 3, 64, 128}, f32)) / std::sqrt(1.0 / 864) - 1) < 0.02);
  CHECK(std::abs(sd(he_uniform()(key, {512, 256}, f32)) / std::sqrt(2.0 / 512) - 1) < 0.02);
  CHECK(std::abs(sd(glorot_uniform()(key, {512, 256}, f32)) / std::sqrt(1.0 / 384) - 1) < 0.02);
  CHECK(std::abs(sd(variance_scaling(1.0, "fan_out", "normal")(key, {256, 512}, f32)) / std::sqrt(1.0 / 512) - 1) <
        0.02);
  // in_axis / out_axis.
  CHECK(std::abs(sd(lecun_normal(0, 1)(key, {128, 512}, f32)) / std::sqrt(1.0 / 128) - 1) < 0.02);
  // Uniform bounds: he_uniform in [-sqrt(6/fan_in), sqrt(6/fan_in)).
  Array hu = he_uniform()(key, {600, 100}, f32);
  double lim = std::sqrt(6.0 / 600);
  CHECK(jnp::max(jnp::abs(hu)).item<double>() <= lim);
  CHECK(jnp::max(jnp::abs(hu)).item<double>() > 0.99 * lim);
  // Truncated normal initializer: within stddev * [-2, 2].
  Array tn = truncated_normal(0.5)(key, {1000}, f32);
  CHECK(jnp::max(jnp::abs(tn)).item<float>() <= 1.f);
  CHECK(std::abs(sd(normal(0.1)(key, {100000}, f32)) - 0.1) < 0.002);
  Array un = uniform(0.5)(key, {1000}, f32);
  CHECK(jnp::min(un).item<float>() >= 0.f);
  CHECK(jnp::max(un).item<float>() < 0.5f);
  CHECK(jnp::array_equal(constant(3.5)(key, {2, 2}, f32), jnp::full({2, 2}, 3.5f)));
  CHECK(constant(7)(key, {3}, i32).to_vector<int32_t>() == std::vector<int32_t>{7, 7, 7});
  CHECK(zeros()(key, {2}, bf16).dtype() == bf16);
  CHECK(ones()(key, {2}, f32).to_vector<float>() == std::vector<float>{1, 1});
  // bf16 parameters (the cookbook's): right dtype and scale.
  Array wb = he_normal()(key, {512, 256}, bf16);
  CHECK(wb.dtype() == bf16);
  CHECK(std::abs(sd(wb) / std::sqrt(2.0 / 512) - 1) < 0.03);
}

TEST_CASE("nn misuse raises typed errors naming the problem") {
  Array q = jnp::zeros({1, 4, 2, 3}), k5 = jnp::zeros({1, 4, 2, 5});
  // one_hot of float ids.
  CHECK_THROWS_WITH_AS(nn::one_hot(jnp::array<float>({0.f, 1.f}), 3), doctest::Contains("float32"), DTypeError);
  CHECK_THROWS_WITH_AS(nn::one_hot(jnp::array<int32_t>({0}), 3, f32, 3), doctest::Contains("axis 3"), ValueError);
  // Attention with mismatched head dims names every shape.
  CHECK_THROWS_WITH_AS(nn::dot_product_attention(q, k5, k5), doctest::Contains("(1, 4, 2, 3)"), ShapeError);
  CHECK_THROWS_WITH_AS(nn::dot_product_attention(q, k5, k5), doctest::Contains("(1, 4, 2, 5)"), ShapeError);
  // Heads not a multiple, value/key mismatch, rank, dtype mismatch, non-bool mask, bad bias shape.
  CHECK_THROWS_WITH_AS(nn::dot_product_attention(jnp::zeros({1, 4, 3, 3}), q, q), doctest::Contains("multiple"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(nn::dot_product_attention(q, q, jnp::zeros({1, 5, 2, 3})), doctest::Contains("(1, 5, 2, 3)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(nn::dot_product_attention(jnp::zeros({4, 3}), jnp::zeros({4, 3}), jnp::zeros({4, 3})),
                       doctest::Contains("(4, 3)"), ShapeError);
  CHECK_THROWS_WITH_AS(nn::dot_product_attention(q, q.astype(bf16), q), doctest::Contains("bfloat16"), DTypeError);
  CHECK_THROWS_WITH_AS(nn::dot_product_attention(q, q, q, {.mask = jnp::ones({4, 4})}), doctest::Contains("float32"),
                       DTypeError);
  CHECK_THROWS_WITH_AS(nn::dot_product_attention(q, q, q, {.bias = jnp::zeros({3, 4})}), doctest::Contains("(3, 4)"),
                       ShapeError);
  // rms_norm gain of the wrong size.
  CHECK_THROWS_WITH_AS(nn::rms_norm(jnp::zeros({2, 4}), jnp::ones({3})), doctest::Contains("(3,)"), ShapeError);
  // Initializers: fans of a 1-D shape, bad mode / distribution, integer dtype.
  Array key = random::key(0);
  CHECK_THROWS_WITH_AS(nn::initializers::he_normal()(key, {5}, f32), doctest::Contains("(5,)"), ShapeError);
  CHECK_THROWS_WITH_AS(nn::initializers::variance_scaling(1.0, "fan_sideways", "normal"),
                       doctest::Contains("fan_sideways"), ValueError);
  CHECK_THROWS_WITH_AS(nn::initializers::variance_scaling(1.0, "fan_in", "cauchy"), doctest::Contains("cauchy"),
                       ValueError);
  CHECK_THROWS_WITH_AS(nn::initializers::glorot_normal()(key, {4, 4}, i32), doctest::Contains("int32"), DTypeError);
  // softmax over an axis the array does not have.
  CHECK_THROWS_AS(nn::softmax(jnp::zeros({2, 3}), 5), ValueError);
}
