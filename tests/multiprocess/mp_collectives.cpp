// Collectives of the shard_map tutorial across processes (run by cjax_launch, e.g. 2 processes × 4
// CPU devices or 4 × 2): each process holds the blocks of its devices, and the results must equal
// what one process computes from the whole value.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "cjax/cjax.h"
#include "cjax/distributed.h"

using namespace cjax;
namespace jnp = cjax::numpy;

namespace {
std::vector<float> values(const Array& x) { return process_allgather(x).astype(f32).to_vector<float>(); }
std::vector<float> host(const Array& x) { return x.astype(f32).to_vector<float>(); }
// [8·rows, 3] with distinct small integers (sums are exact in any order).
Array rows(int64_t n) { return jnp::reshape(jnp::arange(n * 3).astype(f32), {n, 3}); }
Mesh mesh_x() { return make_mesh({8}, {"x"}); }
}  // namespace

TEST_CASE("the global device list spans the processes") {
  CHECK(process_count() >= 2);
  CHECK(device_count() == 8);
  CHECK(local_device_count() == 8 / process_count());
  std::vector<Device> local = local_devices();
  CHECK(local.front().id() == process_index() * local_device_count());
  for (const Device& d : local) CHECK(process_index_of(d) == process_index());
  CHECK(process_index_of(devices().back()) == process_count() - 1);
}

TEST_CASE("global arrays: device_put, process-local data, callbacks, addressable shards") {
  Mesh m = mesh_x();
  NamedSharding s(m, P("x"));
  Array whole = rows(16);
  Array a = device_put(whole, s);
  CHECK_FALSE(is_fully_addressable(a));
  CHECK(a.addressable_shards().size() == size_t(local_device_count()));
  for (const Shard& sh : a.addressable_shards()) {
    int64_t k = sh.device.id();
    CHECK(host(sh.data) == host(jnp::reshape(jnp::arange(k * 6, k * 6 + 6).astype(f32), {2, 3})));
  }
  CHECK_THROWS_WITH_AS(a.to_vector<float>(), doctest::Contains("process_allgather"), ValueError);
  CHECK(values(a) == host(whole));

  int64_t per = 16 / process_count();
  Array mine = lax::slice(whole, {process_index() * per, 0}, {(process_index() + 1) * per, 3});
  Array b = make_array_from_process_local_data(s, mine);
  CHECK(b.shape() == Shape{16, 3});
  CHECK(values(b) == host(whole));

  Array c = make_array_from_callback({16, 3}, s, [&](const std::vector<Slice>& index) {
    return lax::slice(whole, {*index[0].start, 0}, {*index[0].stop, 3});
  });
  CHECK(values(c) == host(whole));
  Array d = make_array_from_callback({16, 3}, s, [&](const Index& idx) { return whole[idx]; });  // API.md's form
  CHECK(values(d) == host(whole));
}

TEST_CASE("psum, pmax, pmin, all_gather, psum_scatter, all_to_all, ppermute, axis_index under jit") {
  Mesh m = mesh_x();
  Array whole = rows(16);
  Array x = device_put(whole, NamedSharding(m, P("x")));
  auto run = [&](auto f, PartitionSpec out) { return values(jit(shard_map(f, m, P("x"), out))(x)); };

  Array blocks = jnp::reshape(whole, {8, 2, 3});
  CHECK(run([](const Array& b) { return lax::psum(b, "x"); }, P()) == host(jnp::sum(blocks, {0})));
  CHECK(run([](const Array& b) { return lax::pmax(b, "x"); }, P()) == host(jnp::max(blocks, {0})));
  CHECK(run([](const Array& b) { return lax::pmin(b, "x"); }, P()) == host(jnp::min(blocks, {0})));
  CHECK(run([](const Array& b) { return lax::all_gather(b, "x", {.tiled = true}); }, P("x")) ==
        host(jnp::concatenate(std::vector<Array>(8, whole), 0)));
  // psum_scatter: device k gets row k of the sum of the blocks [2,3] → sum is [2,3]; split rows over 8
  // does not divide, so scatter a [8,3] block instead.
  Array x8 = device_put(rows(64), NamedSharding(m, P("x")));
  Array blocks8 = jnp::reshape(rows(64), {8, 8, 3});
  CHECK(values(jit(shard_map([](const Array& b) { return lax::psum_scatter(b, "x", {.tiled = true}); }, m, P("x"),
                             P("x")))(x8)) == host(jnp::sum(blocks8, {0})));
  // all_to_all: device k's chunk j goes to device j as chunk k (a block transpose).
  CHECK(values(jit(shard_map([](const Array& b) { return lax::all_to_all(b, "x", 0, 0, {.tiled = true}); }, m, P("x"),
                             P("x")))(x8)) ==
        host(jnp::reshape(jnp::transpose(blocks8.reshape({8, 8, 1, 3}), {1, 0, 2, 3}), {64, 3})));
  // ppermute: a ring shift, block k to device k+1.
  std::vector<std::pair<int, int>> ring;
  for (int k = 0; k < 8; ++k) ring.emplace_back(k, (k + 1) % 8);
  CHECK(run([&](const Array& b) { return lax::ppermute(b, "x", ring); }, P("x")) == host(jnp::roll(whole, 2, 0)));
  CHECK(run([](const Array& b) { return b * lax::axis_index("x").astype(f32); }, P("x")) ==
        host(whole * jnp::repeat(jnp::arange(8).astype(f32), 2).reshape({16, 1})));
}

