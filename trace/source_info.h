// Where a traced equation came from (JAX's eqn.source_info): the user's call site, found by
// walking the stack past cjax's own frames. Capturing stores raw return addresses (about a
// microsecond); turning them into "file:line (function)" reads DWARF debug info with GCC's
// libbacktrace and happens only when the text is asked for (printing with source info, errors).
// Frames in cjax's sources and in system headers are skipped. Without debug info (or without
// libbacktrace at build time) str() is "".
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace cjax {

class SourceInfo {
 public:
  // The current call stack, or null when capturing is off (config::set_capture_source_info).
  static std::shared_ptr<const SourceInfo> capture();
  // "file.cpp:12 (function)" of the first frame outside cjax, or "".
  const std::string& str() const;
  // A distinct object for the same call site (null for null): marks keyed by the object
  // (trace/phase.h) then apply to one equation, not to every equation that shares `info`.
  static std::shared_ptr<const SourceInfo> copy_of(const SourceInfo* info);
  // How many SourceInfos this process has turned into text (tests check that a hot path such as
  // a sharded jit's first call symbolizes nothing: the first symbolization reads the debug info).
  static int64_t symbolized_count();

 private:
  std::vector<uintptr_t> pcs_;
  mutable std::once_flag once_;
  mutable std::string text_;
};

// While alive, equations traced on this thread take `info` as their source (the partitioner
// stages each equation's per-device form with the user's call site of the original equation).
class SourceInfoOverride {
 public:
  explicit SourceInfoOverride(std::shared_ptr<const SourceInfo> info);
  ~SourceInfoOverride();
  SourceInfoOverride(const SourceInfoOverride&) = delete;
  SourceInfoOverride& operator=(const SourceInfoOverride&) = delete;

 private:
  std::shared_ptr<const SourceInfo> previous_;
  bool previous_set_;
};

namespace config {
void set_capture_source_info(bool enabled);  // default: on
bool capture_source_info();
}  // namespace config

}  // namespace cjax
