// The CPU compiler: what fuses (plans read like docs/design.md §5.4), that generated kernels compute
// what the eager library kernels compute (every scalar op in every dtype, conversions, selects,
// broadcasts, reductions), determinism, in-place outputs, the kernel cache and CJAX_DUMP.
#include <doctest/doctest.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "backends/cpu/llvm_jit.h"
#include "cjax/cjax.h"
#include "core/array/array_impl.h"
#include "core/array/primitive.h"
#include "jit/executable.h"
#include "jit/passes/passes.h"
#include "test_util.h"
#include "trace/eval_jaxpr.h"
#include "trace/shard_map.h"

using namespace cjax;
using namespace cjax::testing;
namespace jnp = cjax::numpy;

namespace {

template <class F, class... A>
FusionPlan plan_of(F f, const A&... args) {
  return Executable(make_jaxpr(f)(args...)).plan();
}
int count_lines(const std::string& text, const std::string& prefix) {
  std::istringstream is(text);
  int n = 0;
  for (std::string line; std::getline(is, line);) n += line.rfind(prefix, 0) == 0;
  return n;
}
// Elementwise equality up to `tol` relative (absolute near zero); NaN equals NaN, infinities
// must match exactly.
void check_same(const Array& got, const Array& want, double tol, const std::string& what) {
  REQUIRE(got.shape() == want.shape());
  REQUIRE(got.dtype() == want.dtype());
  auto g = vals(got), w = vals(want);
  int bad = 0;
  for (size_t i = 0; i < g.size() && bad < 3; ++i) {
    bool ok = (std::isnan(g[i]) && std::isnan(w[i])) || g[i] == w[i] ||
              std::fabs(g[i] - w[i]) <= tol * std::max(1.0, std::fabs(w[i]));
    if (!ok) {
      ++bad;
      FAIL_CHECK(what << ": element " << i << " is " << g[i] << ", eager gives " << w[i]);
    }
  }
}
std::filesystem::path fresh_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() / fmt::format("cjax_{}_{}", name, ::getpid());
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}
std::string read(const std::filesystem::path& p) {
  std::ifstream in(p);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

Array chain10(const Array& x) {
  Array y = x * 1.5f;
  y = y + 0.5f;
  y = jnp::tanh(y);
  y = y * 0.9f;
  y = y - 0.1f;
  y = nn::relu(y);
  y = y * 2.0f;
  y = nn::sigmoid(y);
  y = y + 1.0f;
  return y * 0.5f;
}

}  // namespace

TEST_CASE("a chain of 10 elementwise ops is one kernel and matches eager") {
  Array x = random::normal(random::key(0), {1000, 37});
  FusionPlan p = plan_of(chain10, x);
  REQUIRE(p.kernels.size() == 1);
  CHECK(p.steps.size() == 1);
  CHECK(p.kernels[0].eqns.size() >= 10);
  CHECK(p.kernels[0].spec.rows() == 1);  // contiguous: one flat row split over threads by columns
  CHECK(p.kernels[0].spec.cols == 37000);
  check_same(jit(chain10)(x), chain10(x), 1e-6, "chain");
}

TEST_CASE("softmax, log_softmax, RMSNorm and layer norm rows are one kernel") {
  Array x = random::normal(random::key(1), {33, 257}) * 4.0f;
  Array g = random::normal(random::key(2), {257});
  FusionPlan sm = plan_of([](const Array& x) { return nn::softmax(x); }, x);
  REQUIRE(sm.kernels.size() == 1);
  CHECK(sm.steps.size() == 1);
  CHECK(sm.kernels[0].spec.num_passes == 3);  // max, sum of exp, normalise
  CHECK(sm.kernels[0].spec.rows() == 33);
  FusionPlan rms = plan_of([](const Array& x, const Array& g) { return nn::rms_norm(x, g); }, x, g);
  REQUIRE(rms.kernels.size() == 1);
  CHECK(rms.steps.size() == 1);
  CHECK(rms.kernels[0].spec.num_passes == 2);
  auto layer_norm = [](const Array& x, const Array& g) {
    Array m = jnp::mean(x, -1, true);
    Array v = jnp::mean(jnp::square(x - m), -1, true);
    return (x - m) * lax::rsqrt(v + 1e-5f) * g;
  };
  CHECK(plan_of(layer_norm, x, g).kernels.size() == 1);
  for (Shape s : {Shape{1, 1}, Shape{3, 5}, Shape{64, 1000}, Shape{2, 3, 7}}) {
    Array a = random::normal(random::key(3), s) * 3.0f;
    Array gs = random::normal(random::key(4), {s.back()});
    auto sm_f = [](const Array& x) { return nn::softmax(x); };
    auto lsm_f = [](const Array& x) { return nn::log_softmax(x); };
    auto rms_f = [](const Array& x, const Array& g) { return nn::rms_norm(x, g); };
    check_same(jit(sm_f)(a), sm_f(a), 2e-6, "softmax");
    check_same(jit(lsm_f)(a), lsm_f(a), 2e-6, "log_softmax");
    check_same(jit(rms_f)(a, gs), rms_f(a, gs), 2e-6, "rms_norm");
    check_same(jit(layer_norm)(a, gs), layer_norm(a, gs), 1e-5, "layer_norm");
  }
}

TEST_CASE("broadcasts are read through index maps, never materialized inside a fusion") {
  Array x = random::normal(random::key(5), {4, 6, 8});
  Array row = random::normal(random::key(6), {8});
  Array col = random::normal(random::key(7), {4, 1, 1});
  Array mid = random::normal(random::key(8), {6, 1});
  Array s = Array(2.5f);
  auto f = [](const Array& x, const Array& row, const Array& col, const Array& mid, const Array& s) {
    return jnp::exp(x * row + col) - mid * s + jnp::sum(x, {1, 2}, true);
  };
  FusionPlan p = plan_of(f, x, row, col, mid, s);
  std::string d = p.describe();
  CHECK(count_lines(d, "broadcast_in_dim") == 0);  // no library broadcast step
  check_same(jit(f)(x, row, col, mid, s), f(x, row, col, mid, s), 1e-5, "broadcasts");
  // Reductions over trailing axes of 3-D arrays, keepdims or not; a full reduction; a mean.
  auto g = [](const Array& x) {
    return std::tuple{jnp::max(x, {2}), jnp::sum(x * x, {1, 2}), jnp::mean(x), jnp::min(x, {2}, true)};
  };
  auto [a1, a2, a3, a4] = jit(g)(x);
  auto [b1, b2, b3, b4] = g(x);
  check_same(a1, b1, 0, "max");
  check_same(a2, b2, 1e-5, "sum of squares");
  check_same(a3, b3, 1e-5, "mean");
  check_same(a4, b4, 0, "min keepdims");
}

TEST_CASE("leading and interior reductions run the library reduce on the fused producer's output") {
  Array x = random::normal(random::key(9), {16, 24, 5});
  auto f = [](const Array& x) { return std::pair{jnp::sum(jnp::tanh(x), {0}), jnp::max(x * 2.0f, {1})}; };
  FusionPlan p = plan_of(f, x);
  std::string d = p.describe();
  CHECK(count_lines(d, "reduce_sum") == 1);
  CHECK(count_lines(d, "reduce_max") == 1);
  auto [a, b] = jit(f)(x);
  auto [c, e] = f(x);
  check_same(a, c, 1e-5, "column sum");
  check_same(b, e, 0, "interior max");
}

