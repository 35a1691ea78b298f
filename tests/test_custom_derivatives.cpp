// custom_jvp, custom_vjp and checkpoint (remat): values, the rules being used under jvp / grad /
// jit / vmap, second order, staging, misuse errors, and what checkpoint policies recompute.
#include <doctest/doctest.h>

#include <cmath>

#include "autodiff/check_grads.h"
#include "cjax/cjax.h"
#include "test_util.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {

size_t count(const std::string& s, const std::string& needle) {
  size_t n = 0;
  for (size_t p = s.find(needle); p != std::string::npos; p = s.find(needle, p + 1)) ++n;
  return n;
}

// JAX's example: log(1 + e^x), whose autodiff derivative is nan for large x in f32, with the
// stable rule d/dx = 1 - 1 / (1 + e^x).
auto log1pexp = custom_jvp([](const Array& x) { return jnp::log(1.0 + jnp::exp(x)); },
                           [](const std::tuple<Array>& primals, const std::tuple<Array>& tangents) {
                             auto [x] = primals;
                             auto [t] = tangents;
                             return std::pair{jnp::log(1.0 + jnp::exp(x)), t * (1.0 - 1.0 / (1.0 + jnp::exp(x)))};
                           },
                           {.name = "log1pexp", .jvp_name = "log1pexp_jvp"});

// JAX's example: identity forward, cotangent clipped to [-1, 1] backward.
auto clip_gradient =
    custom_vjp([](const Array& x) { return x; },
               [](const Array& x) {
                 return std::pair{x, std::tuple<>{}};
               },
               [](const std::tuple<>&, const Array& g) { return std::tuple{jnp::clip(g, Array(-1.0), Array(1.0))}; },
               {.name = "clip_gradient", .fwd_name = "clip_fwd", .bwd_name = "clip_bwd"});

// sin with an exact custom vjp that saves cos(x) as its residual.
auto vjp_sin = custom_vjp([](const Array& x) { return jnp::sin(x); },
                          [](const Array& x) {
                            return std::pair{jnp::sin(x), jnp::cos(x)};
                          },
                          [](const Array& cos_x, const Array& g) { return std::tuple{g * cos_x}; },
                          {.name = "vjp_sin", .fwd_name = "vjp_sin_fwd", .bwd_name = "vjp_sin_bwd"});

}  // namespace

TEST_CASE("custom_jvp: the rule is used by jvp, grad and jit; calling evaluates f") {
  Array x = make_scalar(3.0, f32);
  CHECK(log1pexp(x).item<float>() == doctest::Approx(std::log1p(std::exp(3.0))));
  CHECK(grad(log1pexp)(make_scalar(0.0, f32)).item<float>() == doctest::Approx(0.5));
  // exp(100) overflows f32: plain autodiff gives nan, the rule gives 1.
  Array big = make_scalar(100.0, f32);
  CHECK(std::isnan(grad([](const Array& v) { return jnp::log(1.0 + jnp::exp(v)); })(big).item<float>()));
  CHECK(grad(log1pexp)(big).item<float>() == 1.0f);
  auto [out, tan] = jvp(log1pexp, std::tuple{big}, std::tuple{make_scalar(2.0, f32)});
  CHECK(std::isinf(out.item<float>()));
  CHECK(tan.item<float>() == 2.0f);
  CHECK(jit(grad(log1pexp))(big).item<float>() == 1.0f);
  CHECK(grad(jit(log1pexp))(big).item<float>() == 1.0f);
  // A rule that is deliberately not the derivative shows that it is what differentiation uses.
  auto fake = custom_jvp([](const Array& v) { return jnp::sin(v); },
                         [](const std::tuple<Array>& p, const std::tuple<Array>& t) {
                           return std::pair{jnp::sin(std::get<0>(p)), std::get<0>(t) * 3.0};
                         });
  CHECK(grad(fake)(make_scalar(0.4, f64)).item<double>() == 3.0);
  CHECK(fake(make_scalar(0.4, f64)).item<double>() == doctest::Approx(std::sin(0.4)));
}

