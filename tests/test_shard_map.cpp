// shard_map basics (docs/examples.md §1, docs/shard_map.md §1): slicing, assembly, eager and
// staged execution, printing per device, collectives' values and the errors of §1.7 and §2.4.
#include <algorithm>

#include "test_util.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {
Array arange_f(int64_t n) { return jnp::arange(n).astype(f32); }
}  // namespace

TEST_CASE("the test runs with 8 CPU devices") { REQUIRE(device_count() == 8); }

TEST_CASE("matmul_basic: local dot then psum over j, eager and under jit") {
  Mesh mesh = make_mesh({4, 2}, {"i", "j"});
  Array a = arange_f(8 * 16).reshape({8, 16});
  Array b = arange_f(16 * 32).reshape({16, 32});
  std::vector<Shape> block_shapes;
  auto f = shard_map(
      [&](const Array& ab, const Array& bb) {
        block_shapes = {ab.shape(), bb.shape()};
        return lax::psum(jnp::dot(ab, bb), "j");
      },
      mesh, {P("i", "j"), P("j", None)}, P("i", None));
  Array c = f(a, b);
  CHECK(block_shapes == std::vector<Shape>{{2, 8}, {8, 32}});
  CHECK(c.shape() == Shape{8, 32});
  CHECK(c.to_vector<float>() == jnp::dot(a, b).to_vector<float>());
  CHECK(c.sharding().str() == "NamedSharding(mesh=Mesh('i': 4, 'j': 2), spec=P('i', None), memory_kind=device)");
  Array cj = jit(f)(a, b);
  CHECK(cj.to_vector<float>() == jnp::dot(a, b).to_vector<float>());
}

TEST_CASE("collectives tutorial values (docs/examples.md §2)") {
  Mesh mesh = make_mesh({4}, {"i"});
  Array x = jnp::array(std::vector<float>{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 1, 2});
  auto psum_f = shard_map([](const Array& v) { return lax::psum(v, "i"); }, mesh, P("i"), P());
  CHECK(psum_f(x).to_vector<float>() == std::vector<float>{22, 20, 12, 17});
  CHECK(jit(psum_f)(x).to_vector<float>() == std::vector<float>{22, 20, 12, 17});
  auto ps = shard_map([](const Array& v) { return lax::psum_scatter(v, "i", {.tiled = true}); }, mesh, P("i"), P("i"));
  CHECK(ps(x).to_vector<float>() == std::vector<float>{22, 20, 12, 17});
  CHECK(jit(ps)(x).to_vector<float>() == std::vector<float>{22, 20, 12, 17});
  auto shift = shard_map(
      [](const Array& v) {
        return lax::ppermute(v, "i", {{0, 1}, {1, 2}, {2, 3}, {3, 0}});
      },
      mesh, P("i"), P("i"));
  CHECK(shift(jnp::arange(8)).to_vector<int>() == std::vector<int>{6, 7, 0, 1, 2, 3, 4, 5});
  CHECK(jit(shift)(jnp::arange(8)).to_vector<int>() == std::vector<int>{6, 7, 0, 1, 2, 3, 4, 5});
  auto a2a =
      shard_map([](const Array& v) { return lax::all_to_all(v, "i", 0, 0, {.tiled = true}); }, mesh, P("i"), P("i"));
  std::vector<float> want{3, 5, 5, 9, 1, 9, 3, 7, 4, 2, 5, 1, 1, 6, 8, 2};
  CHECK(a2a(x).to_vector<float>() == want);
  CHECK(jit(a2a)(x).to_vector<float>() == want);
  auto ag = shard_map([](const Array& v) { return lax::all_gather(v, "i", {.tiled = true}); }, mesh, P("i"), P("i"));
  Array g = ag(jnp::array(std::vector<float>{3, 9, 5, 2}));
  CHECK(g.to_vector<float>() == std::vector<float>{3, 9, 5, 2, 3, 9, 5, 2, 3, 9, 5, 2, 3, 9, 5, 2});
}

TEST_CASE("eager printing shows every device's block") {
  Mesh mesh = make_mesh({4}, {"i"});
  std::string text;
  auto f = shard_map(
      [&](const Array& v) {
        text = to_string(v);
        return v;
      },
      mesh, P("i"), P("i"));
  f(arange_f(8));
  CHECK(text ==
        "On cpu:0 at mesh coordinates (i,) = (0,):\n[0. 1.]\n\nOn cpu:1 at mesh coordinates (i,) = (1,):\n[2. 3.]\n\n"
        "On cpu:2 at mesh coordinates (i,) = (2,):\n[4. 5.]\n\nOn cpu:3 at mesh coordinates (i,) = (3,):\n[6. 7.]");
}

