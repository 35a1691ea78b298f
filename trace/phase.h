// Which traced equations belong to a backward pass. Equations traced while autodiff transposes a
// program (backward_pass) are marked through their source info; the per-device equations that the
// sharded-jit partitioner stages for a marked equation (collectives included) share its source
// info, so the executor reports their collectives to debug::CollectiveRecorder as backward, as a
// transposed shard_map body's are. Without source info (config::set_capture_source_info(false))
// nothing is marked and those collectives record as forward.
#pragma once
#include <memory>

#include "trace/source_info.h"

namespace cjax {

// While alive, this thread is transposing a program (autodiff's backward_pass).
class BackwardPassScope {
 public:
  BackwardPassScope();
  ~BackwardPassScope();
  BackwardPassScope(const BackwardPassScope&) = delete;
  BackwardPassScope& operator=(const BackwardPassScope&) = delete;

 private:
  bool previous_;
};
bool in_backward_pass();

void mark_backward(const std::shared_ptr<const SourceInfo>& info);
bool is_backward(const SourceInfo* info);  // false for null

}  // namespace cjax
