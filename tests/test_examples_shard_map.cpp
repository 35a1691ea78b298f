// docs/examples.md §1–4 asserted: the programs of samples/examples_shard_map.h (shared with the
// samples shard_map_basics and mlp_strategies) give the values their JAX originals give.
#include "../samples/examples_shard_map.h"
#include "test_util.h"

using namespace cjax;
using namespace cjax::examples;
using namespace cjax::testing;

TEST_CASE("§1 matmul_basic and matmul_reduce_scatter") {
  MatmulBasic m = matmul_basic();
  CHECK(m.a_block == Shape{2, 8});
  CHECK(m.b_block == Shape{8, 32});
  std::vector<float> want = jnp::dot(m.a, m.b).to_vector<float>();
  CHECK(m.c.to_vector<float>() == want);
  // The device kind follows the default platform (CJAX_PLATFORM=cuda runs this suite on GPU devices).
  std::string kind = config::default_platform() == "cuda" ? "GPU" : "CPU";
  CHECK(debug::visualize_array_sharding(m.c) == "┌─────────┐\n│ " + kind + " 0,1 │\n├─────────┤\n│ " + kind +
                                                    " 2,3 │\n├─────────┤\n│ " + kind + " 4,5 │\n├─────────┤\n│ " +
                                                    kind + " 6,7 │\n└─────────┘\n");
  Array rs = matmul_reduce_scatter(m.a, m.b);
  CHECK(rs.to_vector<float>() == want);
  CHECK(rs.sharding().str() == "NamedSharding(mesh=Mesh('i': 4, 'j': 2), spec=P('i', 'j'), memory_kind=device)");
}

TEST_CASE("§1 slicing and tiling") {
  Tiling t = slicing_and_tiling();
  CHECK(t.f1_block == Shape{3, 12});
  CHECK(t.f1_out == Shape{12, 24});
  CHECK(t.f2_block == Shape{3, 12});
  CHECK(t.f2_out == Shape{12, 24});
  std::vector<int> tiled = jnp::tile(jnp::arange(144).reshape({12, 12}), {1, 2}).to_vector<int>();
  CHECK(t.f1_y.to_vector<int>() == tiled);
  CHECK(t.f2_y.to_vector<int>() == tiled);
  CHECK(t.f3_out == Shape{12, 6});
  CHECK(t.f4_out == Shape{3, 12});
  CHECK(t.f5_out == Shape{3, 6});
  CHECK(tile_constant(P("i", "j")).to_vector<float>() == std::vector<float>(8, 3.f));
  CHECK(tile_constant(P("i", "j")).shape() == Shape{4, 2});
  CHECK(tile_constant(P("i", None)).shape() == Shape{4, 1});
  CHECK(tile_constant(P(None, None)).shape() == Shape{1, 1});
}

TEST_CASE("§2 collectives") {
  Array v = tutorial_vector();
  Mesh m = mesh_i4();
  CHECK(shard_map([](const Array& x) { return lax::psum(x, "i"); }, m, P("i"), P())(v).to_vector<float>() ==
        std::vector<float>{22, 20, 12, 17});
  Mesh m2 = make_mesh({2, 2}, {"i", "j"});
  Array x = arange_f(16).reshape({4, 4});
  CHECK(shard_map([](const Array& b) { return lax::psum(b, "i"); }, m2, P("i", "j"), P(None, "j"))(x)
            .to_vector<float>() == std::vector<float>{8, 10, 12, 14, 16, 18, 20, 22});
  CHECK(shard_map(
            [](const Array& b) {
              return lax::psum(b, {"i", "j"});
            },
            m2, P("i", "j"), P(None, None))(x)
            .to_vector<float>() == std::vector<float>{20, 24, 36, 40});
  Array g = jnp::array(std::vector<float>{3, 9, 5, 2});
  std::vector<float> rep;
  for (int k = 0; k < 4; ++k) rep.insert(rep.end(), {3, 9, 5, 2});
  CHECK(shard_map([](const Array& b) { return lax::all_gather(b, "i", {.tiled = true}); }, m, P("i"), P("i"))(g)
            .to_vector<float>() == rep);
  Array untiled = shard_map([](const Array& b) { return lax::all_gather(b, "i"); }, m, P("i"), P("i"))(g);
  CHECK(untiled.shape() == Shape{16, 1});
  CHECK(untiled.to_vector<float>() == rep);
  CHECK(shard_map([](const Array& b) { return lax::psum_scatter(b, "i", {.tiled = true}); }, m, P("i"), P("i"))(v)
            .to_vector<float>() == std::vector<float>{22, 20, 12, 17});
  CHECK(ring_psum_scatter(v).to_vector<float>() == std::vector<float>{22, 20, 12, 17});
  CHECK(shard_map(
            [](const Array& b) {
              return lax::ppermute(b, "i", {{0, 1}, {1, 2}, {2, 3}, {3, 0}});
            },
            m, P("i"), P("i"))(jnp::arange(8))
            .to_vector<int>() == std::vector<int>{6, 7, 0, 1, 2, 3, 4, 5});
  CHECK(shard_map([](const Array& b) { return lax::all_to_all(b, "i", 0, 0, {.tiled = true}); }, m, P("i"), P("i"))(v)
            .to_vector<float>() == std::vector<float>{3, 5, 5, 9, 1, 9, 3, 7, 4, 2, 5, 1, 1, 6, 8, 2});
}