TEST_CASE("custom_jvp: several arguments, zero tangents, check_grads, second order, vmap") {
  // JAX's f(x, y) = sin(x) * y with its exact rule.
  auto f = custom_jvp([](const Array& x, const Array& y) { return jnp::sin(x) * y; },
                      [](const std::tuple<Array, Array>& p, const std::tuple<Array, Array>& t) {
                        auto [x, y] = p;
                        auto [dx, dy] = t;
                        return std::pair{jnp::sin(x) * y, jnp::cos(x) * dx * y + jnp::sin(x) * dy};
                      });
  Array x = arr<double>({0.3, -1.2, 2.0}), y = arr<double>({1.5, 0.5, -2.0});
  auto gx = grad([&](const Array& a) { return jnp::sum(f(a, y)); })(x);
  for (int i = 0; i < 3; ++i) CHECK(vals(gx)[i] == doctest::Approx(std::cos(vals(x)[i]) * vals(y)[i]));
  // y's tangent reaches the rule as zeros (not perturbed): only the dx term remains.
  auto [o, t] = jvp([&](const Array& a) { return f(a, y); }, std::tuple{x}, std::tuple{jnp::ones({3}, f64)});
  CHECK(vals(t) == vals(jnp::cos(x) * y));
  check_grads([&](const std::vector<Array>& a) { return std::vector<Array>{f(a[0], a[1])}; }, {x, y}, {.order = 2});
  // Second order differentiates through the rule: d2/dx2 sin(x) y = -sin(x) y.
  Array x0 = make_scalar(0.7, f64), y0 = make_scalar(2.0, f64);
  Array h = grad(grad([&](const Array& a) { return f(a, y0); }))(x0);
  CHECK(h.item<double>() == doctest::Approx(-std::sin(0.7) * 2.0));
  // vmap of f, of its grad, and grad of a vmapped f.
  Array xs = arr<double>({0.1, 0.2, 0.3, 0.4, 0.5, 0.6}, {2, 3});
  CHECK(vals(vmap(f, {0, None})(xs, y)) == vals(jnp::sin(xs) * y));
  Array gv = vmap(grad([&](const Array& a) { return jnp::sum(f(a, y)); }))(xs);
  CHECK(vals(gv) == vals(jnp::cos(xs) * y));
  Array gb = grad([&](const Array& a) { return jnp::sum(vmap(f, {1, None}, 1)(a, y)); })(xs.T());
  std::vector<double> want = vals((jnp::cos(xs.T()) * y.reshape({3, 1})));
  for (size_t i = 0; i < want.size(); ++i) CHECK(vals(gb)[i] == doctest::Approx(want[i]));
  // jvp of a vmapped custom_jvp function uses the batched rule.
  auto [vo, vt] = jvp(
      [&](const Array& a) {
        return vmap(f, {0, None})(a, y);
      },
      std::tuple{xs}, std::tuple{jnp::ones({2, 3}, f64)});
  CHECK(vals(vt) == vals(jnp::cos(xs) * y));
}

TEST_CASE("custom_jvp: staged as custom_jvp_call") {
  auto cj = make_jaxpr(log1pexp)(make_scalar(1.0, f32));
  CHECK(text(cj) ==
        "{ lambda ; a:f32[]. let\n"
        "    b:f32[] = custom_jvp_call[\n"
        "      name=log1pexp\n"
        "      call_jaxpr={ lambda ; c:f32[]. let\n"
        "          d:f32[] = exp c\n"
        "          e:f32[] = add 1.0:f32[] d\n"
        "          f:f32[] = log e\n"
        "        in (f,) }\n"
        "      jvp=log1pexp_jvp\n"
        "      symbolic_zeros=False\n"
        "    ] a\n"
        "  in (b,) }");
  // Under grad the rule's tangent work is staged (no custom_jvp_call remains).
  std::string g = text(make_jaxpr(grad(log1pexp))(make_scalar(1.0, f32)));
  CHECK(g.find("custom_jvp_call") == std::string::npos);
  CHECK(g.find("div") != std::string::npos);
}