TEST_CASE("staged shard_map prints its body with varying axes") {
  Mesh mesh = make_mesh({4, 2}, {"x", "y"});
  auto f = shard_map([](const Array& a, const Array& b) { return lax::psum(jnp::dot(a, b), "y"); }, mesh,
                     {P("x", "y"), P("y", None)}, P("x", None));
  std::string text = make_jaxpr(f)(jnp::ones({8, 16}), jnp::ones({16, 4})).str();
  MESSAGE(text);
  CHECK(text.find("{V:x,y}") != std::string::npos);
}

TEST_CASE("nested shard_map: the inner one makes a further axis manual") {
  Mesh mesh = make_mesh({2, 4}, {"x", "y"});
  Array a = arange_f(8 * 4).reshape({8, 4});
  auto inner = shard_map([](const Array& b) { return lax::psum(b, "y"); }, mesh, P(None, "y"), P(None, None),
                         {.axis_names = {"y"}});
  auto outer = shard_map([&](const Array& b) { return inner(b) * 2.f; }, mesh, P("x"), P("x"), {.axis_names = {"x"}});
  std::vector<float> want;
  std::vector<float> av = a.to_vector<float>();
  for (int r = 0; r < 8; ++r) want.push_back(2.f * (av[r * 4] + av[r * 4 + 1] + av[r * 4 + 2] + av[r * 4 + 3]));
  CHECK(outer(a).shape() == Shape{8, 1});
  CHECK(outer(a).to_vector<float>() == want);
  CHECK(jit(outer)(a).to_vector<float>() == want);
  std::string text = make_jaxpr(outer)(a).str();
  CHECK(text.find("manual_axes=frozenset({'y'})") != std::string::npos);
}

TEST_CASE("devices that run different collectives raise CollectiveError instead of hanging") {
  Mesh mesh = make_mesh({4}, {"i"});
  // Only device 0 takes the branch with the psum: the others finish while it waits.
  auto diverge = shard_map(
      [](const Array& x) {
        return lax::cond(
            lax::axis_index("i") == 0, [](const Array& v) { return lax::psum(v, "i"); },
            [](const Array& v) { return v; }, x);
      },
      mesh, P("i"), P("i"), {.check_vma = false});
  CHECK_ERR(jit(diverge)(arange_f(4)).block_until_ready(), CollectiveError, "finished the shard_map body while");
  if (!config::disable_jit()) {
    // Dispatched asynchronously: the error surfaces when the result is read, naming the jit.
    Array pending = jit(diverge)(arange_f(4));
    CHECK_ERR(pending.block_until_ready(), CollectiveError, "jit '<lambda>': ", "finished the shard_map body while");
    CHECK_ERR(pending.item<float>(), CollectiveError, "finished the shard_map body while");  // at every read
  }
  CHECK_ERR(diverge(arange_f(4)), CollectiveError, "finished the shard_map body while");
  // Device 0 is busy for a while before the psum: the others time out.
  double saved = config::collective_timeout_seconds();
  config::set_collective_timeout_seconds(0.05);
  auto slow = shard_map(
      [](const Array& x) {
        Array y = lax::cond(
            lax::axis_index("i") == 0,
            [](const Array& v) {
              return lax::fori_loop(
                  0, 100000, [](const Array&, const Array& c) { return jnp::sin(c); }, v);
            },
            [](const Array& v) { return v; }, x);
        return lax::psum(y, "i");
      },
      mesh, P("i"), P("i"), {.check_vma = false});
  // Only a body on one thread per device runs ahead on one device (eagerly, and staged bodies
  // without collectives inside control flow, run each instruction for all devices in lockstep:
  // nothing waits, the result is simply late).
  if (!config::disable_jit()) {
    setenv("CJAX_SPMD_THREADS", "1", 1);
    CHECK_ERR(jit(slow)(arange_f(4)).block_until_ready(), CollectiveError, "timed out after");
    unsetenv("CJAX_SPMD_THREADS");
    config::set_collective_timeout_seconds(saved);
    std::vector<float> v = jit(slow)(arange_f(4)).to_vector<float>();
    CHECK(v.size() == 4);
    CHECK(v[1] == v[0]);
  }
  config::set_collective_timeout_seconds(saved);
}

