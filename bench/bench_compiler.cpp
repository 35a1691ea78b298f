// CPU compiler benchmarks (issue 4): fused elementwise chain vs a hand-fused loop, op by op and
// PyTorch; row softmax vs the machine's memory bandwidth; an MLP train step vs a hand-written
// OpenBLAS step and PyTorch; compile time cold and from the disk cache; peak memory and RSS
// growth of the train step. Every ratio is measured in this run; nothing is asserted (a failed
// check prints CHECK FAILED and the run goes on).
//
//   bench_compiler                  the benchmarks (~1 minute on 2 cores)
//   bench_compiler --compile-child  internal: one cold first call of the train step in a fresh
//                                   process (the parent sets CJAX_CACHE_DIR), printed as key=value
#include <cblas.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/llvm_jit.h"
#include "bench/harness.h"
#include "cjax/cjax.h"
#include "core/array/array_impl.h"
#include "core/backend/parallel.h"
#include "jit/executable.h"

using namespace cjax;
using namespace cjax::bench;
namespace jnp = cjax::numpy;

namespace cjax::bench {
// bench/compiler_peers.cpp (-ffast-math -fopenmp-simd: libmvec tanhf/expf).
void chain_loop(const float* __restrict x, float* __restrict y, int64_t b, int64_t e);
void copy_loop(const float* __restrict src, float* __restrict dst, int64_t b, int64_t e);
// bench/chain_same_math.cpp: the chain with cjax's own tanh/logistic approximations (the peer).
void chain_loop_same_math(const float* __restrict x, float* __restrict y, int64_t b, int64_t e);
}  // namespace cjax::bench

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}
std::string fmt_ms(double s) { return fmt("%.2f ms", s * 1e3); }
std::string fmt_us(double s) { return fmt("%.1f us", s * 1e6); }
std::string fmt_gbs(double g) { return fmt("%.1f GB/s", g); }

void check(bool ok, const std::string& what) {
  if (!ok) std::printf("CHECK FAILED: %s\n", what.c_str());
}
std::string verdict(bool met) { return met ? "met" : "NOT met"; }

// ---- PyTorch peer ---------------------------------------------------------------------------

