// Golden jaxpr texts of transformed programs (JAX's format) and their parser round trips.
#include <doctest/doctest.h>

#include "cjax/cjax.h"
#include "test_util.h"
#include "trace/eval_jaxpr.h"
#include "trace/jaxpr.h"
#include "trace/jaxpr_parser.h"
#include "trace/source_info.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {
// The text parses back to a jaxpr that prints identically, passes check_jaxpr and evaluates to
// the same values as the original on `args`.
void round_trip(const ClosedJaxpr& cj, const std::vector<Array>& args) {
  std::string t = text(cj);
  ClosedJaxpr parsed = parse_closed_jaxpr(t, cj.consts);
  CHECK(text(parsed) == t);
  check_jaxpr(parsed);
  auto a = eval_jaxpr(cj, args), b = eval_jaxpr(parsed, args);
  REQUIRE(a.size() == b.size());
  for (size_t i = 0; i < a.size(); ++i) CHECK(vals(a[i]) == vals(b[i]));
}
}  // namespace

TEST_CASE("grad of an MLP") {
  // The rules mirror JAX's, so this is JAX's text except one known difference: JAX adds a bias
  // f32[4] to f32[5,4] by rank promotion (broadcast_in_dim to shape (1, 4)) and lax's size-1
  // broadcasting in `add`; cjax's lax requires equal shapes, so jnp broadcasts to (5, 4).
  auto loss = [](const std::vector<Array>& p, const Array& x) {
    Array h = jnp::tanh(jnp::matmul(x, p[0]) + p[1]);
    return jnp::sum(jnp::matmul(h, p[2]));
  };
  std::vector<Array> p{jnp::ones({3, 4}) * 0.1f, jnp::ones({4}) * 0.2f, jnp::ones({4, 2}) * 0.3f};
  Array x = jnp::arange(15).reshape({5, 3}).astype(f32) * 0.1f;
  ClosedJaxpr cj = make_jaxpr(grad(loss))(p, x);
  CHECK(text(cj) ==
        "{ lambda ; a:f32[3,4] b:f32[4] c:f32[4,2] d:f32[5,3]. let\n"
        "    e:f32[5,4] = dot_general[\n"
        "      dimension_numbers=(([1], [0]), ([], []))\n"
        "      out_sharding=None\n"
        "      precision=None\n"
        "      preferred_element_type=float32\n"
        "    ] d a\n"
        "    f:f32[5,4] = broadcast_in_dim[\n"
        "      broadcast_dimensions=(1,)\n"
        "      shape=(5, 4)\n"
        "      sharding=None\n"
        "    ] b\n"
        "    g:f32[5,4] = add e f\n"
        "    h:f32[5,4] = tanh g\n"
        "    i:f32[5,4] = sub 1.0:f32[] h\n"
        "    j:f32[5,2] = dot_general[\n"
        "      dimension_numbers=(([1], [0]), ([], []))\n"
        "      out_sharding=None\n"
        "      precision=None\n"
        "      preferred_element_type=float32\n"
        "    ] h c\n"
        "    _:f32[] = reduce_sum[axes=(0, 1) out_sharding=None] j\n"
        "    k:f32[5,2] = broadcast_in_dim[\n"
        "      broadcast_dimensions=()\n"
        "      shape=(5, 2)\n"
        "      sharding=None\n"
        "    ] 1.0:f32[]\n"
        "    l:f32[2,4] = dot_general[\n"
        "      dimension_numbers=(([0], [0]), ([], []))\n"
        "      out_sharding=None\n"
        "      precision=None\n"
        "      preferred_element_type=float32\n"
        "    ] k h\n"
        "    m:f32[4,2] = transpose[permutation=(1, 0)] l\n"
        "    n:f32[5,4] = dot_general[\n"
        "      dimension_numbers=(([1], [1]), ([], []))\n"
        "      out_sharding=None\n"
        "      precision=None\n"
        "      preferred_element_type=float32\n"
        "    ] k c\n"
        "    o:f32[5,4] = transpose[permutation=(0, 1)] n\n"
        "    p:f32[5,4] = mul o i\n"
        "    q:f32[5,4] = mul p h\n"
        "    r:f32[5,4] = add_any p q\n"
        "    s:f32[4] = reduce_sum[axes=(0,) out_sharding=None] r\n"
        "    t:f32[4,3] = dot_general[\n"
        "      dimension_numbers=(([0], [0]), ([], []))\n"
        "      out_sharding=None\n"
        "      precision=None\n"
        "      preferred_element_type=float32\n"
        "    ] r d\n"
        "    u:f32[3,4] = transpose[permutation=(1, 0)] t\n"
        "  in (u, s, m) }");
  round_trip(cj, {p[0], p[1], p[2], x});
}

TEST_CASE("jit inside grad, grad inside jit, vmap of jit: texts round-trip") {
  auto f = jit([](const Array& x) { return lax::mul(lax::sin(x), x); }, {.name = "f"});
  Array x = jnp::array({0.1f, 0.2f, 0.3f});
  round_trip(make_jaxpr([&](const Array& v) { return jnp::sum(f(v)); })(x), {x});
  round_trip(make_jaxpr(grad([&](const Array& v) { return jnp::sum(f(v)); }))(x), {x});
  round_trip(make_jaxpr(vmap(f))(x), {x});
  round_trip(make_jaxpr(jit(grad([](const Array& v) { return jnp::sum(jnp::tanh(v)); }), {.name = "g"}))(x), {x});
}

TEST_CASE("equations record where they were traced") {
  // (A body of its own: GCC folds identical lambdas, and the location is the folded one's.)
  auto f = [](const Array& x) {
    Array y = lax::sin(x);  // the line below is what the mul equation reports
    return lax::mul(y, lax::cos(x));
  };
  int mul_line = __LINE__ - 2;
  ClosedJaxpr cj = make_jaxpr(f)(jnp::array({1.f, 2.f}));
  std::string with = cj.pretty_print(80, true);
  CHECK(with.find("mul b c  # test_golden_transforms.cpp:" + std::to_string(mul_line)) != std::string::npos);
  CHECK(with.find("sin a  # test_golden_transforms.cpp:" + std::to_string(mul_line - 1)) != std::string::npos);
  CHECK(text(cj).find('#') == std::string::npos);  // not printed by default, as in JAX
  config::set_capture_source_info(false);
  CHECK(make_jaxpr(f)(jnp::array({1.f})).pretty_print(80, true).find('#') == std::string::npos);
  config::set_capture_source_info(true);
}
