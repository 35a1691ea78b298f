// Collectives inside shard_map beyond the tutorial (docs/shard_map.md §1.2, §1.6, §2.2, §3.3):
// pmax/pmin and pbroadcast (values, types, derivatives), the tree overloads of
// cjax/collectives.h, collectives over several axes in both name orders, the untiled forms of
// psum_scatter and all_to_all, and vmap / jvp of shard_maps whose bodies move data.
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <thread>
#include <tuple>

#include "backends/cpu/buffer_communicator.h"
#include "core/array/array_impl.h"
#include "core/backend/backend.h"
#include "core/spmd/collectives.h"
#include "jit/executable.h"
#include "jit/schedule_collectives.h"
#include "test_util.h"
#include "trace/shard_map.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {
Array arange_f(int64_t n) { return jnp::arange(n).astype(f32); }
std::vector<float> fv(const Array& a) { return a.astype(f32).to_vector<float>(); }
Mesh mesh_i(int n = 4) { return make_mesh({n}, {"i"}); }
Mesh mesh_ij() { return make_mesh({2, 2}, {"i", "j"}); }
Array tutorial_vector() { return jnp::array(std::vector<float>{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 1, 2}); }
// `want` repeated `times` times.
std::vector<float> repeat(const std::vector<float>& want, int times) {
  std::vector<float> out;
  for (int k = 0; k < times; ++k) out.insert(out.end(), want.begin(), want.end());
  return out;
}
}  // namespace

TEST_CASE("pmax and pmin: group-wise max and min, invariant results") {
  Mesh m = mesh_i();
  Array x = tutorial_vector();  // blocks [3,1,4,1] [5,9,2,6] [5,3,5,8] [9,7,1,2]
  auto mx = shard_map([](const Array& b) { return lax::pmax(b, "i"); }, m, P("i"), P());
  auto mn = shard_map([](const Array& b) { return lax::pmin(b, "i"); }, m, P("i"), P());
  CHECK(fv(mx(x)) == std::vector<float>{9, 9, 5, 8});
  CHECK(fv(mn(x)) == std::vector<float>{3, 1, 1, 1});
  CHECK(fv(jit(mx)(x)) == std::vector<float>{9, 9, 5, 8});
  CHECK(fv(jit(mn)(x)) == std::vector<float>{3, 1, 1, 1});
  // Integers, and over two axes / one of two axes of a 2-D mesh.
  Array xi = jnp::arange(16).reshape({4, 4});
  auto mx2 = shard_map([](const Array& b) { return lax::pmax(b, {"i", "j"}); }, mesh_ij(), P("i", "j"), P());
  auto mn2 = shard_map([](const Array& b) { return lax::pmin(b, {"j", "i"}); }, mesh_ij(), P("i", "j"), P());
  CHECK(mx2(xi).to_vector<int>() == std::vector<int>{10, 11, 14, 15});
  CHECK(mn2(xi).to_vector<int>() == std::vector<int>{0, 1, 4, 5});
  CHECK(jit(mn2)(xi).to_vector<int>() == std::vector<int>{0, 1, 4, 5});
  auto mxj = shard_map([](const Array& b) { return lax::pmax(b, "j"); }, mesh_ij(), P("i", "j"), P("i", None));
  CHECK(mxj(xi).to_vector<int>() == std::vector<int>{2, 3, 6, 7, 10, 11, 14, 15});
  CHECK(jit(mxj)(xi).to_vector<int>() == std::vector<int>{2, 3, 6, 7, 10, 11, 14, 15});
  // Of an invariant operand: every copy is the same, so the value is unchanged.
  auto inv = shard_map([](const Array& b) { return lax::pmin(b * 2.f, "i"); }, m, P(), P());
  CHECK(fv(inv(arange_f(3))) == std::vector<float>{0, 2, 4});
  CHECK(fv(jit(inv)(arange_f(3))) == std::vector<float>{0, 2, 4});
  // The staged types: the result is invariant over the reduced axis.
  std::string text = make_jaxpr(mn)(x).str();
  CHECK(text.find("f32[4] = pmin[axes=('i',)]") != std::string::npos);
}

TEST_CASE("pmax and pmin have no derivative") {
  auto mx = shard_map([](const Array& b) { return lax::pmax(b, "i"); }, mesh_i(), P("i"), P());
  auto mn = shard_map([](const Array& b) { return lax::pmin(b, "i"); }, mesh_i(), P("i"), P());
  auto lmx = [&](const Array& x) { return jnp::sum(mx(x)); };
  auto lmn = [&](const Array& x) { return jnp::sum(mn(x)); };
  CHECK_ERR(grad(lmx)(arange_f(8)), Error, "Differentiation rule for 'pmax' not implemented");
  CHECK_ERR(grad(lmn)(arange_f(8)), Error, "Differentiation rule for 'pmin' not implemented");
  CHECK_ERR(jvp(mn, std::tuple{arange_f(8)}, std::tuple{jnp::ones({8})}), Error,
            "Differentiation rule for 'pmin' not implemented", "stop_gradient");
  CHECK_ERR(jit(grad(lmn))(arange_f(8)), Error, "Differentiation rule for 'pmin' not implemented");
  // stop_gradient on the input is the way out: the gradient is zero.
  auto stopped = [&](const Array& x) { return jnp::sum(mn(lax::stop_gradient(x))) + jnp::sum(x); };
  CHECK(fv(grad(stopped)(arange_f(8))) == std::vector<float>(8, 1.f));
}

TEST_CASE("pbroadcast: every member gets the source's block, typed varying") {
  Mesh m = mesh_i();
  auto f = shard_map([](const Array& b) { return lax::pbroadcast(b, "i", 2); }, m, P("i"), P("i"));
  CHECK(fv(f(arange_f(8))) == std::vector<float>{4, 5, 4, 5, 4, 5, 4, 5});
  CHECK(fv(jit(f)(arange_f(8))) == std::vector<float>{4, 5, 4, 5, 4, 5, 4, 5});
  // The result stays varying (§2.2): it cannot be returned as replicated, and the staged type says so.
  auto rep = shard_map([](const Array& b) { return lax::pbroadcast(b, "i", 0); }, m, P("i"), P());
  CHECK_ERR(rep(arange_f(8)), VmaError, "require replication");
  CHECK_ERR(jit(rep)(arange_f(8)), VmaError, "require replication");
  std::string text = make_jaxpr(f)(arange_f(8)).str();
  CHECK(text.find("f32[2]{V:i} = pbroadcast[axes=('i',) source=2]") != std::string::npos);
  // With check_vma=false the promise is the user's: P() takes one copy.
  auto unchecked =
      shard_map([](const Array& b) { return lax::pbroadcast(b, "i", 3); }, m, P("i"), P(), {.check_vma = false});
  CHECK(fv(unchecked(arange_f(8))) == std::vector<float>{6, 7});
  // Over two axes: the source is a row-major index over the axes as written.
  Array x = arange_f(8);
  auto ij = shard_map(
      [](const Array& b) {
        return lax::pbroadcast(b, {"i", "j"}, 1);
      },
      mesh_ij(), P(axes("i", "j")), P(axes("i", "j")));
  auto ji = shard_map(
      [](const Array& b) {
        return lax::pbroadcast(b, {"j", "i"}, 1);
      },
      mesh_ij(), P(axes("i", "j")), P(axes("i", "j")));
  CHECK(fv(ij(x)) == repeat({2, 3}, 4));  // index 1 over (i, j) is device (0, 1): block 1
  CHECK(fv(ji(x)) == repeat({4, 5}, 4));  // index 1 over (j, i) is device (1, 0): block 2
  CHECK(fv(jit(ji)(x)) == repeat({4, 5}, 4));
  // Of an invariant operand: a pvary first, the same values.
  auto inv = shard_map([](const Array& b) { return lax::pbroadcast(b, "i", 1); }, m, P(), P("i"));
  CHECK(fv(inv(arange_f(2))) == repeat({0, 1}, 4));
}