TEST_CASE("golden jaxprs of staged shard_maps with varying-axes types") {
  Mesh mesh = make_mesh({4, 2}, {"x", "y"});
  auto f = shard_map([](const Array& a, const Array& b) { return lax::psum(jnp::dot(a, b), "y"); }, mesh,
                     {P("x", "y"), P("y", None)}, P("x", None));
  Mesh mi = make_mesh({4}, {"i"});
  auto b = shard_map([](const Array& x) { return x; }, mi, P(), P("i"));
  auto bl = [&](const Array& x) { return jnp::sum(b(x)); };
  auto c = shard_map([](const Array& x) { return lax::psum(x, "i"); }, mi, P("i"), P("i"), {.check_vma = false});
  auto k = [&](const Array& w) {
    return shard_map([&](const Array& x) { return w * x; }, mi, P("i"), P("i"))(jnp::ones({8}));
  };
  // matmul_basic (docs/examples.md §1)
  CHECK(text(make_jaxpr(f)(jnp::ones({8, 16}), jnp::ones({16, 4}))) ==
        "{ lambda ; a:f32[8,16] b:f32[16,4]. let\n"
        "    c:f32[8,4] = shard_map[\n"
        "      check_vma=True\n"
        "      in_specs=(P('x', 'y'), P('y', None))\n"
        "      jaxpr={ lambda ; d:f32[2,8]{V:x,y} e:f32[8,4]{V:y}. let\n"
        "          f:f32[8,4]{V:x,y} = pvary[axes=('x',)] e\n"
        "          g:f32[2,4]{V:x,y} = dot_general[\n"
        "            dimension_numbers=(([1], [0]), ([], []))\n"
        "            out_sharding=None\n"
        "            precision=None\n"
        "            preferred_element_type=float32\n"
        "          ] d f\n"
        "          h:f32[2,4]{V:x} = psum_invariant[axes=('y',)] g\n"
        "        in (h,) }\n"
        "      manual_axes=frozenset({'x', 'y'})\n"
        "      mesh=Mesh('x': 4, 'y': 2)\n"
        "      out_specs=(P('x', None),)\n"
        "    ] a b\n"
        "  in (c,) }");
  // example B forward: the body is one pvary
  CHECK(text(make_jaxpr(b)(jnp::ones({2}))) ==
        "{ lambda ; a:f32[2]. let\n"
        "    b:f32[8] = shard_map[\n"
        "      check_vma=True\n"
        "      in_specs=(P(),)\n"
        "      jaxpr={ lambda ; c:f32[2]. let\n"
        "          d:f32[2]{V:i} = pvary[axes=('i',)] c\n"
        "        in (d,) }\n"
        "      manual_axes=frozenset({'i'})\n"
        "      mesh=Mesh('i': 4)\n"
        "      out_specs=(P('i',),)\n"
        "    ] a\n"
        "  in (b,) }");
  // example B grad: the transposed body is one psum_invariant
  CHECK(text(make_jaxpr(grad(bl))(jnp::ones({2}))) ==
        "{ lambda ; a:f32[2]. let\n"
        "    b:f32[8] = shard_map[\n"
        "      check_vma=True\n"
        "      in_specs=(P(),)\n"
        "      jaxpr={ lambda ; c:f32[2]. let\n"
        "          d:f32[2]{V:i} = pvary[axes=('i',)] c\n"
        "        in (d,) }\n"
        "      manual_axes=frozenset({'i'})\n"
        "      mesh=Mesh('i': 4)\n"
        "      out_specs=(P('i',),)\n"
        "    ] a\n"
        "    _:f32[] = reduce_sum[axes=(0,) out_sharding=None] b\n"
        "    e:f32[8] = broadcast_in_dim[\n"
        "      broadcast_dimensions=()\n"
        "      shape=(8,)\n"
        "      sharding=None\n"
        "    ] 1.0:f32[]\n"
        "    f:f32[2] = shard_map[\n"
        "      check_vma=True\n"
        "      in_specs=(P('i',),)\n"
        "      jaxpr={ lambda ; g:f32[2]{V:i}. let\n"
        "          h:f32[2] = psum_invariant[axes=('i',)] g\n"
        "        in (h,) }\n"
        "      manual_axes=frozenset({'i'})\n"
        "      mesh=Mesh('i': 4)\n"
        "      out_specs=(P(),)\n"
        "    ] e\n"
        "  in (f,) }");
  // check_vma=false: no {V:} types, plain psum
  CHECK(text(make_jaxpr(c)(jnp::ones({4}))) ==
        "{ lambda ; a:f32[4]. let\n"
        "    b:f32[4] = shard_map[\n"
        "      check_vma=False\n"
        "      in_specs=(P('i',),)\n"
        "      jaxpr={ lambda ; c:f32[1]. let d:f32[1] = psum[axes=('i',)] c in (d,) }\n"
        "      manual_axes=frozenset({'i'})\n"
        "      mesh=Mesh('i': 4)\n"
        "      out_specs=(P('i',),)\n"
        "    ] a\n"
        "  in (b,) }");
  // a closed-over value becomes a P() input
  CHECK(text(make_jaxpr(k)(Array(2.f))) ==
        "{ lambda a:f32[8]; b:f32[]. let\n"
        "    c:f32[8] = shard_map[\n"
        "      check_vma=True\n"
        "      in_specs=(P(), P('i',))\n"
        "      jaxpr={ lambda ; d:f32[] e:f32[2]{V:i}. let\n"
        "          f:f32[]{V:i} = pvary[axes=('i',)] d\n"
        "          g:f32[2]{V:i} = mul f e\n"
        "        in (g,) }\n"
        "      manual_axes=frozenset({'i'})\n"
        "      mesh=Mesh('i': 4)\n"
        "      out_specs=(P('i',),)\n"
        "    ] b a\n"
        "  in (c,) }");
}

