// shard_map on 8 virtual CPU devices: collectives of 4 MB per device as a ratio to a memcpy of
// the same bytes on one core (measured in the same run), and dispatch latency of a cached
// jitted shard_map and of an eager one on tiny inputs (goal <= 50 us for the jitted one).
#include <cjax/cjax.h>
#include <fmt/format.h>

#include <cstring>
#include <vector>

#include "bench/harness.h"

using namespace cjax;
namespace jnp = cjax::numpy;

int main() {
  config::set_num_cpu_devices(8);
  Mesh mesh = make_mesh({8}, {"i"});
  const int64_t per_device = 1 << 20;  // f32 elements: 4 MB per device
  Array x = device_put(jnp::ones({8 * per_device}), NamedSharding(mesh, P("i")));

  std::vector<float> src(static_cast<size_t>(per_device), 1.f), dst(static_cast<size_t>(per_device));
  double t_memcpy = bench::time_median([&] { std::memcpy(dst.data(), src.data(), src.size() * 4); }, 20);

  auto psum = jit(shard_map([](const Array& b) { return lax::psum(b, "i"); }, mesh, P("i"), P("i")));
  auto gather =
      jit(shard_map([](const Array& b) { return lax::all_gather(b, "i", {.tiled = true}); }, mesh, P("i"), P("i")));
  auto scatter =
      jit(shard_map([](const Array& b) { return lax::psum_scatter(b, "i", {.tiled = true}); }, mesh, P("i"), P("i")));
  double t_psum = bench::time_median([&] { psum(x).block_until_ready(); }, 10);
  double t_gather = bench::time_median([&] { gather(x).block_until_ready(); }, 5);
  double t_scatter = bench::time_median([&] { scatter(x).block_until_ready(); }, 10);

  std::printf("%-44s %-18s %-26s %8s   %s\n", "what", "cjax", "peer", "ratio", "goal");
  bench::row("psum 4 MB/device x 8 devices", fmt::format("{:.2f} ms", t_psum * 1e3),
             fmt::format("memcpy 4 MB {:.2f} ms", t_memcpy * 1e3), t_psum / t_memcpy, "report");
  bench::row("all_gather tiled 4 MB/device x 8", fmt::format("{:.2f} ms", t_gather * 1e3),
             fmt::format("memcpy 4 MB {:.2f} ms", t_memcpy * 1e3), t_gather / t_memcpy, "report (writes 8x)");
  bench::row("psum_scatter tiled 4 MB/device x 8", fmt::format("{:.2f} ms", t_scatter * 1e3),
             fmt::format("memcpy 4 MB {:.2f} ms", t_memcpy * 1e3), t_scatter / t_memcpy, "report");

  Array tiny = device_put(jnp::ones({8}), NamedSharding(mesh, P("i")));
  auto small = jit(shard_map([](const Array& b) { return lax::psum(b * 2.f, "i"); }, mesh, P("i"), P()));
  auto eager_small = shard_map([](const Array& b) { return lax::psum(b * 2.f, "i"); }, mesh, P("i"), P());
  double t_dispatch = bench::time_median([&] { small(tiny).block_until_ready(); }, 200);
  double t_eager = bench::time_median([&] { eager_small(tiny).block_until_ready(); }, 50);
  bench::row("cached jit(shard_map) dispatch, 8 devices", fmt::format("{:.1f} us", t_dispatch * 1e6), "goal 50 us",
             t_dispatch / 50e-6, "<= 1.0x");
  bench::row("eager shard_map (2 primitives), 8 devices", fmt::format("{:.1f} us", t_eager * 1e6),
             fmt::format("jit {:.1f} us", t_dispatch * 1e6), t_eager / t_dispatch, "report");
  return 0;
}
