// Concreteness errors (issue 3 item 7) and the transformation misuse cases: each names what went
// wrong, which argument the value depends on, and the fix.
#include <doctest/doctest.h>

#include "cjax/cjax.h"
#include "core/array/kernel_table.h"
#include "core/array/primitive.h"
#include "core/backend/backend.h"
#include "core/lax/elementwise.h"
#include "test_util.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

TEST_CASE("bool of a tracer under jit names the argument" CJAX_JIT_ONLY) {
  auto f = jit(
      [](const Array& x, const std::map<std::string, Array>& p) {
        if (jnp::sum(p.at("w")) > 0) return x;
        return -x;
      },
      {.name = "step"});
  std::map<std::string, Array> p{{"w", arr<float>({1, 2})}};
  CHECK_ERR(f(make_scalar(1, f32), p), TracerBoolConversionError, "boolean conversion", "bool[]", "jit 'step'",
            "argument 1 (leaf ['w'])", "lax::cond");
}

TEST_CASE("item() and shapes from traced values under jit" CJAX_JIT_ONLY) {
  auto f = jit([](const Array& x, const Array& n) { return jnp::zeros({n.item<int>()}) + x; });
  CHECK_ERR(f(make_scalar(1, f32), make_scalar(3, i32)), ConcretizationError, "item", "argument 1", "static");
  auto g = [](const Array& x) { return x * float(x.item<float>()); };
  CHECK_ERR(make_jaxpr(g)(make_scalar(2, f32)), ConcretizationError, "make_jaxpr", "argument 0");
}

TEST_CASE("under eager grad a tracer over a concrete primal converts to bool, as in JAX" CJAX_JIT_ONLY) {
  auto f = [](const Array& x) { return x > 0 ? lax::mul(x, x) : lax::neg(x); };
  CHECK(grad(f)(make_scalar(3, f32)).item<float>() == 6);
  CHECK(grad(f)(make_scalar(-3, f32)).item<float>() == -1);
  // ... but not under jit(grad): the primal is abstract there.
  CHECK_ERR(jit(grad(f))(make_scalar(3, f32)), TracerBoolConversionError, "argument 0");
}

TEST_CASE("bool of a batched value under vmap") {
  auto f = [](const Array& x) { return x > 0 ? x : -x; };
  CHECK_ERR(vmap(f)(arr<float>({1, -2})), TracerBoolConversionError, "vmap", "batched");
}

TEST_CASE("escaped tracers" CJAX_JIT_ONLY) {
  Array leaked;
  auto f = [&](const Array& x) {
    leaked = lax::sin(x);
    return x;
  };
  const int leak_line = __LINE__ - 3;
  jit(f)(make_scalar(1, f32));
  // The message names where the leaked value was made (the `leaked = lax::sin(x)` line).
  std::string where = "created at test_concretization.cpp:" + std::to_string(leak_line);
  CHECK_ERR(lax::cos(leaked), EscapedTracerError, "escaped", "'cos'", "f32[]", where.c_str());
  grad([&](const Array& x) {
    leaked = lax::sin(x);
    return x;
  })(make_scalar(1, f32));
  CHECK_ERR(lax::cos(leaked), EscapedTracerError, "escaped");
  vmap([&](const Array& x) {
    leaked = lax::sin(x);
    return x;
  })(arr<float>({1, 2}));
  CHECK_ERR(lax::cos(leaked), EscapedTracerError, "escaped");
}

