// docs/examples.md §1–3, printing what JAX's shard_map tutorial prints: matmul with psum and
// psum_scatter, slicing and tiling, eager per-device printing, the collectives tutorial and the
// six distributed matmuls (`--bench` times them at a larger size).
#include <chrono>
#include <cstring>
#include <iostream>

#include "examples_shard_map.h"

using namespace cjax;
using namespace cjax::examples;

int main(int argc, char** argv) {
  config::set_num_cpu_devices(8);
  bool bench = argc > 1 && std::strcmp(argv[1], "--bench") == 0;

  std::cout << "== matmul_basic ==\n";
  MatmulBasic m = matmul_basic();
  std::cout << "blocks: a " << shape_str(m.a_block) << ", b " << shape_str(m.b_block) << "\n";
  std::cout << "allclose(c, dot(a, b)): " << std::boolalpha
            << (m.c.to_vector<float>() == jnp::dot(m.a, m.b).to_vector<float>()) << "\n";
  std::cout << debug::visualize_array_sharding(m.c);
  Array rs = matmul_reduce_scatter(m.a, m.b);
  std::cout << "matmul_reduce_scatter == dot(a, b): "
            << (rs.to_vector<float>() == jnp::dot(m.a, m.b).to_vector<float>()) << "\n"
            << debug::visualize_array_sharding(rs);

  std::cout << "\n== slicing and tiling ==\n";
  Tiling t = slicing_and_tiling();
  std::cout << "f1 block " << shape_str(t.f1_block) << " -> " << shape_str(t.f1_out) << "\n";
  std::cout << "f2 block " << shape_str(t.f2_block) << " -> " << shape_str(t.f2_out)
            << ", same as f1: " << (t.f1_y.to_vector<int>() == t.f2_y.to_vector<int>()) << "\n";
  std::cout << "f3 " << shape_str(t.f3_out) << ", f4 " << shape_str(t.f4_out) << ", f5 " << shape_str(t.f5_out) << "\n";
  std::cout << "P('i','j'):\n"
            << tile_constant(P("i", "j")) << "\nP('i', None):\n"
            << tile_constant(P("i", None)) << "\nP(None, None):\n"
            << tile_constant(P(None, None)) << "\n";

  std::cout << "\n== eager printing ==\n";
  shard_map(
      [](const Array& x) {
        std::cout << x << "\n";
        return x;
      },
      mesh_i4(), P("i"), P("i"))(jnp::arange(8));

  std::cout << "\n== collectives ==\n";
  Array v = tutorial_vector();
  std::cout << "psum: " << shard_map([](const Array& x) { return lax::psum(x, "i"); }, mesh_i4(), P("i"), P())(v)
            << "\n";
  Mesh m2 = make_mesh({2, 2}, {"i", "j"});
  Array x44 = jnp::arange(16).reshape({4, 4});
  std::cout << "psum over i, out P(None, j):\n"
            << shard_map([](const Array& x) { return lax::psum(x, "i"); }, m2, P("i", "j"), P(None, "j"))(x44) << "\n";
  std::cout << "psum over (i, j), out P(None, None):\n"
            << shard_map(
                   [](const Array& x) {
                     return lax::psum(x, {"i", "j"});
                   },
                   m2, P("i", "j"), P(None, None))(x44)
            << "\n";
  Array g = jnp::array(std::vector<float>{3, 9, 5, 2});
  std::cout << "all_gather tiled: "
            << shard_map([](const Array& x) { return lax::all_gather(x, "i", {.tiled = true}); }, mesh_i4(), P("i"),
                         P("i"))(g)
            << "\n";
  std::cout << "all_gather untiled:\n"
            << shard_map([](const Array& x) { return lax::all_gather(x, "i"); }, mesh_i4(), P("i"), P("i"))(g) << "\n";
  std::cout << "psum_scatter: "
            << shard_map([](const Array& x) { return lax::psum_scatter(x, "i", {.tiled = true}); }, mesh_i4(), P("i"),
                         P("i"))(v)
            << "\n";
  std::cout << "ring psum_scatter: " << ring_psum_scatter(v) << "\n";
  std::cout << "ppermute shift: "
            << shard_map(
                   [](const Array& x) {
                     return lax::ppermute(x, "i", {{0, 1}, {1, 2}, {2, 3}, {3, 0}});
                   },
                   mesh_i4(), P("i"), P("i"))(jnp::arange(8))
            << "\n";
  std::cout << "all_to_all: "
            << shard_map([](const Array& x) { return lax::all_to_all(x, "i", 0, 0, {.tiled = true}); }, mesh_i4(),
                         P("i"), P("i"))(v)
            << "\n";

  std::cout << "\n== distributed matmuls ==\n";
  int64_t rows = bench ? 1024 : 8, inner = bench ? 1024 : 8, cols = bench ? 1024 : 4;
  Array lhs = random::normal(random::key(1), {rows, inner}), rhs = random::normal(random::key(2), {inner, cols});
  Array want = jnp::dot(lhs, rhs);
  for (MatmulVariant var : kMatmulVariants) {
    auto run = jit([var](const Array& l, const Array& r) { return distributed_matmul(var, l, r); });
    Array got = run(lhs, rhs);
    bool ok = jnp::allclose(got, want, 1e-3, 1e-3);
    std::cout << variant_name(var) << ": allclose " << ok;
    if (bench) {
      auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < 5; ++k) run(lhs, rhs).block_until_ready();
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / 5;
      std::cout << "  " << ms << " ms";
    }
    std::cout << "\n";
  }
  return 0;
}