std::string python_with_torch() {
  for (const char* py : {"python3", "/usr/bin/python3"})
    if (std::system((std::string(py) + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0) return py;
  return {};
}
std::string run_command(const std::string& cmd) {
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return {};
  std::string out;
  char buf[512];
  while (fgets(buf, sizeof buf, p)) out += buf;
  if (pclose(p) != 0) return {};
  return out;
}
double peer_value(const std::string& out, const std::string& key) {
  auto pos = out.find(key + "=");
  if (pos == std::string::npos || (pos > 0 && out[pos - 1] != '\n')) return -1;
  return std::atof(out.c_str() + pos + key.size() + 1);
}

// ---- 1. the 10-op chain -------------------------------------------------------------------------

Array chain(const Array& x) {
  Array a = x * 1.5f;        // mul
  Array b = a + 0.5f;        // add
  Array c = jnp::tanh(b);    // tanh
  Array d = c * x;           // mul
  Array e = d - 0.25f;       // sub
  Array r = nn::relu(e);     // relu
  Array g = r * 2.0f;        // mul
  Array s = nn::sigmoid(g);  // sigmoid
  Array h = s + x;           // add
  return h * 0.5f;           // mul
}

// ---- STREAM copy on the cjax thread pool -----------------------------------------------------

// The arrays are on transparent huge pages, as cjax's large buffers are (runtime.cpp): the
// machine's best copy bandwidth, not one slowed by a TLB miss every 4 KB (~5% here).
class StreamCopy {
 public:
  explicit StreamCopy(int64_t n) : n_(n), a_(huge(n)), b_(huge(n)) {
    parallel_for(n, 1 << 16, [&](int64_t s, int64_t e) {
      for (int64_t i = s; i < e; ++i) a_[size_t(i)] = float(i & 1023), b_[size_t(i)] = 0;
    });
  }
  double bytes() const { return 2.0 * double(n_) * sizeof(float); }
  void memcpy_once() {
    parallel_for(n_, 1 << 16,
                 [&](int64_t s, int64_t e) { std::memcpy(b_.get() + s, a_.get() + s, size_t(e - s) * sizeof(float)); });
  }
  void loop_once() {
    parallel_for(n_, 1 << 16, [&](int64_t s, int64_t e) { copy_loop(a_.get(), b_.get(), s, e); });
  }

 private:
  using Block = std::unique_ptr<float[], decltype(&std::free)>;
  static Block huge(int64_t count) {
    size_t bytes = size_t(count) * sizeof(float);
    auto* p = static_cast<float*>(std::aligned_alloc(size_t(2) << 20, bytes));
    madvise(p, bytes, MADV_HUGEPAGE);
    return Block(p, &std::free);
  }
  int64_t n_;
  Block a_, b_;
};

// ---- 3. the MLP ----------------------------------------------------------------------------------

struct Layer {
  Array w, b;
};
CJAX_TREE(Layer, w, b)

const std::vector<int64_t> kSizes{784, 128, 128, 128, 128, 128, 8};
constexpr int64_t kBatch = 32;
constexpr float kLr = 0.01f;

// MLP 784-128x5-8, relu, softmax cross-entropy averaged over the batch (the same in every peer).
Array mlp_loss(const std::vector<Layer>& params, const Array& x, const Array& labels) {
  Array h = x;
  for (size_t i = 0; i < params.size(); ++i) {
    h = jnp::matmul(h, params[i].w) + params[i].b;
    if (i + 1 < params.size()) h = nn::relu(h);
  }
  Array logp = nn::log_softmax(h, -1);
  return -jnp::mean(jnp::sum(logp * nn::one_hot(labels, kSizes.back()), -1));
}

auto train_step = [](const std::vector<Layer>& p, const Array& x, const Array& y) {
  auto [l, g] = value_and_grad(mlp_loss)(p, x, y);
  return std::pair{l, tree::map([](const Array& w, const Array& dw) { return w - dw * kLr; }, p, g)};
};

struct MlpData {
  std::vector<Layer> params;
  Array x, labels;
};
MlpData make_mlp_data() {
  MlpData d;
  Array key = random::key(0);
  for (size_t i = 0; i + 1 < kSizes.size(); ++i) {
    key = random::split(key)[0];
    d.params.push_back({random::normal(key, {kSizes[i], kSizes[i + 1]}) * 0.05f, jnp::zeros({kSizes[i + 1]})});
  }
  d.x = random::normal(random::key(1), {kBatch, kSizes[0]});
  d.labels = random::randint(random::key(2), {kBatch}, 0, int(kSizes.back()));
  d.x.block_until_ready();
  d.labels.block_until_ready();
  return d;
}
// `n` chained jitted train steps (params fed forward), then a wait for the last loss.
template <class F>
void chained_steps(F& step, std::vector<Layer>& p, const MlpData& d, int n) {
  Array l;
  for (int i = 0; i < n; ++i) {
    auto [li, pi] = step(p, d.x, d.labels);
    p = std::move(pi);
    l = li;
  }
  l.block_until_ready();
}
// A deep copy (the jitted step donates its params).
std::vector<Layer> copy_params(const std::vector<Layer>& p) {
  return tree::map([](const Array& a) { return jnp::array(a.to_vector<float>(), a.shape()); }, p);
}

// The hand-written OpenBLAS step: sgemm forward, hand loops for bias/relu/loss, sgemm backward
// with the SGD update folded into the weight-gradient sgemm (beta = 1, alpha = -lr).
struct BlasMlp {
  std::vector<std::vector<float>> w, b, z;  // z[i]: layer i's output (relu applied to hidden layers)
  std::vector<float> dz, dh;

  explicit BlasMlp(const std::vector<Layer>& p) {
    for (size_t i = 0; i < p.size(); ++i) {
      w.push_back(p[i].w.to_vector<float>());
      b.push_back(p[i].b.to_vector<float>());
      z.emplace_back(size_t(kBatch * kSizes[i + 1]));
    }
    dz.resize(size_t(kBatch * 128));
    dh.resize(size_t(kBatch * 128));
  }

  float step(const float* x, const int* labels) {
    const int B = int(kBatch), L = int(w.size());
    const float* in = x;
    for (int i = 0; i < L; ++i) {
      const int k = int(kSizes[size_t(i)]), n = int(kSizes[size_t(i) + 1]);
      float* o = z[size_t(i)].data();
      for (int r = 0; r < B; ++r) std::memcpy(o + r * n, b[size_t(i)].data(), size_t(n) * sizeof(float));
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B, n, k, 1.f, in, k, w[size_t(i)].data(), n, 1.f, o, n);
      if (i + 1 < L)
        for (int j = 0; j < B * n; ++j) o[j] = std::max(o[j], 0.f);
      in = o;
    }
    // Softmax cross-entropy and its gradient dlogits = (softmax - onehot) / B.
    const int C = int(kSizes.back());
    const float* logits = z.back().data();
    double loss = 0;
    for (int r = 0; r < B; ++r) {
      const float* l = logits + r * C;
      float m = *std::max_element(l, l + C), s = 0;
      for (int c = 0; c < C; ++c) s += std::exp(l[c] - m);
      loss += double(m + std::log(s) - l[labels[r]]);
      for (int c = 0; c < C; ++c)
        dz[size_t(r * C + c)] = (std::exp(l[c] - m) / s - (c == labels[r] ? 1.f : 0.f)) / float(B);
    }
    for (int i = L - 1; i >= 0; --i) {
      const int k = int(kSizes[size_t(i)]), n = int(kSizes[size_t(i) + 1]);
      const float* hin = i > 0 ? z[size_t(i) - 1].data() : x;
      if (i > 0) {  // dh = dz @ w^T, masked by relu' (before w is updated)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B, k, n, 1.f, dz.data(), n, w[size_t(i)].data(), n, 0.f,
                    dh.data(), k);
        for (int j = 0; j < B * k; ++j)
          if (hin[j] <= 0.f) dh[size_t(j)] = 0.f;
      }
      for (int c = 0; c < n; ++c) {
        float s = 0;
        for (int r = 0; r < B; ++r) s += dz[size_t(r * n + c)];
        b[size_t(i)][size_t(c)] -= kLr * s;
      }
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, k, n, B, -kLr, hin, k, dz.data(), n, 1.f,
                  w[size_t(i)].data(), n);
      std::swap(dz, dh);
    }
    return float(loss / B);
  }
};

