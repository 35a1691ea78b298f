// dot_general and the numpy linear-algebra functions. Expected values from numpy (offline).
#include <cblas.h>
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>

#include "backends/cpu/kernels/gemm_choice.h"
#include "backends/cpu/kernels/gemm_xsmm.h"
#include "backends/cpu/kernels/scratch.h"
#include "cjax/cjax.h"
#include "core/array/primitive.h"
#include "core/backend/backend.h"
#include "core/backend/kernel_cache.h"
#include "core/backend/parallel.h"
#include "core/lax/linalg.h"
#include "jit/executable.h"
#include "test_util.h"

using namespace cjax;
namespace jnp = cjax::numpy;
using DN = lax::DotDimensionNumbers;

using namespace cjax::testing;
namespace {
DN mm() { return DN{{{1}, {0}}, {{}, {}}}; }
// Naive reference for C[b] = A[b] @ B[b] on row-major data.
std::vector<double> ref_bmm(const std::vector<double>& a, const std::vector<double>& b, int64_t B, int64_t M, int64_t K,
                            int64_t N) {
  std::vector<double> c(size_t(B * M * N), 0.0);
  for (int64_t z = 0; z < B; ++z)
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < K; ++k)
        for (int64_t j = 0; j < N; ++j)
          c[size_t((z * M + i) * N + j)] += a[size_t((z * M + i) * K + k)] * b[size_t((z * K + k) * N + j)];
  return c;
}
void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) bad += !(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])));
  CHECK(bad == 0);
}
}  // namespace

TEST_CASE("dot_general plain and transposed operands (BLAS transpose flags)") {
  Array a = seq({2, 3}, 7, 3), b = seq({3, 4}, 5, 2);
  Array c = lax::dot_general(a, b, mm());
  CHECK(c.shape() == Shape{2, 4});
  CHECK(vals(c) == std::vector<double>{1.0, 5.0, 4.0, -2.0, 4.0, 2.0, -5.0, -2.0});
  // lhs stored [K, M] contracting dim 0; rhs stored [N, K] contracting dim 1.
  Array at = seq({3, 2}, 7, 3), bt = seq({4, 3}, 5, 2);
  Array t = lax::dot_general(at, bt, DN{{{0}, {1}}, {{}, {}}});
  CHECK(t.shape() == Shape{2, 4});
  CHECK(vals(t) == std::vector<double>{7.0, -7.0, 4.0, -5.0, 4.0, -6.0, 4.0, -6.0});
  // Mixed: only one side transposed, checked against the naive product.
  Array u = lax::dot_general(at, b, DN{{{0}, {0}}, {{}, {}}});
  check_close(vals(u), ref_bmm(vals(at.T()), vals(b), 1, 2, 3, 4), 0);
}

TEST_CASE("dot_general batch dims in non-leading positions on both sides") {
  Array a = seq({3, 2, 4}, 7, 3), b = seq({4, 5, 2}, 5, 2);
  Array c = lax::dot_general(a, b, DN{{{2}, {0}}, {{1}, {2}}});
  CHECK(c.shape() == Shape{2, 3, 5});
  CHECK(vals(c) == std::vector<double>{12.0, 0.0, -12.0, 6.0,  -6.0, 4.0,  0.0,  -4.0, 2.0, -2.0,
                                       -4.0, 0.0, 4.0,   -2.0, 2.0,  -3.0, 3.0,  -6.0, 0.0, 6.0,
                                       0.0,  0.0, 0.0,   0.0,  0.0,  3.0,  -3.0, 6.0,  0.0, -6.0});
}

TEST_CASE("dot_general contracting several dims (copy path)") {
  Array a = seq({2, 3, 4}, 7, 3), b = seq({4, 3, 5}, 5, 2);
  Array c = lax::dot_general(a, b, DN{{{1, 2}, {1, 0}}, {{}, {}}});
  CHECK(c.shape() == Shape{2, 5});
  CHECK(vals(c) == std::vector<double>{10.0, 5.0, 0.0, -5.0, -10.0, 2.0, 1.0, 0.0, -1.0, -2.0});
}

TEST_CASE("dot_general every dtype") {
  std::vector<double> a{1, 2, 3, 4, 5, 6}, b{1, 0, 0, 1, 1, 1};
  for (DType dt : {i8, i16, i32, i64, u8, u32, bf16, f16, f32, f64}) {
    CAPTURE(dtype_name(dt));
    Array c = lax::dot_general(jnp::array(a, {2, 3}).astype(dt), jnp::array(b, {3, 2}).astype(dt), mm());
    CHECK(c.dtype() == dt);
    CHECK(vals(c) == std::vector<double>{4, 5, 10, 11});
  }
  Array ba = jnp::array<bool>({true, false, true, false, false, false}, {2, 3});
  Array bb = jnp::array<bool>({false, true, true, false, false, false}, {3, 2});
  Array bc = lax::dot_general(ba, bb, mm());
  CHECK(bc.dtype() == bool_);
  CHECK(bc.to_vector<bool>() == std::vector<bool>{false, true, false, false});
}

