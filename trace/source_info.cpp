#include "trace/source_info.h"

#include <execinfo.h>

#include <atomic>
#include <cstring>
#include <mutex>

#ifdef CJAX_HAVE_LIBBACKTRACE
#include <backtrace.h>
#endif

namespace cjax {

namespace config {
namespace {
std::atomic<bool> g_capture{true};
}
void set_capture_source_info(bool enabled) { g_capture = enabled; }
bool capture_source_info() { return g_capture; }
}  // namespace config

namespace {
std::atomic<int64_t> g_symbolized{0};
thread_local std::shared_ptr<const SourceInfo> t_override;
thread_local bool t_override_set = false;
}  // namespace

SourceInfoOverride::SourceInfoOverride(std::shared_ptr<const SourceInfo> info)
    : previous_(std::move(t_override)), previous_set_(t_override_set) {
  t_override = std::move(info);
  t_override_set = true;
}
SourceInfoOverride::~SourceInfoOverride() {
  t_override = std::move(previous_);
  t_override_set = previous_set_;
}

std::shared_ptr<const SourceInfo> SourceInfo::copy_of(const SourceInfo* info) {
  auto s = std::make_shared<SourceInfo>();
  if (info) s->pcs_ = info->pcs_;
  return s;
}

std::shared_ptr<const SourceInfo> SourceInfo::capture() {
  if (t_override_set) return t_override;
  if (!config::capture_source_info()) return nullptr;
  // 32 frames reach the user's code through cjax's layers (bind, traces, rules, templates);
  // each frame costs about 0.15 us to unwind.
  void* frames[32];
  int n = ::backtrace(frames, 32);
  auto s = std::make_shared<SourceInfo>();
  s->pcs_.reserve(size_t(n));
  for (int i = 1; i < n; ++i) s->pcs_.push_back(reinterpret_cast<uintptr_t>(frames[i]));
  return s;
}

namespace {
#ifdef CJAX_HAVE_LIBBACKTRACE
backtrace_state* state() {
  static backtrace_state* s = backtrace_create_state(nullptr, /*threaded=*/1, nullptr, nullptr);
  return s;
}
// cjax's own frames and system headers are skipped. Debug info may name cjax's files by
// absolute path or, when compiled through ccache with CCACHE_BASEDIR, relative to the build
// directory ("../trace/jaxpr_trace.cpp"), so both forms are recognized.
bool is_internal(const char* file) {
  std::string f(file);
  if (f.rfind("/usr/include/", 0) == 0 || f.rfind("/usr/lib/", 0) == 0) return true;
  static const std::string src = std::string(CJAX_SOURCE_DIR) + "/";
  std::string rel;
  if (f.rfind(src, 0) == 0) {
    rel = f.substr(src.size());
  } else if (f.empty() || f[0] != '/') {
    rel = f;
    while (rel.rfind("../", 0) == 0 || rel.rfind("./", 0) == 0)
      rel = rel.substr(rel[0] == '.' && rel[1] == '/' ? 2 : 3);
  } else {
    return false;
  }
  // cjax's own layers; tests/samples/bench and everything else are user code.
  for (const char* dir : {"core/", "trace/", "autodiff/", "jit/", "backends/", "include/cjax/"})
    if (rel.rfind(dir, 0) == 0) return true;
  return false;
}
#endif
}  // namespace

int64_t SourceInfo::symbolized_count() { return g_symbolized.load(); }

const std::string& SourceInfo::str() const {
  std::call_once(once_, [this] {
    g_symbolized.fetch_add(1);
#ifdef CJAX_HAVE_LIBBACKTRACE
    // One symbolization at a time: libbacktrace's threaded mode synchronizes with atomics that
    // ThreadSanitizer cannot see (it is not instrumented), and symbolizing is rare (errors, dumps).
    static std::mutex mu;
    std::lock_guard lock(mu);
    struct Ctx {
      std::string* out;
    } ctx{&text_};
    for (uintptr_t pc : pcs_) {
      // Return addresses point after the call: look up pc - 1 to land on the call's line.
      backtrace_pcinfo(
          state(), pc - 1,
          [](void* data, uintptr_t, const char* file, int line, const char* fn) -> int {
            auto* c = static_cast<Ctx*>(data);
            if (!file || is_internal(file)) return 0;
            const char* base = std::strrchr(file, '/');
            *c->out = std::string(base ? base + 1 : file) + ":" + std::to_string(line);
            if (fn) *c->out += std::string(" (") + fn + ")";
            return 1;
          },
          [](void*, const char*, int) {}, &ctx);
      if (!text_.empty()) break;
    }
#endif
  });
  return text_;
}

}  // namespace cjax