TEST_CASE("large all-reduces (pipelined in chunks between processes) give one process's bits") {
  // Blocks of 4.8 MB and just over 4 MB: with CJAX_GLOO_CHUNK_KB=1024 (tests/CMakeLists.txt)
  // every process's slice spans several chunks, the last one short.
  Mesh m = mesh_x();
  for (int64_t width : {1200007, 1048579}) {
    CAPTURE(width);
    Array whole = random::normal(random::key(uint64_t(width)), {8, width});
    Array x = device_put(whole, NamedSharding(m, P("x")));
    // The members' blocks summed in rank order, as the in-process communicator does.
    Array want = whole[0];
    for (int64_t k = 1; k < 8; ++k) want = want + whole[k];
    CHECK(values(jit(shard_map([](const Array& b) { return lax::psum(b, "x"); }, m, P("x"), P()))(x)) ==
          host(want.reshape({1, width})));
    CHECK(values(jit(shard_map([](const Array& b) { return lax::pmax(b, "x"); }, m, P("x"), P()))(x)) ==
          host(jnp::max(whole, {0}).reshape({1, width})));
  }
}

TEST_CASE("eager shard_map across processes runs staged, with the same values") {
  Mesh m = mesh_x();
  Array whole = rows(16);
  Array x = device_put(whole, NamedSharding(m, P("x")));
  auto f = shard_map([](const Array& b) { return lax::psum(b * 2.0f, "x"); }, m, P("x"), P());
  CHECK(values(f(x)) == host(jnp::sum(jnp::reshape(whole * 2.0f, {8, 2, 3}), {0})));
}

TEST_CASE("a 2-D mesh: groups inside one process and groups across processes") {
  Mesh m = make_mesh({4, 2}, {"i", "j"});
  Array whole = rows(8);  // [8,3]: block (i, j) is rows 2i+j
  Array x = device_put(whole, NamedSharding(m, P(axes("i", "j"))));
  Array blocks = jnp::reshape(whole, {4, 2, 1, 3});
  CHECK(values(jit(shard_map([](const Array& b) { return lax::psum(b, "j"); }, m, P(axes("i", "j")), P("i")))(x)) ==
        host(jnp::reshape(jnp::sum(blocks, {1}), {4, 3})));
  CHECK(values(jit(shard_map([](const Array& b) { return lax::psum(b, "i"); }, m, P(axes("i", "j")), P("j")))(x)) ==
        host(jnp::reshape(jnp::sum(blocks, {0}), {2, 3})));
}

TEST_CASE("grad through psum across processes") {
  Mesh m = mesh_x();
  Array whole = rows(16);
  Array x = device_put(whole, NamedSharding(m, P("x")));
  Array w = jnp::array(std::vector<float>{1, 2, 3});
  auto loss = [&](const Array& wv) {
    auto f = shard_map([&](const Array& b, const Array& wb) { return lax::psum(jnp::sum(b * wb * wb), "x"); }, m,
                       {P("x"), P()}, P());
    return f(x, wv);
  };
  Array g = jit(grad(loss))(w);
  // d/dw sum(x · w²) = 2 w · column sums of x
  CHECK(values(g) == host(2.0f * w * jnp::sum(whole, {0})));
}

TEST_CASE("sharded jit inserts the collectives between processes") {
  Mesh m = mesh_x();
  Array whole = rows(16);
  Array x = device_put(whole, NamedSharding(m, P("x")));
  Array total = jit([](const Array& v) { return jnp::sum(v * v, {0}); })(x);
  CHECK(values(total) == host(jnp::sum(whole * whole, {0})));
}

TEST_CASE("sharded checkpoints: each process writes its own blocks, another layout reads them") {
  namespace fs = std::filesystem;
  std::string address = std::getenv("CJAX_COORDINATOR_ADDRESS");
  fs::path dir = fs::temp_directory_path() / ("cjax_mp_ckpt_" + address.substr(address.rfind(':') + 1));
  Mesh m = mesh_x();
  Array whole = rows(16);
  Array a = device_put(whole, NamedSharding(m, P("x")));
  Array r = device_put(whole * 2.0f, NamedSharding(m, P()));  // replicated: one block, written by process 0
  io::save_sharded_entries(dir, {{"a", a}, {"r", r}}, {{"step", "7"}});
  std::string mine = "process" + std::to_string(process_index()) + ".0.safetensors";
  REQUIRE(fs::exists(dir / mine));
  CHECK(io::load_safetensors_entries(dir / mine).size() == size_t(local_device_count() + (process_index() == 0)));
  CHECK(io::load_sharded_metadata(dir).at("step") == "7");
  Mesh grid = make_mesh({2, 4}, {"i", "j"});
  CHECK(values(io::load_sharded(dir, "a", NamedSharding(grid, P("j")))) == host(whole));
  CHECK(values(io::load_sharded(dir, "a", NamedSharding(grid, P()))) == host(whole));
  CHECK(values(io::load_sharded(dir, "r", NamedSharding(m, P("x")))) == host(whole * 2.0f));
  io::save_sharded_entries(dir, {{"a", a}}, {});  // the second save replaces the first one's files
  CHECK(fs::exists(dir / ("process" + std::to_string(process_index()) + ".1.safetensors")));
  CHECK_FALSE(fs::exists(dir / mine));
  CHECK(values(io::load_sharded(dir, "a", NamedSharding(m, P()))) == host(whole));
  (void)process_allgather(a);  // every process is done reading
  if (process_index() == 0) fs::remove_all(dir);
}