TEST_CASE("custom_vjp: clipped gradient") {
  // d/dx sum(5 * clip_gradient(x)): the cotangent 5 is clipped to 1.
  auto loss = [](const Array& x) { return jnp::sum(5.0 * clip_gradient(x)); };
  Array x = arr<float>({1, -2, 3});
  CHECK(vals(clip_gradient(x)) == vals(x));
  CHECK(vals(grad(loss)(x)) == std::vector<double>{1, 1, 1});
  auto small = [](const Array& v) { return jnp::sum(0.25 * clip_gradient(v)); };
  CHECK(vals(grad(small)(x)) == std::vector<double>{0.25, 0.25, 0.25});
  auto neg = [](const Array& v) { return jnp::sum(-7.0 * clip_gradient(v * 2.0)); };
  CHECK(vals(grad(neg)(x)) == std::vector<double>{-2, -2, -2});  // clip(-7) * 2
  // jit either side of grad, vmap either side of grad.
  CHECK(vals(jit(clip_gradient)(x)) == vals(x));
  std::string staged_vmap = text(make_jaxpr(vmap(clip_gradient))(arr<float>({1, 2}, {2, 1})));
  CHECK(staged_vmap.find("custom_vjp_call[\n      name=clip_gradient") != std::string::npos);
  CHECK(staged_vmap.find("c:f32[2,1]. let  in (c,)") != std::string::npos);
  CHECK(vals(jit(grad(loss))(x)) == std::vector<double>{1, 1, 1});
  CHECK(vals(grad(jit(loss))(x)) == std::vector<double>{1, 1, 1});
  Array xs = arr<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  auto row = [](const Array& v) { return jnp::sum(jnp::arange(3).astype(f32) * clip_gradient(v)); };
  CHECK(vals(vmap(grad(row))(xs)) == std::vector<double>{0, 1, 1, 0, 1, 1});
  Array gb = grad([&](const Array& v) { return jnp::sum(vmap(row)(v)); })(xs);
  CHECK(vals(gb) == std::vector<double>{0, 1, 1, 0, 1, 1});
  // vmap with an unbatched argument: its cotangent is summed over the batch.
  auto two = custom_vjp([](const Array& a, const Array& b) { return a * b; },
                        [](const Array& a, const Array& b) {
                          return std::pair{a * b, std::tuple{a, b}};
                        },
                        [](const std::tuple<Array, Array>& r, const Array& g) {
                          return std::tuple{g * std::get<1>(r), g * std::get<0>(r)};
                        });
  Array b = arr<float>({2, 3, 4});
  auto [gxs, gbb] = grad(
      [&](const Array& a, const Array& c) {
        return jnp::sum(vmap(two, {0, None})(a, c));
      },
      argnums<0, 1>)(xs, b);
  CHECK(vals(gxs) == std::vector<double>{2, 3, 4, 2, 3, 4});
  CHECK(vals(gbb) == std::vector<double>{5, 7, 9});
}

TEST_CASE("custom_vjp: exact rule, residuals, second order, staging") {
  Array x = arr<double>({0.3, -1.1, 2.5});
  auto loss = [](const Array& v) { return jnp::sum(vjp_sin(v) * v); };
  Array g = grad(loss)(x);
  for (int i = 0; i < 3; ++i) {
    double xi = vals(x)[i];
    CHECK(vals(g)[i] == doctest::Approx(std::cos(xi) * xi + std::sin(xi)));
  }
  // Second order differentiates through fwd and bwd: d2/dx2 sin x = -sin x.
  Array x0 = make_scalar(0.9, f64);
  CHECK(grad(grad(vjp_sin))(x0).item<double>() == doctest::Approx(-std::sin(0.9)));
  // vjp with a tree argument and tree residuals.
  auto norm2 =
      custom_vjp([](const std::vector<Array>& v) { return jnp::sum(v[0] * v[0]) + jnp::sum(v[1] * v[1]); },
                 [](const std::vector<Array>& v) {
                   return std::pair{jnp::sum(v[0] * v[0]) + jnp::sum(v[1] * v[1]), std::vector<Array>{v[0], v[1]}};
                 },
                 [](const std::vector<Array>& r, const Array& ct) {
                   return std::tuple{std::vector<Array>{2.0 * ct * r[0], 2.0 * ct * r[1]}};
                 });
  std::vector<Array> v{arr<double>({1, 2}), arr<double>({3})};
  auto gv = grad(norm2)(v);
  CHECK(vals(gv[0]) == std::vector<double>{2, 4});
  CHECK(vals(gv[1]) == std::vector<double>{6});
  // Staged: custom_vjp_call with JAX's params; under grad fwd runs forward and bwd backward.
  auto cj = make_jaxpr(clip_gradient)(make_scalar(1.0, f32));
  CHECK(text(cj) ==
        "{ lambda ; a:f32[]. let\n"
        "    b:f32[] = custom_vjp_call[\n"
        "      name=clip_gradient\n"
        "      bwd=clip_bwd\n"
        "      call_jaxpr={ lambda ; c:f32[]. let  in (c,) }\n"
        "      fwd=clip_fwd\n"
        "      symbolic_zeros=False\n"
        "    ] a\n"
        "  in (b,) }");
  std::string gj = text(make_jaxpr(grad(vjp_sin))(make_scalar(1.0, f32)));
  CHECK(gj.find("custom_vjp_call") == std::string::npos);
  CHECK(count(gj, "= cos ") == 1);  // the residual from fwd
  CHECK(count(gj, "= mul ") == 1);  // bwd
}