TEST_CASE("every scalar op in every dtype of its domain matches the eager kernel") {
  // Values chosen to hit signs, zero, fractions, large magnitudes and (for ints) the wrap-around
  // and division corner cases.
  std::vector<double> base = {-7.5, -3, -1, -0.5, 0, 0.25, 1, 2, 3.75, 9, 100, -100, 0.1, 5, -2, 64};
  std::vector<double> other = {2, -3, 0, 4, -1, 3, 0.5, -2.25, 1, 7, -9, 31, 2, -5, 6, 1};
  for (const ScalarOpInfo& info : kScalarOps) {
    if (info.op == ScalarOp::ErfInv || info.op == ScalarOp::Lgamma) continue;  // library kernels
    const PrimitiveDef* def = find_primitive(info.name);
    REQUIRE(def);
    for (DType dt : kAllDTypes) {
      bool fl = is_floating(dt), in_domain;
      switch (info.domain) {
        case ScalarDomain::Float:
        case ScalarDomain::Pred: in_domain = fl; break;
        case ScalarDomain::Int: in_domain = is_integer(dt); break;
        case ScalarDomain::Num: in_domain = dt != bool_; break;
        case ScalarDomain::Logic: in_domain = !fl; break;
        default: in_domain = true;
      }
      if (!in_domain) continue;
      auto make = [&](const std::vector<double>& v, int shift) {
        std::vector<double> w;
        for (size_t i = 0; i < v.size(); ++i) {
          double t = v[(i + size_t(shift)) % v.size()];
          if (!fl) t = std::trunc(t);
          if (is_unsigned_integer(dt)) t = std::fabs(t);
          if (info.op == ScalarOp::ShiftLeft || info.op == ScalarOp::ShiftRightLogical ||
              info.op == ScalarOp::ShiftRightArithmetic)
            t = shift ? std::fmod(std::fabs(t), 40.0) : t;
          w.push_back(t);
        }
        return arr<double>(w).astype(dt);
      };
      std::vector<Array> args;
      for (int k = 0; k < info.arity; ++k) args.push_back(make(k == 1 ? other : base, k));
      auto f = [def](const std::vector<Array>& a) { return bind1(*def, std::span<const Array>(a)); };
      Array want = f(args);
      Array got = jit(f)(args);
      // Transcendentals: our approximations vs libm, a few ulp; half types round the same way.
      double tol = dt == f64 ? 1e-13 : dt == f32 ? 2e-6 : dt == bf16 ? 1e-2 : dt == f16 ? 2e-3 : 0;
      check_same(got, want, tol, fmt::format("{} {}", info.name, dtype_name(dt)));
    }
  }
}

TEST_CASE("conversions, selects, integer_pow and clamp match the eager kernels") {
  Array x =
      arr<double>({-1e10, -300.7, -129, -1.5, -0.5, 0, 0.5, 1.5, 2.5, 127.9, 255.5, 3e9, kInf, -kInf, kNaN, 1e-40});
  for (DType from : kAllDTypes)
    for (DType to : kAllDTypes) {
      Array a = x.astype(from);
      auto f = [to](const Array& v) { return lax::convert_element_type(v * 1, to); };
      check_same(jit(f)(a), f(a), 0, fmt::format("convert {} -> {}", dtype_name(from), dtype_name(to)));
    }
  Array p = arr<int32_t>({-3, 0, 1, 2, 7, 1, 0, 2});
  Array a = arr<float>({1, 2, 3, 4, 5, 6, 7, 8}), b = a * 10.0f, c = a * 100.0f;
  auto sel = [](const Array& p, const Array& a, const Array& b, const Array& c) {
    return std::pair{lax::select_n(p, {a + 0.0f, b, c}), lax::select_n(p > 0, {a, b * 2.0f})};
  };
  auto [s1, s2] = jit(sel)(p, a, b, c);
  auto [t1, t2] = sel(p, a, b, c);
  check_same(s1, t1, 0, "select_n int32");
  check_same(s2, t2, 0, "select_n bool");
  for (int y : {0, 1, 2, 3, 7, -1, -4}) {
    auto ip = [y](const Array& v) { return lax::integer_pow(v - 4.5f, y); };
    check_same(jit(ip)(a), ip(a), 1e-6, fmt::format("integer_pow {}", y));
  }
  auto cl = [](const Array& v) { return lax::clamp(Array(2.0f), v * 1.0f, Array(6.5f)); };
  check_same(jit(cl)(a), cl(a), 0, "clamp");
}

TEST_CASE("fused reductions are deterministic and accurate") {
  Array x = random::normal(random::key(10), {1 << 20});
  auto f = jit([](const Array& x) { return jnp::sum(x * x); });
  float r1 = f(x).item<float>(), r2 = f(x).item<float>();
  CHECK(std::memcmp(&r1, &r2, sizeof r1) == 0);
  double exact = 0;
  for (double v : dv(x.astype(f64))) exact += v * v;
  CHECK(r1 == doctest::Approx(exact).epsilon(1e-5));
  Array m = random::normal(random::key(11), {300, 3000});
  auto rows = jit([](const Array& m) { return jnp::sum(jnp::exp(m), {1}); });
  CHECK(dv(rows(m).astype(f64)) == dv(rows(m).astype(f64)));
  // A row of 4M: the vector accumulators are summed in blocks, so the error stays near the
  // float rounding of the result (one accumulator per lane: 1e-4).
  Array row = random::normal(random::key(12), {1, 1 << 22}) * 3.0f;  // terms from e^-15 to e^15
  double exact_row = 0;
  for (double v : dv(row.astype(f64))) exact_row += std::exp(v);
  double got = dv(rows(row).astype(f64))[0];
  INFO("relative error " << (got - exact_row) / exact_row);
  CHECK(got == doctest::Approx(exact_row).epsilon(1e-6));
}

TEST_CASE("outputs are written in place over donated and dying inputs, never over live ones" CJAX_JIT_ONLY) {
  Array x = random::normal(random::key(12), {4096});
  void* before = raw_ptr(x);
  auto f = jit([](const Array& x) { return jnp::exp(x * 0.5f) + 1.0f; }, {.name = "donating", .donate_argnums = {0}});
  Array want = jnp::exp(x * 0.5f) + 1.0f;
  Array y = f(x);
  CHECK(raw_ptr(y) == before);  // the donated buffer holds the result
  CHECK_THROWS_AS(x + 1.0f, ValueError);
  check_same(y, want, 1e-6, "donated");
  // Not donated: the argument must survive untouched even though the kernel could write over it.
  Array z = random::normal(random::key(13), {4096});
  std::vector<float> z0 = z.to_vector<float>();
  auto g = jit([](const Array& z) { return jnp::exp(z * 0.5f) + 1.0f; });
  Array out = g(z);
  CHECK(raw_ptr(out) != raw_ptr(z));
  CHECK(z.to_vector<float>() == z0);
  // A dying intermediate of a library step (the matmul's output) is reused by the kernel after it.
  Array a = random::normal(random::key(14), {64, 64});
  auto h = [](const Array& a) { return jnp::tanh(jnp::matmul(a, a)) * 2.0f; };
  Executable e(make_jaxpr(h)(a));
  REQUIRE(e.plan().kernels.size() == 1);
  CHECK(e.plan().kernels[0].spec.outputs[0].in_place_of == 0);
  check_same(e.run(std::vector<Array>{a})[0], h(a), 1e-5, "in place after matmul");
}