TEST_CASE("pbroadcast transposes to a psum kept at the source") {
  Mesh m = mesh_i();
  auto f = shard_map([](const Array& b) { return lax::pbroadcast(b, "i", 2); }, m, P("i"), P("i"));
  Array w = arange_f(8) + 1.f;  // cotangent blocks [1,2] [3,4] [5,6] [7,8]: psum [16,20]
  auto loss = [&](const Array& x) { return jnp::sum(f(x) * w); };
  std::vector<float> want{0, 0, 0, 0, 16, 20, 0, 0};
  CHECK(fv(grad(loss)(arange_f(8))) == want);
  CHECK(fv(jit(grad(loss))(arange_f(8))) == want);
  // jvp: pbroadcast is linear, the tangent is broadcast from the source too.
  auto [y, t] = jvp(f, std::tuple{arange_f(8)}, std::tuple{w});
  CHECK(fv(y) == std::vector<float>{4, 5, 4, 5, 4, 5, 4, 5});
  CHECK(fv(t) == std::vector<float>{5, 6, 5, 6, 5, 6, 5, 6});
  // An invariant input: every instance's cotangent flows to the one input, psum'd once.
  auto g = shard_map([](const Array& b) { return lax::pbroadcast(b, "i", 1); }, m, P(), P("i"));
  CHECK(fv(grad([&](const Array& x) { return jnp::sum(g(x) * w); })(arange_f(2))) == std::vector<float>{16, 20});
  // check_vma=false: the same numbers.
  auto h =
      shard_map([](const Array& b) { return lax::pbroadcast(b, "i", 2); }, m, P("i"), P("i"), {.check_vma = false});
  CHECK(fv(grad([&](const Array& x) { return jnp::sum(h(x) * w); })(arange_f(8))) == want);
}

