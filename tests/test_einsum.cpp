// jnp.einsum lowered to dot_general / transpose / reduce. Expected values from numpy.einsum.
#include <doctest/doctest.h>

#include <cmath>

#include "cjax/cjax.h"
#include "test_util.h"

using namespace cjax;
namespace jnp = cjax::numpy;

using namespace cjax::testing;
namespace {}  // namespace

TEST_CASE("einsum bsd,dh->bsh and bhqd,bhkd->bhqk") {
  Array r = jnp::einsum("bsd,dh->bsh", seq({2, 3, 4}, 7, 3), seq({4, 5}, 5, 2));
  CHECK(r.shape() == Shape{2, 3, 5});
  CHECK(vals(r) == std::vector<double>{12.0, 6.0,  0.0, -6.0, -12.0, -6.0, -3.0, 0.0, 3.0,  6.0,
                                       4.0,  2.0,  0.0, -2.0, -4.0,  0.0,  0.0,  0.0, 0.0,  0.0,
                                       -4.0, -2.0, 0.0, 2.0,  4.0,   6.0,  3.0,  0.0, -3.0, -6.0});
  Array s = jnp::einsum("bhqd,bhkd->bhqk", seq({2, 2, 3, 4}, 7, 3), seq({2, 2, 5, 4}, 5, 2));
  CHECK(s.shape() == Shape{2, 2, 3, 5});
  std::vector<double> half = {8.0,  -1.0, -5.0, -4.0, 2.0,  -7.0, -5.0, 2.0,  14.0, -4.0, 6.0,  -2.0, -5.0, -3.0, 4.0,
                              -9.0, 1.0,  16.0, 1.0,  -9.0, 4.0,  -3.0, -5.0, -2.0, 6.0,  -4.0, 14.0, 2.0,  -5.0, -7.0};
  auto v = vals(s);
  CHECK(std::vector<double>(v.begin(), v.begin() + 30) == half);
  CHECK(v[30] == 2.0);
  CHECK(v[59] == 6.0);
}

TEST_CASE("einsum single operand: transpose, diagonal, trace, sums") {
  Array m = seq({3, 3}, 7, 3);
  CHECK(vals(jnp::einsum("ij->ji", m)) == std::vector<double>{-3.0, 0.0, 3.0, -2.0, 1.0, -3.0, -1.0, 2.0, -2.0});
  Array d = jnp::einsum("ii->i", m);
  CHECK(d.shape() == Shape{3});
  CHECK(vals(d) == std::vector<double>{-3.0, 1.0, -2.0});
  Array t = jnp::einsum("ii", m);
  CHECK(t.shape() == Shape{});
  CHECK(t.item<float>() == -4.0f);
  Array t3 = seq({2, 3, 3}, 7, 3);
  CHECK(vals(jnp::einsum("bii->b", t3)) == std::vector<double>{-4.0, 2.0});
  CHECK(vals(jnp::einsum("bij->b", t3)) == std::vector<double>{-5.0, -1.0});
  CHECK(vals(jnp::einsum("ijk->j", t3)) == std::vector<double>{-6.0, 5.0, -5.0});
  CHECK(vals(jnp::einsum("iij->ij", seq({2, 2, 3}, 7, 3))) == std::vector<double>{-3.0, -2.0, -1.0, -1.0, 0.0, 1.0});
  CHECK(vals(jnp::einsum("ba", seq({2, 3}, 7, 3))) == std::vector<double>{-3.0, 0.0, -2.0, 1.0, -1.0, 2.0});
  Array same = seq({2, 3}, 7, 3);
  CHECK(vals(jnp::einsum("ij->ij", same)) == vals(same));
  // The diagonal ignores off-diagonal NaNs (numpy does too).
  Array nanm = jnp::array<float>({1, NAN, NAN, 2}, {2, 2});
  CHECK(nanm.size() == 4);
  CHECK(jnp::einsum("ii->i", nanm).to_vector<float>() == std::vector<float>{1, 2});
  CHECK(std::isnan(jnp::einsum("ij->", nanm).item<float>()));
}