TEST_CASE("custom rules: misuse errors") {
  CHECK_ERR(jvp(vjp_sin, std::tuple{make_scalar(1.0, f32)}, std::tuple{make_scalar(1.0, f32)}), ValueError,
            "can't apply forward-mode autodiff (jvp) to a custom_vjp function");
  CHECK_ERR(jacfwd(vjp_sin)(arr<float>({1, 2})), ValueError, "forward-mode");
  auto bad_bwd = custom_vjp([](const Array& x) { return x * 2.0; },
                            [](const Array& x) {
                              return std::pair{x * 2.0, std::tuple<>{}};
                            },
                            [](const std::tuple<>&, const Array& g) {
                              return std::tuple{g, g};
                            },
                            {.name = "double", .bwd_name = "double_bwd"});
  CHECK_ERR(grad(bad_bwd)(make_scalar(1.0, f32)), ValueError, "double_bwd", "'double'", "PyTreeDef((*, *))",
            "PyTreeDef((*,))");
  auto bad_shape = custom_vjp([](const Array& x) { return jnp::sum(x); },
                              [](const Array& x) {
                                return std::pair{jnp::sum(x), std::tuple<>{}};
                              },
                              [](const std::tuple<>&, const Array& g) { return std::tuple{g}; },
                              {.name = "total", .bwd_name = "total_bwd"});
  CHECK_ERR(grad(bad_shape)(arr<float>({1, 2})), ValueError, "total_bwd", "f32[]", "f32[2]");
  auto bad_tangent = custom_jvp([](const Array& x) { return x * 2.0; },
                                [](const std::tuple<Array>& p, const std::tuple<Array>& t) {
                                  return std::pair{std::get<0>(p) * 2.0, jnp::sum(std::get<0>(t))};
                                },
                                {.name = "twice", .jvp_name = "twice_jvp"});
  CHECK_ERR(jvp(bad_tangent, std::tuple{arr<float>({1, 2})}, std::tuple{arr<float>({1, 1})}), ShapeError,
            "Custom JVP rule 'twice_jvp'", "primal f32[2] with tangent f32[]");
  // Differentiating with respect to a closed-over value is not covered by the rules.
  CHECK_ERR(grad([](const Array& y) {
              auto g = custom_jvp([&](const Array& x) { return x * y; },
                                  [&](const std::tuple<Array>& p, const std::tuple<Array>& t) {
                                    return std::pair{std::get<0>(p) * y, std::get<0>(t) * y};
                                  },
                                  {.name = "scale"});
              return g(make_scalar(2.0, f32));
            })(make_scalar(3.0, f32)),
            ValueError, "custom_jvp function ('scale')", "closed-over value");
  CHECK_ERR(grad([](const Array& y) {
              auto g = custom_vjp([&](const Array& x) { return x * y; },
                                  [&](const Array& x) {
                                    return std::pair{x * y, std::tuple<>{}};
                                  },
                                  [&](const std::tuple<>&, const Array& c) { return std::tuple{c}; });
              return g(make_scalar(2.0, f32));
            })(make_scalar(3.0, f32)),
            ValueError, "closed-over value");
}