int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * int64_t(sysconf(_SC_PAGESIZE));
}

// This process's executable for the child runs: /proc/<pid>/exe stays valid even when a rebuild
// replaces (deletes) the file while the benchmark runs.
std::string self_exe() { return "/proc/" + std::to_string(getpid()) + "/exe"; }
std::string make_temp_dir() {
  std::string t = (std::filesystem::temp_directory_path() / "cjax_bench_cacheXXXXXX").string();
  if (!mkdtemp(t.data())) return {};
  return t;
}

// --compile-child [warm]: the first call of the jitted train step in this fresh process; with
// `warm`, after a first tiny jit call has initialized LLVM (the ORC JIT, the host target).
int compile_child(bool warm) {
  MlpData d = make_mlp_data();
  if (warm) jit([](const Array& a) { return a * 2.0f; })(jnp::ones({8})).block_until_ready();
  auto step = jit(train_step, {.name = "train_step", .donate_argnums = {0}});
  auto t0 = Clock::now();
  auto [l, p] = step(d.params, d.x, d.labels);
  l.block_until_ready();
  double t = seconds_since(t0);
  cpu::KernelCacheStats s = cpu::kernel_cache_stats();
  std::printf("first_call_ms=%f\nmisses=%lld\ndisk_hits=%lld\n", t * 1e3, (long long)s.misses, (long long)s.disk_hits);
  return 0;
}

double thread_cpu_seconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
}

