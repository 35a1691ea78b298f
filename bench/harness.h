// A small benchmark harness: median wall time of repeated runs (alone, or interleaved with
// peers), and ratio printing.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

extern "C" {
int openblas_get_num_threads(void);
void openblas_set_num_threads(int);
}

namespace cjax::bench {

// OpenBLAS as its users call it, on its own threads (one per core, or OPENBLAS_NUM_THREADS), for
// the scope's lifetime: cjax pins OpenBLAS to one thread once it has run a GEMM on it
// (backends/cpu/kernels/linalg.cpp), which must not slow the OpenBLAS peer rows.
class OpenBlasOwnThreads {
 public:
  OpenBlasOwnThreads() : previous_(openblas_get_num_threads()) {
    const char* env = std::getenv("OPENBLAS_NUM_THREADS");
    openblas_set_num_threads(env && *env ? std::atoi(env) : int(std::thread::hardware_concurrency()));
  }
  ~OpenBlasOwnThreads() { openblas_set_num_threads(previous_); }
  OpenBlasOwnThreads(const OpenBlasOwnThreads&) = delete;
  OpenBlasOwnThreads& operator=(const OpenBlasOwnThreads&) = delete;

 private:
  int previous_;
};

// Median seconds per call of fn over `reps` timed runs (after one warm-up run).
inline double time_median(const std::function<void()>& fn, int reps) {
  fn();
  std::vector<double> t;
  for (int r = 0; r < reps; ++r) {
    auto a = std::chrono::steady_clock::now();
    fn();
    auto b = std::chrono::steady_clock::now();
    t.push_back(std::chrono::duration<double>(b - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Medians of fns[k] over `reps` rounds that run each fn once in turn: this VM's memory bandwidth
// changes state for minutes at a time (STREAM copy reads 45-50 GB/s in one, 78-90 in the other),
// so a peer and the measured code are timed in the same rounds, not one after the other.
inline std::vector<double> interleaved_medians(const std::vector<std::function<void()>>& fns, int reps) {
  std::vector<std::vector<double>> t(fns.size());
  for (const auto& f : fns) f();
  for (int r = 0; r < reps; ++r)
    for (size_t k = 0; k < fns.size(); ++k) {
      auto a = std::chrono::steady_clock::now();
      fns[k]();
      t[k].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
    }
  std::vector<double> out;
  for (auto& v : t) {
    std::sort(v.begin(), v.end());
    out.push_back(v[v.size() / 2]);
  }
  return out;
}

// The environment a PyTorch peer's command runs under: under CJAX_ISA=avx2 (an AVX2-only host,
// emulated) the peer is held to AVX2 too, ATen's kernels (ATEN_CPU_CAPABILITY) and OpenBLAS's
// (OPENBLAS_CORETYPE=Haswell unless set). Otherwise ATen ran its AVX-512 kernels against cjax's
// AVX2 ones (2-core Zen 4: torch.tanh 7x slower with them, the transformer peer 4-11% faster).
inline std::string torch_isa_env() {
  const char* requested = std::getenv("CJAX_ISA");
  if (!requested || std::string(requested) != "avx2") return {};
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  return std::string("ATEN_CPU_CAPABILITY=avx2 OPENBLAS_CORETYPE=") + (core && *core ? core : "Haswell") + " ";
}

// The host every table was measured on: CPU model, the widest vector ISA it has, the ISA the
// generated kernels were asked to use (CJAX_ISA), its logical cores, and the PyTorch peers' ISA
// settings where they are held to AVX2.
inline void print_host() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, model = "unknown CPU", flags;
  while (std::getline(cpuinfo, line)) {
    auto value = [&] { return line.substr(line.find(':') + 2); };
    if (line.rfind("model name", 0) == 0 && model == "unknown CPU") model = value();
    if (line.rfind("flags", 0) == 0 && flags.empty()) flags = " " + value() + " ";
  }
  const char* isa = flags.find(" avx512f ") != std::string::npos ? "AVX-512"
                    : flags.find(" avx2 ") != std::string::npos  ? "AVX2"
                                                                 : "SSE";
  const char* requested = std::getenv("CJAX_ISA");
  const std::string peer = torch_isa_env();
  std::printf("host: %s, %s, %u logical cores; kernels: CJAX_ISA=%s%s%s\n", model.c_str(), isa,
              std::thread::hardware_concurrency(), requested && *requested ? requested : "native",
              peer.empty() ? "" : "; PyTorch peers: ", peer.substr(0, peer.find_last_not_of(' ') + 1).c_str());
}

inline void row(const std::string& what, const std::string& ours, const std::string& peer, double ratio,
                const std::string& goal) {
  std::printf("%-44s %-18s %-26s %7.2fx   goal %s\n", what.c_str(), ours.c_str(), peer.c_str(), ratio, goal.c_str());
}

}  // namespace cjax::bench
