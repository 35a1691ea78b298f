// gather / scatter primitives: the forms jnp uses, batching dims, modes with out-of-bounds
// indices, every dtype, zero-size arrays, params as JAX prints them, misuse.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>

#include "cjax/cjax.h"
#include "core/lax/gather_scatter.h"

using namespace cjax;
namespace jnp = cjax::numpy;
using lax::GatherDimensionNumbers;
using lax::GatherScatterMode;
using lax::ScatterDimensionNumbers;

namespace {
Array ai(std::vector<int32_t> v, Shape s = {}) { return jnp::array<int32_t>(v, s); }
Array af(std::vector<float> v, Shape s = {}) { return jnp::array<float>(v, s); }
// The take form: operand rank 1, one scalar index per batch position.
GatherDimensionNumbers take_dn() { return GatherDimensionNumbers{{}, {0}, {0}, {}, {}}; }
ScatterDimensionNumbers scatter1_dn() { return ScatterDimensionNumbers{{}, {0}, {0}, {}, {}}; }
bool same(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}
const DType kAll[] = {bool_, i8, i16, i32, i64, u8, u32, bf16, f16, f32, f64};
}  // namespace

TEST_CASE("gather: take form along axis 0 and axis 1 (jnp.take)") {
  Array x = af({1, 2, 3, 4, 5, 6}, {2, 3});
  // jnp.take(x, [2, 0], axis=1): offset_dims=(0,), collapsed=(1,), start_index_map=(1,)
  Array r = lax::gather(x, ai({2, 0}, {2, 1}), GatherDimensionNumbers{{0}, {1}, {1}, {}, {}}, {2, 1},
                        GatherScatterMode::promise_in_bounds);
  CHECK(r.shape() == Shape{2, 2});
  CHECK(r.to_vector<float>() == std::vector<float>{3, 1, 6, 4});
  // rows: x[[1, 0, 1]]
  Array rows = lax::gather(x, ai({1, 0, 1}, {3, 1}), GatherDimensionNumbers{{1}, {0}, {0}, {}, {}}, {1, 3},
                           GatherScatterMode::clip);
  CHECK(rows.shape() == Shape{3, 3});
  CHECK(rows.to_vector<float>() == std::vector<float>{4, 5, 6, 1, 2, 3, 4, 5, 6});
  CHECK(rows.dtype() == f32);
}