TEST_CASE("dot_general integer wrapping and preferred_element_type") {
  Array a = jnp::array<int8_t>({100, 100}, {1, 2}), b = jnp::array<int8_t>({2, 1}, {2, 1});
  CHECK(lax::dot_general(a, b, mm()).to_vector<int>() == std::vector<int>{44});
  Array w = lax::dot_general(a, b, mm(), i32);
  CHECK(w.dtype() == i32);
  CHECK(w.to_vector<int>() == std::vector<int>{300});
  Array ua = jnp::array<uint8_t>({200, 100}, {1, 2}), ub = jnp::array<uint8_t>({1, 1}, {2, 1});
  CHECK(lax::dot_general(ua, ub, mm()).to_vector<int>() == std::vector<int>{44});
  Array ia = jnp::array<int32_t>({1 << 30, 1 << 30}, {1, 2}), ib = jnp::array<int32_t>({2, 2}, {2, 1});
  CHECK(lax::dot_general(ia, ib, mm()).to_vector<int>() == std::vector<int>{0});
  // bf16 inputs accumulated in f32: 256 + 1 + 1 is not representable in bf16 but is in f32.
  Array h = jnp::array<float>({256, 1, 1}, {1, 3}).astype(bf16), o = jnp::ones({3, 1}, bf16);
  Array hf = lax::dot_general(h, o, mm(), f32);
  CHECK(hf.dtype() == f32);
  CHECK(hf.item<float>() == 258.0f);
  CHECK(lax::dot_general(h, o, mm()).item<float>() == 258.0f);  // 258 is a bf16 value
  Array d = lax::dot_general(seq({2, 3}, 7, 3), seq({3, 4}, 5, 2), mm(), f64);
  CHECK(d.dtype() == f64);
  CHECK(vals(d) == std::vector<double>{1.0, 5.0, 4.0, -2.0, 4.0, 2.0, -5.0, -2.0});
}

TEST_CASE("dot_general zero-size dims and scalars") {
  Array z = lax::dot_general(jnp::ones({2, 0}), jnp::ones({0, 3}), mm());
  CHECK(z.shape() == Shape{2, 3});
  CHECK(vals(z) == std::vector<double>(6, 0.0));
  Array zi = lax::dot_general(jnp::ones({2, 0}, i32), jnp::ones({0, 3}, i32), mm());
  CHECK(zi.to_vector<int>() == std::vector<int>(6, 0));
  Array e = lax::dot_general(jnp::ones({0, 4}), jnp::ones({4, 3}), mm());
  CHECK(e.shape() == Shape{0, 3});
  Array s = lax::dot_general(Array(3.0f), jnp::array<float>({1, 2}), DN{});
  CHECK(s.shape() == Shape{2});
  CHECK(vals(s) == std::vector<double>{3, 6});
  Array vv = lax::dot_general(jnp::array<float>({1, 2, 3}), jnp::array<float>({4, 5, 6}), DN{{{0}, {0}}, {{}, {}}});
  CHECK(vv.shape() == Shape{});
  CHECK(vv.item<float>() == 32.0f);
}

TEST_CASE("dot_general NaN and Inf propagate") {
  Array a = jnp::array<float>({NAN, 1, 1, 1}, {2, 2}), b = jnp::array<float>({1, 1, INFINITY, 1}, {2, 2});
  auto v = lax::dot_general(a, b, mm()).to_vector<float>();
  CHECK(std::isnan(v[0]));
  CHECK(std::isnan(v[1]));
  CHECK(std::isinf(v[2]));
  CHECK(v[3] == 2.0f);
}

TEST_CASE("dot_general batched small and large against a naive reference") {
  for (auto [B, M, K, N] : std::vector<std::array<int64_t, 4>>{{16, 20, 30, 10}, {2, 300, 200, 100}, {64, 4, 4, 4}}) {
    CAPTURE(B);
    CAPTURE(M);
    Array a = seq({B, M, K}, 11, 5), b = seq({B, K, N}, 13, 6);
    Array c = lax::dot_general(a, b, DN{{{2}, {1}}, {{0}, {0}}});
    CHECK(c.shape() == Shape{B, M, N});
    check_close(vals(c), ref_bmm(vals(a), vals(b), B, M, K, N), 1e-6);
    // bf16 through the f32 path with the batch dims interleaved (copy path)
    Array a2 = seq({M, B, K}, 11, 5, bf16), b2 = seq({K, B, N}, 13, 6, bf16);
    Array c2 = lax::dot_general(a2, b2, DN{{{2}, {0}}, {{1}, {1}}}, f32);
    CHECK(c2.shape() == Shape{B, M, N});
  }
  // int path on a bigger shape
  Array ai = seq({3, 40, 50}, 11, 5, i32), bi = seq({3, 50, 30}, 13, 6, i32);
  Array ci = lax::dot_general(ai, bi, DN{{{2}, {1}}, {{0}, {0}}});
  check_close(vals(ci), ref_bmm(vals(ai), vals(bi), 3, 40, 50, 30), 0);
}