TEST_CASE("§3 the six distributed matmuls, eager and under jit") {
  Array lhs = random::normal(random::key(1), {8, 8}), rhs = random::normal(random::key(2), {8, 4});
  Array want = jnp::dot(lhs, rhs);
  for (MatmulVariant var : kMatmulVariants) {
    CAPTURE(variant_name(var));
    check_all_close(distributed_matmul(var, lhs, rhs), want, 1e-3);
    check_all_close(jit([var](const Array& l, const Array& r) { return distributed_matmul(var, l, r); })(lhs, rhs),
                    want, 1e-3);
  }
}

TEST_CASE("§4 MLP strategies match the single-device loss and gradients") {
  auto [params, batch] = mlp_init();
  CHECK(params.size() == 6);
  CHECK(params[0].first.shape() == Shape{784, 128});
  CHECK(batch.inputs.shape() == Shape{32, 784});
  float ref = jit(mlp_loss)(params, batch).item<float>();
  Params ref_grad = jit(grad(mlp_loss))(params, batch);
  auto check = [&](const char* name, auto loss) {
    CAPTURE(name);
    float l = jit(loss)(params, batch).template item<float>();
    CHECK(l == doctest::Approx(ref).epsilon(1e-5));
    Params g = jit(grad(loss))(params, batch);
    REQUIRE(g.size() == ref_grad.size());
    for (size_t k = 0; k < g.size(); ++k) {
      check_all_close(g[k].first, ref_grad[k].first, 1e-2);
      check_all_close(g[k].second, ref_grad[k].second, 1e-2);
    }
  };
  check("DP", loss_dp);
  check("FSDP", loss_fsdp);
  check("TP", loss_tp);
  check("FSDP+TP", loss_fsdp_tp);
  // Pipeline parallel (2 stages): the loss matches; jit(grad) runs. With the tutorial's NaN-filled
  // idle slots the gradients are NaN (NaN * 0); filled with zeros they match one device.
  PipelineParams pp = stack_for_pipeline(params);
  CHECK(jit([](const PipelineParams& p, const Batch& b) { return loss_pp(p, b); })(pp, batch).item<float>() ==
        doctest::Approx(ref).epsilon(1e-5));
  PipelineParams gnan = jit(grad([](const PipelineParams& p, const Batch& b) { return loss_pp(p, b); }))(pp, batch);
  CHECK(gnan.inner.first.shape() == Shape{4, 128, 128});
  auto loss_pp0 = [](const PipelineParams& p, const Batch& b) { return loss_pp(p, b, 0.f); };
  CHECK(jit(loss_pp0)(pp, batch).item<float>() == doctest::Approx(ref).epsilon(1e-5));
  PipelineParams gpp = jit(grad(loss_pp0))(pp, batch);
  check_all_close(gpp.first.first, ref_grad[0].first, 1e-2);
  Array inner_ref = jnp::stack({ref_grad[1].first, ref_grad[2].first, ref_grad[3].first, ref_grad[4].first}, 0);
  check_all_close(device_put(gpp.inner.first, SingleDeviceSharding(default_device())), inner_ref, 1e-2);
  check_all_close(gpp.last.second, ref_grad[5].second, 1e-2);
  // Eagerly too (no jit): the same numbers.
  CHECK(loss_dp(params, batch).item<float>() == doctest::Approx(ref).epsilon(1e-5));
  check_all_close(grad(loss_fsdp)(params, batch)[2].first, ref_grad[2].first, 1e-2);
}