TEST_CASE("einsum vector products, implicit output, three operands") {
  Array x = seq({4}, 7, 3), y = seq({3}, 5, 2);
  Array dotv = jnp::einsum("i,i->", x, seq({4}, 5, 2));
  CHECK(dotv.shape() == Shape{});
  CHECK(dotv.item<float>() == 8.0f);
  Array o = jnp::einsum("i,j->ij", x, y);
  CHECK(o.shape() == Shape{4, 3});
  CHECK(vals(o) == std::vector<double>{6.0, 3.0, 0.0, 4.0, 2.0, 0.0, 2.0, 1.0, 0.0, 0.0, 0.0, 0.0});
  Array a = seq({2, 3}, 7, 3), b = seq({3, 4}, 5, 2);
  Array imp = jnp::einsum("ij,jk", a, b);
  CHECK(imp.shape() == Shape{2, 4});
  CHECK(vals(imp) == std::vector<double>{1.0, 5.0, 4.0, -2.0, 4.0, 2.0, -5.0, -2.0});
  Array three = jnp::einsum("ij,jk,kl->il", a, b, seq({4, 2}, 3, 1));
  CHECK(three.shape() == Shape{2, 2});
  CHECK(vals(three) == std::vector<double>{6.0, -1.0, 0.0, -7.0});
}

TEST_CASE("einsum ellipsis broadcasting") {
  Array r = jnp::einsum("...ij,...jk->...ik", seq({2, 1, 2, 3}, 7, 3), seq({3, 3, 2}, 5, 2));
  CHECK(r.shape() == Shape{2, 3, 2, 2});
  CHECK(vals(r) == std::vector<double>{4.0,   3.0,  4.0, -3.0, 3.0,  -3.0, -3.0, 0.0,  -3.0, 1.0, 0.0,  -2.0,
                                       -10.0, -2.0, 4.0, -1.0, -2.0, -4.0, -1.0, -1.0, -4.0, 9.0, -1.0, -1.0});
  Array imp = jnp::einsum("...j,j", seq({2, 3}, 7, 3), jnp::ones({3}));
  CHECK(imp.shape() == Shape{2});
  CHECK(vals(imp) == std::vector<double>{-6.0, 3.0});
}

TEST_CASE("einsum dtypes: promotion, integers, bool, half") {
  Array p = jnp::einsum("ij,jk->ik", seq({2, 3}, 7, 3, i32), seq({3, 4}, 5, 2));
  CHECK(p.dtype() == f32);
  CHECK(vals(p) == std::vector<double>{1.0, 5.0, 4.0, -2.0, 4.0, 2.0, -5.0, -2.0});
  Array ii = jnp::einsum("ij,jk->ik", seq({2, 3}, 7, 3, i8), seq({3, 4}, 5, 2, i8));
  CHECK(ii.dtype() == i8);
  CHECK(vals(ii) == std::vector<double>{1.0, 5.0, 4.0, -2.0, 4.0, 2.0, -5.0, -2.0});
  Array h = jnp::einsum("ii->i", seq({3, 3}, 7, 3, bf16));
  CHECK(h.dtype() == bf16);
  CHECK(vals(h) == std::vector<double>{-3.0, 1.0, -2.0});
  Array b = jnp::array<bool>({true, false, false, true}, {2, 2});
  Array bd = jnp::einsum("ij,jk->ik", b, b);
  CHECK(bd.dtype() == bool_);
  CHECK(bd.to_vector<bool>() == std::vector<bool>{true, false, false, true});
  CHECK(jnp::einsum("ii->i", b).to_vector<bool>() == std::vector<bool>{true, true});
}

TEST_CASE("einsum misuse") {
  Array a = jnp::ones({2, 3}), b = jnp::ones({4, 5});
  CHECK_THROWS_WITH_AS(jnp::einsum("ij,jk->ik", a), doctest::Contains("name 2 operand(s) but 1 were given"),
                       ValueError);
  CHECK_THROWS_WITH_AS(jnp::einsum("ij,jk->ik", a, b),
                       doctest::Contains("size of label 'j' for operand 1 (4) does not match previous terms (3)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(jnp::einsum("ijk->i", a), doctest::Contains("operand 0 has shape (2, 3) (rank 2)"), ShapeError);
  CHECK_THROWS_WITH_AS(jnp::einsum("ij->iz", a), doctest::Contains("output subscript 'z'"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::einsum("i1->i", a), doctest::Contains("invalid character '1'"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::einsum("ii->i", a),
                       doctest::Contains("size of label 'i' for operand 0 (3) does not "
                                         "match previous terms (2)"),
                       ShapeError);
}