namespace {
auto sin_sin = [](const Array& x) { return jnp::sin(jnp::sin(x)); };
}  // namespace

TEST_CASE("checkpoint: same values and gradients, staged as remat2") {
  Array x = make_scalar(0.6, f32);
  auto c = checkpoint(sin_sin);
  CHECK(c(x).item<float>() == sin_sin(x).item<float>());
  CHECK(grad(c)(x).item<float>() == grad(sin_sin)(x).item<float>());
  CHECK(grad(grad(c))(x).item<float>() == doctest::Approx(grad(grad(sin_sin))(x).item<float>()));
  CHECK(jit(grad(c))(x).item<float>() == doctest::Approx(grad(sin_sin)(x).item<float>()));
  CHECK(grad(jit(c))(x).item<float>() == doctest::Approx(grad(sin_sin)(x).item<float>()));
  CHECK(jit(c)(x).item<float>() == sin_sin(x).item<float>());
  Array xs = arr<float>({0.1, 0.5, 0.9});
  CHECK(vals(vmap(grad(c))(xs)) == vals(vmap(grad(sin_sin))(xs)));
  CHECK(vals(grad([&](const Array& v) { return jnp::sum(vmap(c)(v)); })(xs)) == vals(vmap(grad(sin_sin))(xs)));
  auto [o, t] = jvp(c, std::tuple{x}, std::tuple{make_scalar(1.0, f32)});
  CHECK(t.item<float>() == grad(sin_sin)(x).item<float>());
  CHECK(text(make_jaxpr(c)(x)) ==
        "{ lambda ; a:f32[]. let\n"
        "    b:f32[] = remat2[\n"
        "      differentiated=False\n"
        "      jaxpr={ lambda ; c:f32[]. let d:f32[] = sin c; e:f32[] = sin d in (e,) }\n"
        "      policy=None\n"
        "      prevent_cse=True\n"
        "    ] a\n"
        "  in (b,) }");
  // grad of grad keeps the remat2 equations (JAX's test_remat_higher_order_ad_preserves_remat_primitive).
  CHECK(text(make_jaxpr(grad(grad(c)))(x)).find("remat2") != std::string::npos);
  check_grads([&](const std::vector<Array>& a) { return std::vector<Array>{c(a[0])}; }, {arr<double>({0.3, -0.8})},
              {.order = 2});
  CHECK(hessian(c)(make_scalar(0.6, f64)).item<double>() ==
        doctest::Approx(hessian(sin_sin)(make_scalar(0.6, f64)).item<double>()));
  // Custom rules inside a checkpoint are still used.
  CHECK(grad(checkpoint(log1pexp))(make_scalar(100.0, f32)).item<float>() == 1.0f);
  auto clipped = checkpoint([](const Array& v) { return jnp::sum(5.0 * clip_gradient(jnp::sin(v))); });
  Array v = arr<float>({0.5, 1.0});
  std::vector<double> want = vals(jnp::cos(v));
  for (size_t i = 0; i < 2; ++i) CHECK(vals(grad(clipped)(v))[i] == doctest::Approx(want[i]));
}

