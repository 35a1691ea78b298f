// trace/phase.h: the marks of equations traced in a backward pass, kept as weak references to
// their source info (an address is reused only after the info is gone, which a weak reference
// detects).
#include "trace/phase.h"

#include <mutex>
#include <unordered_map>

namespace cjax {
namespace {

thread_local bool t_backward = false;

struct Marks {
  std::mutex mu;
  std::unordered_map<const SourceInfo*, std::weak_ptr<const SourceInfo>> marked;
  size_t since_prune = 0;
};
Marks& marks() {
  static Marks m;
  return m;
}

}  // namespace

BackwardPassScope::BackwardPassScope() : previous_(t_backward) { t_backward = true; }
BackwardPassScope::~BackwardPassScope() { t_backward = previous_; }
bool in_backward_pass() { return t_backward; }

void mark_backward(const std::shared_ptr<const SourceInfo>& info) {
  if (!info) return;
  Marks& m = marks();
  std::lock_guard lock(m.mu);
  m.marked[info.get()] = info;
  if (++m.since_prune >= 4096) {
    std::erase_if(m.marked, [](const auto& kv) { return kv.second.expired(); });
    m.since_prune = 0;
  }
}

bool is_backward(const SourceInfo* info) {
  if (!info) return false;
  Marks& m = marks();
  std::lock_guard lock(m.mu);
  auto it = m.marked.find(info);
  if (it == m.marked.end()) return false;
  std::shared_ptr<const SourceInfo> alive = it->second.lock();
  return alive && alive.get() == info;
}

}  // namespace cjax