TEST_CASE("errors of docs/shard_map.md §1.7 and the out_specs check §2.4") {
  Mesh m = make_mesh({4, 2}, {"i", "j"});
  auto id = [](const Array& x) { return x; };
  // 2: unknown axis; 8 (D4): an axis named twice is rejected at construction.
  CHECK_ERR(shard_map(id, m, P("k"), P()), SpecError, "must refer to an axis marked as manual", "'k'");
  CHECK_ERR(shard_map(id, m, P(), P("k")), SpecError, "out_specs", "'k'");
  CHECK_ERR(shard_map(id, m, P("i", "i"), P()), SpecError, "duplicate entries for `i`");
  CHECK_ERR(shard_map(id, m, P(axes("i", "j"), "i"), P()), SpecError, "duplicate entries for `i`");
  // 3: specs not a tree prefix of the arguments.
  auto two = [](const Array& x, const Array& y) { return x + y; };
  CHECK_ERR(shard_map(two, m, {P("i")}, P("i"))(jnp::ones({8}), jnp::ones({8})), SpecError, "in_specs", "1 entries");
  auto pairf = [](const std::vector<Array>& xs) { return xs[0]; };
  CHECK_ERR(shard_map(pairf, m, {{P("i"), P("i"), P("i")}}, P("i"))(std::vector<Array>{jnp::ones({8}), jnp::ones({8})}),
            SpecError, "in_specs[0]", "not a tree prefix");
  // 4: spec longer than the argument's rank (with the scalar hint).
  CHECK_ERR(shard_map(id, m, P("i", "j"), P())(jnp::arange(4)), SpecError, "too long", "int32[4]", "(and 1 < 2)");
  CHECK_ERR(shard_map(id, m, P("i"), P())(Array(1.f)), SpecError, "too long", "use P() for it");
  // 5: divisibility, one failure and several.
  CHECK_ERR(shard_map(two, m, {P(), P("i")}, P())(jnp::ones({4}), jnp::ones({2, 2})), SpecError, "not evenly divisible",
            "The mesh given has shape (4, 2) with corresponding axis names ('i', 'j').", "args[1]",
            "maps array axis 0 (of size 2) to mesh axis 'i' (of size 4), but 4 does not evenly divide 2");
  CHECK_ERR(shard_map(two, m, {P(axes("i", "j")), P("i")}, P())(jnp::ones({4}), jnp::ones({2})), SpecError,
            "* the passed args[0]", "mesh axes ('i', 'j') (of total size 8)", "* the passed args[1]");
  // 6: out spec longer than the output's rank.
  CHECK_ERR(shard_map([](const Array& x) { return jnp::sum(x); }, m, P("i"), P("i"))(jnp::ones({8})), SpecError,
            "out_specs entry which is too long", "scalar", "x[None]");
  // 7 (§2.4): the replication check, eagerly and when staged.
  Mesh mi = make_mesh({4}, {"i"});
  auto varying = shard_map(id, mi, P("i"), P());
  CHECK_ERR(varying(jnp::ones({8})), VmaError, "statically inferred", "require replication",
            "out_specs[0] is P() which implies that the corresponding output value is replicated across mesh axis "
            "'i', but could not infer replication over any axes");
  CHECK_ERR(jit(varying)(jnp::ones({8})), VmaError, "require replication");
  Mesh m3 = make_mesh({2, 2, 2}, {"x", "y", "z"});
  auto f3 = shard_map(id, m3, P(axes("x", "y", "z")), P("x"));
  CHECK_ERR(f3(jnp::ones({8})), VmaError,
            "The mesh given has shape (2, 2, 2) with corresponding axis names ('x', 'y', 'z').",
            "only varying across mesh axes {x} and not {y,z}, but it was inferred to be possibly varying over {x,y,z}");
  auto both = shard_map([](const Array& x) { return std::tuple{x, x}; }, m, P("i"), {P(), P()});
  CHECK_ERR(both(jnp::ones({8})), VmaError, "* out_specs[0]", "* out_specs[1]");
  // all_gather stays varying; psum and all_gather(to_invariant) are invariant; check_vma=false accepts.
  CHECK_ERR(shard_map([](const Array& x) { return lax::all_gather(x, "i", {.tiled = true}); }, m, P("i"),
                      P())(jnp::ones({8})),
            VmaError, "require replication");
  CHECK(shard_map([](const Array& x) { return lax::psum(x, "i"); }, m, P("i"), P())(jnp::ones({8})).shape() ==
        Shape{2});
  CHECK(shard_map([](const Array& x) { return lax::all_gather(x, "i", {.tiled = true, .to_invariant = true}); }, m,
                  P("i"), P())(jnp::ones({8}))
            .shape() == Shape{8});
  CHECK(shard_map(id, m, P("i"), P(), {.check_vma = false})(jnp::ones({8})).shape() == Shape{2});
  // 9, 11: collectives and pvary outside shard_map; 10: collective-specific messages.
  CHECK_ERR(lax::psum(jnp::ones({2}), "i"), AxisNameError, "unbound axis name: i");
  CHECK_ERR(lax::pvary(jnp::ones({2}), "i"), ValueError, "pvary should be called under shard_map.");
  auto body = [&](std::function<Array(const Array&)> g, int64_t n) {
    return shard_map(g, mi, P("i"), P("i"))(jnp::ones({n}));
  };
  CHECK_ERR(body([](const Array& x) { return lax::all_to_all(x, "i", 0, 0, {.tiled = true}); }, 24), ValueError,
            "The size of all_to_all split_axis (6) has to be divisible by the size of the named axis i (4)");
  CHECK_ERR(body([](const Array& x) { return lax::all_to_all(x, "i", 0, 0); }, 32), ValueError,
            "all_to_all requires the size of the mapped axis i to equal x.shape[split_axis], but they are 4 and 8");
  CHECK_ERR(body([](const Array& x) { return lax::psum_scatter(x, "i", {.tiled = true}); }, 24), ValueError,
            "tiled reduce_scatter operand scatter dimension size 6 must be divisible by shard_count 4");
  CHECK_ERR(body([](const Array& x) { return lax::psum_scatter(x, "i"); }, 12), ValueError,
            "reduce_scatter operand scatter dimension size 3 must match shard count 4");
  CHECK_ERR(body(
                [](const Array& x) {
                  return lax::ppermute(x, "i", {{0, 1}, {0, 2}});
                },
                4),
            ValueError, "ppermute sources and destinations must be unique, got ((0, 1), (0, 2)).");
  // Partially manual: only "i" is manual; naming "j" or reducing over it is an error.
  CHECK_ERR(shard_map(id, m, P("j"), P("j"), {.axis_names = {"i"}}), SpecError, "marked as manual", "'j'");
  CHECK_ERR(shard_map([](const Array& x) { return lax::psum(x, "j"); }, m, P("i"), P("i"),
                      {.axis_names = {"i"}})(jnp::ones({8})),
            AxisNameError, "unbound axis name: j");
  CHECK(shard_map([](const Array& x) { return lax::psum(x, "i"); }, m, P("i"), P(), {.axis_names = {"i"}})(arange_f(8))
            .to_vector<float>() == std::vector<float>{12, 16});
}

