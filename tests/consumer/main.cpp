// A program written against the public API only (<cjax/cjax.h>), as an outside user would.
#include <cjax/cjax.h>

#include <cmath>
#include <cstdio>

using namespace cjax;
namespace jnp = cjax::numpy;

int main() {
  Array x = jnp::arange(6).astype(f32).reshape({2, 3});
  Array w = jnp::ones({3, 2});
  Array y = jnp::matmul(x, w) * 2.0 + 1;  // [[7, 7], [25, 25]]
  auto v = y.to_vector<float>();
  if (v != std::vector<float>{7, 7, 25, 25}) {
    std::printf("unexpected matmul result\n");
    return 1;
  }
  Array key = random::key(0);
  Array u = random::uniform(key, {4});
  float u0 = u.to_vector<float>()[0];
  if (std::fabs(u0 - 0.947667f) > 1e-6f) {  // docs/prng.md §5 golden value
    std::printf("unexpected uniform %f\n", u0);
    return 1;
  }
  Dict params;
  params["w"] = w;
  params["b"] = jnp::zeros({2});
  if (tree::leaves(params).size() != 2) return 1;
  Array total = jnp::sum(y);
  std::printf("sum = %g\n%s\n", total.item<double>(), to_string(y).c_str());
  return total.item<float>() == 64.0f ? 0 : 1;
}
