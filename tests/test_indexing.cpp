// numpy-style indexing, .at[] updates, take / take_along_axis. Reference values from numpy 1.24.
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>

#include "cjax/cjax.h"
#include "core/array/array_impl.h"
#include "core/array/trace.h"
#include "core/lax/gather_scatter.h"

using namespace cjax;
namespace jnp = cjax::numpy;

namespace {
Array ai(std::vector<int32_t> v, Shape s = {}) { return jnp::array<int32_t>(v, s); }
Array af(std::vector<float> v, Shape s = {}) { return jnp::array<float>(v, s); }
Array ab(std::vector<bool> v, Shape s = {}) { return jnp::array<bool>(v, s); }
Array arange24() {
  std::vector<int32_t> v(24);
  std::iota(v.begin(), v.end(), 0);
  return ai(v, {2, 3, 4});
}
Array arange_n(int n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return ai(v);
}
std::vector<int32_t> vals(const Array& a) { return a.to_vector<int32_t>(); }

// Records the primitives bound while it is the current trace, and runs them eagerly.
struct CountingTrace final : Trace {
  CountingTrace() : Trace(eval_trace()) {}
  std::vector<std::string> names;
  std::vector<Params> params;
  std::vector<Array> process_primitive(const PrimitiveDef& def, std::span<const Array> in, const Params& p) override {
    names.push_back(def.name);
    params.push_back(p);
    return eval_trace()->process_primitive(def, in, p);
  }
  std::string name() const override { return "CountingTrace"; }
  int count(std::string_view n) const { return int(std::count(names.begin(), names.end(), n)); }
};
const DType kAll[] = {bool_, i8, i16, i32, i64, u8, u32, bf16, f16, f32, f64};
}  // namespace

TEST_CASE("basic indexing: ints") {
  Array x = arange24();
  Array a = x[1];
  CHECK(a.shape() == Shape{3, 4});
  CHECK(vals(a) == std::vector<int32_t>{12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23});
  Array b = x[{-1, 1}];
  CHECK(b.shape() == Shape{4});
  CHECK(vals(b) == std::vector<int32_t>{16, 17, 18, 19});
  Array c = x[{1, 2, -1}];
  CHECK(c.shape() == Shape{});
  CHECK(c.item<int32_t>() == 23);
  CHECK(arange_n(10)[-1].item<int32_t>() == 9);
}

