// Meshes, partition specs, NamedSharding, device_put round trips, addressable shards, per-device
// memory, visualize_array_sharding and the eager-op guard. Runs with CJAX_NUM_CPU_DEVICES=8.
#include <map>
#include <unordered_set>

#include "test_util.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {
// (start, stop) per dimension of a shard index; (-1, -1) for a whole axis.
std::vector<std::pair<int64_t, int64_t>> bounds(const std::vector<Slice>& idx) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const Slice& s : idx) out.push_back({s.start.value_or(-1), s.stop.value_or(-1)});
  return out;
}
std::vector<int> device_ids(const std::vector<Device>& ds) {
  std::vector<int> out;
  for (const Device& d : ds) out.push_back(d.id());
  return out;
}
}  // namespace

TEST_CASE("the test runs with 8 CPU devices") { REQUIRE(device_count() == 8); }

TEST_CASE("meshes: shape, names, devices, printing, equality") {
  Mesh m = make_mesh({4, 2}, {"x", "y"});
  CHECK(m.str() == "Mesh('x': 4, 'y': 2)");
  CHECK(m.shape() == Shape{4, 2});
  CHECK(m.axis_names() == std::vector<std::string>{"x", "y"});
  CHECK(m.axis_size("x") == 4);
  CHECK(m.axis_size("y") == 2);
  CHECK(device_ids(m.devices()) == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(m.coords(5) == std::vector<int64_t>{2, 1});
  CHECK(make_mesh({4}, {"x"}).str() == "Mesh('x': 4)");
  CHECK(device_ids(make_mesh({4}, {"x"}).devices()) == std::vector<int>{0, 1, 2, 3});
  CHECK(m == make_mesh({4, 2}, {"x", "y"}));
  CHECK(m != make_mesh({2, 4}, {"x", "y"}));
  CHECK(std::hash<Mesh>{}(m) == std::hash<Mesh>{}(make_mesh({4, 2}, {"x", "y"})));
  std::vector<Device> rev = devices();
  std::reverse(rev.begin(), rev.end());
  Mesh r(rev, {2, 4}, {"a", "b"});
  CHECK(device_ids(r.devices()) == std::vector<int>{7, 6, 5, 4, 3, 2, 1, 0});

  CHECK_ERR(make_mesh({4, 4}, {"x", "y"}), ShardingError, "16 devices", "only 8");
  CHECK_ERR(m.axis_size("z"), ShardingError, "'z'", "('x', 'y')");
  CHECK_ERR(Mesh(devices(), {4, 2}, {"x", "x"}), ShardingError, "'x' appears twice");
  CHECK_ERR(Mesh(devices(), {4, 2}, {"x"}), ShardingError, "2 axes", "1 axis names");
  CHECK_ERR(Mesh(devices(), {2, 2}, {"x", "y"}), ShardingError, "needs 4 devices", "8 were given");
}

TEST_CASE("partition specs print as JAX and compare by entries") {
  CHECK(P("i", "j").str() == "P('i', 'j')");
  CHECK(P("i", None).str() == "P('i', None)");
  CHECK(P(axes("i", "j"), None).str() == "P(('i', 'j'), None)");
  CHECK(P().str() == "P()");
  CHECK(P("x").str() == "P('x',)");
  CHECK(P(None).str() == "P(None,)");
  CHECK(P("i", None) == P("i", None));
  CHECK(P("i", None) != P(None, "i"));
  CHECK(P(axes("i")) == P("i"));
  CHECK(P(axes("i", "j")).mentioned_axes() == std::vector<std::string>{"i", "j"});
  std::unordered_set<PartitionSpec> set{P("i"), P("i"), P(None, "i"), P()};
  CHECK(set.size() == 3);
}

TEST_CASE("NamedSharding: printing, shard shapes, validation errors") {
  Mesh m = make_mesh({4, 2}, {"i", "j"});
  NamedSharding s(make_mesh({4}, {"x"}), P("x"));
  CHECK(s.str() == "NamedSharding(mesh=Mesh('x': 4), spec=P('x',), memory_kind=device)");
  CHECK(NamedSharding(m, P("i", "j")).shard_shape({8, 16}) == Shape{2, 8});
  CHECK(NamedSharding(m, P(axes("i", "j"), None)).shard_shape({16, 3}) == Shape{2, 3});
  CHECK(NamedSharding(m, P(None, "j")).shard_shape({3, 4}) == Shape{3, 2});
  CHECK(NamedSharding(m, P()).shard_shape({3, 5}) == Shape{3, 5});
  CHECK(NamedSharding(m, P()).is_fully_replicated());
  CHECK_FALSE(NamedSharding(m, P("i")).is_fully_replicated());
  CHECK(NamedSharding(m, P("i")) == NamedSharding(m, P("i")));
  CHECK(std::hash<NamedSharding>{}(NamedSharding(m, P("i"))) == std::hash<NamedSharding>{}(NamedSharding(m, P("i"))));
  CHECK(device_ids(NamedSharding(m, P()).device_set()).size() == 8);

  CHECK_ERR(NamedSharding(m, P("k")), SpecError, "'k'", "('i', 'j')");
  CHECK_ERR(NamedSharding(m, P("i", "i")), SpecError, "'i'", "more than once");
  CHECK_ERR(NamedSharding(m, P(axes("i", "j"), "j")), SpecError, "'j'", "more than once");
  CHECK_ERR(NamedSharding(m, P("i", "j")).shard_shape({6, 4}), ShardingError, "dimension 0", "size 6",
            "not divisible by 4", "('i',)");
  CHECK_ERR(NamedSharding(m, P(axes("i", "j"))).shard_shape({12}), ShardingError, "size 12", "by 8", "('i', 'j')");
  CHECK_ERR(NamedSharding(m, P("i", None, None)).shard_shape({8, 8}), ShardingError, "3 entries", "rank 2");
  Array x = numpy::arange(6).astype(f32);
  CHECK_ERR(device_put(x, NamedSharding(m, P("i"))), ShardingError, "size 6", "not divisible by 4");
}

TEST_CASE("device_put round trips over meshes and specs") {
  struct Case {
    Shape mesh;
    PartitionSpec spec;
    Shape shape;
  };
  std::vector<Case> cases = {
      {{8}, P("i"), {16}},
      {{8}, P("i"), {8, 3}},
      {{8}, P(None, "i"), {3, 8}},
      {{8}, P(), {5, 3}},
      {{4, 2}, P("i"), {8}},
      {{4, 2}, P("i", None), {4, 4}},
      {{4, 2}, P(None, "j"), {3, 4}},
      {{4, 2}, P("i", "j"), {8, 6}},
      {{4, 2}, P(axes("i", "j")), {16}},
      {{4, 2}, P(axes("i", "j"), None), {8, 2}},
      {{4, 2}, P(axes("j", "i")), {8}},
      {{4, 2}, P(), {4, 4}},
      {{2, 4}, P("i", None), {4, 4}},
      {{2, 4}, P(None, "j"), {2, 8}},
      {{2, 4}, P("j", "i"), {8, 2}},
      {{2, 4}, P(axes("i", "j")), {8}},
      {{2, 4}, P(), {3}},
  };
  for (const Case& c : cases) {
    std::vector<std::string> names =
        c.mesh.size() == 1 ? std::vector<std::string>{"i"} : std::vector<std::string>{"i", "j"};
    NamedSharding s(make_mesh(c.mesh, names), c.spec);
    for (DType dt : {f32, i64, bool_, bf16}) {
      CAPTURE(s.str());
      CAPTURE(shape_str(c.shape));
      Array x = idx_array(c.shape, dt);
      Array y = device_put(x, s);
      CHECK(concrete(y)->buffers.size() == 8);
      CHECK(y.sharding().str() == s.str());
      CHECK(y.shape() == c.shape);
      CHECK(y.dtype() == dt);
      CHECK(vals(device_put(y, SingleDeviceSharding(default_device()))) == vals(x));
      CHECK(y.to_vector<double>() == x.to_vector<double>());
      CHECK(text(y) == text(x));
      for (const Shard& sh : y.addressable_shards()) CHECK(sh.data.shape() == s.shard_shape(c.shape));
    }
  }
  // A scalar replicated with P() and read back with item().
  Array r = device_put(Array(2.5f), NamedSharding(make_mesh({8}, {"i"}), P()));
  CHECK(r.item<float>() == 2.5f);
  // Resharding a sharded array to another spec.
  Mesh m = make_mesh({4, 2}, {"i", "j"});
  Array x = idx_array({8, 4}, f32);
  Array y = device_put(device_put(x, NamedSharding(m, P("i", "j"))), NamedSharding(m, P(None, "i")));
  CHECK(y.sharding().str() == NamedSharding(m, P(None, "i")).str());
  CHECK(device_put(y, NamedSharding(m, P(None, "i"))).impl() == y.impl());  // already placed: no copy
  CHECK_ERR(device_put(Array(1.0f), NamedSharding(m, P(None))), ShardingError, "1 entries", "rank 0");
  CHECK(y.to_vector<double>() == x.to_vector<double>());
}

TEST_CASE("addressable shards: device, index and block per device") {
  Mesh m8 = make_mesh({8}, {"i"});
  Array x = idx_array({16}, f32);
  std::vector<Shard> shards = device_put(x, NamedSharding(m8, P("i"))).addressable_shards();
  REQUIRE(shards.size() == 8);
  for (int k = 0; k < 8; ++k) {
    CHECK(shards[size_t(k)].device.id() == k);
    CHECK(bounds(shards[size_t(k)].index) == std::vector<std::pair<int64_t, int64_t>>{{2 * k, 2 * k + 2}});
    CHECK(vals(shards[size_t(k)].data) == std::vector<double>{2.0 * k, 2.0 * k + 1});
    CHECK(shards[size_t(k)].data.sharding().str() == SingleDeviceSharding(Device(Platform::cpu, k)).str());
  }

  // (4,4) rows over i of a (4,2) mesh: devices 2r and 2r+1 both hold row r.
  Mesh m = make_mesh({4, 2}, {"i", "j"});
  Array a = idx_array({4, 4}, f32);
  shards = device_put(a, NamedSharding(m, P("i", None))).addressable_shards();
  for (int k = 0; k < 8; ++k) {
    int r = k / 2;
    CHECK(bounds(shards[size_t(k)].index) == std::vector<std::pair<int64_t, int64_t>>{{r, r + 1}, {-1, -1}});
    CHECK(vals(shards[size_t(k)].data) == std::vector<double>{4.0 * r, 4.0 * r + 1, 4.0 * r + 2, 4.0 * r + 3});
  }
  // Columns over j: devices with j = 0 hold columns 0-1, j = 1 columns 2-3.
  shards = device_put(a, NamedSharding(m, P(None, "j"))).addressable_shards();
  CHECK(bounds(shards[3].index) == std::vector<std::pair<int64_t, int64_t>>{{-1, -1}, {2, 4}});
  CHECK(vals(shards[3].data) == std::vector<double>{2, 3, 6, 7, 10, 11, 14, 15});
  CHECK(vals(shards[4].data) == std::vector<double>{0, 1, 4, 5, 8, 9, 12, 13});
  // Both axes, i major: device (i, j) holds block i*2 + j; ('j', 'i') puts j major.
  Array v = idx_array({8}, i32);
  shards = device_put(v, NamedSharding(m, P(axes("i", "j")))).addressable_shards();
  CHECK(vals(shards[1].data) == std::vector<double>{1});
  CHECK(vals(shards[2].data) == std::vector<double>{2});
  shards = device_put(v, NamedSharding(m, P(axes("j", "i")))).addressable_shards();
  CHECK(vals(shards[1].data) == std::vector<double>{4});  // (i=0, j=1) -> block 1*4 + 0
  CHECK(vals(shards[2].data) == std::vector<double>{1});  // (i=1, j=0) -> block 0*4 + 1
  CHECK(bounds(shards[1].index) == std::vector<std::pair<int64_t, int64_t>>{{4, 5}});
  // An unsharded array has one shard: the whole array on its device.
  shards = a.addressable_shards();
  REQUIRE(shards.size() == 1);
  CHECK(bounds(shards[0].index) == std::vector<std::pair<int64_t, int64_t>>{{-1, -1}, {-1, -1}});
}

TEST_CASE("device_put to one device, and of trees") {
  Array x = idx_array({4, 2}, f32);
  Array y = device_put(x, SingleDeviceSharding(devices()[3]));
  CHECK(concrete(y)->device().id() == 3);
  CHECK(y.sharding().str() == "SingleDeviceSharding(device=CpuDevice(id=3))");
  CHECK(vals(y) == vals(x));
  Array z = device_put(device_put(x, NamedSharding(make_mesh({4, 2}, {"i", "j"}), P("i", "j"))),
                       SingleDeviceSharding(devices()[5]));
  CHECK(concrete(z)->buffers.size() == 1);
  CHECK(concrete(z)->device().id() == 5);
  CHECK(vals(z) == vals(x));

  NamedSharding s(make_mesh({8}, {"i"}), P("i"));
  std::map<std::string, Array> tree{{"w", idx_array({8, 2}, f32)}, {"b", idx_array({8}, f32)}};
  auto put = device_put(tree, s);
  CHECK(put.at("w").sharding().str() == s.str());
  CHECK(concrete(put.at("b"))->buffers.size() == 8);
  CHECK(put.at("w").to_vector<float>() == tree.at("w").to_vector<float>());
  std::vector<Array> list{idx_array({8}, i32), idx_array({16}, i32)};
  auto put_list = device_put(list, s);
  CHECK(put_list[1].addressable_shards()[7].data.to_vector<int>() == std::vector<int>{14, 15});
}

TEST_CASE("per-device memory: a fully sharded array costs 1/N on each device") {
  Array x = idx_array({8, 1024}, f32);  // 32 KiB on device 0
  std::vector<int64_t> before;
  for (const Device& d : devices()) before.push_back(memory_stats(d).bytes_in_use);
  {
    Array y = device_put(x, NamedSharding(make_mesh({8}, {"i"}), P("i")));
    for (size_t k = 0; k < 8; ++k) CHECK(memory_stats(devices()[k]).bytes_in_use - before[k] == 4096);
    Array r = device_put(x, NamedSharding(make_mesh({8}, {"i"}), P()));  // replicated: full copies
    for (size_t k = 0; k < 8; ++k) CHECK(memory_stats(devices()[k]).bytes_in_use - before[k] == 4096 + 32768);
  }
  for (size_t k = 0; k < 8; ++k) CHECK(memory_stats(devices()[k]).bytes_in_use == before[k]);
}

TEST_CASE("visualize_array_sharding") {
  Array v = idx_array({8}, f32);
  CHECK(debug::visualize_array_sharding(device_put(v, NamedSharding(make_mesh({4}, {"i"}), P("i")))) ==
        "┌───────┬───────┬───────┬───────┐\n"
        "│ CPU 0 │ CPU 1 │ CPU 2 │ CPU 3 │\n"
        "└───────┴───────┴───────┴───────┘\n");
  // docs/examples.md §1 matmul_basic: the (8, 32) result sharded by rows over i of a (4,2) mesh.
  Mesh m = make_mesh({4, 2}, {"i", "j"});
  std::string rows =
      debug::visualize_array_sharding(device_put(idx_array({8, 32}, f32), NamedSharding(m, P("i", None))));
  CHECK(rows ==
        "┌─────────┐\n"
        "│ CPU 0,1 │\n"
        "├─────────┤\n"
        "│ CPU 2,3 │\n"
        "├─────────┤\n"
        "│ CPU 4,5 │\n"
        "├─────────┤\n"
        "│ CPU 6,7 │\n"
        "└─────────┘\n");
  CHECK(debug::visualize_array_sharding(device_put(idx_array({4, 4}, f32), NamedSharding(m, P(None, "j")))) ==
        "┌─────────────┬─────────────┐\n"
        "│ CPU 0,2,4,6 │ CPU 1,3,5,7 │\n"
        "└─────────────┴─────────────┘\n");
  CHECK(debug::visualize_array_sharding(
            device_put(idx_array({4, 4}, f32), NamedSharding(make_mesh({2, 4}, {"i", "j"}), P("i", "j")))) ==
        "┌───────┬───────┬───────┬───────┐\n"
        "│ CPU 0 │ CPU 1 │ CPU 2 │ CPU 3 │\n"
        "├───────┼───────┼───────┼───────┤\n"
        "│ CPU 4 │ CPU 5 │ CPU 6 │ CPU 7 │\n"
        "└───────┴───────┴───────┴───────┘\n");
  CHECK(debug::visualize_array_sharding(v) ==
        "┌───────┐\n"
        "│ CPU 0 │\n"
        "└───────┘\n");
  CHECK(debug::visualize_array_sharding(device_put(v, NamedSharding(m, P()))) ==
        "┌─────────────────────┐\n"
        "│ CPU 0,1,2,3,4,5,6,7 │\n"
        "└─────────────────────┘\n");
  CHECK_ERR(debug::visualize_array_sharding(idx_array({2, 2, 2}, f32)), ShardingError, "(2, 2, 2)");
}

TEST_CASE("eager ops on sharded inputs run per shard, or through the partitioner of sharded jit") {
  Mesh m = make_mesh({8}, {"i"});
  Array x = device_put(idx_array({8}, f32), NamedSharding(m, P("i")));
  Array y = x + 1.0f;
  CHECK(y.sharding().str() == "NamedSharding(mesh=Mesh('i': 8), spec=P('i',), memory_kind=device)");
  CHECK(vals(y) == std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(vals(x * idx_array({8}, f32)) == std::vector<double>{0, 1, 4, 9, 16, 25, 36, 49});  // the other is split
  CHECK(numpy::sum(x).item<float>() == 28.f);
  CHECK(numpy::max(x).item<float>() == 7.f);
  Mesh m2 = make_mesh({4, 2}, {"a", "b"});
  Array z = device_put(idx_array({4, 4}, f32), NamedSharding(m2, P("a", "b")));
  Array rows = numpy::sum(z, 1);
  CHECK(rows.sharding().str() == "NamedSharding(mesh=Mesh('a': 4, 'b': 2), spec=P('a',), memory_kind=device)");
  CHECK(vals(rows) == std::vector<double>{6, 22, 38, 54});
  // 8 blocks cannot stay blocks of 2 rows: the partitioner gathers them (docs/sharding.md §2).
  CHECK(vals(x.reshape({2, 4}) + 0.f) == vals(idx_array({8}, f32)));
  CHECK_ERR(x + device_put(idx_array({8}, f32), NamedSharding(m2, P(axes("a", "b")))), ShardingError,
            "split over Mesh('a': 4, 'b': 2)", "onto one mesh");
  // Fully replicated inputs compute on their first copy.
  Array r = device_put(idx_array({8}, f32), NamedSharding(m, P()));
  CHECK(vals(r + 1.0f) == std::vector<double>{1, 2, 3, 4, 5, 6, 7, 8});
  CHECK(vals(r.reshape({2, 4})) == vals(idx_array({8}, f32)));
  CHECK(r.reshape({2, 4}).addressable_shards().size() == 1);  // a view of one replica is unsharded
  // Moving to one device makes eager ops work again.
  CHECK(vals(device_put(x, SingleDeviceSharding(default_device())) * 2.0f) ==
        std::vector<double>{0, 2, 4, 6, 8, 10, 12, 14});
}

TEST_CASE("with_sharding_constraint: device_put eagerly, a staged identity that reshards when run") {
  Mesh m = make_mesh({4, 2}, {"i", "j"});
  NamedSharding rows(m, P("i", None)), cols(m, P(None, "i"));
  Array x = idx_array({8, 4}, f32);
  std::vector<double> xv = vals(x);
  // Eagerly: device_put, from one device or from another layout.
  Array y = with_sharding_constraint(x, rows);
  CHECK(y.sharding().str() == rows.str());
  CHECK(vals(y) == xv);
  Array z = with_sharding_constraint(y, cols);
  CHECK(z.sharding().str() == cols.str());
  CHECK(vals(z) == xv);
  CHECK(with_sharding_constraint(z, cols).impl() == z.impl());  // already laid out so: no copy
  // Staged: the identity with the sharding in its parameters.
  auto f = [&](const Array& a) { return with_sharding_constraint(a * 2.f, cols); };
  std::string jt = text(make_jaxpr(f)(x));
  CHECK(
      jt.find("c:f32[8,4] = sharding_constraint[\n      sharding=NamedSharding(mesh=Mesh('i': 4, 'j': 2), spec=P(None, "
              "'i'), memory_kind=device)\n    ] b") != std::string::npos);
  // Under jit the result is laid out as constrained, whatever the input's layout.
  std::vector<double> twice;
  for (double v : xv) twice.push_back(2 * v);
  for (const Array& in : {x, y}) {
    Array r = jit(f)(in);
    CHECK(vals(r) == twice);
    CHECK(r.sharding().str() == cols.str());
  }
  // Trees.
  auto [t0, t1] = with_sharding_constraint(std::pair{x, x + 1.f}, rows);
  CHECK(t0.sharding().str() == rows.str());
  CHECK(t1.sharding().str() == rows.str());
  CHECK(vals(t1)[0] == xv[0] + 1);
  // A spec that does not fit the shape.
  CHECK_ERR(with_sharding_constraint(idx_array({6}, f32), NamedSharding(m, P("i"))), ShardingError, "6");
  CHECK_ERR(make_jaxpr([&](const Array& a) { return with_sharding_constraint(a, NamedSharding(m, P("i"))); })(
                idx_array({6}, f32)),
            ShardingError, "6");
  // Inside a shard_map body the mesh axes are manual.
  CHECK_ERR(shard_map([&](const Array& b) { return with_sharding_constraint(b, rows); }, m, P("i"), P("i"))(x),
            ShardingError, "inside a shard_map body");
}

TEST_CASE("with_sharding_constraint under grad, jvp and vmap") {
  Mesh m = make_mesh({4}, {"i"});
  NamedSharding s(m, P("i"));
  Array x = idx_array({8}, f32);
  auto f = [&](const Array& a) { return jnp::sum(with_sharding_constraint(a * a, s)); };
  std::vector<double> want;
  for (double v : vals(x)) want.push_back(2 * v);
  CHECK(vals(grad(f)(x)) == want);
  CHECK(vals(jit(grad(f))(x)) == want);
  // The cotangent passes through the same constraint (the transpose is the constraint).
  std::string gt = text(make_jaxpr(grad(f))(x));
  size_t first = gt.find("sharding_constraint"), second = gt.find("sharding_constraint", first + 1);
  CHECK(first != std::string::npos);
  CHECK(second != std::string::npos);
  // jvp: the tangent is constrained too.
  auto g = [&](const Array& a) { return with_sharding_constraint(a * 3.f, s); };
  auto [out, tan] = jvp(g, std::tuple{x}, std::tuple{jnp::ones({8})});
  CHECK(out.sharding().str() == s.str());
  CHECK(tan.sharding().str() == s.str());
  CHECK(vals(tan) == std::vector<double>(8, 3));
  // vmap: the batch dimension leads, unsplit.
  Array xs = idx_array({3, 8}, f32);
  std::string vt = text(make_jaxpr(vmap(g))(xs));
  CHECK(vt.find("spec=P(None, 'i')") != std::string::npos);
  Array vr = vmap(g)(xs);
  CHECK(vr.sharding().str() == NamedSharding(m, P(None, "i")).str());
  std::vector<double> w3;
  for (double v : vals(xs)) w3.push_back(3 * v);
  CHECK(vals(vr) == w3);
}
