// Timing of one executable step for cjax/profiler.h (a no-op unless the profiler is on).
#pragma once
#include <chrono>
#include <string>

namespace cjax {

class ProfileScope {
 public:
  explicit ProfileScope(bool on);
  void record(std::string name, const std::string& jit);

 private:
  bool on_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace cjax