TEST_CASE("the kernel cache serves compiled code from memory and from disk") {
  auto dir = fresh_dir("kernel_cache");
  setenv("CJAX_CACHE_DIR", dir.c_str(), 1);
  Array x = random::normal(random::key(15), {123, 45});
  auto f = [](const Array& x) { return jnp::sin(x) * jnp::cos(x * 3.0f) + 0.125f; };
  auto s0 = cpu::kernel_cache_stats();
  Executable cold(make_jaxpr(f)(x));
  CHECK_FALSE(cold.compiled().from_cache);
  auto s1 = cpu::kernel_cache_stats();
  CHECK(s1.misses == s0.misses + 1);
  CHECK(s1.disk_writes == s0.disk_writes + 1);
  CHECK(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()) == 1);
  Executable warm(make_jaxpr(f)(x));
  CHECK(warm.compiled().from_cache);
  CHECK(cpu::kernel_cache_stats().memory_hits == s1.memory_hits + 1);
  cpu::clear_memory_kernel_cache();
  Executable from_disk(make_jaxpr(f)(x));
  CHECK(from_disk.compiled().from_cache);
  CHECK(cpu::kernel_cache_stats().disk_hits == s1.disk_hits + 1);
  check_same(from_disk.run(std::vector<Array>{x})[0], f(x), 2e-6, "from disk");
  // A damaged cache file is a miss (recompiled and rewritten), never wrong code or a crash.
  for (auto& e : std::filesystem::directory_iterator(dir)) std::ofstream(e.path(), std::ios::trunc) << "garbage";
  cpu::clear_memory_kernel_cache();
  Executable repaired(make_jaxpr(f)(x));
  CHECK_FALSE(repaired.compiled().from_cache);
  check_same(repaired.run(std::vector<Array>{x})[0], f(x), 2e-6, "after a damaged file");
  setenv("CJAX_CACHE_DIR", "", 1);  // the rest of this process: memory only
  std::filesystem::remove_all(dir);
}

TEST_CASE("the disk kernel cache stays under CJAX_CACHE_MAX_MB, dropping the least recently used files") {
  auto dir = fresh_dir("kernel_cache_cap");
  setenv("CJAX_CACHE_DIR", dir.c_str(), 1);
  setenv("CJAX_CACHE_MAX_MB", "0.1", 1);  // 104857 bytes
  // 20 files of 10000 bytes, file k last used k minutes ago; a stale temporary file of a dead writer.
  auto now = std::filesystem::file_time_type::clock::now();
  for (int k = 0; k < 20; ++k) {
    auto path = dir / fmt::format("{:032x}.o", k);
    std::ofstream(path, std::ios::binary) << std::string(10000, 'x');
    std::filesystem::last_write_time(path, now - std::chrono::minutes(k));
  }
  auto tmp = dir / "dead.o.tmp123.4";
  std::ofstream(tmp) << "partial";
  std::filesystem::last_write_time(tmp, now - std::chrono::hours(2));
  cpu::trim_disk_kernel_cache();
  std::vector<std::string> left;
  uint64_t bytes = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    left.push_back(e.path().filename().string());
    bytes += e.file_size();
  }
  std::sort(left.begin(), left.end());
  CHECK(bytes <= 104857 / 5 * 4);  // down to 80% of the cap
  REQUIRE(left.size() == 8);
  for (int k = 0; k < 8; ++k) CHECK(left[size_t(k)] == fmt::format("{:032x}.o", k));  // the 8 most recent
  // Under the cap nothing goes; a compilation still writes its file.
  cpu::trim_disk_kernel_cache();
  CHECK(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()) == 8);
  cpu::clear_memory_kernel_cache();
  Array x = random::normal(random::key(17), {9, 7});
  Executable fresh(make_jaxpr([](const Array& x) { return jnp::exp(x) * 0.75f - x; })(x));
  CHECK_FALSE(fresh.compiled().from_cache);
  CHECK(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()) >= 8);
  unsetenv("CJAX_CACHE_MAX_MB");
  setenv("CJAX_CACHE_DIR", "", 1);  // the rest of this process: memory only
  std::filesystem::remove_all(dir);
}

// The LLVM IR CJAX_DUMP writes for one call of jit(f) named `name` (with that of the lazily
// compiled out-of-place variants: x stays alive, so in-place kernels run out of place).
template <class F>
std::string dumped_ir(const std::string& name, F f, const Array& x) {
  auto dir = fresh_dir("dump_" + name);
  setenv("CJAX_DUMP", dir.c_str(), 1);
  jit(f, {.name = name})(x).block_until_ready();
  unsetenv("CJAX_DUMP");
  std::string ir;
  for (auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().find(name + ".") != std::string::npos && e.path().extension() == ".ll")
      ir += read(e.path());
  std::filesystem::remove_all(dir);
  return ir;
}

TEST_CASE("kernels writing more than 16 MB of fresh output use streaming stores, with the eager values" CJAX_JIT_ONLY) {
  auto softmax = [](const Array& x) { return nn::softmax(x); };
  // 4099 columns: rows start at every alignment, so each row has a scalar head and tail around
  // the aligned vector loop.
  Array big = random::normal(random::key(70), {1031, 4099}) * 3.0f;
  std::string ir = dumped_ir("big_softmax", softmax, big);
  CHECK(ir.find("!nontemporal") != std::string::npos);
  CHECK(ir.find("fence seq_cst") != std::string::npos);
  CHECK(ir.find("@llvm.prefetch") != std::string::npos);  // its last pass fetches the next row
  CHECK(dumped_ir("small_softmax", softmax, random::normal(random::key(71), {256, 256})).find("!nontemporal") ==
        std::string::npos);
  check_same(jit(softmax)(big), softmax(big), 2e-6, "softmax f32[1031, 4099]");
  // A pass that stores a big output while it reduces uses plain stores (here: explicit vector code).
  auto exp_and_sum = [](const Array& x) {
    Array e = jnp::exp(x);
    return std::pair{e, jnp::sum(e, {-1})};
  };
  auto [e, sum] = jit(exp_and_sum)(big);
  auto [e_eager, sum_eager] = exp_and_sum(big);
  check_same(e, e_eager, 2e-6, "exp f32[1031, 4099]");
  check_same(sum, sum_eager, 1e-5, "its row sums");
  // One long row: the runtime splits the columns over threads at arbitrary offsets.
  Array flat = random::normal(random::key(72), {(int64_t(1) << 22) + 37});
  auto cheap_chain = [](const Array& x) { return nn::relu(x * 2.0f - 0.25f) + x * x; };
  std::string chain_ir = dumped_ir("big_cheap_chain", cheap_chain, flat);
  CHECK(chain_ir.find("!nontemporal") != std::string::npos);
  CHECK(chain_ir.find("@llvm.prefetch") == std::string::npos);  // one pass: nothing to fetch ahead
  check_same(jit(cheap_chain)(flat), cheap_chain(flat), 2e-6, "chain of 5 ops on f32[4194341]");
  // With inline transcendentals (tanh, logistic) the pass is bound by its arithmetic: it keeps
  // the vectorizer's loop of four vectors in flight, with plain stores.
  CHECK(dumped_ir("big_chain", chain10, flat).find("!nontemporal") == std::string::npos);
  check_same(jit(chain10)(flat), chain10(flat), 2e-6, "chain of 10 ops on f32[4194341]");
  // Outputs of 1 and 2 bytes per element (bool, bfloat16) take the same path.
  Array many = random::normal(random::key(73), {17'000'003});
  auto positive = [](const Array& x) { return x > 0.0f; };
  auto to_bf16 = [](const Array& x) { return (x * 2.0f).astype(DType::bfloat16); };
  check_same(jit(positive)(many), positive(many), 0, "x > 0 into bool[17000003]");
  Array half = random::normal(random::key(74), {9'000'001});
  check_same(jit(to_bf16)(half), to_bf16(half), 0, "x * 2 into bfloat16[9000001]");
}