TEST_CASE("basic indexing: slices with None, negative bounds and steps") {
  Array y = arange_n(10);
  CHECK(vals(y[Slice(1, 5)]) == std::vector<int32_t>{1, 2, 3, 4});
  CHECK(vals(y[Slice(None, None, -1)]) == std::vector<int32_t>{9, 8, 7, 6, 5, 4, 3, 2, 1, 0});
  CHECK(vals(y[Slice(8, 2, -2)]) == std::vector<int32_t>{8, 6, 4});
  CHECK(vals(y[Slice(-3, None)]) == std::vector<int32_t>{7, 8, 9});
  CHECK(vals(y[Slice(None, None, 3)]) == std::vector<int32_t>{0, 3, 6, 9});
  CHECK(vals(y[Slice(-100, 100)]) == std::vector<int32_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(y[Slice(5, 2)].shape() == Shape{0});
  CHECK(vals(y[Slice()]) == vals(y));
  CHECK(vals(y[Slice(None, -7, -3)]) == std::vector<int32_t>{9, 6});
}

TEST_CASE("basic indexing: Ellipsis and NewAxis") {
  Array x = arange24();
  Array a = x[{Slice(1, None), Ellipsis, 0}];
  CHECK(a.shape() == Shape{1, 3});
  CHECK(vals(a) == std::vector<int32_t>{12, 16, 20});
  Array b = x[{NewAxis, Slice(None, None, -1)}];
  CHECK(b.shape() == Shape{1, 2, 3, 4});
  CHECK(vals(b) ==
        std::vector<int32_t>{12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  Array c = x[{Slice(), NewAxis, 1, Slice(None, None, 2)}];
  CHECK(c.shape() == Shape{2, 1, 2});
  CHECK(vals(c) == std::vector<int32_t>{4, 6, 16, 18});
  CHECK(x[Ellipsis].shape() == Shape{2, 3, 4});
  CHECK(x[{Ellipsis, NewAxis}].shape() == Shape{2, 3, 4, 1});
  Array s = Array(5);  // 0-d
  CHECK(s[NewAxis].shape() == Shape{1});
  CHECK(s[Ellipsis].item<int32_t>() == 5);
}

TEST_CASE("basic indexing lowers to slice/rev/reshape, never gather") {
  Array x = arange24();
  CountingTrace t;
  {
    TraceScope scope(&t);
    Array a = x[{Slice(1, None), Ellipsis, 0}];
    Array b = x[{NewAxis, Slice(None, None, -1)}];
    Array c = x[1];
  }
  CHECK(t.count("gather") == 0);
  for (auto& n : t.names) CHECK((n == "slice" || n == "rev" || n == "reshape"));
  CHECK(t.count("rev") == 1);
}

TEST_CASE("advanced indexing: placement of the broadcast dims (numpy rules)") {
  Array x = arange24();
  Array idx = ai({2, 0, 2});
  Array a = x[{Slice(), idx}];
  CHECK(a.shape() == Shape{2, 3, 4});
  CHECK(vals(a) ==
        std::vector<int32_t>{8, 9, 10, 11, 0, 1, 2, 3, 8, 9, 10, 11, 20, 21, 22, 23, 12, 13, 14, 15, 20, 21, 22, 23});
  Array i1 = ai({1, 0}), i2 = ai({3, -1});
  // separated by a slice: the advanced dims go first
  Array b = x[{i1, Slice(), i2}];
  CHECK(b.shape() == Shape{2, 3});
  CHECK(vals(b) == std::vector<int32_t>{15, 19, 23, 3, 7, 11});
  Array c = x[{Slice(), i1, i2}];  // adjacent: in place
  CHECK(c.shape() == Shape{2, 2});
  CHECK(vals(c) == std::vector<int32_t>{7, 3, 19, 15});
  Array d = x[{0, Slice(), i2}];  // an int counts as advanced: not adjacent
  CHECK(d.shape() == Shape{2, 3});
  CHECK(vals(d) == std::vector<int32_t>{3, 7, 11, 3, 7, 11});
  Array e = x[{i1, 1}];
  CHECK(e.shape() == Shape{2, 4});
  CHECK(vals(e) == std::vector<int32_t>{16, 17, 18, 19, 4, 5, 6, 7});
  Array f = x[{Ellipsis, i2, NewAxis}];
  CHECK(f.shape() == Shape{2, 3, 2, 1});
  CHECK(vals(f) == std::vector<int32_t>{3, 3, 7, 7, 11, 11, 15, 15, 19, 19, 23, 23});
  Array g = x[{1, Slice(None, None, -1), ai({0, 3})}];
  CHECK(g.shape() == Shape{2, 3});
  CHECK(vals(g) == std::vector<int32_t>{20, 16, 12, 23, 19, 15});
  Array h = x[{Slice(), ai({0, 2}, {2, 1}), ai({1, 3})}];  // (2,1) x (2,) broadcast to (2,2)
  CHECK(h.shape() == Shape{2, 2, 2});
  CHECK(vals(h) == std::vector<int32_t>{1, 3, 9, 11, 13, 15, 21, 23});
  // dynamic 0-d index
  CHECK(vals(x[{Array(1), 2}]) == std::vector<int32_t>{20, 21, 22, 23});
  CHECK(arange_n(10)[Array(-2)].item<int32_t>() == 8);
}

TEST_CASE("advanced indexing: out-of-range array entries clamp (JAX's default for gets)") {
  Array y = arange_n(10);
  CHECK(vals(y[ai({12, -11, -1})]) == std::vector<int32_t>{9, 0, 9});
  CHECK(vals(y.at(ai({12})).get()) == std::vector<int32_t>{9});
}

TEST_CASE("embedding lookup table[ids] is a single gather with JAX's dimension numbers") {
  const int V = 7, D = 3;
  std::vector<float> tv(V * D);
  for (int i = 0; i < V * D; ++i) tv[size_t(i)] = float(i);
  Array table = af(tv, {V, D});
  Array ids = ai({1, 6, 0, 1, 2, -1}, {2, 3});
  CountingTrace t;
  Array r;
  {
    TraceScope scope(&t);
    r = table[ids];
  }
  CHECK(r.shape() == Shape{2, 3, 3});
  CHECK(r.to_vector<float>() == std::vector<float>{3, 4, 5, 18, 19, 20, 0, 1, 2, 3, 4, 5, 6, 7, 8, 18, 19, 20});
  CHECK(t.count("gather") == 1);
  size_t gi = size_t(std::find(t.names.begin(), t.names.end(), "gather") - t.names.begin());
  const Params& p = t.params[gi];
  CHECK(param_value_str(p.at("dimension_numbers")) ==
        "GatherDimensionNumbers(offset_dims=(2,), collapsed_slice_dims=(0,), start_index_map=(0,), "
        "operand_batching_dims=(), start_indices_batching_dims=())");
  CHECK(param_value_str(p.at("slice_sizes")) == "(1, 3)");
  CHECK(param_value_str(p.at("mode")) == "GatherScatterMode.PROMISE_IN_BOUNDS");
  CHECK(param_value_str(p.at("fill_value")) == "None");
}

TEST_CASE("boolean masks") {
  Array x = arange24();
  std::vector<bool> mv(24);
  for (int i = 0; i < 24; ++i) mv[size_t(i)] = i % 5 == 0;
  Array m = ab(mv, {2, 3, 4});
  CHECK(vals(x[m]) == std::vector<int32_t>{0, 5, 10, 15, 20});
  Array a = x[{Slice(), ab({true, false, true})}];
  CHECK(a.shape() == Shape{2, 2, 4});
  CHECK(vals(a) == std::vector<int32_t>{0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 20, 21, 22, 23});
  CHECK(x[Array(true)].shape() == Shape{1, 2, 3, 4});
  CHECK(x[Array(false)].shape() == Shape{0, 2, 3, 4});
  Array b = x[{1, Array(true)}];
  CHECK(b.shape() == Shape{1, 3, 4});
  CHECK(vals(b)[0] == 12);
  // all-false mask -> empty
  CHECK(x[ab(std::vector<bool>(24, false), {2, 3, 4})].shape() == Shape{0});
  // mask after an Ellipsis
  Array c = x[{Ellipsis, ab({false, true, true, false})}];
  CHECK(c.shape() == Shape{2, 3, 2});
  CHECK(vals(c) == std::vector<int32_t>{1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22});
}

TEST_CASE("indexing every dtype") {
  for (DType d : kAll) {
    CAPTURE(dtype_name(d));
    Array x = ai({0, 1, 2, 3, 4, 5}, {2, 3}).astype(d);
    Array a = x[{Slice(), ai({2, 0})}];
    CHECK(a.dtype() == d);
    std::vector<double> expect = {2, 0, 5, 3};
    if (d == bool_) expect = {1, 0, 1, 1};
    CHECK(a.to_vector<double>() == expect);
    Array b = x[{-1, Slice(None, None, -1)}];
    std::vector<double> eb = {5, 4, 3};
    if (d == bool_) eb = {1, 1, 1};
    CHECK(b.to_vector<double>() == eb);
    Array s = x.at(ai({0, 0})).set(Array(1).astype(d));
    CHECK(s.dtype() == d);
    CHECK(s.to_vector<double>()[0] == 1);
  }
  // index arrays of every integer dtype
  Array y = arange_n(10);
  for (DType d : {i8, i16, i64, u8, u32}) {
    CAPTURE(dtype_name(d));
    CHECK(vals(y[ai({7, 2}).astype(d)]) == std::vector<int32_t>{7, 2});
  }
  CHECK(vals(y[ai({-3}).astype(i8)]) == std::vector<int32_t>{7});
}

TEST_CASE("zero-size arrays and index arrays") {
  Array z = jnp::array<float>(std::vector<float>{}, {0, 3});
  CHECK(z[Slice()].shape() == Shape{0, 3});
  CHECK(z[{Slice(), 1}].shape() == Shape{0});
  Array e = jnp::array<int32_t>(std::vector<int32_t>{}, {0});
  CHECK(arange_n(5)[e].shape() == Shape{0});
  CHECK(z[e].shape() == Shape{0, 3});
  CHECK(arange24()[{Slice(), e}].shape() == Shape{2, 0, 4});
  CHECK(vals(arange_n(5).at(e).add(Array(1))) == std::vector<int32_t>{0, 1, 2, 3, 4});
  Array ze = jnp::array<float>(std::vector<float>{}, {0});
  CHECK(ze[e].shape() == Shape{0});
}

TEST_CASE(".at[] updates: set/add/multiply/min/max with duplicates") {
  Array x = af({0, 1, 2, 3, 4});
  Array idx = ai({0, 2, 0, 4});
  CHECK(x.at(idx).add(af({1, 2, 3, 4})).to_vector<float>() == std::vector<float>{4, 1, 4, 3, 8});
  CHECK(x.at(idx).set(af({1, 2, 3, 4})).to_vector<float>() == std::vector<float>{3, 1, 2, 3, 4});
  Array x1 = af({1, 2, 3, 4, 5});
  CHECK(x1.at(ai({1, 1, 3})).multiply(af({2, 3, 4})).to_vector<float>() == std::vector<float>{1, 12, 3, 16, 5});
  CHECK(x.at(ai({1, 1, 3})).min(af({-1, 0.5f, 7})).to_vector<float>() == std::vector<float>{0, -1, 2, 3, 4});
  CHECK(x.at(ai({1, 1, 3})).max(af({-1, 9, 7})).to_vector<float>() == std::vector<float>{0, 9, 2, 7, 4});
  // scalar update broadcast, static int, slice, negative array index
  CHECK(x.at(2).set(Array(9.f)).to_vector<float>() == std::vector<float>{0, 1, 9, 3, 4});
  CHECK(x.at(-1).add(Array(10)).to_vector<float>() == std::vector<float>{0, 1, 2, 3, 14});
  CHECK(x.at(Slice(1, None, 2)).set(Array(0.5)).to_vector<float>() == std::vector<float>{0, 0.5f, 2, 0.5f, 4});
  CHECK(x.at(Slice(None, None, -1)).set(af({5, 6, 7, 8, 9})).to_vector<float>() == std::vector<float>{9, 8, 7, 6, 5});
  CHECK(x.at(ai({-1, -5})).set(Array(7.f)).to_vector<float>() == std::vector<float>{7, 1, 2, 3, 7});
  // out-of-range array entries are dropped (FILL_OR_DROP), unlike gets
  CHECK(x.at(ai({5, 1, -6})).set(Array(-1.f)).to_vector<float>() == std::vector<float>{0, -1, 2, 3, 4});
  // the operand is unchanged; dtype and weak type kept
  CHECK(x.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4});
  Array xi = ai({1, 2, 3});
  Array r = xi.at(0).multiply(Array(2.5));  // promoted to float, then back to int32 (JAX)
  CHECK(r.dtype() == i32);
  CHECK(vals(r) == std::vector<int32_t>{2, 2, 3});
  CHECK(vals(xi.at(0).get()) == std::vector<int32_t>{1});
}

TEST_CASE(".at[] updates on 2-D and 3-D arrays") {
  Array z = jnp::zeros({3, 4});
  Array a = z.at({Slice(), ai({1, 3})}).set(af({1, 2}));
  CHECK(a.to_vector<float>() == std::vector<float>{0, 1, 0, 2, 0, 1, 0, 2, 0, 1, 0, 2});
  Array b = z.at({ai({0, 2, 0}), Slice(), NewAxis}).add(Array(1.f));
  CHECK(b.to_vector<float>() == std::vector<float>{2, 2, 2, 2, 0, 0, 0, 0, 1, 1, 1, 1});
  Array c = z.at({1, Slice(1, 3)}).set(af({7, 8}));
  CHECK(c.to_vector<float>() == std::vector<float>{0, 0, 0, 0, 0, 7, 8, 0, 0, 0, 0, 0});
  std::vector<bool> mv(12, false);
  mv[0] = mv[5] = mv[11] = true;
  Array d = z.at(ab(mv, {3, 4})).set(af({1, 2, 3}));
  CHECK(d.to_vector<float>() == std::vector<float>{1, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 3});
  // embedding-gradient form: rows accumulate
  Array g = jnp::zeros({4, 2}).at(ai({1, 3, 1}, {1, 3})).add(jnp::ones({1, 3, 2}));
  CHECK(g.to_vector<float>() == std::vector<float>{0, 0, 2, 2, 0, 0, 1, 1});
  Array x = arange24().astype(f32);
  Array e = x.at({ai({1, 0}), Slice(), ai({3, -1})}).set(jnp::zeros({2, 3}));
  auto ev = e.to_vector<float>();
  CHECK(ev[3] == 0);
  CHECK(ev[7] == 0);
  CHECK(ev[15] == 0);
  CHECK(ev[23] == 0);
  CHECK(ev[2] == 2);
  Array f = z.at(Array(true)).set(Array(3.f));
  CHECK(f.shape() == Shape{3, 4});
  CHECK(f.to_vector<float>()[11] == 3);
}

TEST_CASE("take") {
  Array a = af({1, 2, 3, 4, 5, 6}, {2, 3});
  Array r = jnp::take(a, ai({2, 0}), 1);
  CHECK(r.shape() == Shape{2, 2});
  CHECK(r.to_vector<float>() == std::vector<float>{3, 1, 6, 4});
  CHECK(jnp::take(a, ai({5, 0, 3})).to_vector<float>() == std::vector<float>{6, 1, 4});
  CHECK(jnp::take(a, ai({-4, 7, 2}), 1, "wrap").to_vector<float>() == std::vector<float>{3, 2, 3, 6, 5, 6});
  CHECK(jnp::take(a, ai({-4, 7, 2}), 1, "clip").to_vector<float>() == std::vector<float>{1, 3, 3, 4, 6, 6});
  // fill (default): -1 wraps once, out of range -> NaN (int: minimum)
  auto f = jnp::take(a, ai({-1, 3, -4}), 1).to_vector<float>();
  CHECK(f[0] == 3);
  CHECK(std::isnan(f[1]));
  CHECK(std::isnan(f[2]));
  CHECK(jnp::take(ai({1, 2, 3}), ai({3})).item<int32_t>() == std::numeric_limits<int32_t>::min());
  // indices with several dims, negative axis
  Array r2 = jnp::take(a, ai({0, 1, 1, 0}, {2, 2}), -1);
  CHECK(r2.shape() == Shape{2, 2, 2});
  CHECK(r2.to_vector<float>() == std::vector<float>{1, 2, 2, 1, 4, 5, 5, 4});
  CHECK(jnp::take(a, jnp::array<int32_t>(std::vector<int32_t>{}, {0}), 0).shape() == Shape{0, 3});
  for (DType d : kAll) {
    CAPTURE(dtype_name(d));
    Array x = ai({0, 3, 5}).astype(d);
    double last = d == bool_ ? 1 : 5;
    CHECK(jnp::take(x, ai({2, 0}), 0, "clip").to_vector<double>() == std::vector<double>{last, 0});
  }
}

TEST_CASE("take_along_axis") {
  Array a = af({1, 2, 3, 4, 5, 6}, {2, 3});
  CHECK(jnp::take_along_axis(a, ai({0, 2, 1, 0}, {2, 2}), 1).to_vector<float>() == std::vector<float>{1, 3, 5, 4});
  CHECK(jnp::take_along_axis(a, ai({1, 0, 1}, {1, 3}), 0).to_vector<float>() == std::vector<float>{4, 2, 6});
  Array b = arange24();
  Array r = jnp::take_along_axis(b, ai({3, 0, 1, 2, 2, 0}, {2, 3, 1}), 2);
  CHECK(r.shape() == Shape{2, 3, 1});
  CHECK(vals(r) == std::vector<int32_t>{3, 4, 9, 14, 18, 20});
  Array bc = jnp::take_along_axis(b, ai({1, 0}, {1, 1, 2}), -1);  // broadcast indices over dims 0, 1
  CHECK(bc.shape() == Shape{2, 3, 2});
  CHECK(vals(bc) == std::vector<int32_t>{1, 0, 5, 4, 9, 8, 13, 12, 17, 16, 21, 20});
  Array s = ai({5, 3, 4, 2, 7, 6}, {2, 3});
  CHECK(vals(jnp::take_along_axis(s, ai({1, 2, 0, 0, 2, 1}, {2, 3}), 1)) == std::vector<int32_t>{3, 4, 5, 2, 6, 7});
  // negative indices wrap once, out of range fills
  auto f = jnp::take_along_axis(a, ai({-1, 5}, {1, 2}), 1).to_vector<float>();
  CHECK(f.size() == 4);  // indices (1, 2) broadcast against arr (2, 3) outside the axis -> (2, 2)
  CHECK(f[0] == 3);
  CHECK(std::isnan(f[1]));
  CHECK(f[2] == 6);
  CHECK(std::isnan(f[3]));
  // arr broadcast along a dim of size 1
  Array col = af({10, 20, 30}, {1, 3});
  CHECK(jnp::take_along_axis(col, ai({2, 0, 1, 1}, {2, 2}), 1).to_vector<float>() ==
        std::vector<float>{30, 10, 20, 20});
  CHECK(jnp::take_along_axis(jnp::zeros({2, 0}), ai({0, 0}, {2, 1}), 1).to_vector<float>() == std::vector<float>{0, 0});
}

TEST_CASE("indexing misuse: typed errors naming what is wrong") {
  Array x = arange24();
  CHECK_THROWS_WITH_AS((x[{0, 0, 0, 0}]), doctest::Contains("3-dimensional"), ValueError);
  CHECK_THROWS_WITH_AS((x[{0, 5}]), doctest::Contains("index 5 is out of bounds for axis 1 with size 3"), ValueError);
  CHECK_THROWS_WITH_AS(x[-3], doctest::Contains("axis 0 with size 2"), ValueError);
  CHECK_THROWS_WITH_AS(x[af({1.f})], doctest::Contains("float32"), DTypeError);
  CHECK_THROWS_WITH_AS((x[{Ellipsis, 0, Ellipsis}]), doctest::Contains("single ellipsis"), ValueError);
  CHECK_THROWS_WITH_AS(x[ab({true, false, true})], doctest::Contains("got a mask of shape (3,), expected shape (2,)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(jnp::zeros({3}).at(ai({0, 1})).set(af({1, 2, 3})),
                       doctest::Contains("update of shape (3,) cannot be broadcast to the indexed shape (2,)"),
                       ShapeError);
  CHECK_THROWS_WITH_AS(x[Slice(0, 2, 0)], doctest::Contains("step cannot be zero"), ValueError);
  CHECK_THROWS_WITH_AS((x[{ai({0, 1}), ai({0, 1, 2})}]), doctest::Contains("(2,) (3,)"), ShapeError);
  CHECK_THROWS_WITH_AS(jnp::take(x, ai({0}), 0, "raise"), doctest::Contains("invalid mode 'raise'"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::take(x, af({0.f})), doctest::Contains("float32"), DTypeError);
  CHECK_THROWS_WITH_AS(jnp::take(x, ai({0}), 3), doctest::Contains("axis 3"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::take_along_axis(x, ai({0}), 0), doctest::Contains("rank 1"), ShapeError);
  CHECK_THROWS_WITH_AS(jnp::take_along_axis(x, ai({0, 0, 0}, {3, 1, 1}), 2),
                       doctest::Contains("not broadcast-compatible"), ShapeError);
  CHECK_THROWS_WITH_AS(jnp::take(jnp::zeros({0}), ai({0})), doctest::Contains("empty axis"), ValueError);
  CHECK_THROWS_WITH_AS(jnp::zeros({0})[0], doctest::Contains("axis 0 with size 0"), ValueError);
  CHECK_THROWS_WITH_AS(x.at(7).set(Array(1)), doctest::Contains("index 7 is out of bounds for axis 0 with size 2"),
                       ValueError);
  CHECK_THROWS_WITH_AS(x[Array()], doctest::Contains("empty Array"), ValueError);
}

TEST_CASE("a traced mask raises ConcretizationError pointing at jnp::where") {
  Array x = arange_n(3);
  CountingTrace t;
  struct LiveTracer final : Tracer {
    using Tracer::Tracer;
    bool is_live() const override { return true; }
  };
  Array tracer(std::make_shared<LiveTracer>(AbstractValue{{3}, bool_, false, {}}, &t));
  CHECK_THROWS_WITH_AS(x[tracer], doctest::Contains("jnp::where"), ConcretizationError);
}

TEST_CASE("a block index (a slice per dimension) indexes and updates like its slices") {
  Array x = arange24();  // [2, 3, 4]
  Index block = std::vector<Slice>{Slice(0, 1), Slice(1, 3)};
  CHECK(x[block].shape() == Shape{1, 2, 4});
  CHECK(vals(x[block]) == std::vector<int32_t>{4, 5, 6, 7, 8, 9, 10, 11});
  CHECK(vals(x[{block, 2}]) == std::vector<int32_t>{6, 10});
  CHECK(block.block().size() == 2);
  CHECK_THROWS_AS((void)Index(3).block(), ValueError);
  Array y = x.at(block).set(0);
  CHECK(jnp::sum(y).item<int32_t>() == 276 - (4 + 5 + 6 + 7 + 8 + 9 + 10 + 11));
  // A shard's index reads its block from the global value.
  Mesh mesh(devices(), {8}, {"x"});
  Array g = device_put(jnp::arange(32).reshape({8, 4}), NamedSharding(mesh, P("x")));
  for (const Shard& s : g.addressable_shards()) CHECK(vals(g[Index(s.index)]) == vals(s.data));
}

TEST_CASE("make_array_from_callback takes a callback of an Index, as the JAX idiom data[idx]") {
  Mesh mesh(devices(), {4, 2}, {"i", "j"});
  Array data = jnp::arange(8 * 6).reshape({8, 6});
  int calls = 0;
  Array a = make_array_from_callback({8, 6}, NamedSharding(mesh, P("i", "j")), [&](const Index& idx) {
    ++calls;
    return data[idx];
  });
  CHECK(calls == 8);
  CHECK(vals(a) == vals(data));
  Array b = make_array_from_callback({8, 6}, NamedSharding(mesh, P("i")), [&](const std::vector<Slice>& idx) {
    return lax::slice(data, {*idx[0].start, 0}, {*idx[0].stop, 6});
  });
  CHECK(vals(b) == vals(data));
}