TEST_CASE("transformation misuse") {
  auto sq = [](const Array& x) { return lax::mul(x, x); };
  CHECK_ERR(grad(sq)(arr<float>({1, 2})), ShapeError, "scalar output", "f32[2]", "vjp");
  CHECK_ERR(grad(sq)(make_scalar(2, i32)), DTypeError, "floating", "argument 0", "i32[]");
  CHECK_ERR(vmap(sq)(make_scalar(2, f32)), ValueError, "axis 0", "rank");
  CHECK_ERR(vmap([](const Array& a, const Array& b) { return lax::add(a, b); })(arr<float>({1, 2}),
                                                                                arr<float>({1, 2, 3})),
            ValueError, "inconsistent sizes");
  CHECK_ERR(vmap(sq, {0, 0})(arr<float>({1, 2})), ValueError, "one entry per argument");
  CHECK_ERR(vmap(sq, None)(arr<float>({1, 2})), ValueError, "at least one non-None");
  CHECK_ERR(vmap([](const Array& x) { return lax::sin(x); }, 0, None)(arr<float>({1, 2})), ValueError,
            "out_axes is None");
  auto [out, f_vjp] = vjp(sq, arr<float>({1, 2}));
  CHECK_ERR(f_vjp(arr<float>({1, 2, 3})), ValueError, "cotangent 0", "f32[3]", "f32[2]");
  CHECK_ERR(jvp(sq, std::tuple{arr<float>({1, 2})}, std::tuple{arr<float>({1})}), ValueError, "tangent 0", "f32[1]");
  // A primitive without rules names itself under grad and vmap.
  static const PrimitiveDef& bare = register_primitive([] {
    PrimitiveDef d;
    d.name = "test_rule_less";
    d.arity = Arity::exactly(1);
    d.abstract_eval = [](std::span<const Array> in, const Params&) { return std::vector<AbstractValue>{in[0].aval()}; };
    d.impl = [](std::span<const Array> in, std::span<const AbstractValue>, const Params&) {
      return std::vector<Array>{in[0]};
    };
    return d;
  }());
  auto h = [](const Array& x) { return bind1(bare, {x}); };
  CHECK_ERR(grad(h)(make_scalar(1, f32)), ValueError, "JVP rule for primitive 'test_rule_less'");
  CHECK_ERR(vmap(h)(arr<float>({1, 2})), ValueError, "batching rule for primitive 'test_rule_less'");
  CHECK_ERR(tree::map([](const Array& a, const Array& b) { return a + b; }, std::vector<Array>{jnp::ones({1})},
                      std::vector<Array>{jnp::ones({1}), jnp::ones({1})}),
            ValueError, "");
}

TEST_CASE("eager kernels are found by (primitive, platform); a missing one is a BackendError naming both") {
  // Every primitive runs on the CPU: through the kernel backends/cpu/kernels registered for it, or
  // through its def's platform-independent impl (views, higher-order primitives, collectives).
  for (const PrimitiveDef* d : all_primitives())
    CHECK_MESSAGE(find_implementation(*d, Platform::cpu) != nullptr, d->name);
  // A primitive that computes names no platform: its kernels live in the table.
  CHECK(!prims::elementwise(ScalarOp::Sin).impl);
  CHECK(find_kernel("sin", Platform::cpu) != nullptr);
  CHECK(find_kernel("dot_general", Platform::cpu) != nullptr);

  static const PrimitiveDef& kernel_less = register_primitive([] {
    PrimitiveDef d;
    d.name = "test_kernel_less";
    d.arity = Arity::exactly(1);
    d.abstract_eval = [](std::span<const Array> in, const Params&) { return std::vector<AbstractValue>{in[0].aval()}; };
    return d;
  }());
  Array x = arr<float>({1, 2, 3});
  CHECK_ERR(bind1(kernel_less, {x}), BackendError, "primitive 'test_kernel_less' has no kernel for platform 'cpu'");
  // A kernel registered later (as a library loaded at run time would) is found.
  register_kernel("test_kernel_less", Platform::cpu,
                  [](std::span<const Array> in, std::span<const AbstractValue>, const Params&) {
                    return std::vector<Array>{lax::mul(in[0], in[0])};
                  });
  CHECK(bind1(kernel_less, {x}).to_vector<float>() == std::vector<float>{1, 4, 9});
}