TEST_CASE("dot_general attention layouts: batch dims interleaved with matrix dims, no copy") {
  // q [b, s, n, h] x k [b, t, n, h] -> [b, n, s, t], batched over (b, n): each operand is a
  // strided view (two batch strides, ld = n*h), in f32 and f64, against transposed copies.
  for (DType dt : {f32, f64}) {
    const int64_t b = 3, s = 5, t = 7, n = 4, h = 6;
    Array q = seq({b, s, n, h}, 11, 5, dt), k = seq({b, t, n, h}, 13, 6, dt);
    Array scores = lax::dot_general(q, k, DN{{{3}, {3}}, {{0, 2}, {0, 2}}});
    CHECK(scores.shape() == Shape{b, n, s, t});
    Array qc = lax::transpose(q, {0, 2, 1, 3}).reshape({b * n, s, h});
    Array kc = lax::transpose(k, {0, 2, 3, 1}).reshape({b * n, h, t});
    check_close(vals(scores), ref_bmm(vals(qc), vals(kc), b * n, s, h, t), 1e-6);
    // probabilities [b, n, s, t] x v [b, t, n, h] -> [b, n, s, h]
    Array v = seq({b, t, n, h}, 7, 3, dt);
    Array out = lax::dot_general(scores, v, DN{{{3}, {1}}, {{0, 1}, {0, 2}}});
    Array vc = lax::transpose(v, {0, 2, 1, 3}).reshape({b * n, t, h});
    check_close(vals(out), ref_bmm(vals(scores), vals(vc), b * n, s, t, h), 1e-6);
  }
}

TEST_CASE("dot_general parameters print like JAX") {
  DotDimsParam p;
  p.lhs_contracting = {1};
  p.rhs_contracting = {0};
  CHECK(p.str() == "(([1], [0]), ([], []))");
  p.lhs_batch = {0, 2};
  p.rhs_batch = {1, 3};
  CHECK(p.str() == "(([1], [0]), ([0, 2], [1, 3]))");
  CHECK(prims::dot_general().name == "dot_general");
}

TEST_CASE("dot_general misuse") {
  Array a = jnp::ones({2, 3}), b = jnp::ones({4, 5});
  CHECK_THROWS_WITH_AS(lax::dot_general(a, b, mm()),
                       doctest::Contains("contracting dimensions to have the same shape, got (3,)"), ShapeError);
  CHECK_THROWS_WITH_AS(lax::dot_general(a, b, mm()), doctest::Contains("and (4,)"), ShapeError);
  CHECK_THROWS_WITH_AS(lax::dot_general(jnp::ones({2, 3, 4}), jnp::ones({5, 4, 3}), DN{{{2}, {1}}, {{0}, {0}}}),
                       doctest::Contains("batch dimensions to have the same shape, got (2,)"), ShapeError);
  CHECK_THROWS_WITH_AS(lax::dot_general(a, jnp::ones({3, 2}, i32), mm()),
                       doctest::Contains("same dtype, got float32 and int32"), DTypeError);
  CHECK_THROWS_WITH_AS(lax::dot_general(a, jnp::ones({3, 2}), DN{{{1}, {0, 1}}, {{}, {}}}),
                       doctest::Contains("equal numbers of lhs and rhs contracting dimensions"), ShapeError);
  CHECK_THROWS_WITH_AS(lax::dot_general(a, jnp::ones({3, 2}), DN{{{2}, {0}}, {{}, {}}}),
                       doctest::Contains("lhs contracting dimension 2 is out of range for an operand of rank 2"),
                       ValueError);
  CHECK_THROWS_WITH_AS(lax::dot_general(a, jnp::ones({3, 2}), mm(), bf16),
                       doctest::Contains("preferred_element_type bfloat16 must not be narrower than the input type "
                                         "float32"),
                       DTypeError);
  CHECK_THROWS_WITH_AS(lax::dot_general(a, jnp::ones({3, 2}), mm(), i32),
                       doctest::Contains("incompatible with preferred_element_type int32"), DTypeError);
}