TEST_CASE("large reductions take the chunked path and agree bit for bit with the small one") {
  Mesh mesh = make_mesh({8}, {"i"});
  Array x = random::normal(random::key(7), {8 * 4096});
  auto sum = jit(shard_map([](const Array& b) { return lax::psum(b, "i"); }, mesh, P("i"), P()));
  auto mx = jit(shard_map([](const Array& b) { return lax::pmax(b, "i"); }, mesh, P("i"), P()));
  std::vector<float> xs = x.to_vector<float>(), want_sum(4096, 0.f), want_max(4096, -1e30f);
  for (int d = 0; d < 8; ++d)
    for (int k = 0; k < 4096; ++k) {
      want_sum[size_t(k)] += xs[size_t(d * 4096 + k)];
      want_max[size_t(k)] = std::max(want_max[size_t(k)], xs[size_t(d * 4096 + k)]);
    }
  CHECK(sum(x).to_vector<float>() == want_sum);  // member order, like the loop above
  CHECK(mx(x).to_vector<float>() == want_max);
  auto eager = shard_map([](const Array& b) { return lax::psum(b, "i"); }, mesh, P("i"), P());
  CHECK(eager(x).to_vector<float>() == want_sum);
}

TEST_CASE("D2: psum over varying and invariant axes together is total") {
  Mesh mesh = make_mesh({2, 2}, {"i", "j"});
  // x varies over i only; psum over (i, j) = size_j * sum over i.
  auto f = shard_map([](const Array& x) { return lax::psum(x, {"i", "j"}); }, mesh, P("i"), P());
  CHECK(f(arange_f(4)).to_vector<float>() == std::vector<float>{2 * (0 + 2), 2 * (1 + 3)});
  CHECK(jit(f)(arange_f(4)).to_vector<float>() == std::vector<float>{4, 8});
  std::string text = make_jaxpr(f)(arange_f(4)).str();
  CHECK(text.find("pvary[axes=('j',)]") != std::string::npos);
  CHECK(text.find("psum_invariant[axes=('i', 'j')]") != std::string::npos);
}

