// Shape primitives, reductions, gathers and scatters, and whole training steps (an MLP, the
// transformer sample's) and flash attention's kernels on the GPU, against the CPU.
#include <cjax/cjax.h>
#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <tuple>

#include "core/lax/attention.h"
#include "cuda_test_util.h"
#include "transformer/transformer.h"

using namespace cjax;
using namespace cuda_test;
namespace jnp = cjax::numpy;

namespace {
Array random_array(Shape s, DType d, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<double> v(static_cast<size_t>(shape_size(s)));
  for (double& x : v) x = normal(rng);
  return jnp::array(v).astype(d).reshape(s);
}
void check_same(const Array& want, const Array& got, double tol) {
  REQUIRE(device_of(got) == kGpu);
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  std::vector<double> w = want.astype(f64).to_vector<double>(), g = got.astype(f64).to_vector<double>();
  int bad = 0;
  for (size_t i = 0; i < w.size(); ++i)
    if (!close(w[i], g[i], tol, tol) && bad++ < 3) MESSAGE("[" << i << "]: cpu " << w[i] << " gpu " << g[i]);
  CHECK(bad == 0);
}
}  // namespace

TEST_CASE("shape primitives copy on the GPU: broadcast, transpose, slice, rev, concatenate, views") {
  int64_t before = profiler::host_fallback_count();
  for (DType d : {f32, bf16, i32, bool_, f64, u8}) {
    CAPTURE(dtype_name(d));
    Array x = random_array({3, 4, 5}, f32, 1).astype(d);
    Array g = on_gpu(x);
    check_same(lax::broadcast_in_dim(x, {2, 3, 4, 5}, {1, 2, 3}), lax::broadcast_in_dim(g, {2, 3, 4, 5}, {1, 2, 3}), 0);
    check_same(lax::broadcast_in_dim(x, {3, 6, 4, 5}, {0, 2, 3}), lax::broadcast_in_dim(g, {3, 6, 4, 5}, {0, 2, 3}), 0);
    check_same(lax::transpose(x, {2, 0, 1}), lax::transpose(g, {2, 0, 1}), 0);
    check_same(lax::slice(x, {1, 0, 1}, {3, 4, 5}, std::vector<int64_t>{1, 2, 3}),
               lax::slice(g, {1, 0, 1}, {3, 4, 5}, std::vector<int64_t>{1, 2, 3}), 0);
    check_same(lax::rev(x, {0, 2}), lax::rev(g, {0, 2}), 0);
    Array y = lax::rev(x, {1});
    check_same(lax::concatenate({x, y}, 1), lax::concatenate({g, lax::rev(g, {1})}, 1), 0);
    check_same(x.reshape({20, 3}), g.reshape({20, 3}), 0);
    check_same(jnp::squeeze(x.reshape({1, 60})), jnp::squeeze(g.reshape({1, 60})), 0);
  }
  CHECK(profiler::host_fallback_count() == before);
}

TEST_CASE("reductions over any axes on the GPU") {
  int64_t before = profiler::host_fallback_count();
  struct Case {
    Shape shape;
    std::vector<int64_t> axes;
  };
  const Case cases[] = {{{37, 1000}, {1}}, {{37, 1000}, {0}}, {{37, 1000}, {0, 1}}, {{4, 5, 6}, {0, 2}},
                        {{3, 1}, {1}},     {{0, 5}, {0}},     {{2, 3}, {}}};
  for (const Case& c : cases)
    for (DType d : {f32, bf16, i32, f64}) {
      CAPTURE(shape_str(c.shape));
      CAPTURE(dtype_name(d));
      Array x = random_array(c.shape, f32, 3).astype(d);
      if (d == i32) x = (random_array(c.shape, f32, 3) * 10.0f).astype(i32);
      Array g = on_gpu(x);
      double tol = d == f64 ? 1e-12 : d == f32 ? 1e-5 : d == bf16 ? 2e-2 : 0;
      check_same(lax::reduce_sum(x, c.axes), lax::reduce_sum(g, c.axes), tol);
      check_same(lax::reduce_max(x, c.axes), lax::reduce_max(g, c.axes), 0);
      check_same(lax::reduce_min(x, c.axes), lax::reduce_min(g, c.axes), 0);
      if (d != i32)
        check_same(lax::reduce_prod(x * 0.1f + 1.0f, c.axes), lax::reduce_prod(g * 0.1f + 1.0f, c.axes), tol);
    }
  Array b = random_array({6, 7}, f32, 5) > 0.0f;
  check_same(lax::reduce_and(b, {1}), lax::reduce_and(on_gpu(b), {1}), 0);
  check_same(lax::reduce_or(b, {0}), lax::reduce_or(on_gpu(b), {0}), 0);
  // NaN propagates through max, as on the CPU.
  Array n = jnp::array<float>({1.0f, NAN, 3.0f});
  CHECK(std::isnan(lax::reduce_max(on_gpu(n), {0}).item<float>()));
  CHECK(profiler::host_fallback_count() == before);
  // Deterministic: the same reduction twice gives the same bits.
  Array big = on_gpu(random_array({1 << 20}, f32, 9));
  CHECK(jnp::sum(big).item<float>() == jnp::sum(big).item<float>());
}