TEST_CASE("jnp.matmul: 2-D, broadcasting batch dims, 1-D promotion, dtype promotion") {
  Array a = seq({2, 3}, 7, 3), b = seq({3, 4}, 5, 2);
  CHECK(vals(jnp::matmul(a, b)) == std::vector<double>{1.0, 5.0, 4.0, -2.0, 4.0, 2.0, -5.0, -2.0});
  Array mb = jnp::matmul(seq({2, 1, 2, 3}, 7, 3), seq({3, 3, 2}, 5, 2));
  CHECK(mb.shape() == Shape{2, 3, 2, 2});
  CHECK(vals(mb) == std::vector<double>{4.0,   3.0,  4.0, -3.0, 3.0,  -3.0, -3.0, 0.0,  -3.0, 1.0, 0.0,  -2.0,
                                        -10.0, -2.0, 4.0, -1.0, -2.0, -4.0, -1.0, -1.0, -4.0, 9.0, -1.0, -1.0});
  Array mb2 = jnp::matmul(seq({2, 3}, 7, 3), seq({4, 3, 2}, 5, 2));
  CHECK(mb2.shape() == Shape{4, 2, 2});
  CHECK(vals(mb2) ==
        std::vector<double>{4.0, 3.0, 4.0, -3.0, 3.0, -3.0, -3.0, 0.0, -3.0, 1.0, 0.0, -2.0, 1.0, -5.0, -2.0, 1.0});
  Array A = seq({3, 4}, 7, 3);
  Array mv = jnp::matmul(A, seq({4}, 5, 2));
  CHECK(mv.shape() == Shape{3});
  CHECK(vals(mv) == std::vector<double>{8.0, -7.0, 6.0});
  Array vm = jnp::matmul(seq({3}, 5, 2), A);
  CHECK(vm.shape() == Shape{4});
  CHECK(vals(vm) == std::vector<double>{5.0, 2.0, -1.0, 3.0});
  Array vv = jnp::matmul(jnp::array<float>({1, 2}), jnp::array<float>({3, 4}));
  CHECK(vv.shape() == Shape{});
  CHECK(vv.item<float>() == 11.0f);
  Array p = jnp::matmul(seq({2, 3}, 7, 3, i32), b);
  CHECK(p.dtype() == f32);
  CHECK(vals(p) == std::vector<double>{1.0, 5.0, 4.0, -2.0, 4.0, 2.0, -5.0, -2.0});
  CHECK(jnp::matmul(seq({2, 3}, 7, 3, bf16), seq({3, 4}, 5, 2, bf16)).dtype() == bf16);
  CHECK_THROWS_WITH_AS(jnp::matmul(a, a), doctest::Contains("a (2, 3) has 3 columns but b (2, 3) has 2 rows"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(jnp::matmul(Array(1.0f), a), doctest::Contains("at least 1-D"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::matmul(jnp::ones({2, 2, 3}), jnp::ones({3, 3, 2})),
                       doctest::Contains("cannot be broadcast together (dimension 2 vs 3)"), ShapeError);
}

TEST_CASE("jnp.dot, vdot, inner, outer, tensordot") {
  Array dv = jnp::dot(seq({2, 3, 4}, 7, 3), seq({4}, 5, 2));
  CHECK(dv.shape() == Shape{2, 3});
  CHECK(vals(dv) == std::vector<double>{8.0, -7.0, 6.0, -9.0, 4.0, -4.0});
  Array dn = jnp::dot(seq({2, 3}, 7, 3), seq({4, 3, 2}, 5, 2));
  CHECK(dn.shape() == Shape{2, 4, 2});
  CHECK(vals(dn) ==
        std::vector<double>{4.0, 3.0, 3.0, -3.0, -3.0, 1.0, 1.0, -5.0, 4.0, -3.0, -3.0, 0.0, 0.0, -2.0, -2.0, 1.0});
  Array ds = jnp::dot(Array(2), jnp::array<int32_t>({1, 2, 3}));
  CHECK(ds.dtype() == i32);
  CHECK(ds.to_vector<int>() == std::vector<int>{2, 4, 6});
  Array wk = jnp::dot(Array(2.0f), Array(3.0f));  // weak inputs give a weak result, as in JAX
  CHECK(wk.weak_type());
  CHECK(wk.item<float>() == 6.0f);
  CHECK(!lax::dot_general(Array(2.0f), Array(3.0f), DN{}, f64).weak_type());
  CHECK(jnp::vdot(jnp::array<float>({1, 2, 3, 4}, {2, 2}), jnp::array<float>({1, 1, 2, 2}, {2, 2})).item<float>() ==
        17.0f);
  Array in = jnp::inner(seq({2, 3}, 7, 3), seq({4, 3}, 5, 2));
  CHECK(in.shape() == Shape{2, 4});
  CHECK(vals(in) == std::vector<double>{8.0, -5.0, 2.0, -1.0, -1.0, -2.0, 2.0, -4.0});
  Array out = jnp::outer(jnp::array<int32_t>({1, 2}, {1, 2}), jnp::array<int32_t>({3, 4, 5}));
  CHECK(out.shape() == Shape{2, 3});
  CHECK(out.to_vector<int>() == std::vector<int>{3, 4, 5, 6, 8, 10});
  Array t2 = jnp::tensordot(seq({2, 3, 4}, 7, 3), seq({3, 4, 5}, 5, 2), 2);
  CHECK(t2.shape() == Shape{2, 5});
  CHECK(vals(t2) == std::vector<double>{10.0, 5.0, 0.0, -5.0, -10.0, 2.0, 1.0, 0.0, -1.0, -2.0});
  Array tp = jnp::tensordot(seq({2, 3, 4}, 7, 3), seq({4, 2, 3}, 5, 2), {{1, -1}, {2, 0}});
  CHECK(tp.shape() == Shape{2, 2});
  CHECK(vals(tp) == std::vector<double>{1.0, -4.0, -8.0, 9.0});
  Array t0 = jnp::tensordot(jnp::array<float>({1, 2}), jnp::array<float>({3, 4}), 0);
  CHECK(t0.shape() == Shape{2, 2});
  CHECK_THROWS_WITH_AS(jnp::tensordot(seq({2, 3}, 7, 3), seq({4, 3}, 5, 2), 1),
                       doctest::Contains("axis 1 of a (size 3) != axis 0 of b (size 4)"), ShapeError);
  CHECK_THROWS_WITH_AS(jnp::dot(seq({2, 3}, 7, 3), seq({2, 3}, 5, 2)),
                       doctest::Contains("dot: shapes (2, 3) and (2, 3) "
                                         "are not aligned"),
                       ShapeError);
}

TEST_CASE("with several CPU devices OpenBLAS is pinned to one thread (device workers call it concurrently)") {
  Array c = numpy::dot(numpy::ones({64, 64}), numpy::ones({64, 64}));
  CHECK(c[{0, 0}].item<float>() == 64.0f);
  if (device_count() > 1) CHECK(openblas_get_num_threads() == 1);
}

// Reference C = alpha * op(A) op(B) + beta * C0 in double, over the same strided operands: op(A)
// and op(B)^T are read element by element into contiguous rows first (the triple loop then runs
// fast enough under the sanitizers too).
template <class T>
std::vector<double> naive_gemm(int64_t batch, int64_t M, int64_t N, int64_t K, const GemmOperand& A,
                               const GemmOperand& B, const std::vector<T>& C0, double alpha, double beta) {
  const T* a = static_cast<const T*>(A.ptr);
  const T* b = static_cast<const T*>(B.ptr);
  std::vector<double> out(size_t(batch * M * N)), rows_a(size_t(M * K)), cols_b(size_t(N * K));
  for (int64_t bi = 0; bi < batch; ++bi) {
    const T* ab = a + A.batch_offset(bi);
    const T* bb = b + B.batch_offset(bi);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < K; ++k) rows_a[size_t(i * K + k)] = double(A.trans ? ab[k * A.ld + i] : ab[i * A.ld + k]);
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k) cols_b[size_t(j * K + k)] = double(B.trans ? bb[j * B.ld + k] : bb[k * B.ld + j]);
    for (int64_t i = 0; i < M; ++i)
      for (int64_t j = 0; j < N; ++j) {
        const double* ra = rows_a.data() + i * K;
        const double* cb = cols_b.data() + j * K;
        double acc = 0;
        for (int64_t k = 0; k < K; ++k) acc += ra[k] * cb[k];
        size_t c = size_t((bi * M + i) * N + j);
        out[c] = alpha * acc + beta * double(C0[c]);
      }
  }
  return out;
}

TEST_CASE("the OpenBLAS path spreads a wide product by column panels, a tall one by row panels") {
  // Each panel is a single-threaded OpenBLAS call over all of K. 32 x 1024 x 1024 (fewer rows
  // than columns) goes by columns, 300 x 70 x 200 by rows; the wide weight gradient reads A
  // transposed. Values against a double reference; the same bits on a second call. (Not the bits
  // of one call over the whole product: OpenBLAS's Haswell kernels round a 150-row panel's
  // elements differently from a 300-row call's.)
  struct Case {
    int64_t m, n, k;
    bool a_trans;
  };
  set_gemm_engine_override(GemmEngine::blas);
  for (Case c : {Case{32, 1024, 1024, false}, Case{128, 512, 2048, true}, Case{300, 70, 200, false}}) {
    CAPTURE(c.m);
    Array A =
        jnp::sin(jnp::arange(c.m * c.k).astype(DType::float32)).reshape(c.a_trans ? Shape{c.k, c.m} : Shape{c.m, c.k});
    Array B = jnp::cos(jnp::arange(c.k * c.n).astype(DType::float32)).reshape({c.k, c.n});
    lax::DotDimensionNumbers dims{{{c.a_trans ? 0 : 1}, {0}}, {{}, {}}};
    std::vector<float> got = lax::dot_general(A, B, dims).to_vector<float>();
    CHECK(lax::dot_general(A, B, dims).to_vector<float>() == got);
    std::vector<float> zeros(size_t(c.m * c.n), 0.0f);
    std::vector<double> want =
        naive_gemm<float>(1, c.m, c.n, c.k, GemmOperand{data_ptr<const float>(A), c.a_trans, c.a_trans ? c.m : c.k},
                          GemmOperand{data_ptr<const float>(B), false, c.n}, zeros, 1.0, 0.0);
    double worst = 0;  // relative to the magnitude of a sum of K products of size <= 1
    for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, std::fabs(double(got[i]) - want[i]) / double(c.k));
    CHECK(worst <= 1e-6);
  }
  set_gemm_engine_override(std::nullopt);
}

