// JVP, transpose and batching rules of the shape and slicing primitives (autodiff/rules_shape.cpp):
// numerical gradient checks, closed-form cotangents, vmap against per-example loops, and the
// jaxpr JAX prints for the gradient of a slice.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <optional>

#include "autodiff/check_grads.h"
#include "cjax/cjax.h"
#include "test_util.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {

using Fn = std::function<Array(const std::vector<Array>&)>;

Array idx(int v) { return make_scalar(double(v), i32); }
Array idxs(const std::vector<double>& v) { return arr<int32_t>(v); }

// Smooth, non-polynomial values away from zero (so sin(x) * x has non-trivial second derivatives).
Array smooth(const Shape& shape, double offset = 0.3) {
  std::vector<double> v(size_t(shape_size(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = offset + 0.37 * double(i) - 0.05 * double(i * i % 7);
  return arr<double>(v, shape);
}

struct GradCase {
  const char* name;
  Fn op;  // the primitive under test, on the transformed inputs
  std::vector<Array> args;
};

// f(args) = sin(op(sin(floating args))) * op(...): the op appears inside non-linear functions on
// both sides, so order-2 checks run its JVP and transpose rules on tangents of tangents.
std::vector<Array> wrap(const Fn& op, const std::vector<Array>& a) {
  std::vector<Array> in;
  for (const Array& x : a) in.push_back(is_floating(x.dtype()) ? lax::sin(x) : x);
  Array y = op(in);
  return {lax::mul(lax::sin(y), y)};
}

std::vector<GradCase> grad_cases() {
  using V = std::vector<Array>;
  return {
      {"broadcast_in_dim (new dims)",
       [](const V& a) {
         return lax::broadcast_in_dim(a[0], {2, 3, 4}, {1});
       },
       {smooth({3})}},
      {"broadcast_in_dim (size-1 expand)",
       [](const V& a) {
         return lax::broadcast_in_dim(a[0], {2, 3, 4}, {0, 2});
       },
       {smooth({1, 4})}},
      {"reshape",
       [](const V& a) {
         return lax::reshape(a[0], {3, 2, 2});
       },
       {smooth({2, 6})}},
      {"transpose",
       [](const V& a) {
         return lax::transpose(a[0], {2, 0, 1});
       },
       {smooth({2, 3, 4})}},
      {"squeeze",
       [](const V& a) {
         return lax::squeeze(a[0], {0, 2});
       },
       {smooth({1, 3, 1, 2})}},
      {"rev",
       [](const V& a) {
         return lax::rev(a[0], {0, 2});
       },
       {smooth({2, 3, 2})}},
      {"concatenate",
       [](const V& a) {
         return lax::concatenate({a[0], a[1], a[2]}, 1);
       },
       {smooth({2, 1}), smooth({2, 3}, -0.4), smooth({2, 2}, 0.9)}},
      {"pad (lo/hi)",
       [](const V& a) {
         return lax::pad(a[0], a[1], {{1, 2, 0}, {0, 1, 0}});
       },
       {smooth({2, 3}), make_scalar(0.6, f64)}},
      {"pad (negative and interior)",
       [](const V& a) {
         return lax::pad(a[0], a[1], {{-1, 2, 1}, {2, -2, 2}});
       },
       {smooth({4, 3}), make_scalar(-0.8, f64)}},
      {"slice",
       [](const V& a) {
         return lax::slice(a[0], {1, 0}, {3, 2});
       },
       {smooth({4, 3})}},
      {"slice (strided)",
       [](const V& a) {
         return lax::slice(a[0], {0, 1}, {4, 3}, {3, 2});
       },
       {smooth({5, 3})}},
      {"dynamic_slice",
       [](const V& a) {
         return lax::dynamic_slice(a[0], {a[1], a[2]}, {2, 2});
       },
       {smooth({4, 3}), idx(1), idx(5)}},  // the second start is clamped to 1
      {"dynamic_update_slice",
       [](const V& a) {
         return lax::dynamic_update_slice(a[0], a[1], {a[2], a[3]});
       },
       {smooth({4, 3}), smooth({2, 2}, -0.7), idx(2), idx(0)}},
  };
}

// vmap(f) over `axes` (nullopt: unmapped) equals stacking f on each example's slices.
void check_vmap(const Fn& f, const std::vector<Array>& args, const std::vector<std::optional<int>>& axes,
                int out_axis = 0) {
  int64_t size = -1;
  for (size_t i = 0; i < args.size(); ++i)
    if (axes[i]) size = args[i].shape()[size_t(*axes[i] < 0 ? *axes[i] + args[i].ndim() : *axes[i])];
  REQUIRE(size > 0);
  Array batched = vmap_detail::vmap([&](const std::vector<Array>& xs) { return std::vector<Array>{f(xs)}; }, args, axes,
                                    {out_axis}, {})[0];
  std::vector<Array> per_example;
  for (int64_t b = 0; b < size; ++b) {
    std::vector<Array> one;
    for (size_t i = 0; i < args.size(); ++i) {
      if (!axes[i]) {
        one.push_back(args[i]);
        continue;
      }
      int a = *axes[i] < 0 ? *axes[i] + args[i].ndim() : *axes[i];
      one.push_back(lax::squeeze(lax::slice_in_dim(args[i], b, b + 1, 1, a), {a}));
    }
    per_example.push_back(f(one));
  }
  Array expected = jnp::stack(per_example, out_axis);
  CHECK(batched.shape() == expected.shape());
  CHECK(batched.dtype() == expected.dtype());
  CHECK(vals(batched) == vals(expected));
}

}  // namespace

TEST_CASE("check_grads: every shape and slicing primitive, orders 1 and 2, fwd and rev") {
  for (const GradCase& c : grad_cases()) {
    CAPTURE(c.name);
    Fn op = c.op;
    CHECK_NOTHROW(check_grads([op](const std::vector<Array>& a) { return wrap(op, a); }, c.args, {.order = 2}));
  }
}

TEST_CASE("jvp of shape primitives is the primitive applied to the tangent") {
  Array x = smooth({2, 3}), t = arr<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  auto [y, ty] = jvp(
      [](const Array& a) {
        return lax::transpose(lax::rev(a, {1}), {1, 0});
      },
      std::tuple{x}, std::tuple{t});
  CHECK(vals(ty) == std::vector<double>{3, 6, 2, 5, 1, 4});
  // Only the padding value has a tangent: the operand's tangent is instantiated as zeros.
  Array pv = make_scalar(2.0, f64);
  auto [p, tp] = jvp(
      [&](const Array& v) {
        return lax::pad(x, v, {{1, 0, 0}, {0, 0, 1}});
      },
      std::tuple{pv}, std::tuple{make_scalar(1.0, f64)});
  CHECK(tp.shape() == Shape{3, 5});
  CHECK(vals(tp) == std::vector<double>{1, 1, 1, 1, 1, 0, 1, 0, 1, 0, 0, 1, 0, 1, 0});
  // Only the update has a tangent in dynamic_update_slice.
  Array u = arr<double>({7, 8});
  auto [d, td] = jvp([&](const Array& up) { return lax::dynamic_update_slice(jnp::zeros({5}, f64), up, {idx(-2)}); },
                     std::tuple{u}, std::tuple{arr<double>({1, 10})});
  CHECK(vals(d) == std::vector<double>{0, 0, 0, 7, 8});
  CHECK(vals(td) == std::vector<double>{0, 0, 0, 1, 10});
}

TEST_CASE("vjp cotangents against closed forms") {
  SUBCASE("broadcast_in_dim sums the added dimensions and the expanded size-1 ones") {
    auto [y, f_vjp] = vjp(
        [](const Array& a) {
          return lax::broadcast_in_dim(a, {2, 1, 3, 4}, {1, 2});
        },
        arr<double>({1, 2, 3}, {1, 3}));
    Array ct = arr<double>(std::vector<double>(24, 1.0), {2, 1, 3, 4});
    auto [g] = f_vjp(ct);
    CHECK(g.shape() == Shape{1, 3});
    CHECK(vals(g) == std::vector<double>{8, 8, 8});
  }
  SUBCASE("transpose and reshape") {
    auto [y, f_vjp] = vjp(
        [](const Array& a) {
          return lax::reshape(lax::transpose(a, {1, 2, 0}), {6, 2});
        },
        smooth({2, 3, 2}));
    auto [g] = f_vjp(arr<double>({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {6, 2}));
    // y[j, k, i] = a[i, j, k] flattened; so g[i, j, k] = ct_flat[(j * 2 + k) * 2 + i].
    CHECK(g.shape() == Shape{2, 3, 2});
    CHECK(vals(g) == std::vector<double>{0, 2, 4, 6, 8, 10, 1, 3, 5, 7, 9, 11});
  }
  SUBCASE("squeeze and rev") {
    auto [y, f_vjp] = vjp([](const Array& a) { return lax::rev(lax::squeeze(a, {1}), {0}); }, smooth({3, 1}));
    auto [g] = f_vjp(arr<double>({1, 2, 3}));
    CHECK(g.shape() == Shape{3, 1});
    CHECK(vals(g) == std::vector<double>{3, 2, 1});
  }
  SUBCASE("concatenate splits the cotangent") {
    auto [y, f_vjp] = vjp(
        [](const Array& a, const Array& b) {
          return lax::concatenate({a, b, a}, 0);
        },
        arr<double>({1, 2}), arr<double>({3}));
    auto [ga, gb] = f_vjp(arr<double>({10, 20, 30, 40, 50}));
    CHECK(vals(ga) == std::vector<double>{10 + 40, 20 + 50});
    CHECK(vals(gb) == std::vector<double>{30});
  }
  SUBCASE("pad with negative low and interior padding") {
    // Interior-padded: [x0 p x1 p x2 p x3]; lo=-1 drops x0, hi=2 appends p p.
    auto [y, f_vjp] = vjp(
        [](const Array& a, const Array& v) {
          return lax::pad(a, v, {{-1, 2, 1}});
        },
        arr<double>({1, 2, 3, 4}), make_scalar(9.0, f64));
    CHECK(vals(y) == std::vector<double>{9, 2, 9, 3, 9, 4, 9, 9});
    auto [ga, gv] = f_vjp(arr<double>({1, 2, 4, 8, 16, 32, 64, 128}));
    CHECK(vals(ga) == std::vector<double>{0, 2, 8, 32});
    CHECK(gv.ndim() == 0);
    CHECK(vals(gv) == std::vector<double>{1 + 4 + 16 + 64 + 128});
  }
  SUBCASE("strided slice scatters the cotangent with interior zeros") {
    auto [y, f_vjp] = vjp([](const Array& a) { return lax::slice(a, {1}, {7}, {2}); }, smooth({8}));
    auto [g] = f_vjp(arr<double>({1, 2, 3}));
    CHECK(vals(g) == std::vector<double>{0, 1, 0, 2, 0, 3, 0, 0});
  }
  SUBCASE("dynamic_slice with a clamped start") {
    auto [y, f_vjp] = vjp([](const Array& a) { return lax::dynamic_slice(a, {idx(4)}, {2}); }, smooth({5}));
    auto [g] = f_vjp(arr<double>({1, 2}));
    CHECK(vals(g) == std::vector<double>{0, 0, 0, 1, 2});
  }
  SUBCASE("dynamic_update_slice: the window's cotangent goes to the update, the rest to the operand") {
    auto [y, f_vjp] = vjp([](const Array& a, const Array& u) { return lax::dynamic_update_slice(a, u, {idx(1)}); },
                          smooth({4}), smooth({2}));
    auto [ga, gu] = f_vjp(arr<double>({1, 2, 3, 4}));
    CHECK(vals(ga) == std::vector<double>{1, 0, 0, 4});
    CHECK(vals(gu) == std::vector<double>{2, 3});
  }
}

TEST_CASE("grad values of composite functions") {
  // d/dx sum(x[1:3] * 2) = [0, 2, 2, 0]
  auto f = [](const Array& x) {
    return lax::reduce_sum(lax::mul(lax::slice(x, {1}, {3}), make_scalar(2.0, f32)), {0});
  };
  Array g = grad(f)(arr<float>({1, 2, 3, 4}));
  CHECK(vals(g) == std::vector<double>{0, 2, 2, 0});
  // d/dx sum(pad(x, 0)^2 ) = 2x; d/dv = 2 v * (number of padded cells).
  auto h = [](const Array& x, const Array& v) {
    Array p = lax::pad(x, v, {{1, 1, 1}});
    return lax::reduce_sum(lax::mul(p, p), {0});
  };
  auto [gx, gv] = grad(h, argnums<0, 1>)(arr<double>({1, -2, 3}), make_scalar(0.5, f64));
  CHECK(vals(gx) == std::vector<double>{2, -4, 6});
  CHECK(vals(gv) == std::vector<double>{2 * 0.5 * 4});
  // Second derivative through a broadcast: d2/dx2 sum(bcast(x)^3) = 6 x * 4.
  auto k = [](const Array& x) {
    Array b = lax::broadcast_in_dim(x, {4}, {});
    return lax::reduce_sum(lax::mul(lax::mul(b, b), b), {0});
  };
  CHECK(grad(grad(k))(make_scalar(1.5, f64)).item<double>() == doctest::Approx(6 * 1.5 * 4));
}

TEST_CASE("make_jaxpr of a vjp through a slice prints JAX's jaxpr") {
  // jax.make_jaxpr(lambda x, ct: jax.vjp(lambda x: lax.slice(x, (1,), (3,)) * 2.0, x)[1](ct))
  auto f = [](const Array& x, const Array& ct) {
    auto [y, f_vjp] = vjp([](const Array& a) { return lax::mul(lax::slice(a, {1}, {3}), make_scalar(2.0, f32)); }, x);
    return std::get<0>(f_vjp(ct));
  };
  auto cj = make_jaxpr(f)(arr<float>({1, 2, 3, 4}), arr<float>({1, 1}));
  CHECK(text(cj) ==
        "{ lambda ; a:f32[4] b:f32[2]. let\n"
        "    c:f32[2] = slice[limit_indices=(3,) start_indices=(1,) strides=None] a\n"
        "    _:f32[2] = mul c 2.0:f32[]\n"
        "    d:f32[2] = mul b 2.0:f32[]\n"
        "    e:f32[4] = pad[padding_config=((1, 1, 0),)] d 0.0:f32[]\n"
        "  in (e,) }");
  // The strided slice transposes to a pad with interior padding (JAX's _slice_transpose_rule).
  auto g = [](const Array& x, const Array& ct) {
    auto [y, f_vjp] = vjp([](const Array& a) { return lax::slice(a, {1}, {7}, {2}); }, x);
    return std::get<0>(f_vjp(ct));
  };
  std::string t = text(make_jaxpr(g)(jnp::zeros({8}), jnp::zeros({3})));
  CHECK(t.find("pad[padding_config=((1, 2, 1),)] b 0.0:f32[]") != std::string::npos);
}

TEST_CASE("iota is a constant to jvp, grad and vmap") {
  auto f = [](const Array& x) { return lax::mul(x, lax::iota(f64, 3)); };
  auto [y, t] = jvp(f, std::tuple{arr<double>({1, 1, 1})}, std::tuple{arr<double>({1, 2, 3})});
  CHECK(vals(y) == std::vector<double>{0, 1, 2});
  CHECK(vals(t) == std::vector<double>{0, 2, 6});
  auto s = [&](const Array& x) { return lax::reduce_sum(f(x), {0}); };
  CHECK(vals(grad(s)(arr<double>({5, 5, 5}))) == std::vector<double>{0, 1, 2});
  Array xs = arr<double>({1, 2, 3, 4, 5, 6}, {2, 3});
  check_vmap([&](const std::vector<Array>& a) { return f(a[0]); }, {xs}, {0});
  check_vmap(
      [](const std::vector<Array>& a) {
        return lax::add(a[0], lax::broadcasted_iota(f32, {2, 3}, 1));
      },
      {jnp::ones({4, 2, 3})}, {0});
}

TEST_CASE("vmap of shape primitives equals the per-example results") {
  using V = std::vector<Array>;
  Array x234 = smooth({2, 3, 4});
  SUBCASE("broadcast_in_dim") {
    Fn f = [](const V& a) { return lax::broadcast_in_dim(a[0], {a[0].shape()[0], 5, a[0].shape()[1]}, {0, 2}); };
    check_vmap(f, {x234}, {0});
    check_vmap(f, {x234}, {2});
    check_vmap(f, {x234}, {-1}, 1);
    Fn g = [](const V& a) { return lax::broadcast_in_dim(a[0], {4, 2, 3}, {1, 2}); };
    check_vmap(g, {smooth({1, 3, 5})}, {2});  // a size-1 dimension expands
  }
  SUBCASE("reshape") {
    Fn f = [](const V& a) { return lax::reshape(a[0], {a[0].size()}); };
    check_vmap(f, {x234}, {0});
    check_vmap(f, {x234}, {1});
    check_vmap(f, {x234}, {-1}, 1);
  }
  SUBCASE("transpose") {
    Fn f = [](const V& a) { return lax::transpose(a[0], {1, 0}); };
    check_vmap(f, {x234}, {0});
    check_vmap(f, {x234}, {1});
    check_vmap(f, {x234}, {-1}, 2);
  }
  SUBCASE("squeeze") {
    Fn f = [](const V& a) {  // squeezes every size-1 dimension of the example
      std::vector<int64_t> ones;
      for (int i = 0; i < a[0].ndim(); ++i)
        if (a[0].shape()[size_t(i)] == 1) ones.push_back(i);
      return lax::squeeze(a[0], ones);
    };
    Array x = smooth({3, 1, 4, 1, 2});
    check_vmap(f, {x}, {0});
    check_vmap(f, {x}, {2});
    check_vmap(f, {x}, {-1}, 1);
  }
  SUBCASE("rev") {
    Fn f = [](const V& a) { return lax::rev(a[0], {0, 1}); };
    check_vmap(f, {x234}, {0});
    check_vmap(f, {x234}, {1});
    check_vmap(f, {x234}, {-1});
  }
  SUBCASE("concatenate with mapped and unmapped operands") {
    Fn f = [](const V& a) { return lax::concatenate({a[0], a[1], a[2]}, 0); };
    Array a = smooth({2, 1, 3}), b = smooth({4, 3}, 1.0), c = smooth({2, 2, 3}, -2.0);
    check_vmap(f, {a, b, c}, {0, std::nullopt, 1});
    check_vmap(f, {smooth({3, 5, 3}), b, smooth({2, 3}, 7.0)}, {1, std::nullopt, std::nullopt});
    check_vmap(f, {smooth({2, 3, 2}), smooth({4, 3, 2}), smooth({1, 3, 2})}, {-1, -1, -1}, 1);
  }
  SUBCASE("pad with mapped operand and/or padding value") {
    Fn f = [](const V& a) { return lax::pad(a[0], a[1], {{1, -1, 1}, {0, 2, 0}}); };
    Array x = smooth({3, 2, 4}), vs = arr<double>({-1, -2, -3}), v = make_scalar(5.0, f64);
    check_vmap(f, {x, v}, {0, std::nullopt});
    check_vmap(f, {x, vs}, {0, 0});
    check_vmap(f, {smooth({2, 3, 4}), vs}, {1, 0});
    check_vmap(f, {smooth({2, 4, 3}), vs}, {-1, 0}, 2);
    check_vmap(f, {smooth({2, 4}), vs}, {std::nullopt, 0});
  }
  SUBCASE("slice") {
    Fn f = [](const V& a) { return lax::slice(a[0], {1, 0}, {4, 4}, {2, 3}); };
    Fn g = [](const V& a) { return lax::slice(a[0], {0, 1}, {2, 3}); };
    Array x = smooth({3, 5, 4});
    check_vmap(f, {x}, {0});
    check_vmap(g, {x}, {1});
    check_vmap(f, {smooth({5, 4, 3})}, {-1}, 1);
  }
}

TEST_CASE("vmap of dynamic_slice and dynamic_update_slice with batched start indices") {
  using V = std::vector<Array>;
  Fn ds = [](const V& a) { return lax::dynamic_slice(a[0], {a[1], a[2]}, {2, 3}); };
  Array x = smooth({3, 4, 5}), starts = idxs({0, 2, 7}), neg = idxs({-1, 1, -3});
  SUBCASE("dynamic_slice") {
    check_vmap(ds, {x, idx(1), idx(1)}, {0, std::nullopt, std::nullopt});                  // operand only
    check_vmap(ds, {smooth({4, 3, 5}), idx(1), idx(9)}, {1, std::nullopt, std::nullopt});  // clamped
    check_vmap(ds, {smooth({4, 5}), starts, idx(2)}, {std::nullopt, 0, std::nullopt});     // indices only
    check_vmap(ds, {x, starts, neg}, {0, 0, 0});                                           // both, clamped, negative
    check_vmap(ds, {smooth({4, 5, 3}), idx(0), neg}, {-1, std::nullopt, 0}, 2);
  }
  SUBCASE("dynamic_update_slice") {
    Fn dus = [](const V& a) { return lax::dynamic_update_slice(a[0], a[1], {a[2], a[3]}); };
    Array u = smooth({2, 3}, -5.0), us = smooth({3, 2, 3}, -9.0);
    check_vmap(dus, {x, u, idx(1), idx(1)}, {0, std::nullopt, std::nullopt, std::nullopt});
    check_vmap(dus, {smooth({4, 5}), us, idx(3), idx(0)}, {std::nullopt, 0, std::nullopt, std::nullopt});
    check_vmap(dus, {smooth({4, 5}), u, starts, neg}, {std::nullopt, std::nullopt, 0, 0});
    check_vmap(dus, {smooth({4, 3, 5}), us, starts, idx(4)}, {1, 0, 0, std::nullopt});
    check_vmap(dus, {x, smooth({2, 3, 3}), idx(2), neg}, {0, -1, std::nullopt, 0}, 1);
  }
  SUBCASE("the batched form is a single gather / scatter, not a loop") {
    auto cj = make_jaxpr([&](const Array& xs, const Array& ss) {
      return vmap([](const Array& a, const Array& s) { return lax::dynamic_slice(a, {s, idx(0)}, {2, 3}); })(xs, ss);
    })(smooth({3, 4, 5}), starts);
    CHECK(text(cj).find("gather[") != std::string::npos);
    CHECK(text(cj).find("dynamic_slice") == std::string::npos);
  }
}

TEST_CASE("transformations compose: vmap of grad and grad of vmap through slicing") {
  auto loss = [](const Array& x) {
    Array y = lax::pad(lax::slice(x, {1}, {5}, {2}), make_scalar(0.5, f64), {{1, 0, 1}});
    return lax::reduce_sum(lax::mul(y, y), {0});
  };
  Array xs = smooth({3, 6});
  Array gs = vmap(grad(loss))(xs);
  for (int64_t b = 0; b < 3; ++b) {
    Array row = lax::squeeze(lax::slice_in_dim(xs, b, b + 1), {0});
    CHECK(vals(lax::squeeze(lax::slice_in_dim(gs, b, b + 1), {0})) == vals(grad(loss)(row)));
  }
  auto batch_loss = [&](const Array& x) { return lax::reduce_sum(vmap(loss)(x), {0}); };
  CHECK(vals(grad(batch_loss)(xs)) == vals(gs));
}