TEST_CASE("checkpoint: the policy decides what the backward pass recomputes") {
  Array x = make_scalar(0.6, f32);
  auto split = [](const std::string& s) {  // (forward part, the backward remat2 equation)
    size_t p = s.find("remat2[");
    REQUIRE(p != std::string::npos);
    return std::pair{s.substr(0, p), s.substr(p)};
  };
  // Without checkpoint: sin twice, and cos of each saved for the backward pass.
  std::string plain = text(make_jaxpr(grad(sin_sin))(x));
  CHECK(count(plain, "= sin ") == 2);
  // nothing_saveable: only the input is saved; the backward pass recomputes sin(x) (for cos(sin x)).
  auto [fwd0, bwd0] = split(text(make_jaxpr(grad(checkpoint(sin_sin)))(x)));
  CHECK(count(fwd0, "= sin ") == 2);
  CHECK(count(fwd0, "= cos ") == 0);
  CHECK(count(bwd0, "= sin ") == 1);
  CHECK(count(bwd0, "= cos ") == 2);
  CHECK(bwd0.find("differentiated=True") != std::string::npos);
  // everything_saveable: nothing is recomputed.
  auto [fwd1, bwd1] = split(text(make_jaxpr(grad(checkpoint(sin_sin, checkpoint_policies::everything_saveable)))(x)));
  CHECK(count(fwd1, "= cos ") == 2);
  CHECK(count(bwd1, "= sin ") == 0);
  CHECK(count(bwd1, "= cos ") == 0);
  CHECK(bwd1.find("policy=everything_saveable") != std::string::npos);
  // save everything except cos: cos(x) and cos(sin x) are recomputed from the saved x and sin x.
  auto [fwd2, bwd2] =
      split(text(make_jaxpr(grad(checkpoint(sin_sin, checkpoint_policies::save_everything_except({"cos"}))))(x)));
  CHECK(count(fwd2, "= cos ") == 0);
  CHECK(count(bwd2, "= cos ") == 2);
  CHECK(count(bwd2, "= sin ") == 0);
  CHECK(bwd2.find("policy=save_everything_except('cos')") != std::string::npos);
  // save everything except sin: the cos values are saved, so nothing needs sin again.
  auto [fwd3, bwd3] =
      split(text(make_jaxpr(grad(checkpoint(sin_sin, checkpoint_policies::save_everything_except({"sin"}))))(x)));
  CHECK(count(fwd3, "= cos ") == 2);
  CHECK(count(bwd3, "= sin ") + count(bwd3, "= cos ") == 0);
  // Gradients agree under every policy.
  for (const CheckpointPolicy& p :
       {checkpoint_policies::nothing_saveable, checkpoint_policies::everything_saveable,
        checkpoint_policies::dots_saveable, checkpoint_policies::save_everything_except({"sin"})})
    CHECK(grad(checkpoint(sin_sin, p))(x).item<float>() == doctest::Approx(grad(sin_sin)(x).item<float>()));
}

TEST_CASE("checkpoint: dots_saveable saves matmul outputs and recomputes elementwise ops") {
  Array w = arr<float>({0.1, 0.2, -0.3, 0.4, 0.5, -0.6}, {2, 3});
  Array x = arr<float>({1.0, -0.5, 0.25});
  auto layer = [](const Array& w, const Array& x) { return jnp::sum(jnp::sin(jnp::tanh(jnp::matmul(w, x)))); };
  auto vg = [&](auto f) { return grad(f, argnums<0, 1>)(w, x); };
  auto [gw0, gx0] = vg(layer);
  auto [gw1, gx1] = vg(checkpoint(layer, checkpoint_policies::dots_saveable));
  auto [gw2, gx2] = vg(checkpoint(layer));
  for (size_t i = 0; i < 6; ++i) {
    CHECK(vals(gw1)[i] == doctest::Approx(vals(gw0)[i]));
    CHECK(vals(gw2)[i] == doctest::Approx(vals(gw0)[i]));
  }
  CHECK(vals(gx1)[2] == doctest::Approx(vals(gx0)[2]));
  auto staged = [&](auto f) { return text(make_jaxpr(grad(f, argnums<0, 1>))(w, x)); };
  std::string dots = staged(checkpoint(layer, checkpoint_policies::dots_saveable));
  std::string none = staged(checkpoint(layer));
  // The backward jaxpr has more than 10 equations, so it is hoisted (`let jaxpr = { ... } in`).
  // The forward matmul (contracting ([1], [0])) runs again in the backward pass only without
  // dots_saveable, where the remat2 equation takes just the inputs (r q) as residuals; tanh is
  // recomputed under both (its output feeds cos and the tanh derivative).
  CHECK(count(none, "dimension_numbers=(([1], [0]), ([], []))") == 2);
  CHECK(count(dots, "dimension_numbers=(([1], [0]), ([], []))") == 1);
  CHECK(count(none, "= tanh ") == 2);
  CHECK(count(dots, "= tanh ") == 2);
  CHECK(none.find("] r q 1.0:f32[]") != std::string::npos);
  CHECK(dots.find("] r q s 1.0:f32[]") != std::string::npos);
}