TEST_CASE_TEMPLATE("LIBXSMM GEMMs: every transpose, alpha, beta 0/1, edge tiles and strided batches", T, float,
                   double) {
  // 130 x 70 leaves edge tiles in both directions (64-wide tiles); 3 x 2 batches are strided
  // like attention's [b, s, n, h] operands. K = 300 packs B into column panels (gemm_xsmm.cpp);
  // K = 768 and 1000 run in slices of 256, accumulated (the last slice shorter at 1000).
  const int64_t M = 130, N = 70, nb0 = 3, nb1 = 2, batch = nb0 * nb1;
  for (int64_t K : {33, 300, 768, 1000})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (double alpha : {1.0, -0.5})
          for (double beta : {0.0, 1.0}) {
            if (K > 300 && alpha != 1.0) continue;  // the naive reference's time
            CAPTURE(K);
            CAPTURE(ta);
            CAPTURE(tb);
            CAPTURE(alpha);
            CAPTURE(beta);
            // A is [nb0, rows, nb1, cols] in memory (batch dims interleaved), B plainly batched.
            int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
            std::vector<T> a(size_t(nb0 * ar * nb1 * ac)), b(size_t(batch * br * bc)), c(size_t(batch * M * N));
            for (size_t i = 0; i < a.size(); ++i) a[i] = T(std::sin(0.37 * double(i)));
            for (size_t i = 0; i < b.size(); ++i) b[i] = T(std::cos(0.11 * double(i)));
            for (size_t i = 0; i < c.size(); ++i) c[i] = T(0.25 * double(i % 7));
            GemmOperand A{a.data(), ta, nb1 * ac, 0, {{nb0, ar * nb1 * ac}, {nb1, ac}}};
            GemmOperand B{b.data(), tb, bc, br * bc};
            std::vector<double> want = naive_gemm<T>(batch, M, N, K, A, B, c, alpha, beta);
            REQUIRE(xsmm_gemm<T>(batch, M, N, K, A, B, c.data(), T(alpha), T(beta)));
            double worst = 0;  // relative to the magnitude of a sum of K products of size <= 1
            for (size_t i = 0; i < c.size(); ++i)
              worst = std::max(worst, std::fabs(double(c[i]) - want[i]) / double(K));
            CHECK(worst <= (std::is_same_v<T, float> ? 1e-6 : 1e-14));
          }
  // beta outside {0, 1} is left to BLAS.
  std::vector<T> a(4, T(1)), b(4, T(1)), c(4, T(1));
  CHECK_FALSE(xsmm_gemm<T>(1, 2, 2, 2, GemmOperand{a.data(), false, 2}, GemmOperand{b.data(), false, 2}, c.data(), T(1),
                           T(0.5)));
  CHECK(c == std::vector<T>(4, T(1)));
}