TEST_CASE("big softmax rows are pipelined: row r's exp pass hosts row r-1's streaming stores" CJAX_JIT_ONLY) {
  auto softmax = [](const Array& x) { return nn::softmax(x); };
  Array x = random::normal(random::key(74), {1031, 4099}) * 3.0f;
  CHECK(dumped_ir("pipelined_softmax", softmax, x).find("col.fused") != std::string::npos);
  check_same(jit(softmax)(x), softmax(x), 2e-6, "softmax f32[1031, 4099]");
  // A row value of the last pass (log of the sum) is carried to the next row's loop; a row-level
  // output (logsumexp) is stored with its own row.
  auto log_softmax = [](const Array& x) { return nn::log_softmax(x); };
  CHECK(dumped_ir("pipelined_log_softmax", log_softmax, x).find("col.fused") != std::string::npos);
  check_same(jit(log_softmax)(x), log_softmax(x), 2e-6, "log_softmax f32[1031, 4099]");
  auto both = [](const Array& x) { return std::pair{nn::softmax(x), nn::logsumexp(x, {-1})}; };
  auto [p, lse] = jit(both)(x);
  auto [p0, lse0] = both(x);
  check_same(p, p0, 2e-6, "softmax beside logsumexp");
  check_same(lse, lse0, 2e-6, "logsumexp rows");
  // One row (no previous row to overlap) and two rows, each a 17 MB output.
  for (int64_t rows : {1, 2}) {
    Array y = random::normal(random::key(75), {rows, 4200007 / rows}) * 3.0f;
    check_same(jit(softmax)(y), softmax(y), 2e-6, fmt::format("softmax of {} long rows", rows));
  }
}

TEST_CASE("passes computing an f32 exp are explicit vector code; special inputs take exp's rare path" CJAX_JIT_ONLY) {
  // 1000 columns: 62 whole vectors of 16 columns, then a scalar tail of 8.
  const int64_t R = 6, C = 1000;
  std::vector<float> v(size_t(R * C));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 4.0f * std::sin(float(i) * 0.37f);
  for (int64_t c = 300; c < C; ++c) v[size_t(c)] = -INFINITY;  // row 0: masked from column 300 on
  v[size_t(C + 517)] = NAN;                                    // row 1: a NaN
  v[size_t(2 * C + 40)] = INFINITY;                            // row 2: +inf
  for (float e : {89.0f, -90.0f, -103.99f, 88.5f, -87.5f}) v[size_t(3 * C + 10 + int64_t(e < 0))] = e;  // row 3
  v[size_t(4 * C + 998)] = 88.0f;  // row 4: large, in the tail
  Array x = jnp::array(v, {R, C});
  auto softmax = [](const Array& x) { return nn::softmax(x); };
  std::string ir = dumped_ir("vector_softmax", softmax, x);
  CHECK(ir.find("exp.rare") != std::string::npos);
  check_same(jit(softmax)(x), softmax(x), 2e-6, "softmax f32[6, 1000]");
  Array y = jit(softmax)(x);
  CHECK(std::isnan(vals(y)[size_t(C)]));  // the NaN row is NaN
  CHECK(vals(y)[size_t(C - 1)] == 0.0);   // the masked columns are 0
  // exp with reductions of several kinds and dtypes in one vector pass.
  auto stats = [](const Array& x) {
    Array e = jnp::exp(x);
    return std::tuple{e, jnp::sum(e, {-1}), jnp::max(e, {-1}), jnp::sum((e > 1.0f).astype(DType::int32), {-1})};
  };
  auto [e, sum, max, count] = jit(stats)(x);
  auto [e0, sum0, max0, count0] = stats(x);
  check_same(e, e0, 2e-6, "exp");  // exp's special values: inf, 0, NaN, denormals
  for (float t : {89.0f, -90.0f, -103.99f, 88.5f, -87.5f, 88.0f, -INFINITY, INFINITY})
    CHECK(vals(jit([](const Array& a) { return jnp::exp(a); })(jnp::full({64}, t)))[0] == double(std::exp(t)));
  check_same(sum, sum0, 1e-5, "row sums of exp");
  check_same(max, max0, 0, "row maxima of exp");
  check_same(count, count0, 0, "row counts of exp > 1");
  // The same program on shapes whose rows are too short for a vector loop agrees too.
  Array small = jnp::array(std::vector<float>(v.begin(), v.begin() + 6 * 40), {6, 40});
  CHECK(dumped_ir("short_rows", softmax, small).find("exp.rare") == std::string::npos);
  check_same(jit(softmax)(small), softmax(small), 2e-6, "softmax f32[6, 40]");
}

TEST_CASE("independent elementwise updates of one shape are one kernel (an optimizer's m, v and parameter)") {
  auto adam_like = [](const Array& p, const Array& m, const Array& v, const Array& g) {
    Array m2 = 0.9f * m + 0.1f * g;
    Array v2 = 0.99f * v + 0.01f * g * g;
    return std::tuple{p - 0.001f * m2 / (jnp::sqrt(v2) + 1e-8f), m2, v2};
  };
  Array p = random::normal(random::key(80), {64, 32}), m = random::normal(random::key(81), {64, 32}) * 0.1f,
        v = jnp::abs(random::normal(random::key(82), {64, 32})), g = random::normal(random::key(83), {64, 32});
  FusionPlan plan = plan_of(adam_like, p, m, v, g);
  CHECK(plan.kernels.size() == 1);
  CHECK(plan.steps.size() == 1);
  auto [p1, m1, v1] = jit(adam_like)(p, m, v, g);
  auto [p0, m0, v0] = adam_like(p, m, v, g);
  check_same(p1, p0, 2e-6, "p");
  check_same(m1, m0, 2e-6, "m");
  check_same(v1, v0, 2e-6, "v");
}

TEST_CASE("an optimizer written as three tree maps is one kernel per parameter (open producer groups merge)") {
  // All m updates, then all v updates, then the parameter updates: each parameter's update reads
  // two groups that were started apart (with other shapes in between).
  auto adam_maps = [](const std::vector<Array>& p, const std::vector<Array>& m, const std::vector<Array>& v,
                      const std::vector<Array>& g) {
    std::vector<Array> m2, v2, p2;
    for (size_t i = 0; i < p.size(); ++i) m2.push_back(0.9f * m[i] + 0.1f * g[i]);
    for (size_t i = 0; i < p.size(); ++i) v2.push_back(0.99f * v[i] + 0.01f * jnp::square(g[i]));
    for (size_t i = 0; i < p.size(); ++i)
      p2.push_back(p[i] - 0.001f * (m2[i] / 0.1f) / (jnp::sqrt(v2[i] / 0.01f) + 1e-8f));
    return std::tuple{p2, m2, v2};
  };
  std::vector<Shape> shapes{{64, 32}, {48}, {32, 64}};
  std::vector<Array> p, m, v, g;
  for (size_t i = 0; i < shapes.size(); ++i) {
    int k = 90 + 4 * int(i);
    p.push_back(random::normal(random::key(k), shapes[i]));
    m.push_back(random::normal(random::key(k + 1), shapes[i]) * 0.1f);
    v.push_back(jnp::abs(random::normal(random::key(k + 2), shapes[i])));
    g.push_back(random::normal(random::key(k + 3), shapes[i]));
  }
  FusionPlan plan = plan_of(adam_maps, p, m, v, g);
  CHECK(plan.kernels.size() == 3);
  for (const FusedKernel& k : plan.kernels) CHECK(k.outputs.size() == 3);
  auto [p1, m1, v1] = jit(adam_maps)(p, m, v, g);
  auto [p0, m0, v0] = adam_maps(p, m, v, g);
  for (size_t i = 0; i < shapes.size(); ++i) {
    check_same(p1[i], p0[i], 2e-6, "p");
    check_same(m1[i], m0[i], 2e-6, "m");
    check_same(v1[i], v0[i], 2e-6, "v");
  }
}