TEST_CASE("collectives on trees apply to every leaf") {
  Mesh m = mesh_i();
  Array a = arange_f(8), b = arange_f(8) * 10.f;
  auto ps = shard_map([](const std::vector<Array>& xs) { return lax::psum(xs, "i"); }, m, P("i"), P());
  std::vector<Array> r = ps(std::vector<Array>{a, b});
  REQUIRE(r.size() == 2);
  CHECK(fv(r[0]) == std::vector<float>{12, 16});
  CHECK(fv(r[1]) == std::vector<float>{120, 160});
  using Map = std::map<std::string, Array>;
  auto stats = shard_map(
      [](const Map& d) {
        return std::tuple{lax::pmean(d, "i"), lax::pmax(d, "i"), lax::pmin(d, "i")};
      },
      m, P("i"), P());
  auto [mean, mx, mn] = stats(Map{{"a", a}, {"b", b}});
  CHECK(fv(mean.at("a")) == std::vector<float>{3, 4});
  CHECK(fv(mean.at("b")) == std::vector<float>{30, 40});
  CHECK(fv(mx.at("a")) == std::vector<float>{6, 7});
  CHECK(fv(mn.at("b")) == std::vector<float>{0, 10});
  auto moves = shard_map(
      [](const std::tuple<Array, Array>& t) {
        auto g = lax::all_gather(t, "i", {.tiled = true});
        auto s = lax::psum_scatter(t, "i", {.tiled = true});
        auto p = lax::ppermute(t, "i", {{0, 1}, {1, 2}, {2, 3}, {3, 0}});
        auto x = lax::all_to_all(t, "i", 0, 0, {.tiled = true});
        auto c = lax::pbroadcast(t, "i", 3);
        return std::vector<Array>{std::get<0>(g), std::get<1>(g), std::get<0>(s), std::get<1>(s), std::get<0>(p),
                                  std::get<1>(p), std::get<0>(x), std::get<1>(x), std::get<0>(c), std::get<1>(c)};
      },
      m, P("i"), P("i"));
  Array a16 = arange_f(16), b16 = arange_f(16) * -1.f;
  for (bool jitted : {false, true}) {
    CAPTURE(jitted);
    std::vector<Array> o = jitted ? jit(moves)(std::tuple{a16, b16}) : moves(std::tuple{a16, b16});
    REQUIRE(o.size() == 10);
    std::vector<float> av = fv(a16), bv = fv(b16);
    CHECK(fv(o[0]) == repeat(av, 4));
    CHECK(fv(o[1]) == repeat(bv, 4));
    CHECK(fv(o[2]) == std::vector<float>{24, 28, 32, 36});
    CHECK(fv(o[3]) == std::vector<float>{-24, -28, -32, -36});
    CHECK(fv(o[4]) == std::vector<float>{12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
    CHECK(fv(o[6]) == std::vector<float>{0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15});
    CHECK(fv(o[7]) == fv(-o[6]));
    CHECK(fv(o[8]) == repeat({12, 13, 14, 15}, 4));
    CHECK(fv(o[9]) == repeat({-12, -13, -14, -15}, 4));
  }
  // pvary on a tree, and a tree gradient through psum.
  auto pv = shard_map([](const std::vector<Array>& xs) { return lax::pvary(xs, "i"); }, m, P(), P("i"));
  std::vector<Array> tiled = pv(std::vector<Array>{arange_f(2), arange_f(2) + 5.f});
  CHECK(fv(tiled[1]) == repeat({5, 6}, 4));
  auto tree_loss = [&](const std::vector<Array>& xs) {
    std::vector<Array> s = ps(xs);
    return jnp::sum(s[0]) + 2.f * jnp::sum(s[1]);
  };
  std::vector<Array> g = grad(tree_loss)(std::vector<Array>{a, b});
  CHECK(fv(g[0]) == std::vector<float>(8, 1));
  CHECK(fv(g[1]) == std::vector<float>(8, 2));
}

TEST_CASE("collectives over two axes are row-major in the order the names are written") {
  Mesh m = mesh_ij();
  Array x = arange_f(8);  // P(('i','j')): device (i, j) holds block 2i+j
  auto index = [&](AxisNames names) {
    return shard_map([names](const Array&) { return jnp::expand_dims(lax::axis_index(names), 0); }, m, P(),
                     P(axes("i", "j")))(x);
  };
  CHECK(index({"i", "j"}).to_vector<int>() == std::vector<int>{0, 1, 2, 3});
  CHECK(index({"j", "i"}).to_vector<int>() == std::vector<int>{0, 2, 1, 3});
  CHECK(index("j").to_vector<int>() == std::vector<int>{0, 1, 0, 1});
  CHECK(jit([&](const Array& y) {
          return shard_map(
              [](const Array&) {
                return jnp::expand_dims(lax::axis_index({"j", "i"}), 0);
              },
              m, P(), P(axes("i", "j")))(y);
        })(x)
            .to_vector<int>() == std::vector<int>{0, 2, 1, 3});
  CHECK(shard_map(
            [](const Array& b) {
              return b * float(lax::axis_size({"i", "j"}));
            },
            m, P(), P())(Array(1.f))
            .item<float>() == 4.f);

  auto gather = [&](AxisNames names) {
    return shard_map([names](const Array& b) { return lax::all_gather(b, names, {.tiled = true}); }, m,
                     P(axes("i", "j")), P(axes("i", "j")));
  };
  CHECK(fv(gather({"i", "j"})(x)) == repeat({0, 1, 2, 3, 4, 5, 6, 7}, 4));
  CHECK(fv(gather({"j", "i"})(x)) == repeat({0, 1, 4, 5, 2, 3, 6, 7}, 4));
  CHECK(fv(jit(gather({"j", "i"}))(x)) == repeat({0, 1, 4, 5, 2, 3, 6, 7}, 4));
  // Untiled: a new leading axis of size 4.
  auto stacked = shard_map(
      [](const Array& b) {
        return lax::all_gather(b, {"i", "j"});
      },
      m, P(axes("i", "j")), P(None, axes("i", "j")));
  Array s = stacked(x);
  CHECK(s.shape() == Shape{4, 8});
  CHECK(fv(s) == std::vector<float>{0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 2, 3, 2, 3, 2, 3,
                                    4, 5, 4, 5, 4, 5, 4, 5, 6, 7, 6, 7, 6, 7, 6, 7});

  auto shift = [&](AxisNames names) {
    return shard_map(
        [names](const Array& b) {
          return lax::ppermute(b, names, {{0, 1}, {1, 2}, {2, 3}, {3, 0}});
        },
        m, P(axes("i", "j")), P(axes("i", "j")));
  };
  CHECK(fv(shift({"i", "j"})(x)) == std::vector<float>{6, 7, 0, 1, 2, 3, 4, 5});
  CHECK(fv(jit(shift({"i", "j"}))(x)) == std::vector<float>{6, 7, 0, 1, 2, 3, 4, 5});

  Array x16 = arange_f(16);
  auto a2a = [&](AxisNames names) {
    return shard_map([names](const Array& b) { return lax::all_to_all(b, names, 0, 0, {.tiled = true}); }, m,
                     P(axes("i", "j")), P(axes("i", "j")));
  };
  std::vector<float> transposed{0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
  CHECK(fv(a2a({"i", "j"})(x16)) == transposed);
  CHECK(fv(jit(a2a({"i", "j"}))(x16)) == transposed);
  // Over (j, i): member t = 2j+i receives chunk t of every member, ordered by t.
  // Device (i, j) holds block 2i+j = [4b .. 4b+3]; members in (j, i) order hold blocks 0, 2, 1, 3.
  CHECK(fv(a2a({"j", "i"})(x16)) == std::vector<float>{0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15});

  auto scatter = [&](AxisNames names) {
    return shard_map([names](const Array& b) { return lax::psum_scatter(b, names, {.tiled = true}); }, m,
                     P(axes("i", "j")), P(axes("i", "j")));
  };
  CHECK(fv(scatter({"i", "j"})(x16)) == std::vector<float>{24, 28, 32, 36});
  CHECK(fv(scatter({"j", "i"})(x16)) == std::vector<float>{24, 32, 28, 36});
  CHECK(fv(jit(scatter({"j", "i"}))(x16)) == std::vector<float>{24, 32, 28, 36});
  // psum's value does not depend on the order.
  auto total = [&](AxisNames names) {
    return shard_map([names](const Array& b) { return lax::psum(b, names); }, m, P(axes("i", "j")), P());
  };
  CHECK(fv(total({"j", "i"})(x)) == std::vector<float>{12, 16});
  CHECK(fv(total({"i", "j"})(x)) == std::vector<float>{12, 16});
}

TEST_CASE("untiled psum_scatter and all_to_all") {
  Mesh m = mesh_i();
  // Blocks f32[4,2]: x[4k+r, c] = 8k+2r+c; the sum S[r, c] = 48+8r+4c; member k gets row k.
  Array x = arange_f(32).reshape({16, 2});
  auto ps = shard_map([](const Array& b) { return lax::psum_scatter(b, "i"); }, m, P("i"), P("i"));
  std::vector<float> want{48, 52, 56, 60, 64, 68, 72, 76};
  CHECK(ps(x).shape() == Shape{8});
  CHECK(fv(ps(x)) == want);
  CHECK(fv(jit(ps)(x)) == want);
  // Along dimension 1 of blocks f32[2,4]: member k gets column k of the sum.
  Array y = arange_f(32).reshape({8, 4});  // blocks rows 2k, 2k+1
  auto ps1 = shard_map([](const Array& b) { return lax::psum_scatter(b, "i", {.scatter_dimension = 1}); }, m,
                       P("i", None), P("i"));
  // S[r, c] = sum_k y[2k+r, c] = sum_k (8k + 4r + c) = 48 + 16r + 4c.
  CHECK(fv(ps1(y)) == std::vector<float>{48, 64, 52, 68, 56, 72, 60, 76});
  // psum_scatter's transpose is an untiled all_gather: each member's cotangent row goes back to every block.
  Array w = arange_f(8) + 1.f;
  Array g = grad([&](const Array& z) { return jnp::sum(ps(z) * w); })(x);
  std::vector<float> gw;
  for (int k = 0; k < 4; ++k)
    for (int r = 0; r < 4; ++r) gw.insert(gw.end(), {float(2 * r + 1), float(2 * r + 2)});
  CHECK(fv(g) == gw);

  // Untiled all_to_all of blocks f32[4,3] (x[4j+r, c] = 12j+3r+c), split 0, concat 1: member k
  // receives row k of every member j, stacked at position 1: out[c, j] = 12j+3k+c, block f32[3,4].
  Array z = arange_f(48).reshape({16, 3});
  auto a2a = shard_map([](const Array& b) { return lax::all_to_all(b, "i", 0, 1); }, m, P("i"), P("i"));
  std::vector<float> want2;
  for (int k = 0; k < 4; ++k)
    for (int c = 0; c < 3; ++c)
      for (int j = 0; j < 4; ++j) want2.push_back(float(12 * j + 3 * k + c));
  CHECK(a2a(z).shape() == Shape{12, 4});
  CHECK(fv(a2a(z)) == want2);
  CHECK(fv(jit(a2a)(z)) == want2);
  // Its transpose is the untiled all_to_all back (split 1, concat 0): the gradient of a weighted sum
  // puts each weight back where its element came from.
  Array wz = arange_f(48).reshape({12, 4});
  Array gz = grad([&](const Array& q) { return jnp::sum(a2a(q) * wz); })(z);
  std::vector<float> wzv = fv(wz), gzv = fv(gz), zv = fv(z);
  std::vector<float> got_back(48);
  for (size_t e = 0; e < 48; ++e) {  // the weight on the output element that z[e] became
    int value = int(zv[e]), j = value / 12, k = (value % 12) / 3, c = value % 3;
    got_back[e] = wzv[size_t((k * 3 + c) * 4 + j)];
  }
  CHECK(gzv == got_back);
}

TEST_CASE("vmap of shard_maps whose bodies move data equals stacking the examples") {
  Mesh m = mesh_i();
  Array xs = arange_f(3 * 16).reshape({3, 16}) * 0.5f;
  auto stacked = [](auto f, const Array& batch, int axis) {
    std::vector<Array> per;
    for (int64_t b = 0; b < batch.shape()[size_t(axis)]; ++b)  // gathered to one device to stack
      per.push_back(device_put(f(take_example(batch, axis, b)), SingleDeviceSharding(default_device())));
    return jnp::stack(per, 0);
  };
  auto check = [&](const char* name, auto f, const Array& batch, int axis = 0) {
    CAPTURE(name);
    Array want = stacked(f, batch, axis);
    check_all_close(vmap(f, axis, 0)(batch), want);
    check_all_close(jit(vmap(f, axis, 0))(batch), want);
  };
  check("all_gather tiled",
        shard_map([](const Array& b) { return lax::all_gather(b, "i", {.tiled = true}); }, m, P("i"), P("i")), xs);
  check("all_gather untiled axis 1",
        shard_map([](const Array& b) { return lax::all_gather(b, "i", {.axis = 1}); }, m, P("i"), P("i")), xs);
  check("all_gather_invariant",
        shard_map([](const Array& b) { return lax::all_gather(b, "i", {.tiled = true, .to_invariant = true}); }, m,
                  P("i"), P()),
        xs);
  check("psum_scatter tiled",
        shard_map([](const Array& b) { return lax::psum_scatter(b, "i", {.tiled = true}); }, m, P("i"), P("i")), xs);
  check("psum_scatter untiled",
        shard_map(
            [](const Array& b) {
              return lax::psum_scatter(b.reshape({4, 1}), "i");
            },
            m, P("i"), P("i")),
        xs);
  check("ppermute",
        shard_map(
            [](const Array& b) {
              return lax::ppermute(b, "i", {{0, 1}, {1, 2}, {2, 3}});
            },
            m, P("i"), P("i")),
        xs);
  check("all_to_all tiled",
        shard_map([](const Array& b) { return lax::all_to_all(b, "i", 0, 0, {.tiled = true}); }, m, P("i"), P("i")),
        xs);
  check("pbroadcast", shard_map([](const Array& b) { return lax::pbroadcast(b, "i", 1); }, m, P("i"), P("i")), xs);
  // 2-D blocks, batched along axis 1: all_to_all resharding (example Q) and untiled all_to_all.
  Array as = arange_f(8 * 2 * 8).reshape({8, 2, 8});
  check("all_to_all split 1 concat 0",
        shard_map([](const Array& b) { return lax::all_to_all(b, "i", 1, 0, {.tiled = true}); }, m, P("i", None),
                  P(None, "i")),
        as, 1);
  Array us = arange_f(2 * 16 * 3).reshape({2, 16, 3});
  check("all_to_all untiled",
        shard_map([](const Array& b) { return lax::all_to_all(b, "i", 0, 1); }, m, P("i"), P("i")), us);
}

TEST_CASE("jvp of shard_maps with all_gather and ppermute: the collective applied to the tangent") {
  Mesh m = mesh_i();
  Array x = arange_f(8) * 0.25f, t = arange_f(8) + 1.f;
  auto ag =
      shard_map([](const Array& b) { return lax::all_gather(jnp::sin(b), "i", {.tiled = true}); }, m, P("i"), P("i"));
  auto [y, ty] = jvp(ag, std::tuple{x}, std::tuple{t});
  check_all_close(y, jnp::tile(jnp::sin(x), {4}));
  check_all_close(ty, jnp::tile(jnp::cos(x) * t, {4}), 1e-5);
  auto [yj, tyj] = jit([&](const Array& a, const Array& da) { return jvp(ag, std::tuple{a}, std::tuple{da}); })(x, t);
  check_all_close(yj, y);
  check_all_close(tyj, ty, 1e-5);
  // ppermute with a missing destination: member 0 gets zeros, in value and tangent.
  auto pp = shard_map(
      [](const Array& b) {
        return lax::ppermute(b * b, "i", {{0, 1}, {1, 2}, {2, 3}});
      },
      m, P("i"), P("i"));
  auto [z, tz] = jvp(pp, std::tuple{x}, std::tuple{t});
  std::vector<float> xv = fv(x), tv = fv(t), wz, wtz;
  for (int k = 0; k < 8; ++k) {
    wz.push_back(k < 2 ? 0.f : xv[size_t(k - 2)] * xv[size_t(k - 2)]);
    wtz.push_back(k < 2 ? 0.f : 2.f * xv[size_t(k - 2)] * tv[size_t(k - 2)]);
  }
  CHECK(fv(z) == wz);
  CHECK(fv(tz) == wtz);
  // jvp inside the body: the tangent of a gathered square is the gathered 2 x t.
  auto inner = shard_map(
      [](const Array& b, const Array& db) {
        auto [o, to] = jvp([](const Array& a) { return lax::all_gather(a * a, "i"); }, std::tuple{b}, std::tuple{db});
        return std::pair{o, to};
      },
      m, {P("i"), P("i")}, {P("i"), P("i")});
  auto [io, it] = inner(x, t);
  CHECK(io.shape() == Shape{16, 2});
  check_all_close(it, jnp::tile((2.f * x * t).reshape({4, 2}), {4, 1}), 1e-6);
  check_all_close(io, jnp::tile((x * x).reshape({4, 2}), {4, 1}), 1e-6);
}

TEST_CASE("transposes over two axes in both orders: the vjp and jvp Jacobians agree") {
  Mesh m = mesh_ij();
  // Column by column, jvp pushes tangents through each collective (its JVP is the collective
  // itself); row by row, vjp pulls cotangents through the transposes. A wrong group order or
  // transpose parameter makes the two Jacobians differ.
  auto check = [&](const char* name, std::function<Array(const Array&)> body, const Array& x,
                   PartitionSpec in = P(axes("i", "j")), PartitionSpec out = P(axes("i", "j"))) {
    CAPTURE(name);
    auto f = shard_map(body, m, in, out);
    auto [y, f_vjp] = vjp(f, x);
    int64_t n = x.size(), k = y.size();
    auto basis = [](int64_t size, int64_t at) {
      std::vector<float> e(size_t(size), 0.f);
      e[size_t(at)] = 1.f;
      return jnp::array(e);
    };
    std::vector<float> fwd(size_t(n * k)), rev(size_t(n * k));
    for (int64_t j = 0; j < n; ++j) {
      std::vector<float> col = fv(jvp(f, std::tuple{x}, std::tuple{basis(n, j)}).second);
      for (int64_t r = 0; r < k; ++r) fwd[size_t(r * n + j)] = col[size_t(r)];
    }
    for (int64_t r = 0; r < k; ++r) {
      std::vector<float> row = fv(std::get<0>(f_vjp(basis(k, r))));
      std::copy(row.begin(), row.end(), rev.begin() + r * n);
    }
    CHECK(rev == fwd);
    CHECK(std::count(fwd.begin(), fwd.end(), 0.f) < int64_t(fwd.size()));
  };
  Array x8 = arange_f(8) + 1.f, x16 = arange_f(16) + 1.f;
  for (AxisNames names : {AxisNames{"i", "j"}, AxisNames{"j", "i"}}) {
    CAPTURE(names.str());
    check(
        "all_gather tiled", [names](const Array& b) { return lax::all_gather(b * b, names, {.tiled = true}); }, x8);
    check(
        "all_gather untiled", [names](const Array& b) { return lax::all_gather(b, names, {.axis = 1}).reshape({-1}); },
        x8);
    check(
        "all_gather invariant",
        [names](const Array& b) { return lax::all_gather(b, names, {.tiled = true, .to_invariant = true}); }, x8,
        P(axes("i", "j")), P());
    check(
        "psum_scatter tiled", [names](const Array& b) { return lax::psum_scatter(b, names, {.tiled = true}); }, x16);
    check(
        "psum_scatter untiled", [names](const Array& b) { return lax::psum_scatter(b, names).reshape({1}); }, x16);
    check(
        "all_to_all tiled", [names](const Array& b) { return lax::all_to_all(b, names, 0, 0, {.tiled = true}); }, x16);
    check(
        "all_to_all untiled",
        [names](const Array& b) {
          return lax::all_to_all(b.reshape({4, 1}), names, 0, 1).reshape({-1});
        },
        x16);
    check(
        "pbroadcast", [names](const Array& b) { return lax::pbroadcast(b, names, 2); }, x8);
    check(
        "psum of one axis", [names](const Array& b) { return lax::psum(b, names.names[0]); }, x8);
    check(
        "pmean", [names](const Array& b) { return lax::pmean(b * b, names); }, x8, P(axes("i", "j")), P());
  }
  check(
      "ppermute over (i, j)",
      [](const Array& b) {
        return lax::ppermute(b, {"i", "j"}, {{0, 2}, {2, 3}, {3, 1}});
      },
      x8);
  // Partly replicated: x varies over i only, the collective runs over (j, i).
  check(
      "all_gather of an i-varying value over (j, i)",
      [](const Array& b) {
        return lax::all_gather(b, {"j", "i"}, {.tiled = true});
      },
      x8, P("i"));
}

TEST_CASE("staged bodies run in lockstep, bit-identical to one thread per device" CJAX_JIT_ONLY) {
  Mesh mesh = mesh_ij();
  // Every collective kind once, on blocks small enough for the lockstep path.
  auto body = [](const Array& x) {
    Array s = lax::psum(jnp::sin(x) * 3.0f, "i");
    Array g = lax::all_gather(s, "j", {.tiled = true});
    Array p = lax::ppermute(g, "i", {{0, 1}, {1, 0}});
    Array m = lax::pmax(p, {"i", "j"}) + lax::axis_index("j").astype(f32);
    Array r = lax::psum_scatter(jnp::concatenate({m, m}, 0), "j", {.tiled = true});
    return lax::all_to_all(r, "i", 0, 1, {.tiled = true});
  };
  auto f = jit(shard_map(body, mesh, P("i", "j"), P("i", "j"), {.check_vma = false}));
  Array x = jnp::arange(16).astype(f32).reshape({4, 4}) * 0.37f;
  SpmdRunStats before = spmd_run_stats();
  std::vector<float> lockstep = fv(f(x));
  CHECK(spmd_run_stats().lockstep == before.lockstep + 1);
  CHECK(spmd_run_stats().threaded == before.threaded);
  setenv("CJAX_SPMD_THREADS", "1", 1);
  std::vector<float> threaded = fv(f(x));
  unsetenv("CJAX_SPMD_THREADS");
  CHECK(spmd_run_stats().threaded == before.threaded + 1);
  CHECK(lockstep == threaded);
  CHECK(lockstep == fv(shard_map(body, mesh, P("i", "j"), P("i", "j"), {.check_vma = false})(x)));
  // The recorder sees each collective once per run, as in a threaded run, in the order the
  // compiled body runs them: axis_index needs no operand, so it joins the first group.
  debug::CollectiveRecorder rec;
  f(x).block_until_ready();
  std::vector<std::string> kinds;
  for (const auto& r : rec.records()) kinds.push_back(r.kind);
  INFO(fmt::format("{}", fmt::join(kinds, " ")));
  CHECK(kinds == std::vector<std::string>{"psum", "axis_index", "all_gather", "ppermute", "pmax", "reduce_scatter",
                                          "all_to_all"});
  // A large body runs in lockstep too, its devices' instructions spread over the thread pool.
  auto big = jit(shard_map([](const Array& v) { return lax::psum(jnp::sin(v) * 2.0f, "i"); }, mesh_i(), P("i"), P()));
  Array ones = jnp::ones({4 * 4096});
  std::vector<float> big_lockstep = fv(big(ones));
  CHECK(spmd_run_stats().lockstep == before.lockstep + 3);
  setenv("CJAX_SPMD_THREADS", "1", 1);
  CHECK(fv(big(ones)) == big_lockstep);
  unsetenv("CJAX_SPMD_THREADS");
  CHECK(spmd_run_stats().threaded == before.threaded + 2);
  // A collective inside control flow needs each device's own thread.
  auto branchy = jit(shard_map(
      [](const Array& v) {
        return lax::cond(
            lax::axis_index("i") == 0, [](const Array& u) { return lax::psum(u, "i"); },
            [](const Array& u) { return lax::psum(u * 2.0f, "i"); }, v);
      },
      mesh_i(), P("i"), P(), {.check_vma = false}));
  CHECK(fv(branchy(jnp::ones({4}))) == std::vector<float>{7.0f});
  CHECK(spmd_run_stats().threaded == before.threaded + 3);
}

// One thread per device moves blocks through the backend's buffer communicator of each group
// (core/spmd/collectives.cpp, run_on_group); lockstep combines them on one thread. Every layout
// of every collective gives the same bits both ways, and the same as the eager shard_map.
TEST_CASE("collectives through the buffer communicator match lockstep in every layout" CJAX_JIT_ONLY) {
  Mesh mesh = make_mesh({2, 4}, {"i", "j"});
  Array x = jnp::sin(jnp::arange(8 * 24).astype(f32).reshape({8, 24})) * 5.0f;  // blocks of [4, 6]
  std::vector<std::pair<std::string, std::function<Array(const Array&)>>> bodies = {
      {"all_gather tiled axis 1", [](const Array& b) { return lax::all_gather(b, "j", {.axis = 1, .tiled = true}); }},
      {"all_gather stacked axis 1",
       [](const Array& b) {
         return lax::all_gather(b, "i", {.axis = 1}).reshape({4, 12});
       }},
      {"psum_scatter tiled dim 1",
       [](const Array& b) { return lax::psum_scatter(b, "i", {.scatter_dimension = 1, .tiled = true}); }},
      {"psum_scatter dim 0",
       [](const Array& b) {
         return lax::psum_scatter(b.reshape({2, 12}), "i").reshape({1, 12});
       }},
      {"all_to_all tiled", [](const Array& b) { return lax::all_to_all(b, "i", 1, 0, {.tiled = true}); }},
      {"all_to_all stacked",
       [](const Array& b) {
         return lax::all_to_all(b.reshape({4, 2, 3}), "i", 1, 0).reshape({8, 3});
       }},
      {"ppermute ring",
       [](const Array& b) {
         return lax::ppermute(b, "j", {{0, 1}, {1, 2}, {2, 3}, {3, 0}});
       }},
      {"ppermute partial",
       [](const Array& b) {
         return lax::ppermute(b, "j", {{0, 2}, {3, 1}});
       }},
      {"pbroadcast", [](const Array& b) { return lax::pbroadcast(b, "j", 2); }},
      {"psum int32 over both",
       [](const Array& b) {
         return lax::psum(b.astype(DType::int32), {"i", "j"}).astype(f32);
       }},
      {"pmin", [](const Array& b) { return lax::pmin(b, "j"); }},
      {"pmax large",
       [](const Array& b) {
         return lax::pmax(jnp::tile(b, {64, 64}), "i")[{Slice(0, 4), Slice(0, 6)}];
       }},
  };
  for (const auto& [name, body] : bodies) {
    INFO(name);
    auto f = jit(shard_map(body, mesh, P("i", "j"), P("i", "j"), {.check_vma = false}));
    std::vector<float> lockstep = fv(f(x));
    setenv("CJAX_SPMD_THREADS", "1", 1);
    std::vector<float> threaded = fv(f(x));
    unsetenv("CJAX_SPMD_THREADS");
    CHECK(threaded == lockstep);
    CHECK(fv(shard_map(body, mesh, P("i", "j"), P("i", "j"), {.check_vma = false})(x)) == lockstep);
  }
  // Values, for two of them: device (i, j) holds rows 4i.., columns 6j.. of x.
  auto gathered = jit(shard_map(bodies[0].second, mesh, P("i", "j"), P("i", "j"), {.check_vma = false}));
  setenv("CJAX_SPMD_THREADS", "1", 1);
  Array g = device_put(gathered(x), SingleDeviceSharding(devices()[0]));
  Array moved = device_put(jit(shard_map(bodies[6].second, mesh, P("i", "j"), P("i", "j"), {.check_vma = false}))(x),
                           SingleDeviceSharding(devices()[0]));
  unsetenv("CJAX_SPMD_THREADS");
  CHECK(g.shape() == Shape{8, 96});
  CHECK(fv(g[{Slice(0, 8), Slice(24, 48)}]) == fv(x));  // every j-device holds the whole row block
  // ppermute over j by one: device j receives j-1's block.
  CHECK(fv(moved[{Slice(0, 8), Slice(6, 24)}]) == fv(x[{Slice(0, 8), Slice(0, 18)}]));
  CHECK(fv(moved[{Slice(0, 8), Slice(0, 6)}]) == fv(x[{Slice(0, 8), Slice(18, 24)}]));
}

// The backend's buffer-level communicator (core/backend/backend.h): 4 CPU devices, one thread
// each, every collective checked against values computed here.
TEST_CASE("the cpu buffer communicator: all_reduce, all_gather, reduce_scatter, all_to_all, permute, barrier") {
  constexpr int n = 4;
  std::vector<Device> group;
  for (int i = 0; i < n; ++i) group.emplace_back(Platform::cpu, i);
  std::shared_ptr<BufferCommunicator> comm = backend_for(Platform::cpu).communicator(group);
  REQUIRE(comm->size() == n);
  std::vector<std::vector<float>> sum(n), maxed(n), gathered(n), scattered(n), swapped(n), shifted(n);
  std::vector<std::vector<int32_t>> prod(n);
  std::vector<std::vector<float>> inplace(n);
  std::vector<std::pair<bool, bool>> logic(n);
  std::vector<int32_t> wrapped(n);
  std::vector<std::thread> members;
  for (int r = 0; r < n; ++r)
    members.emplace_back([&, r] {
      // rank r sends [r*8 + 0, ..., r*8 + 7] (and NaN at index 5 on rank 2, for max).
      std::vector<float> x(8);
      for (int i = 0; i < 8; ++i) x[size_t(i)] = float(r * 8 + i);
      sum[r].resize(8);
      comm->all_reduce(r, x.data(), sum[r].data(), 8, DType::float32, ReduceOp::Sum);
      std::vector<float> y = x;
      if (r == 2) y[5] = NAN;
      maxed[r].resize(8);
      comm->all_reduce(r, y.data(), maxed[r].data(), 8, DType::float32, ReduceOp::Max);
      std::vector<int32_t> k = {r + 1, 2};
      prod[r].resize(2);
      comm->all_reduce(r, k.data(), prod[r].data(), 2, DType::int32, ReduceOp::Prod);
      gathered[r].resize(2 * n);
      comm->all_gather(r, x.data(), gathered[r].data(), 2 * sizeof(float));
      scattered[r].resize(2);
      comm->reduce_scatter(r, x.data(), scattered[r].data(), 2, DType::float32, ReduceOp::Sum);
      swapped[r].resize(8);
      comm->all_to_all(r, x.data(), swapped[r].data(), 2 * sizeof(float));
      std::vector<std::pair<int, int>> ring = {{0, 1}, {1, 2}, {2, 3}};  // rank 0 receives nothing
      shifted[r].resize(8);
      comm->permute(r, x.data(), shifted[r].data(), 8 * sizeof(float), ring);
      comm->barrier(r);
      // In place; bool reduces as or (Sum) and and (Min); int32 sums wrap.
      inplace[r] = x;
      comm->all_reduce(r, inplace[r].data(), inplace[r].data(), 8, DType::float32, ReduceOp::Sum);
      bool flags[2] = {r == 1, r != 3}, any_all[2];
      comm->all_reduce(r, &flags[0], &any_all[0], 1, DType::bool_, ReduceOp::Sum);
      comm->all_reduce(r, &flags[1], &any_all[1], 1, DType::bool_, ReduceOp::Min);
      logic[r] = {any_all[0], any_all[1]};
      int32_t big = 0x7fffffff;
      comm->all_reduce(r, &big, &wrapped[r], 1, DType::int32, ReduceOp::Sum);
    });
  for (std::thread& t : members) t.join();
  for (int r = 0; r < n; ++r) {
    CAPTURE(r);
    for (int i = 0; i < 8; ++i) {
      CHECK(sum[r][size_t(i)] == float(4 * i + 8 * (0 + 1 + 2 + 3)));
      if (i == 5)
        CHECK(std::isnan(maxed[r][size_t(i)]));
      else
        CHECK(maxed[r][size_t(i)] == float(24 + i));
      CHECK(swapped[r][size_t(i)] == float((i / 2) * 8 + 2 * r + i % 2));
      CHECK(shifted[r][size_t(i)] == (r == 0 ? 0.0f : float((r - 1) * 8 + i)));
    }
    CHECK(prod[r] == std::vector<int32_t>{24, 16});
    for (int i = 0; i < 2 * n; ++i) CHECK(gathered[r][size_t(i)] == float((i / 2) * 8 + i % 2));
    for (int i = 0; i < 2; ++i) CHECK(scattered[r][size_t(i)] == float(4 * (2 * r + i) + 48));
    CHECK(inplace[r] == sum[r]);
    CHECK(logic[r] == std::pair<bool, bool>{true, false});
    CHECK(wrapped[r] == -4);  // 4 * (2^31 - 1) = 2^33 - 4, which wraps to -4
  }
}

TEST_CASE("the cpu buffer communicator: a rank that never arrives is a CollectiveError naming it") {
  std::vector<Device> group = {Device(Platform::cpu, 0), Device(Platform::cpu, 1), Device(Platform::cpu, 2)};
  auto comm = cpu::make_in_process_buffer_communicator(group, std::chrono::milliseconds(200));
  std::vector<std::string> errors(2);
  std::vector<std::thread> members;
  for (int r = 0; r < 2; ++r)  // rank 2 never calls
    members.emplace_back([&, r] {
      try {
        comm->barrier(r);
      } catch (const CollectiveError& e) {
        errors[size_t(r)] = e.what();
      }
    });
  for (std::thread& t : members) t.join();
  for (const std::string& e : errors) CHECK(e.find("barrier: rank(s) 2 of 3 did not arrive") != std::string::npos);
  // abort: a member that failed releases the others at once, and later calls raise too.
  auto aborted = cpu::make_in_process_buffer_communicator(group, std::chrono::seconds(60));
  std::string waiting_error;
  std::thread waiting([&] {
    try {
      float v = 1, out = 0;
      aborted->all_reduce(0, &v, &out, 1, DType::float32, ReduceOp::Sum);
    } catch (const CollectiveError& e) {
      waiting_error = e.what();
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  aborted->abort("device 2 failed: bad shape");
  waiting.join();
  CHECK(waiting_error == "device 2 failed: bad shape");
  CHECK_THROWS_WITH_AS(aborted->barrier(1), "device 2 failed: bad shape", CollectiveError);
  CHECK_THROWS_AS(cpu::make_in_process_buffer_communicator(std::vector<Device>{Device(Platform::cpu, 0),
                                                                               Device(Platform::cpu, 0)},
                                                           std::chrono::milliseconds(200)),
                  ValueError);
}

namespace {
// The primitive names of a shard_map body's compiled steps, in the order they run ("k" for a
// fused kernel), with the collectives scheduled under `group_bytes`.
std::vector<std::string> scheduled_steps(const ClosedJaxpr& traced, int64_t group_bytes) {
  const JaxprEqn& sm = traced.jaxpr->eqns().back();
  AxisEnvScope env(ShardMapInfo::from(sm.params).axis_frame());
  FusionPlan plan = plan_fusion(*ShardMapInfo::from(sm.params).body);
  schedule_collectives(plan, group_bytes);
  std::vector<std::string> names;
  for (const PlanStep& s : plan.steps) names.push_back(s.kernel >= 0 ? "k" : s.eqn.primitive->name);
  return names;
}
}  // namespace

TEST_CASE("an FSDP body meets the other devices twice: weights gathered together, gradients scattered together") {
  Mesh mesh = mesh_i();
  // Three layers whose weights are all_gathered before use and whose gradient-like products are
  // reduce_scattered: as written, six meeting points between the layers' matmuls.
  auto body = [](const Array& x, const Array& w1, const Array& w2, const Array& w3) {
    Array h = x;
    std::vector<Array> grads;
    for (const Array* w : {&w1, &w2, &w3}) {
      Array full = lax::all_gather(*w, "i", {.tiled = true});
      h = jnp::tanh(jnp::matmul(h, full));
      grads.push_back(lax::psum_scatter(jnp::matmul(jnp::transpose(h), h), "i", {.tiled = true}));
    }
    return std::vector<Array>{h, grads[0], grads[1], grads[2]};
  };
  auto f = shard_map(body, mesh, {P("i"), P("i"), P("i"), P("i")}, {P("i"), P("i"), P("i"), P("i")});
  Array x = random::normal(random::key(1), {8, 16}), w1 = random::normal(random::key(2), {16, 16}) * 0.3f,
        w2 = random::normal(random::key(3), {16, 16}) * 0.3f, w3 = random::normal(random::key(4), {16, 16}) * 0.3f;
  ClosedJaxpr traced = make_jaxpr(f)(x, w1, w2, w3);
  using S = std::vector<std::string>;
  S grouped = scheduled_steps(traced, int64_t(32) << 20);
  INFO(fmt::format("{}", fmt::join(grouped, " ")));
  auto positions = [](const S& steps, const std::string& name) {
    std::vector<size_t> at;
    for (size_t i = 0; i < steps.size(); ++i)
      if (steps[i] == name) at.push_back(i);
    return at;
  };
  std::vector<size_t> gathers = positions(grouped, "all_gather"), scatters = positions(grouped, "reduce_scatter"),
                      matmuls = positions(grouped, "dot_general");
  REQUIRE(gathers.size() == 3);
  REQUIRE(scatters.size() == 3);
  CHECK(gathers == std::vector<size_t>{gathers[0], gathers[0] + 1, gathers[0] + 2});  // one group
  CHECK(gathers[2] < matmuls.front());                                                // before the first use
  CHECK(scatters == std::vector<size_t>{grouped.size() - 3, grouped.size() - 2, grouped.size() - 1});  // at the end
  // A group bound smaller than one weight keeps each collective where the program needs it.
  S in_place = scheduled_steps(traced, 1);
  INFO(fmt::format("{}", fmt::join(in_place, " ")));
  std::vector<size_t> g1 = positions(in_place, "all_gather"), s1 = positions(in_place, "reduce_scatter");
  REQUIRE(g1.size() == 3);
  CHECK(g1[1] > positions(in_place, "dot_general")[0]);  // the second weight is gathered after the first matmul
  CHECK(s1[0] < g1[1]);                                  // the first product is scattered before it
  // The values do not depend on the schedule: the staged body (lockstep), one thread per
  // device, and eager all agree bit for bit.
  auto jf = jit(f);
  std::vector<Array> staged = jf(x, w1, w2, w3);
  setenv("CJAX_SPMD_THREADS", "1", 1);
  std::vector<Array> threaded = jit(f)(x, w1, w2, w3);
  unsetenv("CJAX_SPMD_THREADS");
  std::vector<Array> eager = f(x, w1, w2, w3);
  for (size_t k = 0; k < 4; ++k) {
    CHECK(fv(staged[k]) == fv(threaded[k]));
    std::vector<float> a = fv(staged[k]), b = fv(eager[k]);
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-5));
  }
}

TEST_CASE("psum_scatter sums each member's chunk along any dimension, in member order") {
  Mesh mesh = mesh_i();
  // Blocks [rows, 8, 3] per device; member k gets columns [2k, 2k+2) of dimension 1, summed over
  // the devices in order 0..3 (with 700 rows, the runs of 6 elements span several blocks of the
  // combination).
  for (int64_t rows : {2, 700}) {
    CAPTURE(rows);
    Array x = random::normal(random::key(7), {4 * rows, 8, 3});
    auto f =
        shard_map([](const Array& b) { return lax::psum_scatter(b, "i", {.scatter_dimension = 1, .tiled = true}); },
                  mesh, P("i"), P(None, "i"));
    std::vector<float> got = fv(jit(f)(x)), all = fv(x);
    REQUIRE(got.size() == size_t(rows * 8 * 3));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < 8; ++c)
        for (int64_t e = 0; e < 3; ++e) {
          float want = 0;
          for (int64_t d = 0; d < 4; ++d) {
            float v = all[size_t(((d * rows + r) * 8 + c) * 3 + e)];
            want = d == 0 ? v : want + v;
          }
          CHECK(got[size_t((r * 8 + c) * 3 + e)] == want);
        }
  }
}

TEST_CASE("a psum's result is one buffer that the group's CPU devices share, never written in place") {
  Mesh mesh = mesh_i();
  std::vector<std::vector<Array>> blocks;
  for (int d = 0; d < 4; ++d)
    blocks.push_back({device_put(arange_f(6) + float(10 * d), SingleDeviceSharding(mesh.devices()[size_t(d)]))});
  AbstractValue aval = blocks[0][0].aval();
  std::vector<std::vector<Array>> outs =
      run_collective_on_all_devices(*find_primitive("psum"), {{"axes", axes_param({"i"})}}, blocks,
                                    std::span<const AbstractValue>(&aval, 1), mesh, false, false);
  for (int d = 0; d < 4; ++d) {
    const std::shared_ptr<Buffer>& b = concrete(outs[size_t(d)][0])->buffer();
    CHECK(b->device() == mesh.devices()[size_t(d)]);             // each member's result is on its device
    CHECK(b->data() == concrete(outs[0][0])->buffer()->data());  // in one memory
    CHECK(fv(outs[size_t(d)][0]) == std::vector<float>{60, 64, 68, 72, 76, 80});
    CHECK_FALSE(exclusively_held(b));
  }
  // Staged: every device's next kernel reads the shared sum where it dies (an in-place candidate);
  // none may write over it while the others still read it.
  auto body = [](const Array& b) {
    Array s = lax::psum(b, "i");
    return jnp::tanh(s * 0.01f) * (lax::axis_index("i").astype(f32) + 1.f);
  };
  auto f = jit(shard_map(body, mesh, P("i"), P("i"), {.check_vma = false}));
  Array x = arange_f(16) * 0.5f;
  std::vector<float> staged = fv(f(x));
  setenv("CJAX_SPMD_THREADS", "1", 1);
  std::vector<float> threaded = fv(f(x));
  unsetenv("CJAX_SPMD_THREADS");
  CHECK(staged == threaded);
  std::vector<float> xs = fv(x);
  for (int d = 0; d < 4; ++d)
    for (int e = 0; e < 4; ++e) {
      float sum = 0;
      for (int k = 0; k < 4; ++k) sum += xs[size_t(k * 4 + e)];
      CHECK(staged[size_t(d * 4 + e)] == doctest::Approx(std::tanh(sum * 0.01f) * float(d + 1)).epsilon(1e-6));
    }
}

TEST_CASE("steps whose operands are the same on every device run once, the devices sharing the result") {
  Mesh mesh = mesh_i();
  // Data parallelism: replicated parameters, a split batch, gradients summed over devices, and an
  // update that every device would compute identically.
  auto body = [](const Array& w, const Array& v, const Array& xb) {
    Array g = lax::psum(jnp::matmul(jnp::transpose(xb), jnp::tanh(jnp::matmul(xb, w))), "i");
    Array v2 = v * 0.9f + g * g * 0.1f;
    Array w2 = w - g * 0.01f / (jnp::sqrt(v2) + 1e-6f);
    return std::vector<Array>{w2, v2, jnp::sum(jnp::matmul(xb, w2), {1})};
  };
  auto f = jit(shard_map(body, mesh, {P(), P(), P("i")}, {P(), P(), P("i")}));
  Array w = random::normal(random::key(1), {16, 16}) * 0.3f, v = jnp::ones({16, 16}) * 0.5f,
        x = random::normal(random::key(2), {32, 16});
  // Runs of the fused kernel that updates v and w (the one kernel after the psum that reads no
  // block of the batch).
  auto sqrt_kernels = [] {
    int k = 0;
    for (const profiler::Event& e : profiler::events()) k += e.name.find("sqrt") != std::string::npos;
    return k;
  };
  for (const Array& a : f(w, v, x)) a.block_until_ready();  // compiled
  profiler::start();
  std::vector<Array> once = f(w, v, x);
  for (const Array& a : once) a.block_until_ready();
  profiler::stop();
  CHECK(sqrt_kernels() == 1);  // the update ran once, not once per device
  setenv("CJAX_SPMD_THREADS", "1", 1);
  profiler::start();
  std::vector<Array> threaded = f(w, v, x);
  for (const Array& a : threaded) a.block_until_ready();
  profiler::stop();
  unsetenv("CJAX_SPMD_THREADS");
  CHECK(sqrt_kernels() == 4);
  std::vector<Array> eager = shard_map(body, mesh, {P(), P(), P("i")}, {P(), P(), P("i")})(w, v, x);
  for (size_t k = 0; k < 3; ++k) {
    CHECK(fv(once[k]) == fv(threaded[k]));  // bit for bit
    std::vector<float> a = fv(once[k]), b = fv(eager[k]);
    for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-5));
  }
  // With varying axes unchecked (as sharded jit's bodies are), the in_specs still say which
  // inputs agree: the update runs once too.
  auto unchecked = jit(shard_map(body, mesh, {P(), P(), P("i")}, {P(), P(), P("i")}, {.check_vma = false}));
  for (const Array& a : unchecked(w, v, x)) a.block_until_ready();
  profiler::start();
  std::vector<Array> all = unchecked(w, v, x);
  for (const Array& a : all) a.block_until_ready();
  profiler::stop();
  CHECK(sqrt_kernels() == 1);
  CHECK(fv(all[0]) == fv(once[0]));
}

TEST_CASE("steps the same along one mesh axis run once per class of devices, the others sharing the result") {
  // Megatron-style tensor parallelism under FSDP on a (fsdp 4, tensor 2) mesh: after the psum over
  // 'tensor', the residual add and the norm are the same on both tensor devices (computed on the
  // devices of tensor index 0); the all-gathered weight is the same along 'fsdp' (its scaling
  // computed on the devices of fsdp index 0).
  Mesh mesh = make_mesh({4, 2}, {"fsdp", "tensor"});
  auto body = [](const Array& x, const Array& w_in, const Array& w_out) {
    Array w = jnp::cos(lax::all_gather(w_in, "fsdp", {.axis = 0, .tiled = true}));  // [8, 6 / 2]
    Array y = lax::psum(jnp::matmul(jnp::tanh(jnp::matmul(x, w)), w_out), "tensor");
    Array z = y + x;
    return z * lax::rsqrt(jnp::mean(z * z, {-1}, true) + 1e-6f);
  };
  SpecTree in_specs{P("fsdp"), P("fsdp", "tensor"), P("tensor")};
  auto f = jit(shard_map(body, mesh, in_specs, P("fsdp")));
  Array x = random::normal(random::key(1), {16, 8}), w_in = random::normal(random::key(2), {8, 6}) * 0.5f,
        w_out = random::normal(random::key(3), {6, 8}) * 0.5f;
  auto runs_of = [](const char* op) {
    int k = 0;
    for (const profiler::Event& e : profiler::events()) k += e.name.find(op) != std::string::npos;
    return k;
  };
  f(x, w_in, w_out).block_until_ready();  // compiled
  profiler::start();
  Array by_class = f(x, w_in, w_out);
  by_class.block_until_ready();
  profiler::stop();
  CHECK(runs_of("reduce_sum") == 4);  // the norm: one per fsdp index
  CHECK(runs_of("cos") == 2);         // one per tensor index
  setenv("CJAX_SPMD_THREADS", "1", 1);
  profiler::start();
  Array threaded = f(x, w_in, w_out);
  threaded.block_until_ready();
  profiler::stop();
  unsetenv("CJAX_SPMD_THREADS");
  CHECK(runs_of("reduce_sum") == 8);
  CHECK(runs_of("cos") == 8);
  CHECK(fv(by_class) == fv(threaded));  // bit for bit
  std::vector<float> got = fv(by_class), want = fv(shard_map(body, mesh, in_specs, P("fsdp"))(x, w_in, w_out));
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
  // The gradient's bodies (the transposed psum and all_gather among them) agree with the threaded run too.
  auto loss = [&](const Array& a, const Array& b, const Array& c) {
    return jnp::sum(jnp::square(shard_map(body, mesh, in_specs, P("fsdp"))(a, b, c)));
  };
  auto g = jit(grad(loss, argnums<0, 1, 2>));
  auto [gx, gw_in, gw_out] = g(x, w_in, w_out);
  setenv("CJAX_SPMD_THREADS", "1", 1);
  auto [tx, tw_in, tw_out] = g(x, w_in, w_out);
  unsetenv("CJAX_SPMD_THREADS");
  CHECK(fv(gx) == fv(tx));
  CHECK(fv(gw_in) == fv(tw_in));
  CHECK(fv(gw_out) == fv(tw_out));
}

TEST_CASE("a GEMM operand the devices share is laid out for the GEMM once, not once per device") {
  // x W^T with W replicated (a dX product: W stored [N, K]) and a q/k/v-style weight whose
  // contracted dimension sits between free ones ([3, D, H]): each needs [K, N] order, which the
  // lockstep run makes with one transpose shared by the devices.
  Mesh mesh = mesh_i();
  auto body = [](const Array& x, const Array& w, const Array& wqkv) {
    Array h = jnp::tanh(jnp::einsum("bk,nk->bn", x, w));  // x W^T: [b, 12] from w [12, 8]
    Array qkv = jnp::einsum("bd,cdh->bch", h, wqkv);      // wqkv [3, 12, 5]
    return jnp::sum(qkv, {1});
  };
  SpecTree in_specs{P("i"), P(), P()};
  auto f = jit(shard_map(body, mesh, in_specs, P("i")));
  Array x = random::normal(random::key(11), {16, 8}), w = random::normal(random::key(12), {12, 8}) * 0.4f,
        wqkv = random::normal(random::key(13), {3, 12, 5}) * 0.4f;
  auto transposes = [] {
    int k = 0;
    for (const profiler::Event& e : profiler::events()) k += e.name == "transpose";
    return k;
  };
  f(x, w, wqkv).block_until_ready();  // compiled
  profiler::start();
  Array once = f(x, w, wqkv);
  once.block_until_ready();
  profiler::stop();
  CHECK(transposes() == 2);  // w and wqkv, once each for the 4 devices
  setenv("CJAX_SPMD_THREADS", "1", 1);
  Array threaded = f(x, w, wqkv);
  threaded.block_until_ready();
  unsetenv("CJAX_SPMD_THREADS");
  CHECK(fv(once) == fv(threaded));  // bit for bit
  Array plain = jnp::sum(jnp::einsum("bd,cdh->bch", jnp::tanh(jnp::matmul(x, jnp::transpose(w))), wqkv), {1});
  std::vector<float> got = fv(once), want = fv(plain);
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));
  // An operand that differs on every device keeps the GEMM's own packing: no transpose step.
  auto varying = jit(shard_map(body, mesh, SpecTree{P("i"), P("i"), P()}, P("i")));
  Array wide_w = random::normal(random::key(14), {48, 8}) * 0.4f;
  varying(x, wide_w, wqkv).block_until_ready();
  profiler::start();
  varying(x, wide_w, wqkv).block_until_ready();
  profiler::stop();
  CHECK(transposes() == 1);  // wqkv only
}