TEST_CASE("LIBXSMM GEMMs whose B rows are 4 KiB or 2 KiB apart go through column panels: values of the reference") {
  // B is the first N = 200 columns of a [K, 1024] f32 array (ld 4 KiB): panels for several row
  // tiles (M = 130), and with AVX2 kernels for a single one too (M = 40); and of a [K, 512] one
  // (ld 2 KiB): panels with AVX2 kernels for several row tiles.
  const int64_t K = 96, N = 200;
  for (int64_t ld : {1024, 512}) {
    std::vector<float> b(size_t(K * ld));
    for (size_t i = 0; i < b.size(); ++i) b[i] = float(std::cos(0.11 * double(i)));
    for (int64_t M : {130, 40})
      for (double beta : {0.0, 1.0}) {
        CAPTURE(ld);
        CAPTURE(M);
        CAPTURE(beta);
        std::vector<float> a(size_t(M * K)), c(size_t(M * N));
        for (size_t i = 0; i < a.size(); ++i) a[i] = float(std::sin(0.37 * double(i)));
        for (size_t i = 0; i < c.size(); ++i) c[i] = float(0.25 * double(i % 7));
        GemmOperand A{a.data(), false, K}, B{b.data(), false, ld};
        std::vector<double> want = naive_gemm<float>(1, M, N, K, A, B, c, 1.0, beta);
        REQUIRE(xsmm_gemm<float>(1, M, N, K, A, B, c.data(), 1.0f, float(beta)));
        double worst = 0;
        for (size_t i = 0; i < c.size(); ++i) worst = std::max(worst, std::fabs(double(c[i]) - want[i]) / double(K));
        CHECK(worst <= 1e-6);
      }
  }
}

TEST_CASE("the GEMM library is measured once per host and shape class, then read from memory or disk") {
  if (fixed_gemm_engine()) {
    MESSAGE("CJAX_GEMM fixes the library: nothing is measured");
    return;
  }
  // A class no other test uses: f64, B transposed, 37 x 5 x 300.
  Array a = jnp::sin(jnp::arange(37 * 300).astype(DType::float64).reshape({37, 300}));
  Array b = jnp::cos(jnp::arange(5 * 300).astype(DType::float64).reshape({5, 300}));
  std::vector<double> av = a.to_vector<double>(), bv = b.to_vector<double>(), want(37 * 5, 0.0);
  for (int i = 0; i < 37; ++i)
    for (int j = 0; j < 5; ++j)
      for (int k = 0; k < 300; ++k) want[size_t(i * 5 + j)] += av[size_t(i * 300 + k)] * bv[size_t(j * 300 + k)];
  auto decided = [] { return gemm_choice_stats().measured + gemm_choice_stats().from_disk; };
  auto check_product = [&](const Array& c) {
    std::vector<double> got = c.to_vector<double>();
    for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-12));
  };
  int64_t before = decided();
  check_product(jnp::matmul(a, b.T()));
  CHECK(decided() == before + 1);  // measured, or read from an earlier run's disk cache
  check_product(jnp::matmul(a * 1.0, b.T()));
  CHECK(decided() == before + 1);  // the same class: decided in memory
  clear_gemm_choices();
  int64_t measured = gemm_choice_stats().measured;
  check_product(jnp::matmul(a, b.T()));
  CHECK(decided() == before + 2);
  // With a disk cache the second decision is read back, not measured again.
  if (const char* dir = std::getenv("CJAX_CACHE_DIR"); !dir || *dir) CHECK(gemm_choice_stats().measured == measured);
  // Either library gives the product.
  for (GemmEngine e : {GemmEngine::xsmm, GemmEngine::blas}) {
    set_gemm_engine_override(e);
    check_product(jnp::matmul(a, b.T()));
  }
  set_gemm_engine_override(std::nullopt);
  CHECK(gemm_class(DType::float32, 3, 1000, 1024, 1025, false, true).str() ==
        "f32 NT m<=1024 n<=1024 k<=2048 batch<=4");
}