TEST_CASE("uniform constants made while tracing are kernel constants, not arrays read per element") {
  // jnp::ones and jnp::full with a concrete fill of the result's type run eagerly while tracing
  // (their values do not depend on the arguments) and become the jaxpr's constants;
  // splat_constants turns them into literals.
  auto masked = [](const Array& x) {
    Array keep = jnp::logical_and(jnp::ones(x.shape(), DType::bool_), x > 0.0f);
    return nn::softmax(lax::select(keep, x, jnp::full(x.shape(), jnp::full({}, -1e9, DType::float32))), -1);
  };
  Array x = random::normal(random::key(100), {48, 40});
  ClosedJaxpr traced = make_jaxpr(masked)(x);
  CHECK(traced.consts.size() == 2);  // the all-true mask and the fill
  FusionPlan plan = Executable(traced).plan();
  REQUIRE(plan.kernels.size() == 1);
  CHECK(plan.kernels[0].inputs.size() == 1);  // only x
  check_same(jit(masked)(x), masked(x), 2e-6, "masked softmax");
  // A constant that is not uniform stays an input.
  Array ramp = jnp::arange(40, DType::float32);
  auto shifted = [&](const Array& x) { return x + ramp; };
  FusionPlan p2 = plan_of(shifted, x);
  REQUIRE(p2.kernels.size() == 1);
  CHECK(p2.kernels[0].inputs.size() == 2);
  check_same(jit(shifted)(x), shifted(x), 0, "x + ramp");
}

TEST_CASE("elementwise ops on broadcast row values run per row (sink_broadcasts)") {
  // The backward of x / sum(x) keeps sum^-2, computed on the broadcast sum: per element before
  // the pass, per row after it; so is an op mixing a row value with a broadcast scalar constant.
  auto f = [](const Array& x) {
    Array s = lax::broadcast_in_dim(jnp::sum(x, -1), x.shape(), {0});
    Array one = lax::broadcast_in_dim(jnp::full({}, 1.0, DType::float32), x.shape(), {});
    return std::tuple{x / s, lax::integer_pow(s, -2), one / s};
  };
  Array x = jnp::abs(random::normal(random::key(101), {24, 56})) + 0.5f;
  ClosedJaxpr traced = make_jaxpr(f)(x);
  auto sunk = sink_broadcasts(*traced);
  int row_ops = 0, full_ops = 0;
  for (const JaxprEqn& e : sunk->eqns()) {
    if (e.primitive->name != "integer_pow" && e.primitive->name != "div") continue;
    (e.outputs[0].aval().shape == Shape{24} ? row_ops : full_ops) += 1;
  }
  CHECK(row_ops == 2);   // s^-2 and 1 / s
  CHECK(full_ops == 1);  // x / s
  auto [a1, b1, c1] = jit(f)(x);
  auto [a0, b0, c0] = f(x);
  check_same(a1, a0, 2e-6, "x / s");
  check_same(b1, b0, 2e-6, "s^-2");
  check_same(c1, c0, 2e-6, "1 / s");
}

TEST_CASE("a replicated shard_map operand that is a broadcast constant is built inside the body") {
  Mesh mesh = make_mesh({4}, {"i"});
  auto body = [](const Array& xb, const Array& floor) { return jnp::maximum(xb, floor) * 2.0f; };
  auto f = [&](const Array& x) {
    Array floor = jnp::full({x.shape()[1]}, jnp::full({}, -0.5, DType::float32));  // a constant while tracing
    return shard_map(body, mesh, {P("i"), P()}, P("i"))(x, floor);
  };
  Array x = random::normal(random::key(102), {32, 24});
  Executable exe(make_jaxpr(f)(x));
  int shard_maps = 0;
  for (const JaxprEqn& e : exe.jaxpr().eqns())
    if (e.primitive->name == "shard_map") {
      ++shard_maps;
      CHECK(e.inputs.size() == 1);  // only x: the floor is a literal broadcast in the body
      CHECK(ShardMapInfo::from(e.params).body->invars().size() == 1);
    }
  CHECK(shard_maps == 1);
  check_same(jit(f)(x), f(x), 0, "max(x, -0.5) * 2");
}

TEST_CASE("row values cross shard_map boundaries at row size (unbroadcast_shard_map_boundaries)") {
  // As a forward body returning softmax's row sums broadcast (a residual) and a backward body
  // reading them: the first returns the [rows] sums, the caller broadcasts, the second takes the
  // sums and broadcasts in its body; the full-size array is never written.
  // jit would run the two as one shard_map (merge_shard_maps): kept apart here, as where they
  // cannot be merged (other meshes, a caller's equation between them).
  setenv("CJAX_MERGE_SHARD_MAPS", "0", 1);
  Mesh mesh = make_mesh({4}, {"i"});
  auto row_sums = shard_map([](const Array& xb) { return lax::broadcast_in_dim(jnp::sum(xb, -1), xb.shape(), {0}); },
                            mesh, P("i"), P("i"));
  auto normalize = shard_map([](const Array& xb, const Array& sb) { return xb / sb; }, mesh, {P("i"), P("i")}, P("i"));
  auto f = [&](const Array& x) { return normalize(x, row_sums(x)); };
  Array x = jnp::abs(random::normal(random::key(103), {32, 24})) + 0.5f;
  Executable exe(make_jaxpr(f)(x));
  std::vector<const JaxprEqn*> sms;
  for (const JaxprEqn& e : exe.jaxpr().eqns())
    if (e.primitive->name == "shard_map") sms.push_back(&e);
  REQUIRE(sms.size() == 2);
  CHECK(sms[0]->outputs[0].aval().shape == Shape{32});     // the sums, not [32, 24]
  CHECK(atom_aval(sms[1]->inputs[1]).shape == Shape{32});  // taken as they are
  CHECK(ShardMapInfo::from(sms[1]->params).body->invars()[1].aval().shape == Shape{8});
  check_same(jit(f)(x), f(x), 1e-6, "x / row sums");
  // A broadcast along a sharded dimension stays as it was.
  auto col_sums = shard_map([](const Array& xb) { return lax::broadcast_in_dim(jnp::sum(xb, 0), xb.shape(), {1}); },
                            mesh, P("i"), P("i"));
  auto g = [&](const Array& x) { return normalize(x, col_sums(x)); };
  Executable exe2(make_jaxpr(g)(x));
  for (const JaxprEqn& e : exe2.jaxpr().eqns())
    if (e.primitive->name == "shard_map") CHECK(e.outputs[0].aval().shape == Shape{32, 24});
  check_same(jit(g)(x), g(x), 1e-6, "x / block column sums");
  unsetenv("CJAX_MERGE_SHARD_MAPS");
}

TEST_CASE("pvary fuses as the value itself: constants cast to varying are kernel constants") {
  Mesh mesh = make_mesh({4}, {"i"});
  auto body = [](const Array& m, const Array& g) {
    return lax::pvary(Array(0.9f), {"i"}) * m + lax::pvary(Array(0.1f), {"i"}) * g;
  };
  auto f = shard_map(body, mesh, {P("i"), P("i")}, P("i"));
  Array m = jnp::arange(8).astype(DType::float32), g = jnp::ones({8});
  ClosedJaxpr traced = make_jaxpr(f)(m, g);
  std::shared_ptr<const Jaxpr> inner;
  for (const JaxprEqn& e : traced.jaxpr->eqns())
    if (e.primitive->name == "shard_map") inner = ShardMapInfo::from(e.params).body;
  REQUIRE(inner);
  CHECK(inner->pretty_print().find("pvary") != std::string::npos);
  AxisEnvScope env(ShardMapInfo::from(traced.jaxpr->eqns().back().params).axis_frame());
  FusionPlan plan = Executable(ClosedJaxpr{inner, {}}).plan();
  CHECK(plan.kernels.size() == 1);
  CHECK(plan.steps.size() == 1);  // no library pvary step
  std::vector<double> want = {0.1, 1, 1.9, 2.8, 3.7, 4.6, 5.5, 6.4}, got = vals(jit(f)(m, g));
  for (size_t i = 0; i < want.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-6));
}

