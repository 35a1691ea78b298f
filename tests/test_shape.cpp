// Shape primitives (broadcast_in_dim, reshape, transpose, squeeze, rev, concatenate, pad, iota)
// and the numpy shape-manipulation functions. Expected values computed with numpy.
#include <doctest/doctest.h>

#include "cjax/cjax.h"
#include "core/array_impl.h"
#include "core/shape.h"

using namespace cjax;
namespace jnp = cjax::numpy;

namespace {
template <class T> std::vector<T> vec(const Array& a) { return a.to_vector<T>(); }
using VI = std::vector<int32_t>;
using VF = std::vector<float>;
}  // namespace

TEST_CASE("broadcast_in_dim basic") {
  Array x = jnp::array<int32_t>({1, 2, 3});
  Array y = lax::broadcast_in_dim(x, {2, 3}, {1});
  CHECK(y.shape() == Shape{2, 3});
  CHECK(vec<int32_t>(y) == VI{1, 2, 3, 1, 2, 3});
  Array z = lax::broadcast_in_dim(x, {3, 2}, {0});
  CHECK(vec<int32_t>(z) == VI{1, 1, 2, 2, 3, 3});
}

TEST_CASE("reshape transpose squeeze concatenate iota slice basic") {
  Array x = jnp::array<float>({0, 1, 2, 3, 4, 5}, {2, 3});
  CHECK(vec<float>(lax::transpose(x, {1, 0})) == VF{0, 3, 1, 4, 2, 5});
  CHECK(lax::reshape(x, {3, 2}).shape() == Shape{3, 2});
  CHECK(lax::squeeze(lax::reshape(x, {1, 6}), {0}).shape() == Shape{6});
  CHECK(vec<float>(lax::concatenate({x, x}, 1)) == VF{0, 1, 2, 0, 1, 2, 3, 4, 5, 3, 4, 5});
  CHECK(vec<int32_t>(lax::iota(i32, 4)) == VI{0, 1, 2, 3});
  CHECK(vec<float>(lax::slice(x, {0, 1}, {2, 3})) == VF{1, 2, 4, 5});
}