TEST_CASE("a close GEMM decision is measured again in the steady state, keeping each library's least time") {
  if (fixed_gemm_engine()) {
    MESSAGE("CJAX_GEMM fixes the library: nothing is measured");
    return;
  }
  // Stand-ins for the two libraries' runs: sleeps, so the faster one is known. Classes no other
  // test uses (f64, both operands transposed, a batch of 2^19).
  auto sleeping = [](int xsmm_us, int blas_us) {
    return [=](GemmEngine e) {
      std::this_thread::sleep_for(std::chrono::microseconds(e == GemmEngine::xsmm ? xsmm_us : blas_us));
    };
  };
  auto must_not_run = [](GemmEngine) { FAIL("the libraries were measured where the record decides"); };
  auto record = [](const GemmClass& c) {
    double x = 0, b = 0;
    int n = 0;
    std::optional<std::string> r = cached_kernel(gemm_choice_cache_key(c));
    REQUIRE(r);
    REQUIRE(std::sscanf(r->c_str(), "%lf %lf %d", &x, &b, &n) == 3);
    return std::tuple{x, b, n};
  };
  GemmClass decisive = gemm_class(DType::float64, 1 << 19, 3, 5, 7, true, true);
  GemmClass close = gemm_class(DType::float64, 1 << 19, 3, 5, 9, true, true);
  GemmClass settled = gemm_class(DType::float64, 1 << 19, 3, 5, 17, true, true);

  // Nothing usable stored (a damaged record counts as none; an earlier run of this test left a
  // record): measured at the first call. OpenBLAS 3x faster is decisive, so the record is settled
  // and the class is not measured again, however often it is called.
  store_kernel(gemm_choice_cache_key(decisive), "none");
  int64_t measured = gemm_choice_stats().measured;
  CHECK(choose_gemm_engine(decisive, sleeping(1500, 500)) == GemmEngine::blas);
  CHECK(gemm_choice_stats().measured == measured + 1);
  auto [x1, b1, n1] = record(decisive);
  CHECK(n1 == 1);
  CHECK(x1 >= 1500e-6);
  CHECK(b1 >= 500e-6);
  for (int call = 2; call <= 100; ++call) CHECK(choose_gemm_engine(decisive, must_not_run) == GemmEngine::blas);
  clear_gemm_choices();
  CHECK(choose_gemm_engine(decisive, must_not_run) == GemmEngine::blas);

  // An earlier process found OpenBLAS 5.3% faster: a close call, one measurement, not settled.
  // This process takes OpenBLAS from the record, and at the class's 64th call measures again,
  // keeping its library for the rest of the run; the record now holds the least time of each
  // library over both measurements, and tells the next process LIBXSMM.
  store_kernel(gemm_choice_cache_key(close), "0.0019 0.0018 1");
  clear_gemm_choices();
  measured = gemm_choice_stats().measured;
  for (int call = 1; call < 64; ++call) CHECK(choose_gemm_engine(close, must_not_run) == GemmEngine::blas);
  CHECK(choose_gemm_engine(close, sleeping(300, 1200)) == GemmEngine::blas);
  CHECK(gemm_choice_stats().measured == measured + 1);
  auto [x2, b2, n2] = record(close);
  CHECK(n2 == 2);
  CHECK(x2 >= 300e-6);
  CHECK(x2 < 1200e-6);
  CHECK(b2 >= 1200e-6);
  CHECK(b2 <= 0.0018);
  for (int call = 65; call <= 200; ++call) CHECK(choose_gemm_engine(close, must_not_run) == GemmEngine::blas);
  // What the next process sees (memory dropped); this process does not measure the class again.
  clear_gemm_choices();
  for (int call = 1; call <= 100; ++call) CHECK(choose_gemm_engine(close, must_not_run) == GemmEngine::xsmm);

  // A close first measurement in this process: measured again at the 64th call, the same library kept.
  GemmClass tie = gemm_class(DType::float64, 1 << 19, 3, 5, 33, true, true);
  store_kernel(gemm_choice_cache_key(tie), "none");
  CHECK(choose_gemm_engine(tie, sleeping(3000, 3300)) == GemmEngine::xsmm);
  CHECK(std::get<2>(record(tie)) == 1);
  for (int call = 2; call < 64; ++call) CHECK(choose_gemm_engine(tie, must_not_run) == GemmEngine::xsmm);
  CHECK(choose_gemm_engine(tie, sleeping(3000, 600)) == GemmEngine::xsmm);
  CHECK(std::get<2>(record(tie)) == 2);
  CHECK(std::get<1>(record(tie)) < 3000e-6);

  // Three measurements: settled however close, and read back as it stands.
  store_kernel(gemm_choice_cache_key(settled), "0.0010 0.00094 3");
  for (int call = 1; call <= 100; ++call) CHECK(choose_gemm_engine(settled, must_not_run) == GemmEngine::blas);
  clear_gemm_choices();
}

