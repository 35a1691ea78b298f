// Timing of one executable step for cjax/profiler.h (a no-op unless the profiler is on).
#pragma once
#include <chrono>
#include <span>
#include <string>

#include "cjax/array.h"

namespace cjax {

// "f32[2,3] f32[3] -> f32[2,3]": a step's operands (an empty Array: "_") and results.
std::string shapes_label(std::span<const Array> operands, std::span<const AbstractValue> results);

class ProfileScope {
 public:
  explicit ProfileScope(bool on);
  // `shapes`: the step's operands and results, "f32[2,3] f32[3] -> f32[2,3]" (shapes_label).
  void record(std::string name, const std::string& jit, std::string shapes = {});

 private:
  bool on_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace cjax