TEST_CASE("static arguments with a None in_spec are passed through untouched") {
  Mesh mesh = make_mesh({4}, {"i"});
  std::vector<Shape> seen;
  auto f = shard_map(
      [&](const Array& x, int k, const std::string& tag) {
        seen.push_back(x.shape());
        return tag == "neg" ? x * float(-k) : x * float(k);
      },
      mesh, {P("i"), None, None}, P("i"));
  CHECK(f(arange_f(8), 3, std::string("pos")).to_vector<float>() == std::vector<float>{0, 3, 6, 9, 12, 15, 18, 21});
  CHECK(f(arange_f(8), 2, std::string("neg")).to_vector<float>() ==
        std::vector<float>{0, -2, -4, -6, -8, -10, -12, -14});
  CHECK(seen.back() == Shape{2});
  auto g = [&](const Array& x, int k) { return f(x, k, std::string("pos")); };
  CHECK(jit(g)(arange_f(8), 5).to_vector<float>() == std::vector<float>{0, 5, 10, 15, 20, 25, 30, 35});
  CHECK(jit(g)(arange_f(8), 1).to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(grad([&](const Array& x) { return jnp::sum(f(x, 4, std::string("neg"))); })(arange_f(8)).to_vector<float>() ==
        std::vector<float>(8, -4.f));
  // A static argument needs None: a P for it is an error naming the entry.
  auto bad = shard_map([](const Array& x, int k) { return x * float(k); }, mesh, {P("i"), P()}, P("i"));
  CHECK_ERR(bad(arange_f(8), 2), SpecError, "in_specs[1]", "static", "None");
}

TEST_CASE("out_specs can transpose blocks (docs/shard_map.md §1.5)") {
  Mesh mesh = make_mesh({2, 2}, {"x", "y"});
  Array x = jnp::arange(16).reshape({4, 4});
  auto f = shard_map([](const Array& b) { return b; }, mesh, P("x", "y"), P("y", "x"));
  std::vector<int> want{0, 1, 8, 9, 4, 5, 12, 13, 2, 3, 10, 11, 6, 7, 14, 15};
  CHECK(f(x).to_vector<int>() == want);
  CHECK(jit(f)(x).to_vector<int>() == want);
  CHECK(f(x).sharding().str() == "NamedSharding(mesh=Mesh('x': 2, 'y': 2), spec=P('y', 'x'), memory_kind=device)");
  // Its gradient transposes the blocks back.
  Array w = jnp::arange(16).reshape({4, 4}).astype(f32);
  Array g = grad([&](const Array& a) { return jnp::sum(f(a) * w); })(x.astype(f32));
  std::vector<float> gw;
  for (int v : std::vector<int>{0, 1, 8, 9, 4, 5, 12, 13, 2, 3, 10, 11, 6, 7, 14, 15}) gw.push_back(float(v));
  // The element at position p of f's output is x[want[p]], so d/dx[want[p]] = w[p]: g[want[p]] = p.
  std::vector<float> expect(16);
  for (size_t p = 0; p < 16; ++p) expect[size_t(want[p])] = float(p);
  CHECK(g.to_vector<float>() == expect);
}

TEST_CASE("a tuple entry splits row-major in the order written, and prints per 2-D coordinate") {
  Mesh mesh = make_mesh({2, 2}, {"x", "y"});
  Array x = arange_f(8);
  std::string xy, yx;
  auto fxy = shard_map(
      [&](const Array& b) {
        xy = to_string(b);
        return b;
      },
      mesh, P(axes("x", "y")), P(axes("x", "y")));
  auto fyx = shard_map(
      [&](const Array& b) {
        yx = to_string(b);
        return b;
      },
      mesh, P(axes("y", "x")), P(axes("y", "x")));
  CHECK(fxy(x).to_vector<float>() == x.to_vector<float>());
  CHECK(fyx(x).to_vector<float>() == x.to_vector<float>());
  CHECK(xy ==
        "On cpu:0 at mesh coordinates (x, y) = (0, 0):\n[0. 1.]\n\nOn cpu:1 at mesh coordinates (x, y) = (0, 1):\n[2. "
        "3.]\n\n"
        "On cpu:2 at mesh coordinates (x, y) = (1, 0):\n[4. 5.]\n\nOn cpu:3 at mesh coordinates (x, y) = (1, 1):\n[6. "
        "7.]");
  CHECK(yx ==
        "On cpu:0 at mesh coordinates (x, y) = (0, 0):\n[0. 1.]\n\nOn cpu:1 at mesh coordinates (x, y) = (0, 1):\n[4. "
        "5.]\n\n"
        "On cpu:2 at mesh coordinates (x, y) = (1, 0):\n[2. 3.]\n\nOn cpu:3 at mesh coordinates (x, y) = (1, 1):\n[6. "
        "7.]");
  // Sliced one way, assembled the other: device (x, y) holds block 2x+y and is placed at 2y+x.
  auto swap = shard_map([](const Array& b) { return b; }, mesh, P(axes("x", "y")), P(axes("y", "x")));
  CHECK(swap(x).to_vector<float>() == std::vector<float>{0, 1, 4, 5, 2, 3, 6, 7});
  CHECK(jit(swap)(x).to_vector<float>() == std::vector<float>{0, 1, 4, 5, 2, 3, 6, 7});
}

TEST_CASE("C++ control flow on body values: invariant is concrete, varying is a ConcretizationError") {
  Mesh mesh = make_mesh({2, 2}, {"x", "y"});
  auto f = shard_map(
      [](const Array& b) {
        Array total = lax::psum(jnp::sum(b), {"x", "y"});
        if (total > 0.f) return b * 2.f;
        return b * 3.f;
      },
      mesh, P(axes("x", "y")), P(axes("x", "y")));
  CHECK(f(arange_f(8)).to_vector<float>() == std::vector<float>{0, 2, 4, 6, 8, 10, 12, 14});
  CHECK(f(-arange_f(8) - 1.f).to_vector<float>() == std::vector<float>{-3, -6, -9, -12, -15, -18, -21, -24});
  auto read = shard_map(
      [](const Array& b) {
        return b * lax::psum(jnp::sum(b), {"x", "y"}).item<float>();
      },
      mesh, P(axes("x", "y")), P(axes("x", "y")));
  CHECK(read(arange_f(8)).to_vector<float>() == std::vector<float>{0, 28, 56, 84, 112, 140, 168, 196});
  // Varying over y only (the psum removed x): not one value.
  auto partial = shard_map(
      [](const Array& b) {
        if (lax::psum(jnp::sum(b), "x") > 0.f) return b;
        return -b;
      },
      mesh, P(axes("x", "y")), P(axes("x", "y")));
  CHECK_ERR(partial(arange_f(8)), ConcretizationError, "varies over mesh axes {y}");
  auto varying = shard_map(
      [](const Array& b) {
        if (jnp::sum(b) > 0.f) return b;
        return -b;
      },
      mesh, P(axes("x", "y")), P(axes("x", "y")));
  CHECK_ERR(varying(arange_f(8)), ConcretizationError, "varies over mesh axes {x,y}");
  // With check_vma=false nothing is known to be invariant.
  auto unchecked = shard_map(
      [](const Array& b) {
        if (lax::psum(jnp::sum(b), {"x", "y"}) > 0.f) return b;
        return -b;
      },
      mesh, P(axes("x", "y")), P(axes("x", "y")), {.check_vma = false});
  CHECK_ERR(unchecked(arange_f(8)), ConcretizationError, "check_vma=false");
}

TEST_CASE("more errors: out_specs tree prefix, mesh and axis_names, pvary, mismatched collectives") {
  Mesh m = make_mesh({4, 2}, {"i", "j"});
  Mesh mi = make_mesh({4}, {"i"});
  auto id = [](const Array& x) { return x; };
  // out_specs not a tree prefix of the outputs.
  auto pair = shard_map([](const Array& x) { return std::tuple{x, x}; }, mi, P("i"), {P("i"), P("i"), P("i")});
  CHECK_ERR(pair(jnp::ones({8})), SpecError, "out_specs", "not a tree prefix");
  CHECK_ERR(jit(pair)(jnp::ones({8})), SpecError, "out_specs", "not a tree prefix");
  auto nested = shard_map(
      [](const Array& x) {
        return std::tuple{x, std::vector<Array>{x, x}};
      },
      mi, P("i"), {P("i"), {P("i")}});
  CHECK_ERR(nested(jnp::ones({8})), SpecError, "out_specs[1]", "not a tree prefix");
  // An empty mesh; axis_names that are not mesh axes.
  CHECK_ERR(shard_map(id, Mesh(), P(), P()), SpecError, "shard_map requires a non-empty mesh");
  CHECK_ERR(shard_map(id, m, P(), P(), {.axis_names = {"i", "k"}}), SpecError,
            "shard_map requires axis_names=frozenset({'i', 'k'}) to be a subset of mesh.axis_names=frozenset({'i', "
            "'j'})");
  // pvary over an axis the value already varies over.
  auto twice = shard_map([](const Array& x) { return lax::pvary(x, "i"); }, mi, P("i"), P("i"));
  CHECK_ERR(twice(jnp::ones({8})), VmaError, "pvary is an invariant->varying cast", "axis 'i'");
  CHECK_ERR(jit(twice)(jnp::ones({8})), VmaError, "pvary is an invariant->varying cast", "axis 'i'");
  auto partly = shard_map([](const Array& x) { return lax::pvary(x, {"j", "i"}); }, m, P("i"), P("i", "j"));
  CHECK_ERR(partly(jnp::ones({8, 2})), VmaError, "axis 'i'");
  CHECK(
      shard_map([](const Array& x) { return lax::pvary(x, "j"); }, m, P("i"), P("i", "j"))(jnp::ones({8, 2})).shape() ==
      Shape{8, 4});
  // Devices that reach different collectives (device 0 a psum, the others a pmax).
  auto mismatch = shard_map(
      [](const Array& x) {
        return lax::cond(
            lax::axis_index("i") == 0, [](const Array& v) { return lax::psum(v, "i"); },
            [](const Array& v) { return lax::pmax(v, "i"); }, x);
      },
      mi, P("i"), P("i"), {.check_vma = false});
  CHECK_ERR(jit(mismatch)(arange_f(4)).block_until_ready(), CollectiveError, "arrived at different collectives",
            "device 0: psum", "device 1: pmax");
  CHECK_ERR(mismatch(arange_f(4)), CollectiveError, "arrived at different collectives");
  // The communicator is usable again afterwards.
  auto ok = shard_map([](const Array& x) { return lax::psum(x, "i"); }, mi, P("i"), P());
  CHECK(jit(ok)(arange_f(4)).to_vector<float>() == std::vector<float>{6});
}

TEST_CASE("an eager shard_map times out at a collective that a slow device reaches late") {
  Mesh mesh = make_mesh({4}, {"i"});
  double saved = config::collective_timeout_seconds();
  config::set_collective_timeout_seconds(0.01);
  // Eagerly, a cond whose branches hold collectives runs as one SPMD program: device 0 loops
  // (about 0.2 s) before its psum while the others wait.
  auto slow = shard_map(
      [](const Array& x) {
        return lax::cond(
            lax::axis_index("i") == 0,
            [](const Array& v) {
              return lax::psum(lax::fori_loop(
                                   0, 300000, [](const Array&, const Array& c) { return jnp::sin(c); }, v),
                               "i");
            },
            [](const Array& v) { return lax::psum(v, "i"); }, x);
      },
      mesh, P("i"), P("i"), {.check_vma = false});
  CHECK_ERR(slow(arange_f(4)), CollectiveError, "timed out after 0.01 s", "psum");
  config::set_collective_timeout_seconds(saved);
  // After the failure, eager collectives run again.
  auto sum = shard_map(
      [](const Array& x) {
        return lax::cond(
            lax::axis_index("i") == 0, [](const Array& v) { return lax::psum(v, "i"); },
            [](const Array& v) { return lax::psum(v, "i"); }, x);
      },
      mesh, P("i"), P("i"), {.check_vma = false});
  CHECK(sum(arange_f(4)).to_vector<float>() == std::vector<float>{6, 6, 6, 6});
}