// Median process CPU seconds per call (the --cpu-child measurements: one thread, so another
// process's load does not inflate them the way it inflates wall time).
double cpu_median(const std::function<void()>& fn, int reps) {
  auto cpu = [] {
    timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + double(t.tv_nsec) * 1e-9;
  };
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    double a = cpu();
    fn();
    t.push_back(cpu() - a);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

// --cpu-child (the parent sets CJAX_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1): CPU time per call of
// the fused chain vs the hand loop, and of the MLP step vs the OpenBLAS step, all on one thread.
int cpu_child() {
  const int64_t n = 16 << 20;
  Array x = random::uniform(random::key(3), {n}, DType::float32, -2.0, 2.0);
  x.block_until_ready();
  auto jf = jit(chain, {.name = "chain"});
  std::printf("chain_fused_ms=%f\n", cpu_median([&] { jf(x).block_until_ready(); }, 5) * 1e3);
  std::vector<float> xs = x.to_vector<float>();
  std::vector<float> ys(static_cast<size_t>(n));
  std::printf("chain_hand_ms=%f\n", cpu_median([&] { chain_loop(xs.data(), ys.data(), 0, n); }, 5) * 1e3);
  std::printf("chain_same_ms=%f\n", cpu_median([&] { chain_loop_same_math(xs.data(), ys.data(), 0, n); }, 5) * 1e3);

  MlpData d = make_mlp_data();
  std::vector<int> labels = d.labels.to_vector<int>();
  std::vector<float> xb = d.x.to_vector<float>();
  BlasMlp blas(d.params);
  auto step = jit(train_step, {.name = "train_step", .donate_argnums = {0}});
  std::vector<Layer> p = std::move(d.params);
  const int steps = 200;
  double t_cjax = cpu_median([&] { chained_steps(step, p, d, steps); }, 7) / steps;
  double t_blas = cpu_median(
                      [&] {
                        for (int i = 0; i < steps; ++i) blas.step(xb.data(), labels.data());
                      },
                      7) /
                  steps;
  std::printf("mlp_cjax_us=%f\nmlp_blas_us=%f\nthreads=%d\n", t_cjax * 1e6, t_blas * 1e6, num_threads());
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--compile-child") return compile_child(argc > 2);
  if (argc > 1 && std::string(argv[1]) == "--cpu-child") return cpu_child();
  auto bench_start = Clock::now();
  print_host();
  std::printf("cjax compiler benchmarks: %d threads (cjax pool), OpenBLAS %d threads\n", num_threads(),
              openblas_get_num_threads());
  std::string py = python_with_torch();
  std::string torch;
  if (!py.empty()) {
    // 1 thread: torch's intra-op threads and OpenBLAS's (torch's matmuls) pinned to 1; N: torch
    // on N threads, OpenBLAS on its default (the cores), as cjax's own 2-thread rows.
    std::string script = torch_isa_env() + py + " " CJAX_BENCH_DIR "/peers/torch_compiler.py ";
    torch = run_command("OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 " + script + "1 t1 2>/dev/null") +
            run_command(script + std::to_string(num_threads()) + " tN 2>/dev/null");
    std::printf("PyTorch peer: %s (torch's default intra-op threads here: %d; N = %d)\n", py.c_str(),
                int(peer_value(torch, "default_threads_tN")), num_threads());
  } else {
    std::printf("PyTorch not installed\n");
  }
  std::printf("\n%-44s %-18s %-26s %8s\n", "benchmark", "cjax", "peer", "ratio");
  auto torch_row = [&](const std::string& what, double ours, const std::string& key, const std::string& goal,
                       double goal_ratio, bool faster) {
    double t = peer_value(torch, key);
    if (t <= 0) {
      row(what, "", "PyTorch not installed", 0, goal);
      return;
    }
    t *= key.find("_us_") != std::string::npos ? 1e-6 : 1e-3;
    // faster: goal "cjax at least goal_ratio x faster" -> ratio printed as peer/ours.
    double ratio = faster ? t / ours : ours / t;
    std::string g =
        goal.empty() ? "-"
                     : goal + (goal_ratio > 0 ? " " + verdict(faster ? ratio >= goal_ratio : ratio <= goal_ratio) : "");
    row(what, ours < 1e-3 ? fmt_us(ours) : fmt_ms(ours), "torch " + (t < 1e-3 ? fmt_us(t) : fmt_ms(t)), ratio, g);
  };

  // ---- 1. 10-op elementwise chain on 16M f32 -----------------------------------------------
  {
    const int64_t n = 16 << 20;
    Array x = random::uniform(random::key(3), {n}, DType::float32, -2.0, 2.0);
    x.block_until_ready();
    Executable ex(make_jaxpr(chain)(x), "chain");
    check(ex.plan().kernels.size() == 1 && ex.plan().steps.size() == 1,
          "the 10-op chain should be one fused kernel; plan:\n" + ex.plan().describe());
    std::printf("[chain plan: %zu kernel(s), %zu step(s)] %s", ex.plan().kernels.size(), ex.plan().steps.size(),
                ex.plan().describe().c_str());
    if (ex.plan().describe().empty() || ex.plan().describe().back() != '\n') std::printf("\n");

    auto jf = jit(chain, {.name = "chain"});
    double t_fused = time_median([&] { jf(x).block_until_ready(); }, 11);

    std::vector<float> xs = x.to_vector<float>();
    std::vector<float> ys(static_cast<size_t>(n));
    const float* px = xs.data();
    float* py_ = ys.data();
    auto hand_2thr = [&](auto loop) {
      return time_median([&] { parallel_for(n, int64_t(1) << 14, [&](int64_t b, int64_t e) { loop(px, py_, b, e); }); },
                         11);
    };
    double t_same2 = hand_2thr(chain_loop_same_math);
    double t_same1 = time_median([&] { chain_loop_same_math(px, py_, 0, n); }, 7);
    std::vector<float> ours = jf(x).to_vector<float>();
    auto max_diff = [&] {
      double m = 0;
      for (size_t i = 0; i < ours.size(); ++i) m = std::max(m, double(std::fabs(ours[i] - ys[i])));
      return m;
    };
    double diff_same = max_diff();
    double t_hand2 = hand_2thr(chain_loop);
    double t_hand1 = time_median([&] { chain_loop(px, py_, 0, n); }, 7);
    double diff_libmvec = max_diff();
    std::printf("[chain: max |cjax - hand loop| = %.3g with the same approximations, %.3g with libmvec]\n", diff_same,
                diff_libmvec);
    check(diff_same < 1e-6 && diff_libmvec < 1e-5, "chain: cjax and the hand loops disagree");

    set_fusion_enabled(false);
    auto jf_unfused = jit(chain, {.name = "chain_unfused"});
    double t_unfused = time_median([&] { jf_unfused(x).block_until_ready(); }, 5);
    set_fusion_enabled(true);

    double gbs = 2.0 * double(n) * 4 / t_fused / 1e9;
    row("chain 10 ops 16M f32 (fused, " + fmt("%.1f", gbs) + " GB/s)", fmt_ms(t_fused),
        "same-math loop 2thr " + fmt_ms(t_same2), t_fused / t_same2, "<= 1.2x " + verdict(t_fused / t_same2 <= 1.2));
    row("  vs same-math loop, 1 thread", fmt_ms(t_fused), "same-math 1thr " + fmt_ms(t_same1), t_fused / t_same1, "-");
    row("  vs libmvec loop (-ffast-math), 2 threads", fmt_ms(t_fused), "libmvec 2thr " + fmt_ms(t_hand2),
        t_fused / t_hand2, "-");
    row("  vs libmvec loop, 1 thread", fmt_ms(t_fused), "libmvec 1thr " + fmt_ms(t_hand1), t_fused / t_hand1, "-");
    std::printf(
        "[the hand loop runs %.2fx faster on 2 threads than on 1; near 1x, another process holds a core and "
        "the multi-threaded rows of this run are not meaningful: see the one-thread CPU-time rows]\n",
        t_hand1 / t_hand2);
    row("  vs op by op (fusion disabled)", fmt_ms(t_fused), "unfused " + fmt_ms(t_unfused), t_fused / t_unfused, "-");
    torch_row("  vs PyTorch 1 thread (x faster)", t_fused, "chain_ms_t1", ">= 10x", 10, true);
    torch_row("  vs PyTorch N threads (x faster)", t_fused, "chain_ms_tN", "", 0, true);
  }

  // ---- 2. row softmax f32[4096, 4096] vs memory bandwidth -------------------------------------
  {
    StreamCopy stream(int64_t(32) << 20);  // 2 x 128 MiB
    Array s = random::uniform(random::key(4), {4096, 4096});
    s.block_until_ready();
    auto softmax_fn = [](const Array& a) { return nn::softmax(a, -1); };
    Executable ex(make_jaxpr(softmax_fn)(s), "softmax");
    std::printf("[softmax plan: %zu kernel(s), %zu step(s)] %s", ex.plan().kernels.size(), ex.plan().steps.size(),
                ex.plan().describe().c_str());
    auto jsm = jit(softmax_fn, {.name = "softmax"});
    std::vector<double> med = interleaved_medians({[&] { jsm(s).block_until_ready(); }, [&] { stream.memcpy_once(); },
                                                   [&] { stream.loop_once(); }},
                                                  15);
    double t = med[0], memcpy_gbs = stream.bytes() / med[1] / 1e9, loop_gbs = stream.bytes() / med[2] / 1e9;
    double gbs = 2.0 * 4096 * 4096 * 4 / t / 1e9;
    row("softmax f32[4096,4096] (" + fmt_ms(t) + ")", fmt_gbs(gbs), "STREAM memcpy " + fmt_gbs(memcpy_gbs),
        gbs / memcpy_gbs, ">= 0.70 " + verdict(gbs / memcpy_gbs >= 0.7));
    row("  vs STREAM store loop (no NT stores)", fmt_gbs(gbs), "STREAM loop " + fmt_gbs(loop_gbs), gbs / loop_gbs, "-");
    torch_row("  vs PyTorch 1 thread", t, "softmax_ms_t1", "", 0, false);
    torch_row("  vs PyTorch N threads", t, "softmax_ms_tN", "", 0, false);
  }

  // ---- 3. MLP train step -----------------------------------------------------------------------
  MlpData d = make_mlp_data();
  {
    std::vector<int> labels = d.labels.to_vector<int>();
    BlasMlp blas(d.params);
    std::vector<float> xs = d.x.to_vector<float>();
    auto step = jit(train_step, {.name = "train_step", .donate_argnums = {0}});
    // Same loss from the same start (first step), and the same updated parameters.
    std::vector<Layer> p = copy_params(d.params);
    auto [l0, p1] = step(p, d.x, d.labels);
    float blas_loss = blas.step(xs.data(), labels.data());
    double maxdw = 0;
    for (size_t i = 0; i < p1.size(); ++i) {
      std::vector<float> w = p1[i].w.to_vector<float>();
      for (size_t j = 0; j < w.size(); ++j) maxdw = std::max(maxdw, double(std::fabs(w[j] - blas.w[i][j])));
    }
    std::printf(
        "[MLP step 1: cjax loss %.7f, OpenBLAS loss %.7f, |difference| %.3g; max |w_cjax - w_blas| after the "
        "update %.3g]\n",
        double(l0.item<float>()), double(blas_loss), std::fabs(double(l0.item<float>()) - double(blas_loss)), maxdw);
    check(std::fabs(double(l0.item<float>()) - double(blas_loss)) < 1e-5, "MLP: cjax and OpenBLAS losses differ");
    p = std::move(p1);

    const int n = 200;
    // Seconds per step of `n` chained steps (params fed forward), waiting for the last loss.
    auto time_steps = [&](auto& f, int reps) { return time_median([&] { chained_steps(f, p, d, n); }, reps) / n; };
    // Donated and undonated in the same rounds, taking turns, each on its own parameters: timed one
    // after the other, a change of the VM's speed between them (10-30% over a minute) decided
    // "donated <= undonated" (Zen 4, AVX2: 333 vs 322 us in one run).
    auto step_nodonate = jit(train_step, {.name = "train_step_nodonate"});
    std::vector<Layer> p_nodonate = copy_params(p);
    std::vector<double> donated_vs_not = interleaved_medians({[&] { chained_steps(step, p, d, n); },
                                                              [&] { chained_steps(step_nodonate, p_nodonate, d, n); }},
                                                             7);
    double t_cjax = donated_vs_not[0] / n, t_nodonate = donated_vs_not[1] / n;
    double t_blas = time_median(
                        [&] {
                          OpenBlasOwnThreads own;
                          for (int i = 0; i < n; ++i) blas.step(xs.data(), labels.data());
                        },
                        7) /
                    n;
    set_fusion_enabled(false);
    auto step_unfused = jit(train_step, {.name = "train_step_unfused", .donate_argnums = {0}});
    double t_unfused = time_steps(step_unfused, 5);
    set_fusion_enabled(true);
    Executable ex(make_jaxpr(train_step)(p, d.x, d.labels), "train_step");
    std::printf("[train step plan: %zu kernels, %zu steps]\n", ex.plan().kernels.size(), ex.plan().steps.size());
    row("MLP train step (jit, donated params)", fmt_us(t_cjax), "OpenBLAS step " + fmt_us(t_blas), t_cjax / t_blas,
        "<= 1.3x " + verdict(t_cjax / t_blas <= 1.3));
    torch_row("  vs PyTorch eager 1 thread (+OpenBLAS 1)", t_cjax, "mlp_step_us_t1", "<= 0.5x", 0.5, false);
    torch_row("  vs PyTorch eager N threads (default)", t_cjax, "mlp_step_us_tN", "<= 0.5x", 0.5, false);
    row("  without donation", fmt_us(t_nodonate), "donated " + fmt_us(t_cjax), t_nodonate / t_cjax, "-");
    row("  fusion disabled (op by op)", fmt_us(t_unfused), "fused " + fmt_us(t_cjax), t_unfused / t_cjax, "-");
    d.params = std::move(p);
  }

  // ---- 1+3 on one thread, in CPU time (robust when other processes load the machine) ----------
  {
    std::string exe = self_exe();
    std::string out =
        exe.empty() ? "" : run_command("CJAX_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 " + exe + " --cpu-child");
    double fused = peer_value(out, "chain_fused_ms"), hand = peer_value(out, "chain_hand_ms"),
           same = peer_value(out, "chain_same_ms");
    double mc = peer_value(out, "mlp_cjax_us"), mb = peer_value(out, "mlp_blas_us");
    check(peer_value(out, "threads") == 1, "cpu child: expected 1 thread:\n" + out);
    std::printf("[one thread, process CPU time (CJAX_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1)]\n");
    row("chain 10 ops 16M, 1 thread, CPU time", fmt("%.2f ms", fused), "same-math loop " + fmt("%.2f ms", same),
        fused / same, "<= 1.2x " + verdict(fused / same <= 1.2));
    row("  vs libmvec loop, 1 thread, CPU time", fmt("%.2f ms", fused), "libmvec loop " + fmt("%.2f ms", hand),
        fused / hand, "-");
    double tc = peer_value(torch, "chain_cpu_ms_t1");
    if (tc > 0)
      row("  vs PyTorch 1 thread, CPU time (x faster)", fmt("%.2f ms", fused), "torch " + fmt("%.2f ms", tc),
          tc / fused, ">= 10x " + verdict(tc / fused >= 10));
    row("MLP step, 1 thread, CPU time", fmt("%.1f us", mc), "OpenBLAS step " + fmt("%.1f us", mb), mc / mb,
        "<= 1.3x " + verdict(mc / mb <= 1.3));
    double tm = peer_value(torch, "mlp_step_cpu_us_t1");
    if (tm > 0)
      row("  vs PyTorch eager 1 thread, CPU time", fmt("%.1f us", mc), "torch " + fmt("%.1f us", tm), mc / tm,
          "<= 0.5x " + verdict(mc / tm <= 0.5));
  }

  // ---- 4. compile time of the train step -------------------------------------------------------
  {
    std::vector<std::string> dirs;
    auto fresh_dir = [&] {
      dirs.push_back(make_temp_dir());
      setenv("CJAX_CACHE_DIR", dirs.back().c_str(), 1);
      cpu::clear_memory_kernel_cache();
      return dirs.back();
    };
    const int reps = 5;
    std::vector<double> exe_cold, exe_total_cold, exe_cpu_cold, jit_cold, exe_disk, exe_total_disk, jit_disk, trace_ms;
    bool cold_ok = true, disk_ok = true;
    for (int r = 0; r < reps; ++r) {
      // Cold, in this process: an Executable from the traced jaxpr, and a new jit's first call.
      fresh_dir();
      auto t0 = Clock::now();
      ClosedJaxpr cj = make_jaxpr(train_step)(d.params, d.x, d.labels);
      trace_ms.push_back(seconds_since(t0) * 1e3);
      auto t1 = Clock::now();
      double c1 = thread_cpu_seconds();
      Executable ex(cj, "train_step");
      exe_cpu_cold.push_back((thread_cpu_seconds() - c1) * 1e3);
      exe_total_cold.push_back(seconds_since(t1) * 1e3);
      exe_cold.push_back(ex.compiled().compile_ms);
      cold_ok = cold_ok && !ex.compiled().from_cache;
      // From the disk cache: the memory cache dropped, the objects read back from the directory.
      cpu::clear_memory_kernel_cache();
      auto t2 = Clock::now();
      Executable ex2(cj, "train_step");
      exe_total_disk.push_back(seconds_since(t2) * 1e3);
      exe_disk.push_back(ex2.compiled().compile_ms);
      disk_ok = disk_ok && ex2.compiled().from_cache;

      fresh_dir();
      std::vector<Layer> p = copy_params(d.params);
      auto step = jit(train_step, {.name = "train_step", .donate_argnums = {0}});
      auto t3 = Clock::now();
      step(p, d.x, d.labels).first.block_until_ready();
      jit_cold.push_back(seconds_since(t3) * 1e3);
      cpu::clear_memory_kernel_cache();
      auto step2 = jit(train_step, {.name = "train_step", .donate_argnums = {0}});
      p = copy_params(d.params);
      auto t4 = Clock::now();
      step2(p, d.x, d.labels).first.block_until_ready();
      jit_disk.push_back(seconds_since(t4) * 1e3);
    }
    check(cold_ok, "compile: a cold Executable came from the kernel cache");
    check(disk_ok, "compile: the Executable after clear_memory_kernel_cache() did not come from the disk cache");
    // Fresh processes: a cold one (empty cache directory), then one reading that directory.
    std::vector<double> proc_cold, proc_disk, proc_disk_warm;
    std::string exe = self_exe();
    for (int r = 0; r < 3 && !exe.empty(); ++r) {
      std::string dir = make_temp_dir();
      dirs.push_back(dir);
      std::string cmd = "CJAX_CACHE_DIR=" + dir + " " + exe + " --compile-child";
      std::string a = run_command(cmd), b = run_command(cmd), c = run_command(cmd + " warm");
      check(peer_value(a, "misses") >= 1 && peer_value(b, "misses") == 0 && peer_value(b, "disk_hits") >= 1,
            "compile child: expected a cold process then a disk-cache process:\n" + a + b);
      proc_cold.push_back(peer_value(a, "first_call_ms"));
      proc_disk.push_back(peer_value(b, "first_call_ms"));
      proc_disk_warm.push_back(peer_value(c, "first_call_ms"));
    }
    unsetenv("CJAX_CACHE_DIR");
    for (auto& dir : dirs) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
    double ec = median(exe_cold), ed = median(exe_disk);
    std::printf(
        "[trace (make_jaxpr of the step) %.1f ms; Executable construction cold %.1f ms wall, %.1f ms CPU of "
        "this thread; from disk %.1f ms]\n",
        median(trace_ms), median(exe_total_cold), median(exe_cpu_cold), median(exe_total_disk));
    row("compile train step cold (compile_ms)", fmt("%.1f ms", ec), "goal 150 ms", ec / 150,
        "<= 150 ms " + verdict(ec <= 150));
    row("  first jit call cold (trace+compile+run)", fmt("%.1f ms", median(jit_cold)), "goal 150 ms",
        median(jit_cold) / 150, "<= 150 ms " + verdict(median(jit_cold) <= 150));
    row("  first call cold, fresh process", fmt("%.1f ms", median(proc_cold)), "goal 150 ms", median(proc_cold) / 150,
        "<= 150 ms " + verdict(median(proc_cold) <= 150));
    row("compile train step from disk (compile_ms)", fmt("%.1f ms", ed), "goal 20 ms", ed / 20,
        "<= 20 ms " + verdict(ed <= 20));
    row("  first jit call from disk (trace+load+run)", fmt("%.1f ms", median(jit_disk)), "goal 20 ms",
        median(jit_disk) / 20, "<= 20 ms " + verdict(median(jit_disk) <= 20));
    row("  first call from disk, fresh process", fmt("%.1f ms", median(proc_disk)), "goal 20 ms",
        median(proc_disk) / 20, "<= 20 ms " + verdict(median(proc_disk) <= 20));
    row("  the same after LLVM init (1st tiny jit)", fmt("%.1f ms", median(proc_disk_warm)), "goal 20 ms",
        median(proc_disk_warm) / 20, "<= 20 ms " + verdict(median(proc_disk_warm) <= 20));
  }

  // ---- 5. memory of the train step ------------------------------------------------------------
  {
    auto step = jit(train_step, {.name = "train_step", .donate_argnums = {0}});
    std::vector<Layer> p = std::move(d.params);
    for (int i = 0; i < 100; ++i) {  // warm: compiled, allocator caches filled
      auto [l, pi] = step(p, d.x, d.labels);
      p = std::move(pi);
    }
    Device dev = default_device();
    MemoryStats before = memory_stats(dev);
    reset_peak_memory(dev);
    {
      auto [l, pi] = step(p, d.x, d.labels);
      p = std::move(pi);
      l.block_until_ready();
    }
    MemoryStats after = memory_stats(dev);
    // Analytic: params; inputs (x, labels); activations live at the start of the backward pass
    // (the 5 hidden relu outputs, which also give the relu masks, and the logits).
    int64_t params_b = 0, acts_b = 0;
    for (size_t i = 0; i + 1 < kSizes.size(); ++i) {
      params_b += (kSizes[i] * kSizes[i + 1] + kSizes[i + 1]) * 4;
      acts_b += kBatch * kSizes[i + 1] * 4;
    }
    int64_t inputs_b = kBatch * kSizes[0] * 4 + kBatch * 4;
    int64_t base = params_b + inputs_b + acts_b;
    std::printf(
        "[memory: params %lld B, x+labels %lld B, live activations %lld B -> %lld B; in use before the step "
        "%lld B (other live arrays of the process: %lld B); peak during the step %lld B = in use + %lld B "
        "(%.2f x params)]\n",
        (long long)params_b, (long long)inputs_b, (long long)acts_b, (long long)base, (long long)before.bytes_in_use,
        (long long)(before.bytes_in_use - params_b - inputs_b), (long long)after.peak_bytes_in_use,
        (long long)(after.peak_bytes_in_use - before.bytes_in_use),
        double(after.peak_bytes_in_use - before.bytes_in_use) / double(params_b));
    int64_t other = before.bytes_in_use - params_b - inputs_b;
    double peak_step = double(after.peak_bytes_in_use - other);
    row("MLP step peak memory (less other arrays)", fmt("%.0f KB", peak_step / 1e3),
        "params+in+acts " + fmt("%.0f KB", double(base) / 1e3), peak_step / double(base),
        "<= 1.2x " + verdict(peak_step / double(base) <= 1.2));

    int64_t rss0 = rss_bytes();
    auto t0 = Clock::now();
    const int steps = 10000;
    chained_steps(step, p, d, steps);
    double t = seconds_since(t0);
    int64_t rss1 = rss_bytes();
    double growth = double(rss1 - rss0) / double(rss0);
    row("RSS over 10,000 steps (" + fmt("%.0f us/step", t / steps * 1e6) + ")",
        fmt("%.1f MB", double(rss1) / 1e6) + fmt(" (%+.0f KB)", double(rss1 - rss0) / 1e3),
        "before " + fmt("%.1f MB", double(rss0) / 1e6), double(rss1) / double(rss0),
        "growth < 1% " + verdict(growth < 0.01));
  }
  std::printf("\ntotal %.1f s\n", seconds_since(bench_start));
  return 0;
}