TEST_CASE("CJAX_DUMP writes the jaxpr, the fusion plan and vectorized LLVM IR" CJAX_JIT_ONLY) {
  auto dir = fresh_dir("dump");
  setenv("CJAX_DUMP", dir.c_str(), 1);
  Array x = random::normal(random::key(16), {256, 256});
  auto f = jit([](const Array& x) { return nn::softmax(jnp::tanh(x)); }, {.name = "dumped"});
  f(x);
  unsetenv("CJAX_DUMP");
  std::string jaxpr, plan, ir;
  for (auto& e : std::filesystem::directory_iterator(dir)) {
    std::string name = e.path().filename().string();
    if (name.find("dumped.jaxpr.txt") != std::string::npos) jaxpr = read(e.path());
    if (name.find("dumped.fusion.txt") != std::string::npos) plan = read(e.path());
    if (name.find("dumped.ll") != std::string::npos) ir = read(e.path());
  }
  CHECK(jaxpr.find("reduce_max") != std::string::npos);
  CHECK(plan.find("kernel cjax_k0 [tanh reduce_max") != std::string::npos);
  CHECK(ir.find("define void @cjax_k0(") != std::string::npos);
  CHECK(ir.find("<16 x float>") != std::string::npos);       // the row loops were vectorized for AVX-512
  CHECK(ir.find("call float @tanhf") == std::string::npos);  // no libm call in the kernel
  // Softmax divides by its row sum once per row and multiplies each element by the reciprocal.
  std::string optimized = ir.substr(ir.find("---- after optimization ----"));
  CHECK(optimized.find("fdiv contract float 1.000000e+00") != std::string::npos);
  std::istringstream lines(optimized);
  for (std::string line; std::getline(lines, line);)
    CHECK_MESSAGE(!(line.find("fdiv") != std::string::npos && line.find("broadcast.splat") != std::string::npos), line);
  std::filesystem::remove_all(dir);
}

TEST_CASE("an MLP training step gives the same values compiled, unfused and eagerly") {
  std::vector<std::pair<Array, Array>> params;
  Shape sizes = {20, 32, 32, 4};
  for (size_t i = 0; i + 1 < sizes.size(); ++i)
    params.emplace_back(random::normal(random::key(int(20 + i)), {sizes[i], sizes[i + 1]}) * 0.3f,
                        random::normal(random::key(int(40 + i)), {sizes[i + 1]}) * 0.1f);
  Array x = random::normal(random::key(60), {8, 20}), y = random::normal(random::key(61), {8, 4});
  auto loss = [](const std::vector<std::pair<Array, Array>>& ps, const Array& x, const Array& y) {
    Array h = x;
    for (size_t i = 0; i < ps.size(); ++i) {
      h = jnp::matmul(h, ps[i].first) + ps[i].second;
      if (i + 1 < ps.size()) h = nn::gelu(h);
    }
    return jnp::mean(jnp::square(h - y));
  };
  auto step = [&](const std::vector<std::pair<Array, Array>>& ps, const Array& x, const Array& y) {
    auto [l, g] = value_and_grad(loss)(ps, x, y);
    return std::pair{l, tree::map([](const Array& w, const Array& d) { return w - 0.1f * d; }, ps, g)};
  };
  auto [l0, p0] = step(params, x, y);
  auto [l1, p1] = jit(step)(params, x, y);
  set_fusion_enabled(false);
  auto [l2, p2] = jit(step)(params, x, y);
  set_fusion_enabled(true);
  check_same(l1, l0, 1e-6, "loss");
  check_same(l2, l0, 1e-6, "loss unfused");
  for (size_t i = 0; i < params.size(); ++i) {
    check_same(p1[i].first, p0[i].first, 1e-5, "w");
    check_same(p1[i].second, p0[i].second, 1e-5, "b");
  }
}

TEST_CASE(
    "async dispatch: a 1000-step loop reading metrics one step late blocks only on the previous step" CJAX_JIT_ONLY) {
  // Large enough not to be a cheap program (those run on the caller's thread, Executable::cheap).
  Array x = random::normal(random::key(70), {256, 16});
  Array y = jnp::matmul(x, random::normal(random::key(71), {16, 1}));  // learnable
  auto loss = [](const Array& w, const Array& x, const Array& y) {
    return jnp::mean(jnp::square(jnp::matmul(x, w) - y));
  };
  auto train = [&](bool async) {
    config::set_async_dispatch(async);
    auto step = jit(
        [&](const Array& w, const Array& x, const Array& y) {
          auto [l, g] = value_and_grad(loss)(w, x, y);
          return std::pair{w - 0.05f * g, l};
        },
        {.name = "train_step", .donate_argnums = {0}});
    Array w = jnp::zeros({16, 1});
    std::vector<float> losses;
    Array previous;
    reset_async_dispatch_stats();
    int64_t dispatched0 = async_dispatch_stats().dispatched;
    for (int i = 0; i < 1000; ++i) {
      auto [w2, l] = step(w, x, y);
      w = w2;
      if (previous.defined()) losses.push_back(previous.item<float>());  // one step late
      previous = l;
    }
    losses.push_back(previous.item<float>());
    AsyncDispatchStats s = async_dispatch_stats();
    if (async) {
      CHECK(s.dispatched - dispatched0 == 1000);
      CHECK(s.max_wait_lag <= 1);  // every blocking wait was for the newest or the previous call
    }
    config::set_async_dispatch(true);
    return std::pair{losses, w.to_vector<float>()};
  };
  auto [async_losses, async_w] = train(true);
  auto [sync_losses, sync_w] = train(false);
  CHECK(async_losses == sync_losses);  // same programs, same order: bit-identical
  CHECK(async_w == sync_w);
  CHECK(async_losses.back() < 0.8f * async_losses.front());
}

TEST_CASE("async dispatch: donating the previous step's outputs never blocks the host" CJAX_JIT_ONLY) {
  Array x = random::normal(random::key(73), {512, 64});
  auto step = jit([](const Array& w, const Array& x) { return w + 0.001f * jnp::sum(jnp::tanh(jnp::matmul(x, w)), 0); },
                  {.name = "donating_step", .donate_argnums = {0}});
  auto run = [&](int steps) {
    Array w = jnp::ones({64, 64});
    w.block_until_ready();
    reset_async_dispatch_stats();
    for (int i = 0; i < steps; ++i) {
      Array previous = w;
      w = step(w, x);
      // The donated array is deleted for the caller at once, though its buffers may still be
      // waiting for the previous step, and the call takes them only when it starts.
      CHECK_THROWS_AS(previous.to_vector<float>(), ValueError);
      CHECK_THROWS_AS(step(previous, x), ValueError);
    }
    CHECK(async_dispatch_stats().blocking_waits == 0);  // no call waited for the one before it
    return w.to_vector<float>();
  };
  std::vector<float> async_w = run(6);
  config::set_async_dispatch(false);
  std::vector<float> sync_w = run(6);
  config::set_async_dispatch(true);
  CHECK(async_w == sync_w);
}

