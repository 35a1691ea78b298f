// Fused attention (core/lax/attention.h): nn::dot_product_attention's fused path against its
// unfused one (implementation = xla) in values, gradients, forward mode, vmap, second order and
// jit; the fused kernels against the composites directly; what the jaxpr of a training step holds.
#include <doctest/doctest.h>

#include <array>
#include <cmath>

#include "cjax/cjax.h"
#include "core/lax/attention.h"
#include "test_util.h"

using namespace cjax;
namespace jnp = cjax::numpy;

namespace {

using Impl = nn::AttentionImplementation;

// max |a - b| / max |b|: the error relative to the values' scale.
double rel_err(const Array& a, const Array& b) {
  REQUIRE(a.shape() == b.shape());
  auto x = a.astype(f64).to_vector<double>(), y = b.astype(f64).to_vector<double>();
  double diff = 0, scale = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    diff = std::max(diff, std::abs(x[i] - y[i]));
    scale = std::max(scale, std::abs(y[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

struct Qkv {
  Array q, k, v;
};
// q [B,T,N,H], k and v [B,S,K,H], normal values.
Qkv make_qkv(int64_t B, int64_t T, int64_t S, int64_t N, int64_t K, int64_t H, DType dt = f32, uint64_t seed = 0) {
  auto keys = random::split(random::key(seed), 3);
  return {random::normal(keys[0], {B, T, N, H}, dt), random::normal(keys[1], {B, S, K, H}, dt),
          random::normal(keys[2], {B, S, K, H}, dt)};
}

Array attend(const Qkv& x, bool causal, Impl impl) {
  return nn::dot_product_attention(x.q, x.k, x.v, {.is_causal = causal, .implementation = impl});
}

}  // namespace

TEST_CASE("fused attention matches the unfused path: causal and not, query blocks, odd widths, grouped heads") {
  struct Case {
    int64_t B, T, S, N, K, H;
  };
  // T = 70 crosses a 64-row query block; H = 20, 17 and 3 leave vector tails; S > T and S < T with
  // a causal mask cut key blocks at the diagonal; N = 6 over K = 2 is grouped-query attention. On
  // AVX-512 builds H = 16 and 3 run the 8-lane kernels, H = 17 and 20 the 16-lane ones.
  for (Case c : {Case{2, 70, 70, 4, 4, 20}, Case{1, 5, 130, 6, 2, 16}, Case{3, 129, 40, 2, 1, 3},
                 Case{2, 64, 64, 8, 8, 16}, Case{1, 65, 65, 2, 2, 17}}) {
    for (bool causal : {false, true}) {
      CAPTURE(c.T);
      CAPTURE(c.S);
      CAPTURE(causal);
      Qkv x = make_qkv(c.B, c.T, c.S, c.N, c.K, c.H);
      Array fused = attend(x, causal, Impl::fused), unfused = attend(x, causal, Impl::xla);
      CHECK(rel_err(fused, unfused) < 1e-5);
      CHECK(rel_err(attend(x, causal, Impl::automatic), unfused) < 1e-5);
    }
  }
}

TEST_CASE("fused attention: the kernels against the composites, lse and the first rows") {
  Qkv x = make_qkv(2, 67, 67, 4, 2, 8);
  attention::Options o{.scale = 0.3, .is_causal = true};
  auto fused = attention::forward(x.q, x.k, x.v, o);
  auto ref = attention::composite_forward(x.q, x.k, x.v, o);
  CHECK(rel_err(fused[0], ref[0]) < 1e-5);
  CHECK(rel_err(fused[1], ref[1]) < 1e-6);
  // Causal row t = 0 sees key 0 only: its output is v[:, 0] and its lse is the scaled logit.
  Array o0 = fused[0][0][0][0], v0 = x.v[0][0][0];
  CHECK(rel_err(o0, v0) < 1e-6);
  double logit = jnp::sum(x.q[0][0][0] * x.k[0][0][0]).item<float>() * 0.3;
  CHECK(fused[1][0][0][0].item<float>() == doctest::Approx(logit).epsilon(1e-5));

  Array dout = random::normal(random::key(7), x.q.shape());
  auto grads = attention::backward(x.q, x.k, x.v, fused[0], fused[1], dout, o);
  auto want = attention::composite_backward(x.q, x.k, x.v, ref[0], ref[1], dout, o);
  for (int i = 0; i < 3; ++i) CHECK(rel_err(grads[size_t(i)], want[size_t(i)]) < 1e-5);
  // Deterministic: the same bits again.
  auto again = attention::backward(x.q, x.k, x.v, fused[0], fused[1], dout, o);
  for (int i = 0; i < 3; ++i) CHECK(testing::vec<float>(again[size_t(i)]) == testing::vec<float>(grads[size_t(i)]));
}

TEST_CASE("fused attention: bfloat16 and float16 compute in f32 and round once") {
  Qkv x32 = make_qkv(2, 40, 40, 4, 4, 16);
  for (DType dt : {bf16, f16}) {
    Qkv x{x32.q.astype(dt), x32.k.astype(dt), x32.v.astype(dt)};
    Array fused = attend(x, true, Impl::fused);
    CHECK(fused.dtype() == dt);
    // The f32 attention of the same (rounded) inputs, rounded once: within one rounding.
    Qkv widened{x.q.astype(f32), x.k.astype(f32), x.v.astype(f32)};
    Array want = attend(widened, true, Impl::xla);
    CHECK(rel_err(fused, want) < (dt == bf16 ? 8e-3 : 1e-3));
    CHECK(rel_err(fused, attend(x, true, Impl::xla)) < (dt == bf16 ? 2e-2 : 2e-3));
  }
}

TEST_CASE("fused attention: gradients, forward mode and second order equal the unfused path's") {
  Qkv x = make_qkv(2, 33, 33, 4, 2, 8, f32, 3);
  Array w = random::normal(random::key(11), x.q.shape());
  auto loss = [&](Impl impl) {
    return [impl, w](const Array& q, const Array& k, const Array& v) {
      return jnp::sum(nn::dot_product_attention(q, k, v, {.is_causal = true, .implementation = impl}) * w);
    };
  };
  auto gf = grad(loss(Impl::fused), argnums<0, 1, 2>)(x.q, x.k, x.v);
  auto gu = grad(loss(Impl::xla), argnums<0, 1, 2>)(x.q, x.k, x.v);
  CHECK(rel_err(std::get<0>(gf), std::get<0>(gu)) < 1e-5);
  CHECK(rel_err(std::get<1>(gf), std::get<1>(gu)) < 1e-5);
  CHECK(rel_err(std::get<2>(gf), std::get<2>(gu)) < 1e-5);
  // The same under jit.
  auto gj = jit(grad(loss(Impl::fused), argnums<0, 1, 2>))(x.q, x.k, x.v);
  CHECK(rel_err(std::get<1>(gj), std::get<1>(gu)) < 1e-5);

  // Forward mode: one tangent per input.
  Qkv t = make_qkv(2, 33, 33, 4, 2, 8, f32, 5);
  auto jf = jvp(loss(Impl::fused), std::tuple{x.q, x.k, x.v}, std::tuple{t.q, t.k, t.v});
  auto ju = jvp(loss(Impl::xla), std::tuple{x.q, x.k, x.v}, std::tuple{t.q, t.k, t.v});
  CHECK(jf.second.item<float>() == doctest::Approx(ju.second.item<float>()).epsilon(1e-4));

  // Second order: the gradient of a function of the gradient (through the backward primitive's
  // own derivative).
  auto outer = [&](Impl impl) {
    return [impl, loss](const Array& q, const Array& k, const Array& v) {
      Array dq = grad(loss(impl))(q, k, v);
      return jnp::sum(dq * dq);
    };
  };
  Array hf = grad(outer(Impl::fused), argnums<1>)(x.q, x.k, x.v);
  Array hu = grad(outer(Impl::xla), argnums<1>)(x.q, x.k, x.v);
  CHECK(rel_err(hf, hu) < 1e-4);
}

TEST_CASE("fused attention gradients where a task holds several key heads, and for keys no query reads") {
  // With batches enough for every thread, a task stages all key heads of a batch entry at once
  // (and, causal with S > T, writes zero gradients for the keys past the last query).
  for (auto [B, T, S, N, K] : {std::array<int64_t, 5>{16, 64, 64, 4, 2}, std::array<int64_t, 5>{8, 5, 130, 6, 2}}) {
    CAPTURE(S);
    Qkv x = make_qkv(B, T, S, N, K, 16);
    Array w = random::normal(random::key(12), x.q.shape());
    auto loss = [&](Impl impl) {
      return [impl, w](const Array& q, const Array& k, const Array& v) {
        return jnp::sum(nn::dot_product_attention(q, k, v, {.is_causal = true, .implementation = impl}) * w);
      };
    };
    auto gf = jit(grad(loss(Impl::fused), argnums<0, 1, 2>))(x.q, x.k, x.v);
    auto gu = grad(loss(Impl::xla), argnums<0, 1, 2>)(x.q, x.k, x.v);
    CHECK(rel_err(std::get<0>(gf), std::get<0>(gu)) < 1e-5);
    CHECK(rel_err(std::get<1>(gf), std::get<1>(gu)) < 1e-5);
    CHECK(rel_err(std::get<2>(gf), std::get<2>(gu)) < 1e-5);
    if (S > T)  // keys after the last query get no gradient
      CHECK(jnp::max(jnp::abs(lax::slice(std::get<1>(gf), {0, T, 0, 0}, {B, S, K, 16}))).item<float>() == 0.0f);
  }
}

TEST_CASE("fused attention under vmap folds the mapped axis into the batch") {
  Qkv x = make_qkv(3, 9, 9, 2, 2, 4);
  Array k0 = x.k[0];
  auto f = [](const Array& q, const Array& k, const Array& v) {
    return nn::dot_product_attention(q, k, v, {.is_causal = true, .implementation = Impl::fused});
  };
  // q and v mapped over axis 1 and 0, k shared: equals the unfused attention of each example.
  Array qs = jnp::moveaxis(x.q, 0, 1);
  Array got = vmap(f, {1, None, 0})(qs, k0, x.v);
  for (int64_t i = 0; i < 3; ++i) {
    Array want = nn::dot_product_attention(x.q[i], k0, x.v[i], {.is_causal = true, .implementation = Impl::xla});
    CHECK(rel_err(got[i], want) < 1e-5);
  }
}

TEST_CASE("a training step's jaxpr runs attention as the fused forward and backward primitives") {
  Qkv x = make_qkv(2, 16, 16, 2, 2, 8);
  auto loss = [](const Array& q, const Array& k, const Array& v) {
    return jnp::sum(
        jnp::square(nn::dot_product_attention(q, k, v, {.is_causal = true, .implementation = Impl::fused})));
  };
  std::string j = testing::text(make_jaxpr(grad(loss, argnums<0, 1, 2>))(x.q, x.k, x.v));
  INFO(j);
  CHECK(j.find("= flash_attention[\n      is_causal=True") != std::string::npos);
  CHECK(j.find("flash_attention_backward[") != std::string::npos);
  CHECK(j.find("2,2,16,16") == std::string::npos);  // no [B, N, T, S] logits
  CHECK(j.find("exp ") == std::string::npos);
}

TEST_CASE("fused attention: what it does not take is named") {
  Qkv x = make_qkv(1, 4, 4, 2, 2, 3);
  CHECK_ERR(nn::dot_product_attention(x.q, x.k, x.v,
                                      {.mask = jnp::ones({1, 1, 4, 4}, DType::bool_), .implementation = Impl::fused}),
            ValueError, "implementation=fused does not take a mask", "automatic or xla");
  CHECK_ERR(attend(Qkv{x.q.astype(f64), x.k.astype(f64), x.v.astype(f64)}, false, Impl::fused), ValueError,
            "dtype float64");
  // automatic takes the unfused path for them, with the same values as xla.
  Qkv x64{x.q.astype(f64), x.k.astype(f64), x.v.astype(f64)};
  CHECK(rel_err(attend(x64, true, Impl::automatic), attend(x64, true, Impl::xla)) == 0);
  CHECK_ERR(attention::forward(x.q.astype(f64), x.k.astype(f64), x.v.astype(f64), {}), DTypeError, "flash_attention",
            "float64");
}

TEST_CASE("jit rewrites softmax attention written by hand into the fused kernel (forward programs)") {
  Array q = random::normal(random::key(1), {2, 32, 4, 16}), k = random::normal(random::key(2), {2, 32, 4, 16}),
        v = random::normal(random::key(3), {2, 32, 4, 16});
  auto causal = [](const Array& a, const Array& b, const Array& c) {  // [B, T, N, H], mask as where(tril, x, -1e30)
    Array logits = jnp::einsum("btnh,bsnh->bnts", a, b) * 0.25f;
    Array keep = jnp::tril(jnp::ones({32, 32}, DType::bool_));
    return jnp::einsum("bnts,bsnh->btnh", nn::softmax(jnp::where(keep, logits, -1e30f), -1), c);
  };
  auto heads_first = [](const Array& a, const Array& b, const Array& c) {  // [B, N, T, H], no mask, / sqrt(H)
    Array p = nn::softmax(jnp::einsum("bnth,bnsh->bnts", a, b) / 4.0f, -1);
    return jnp::einsum("bnts,bnsh->bnth", p, c);
  };
  auto fused_in = [](auto& jitted, auto&&... args) {
    return jitted.lower(args...).compile().as_text().find("flash_attention") != std::string::npos;
  };
  SUBCASE("causal, [B, T, N, H]: the kernel, the values of the unfused program") {
    auto f = jit(causal);
    CHECK(fused_in(f, q, k, v));
    testing::check_all_close(f(q, k, v), causal(q, k, v), 1e-5);
    testing::check_all_close(f(q, k, v), nn::dot_product_attention(q, k, v, {.is_causal = true, .scale = 0.25}), 1e-5);
  }
  SUBCASE("not causal, heads before the sequence: transposed in and out") {
    Array qt = jnp::transpose(q, {0, 2, 1, 3}), kt = jnp::transpose(k, {0, 2, 1, 3}),
          vt = jnp::transpose(v, {0, 2, 1, 3});
    auto f = jit(heads_first);
    CHECK(fused_in(f, qt, kt, vt));
    testing::check_all_close(f(qt, kt, vt), heads_first(qt, kt, vt), 1e-5);
  }
  SUBCASE("left alone: a mask that is not causal, and the forward of a gradient (its values are residuals)") {
    auto banded = [](const Array& a, const Array& b, const Array& c) {
      Array logits = jnp::einsum("btnh,bsnh->bnts", a, b);
      Array keep = jnp::tril(jnp::triu(jnp::ones({32, 32}, DType::bool_), -4));
      return jnp::einsum("bnts,bsnh->btnh", nn::softmax(jnp::where(keep, logits, -1e30f), -1), c);
    };
    auto f = jit(banded);
    CHECK_FALSE(fused_in(f, q, k, v));
    testing::check_all_close(f(q, k, v), banded(q, k, v), 1e-5);
    auto loss = [&](const Array& a) { return jnp::sum(causal(a, k, v)); };
    auto g = jit(grad(loss));
    CHECK_FALSE(fused_in(g, q));
    testing::check_all_close(g(q), grad(loss)(q), 1e-4);
  }
}

// ---- packed q, k and v (jit's pack_attention; core/lax/attention.h) ----

namespace {

// x's pieces [starts[i], limits[i]) along `axis` as q [B,T,N,H] and k, v [B,T,K,H].
attention::Packing packing(int64_t axis, std::vector<int64_t> starts, std::vector<int64_t> limits, Shape q, Shape kv) {
  return attention::Packing{axis, std::move(starts), std::move(limits), std::move(q), std::move(kv)};
}

}  // namespace

TEST_CASE("packed attention reads q, k and v in x's rows and writes dx whole: the unpacked kernels' bits") {
  struct Case {
    const char* what;
    Shape x;
    attention::Packing k;
    DType dtype;
  };
  for (const Case& c :
       {// A fused projection's [B, T, 3, N, H], split on axis 2; T = 70 crosses a query block, H = 20 a vector.
        Case{"[B,T,3,N,H]", {2, 70, 3, 4, 20}, packing(2, {0, 1, 2}, {1, 2, 3}, {2, 70, 4, 20}, {2, 70, 4, 20}), f32},
        // [B T, (N + 2K) H] with grouped heads and the ranges in the order v, q, k.
        Case{"[B*T,C] v,q,k", {99, 160}, packing(1, {32, 128, 0}, {128, 160, 32}, {3, 33, 6, 16}, {3, 33, 2, 16}), f32},
        Case{"bf16", {2, 16, 3, 2, 8}, packing(2, {0, 1, 2}, {1, 2, 3}, {2, 16, 2, 8}, {2, 16, 2, 8}), bf16}}) {
    for (bool causal : {false, true}) {
      CAPTURE(c.what);
      CAPTURE(causal);
      Array x = random::normal(random::key(21), c.x, c.dtype);
      attention::Options o{.scale = 0.3, .is_causal = causal};
      std::vector<Array> qkv = attention::unpack(x, c.k);
      std::vector<Array> want = attention::forward(qkv[0], qkv[1], qkv[2], o);
      std::vector<Array> got = attention::forward_packed(x, o, c.k);
      CHECK(rel_err(got[0], want[0]) == 0);
      CHECK(rel_err(got[1], want[1]) == 0);
      Array dout = random::normal(random::key(22), c.k.q_shape, c.dtype);
      Array dx = attention::backward_packed(x, want[0], want[1], dout, o, c.k);
      Array dx_want = attention::expand_backward_packed(x, want[0], want[1], dout, o, c.k);
      CHECK(rel_err(dx, dx_want) == 0);
      // and the unfused reference
      std::vector<Array> g = attention::composite_backward(qkv[0], qkv[1], qkv[2], want[0], want[1], dout, o);
      std::vector<Array> dpieces = attention::unpack(dx, c.k);
      for (size_t i = 0; i < 3; ++i) CHECK(rel_err(dpieces[i], g[i]) < (c.dtype == f32 ? 1e-5 : 1e-2));
    }
  }
}

TEST_CASE("packed attention: forward mode, vmap, and the packings it refuses") {
  attention::Packing k = packing(2, {0, 1, 2}, {1, 2, 3}, {2, 9, 2, 8}, {2, 9, 2, 8});
  attention::Options o{.scale = 0.5, .is_causal = true};
  Array x = random::normal(random::key(23), {2, 9, 3, 2, 8}), t = random::normal(random::key(24), {2, 9, 3, 2, 8});
  auto packed = [&](const Array& a) { return attention::forward_packed(a, o, k)[0]; };
  auto unpacked = [&](const Array& a) { return attention::expand_forward_packed(a, o, k)[0]; };
  auto jp = jvp(packed, std::tuple{x}, std::tuple{t});
  auto ju = jvp(unpacked, std::tuple{x}, std::tuple{t});
  CHECK(rel_err(jp.first, ju.first) == 0);
  CHECK(rel_err(jp.second, ju.second) < 1e-5);
  // Under vmap the mapped axis becomes more rows of x (B grows by the batch size).
  Array xs = jnp::stack({x, t}, 1);
  Array got = vmap(packed, {1})(xs);
  CHECK(rel_err(got[0], packed(x)) == 0);
  CHECK(rel_err(got[1], packed(t)) == 0);

  // Ranges that are not whole rows' columns, and (backward) ranges that leave part of x unwritten.
  CHECK_ERR(attention::forward_packed(x, o, packing(3, {0, 1, 0}, {1, 2, 2}, {2, 9, 2, 8}, {2, 9, 2, 8})), ShapeError,
            "flash_attention_packed", "B x T rows");
  Array wide = random::normal(random::key(25), {2, 9, 4, 2, 8});
  attention::Packing gap = packing(2, {0, 1, 3}, {1, 2, 4}, {2, 9, 2, 8}, {2, 9, 2, 8});
  std::vector<Array> fwd = attention::forward_packed(wide, o, gap);  // the forward reads any three ranges
  CHECK_ERR(attention::backward_packed(wide, fwd[0], fwd[1], fwd[0], o, gap), ShapeError,
            "flash_attention_backward_packed", "tile the packed axis");
}

TEST_CASE(
    "jit runs attention over a fused q/k/v projection on the projection's rows: no slices, no "
    "concatenate" CJAX_JIT_ONLY) {
  const int64_t B = 4, T = 32, D = 32, N = 4, H = 8;
  Array x = random::normal(random::key(26), {B, T, D});
  Array w = random::normal(random::key(27), {D, 3 * N * H}) * 0.2f;
  Array w2 = random::normal(random::key(28), {D, 2 * N * H}) * 0.2f;
  auto attend_heads = [](const Array& q, const Array& k, const Array& v) {
    return nn::dot_product_attention(q, k, v, {.is_causal = true, .implementation = Impl::fused});
  };
  // Self-attention from one projection, split as [B, T, 3, N, H].
  auto self = [&](const Array& wqkv, const Array& xs) {
    Array qkv = jnp::matmul(xs, wqkv).reshape({B, T, 3, N, H});
    auto piece = [&](int64_t i) { return lax::slice_in_dim(qkv, i, i + 1, 1, 2).reshape({B, T, N, H}); };
    return jnp::sum(jnp::square(attend_heads(piece(0), piece(1), piece(2))));
  };
  // q from one projection, k and v from another: not one packed value.
  auto split = [&](const Array& wq, const Array& xs) {
    Array q = jnp::matmul(xs, lax::slice_in_dim(w, 0, N * H, 1, 1)).reshape({B, T, N, H});
    Array kv = jnp::matmul(xs, wq);
    Array k = lax::slice_in_dim(kv, 0, N * H, 1, 2).reshape({B, T, N, H});
    Array v = lax::slice_in_dim(kv, N * H, 2 * N * H, 1, 2).reshape({B, T, N, H});
    return jnp::sum(jnp::square(attend_heads(q, k, v)));
  };
  auto text_of = [](auto& jitted, auto&&... args) { return jitted.lower(args...).compile().as_text(); };

  auto g = jit(grad(self, argnums<0, 1>));
  std::string program = text_of(g, w, x);
  INFO(program);
  CHECK(program.find("flash_attention_packed[") != std::string::npos);
  CHECK(program.find("flash_attention_backward_packed[") != std::string::npos);
  CHECK(program.find("concatenate") == std::string::npos);
  CHECK(program.find(" slice[") == std::string::npos);
  auto got = g(w, x);
  auto want = grad(self, argnums<0, 1>)(w, x);  // eager: the unpacked primitives
  CHECK(rel_err(std::get<0>(got), std::get<0>(want)) < 1e-5);
  CHECK(rel_err(std::get<1>(got), std::get<1>(want)) < 1e-5);
  // The pass switched off: the same bits through three slices and a concatenate.
  setenv("CJAX_PACK_ATTENTION", "0", 1);
  auto g_off = jit(grad(self, argnums<0, 1>));
  std::string unpacked = text_of(g_off, w, x);
  auto off = g_off(w, x);
  unsetenv("CJAX_PACK_ATTENTION");
  CHECK(unpacked.find("flash_attention_packed") == std::string::npos);
  CHECK(unpacked.find("concatenate") != std::string::npos);
  CHECK(rel_err(std::get<0>(got), std::get<0>(off)) == 0);
  CHECK(rel_err(std::get<1>(got), std::get<1>(off)) == 0);

  auto gs = jit(grad(split));
  CHECK(text_of(gs, w2, x).find("_packed") == std::string::npos);
  CHECK(rel_err(gs(w2, x), grad(split)(w2, x)) < 1e-5);
}
