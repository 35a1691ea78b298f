// debug::print eagerly, under jit (prints on every call), vmap, grad (once, primal values),
// control flow and shard_map (once per device).
#include <algorithm>
#include <sstream>

#include "test_util.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {
struct Capture {
  std::ostringstream os;
  Capture() { debug::set_print_stream(&os); }
  ~Capture() { debug::set_print_stream(nullptr); }
  std::string str() const { return os.str(); }
};
}  // namespace

TEST_CASE("eagerly, with several values and braces") {
  Capture c;
  debug::print("x={} y={} {{literal}}", jnp::arange(3), Array(2.5f));
  debug::print("m\n{}", jnp::arange(4).reshape({2, 2}));
  CHECK(c.str() == "x=[0 1 2] y=2.5 {literal}\nm\n[[0 1]\n [2 3]]\n");
  CHECK_ERR(debug::print("{} {}", jnp::arange(3)), ValueError, "2 placeholder(s)", "1 value(s)");
  CHECK_ERR(debug::print("{x}", jnp::arange(3)), ValueError, "lone brace");
}

TEST_CASE("under jit it prints on every call, at run time" CJAX_JIT_ONLY) {
  Capture c;
  auto f = jit([](const Array& x) {
    debug::print("x {}", x);
    return x * 2.f;
  });
  f(jnp::ones({2}));
  f(jnp::zeros({2}));
  CHECK(f.trace_count() == 1);
  CHECK(c.str() == "x [1. 1.]\nx [0. 0.]\n");
  std::string text = make_jaxpr([](const Array& x) {
                       debug::print("v {}", x);
                       return x;
                     })(jnp::ones({2}))
                         .str();
  CHECK(text.find("debug_print") != std::string::npos);
}

TEST_CASE("under vmap, grad and control flow") {
  Capture c;
  vmap([](const Array& x) {
    debug::print("{}", x);
    return x;
  })(jnp::arange(4).reshape({2, 2}));
  CHECK(c.str() == "[[0 1]\n [2 3]]\n");
  c.os.str("");
  Array g = grad([](const Array& x) {
    debug::print("primal {}", x);
    return jnp::sum(x * x);
  })(jnp::array(std::vector<float>{1, 2}));
  CHECK(vals(g) == std::vector<double>{2, 4});
  CHECK(c.str() == "primal [1. 2.]\n");
  c.os.str("");
  lax::fori_loop(
      0, 3,
      [](const Array& i, const Array& acc) {
        debug::print("i={}", i);
        return acc + i;
      },
      Array(0));
  CHECK(c.str() == "i=0\ni=1\ni=2\n");
  c.os.str("");
  // A branch that only prints: the cond has no result, and dead-code elimination keeps it.
  auto report = jit([](const Array& x) {
    lax::cond(
        jnp::sum(x) > 0.f,
        [](const Array& v) {
          debug::print("positive {}", v);
          return std::tuple<>{};
        },
        [](const Array&) { return std::tuple<>{}; }, x);
    return x * 2.f;
  });
  report(jnp::ones({2}));
  report(-jnp::ones({2}));
  CHECK(c.str() == "positive [1. 1.]\n");
}

TEST_CASE("inside shard_map each device prints its block") {
  Mesh mesh = make_mesh({4}, {"i"});
  auto f = shard_map(
      [](const Array& x) {
        debug::print("block {}", x);
        return x;
      },
      mesh, P("i"), P("i"));
  {
    Capture c;
    f(jnp::arange(4));
    CHECK(c.str() == "block [0]\nblock [1]\nblock [2]\nblock [3]\n");
  }
  Capture c;
  jit(f)(jnp::arange(4));
  std::string s = c.str();
  for (const char* line : {"block [0]\n", "block [1]\n", "block [2]\n", "block [3]\n"})
    CHECK(s.find(line) != std::string::npos);  // devices print concurrently: any order
  CHECK(std::count(s.begin(), s.end(), '\n') == 4);
}