TEST_CASE("an MLP training step runs on the GPU with the CPU's loss and gradients") {
  auto loss = [](const std::vector<Array>& p, const Array& x, const Array& y) {
    Array h = jnp::tanh(jnp::matmul(x, p[0]) + p[1]);
    Array out = jnp::matmul(h, p[2]) + p[3];
    return jnp::mean(jnp::square(out - y));
  };
  std::vector<Array> params = {random_array({16, 32}, f32, 1) * 0.3f, jnp::zeros({32}),
                               random_array({32, 4}, f32, 2) * 0.3f, jnp::zeros({4})};
  Array x = random_array({64, 16}, f32, 3), y = random_array({64, 4}, f32, 4);
  std::vector<Array> gparams;
  for (const Array& p : params) gparams.push_back(on_gpu(p));
  Array gx = on_gpu(x), gy = on_gpu(y);
  auto step = [&](std::vector<Array>& ps, const Array& xs, const Array& ys) {
    auto [l, grads] = value_and_grad(loss)(ps, xs, ys);
    for (size_t i = 0; i < ps.size(); ++i) ps[i] = ps[i] - 0.1f * grads[i];
    return l;
  };
  int64_t before = profiler::host_fallback_count();
  for (int i = 0; i < 5; ++i) {
    float want = step(params, x, y).item<float>();
    float got = step(gparams, gx, gy).item<float>();
    CHECK(got == doctest::Approx(want).epsilon(1e-5));
  }
  for (size_t i = 0; i < params.size(); ++i) check_same(params[i], gparams[i], 1e-4);
  MESSAGE("host fallbacks in 5 GPU training steps: " << profiler::host_fallback_count() - before);
  CHECK(profiler::host_fallback_count() - before == 0);
}

TEST_CASE("select_n, integer_pow and stop_gradient on the GPU") {
  int64_t before = profiler::host_fallback_count();
  for (DType d : {f32, bf16, i32, f64}) {
    CAPTURE(dtype_name(d));
    Array a = random_array({5, 7}, f32, 21).astype(d), b = random_array({5, 7}, f32, 22).astype(d);
    Array pred = random_array({5, 7}, f32, 23) > 0.0f;
    check_same(lax::select_n(pred, {a, b}), lax::select_n(on_gpu(pred), {on_gpu(a), on_gpu(b)}), 0);
    Array which = (random_array({5, 7}, f32, 24) * 2.0f).astype(i32);  // -5..5: clamped
    check_same(lax::select_n(which, {a, b, a * 2}), lax::select_n(on_gpu(which), {on_gpu(a), on_gpu(b), on_gpu(a) * 2}),
               0);
    for (int y : {0, 1, 2, 3, 7})
      check_same(lax::integer_pow(a, y), lax::integer_pow(on_gpu(a), y), d == bf16 ? 1e-2 : 1e-6);
    if (d != i32) check_same(lax::integer_pow(a, -2), lax::integer_pow(on_gpu(a), -2), d == bf16 ? 1e-2 : 1e-6);
    check_same(lax::stop_gradient(a), lax::stop_gradient(on_gpu(a)), 0);
  }
  CHECK(profiler::host_fallback_count() == before);
}

