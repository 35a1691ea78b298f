// The measured choice between LIBXSMM and OpenBLAS (gemm_choice.h).
#include "backends/cpu/kernels/gemm_choice.h"

#include <absl/container/flat_hash_map.h>
#include <absl/container/flat_hash_set.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <utility>
#include <vector>

#include "cjax/errors.h"
#include "core/array/util.h"
#include "core/backend/kernel_cache.h"
#include "core/backend/parallel.h"

namespace cjax {
namespace {

// OpenBLAS must be this much faster to be chosen (a tie keeps LIBXSMM), in the median time per
// run of each engine, measured twice one after the other (the faster of the two medians each).
constexpr double kBlasMargin = 0.95;
// A decision closer than kDecisive is measured again until kSettledAfter measurements are
// recorded, the record keeping the least of the measurements' medians per engine: a slow phase
// of the host slows both engines of one measurement alike, and the least drops that measurement.
// One measurement can fall in such a phase (a neighbour, the first step's compile and prefetch
// threads): on a Zen 4 VM one chose OpenBLAS for a class where LIBXSMM was 10-15% faster in every
// later run.
constexpr int kSettledAfter = 3;
// Where a record is not settled, a process measures the class again at this call of it: in the
// steady state, after the first steps' compiles and prefetches, which also ran during the first
// measurement. Its own library stays as it was (one library per class per run); the record it
// leaves decides for the next processes.
constexpr int64_t kRemeasureAtCall = 64;
// The engines take turns until together they have run this long, at least three times each.
constexpr double kMeasureSeconds = 25e-3;
constexpr int kMaxRuns = 50;
constexpr double kDecisive = 1.25;

uint8_t log2_ceil(int64_t v) { return uint8_t(v <= 1 ? 0 : std::bit_width(uint64_t(v - 1))); }

std::string cpu_model() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

// A class's library in this process, and whether the class is to be measured again when its
// kRemeasureAtCall-th call comes (its record on disk is not settled yet).
struct Decision {
  GemmEngine engine;
  bool remeasure = false;
  int64_t calls = 1;  // counting the call that decided
};
struct Choices {
  std::mutex mu;
  absl::flat_hash_map<uint64_t, Decision> by_class;
  absl::flat_hash_set<uint64_t> remeasured_here;  // kept by clear_gemm_choices: at most once per process
  std::atomic<int64_t> measured{0}, from_disk{0};
};
Choices& choices() {
  static Choices c;
  return c;
}

std::atomic<int> g_override{-1};  // -1: none; else a GemmEngine

// What the disk cache keeps for a class: the least over its measurements of each engine's median
// seconds per run, and how many measurements there were. Written as "<xsmm> <blas> <measurements>".
struct Measurement {
  double xsmm = 0, blas = 0;
  int measurements = 0;
  GemmEngine engine() const { return blas < kBlasMargin * xsmm ? GemmEngine::blas : GemmEngine::xsmm; }
  bool settled() const {
    return measurements >= kSettledAfter || std::max(xsmm, blas) >= kDecisive * std::min(xsmm, blas);
  }
};
// The record stored under `key`, if there is one and it reads back whole.
std::optional<Measurement> stored_measurement(const std::string& key) {
  std::optional<std::string> bytes = cached_kernel(key);
  Measurement m;
  if (!bytes || std::sscanf(bytes->c_str(), "%lf %lf %d", &m.xsmm, &m.blas, &m.measurements) != 3 || !(m.xsmm > 0) ||
      !(m.blas > 0) || m.measurements < 1)
    return std::nullopt;
  return m;
}

// The median seconds per run of each engine (xsmm, blas), the two taking turns after a warm-up
// run each (which JIT-compiles LIBXSMM's kernels and wakes OpenBLAS's threads): interference
// from outside, such as a neighbour's load, then slows both alike. The median, not the least: an
// engine whose runs vary costs its typical run in a training step, and the least of its runs
// flattered it (Zen 4, AVX-512: the least chose OpenBLAS for the weight gradients' TN classes,
// where bench_gemm's medians had LIBXSMM 15-20% faster; with medians LIBXSMM is chosen, and those
// rows are 0.98-1.01x the better library).
std::pair<double, double> seconds_per_run(absl::FunctionRef<void(GemmEngine)> run_once) {
  run_once(GemmEngine::xsmm);
  run_once(GemmEngine::blas);
  std::vector<double> runs[2];
  double total = 0;
  auto median = [](std::vector<double> v) {
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
    return v[v.size() / 2];
  };
  // After three runs each, a gap of kDecisive decides: more runs only matter near a tie (a fresh
  // process measures every class it meets, 8 for an MLP train step).
  auto decided = [&] {
    double x = median(runs[0]), b = median(runs[1]);
    return std::max(x, b) >= kDecisive * std::min(x, b);
  };
  for (int r = 0; r < kMaxRuns && (r < 3 || (total < kMeasureSeconds && !decided())); ++r)
    for (GemmEngine e : {GemmEngine::xsmm, GemmEngine::blas}) {
      auto start = std::chrono::steady_clock::now();
      run_once(e);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      runs[int(e)].push_back(s);
      total += s;
    }
  return {median(runs[0]), median(runs[1])};
}

// Measures class c (its record's key: dkey) and merges the result into the record on disk: the
// least of each library's median time per run over every measurement so far.
Measurement measure_and_record(const GemmClass& c, const std::string& dkey,
                               absl::FunctionRef<void(GemmEngine)> run_once) {
  auto [xsmm, blas] = seconds_per_run(run_once);
  if (blas < kBlasMargin * xsmm) {  // more runs of both before OpenBLAS is chosen
    auto [xsmm2, blas2] = seconds_per_run(run_once);
    xsmm = std::min(xsmm, xsmm2);
    blas = std::min(blas, blas2);
  }
  Measurement m{xsmm, blas, 1};
  if (std::optional<Measurement> stored = stored_measurement(dkey))
    m = {std::min(xsmm, stored->xsmm), std::min(blas, stored->blas), stored->measurements + 1};
  if (env_flag("CJAX_LOG_GEMM"))
    std::fprintf(stderr, "cjax gemm: %s: LIBXSMM %.1f us, OpenBLAS %.1f us (least over %d measurement%s): %s\n",
                 c.str().c_str(), m.xsmm * 1e6, m.blas * 1e6, m.measurements, m.measurements == 1 ? "" : "s",
                 m.engine() == GemmEngine::xsmm ? "LIBXSMM" : "OpenBLAS");
  store_kernel(dkey, fmt::format("{:.9g} {:.9g} {}", m.xsmm, m.blas, m.measurements));
  choices().measured.fetch_add(1);
  return m;
}

}  // namespace

// Version 8: LIBXSMM's path packs panels of a B whose rows are 4 KiB apart (gemm_xsmm.cpp), so
// records of such classes measured before describe other code.
std::string gemm_choice_cache_key(const GemmClass& c) {
  static const std::string host = cpu_model();
  return fmt::format("cjax-gemm-choice-8|{}|isa={}|threads={}|{}", host,
                     requested_cpu_isa() == CpuIsa::Avx2 ? "avx2" : "native", num_threads(), c.str());
}

uint64_t GemmClass::packed() const {
  return uint64_t(dtype) | uint64_t(a_trans) << 8 | uint64_t(b_trans) << 9 | uint64_t(log_m) << 16 |
         uint64_t(log_n) << 24 | uint64_t(log_k) << 32 | uint64_t(log_batch) << 40;
}

std::string GemmClass::str() const {
  return fmt::format("{} {}{} m<={} n<={} k<={} batch<={}", dtype_short_name(dtype), a_trans ? 'T' : 'N',
                     b_trans ? 'T' : 'N', int64_t(1) << log_m, int64_t(1) << log_n, int64_t(1) << log_k,
                     int64_t(1) << log_batch);
}

GemmClass gemm_class(DType dtype, int64_t batch, int64_t M, int64_t N, int64_t K, bool a_trans, bool b_trans) {
  return GemmClass{dtype,
                   a_trans,
                   b_trans,
                   log2_ceil(M),
                   log2_ceil(N),
                   log2_ceil(K),
                   log2_ceil(std::min<int64_t>(batch, int64_t(1) << 20))};
}

std::optional<GemmEngine> fixed_gemm_engine() {
  if (int o = g_override.load(std::memory_order_relaxed); o >= 0) return GemmEngine(o);
  static const std::optional<GemmEngine> from_env = []() -> std::optional<GemmEngine> {
    const char* v = std::getenv("CJAX_GEMM");
    std::string_view s = v ? v : "";
    if (s.empty() || s == "auto") return std::nullopt;
    if (s == "xsmm") return GemmEngine::xsmm;
    if (s == "blas") return GemmEngine::blas;
    throw BackendError(
        fmt::format("CJAX_GEMM='{}' names no GEMM library; use 'auto' (measured per host), 'xsmm' or 'blas'", s));
  }();
  return from_env;
}

void set_gemm_engine_override(std::optional<GemmEngine> engine) { g_override = engine ? int(*engine) : -1; }

GemmEngine choose_gemm_engine(const GemmClass& c, absl::FunctionRef<void(GemmEngine)> run_once) {
  if (std::optional<GemmEngine> fixed = fixed_gemm_engine()) return *fixed;
  Choices& ch = choices();
  uint64_t key = c.packed();
  {
    std::unique_lock lock(ch.mu);
    if (auto it = ch.by_class.find(key); it != ch.by_class.end()) {
      Decision& d = it->second;
      if (!d.remeasure || ++d.calls < kRemeasureAtCall) return d.engine;
      d.remeasure = false;
      ch.remeasured_here.insert(key);
      GemmEngine e = d.engine;
      lock.unlock();  // not held while measuring: the runs use the thread pool, whose jobs may wait on it
      measure_and_record(c, gemm_choice_cache_key(c), run_once);
      return e;
    }
  }
  std::string dkey = gemm_choice_cache_key(c);
  std::optional<Measurement> stored = stored_measurement(dkey);
  Decision d;
  if (stored) {
    d.engine = stored->engine();
    std::lock_guard lock(ch.mu);
    d.remeasure = !stored->settled() && !ch.remeasured_here.contains(key);
    ch.from_disk.fetch_add(1);
  } else {
    Measurement m = measure_and_record(c, dkey, run_once);
    d.engine = m.engine();
    d.remeasure = !m.settled();
  }
  std::lock_guard lock(ch.mu);
  return ch.by_class.emplace(key, d).first->second.engine;  // a concurrent first call may have decided already
}

GemmChoiceStats gemm_choice_stats() {
  Choices& ch = choices();
  return {ch.measured.load(), ch.from_disk.load()};
}

void clear_gemm_choices() {
  Choices& ch = choices();
  std::lock_guard lock(ch.mu);
  ch.by_class.clear();
}

}  // namespace cjax
