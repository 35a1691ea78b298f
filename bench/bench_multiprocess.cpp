// Collective bandwidth between processes (Gloo over TCP on this machine) and, for reference,
// between two virtual devices of one process. Prints "op bytes seconds" lines; the table with
// PyTorch's Gloo in the same run is bench/multiprocess_vs_torch.sh.
//   cjax_launch -n 2 -- bench_multiprocess          (one CPU device per process)
//   CJAX_NUM_CPU_DEVICES=2 bench_multiprocess --in-process
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "cjax/cjax.h"
#include "cjax/distributed.h"
#include "core/backend/backend.h"

using namespace cjax;

namespace {
// Median seconds of `reps` runs of `run` after a warm-up (every process must run the same count).
template <class F>
double median_seconds(int reps, F&& run) {
  run();  // warm-up (connections, pages)
  std::vector<double> times;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    run();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Every rank runs op on its own buffers; `ranks` are this process's ranks, each on its own thread.
void measure(BufferCommunicator& comm, const std::vector<int>& ranks, bool print) {
  int n = comm.size();
  for (size_t bytes = 4 << 10; bytes <= (64u << 20); bytes *= 4) {
    size_t count = bytes / 4;
    std::vector<std::vector<float>> send(ranks.size(), std::vector<float>(count * size_t(n), 1.0f)),
        recv(ranks.size(), std::vector<float>(count * size_t(n)));
    int reps = bytes <= (256u << 10) ? 200 : bytes <= (4u << 20) ? 40 : 8;
    auto each_rank = [&](auto op) {
      std::vector<std::future<void>> done;
      for (size_t i = 1; i < ranks.size(); ++i) done.push_back(std::async(std::launch::async, [&, i] { op(i); }));
      op(0);
      for (auto& f : done) f.get();
    };
    double all_reduce = median_seconds(reps, [&] {
      each_rank(
          [&](size_t i) { comm.all_reduce(ranks[i], send[i].data(), recv[i].data(), count, f32, ReduceOp::Sum); });
    });
    double all_gather = median_seconds(reps, [&] {
      each_rank([&](size_t i) { comm.all_gather(ranks[i], send[i].data(), recv[i].data(), bytes / size_t(n)); });
    });
    double reduce_scatter = median_seconds(reps, [&] {
      each_rank([&](size_t i) {
        comm.reduce_scatter(ranks[i], send[i].data(), recv[i].data(), count / size_t(n), f32, ReduceOp::Sum);
      });
    });
    if (print) {
      std::printf("all_reduce %zu %.9f\n", bytes, all_reduce);
      std::printf("all_gather %zu %.9f\n", bytes, all_gather);
      std::printf("reduce_scatter %zu %.9f\n", bytes, reduce_scatter);
      std::fflush(stdout);
    }
  }
}
}  // namespace

// Sizes are the bytes of the whole (reduced or gathered) array, as torch's peer counts them.
int main(int argc, char** argv) {
  bool in_process = argc > 1 && std::string(argv[1]) == "--in-process";
  if (!in_process) distributed::initialize();
  std::vector<Device> group = devices();
  std::shared_ptr<BufferCommunicator> comm = backend_for(Platform::cpu).communicator(group);
  std::vector<int> ranks;
  for (int r = 0; r < int(group.size()); ++r)
    if (process_index_of(group[size_t(r)]) == process_index()) ranks.push_back(r);
  measure(*comm, ranks, process_index() == 0);
  if (!in_process) distributed::shutdown();
  return 0;
}