TEST_CASE("random bits on the GPU are bit-exact with the CPU (threefry2x32); normals agree to float rounding") {
  int64_t before = profiler::host_fallback_count();
  Array k = random::key(42);
  Array kg = on_gpu(k);
  Array u = random::uniform(k, {1000}), ug = random::uniform(kg, {1000});
  CHECK(device_of(ug) == kGpu);
  CHECK(ug.to_vector<float>() == u.to_vector<float>());
  auto second = [](const Array& keys) { return lax::slice(keys, {1, 0}, {2, 2}).reshape({2}); };
  Array n = random::normal(second(random::split(k, 3)), {3, 17});
  Array ng = random::normal(second(random::split(kg, 3)), {3, 17});
  // normal maps the same bits through erf_inv, whose GPU (libdevice) and CPU versions differ in
  // the last bits.
  std::vector<float> nv = n.to_vector<float>(), ngv = ng.to_vector<float>();
  for (size_t i = 0; i < nv.size(); ++i) CHECK(close(ngv[i], nv[i], 2e-6, 1e-6));
  CHECK(profiler::host_fallback_count() == before);
}

TEST_CASE("gather on the GPU: take, x[idx], embedding lookups, every mode") {
  int64_t before = profiler::host_fallback_count();
  for (DType d : {f32, bf16, i32, f64}) {
    CAPTURE(dtype_name(d));
    Array table = random_array({50, 8}, f32, 31).astype(d);
    Array ids = jnp::array<int32_t>({0, 3, 49, 7, -1, 50, 3}, {7});  // two out of bounds
    Array g = on_gpu(table), gi = on_gpu(ids);
    for (const char* mode : {"clip", "fill", "wrap"}) {
      CAPTURE(mode);
      check_same(jnp::take(table, ids, 0, mode), jnp::take(g, gi, 0, mode), 0);
    }
    Array rows = jnp::array<int32_t>({1, 2, 1, 0}, {2, 2});  // a batch of 2x2 row ids
    check_same(jnp::take(table, rows, 0), jnp::take(g, on_gpu(rows), 0), 0);
    // Along axis 1 the batch dims do not lead the output: a counted host fallback for now.
    int64_t fallbacks = profiler::host_fallback_count();
    check_same(jnp::take(table, ids, 1, "clip"), jnp::take(g, gi, 1, "clip"), 0);
    CHECK(profiler::host_fallback_count() == fallbacks + 1);
  }
  Array x = random_array({6, 5}, f32, 33);
  check_same(x[2], on_gpu(x)[2], 0);
  CHECK(profiler::host_fallback_count() == before + 4);  // the four axis-1 takes above
}

TEST_CASE("pad and scatters on the GPU: repeated indices add in the CPU's order, out-of-range ones drop or clip") {
  int64_t before = profiler::host_fallback_count();
  Array x = random_array({3, 5}, f32, 21);
  Array v = jnp::full({}, 2.5f);
  std::vector<lax::PadConfig> cfg = {{1, 2, 1}, {0, 3, 0}};
  check_same(lax::pad(x, v, cfg), lax::pad(on_gpu(x), v, cfg), 0);
  check_same(jnp::pad(x, 2), jnp::pad(on_gpu(x), 2), 0);
  // Embedding-style gradient: rows of `table` get the updates of every matching index, in order.
  Array table = random_array({10, 6}, f32, 22);
  Array idx = jnp::array<int32_t>({3, 1, 3, 9, 3, 0, 1, 12, -1});
  Array upd = random_array({9, 6}, f32, 23);
  Array want = table.at(idx).add(upd), got = on_gpu(table).at(on_gpu(idx)).add(on_gpu(upd));
  REQUIRE(device_of(got) == kGpu);
  CHECK(got.to_vector<float>() == want.to_vector<float>());  // same order of additions: bitwise equal
  check_same(table.at(idx).set(upd), on_gpu(table).at(on_gpu(idx)).set(on_gpu(upd)), 0);
  check_same(table.at(idx).multiply(upd), on_gpu(table).at(on_gpu(idx)).multiply(on_gpu(upd)), 1e-6);
  Array b = random_array({10}, f32, 24).astype(bf16);
  Array ub = random_array({9}, f32, 25).astype(bf16);
  check_same(b.at(idx).add(ub), on_gpu(b).at(on_gpu(idx)).add(on_gpu(ub)), 0);
  lax::ScatterDimensionNumbers dn{{1}, {0}, {0}, {}, {}};
  Array clipped = lax::scatter_add(table, idx.reshape({9, 1}), upd, dn, lax::GatherScatterMode::clip);
  check_same(clipped,
             lax::scatter_add(on_gpu(table), on_gpu(idx.reshape({9, 1})), on_gpu(upd), dn,
                              lax::GatherScatterMode::clip),
             0);
  CHECK(profiler::host_fallback_count() - before == 0);
}

