#include <doctest/doctest.h>

#include "cjax/cjax.h"

using namespace cjax;
namespace jnp = cjax::numpy;

TEST_CASE("elementwise add and scalar broadcast") {
  Array x = jnp::array<float>({1, 2, 3});
  Array y = jnp::array<float>({10, 20, 30});
  CHECK(lax::add(x, y).to_vector<float>() == std::vector<float>{11, 22, 33});
  CHECK(lax::mul(x, lax::convert_element_type(Array(2), f32)).to_vector<float>() == std::vector<float>{2, 4, 6});
}
