// A small benchmark harness: median wall time of repeated runs, and ratio printing.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace cjax::bench {

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

inline void row(const std::string& what, const std::string& ours, const std::string& peer, double ratio,
                const std::string& goal) {
  std::printf("%-44s %-18s %-26s %7.2fx   goal %s\n", what.c_str(), ours.c_str(), peer.c_str(), ratio, goal.c_str());
}

}  // namespace cjax::bench