TEST_CASE("gather: 2-D index vectors (x[i1, i2]) and windows") {
  Array x = ai({0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {3, 4});
  // points (2,1), (0,3)
  Array pts = lax::gather(x, ai({2, 1, 0, 3}, {2, 2}), GatherDimensionNumbers{{}, {0, 1}, {0, 1}, {}, {}}, {1, 1},
                          GatherScatterMode::fill_or_drop);
  CHECK(pts.to_vector<int32_t>() == std::vector<int32_t>{9, 3});
  // 2x2 windows starting at (1,1) and (0,2), offset dims (1, 2)
  Array win = lax::gather(x, ai({1, 1, 0, 2}, {2, 2}), GatherDimensionNumbers{{1, 2}, {}, {0, 1}, {}, {}}, {2, 2},
                          GatherScatterMode::fill_or_drop);
  CHECK(win.shape() == Shape{2, 2, 2});
  CHECK(win.to_vector<int32_t>() == std::vector<int32_t>{5, 6, 9, 10, 2, 3, 6, 7});
  // offset dim before the batch dim: output (2 window, 2 batch)
  Array t = lax::gather(x, ai({1, 1, 0, 2}, {2, 2}), GatherDimensionNumbers{{0}, {0}, {0, 1}, {}, {}}, {1, 2},
                        GatherScatterMode::fill_or_drop);
  CHECK(t.shape() == Shape{2, 2});
  CHECK(t.to_vector<int32_t>() == std::vector<int32_t>{5, 2, 6, 3});
}

TEST_CASE("gather: batching dims (take_along_axis form)") {
  Array x = af({0, 1, 2, 3, 4, 5}, {2, 3});
  GatherDimensionNumbers dn{{}, {1}, {1}, {0}, {0}};
  Array r = lax::gather(x, ai({2, 0}, {2, 1}), dn, {1, 1}, GatherScatterMode::fill_or_drop);
  CHECK(r.shape() == Shape{2});
  CHECK(r.to_vector<float>() == std::vector<float>{2, 3});
  // batch dim of the indices second: indices (k=2, b=2, 1), start_indices_batching_dims=(1,)
  GatherDimensionNumbers dn2{{}, {1}, {1}, {0}, {1}};
  Array r2 = lax::gather(x, ai({0, 1, 2, 2}, {2, 2, 1}), dn2, {1, 1}, GatherScatterMode::fill_or_drop);
  CHECK(r2.shape() == Shape{2, 2});
  CHECK(r2.to_vector<float>() == std::vector<float>{0, 4, 2, 5});
}

TEST_CASE("gather: modes with out-of-bounds indices") {
  Array x = af({10, 20, 30});
  Array idx = ai({1, 3, -1}, {3, 1});
  auto fill = lax::gather(x, idx, take_dn(), {1}, GatherScatterMode::fill_or_drop).to_vector<double>();
  CHECK(same(fill, {20, NAN, NAN}));
  CHECK(lax::gather(x, idx, take_dn(), {1}, GatherScatterMode::clip).to_vector<float>() ==
        std::vector<float>{20, 30, 10});
  CHECK(lax::gather(x, idx, take_dn(), {1}, GatherScatterMode::promise_in_bounds).to_vector<float>() ==
        std::vector<float>{20, 30, 10});
  CHECK(lax::gather(x, idx, take_dn(), {1}, GatherScatterMode::fill_or_drop, -7.0).to_vector<float>() ==
        std::vector<float>{20, -7, -7});
  // windows: a start is out of bounds when start > dim - slice_size
  Array y = af({0, 1, 2, 3});
  GatherDimensionNumbers wdn{{1}, {}, {0}, {}, {}};
  auto wf = lax::gather(y, ai({3, 2}, {2, 1}), wdn, {2}, GatherScatterMode::fill_or_drop).to_vector<double>();
  CHECK(same(wf, {NAN, NAN, 2, 3}));
  CHECK(lax::gather(y, ai({3, 2}, {2, 1}), wdn, {2}, GatherScatterMode::clip).to_vector<float>() ==
        std::vector<float>{2, 3, 2, 3});
}

TEST_CASE("gather: every dtype, JAX's default fill values") {
  for (DType d : kAll) {
    CAPTURE(dtype_name(d));
    Array x = ai({0, 1, 2, 3, 4}).astype(d);
    Array r = lax::gather(x, ai({4, 0, 7}, {3, 1}), take_dn(), {1}, GatherScatterMode::fill_or_drop);
    CHECK(r.dtype() == d);
    std::vector<double> v = r.to_vector<double>();
    double fillv;
    switch (d) {
      case DType::bool_: fillv = 1; break;
      case DType::int8: fillv = -128; break;
      case DType::int16: fillv = -32768; break;
      case DType::int32: fillv = -2147483648.0; break;
      case DType::int64: fillv = -9223372036854775808.0; break;
      case DType::uint8: fillv = 255; break;
      case DType::uint32: fillv = 4294967295.0; break;
      default: fillv = NAN;
    }
    double four = d == bool_ ? 1 : 4;
    CHECK(same(v, {four, 0, fillv}));
    // clip: index 7 -> 4
    Array c = lax::gather(x, ai({7, -2}, {2, 1}), take_dn(), {1}, GatherScatterMode::clip);
    CHECK(same(c.to_vector<double>(), {four, 0}));
  }
}

TEST_CASE("gather: other index dtypes, zero-size indices and operands") {
  Array x = af({5, 6, 7});
  for (DType d : {i8, i16, i64, u8, u32}) {
    CAPTURE(dtype_name(d));
    Array r = lax::gather(x, ai({2, 0}, {2, 1}).astype(d), take_dn(), {1}, GatherScatterMode::clip);
    CHECK(r.to_vector<float>() == std::vector<float>{7, 5});
  }
  Array empty_idx = jnp::array<int32_t>(std::vector<int32_t>{}, {0, 1});
  Array e = lax::gather(x, empty_idx, take_dn(), {1}, GatherScatterMode::fill_or_drop);
  CHECK(e.shape() == Shape{0});
  // zero-size operand rows: slices of size 0 along the window dim
  Array z = jnp::array<float>(std::vector<float>{}, {2, 0});
  Array zr = lax::gather(z, ai({1, 0, 1}, {3, 1}), GatherDimensionNumbers{{1}, {0}, {0}, {}, {}}, {1, 0},
                         GatherScatterMode::fill_or_drop);
  CHECK(zr.shape() == Shape{3, 0});
  // an empty index vector: the whole operand is one slice
  Array whole = lax::gather(x, jnp::array<int32_t>(std::vector<int32_t>{}, {0}),
                            GatherDimensionNumbers{{0}, {}, {}, {}, {}}, {3}, GatherScatterMode::fill_or_drop);
  CHECK(whole.to_vector<float>() == std::vector<float>{5, 6, 7});
  // 0-d operand index into rank-2 operand with many batch dims
  Array x2 = af({1, 2, 3, 4}, {2, 2});
  Array b = lax::gather(x2, ai({1, 0, 0, 1, 1, 1}, {3, 1, 2}), GatherDimensionNumbers{{}, {0, 1}, {0, 1}, {}, {}},
                        {1, 1}, GatherScatterMode::fill_or_drop);
  CHECK(b.shape() == Shape{3, 1});
  CHECK(b.to_vector<float>() == std::vector<float>{3, 2, 4});
}

TEST_CASE("gather: large embedding lookup matches a loop") {
  const int V = 1000, D = 64, N = 4096;
  std::vector<float> tv(size_t(V) * D);
  for (size_t i = 0; i < tv.size(); ++i) tv[i] = float(i % 9973) * 0.5f;
  std::vector<int32_t> ids(N);
  for (int i = 0; i < N; ++i) ids[size_t(i)] = (i * 37) % V;
  Array t = af(tv, {V, D});
  Array r = lax::gather(t, ai(ids, {N, 1}), GatherDimensionNumbers{{1}, {0}, {0}, {}, {}}, {1, D},
                        GatherScatterMode::promise_in_bounds);
  auto v = r.to_vector<float>();
  bool ok = true;
  for (int i = 0; i < N; ++i)
    for (int d = 0; d < D; ++d) ok &= v[size_t(i) * D + d] == tv[size_t(ids[size_t(i)]) * D + d];
  CHECK(ok);
}

TEST_CASE("scatter family: duplicates accumulate in index order") {
  Array x = af({0, 1, 2, 3, 4});
  Array idx = ai({0, 2, 0, 4}, {4, 1});
  Array upd = af({1, 2, 3, 4});
  // numpy: np.add.at(x, [0,2,0,4], [1,2,3,4]) -> [4, 1, 4, 3, 8]
  CHECK(lax::scatter_add(x, idx, upd, scatter1_dn()).to_vector<float>() == std::vector<float>{4, 1, 4, 3, 8});
  // overwrite: the last update wins for a repeated index
  CHECK(lax::scatter(x, idx, upd, scatter1_dn()).to_vector<float>() == std::vector<float>{3, 1, 2, 3, 4});
  Array idx2 = ai({1, 1, 3}, {3, 1});
  // np.multiply.at(x+1, [1,1,3], [2,3,4]) -> [1, 12, 3, 16, 5]
  CHECK(lax::scatter_mul(lax::add(x, af({1, 1, 1, 1, 1})), idx2, af({2, 3, 4}), scatter1_dn()).to_vector<float>() ==
        std::vector<float>{1, 12, 3, 16, 5});
  CHECK(lax::scatter_min(x, idx2, af({-1, 0.5f, 7}), scatter1_dn()).to_vector<float>() ==
        std::vector<float>{0, -1, 2, 3, 4});
  CHECK(lax::scatter_max(x, idx2, af({-1, 9, 7}), scatter1_dn()).to_vector<float>() ==
        std::vector<float>{0, 9, 2, 7, 4});
  // NaN propagates through scatter-min / scatter-max
  auto mn = lax::scatter_min(x, ai({2}, {1, 1}), af({NAN}), scatter1_dn()).to_vector<double>();
  CHECK(std::isnan(mn[2]));
  // element scatters: clip clamps, fill_or_drop drops
  CHECK(
      lax::scatter_add(x, ai({-1, 7}, {2, 1}), af({1, 2}), scatter1_dn(), GatherScatterMode::clip).to_vector<float>() ==
      std::vector<float>{1, 1, 2, 3, 6});
  CHECK(lax::scatter_add(x, ai({-1, 7}, {2, 1}), af({1, 2}), scatter1_dn()).to_vector<float>() ==
        std::vector<float>{0, 1, 2, 3, 4});
  // the input is not modified
  CHECK(x.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4});
}