TEST_CASE("the transformer sample's training step runs on the GPU with no host fallback and the CPU's loss") {
  transformer::Config c;
  c.layout = transformer::Layout::Single;
  c.n_layers = 1;
  c.batch = 4;
  c.seq_len = 16;
  transformer::TrainState s = transformer::init_state(c);
  std::vector<int32_t> host(size_t(c.batch * (c.seq_len + 1)));
  for (size_t i = 0; i < host.size(); ++i) host[i] = int32_t((i * 37 + 11) % 256);
  Array tokens = jnp::array(host).reshape({c.batch, c.seq_len + 1});
  auto loss_and_grad = [&](const transformer::Params& p, const Array& t) {
    return value_and_grad([&](const transformer::Params& q) { return transformer::loss_fn(c, q, t); })(p);
  };
  auto [want_loss, want_grad] = loss_and_grad(s.params, tokens);
  transformer::Params gp = device_put(s.params, SingleDeviceSharding(kGpu));
  int64_t before = profiler::host_fallback_count();
  auto [got_loss, got_grad] = loss_and_grad(gp, on_gpu(tokens));
  CHECK(profiler::host_fallback_count() - before == 0);
  CHECK(got_loss.item<float>() == doctest::Approx(want_loss.item<float>()).epsilon(1e-5));
  check_same(want_grad.embed, got_grad.embed, 1e-4);
  check_same(want_grad.out_kernel, got_grad.out_kernel, 1e-4);
  // The same step under jit, as the sample runs it.
  auto jitted = jit(loss_and_grad);
  before = profiler::host_fallback_count();
  auto [jit_loss, jit_grad] = jitted(gp, on_gpu(tokens));
  CHECK(profiler::host_fallback_count() - before == 0);
  CHECK(jit_loss.item<float>() == doctest::Approx(want_loss.item<float>()).epsilon(1e-5));
  check_same(want_grad.layers[0].mlp_in, jit_grad.layers[0].mlp_in, 1e-4);
}

TEST_CASE("flash attention on the GPU: its fused kernels match the CPU's, bitwise run to run; wider heads too") {
  // Two query blocks with a tail, 2 query heads per key head, more keys than queries; the widest
  // head the fused kernels take and one wider (the composite of GPU kernels).
  for (auto [d, head, causal] : {std::tuple{f32, int64_t(16), true}, std::tuple{bf16, int64_t(32), false},
                                 std::tuple{f16, int64_t(8), true}, std::tuple{f32, int64_t(48), true}}) {
    CAPTURE(dtype_name(d));
    CAPTURE(head);
    CAPTURE(causal);
    const int64_t B = 2, T = 70, S = 75, N = 4, K = 2;
    Array q = random_array({B, T, N, head}, d, 1), k = random_array({B, S, K, head}, d, 2),
          v = random_array({B, S, K, head}, d, 3), dout = random_array({B, T, N, head}, d, 4);
    const attention::Options o{1.0 / std::sqrt(double(head)), causal};
    std::vector<Array> want = attention::forward(q, k, v, o);
    std::vector<Array> want_grad = attention::backward(q, k, v, want[0], want[1], dout, o);
    int64_t before = profiler::host_fallback_count();
    std::vector<Array> got = attention::forward(on_gpu(q), on_gpu(k), on_gpu(v), o);
    std::vector<Array> got_grad =
        attention::backward(on_gpu(q), on_gpu(k), on_gpu(v), on_gpu(want[0]), on_gpu(want[1]), on_gpu(dout), o);
    CHECK(profiler::host_fallback_count() - before == 0);
    const double tol = d == f32 ? 1e-5 : 1e-2;
    check_same(want[0], got[0], tol);
    check_same(want[1], got[1], 1e-5);
    for (int i = 0; i < 3; ++i) check_same(want_grad[size_t(i)], got_grad[size_t(i)], tol);
    std::vector<Array> again =
        attention::backward(on_gpu(q), on_gpu(k), on_gpu(v), on_gpu(want[0]), on_gpu(want[1]), on_gpu(dout), o);
    for (int i = 0; i < 3; ++i) CHECK(bool(jnp::all(jnp::equal(again[size_t(i)], got_grad[size_t(i)])).item<bool>()));
  }
}
