// Per-kernel timing profile of compiled programs, exportable as Chrome / Perfetto trace JSON
// (open it in chrome://tracing or ui.perfetto.dev). One event per executed step of a jit
// program: a fused kernel (named by its equations) or a library kernel (its primitive), on the
// thread that ran it, with the jit function's name and its operands' and results' shapes.
//
//   profiler::start();
//   for (...) step(params, batch);
//   profiler::export_chrome_trace("train.trace.json");
//
// CJAX_PROFILE=<file.json> records from the start of the process and writes the file at exit.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace cjax::profiler {

// Primitives that ran on the host because their operands' platform has no kernel for them yet
// (operands copied to cpu:0, outputs copied back), counted since the process started, whether
// or not the profiler is recording. CJAX_LOG_FALLBACKS=1 names each one on stderr.
int64_t host_fallback_count();

struct Event {
  std::string name;                      // "fused[mul add tanh]" or the primitive, e.g. "dot_general"
  std::string jit;                       // the jit function's name
  std::string shapes;                    // operands and results: "f32[64,128] f32[128,512] -> f32[64,512]"
  double start_us = 0, duration_us = 0;  // since start()
  uint64_t thread = 0;
};

void start();  // clears the recorded events and records from now on
void stop();
bool enabled();
std::vector<Event> events();
// Writes {"traceEvents": [...]} with complete ("X") events (args: "jit", "shapes"); raises IoError
// naming the file.
void export_chrome_trace(const std::string& path);

}  // namespace cjax::profiler