TEST_CASE("async dispatch: calls dispatched before a donation still read the donated value" CJAX_JIT_ONLY) {
  Mesh mesh = make_mesh({4}, {"i"});
  Array xh = random::normal(random::key(74), {1024, 256});
  Array x = device_put(xh, NamedSharding(mesh, P("i")));
  auto make = jit([](const Array& x) { return jnp::tanh(x) * 2.0f; }, {.name = "make"});
  // Reads its sharded argument through eager per-shard instructions of its program.
  auto block_sums = shard_map([](const Array& b) { return jnp::sum(b, 0); }, mesh, P("i"), P("i"));
  auto read = jit([&](const Array& a) { return block_sums(a * 1.0f) - 1.0f; }, {.name = "read"});
  auto consume = jit([](const Array& a) { return a + 1.0f; }, {.name = "consume", .donate_argnums = {0}});
  Array want = make(xh);
  Array want_sums = jnp::sum(jnp::reshape(want, {4, 256, 256}), 1);
  // A slow call ahead of them on the queue keeps `read` queued until `consume` is dispatched.
  auto slow = jit([](const Array& m) {
    Array p = m;
    for (int i = 0; i < 8; ++i) p = jnp::tanh(jnp::matmul(p, m));
    return p;
  });
  Array s = slow(random::normal(random::key(75), {768, 768}));
  Array a = make(x);
  Array r = read(a);     // queued before the donation
  Array c = consume(a);  // takes a's buffers after `read` has run
  CHECK_THROWS_AS(a.to_vector<float>(), ValueError);
  auto local = [](const Array& v) { return device_put(v, SingleDeviceSharding(default_device())); };
  CHECK(jnp::allclose(jnp::reshape(local(r), {4, 256}), want_sums - 1.0f, 1e-5, 1e-4));
  CHECK(jnp::allclose(local(c), want + 1.0f, 1e-6, 1e-6));
  CHECK(s.is_ready());
}

TEST_CASE("async dispatch: outputs are futures; eager ops and reads wait for them") {
  Array x = random::normal(random::key(72), {2048, 2048});
  auto f = jit([](const Array& x) { return nn::softmax(jnp::tanh(x) * 3.0f); });
  Array a = f(x);
  Array b = a * 2.0f;  // an eager op on a pending value waits for it
  b.block_until_ready();
  CHECK(a.is_ready());
  CHECK(jnp::sum(b).item<float>() == doctest::Approx(2.0 * 2048).epsilon(1e-4));
}

TEST_CASE("the profiler records every kernel of a jit program and exports Chrome trace JSON" CJAX_JIT_ONLY) {
  Array x = random::normal(random::key(80), {64, 32}), w = random::normal(random::key(81), {32, 16});
  auto f = jit([](const Array& x, const Array& w) { return nn::softmax(jnp::tanh(jnp::matmul(x, w))); },
               {.name = "profiled"});
  f(x, w).block_until_ready();  // compiled before profiling
  profiler::start();
  for (int i = 0; i < 3; ++i) f(x, w).block_until_ready();
  profiler::stop();
  std::vector<profiler::Event> ev = profiler::events();
  int dots = 0, fused = 0;
  for (const auto& e : ev) {
    CHECK(e.jit == "profiled");
    CHECK(e.duration_us >= 0);
    if (e.name == "dot_general") {
      ++dots;
      CHECK(e.shapes == "f32[64,32] f32[32,16] -> f32[64,16]");
    }
    if (e.name.rfind("fused[tanh reduce_max", 0) == 0) {
      ++fused;
      CHECK(e.shapes == "f32[64,16] -> f32[64,16]");
    }
  }
  CHECK(dots == 3);
  CHECK(fused == 3);
  auto dir = fresh_dir("profile");
  auto path = (dir / "trace.json").string();
  profiler::export_chrome_trace(path);
  std::string json = read(path);
  CHECK(json.find("\"traceEvents\"") != std::string::npos);
  CHECK(json.find("\"ph\":\"X\"") != std::string::npos);
  CHECK(json.find("\"name\":\"dot_general\"") != std::string::npos);
  CHECK(json.find("\"shapes\":\"f32[64,32] f32[32,16] -> f32[64,16]\"") != std::string::npos);
  CHECK_THROWS_AS(profiler::export_chrome_trace((dir / "no_such_dir" / "t.json").string()), IoError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the gradient of pieces sliced from one tensor is their concatenation, not a sum of zero pads") {
  // q, k and v split from one projection, as the transformer sample does: the transposes of the
  // slices are zero pads that tile axis 0, summed.
  auto piece = [](const Array& x, int64_t i) { return lax::slice(x, {i, 0, 0}, {i + 1, 5, 4}); };
  auto loss = [&](const Array& x) {
    return jnp::sum(jnp::tanh(piece(x, 0)) * piece(x, 1) + piece(x, 2) * piece(x, 2));
  };
  auto gapped = [&](const Array& x) { return jnp::sum(jnp::tanh(piece(x, 0)) * piece(x, 2)); };
  Array x = random::normal(random::key(92), {3, 5, 4});
  auto count = [](const Jaxpr& j, const char* name) {
    return std::count_if(j.eqns().begin(), j.eqns().end(),
                         [&](const JaxprEqn& e) { return e.primitive->name == name; });
  };
  auto tiled = optimize(*make_jaxpr(grad(loss))(x));
  CHECK(count(*tiled, "pad") == 0);
  CHECK(count(*tiled, "concatenate") == 1);
  auto same = [](const Array& got, const Array& want) {
    std::vector<float> g = got.to_vector<float>(), w = want.to_vector<float>();
    REQUIRE(g.size() == w.size());
    for (size_t i = 0; i < g.size(); ++i) CHECK(g[i] == doctest::Approx(w[i]).epsilon(1e-6));
  };
  same(jit(grad(loss))(x), grad(loss)(x));
  // Pieces that leave a gap (row 1 unused) stay pads.
  auto with_gap = optimize(*make_jaxpr(grad(gapped))(x));
  CHECK(count(*with_gap, "pad") == 2);
  CHECK(count(*with_gap, "concatenate") == 0);
  same(jit(grad(gapped))(x), grad(gapped)(x));

  // In a shard_map body the pads' zero is pvary(0.0): the backward body concatenates too.
  Mesh mesh = make_mesh({8}, {"d"});
  auto sharded = [&](const Array& xs) {
    return shard_map([&](const Array& b) { return lax::psum(loss(b), "d"); }, mesh, P(None, "d"), P())(xs);
  };
  Array xs = random::normal(random::key(93), {3, 40, 4});
  int64_t pads = 0, concatenates = 0;
  auto program = make_jaxpr(grad(sharded))(xs);
  for (const JaxprEqn& e : program->eqns()) {
    if (e.primitive->name != "shard_map") continue;
    auto body = optimize(*e.params.object<JaxprParam>("jaxpr")->jaxpr);
    pads += count(*body, "pad");
    concatenates += count(*body, "concatenate");
  }
  CHECK(pads == 0);
  CHECK(concatenates == 1);
  same(jit(grad(sharded))(xs), grad(sharded)(xs));
}

TEST_CASE("an SGD step on a matmul weight is one in-place BLAS call (dot_general_accumulate)" CJAX_JIT_ONLY) {
  auto loss = [](const Array& w, const Array& x) { return jnp::sum(jnp::tanh(jnp::matmul(x, w))); };
  auto sgd = [&](const Array& w, const Array& x) { return w - 0.1f * grad(loss)(w, x); };
  Array x = random::normal(random::key(90), {32, 48});
  auto fresh_w = [] { return random::normal(random::key(91), {48, 24}); };
  std::vector<float> want = sgd(fresh_w(), x).to_vector<float>();  // eager, op by op

  auto opt = optimize(*make_jaxpr(sgd)(fresh_w(), x));
  int accumulate = 0, dots = 0;
  for (const JaxprEqn& e : opt->eqns()) {
    accumulate += e.primitive->name == "dot_general_accumulate";
    dots += e.primitive->name == "dot_general";
  }
  CHECK(accumulate == 1);  // w + (-0.1) * x^T dy
  CHECK(dots == 1);        // the forward matmul

  // Donated: BLAS adds into w's own buffer.
  auto step = jit(sgd, {.name = "sgd", .donate_argnums = {0}});
  Array w = fresh_w();
  w.block_until_ready();
  const void* before = raw_ptr(w);
  Array w2 = step(w, x);
  CHECK(raw_ptr(w2) == before);
  std::vector<float> got = w2.to_vector<float>();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == doctest::Approx(want[i]).epsilon(1e-5));

  // Not donated: the caller's w is left as it was; the update goes to a new buffer.
  auto keep = jit(sgd, {.name = "sgd_keep"});
  Array w3 = fresh_w();
  std::vector<float> w3_before = w3.to_vector<float>();
  Array w4 = keep(w3, x);
  CHECK(raw_ptr(w4) != raw_ptr(w3));
  CHECK(w3.to_vector<float>() == w3_before);
  CHECK(w4.to_vector<float>() == got);
}