TEST_CASE("scatter: row windows, out-of-bounds drop vs clip") {
  Array z = jnp::array<float>(std::vector<float>(6, 0.f), {3, 2});
  Array upd = af({1, 2, 3, 4, 5, 6}, {3, 2});
  ScatterDimensionNumbers dn{{1}, {0}, {0}, {}, {}};
  CHECK(lax::scatter_add(z, ai({0, 2, 0}, {3, 1}), upd, dn).to_vector<float>() == std::vector<float>{6, 8, 0, 0, 3, 4});
  CHECK(lax::scatter(z, ai({0, 2, 0}, {3, 1}), upd, dn).to_vector<float>() == std::vector<float>{5, 6, 0, 0, 3, 4});
  Array oob = ai({0, 3, -1}, {3, 1});
  CHECK(lax::scatter_add(z, oob, upd, dn, GatherScatterMode::fill_or_drop).to_vector<float>() ==
        std::vector<float>{1, 2, 0, 0, 0, 0});
  CHECK(lax::scatter_add(z, oob, upd, dn, GatherScatterMode::promise_in_bounds).to_vector<float>() ==
        std::vector<float>{1, 2, 0, 0, 0, 0});
  CHECK(lax::scatter_add(z, oob, upd, dn, GatherScatterMode::clip).to_vector<float>() ==
        std::vector<float>{6, 8, 0, 0, 3, 4});
  // a window partly out of bounds is dropped whole: window of 2 starting at 1 in a dim of 2
  Array y = af({0, 0});
  CHECK(lax::scatter_add(y, ai({1}, {1, 1}), af({1, 1}, {1, 2}), ScatterDimensionNumbers{{1}, {}, {0}, {}, {}})
            .to_vector<float>() == std::vector<float>{0, 0});
}

