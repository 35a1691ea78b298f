// Helpers shared by the test suites: array builders, host readers and an error-checking macro.
#pragma once
#include <doctest/doctest.h>

#include <exception>
#include <functional>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cjax/cjax.h"
#include "core/array/array_impl.h"
#include "core/array/spmd.h"

namespace cjax::testing {

inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
inline const DType kAllDTypes[] = {bool_, i8, i16, i32, i64, u8, u32, bf16, f16, f32, f64};

// A 1-D (or shaped) array of element type T from doubles (half types rounded through float).
template <class T>
Array arr(const std::vector<double>& v, Shape s = {}) {
  std::vector<T> d;
  for (double x : v) {
    if constexpr (std::is_same_v<T, bfloat16_t> || std::is_same_v<T, float16_t>)
      d.push_back(T(float(x)));
    else
      d.push_back(T(x));
  }
  if (s.empty()) s = {int64_t(v.size())};
  return numpy::array<T>(d, s);
}
// Values ((i % mod) - off) in row-major order: small integers, exact in every dtype.
inline Array seq(const Shape& shape, int mod, int off, DType dt = f32) {
  std::vector<float> v(static_cast<size_t>(shape_size(shape)));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(int(i % size_t(mod)) - off);
  return numpy::array(v, shape).astype(dt);
}
// Array of shape `s` holding base, base+1, ... (bool: parity), converted to dtype `d`.
inline Array idx_array(const Shape& s, DType d, int32_t base = 0) {
  int64_t n = shape_size(s);
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = d == bool_ ? (base + int32_t(i)) % 2 : base + int32_t(i);
  Array a = s.empty() ? make_scalar(double(v[0]), i32) : numpy::array<int32_t>(v, s);
  return lax::convert_element_type(a, d);
}
// What idx_array's values become after a data movement described by source indices.
inline std::vector<double> expect_idx(const std::vector<int64_t>& idx, DType d) {
  std::vector<double> out;
  for (int64_t i : idx) out.push_back(d == bool_ ? double(i % 2) : double(i));
  return out;
}
inline std::vector<double> vals(const Array& a) { return a.astype(f64).to_vector<double>(); }
inline std::vector<double> dv(const Array& a) { return a.to_vector<double>(); }
inline std::vector<int64_t> iv(const Array& a) { return a.to_vector<int64_t>(); }
template <class T>
std::vector<T> vec(const Array& a) {
  return a.to_vector<T>();
}
// The text operator<< prints (jaxprs, arrays).
template <class J>
std::string text(const J& j) {
  std::ostringstream os;
  os << j;
  return os.str();
}

// Slice i of `x` along `axis` (negative counts from the end), with that axis removed.
inline Array take_example(const Array& x, int axis, int64_t i) {
  int a = axis < 0 ? axis + x.ndim() : axis;
  return lax::squeeze(lax::slice_in_dim(x, i, i + 1, 1, a), {a});
}
// Same shape and dtype, and every element within `tol` (relative, and absolute near zero).
inline void check_all_close(const Array& got, const Array& want, double tol = 1e-6) {
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  auto g = vals(got), w = vals(want);
  for (size_t i = 0; i < g.size(); ++i) CHECK(g[i] == doctest::Approx(w[i]).epsilon(tol).scale(1.0));
}
// vmap(f) over `axes` (nullopt: unbatched) equals stacking f on each of the B examples.
inline void check_vmap_matches_stack(const std::function<Array(const std::vector<Array>&)>& f,
                                     const std::vector<Array>& args, const std::vector<std::optional<int>>& axes,
                                     int64_t B) {
  using VA = std::vector<Array>;
  Array got = vmap_detail::vmap([&](const VA& xs) { return VA{f(xs)}; }, args, axes, {0}, {})[0];
  VA per;
  for (int64_t i = 0; i < B; ++i) {
    VA xs;
    for (size_t k = 0; k < args.size(); ++k) xs.push_back(axes[k] ? take_example(args[k], *axes[k], i) : args[k]);
    per.push_back(f(xs));
  }
  check_all_close(got, numpy::stack(per, 0));
}

// Runs body(t) on `n` threads and rethrows the first failure on the caller.
inline void on_threads(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(n));
  for (int t = 0; t < n; ++t)
    threads.emplace_back([&, t] {
      try {
        body(t);
      } catch (...) {
        errors[size_t(t)] = std::current_exception();
      }
    });
  for (auto& thread : threads) thread.join();
  for (auto& error : errors)
    if (error) std::rethrow_exception(error);
}

}  // namespace cjax::testing

// CHECK_ERR(expr, ErrorType, "part", ...): expr throws ErrorType and its message contains every part.
// Test cases about jit itself (tracing, caching, compiled code, async dispatch) are skipped when
// CJAX_DISABLE_JIT=1 runs every function op by op: TEST_CASE("..." CJAX_JIT_ONLY).
#define CJAX_JIT_ONLY *doctest::skip(cjax::config::disable_jit())

#define CHECK_ERR(expr, Type, ...)                                                                  \
  do {                                                                                              \
    bool thrown_ = false;                                                                           \
    try {                                                                                           \
      (void)(expr);                                                                                 \
    } catch (const Type& e_) {                                                                      \
      thrown_ = true;                                                                               \
      std::string w_ = e_.what();                                                                   \
      for (std::string part_ : {__VA_ARGS__})                                                       \
        CHECK_MESSAGE(w_.find(part_) != std::string::npos, "missing '" << part_ << "' in: " << w_); \
    }                                                                                               \
    CHECK_MESSAGE(thrown_, #expr " did not throw " #Type);                                          \
  } while (0)