TEST_CASE("cotangent accumulation (add_any) fuses with its neighbours" CJAX_JIT_ONLY) {
  // x feeds two branches: grad sums their cotangents with add_any.
  auto f = [](const Array& x) { return jnp::sum(jnp::sin(x) * jnp::cos(x) + jnp::tanh(x)); };
  Array x = random::normal(random::key(95), {64, 32});
  auto traced = make_jaxpr(grad(f))(x);
  int add_any = 0;
  for (const JaxprEqn& e : traced->eqns()) add_any += e.primitive->name == "add_any";
  REQUIRE(add_any > 0);
  Executable exe(traced, "grad_f");
  for (const PlanStep& s : exe.plan().steps)
    if (s.kernel < 0) CHECK(s.eqn.primitive->name != "add_any");
  check_same(exe.run(std::vector<Array>{x})[0], grad(f)(x), 1e-6, "fused add_any");
}

TEST_CASE("dot_general_accumulate has the jvp, transpose and batching rules of its expansion") {
  // The optimized jaxpr of an SGD step holds dot_general_accumulate; transforming that jaxpr
  // must agree with transforming the original.
  auto sgd = [](const Array& w, const Array& x) {
    return w - 0.1f * grad([](const Array& v, const Array& y) { return jnp::sum(jnp::tanh(jnp::matmul(y, v))); })(w, x);
  };
  Array w = random::normal(random::key(96), {6, 4}), x = random::normal(random::key(97), {5, 6});
  auto cj = make_jaxpr(sgd)(w, x);
  auto opt = optimize(*cj);
  int accumulate = 0;
  for (const JaxprEqn& e : opt->eqns()) accumulate += e.primitive->name == "dot_general_accumulate";
  REQUIRE(accumulate == 1);
  auto run = [&](const std::shared_ptr<const Jaxpr>& j) {
    return [j, consts = cj.consts](const Array& a, const Array& b) {
      return eval_jaxpr(*j, consts, std::vector<Array>{a, b})[0];
    };
  };
  auto orig = run(cj.jaxpr), fused = run(opt);
  auto loss = [](auto f) { return [f](const Array& a, const Array& b) { return jnp::sum(jnp::sin(f(a, b))); }; };
  // grad (jvp + transpose) with respect to both arguments
  auto [gw_fused, gx_fused] = grad(loss(fused), argnums<0, 1>)(w, x);
  auto [gw_orig, gx_orig] = grad(loss(orig), argnums<0, 1>)(w, x);
  check_same(gw_fused, gw_orig, 1e-5, "grad wrt the accumulator's source");
  check_same(gx_fused, gx_orig, 1e-5, "grad wrt a dot_general operand");
  // vmap over a batch of weights, and over a batch of inputs only
  Array ws = random::normal(random::key(98), {3, 6, 4}), xs = random::normal(random::key(99), {3, 5, 6});
  check_same(vmap(fused)(ws, xs), vmap(orig)(ws, xs), 1e-5, "vmap of both");
  check_same(vmap(fused, {None, 0})(w, xs), vmap(orig, {None, 0})(w, xs), 1e-5, "vmap of x only");
}

namespace {
int64_t resident_kb() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * int64_t(sysconf(_SC_PAGESIZE)) / 1024;
}
}  // namespace

TEST_CASE("a destroyed jit object frees what it linked: 400 jit objects built and dropped" CJAX_JIT_ONLY) {
  Array x = jnp::arange(4096).astype(f32);
  auto build_and_drop = [&](int n) {
    for (int i = 0; i < n; ++i) {
      auto f = jit([](const Array& a) { return jnp::exp(a * 0.001f) + 1.f; }, {.name = "dropped"});
      f(x).block_until_ready();
    }
  };
  build_and_drop(50);  // warm: kernels compiled and cached, allocator pools filled
  size_t libraries = cpu::jit_library_count();
  int64_t rss = resident_kb();
  build_and_drop(400);
  // Each object linked its kernels into a JIT library; a dropped object's library is reused.
  CHECK(cpu::jit_library_count() <= libraries + 2);
  // Each object used to keep ~70 KB after it was destroyed (400 objects: ~28 MB). (ASan keeps
  // freed memory in quarantine, so RSS says nothing there.)
  MESSAGE("RSS growth over 400 jit objects: ", resident_kb() - rss, " KB");
#ifndef __SANITIZE_ADDRESS__
  CHECK(resident_kb() - rss < 8 * 1024);
#endif
}

TEST_CASE("a program's kernels compile as several LLVM modules side by side, each cached on its own") {
  auto dir = fresh_dir("kernel_modules");
  setenv("CJAX_CACHE_DIR", dir.c_str(), 1);
  // Ten operands of ten shapes: ten distinct kernels, split 4 + 3 + 3 into three modules.
  std::vector<Array> xs;
  for (int i = 0; i < 10; ++i) xs.push_back(random::normal(random::key(uint64_t(90 + i)), {i + 1, 7}));
  auto f = [](const std::vector<Array>& xs) {
    std::vector<Array> out;
    for (size_t i = 0; i < xs.size(); ++i) out.push_back(jnp::sin(xs[i]) * float(i + 1) + jnp::exp(xs[i] * 0.5f));
    return out;
  };
  auto before = cpu::kernel_cache_stats();
  Executable cold(make_jaxpr(f)(xs));
  REQUIRE(cold.plan().kernels.size() == 10);
  CHECK(cpu::kernel_cache_stats().disk_writes == before.disk_writes + 3);
  CHECK(std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator()) == 3);
  std::vector<Array> want = f(xs), got = cold.run(xs);
  for (size_t i = 0; i < want.size(); ++i) check_same(got[i], want[i], 2e-6, "module kernel");
  // From disk: every module a hit, the same values.
  cpu::clear_memory_kernel_cache();
  Executable warm(make_jaxpr(f)(xs));
  CHECK(warm.compiled().from_cache);
  std::vector<Array> again = warm.run(xs);
  for (size_t i = 0; i < want.size(); ++i) CHECK(again[i].to_vector<float>() == got[i].to_vector<float>());
  setenv("CJAX_CACHE_DIR", "", 1);  // the rest of this process: memory only
  std::filesystem::remove_all(dir);
}