TEST_CASE("scatter: batching dims and an empty index vector") {
  Array z = jnp::array<float>(std::vector<float>(6, 0.f), {2, 3});
  ScatterDimensionNumbers dn{{}, {1}, {1}, {0}, {0}};
  CHECK(lax::scatter_add(z, ai({2, 0}, {2, 1}), af({7, 8}), dn).to_vector<float>() ==
        std::vector<float>{0, 0, 7, 8, 0, 0});
  Array x = af({1, 2, 3});
  Array r = lax::scatter_add(x, jnp::array<int32_t>(std::vector<int32_t>{}, {0}), af({10, 20, 30}),
                             ScatterDimensionNumbers{{0}, {}, {}, {}, {}});
  CHECK(r.to_vector<float>() == std::vector<float>{11, 22, 33});
}

TEST_CASE("scatter: every dtype, zero-size updates") {
  for (DType d : kAll) {
    CAPTURE(dtype_name(d));
    Array x = ai({0, 1, 2, 3, 4}).astype(d);
    Array u = ai({1, 1, 1}).astype(d);
    Array r = lax::scatter_add(x, ai({1, 1, 9}, {3, 1}), u, scatter1_dn());
    CHECK(r.dtype() == d);
    if (d == bool_)
      CHECK(r.to_vector<double>() == std::vector<double>{0, 1, 1, 1, 1});  // add on bool is or
    else
      CHECK(r.to_vector<double>() == std::vector<double>{0, 3, 2, 3, 4});
    Array m = lax::scatter_max(x, ai({0, 0}, {2, 1}), ai({1, 3}).astype(d), scatter1_dn());
    CHECK(m.to_vector<double>()[0] == (d == bool_ ? 1 : 3));
  }
  // integer overflow wraps (two's complement), as XLA does
  Array w = lax::scatter_add(ai({0}).astype(i8), ai({0, 0}, {2, 1}), ai({100, 100}).astype(i8), scatter1_dn());
  CHECK(w.to_vector<int32_t>() == std::vector<int32_t>{-56});
  Array x = af({1, 2});
  Array r = lax::scatter_add(x, jnp::array<int32_t>(std::vector<int32_t>{}, {0, 1}),
                             jnp::array<float>(std::vector<float>{}, {0}), scatter1_dn());
  CHECK(r.to_vector<float>() == std::vector<float>{1, 2});
  Array ze = jnp::array<float>(std::vector<float>{}, {0});
  CHECK(lax::scatter_add(ze, jnp::array<int32_t>(std::vector<int32_t>{}, {0, 1}), ze, scatter1_dn()).shape() ==
        Shape{0});
}

TEST_CASE("scatter-add: large, repeated indices, deterministic") {
  const int V = 50, D = 128, N = 3000;
  std::vector<int32_t> ids(N);
  for (int i = 0; i < N; ++i) ids[size_t(i)] = (i * 7) % V;
  Array z = jnp::array<float>(std::vector<float>(size_t(V) * D, 0.f), {V, D});
  Array ones = jnp::array<float>(std::vector<float>(size_t(N) * D, 1.f), {N, D});
  Array r = lax::scatter_add(z, ai(ids, {N, 1}), ones, ScatterDimensionNumbers{{1}, {0}, {0}, {}, {}});
  auto v = r.to_vector<float>();
  CHECK(v[0] == 60.f);  // 3000 / 50 hits per row
  CHECK(v[size_t(49) * D + 127] == 60.f);
}

