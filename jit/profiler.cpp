#include "cjax/profiler.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <mutex>
#include <thread>

#include "cjax/errors.h"
#include "jit/profile_internal.h"

namespace cjax::profiler {
namespace {

struct State {
  std::mutex mu;
  std::vector<Event> events;
  std::chrono::steady_clock::time_point origin = std::chrono::steady_clock::now();
};
State& state() {
  static State* s = new State;  // outlives other statics: programs may run during exit
  return *s;
}
std::atomic<bool> g_on{false};

const bool g_env = [] {
  const char* path = std::getenv("CJAX_PROFILE");
  if (!path || !*path) return false;
  start();
  std::atexit([] {
    try {
      export_chrome_trace(std::getenv("CJAX_PROFILE"));
    } catch (const std::exception& e) {
      fmt::print(stderr, "cjax: {}\n", e.what());
    }
  });
  return true;
}();

}  // namespace

void start() {
  State& s = state();
  std::lock_guard lk(s.mu);
  s.events.clear();
  s.origin = std::chrono::steady_clock::now();
  g_on = true;
}
void stop() { g_on = false; }
bool enabled() { return g_on.load(std::memory_order_relaxed); }

std::vector<Event> events() {
  State& s = state();
  std::lock_guard lk(s.mu);
  return s.events;
}

void export_chrome_trace(const std::string& path) {
  nlohmann::json trace = nlohmann::json::array();
  for (const Event& e : events())
    trace.push_back({{"name", e.name},
                     {"cat", e.jit},
                     {"ph", "X"},
                     {"ts", e.start_us},
                     {"dur", e.duration_us},
                     {"pid", 0},
                     {"tid", e.thread},
                     {"args", {{"jit", e.jit}, {"shapes", e.shapes}}}});
  // A temporary named as cjax::io names its own (io::remove_stale_temporaries), removed on any error.
  std::filesystem::path target(path);
  std::filesystem::path tmp =
      target.parent_path() / fmt::format(".{}.cjax-tmp.{}.0", target.filename().string(), ::getpid());
  std::error_code ec;
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << nlohmann::json{{"traceEvents", trace}, {"displayTimeUnit", "ms"}}.dump() << "\n";
    out.close();
    if (!out) {
      std::filesystem::remove(tmp, ec);
      throw IoError(fmt::format("profiler: cannot write the trace file '{}'", path));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    int e = errno;
    std::filesystem::remove(tmp, ec);
    throw IoError(fmt::format("profiler: cannot write the trace file '{}': {}", path, std::strerror(e)));
  }
}

}  // namespace cjax::profiler

namespace cjax {

std::string shapes_label(std::span<const Array> operands, std::span<const AbstractValue> results) {
  std::string s;
  for (const Array& x : operands) s += (x.defined() ? x.aval().str() : std::string("_")) + " ";
  s += "->";
  for (const AbstractValue& a : results) s += " " + a.str();
  return s;
}

ProfileScope::ProfileScope(bool on) : on_(on) {
  if (on_) t0_ = std::chrono::steady_clock::now();
}
void ProfileScope::record(std::string name, const std::string& jit, std::string shapes) {
  if (!on_) return;
  auto t1 = std::chrono::steady_clock::now();
  auto& s = profiler::state();
  profiler::Event e;
  e.name = std::move(name);
  e.jit = jit;
  e.shapes = std::move(shapes);
  e.start_us = std::chrono::duration<double, std::micro>(t0_ - s.origin).count();
  e.duration_us = std::chrono::duration<double, std::micro>(t1 - t0_).count();
  e.thread = std::hash<std::thread::id>()(std::this_thread::get_id()) % 100000;
  std::lock_guard lk(s.mu);
  s.events.push_back(std::move(e));
}

}  // namespace cjax