TEST_CASE("kernel scratch memory comes back from the thread's cache") {
  using cpu::ScratchBuffer;
  std::byte* first;
  {
    ScratchBuffer a(1 << 20);
    first = a.data();
    CHECK(reinterpret_cast<uintptr_t>(first) % 64 == 0);
  }
  ScratchBuffer b((1 << 20) - 100);  // a slightly smaller request takes the same block
  CHECK(b.data() == first);
  ScratchBuffer c(1 << 20);  // while b holds it, another block
  CHECK(c.data() != first);
  std::byte* freed = c.data();
  c = ScratchBuffer();
  ScratchBuffer tiny(4096);  // a small request does not take a block far larger than it needs
  CHECK(tiny.data() != freed);
  // Requests of one size, one after another, keep taking one block (small ones are rounded up
  // to a power of two, and must still fit their own rounded blocks).
  for (size_t n : {size_t(1000), size_t(5000), size_t(300000)}) {
    std::set<std::byte*> seen;
    for (int i = 0; i < 20; ++i) seen.insert(ScratchBuffer(n).data());
    CHECK_MESSAGE(seen.size() == 1, n);
  }
  cpu::ScratchArray<double> grow(10);
  grow.resize(1 << 16);
  grow[(1 << 16) - 1] = 2.5;
  CHECK(grow[(1 << 16) - 1] == 2.5);
}

// A GEMM whose operand must be copied into [rows, contracted] order first (a's free axes 0 and 2
// do not merge into one strided axis) needs a 32 MiB temporary, more than glibc ever serves from
// its heap: from malloc, every call would map it afresh and fault on its 8192 pages again.
TEST_CASE("repeated GEMMs with copied operands touch no fresh pages after the first call") {
  Array a = jnp::ones({64, 1024, 128}, DType::float32), b = jnp::ones({1024, 8}, DType::float32);
  DN dn{{{1}, {0}}, {{}, {}}};
  auto minor_faults = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt;
  };
  Array warm = lax::dot_general(a, b, dn);
  CHECK(warm.shape() == Shape{64, 128, 8});
  CHECK(vals(warm)[0] == 1024.0);
  long before = minor_faults();
  for (int i = 0; i < 5; ++i) {
    Array c = lax::dot_general(a, b, dn);
    CHECK(c.shape() == Shape{64, 128, 8});
  }
  CHECK(minor_faults() - before < 2000);  // 5 x 8192 with a fresh temporary per call
}

// LIBXSMM's one-time initialization (~7 ms) runs while jit compiles a program with a GEMM, not in
// its first run. Needs a process whose GEMMs have not started yet: the next test case runs this
// one in a child process (skipped otherwise).
TEST_CASE("fresh process: compiling a program with a GEMM prepares LIBXSMM before its first run" * doctest::skip()) {
  REQUIRE_FALSE(xsmm_prepared());  // no GEMM has run in this process
  // The parent starts this process without thread-affinity variables, which LIBXSMM's
  // initialization would then add to the environment (putenv, racing with getenv on the compile's
  // threads); libcjax set OMP_PROC_BIND when it was loaded, so the environment stays as it is.
  char** const environment = environ;
  REQUIRE(std::getenv("OMP_PROC_BIND") != nullptr);
  REQUIRE(backend_for(Platform::cpu).preparation(std::vector<std::string_view>{"add", "exp"}) == nullptr);
  REQUIRE(backend_for(Platform::cpu).preparation(std::vector<std::string_view>{"dot_general"}) != nullptr);
  Array x = (jnp::arange(24).astype(DType::float32) - 8.0f).reshape({6, 4});
  Array w = jnp::ones({4, 3});
  auto layer = [](const Array& a, const Array& b) { return nn::relu(jnp::matmul(a, b)) * 2.0f; };
  Executable ex(make_jaxpr(layer)(x, w), "layer");
  CHECK(xsmm_prepared());  // before any run
  CHECK(environ == environment);
  CHECK(backend_for(Platform::cpu).preparation(std::vector<std::string_view>{"dot_general"}) == nullptr);
  std::vector<Array> out = ex.run(std::vector<Array>{x, w});
  // Row i of x sums to 4 (4 i - 8) + 6 = 16 i - 26; relu, times 2, in each of the 3 columns.
  std::vector<float> want;
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 3; ++j) want.push_back(2.0f * std::max(0.0f, 16.0f * float(i) - 26.0f));
  CHECK(out[0].to_vector<float>() == want);
}

TEST_CASE("compiling a program with a GEMM prepares LIBXSMM before its first run (in a fresh process)") {
  std::string cmd = "env -u OMP_PROC_BIND -u GOMP_CPU_AFFINITY -u KMP_AFFINITY /proc/" + std::to_string(::getpid()) +
                    "/exe --no-skip=true --no-version=true -tc='fresh process: compiling a program*' 2>&1";
  FILE* child = ::popen(cmd.c_str(), "r");
  REQUIRE(child != nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, child)) > 0;) out.append(buf, n);
  int status = ::pclose(child);
  INFO(out);
  CHECK(status == 0);
  CHECK(out.find("test cases: 1 | 1 passed | 0 failed") != std::string::npos);
}