TEST_CASE("gather/scatter params print as JAX prints them") {
  Params p = gather_params(GatherDimensionNumbers{{2}, {0}, {0}, {}, {}}, {1, 8}, GatherScatterMode::promise_in_bounds);
  CHECK(param_value_str(p.at("dimension_numbers")) ==
        "GatherDimensionNumbers(offset_dims=(2,), collapsed_slice_dims=(0,), start_index_map=(0,), "
        "operand_batching_dims=(), start_indices_batching_dims=())");
  CHECK(param_value_str(p.at("mode")) == "GatherScatterMode.PROMISE_IN_BOUNDS");
  CHECK(param_value_str(p.at("fill_value")) == "None");
  CHECK(param_value_str(p.at("slice_sizes")) == "(1, 8)");
  CHECK(param_value_str(p.at("indices_are_sorted")) == "False");
  CHECK(param_value_str(p.at("unique_indices")) == "False");
  Params s = scatter_params(ScatterDimensionNumbers{{}, {0}, {0}, {}, {}}, GatherScatterMode::fill_or_drop);
  CHECK(param_value_str(s.at("dimension_numbers")) ==
        "ScatterDimensionNumbers(update_window_dims=(), inserted_window_dims=(0,), scatter_dims_to_operand_dims=(0,), "
        "operand_batching_dims=(), scatter_indices_batching_dims=())");
  CHECK(param_value_str(s.at("mode")) == "GatherScatterMode.FILL_OR_DROP");
  CHECK(param_value_str(s.at("update_consts")) == "()");
  CHECK(param_value_str(s.at("update_jaxpr")) == "None");
  CHECK(param_value_str(
            gather_params(GatherDimensionNumbers{{}, {0}, {0}, {}, {}}, {1}, GatherScatterMode::clip).at("mode")) ==
        "GatherScatterMode.CLIP");
  CHECK(prims::gather().name == "gather");
  CHECK(prims::scatter_add().name == "scatter-add");
  CHECK(prims::scatter().name == "scatter");
  CHECK(prims::scatter_mul().name == "scatter-mul");
  CHECK(prims::scatter_min().name == "scatter-min");
  CHECK(prims::scatter_max().name == "scatter-max");
  // params compare and hash structurally
  Params p2 =
      gather_params(GatherDimensionNumbers{{2}, {0}, {0}, {}, {}}, {1, 8}, GatherScatterMode::promise_in_bounds);
  CHECK(p == p2);
  CHECK(p.hash() == p2.hash());
}

TEST_CASE("gather/scatter misuse") {
  Array x = af({1, 2, 3});
  CHECK_THROWS_WITH_AS(lax::gather(x, af({1}, {1, 1}), take_dn(), {1}), doctest::Contains("float32"), DTypeError);
  CHECK_THROWS_WITH_AS(lax::gather(x, ai({1}, {1, 1}), take_dn(), {1, 1}), doctest::Contains("slice_sizes=(1, 1)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(lax::gather(x, ai({1}, {1, 1}), take_dn(), {4}), doctest::Contains("[0, 3]"), ShapeError);
  CHECK_THROWS_WITH_AS(lax::gather(x, ai({1, 0}, {1, 2}), take_dn(), {1}), doctest::Contains("index vector"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(lax::gather(x, ai({1}, {1, 1}), GatherDimensionNumbers{{0, 1}, {0}, {0}, {}, {}}, {1}),
                       doctest::Contains("offset_dims=(0, 1)"), ShapeError);
  CHECK_THROWS_WITH_AS(lax::gather(x, Array(1), take_dn(), {1}), doctest::Contains("rank >= 1"), ShapeError);
  CHECK_THROWS_WITH_AS(lax::scatter_add(x, ai({1}, {1, 1}), jnp::array<double>({1.0}), scatter1_dn()),
                       doctest::Contains("float64"), DTypeError);
  CHECK_THROWS_WITH_AS(lax::scatter_add(x, ai({1, 2}, {2, 1}), af({1, 2, 3}), scatter1_dn()),
                       doctest::Contains("indices of shape (2, 1)"), ShapeError);
  CHECK_THROWS_WITH_AS(lax::scatter(x, ai({0}, {1, 1}), af({1, 2, 3, 4}, {1, 4}),
                                    ScatterDimensionNumbers{{1}, {}, {0}, {}, {}}),
                       doctest::Contains("exceeds operand dimension"), ShapeError);
  CHECK_THROWS_WITH_AS(lax::gather(af({1, 2, 3, 4}, {2, 2}), ai({1, 0}, {2, 1}),
                                   GatherDimensionNumbers{{}, {1}, {1}, {0}, {0}}, {1, 2}),
                       doctest::Contains("collapsed dimension 1"), ShapeError);
}
