// A jit program on a device as one recorded launch (CUDA graphs; docs/cuda.md "CUDA graphs").
//
// A program of many small kernels spends its time in the host's launches; recorded once, it runs
// again with one launch and no host work per instruction. The recording (Backend::begin_recording)
// is made at the program's second call on the device (the first compiles its kernels and warms
// the libraries' caches) and replayed from then on:
//  - the recorded program reads copies of its arguments made at its start and writes its results
//    through copies at its end; a replay points those copies at the call's arguments and at new
//    result buffers, so nothing the caller holds is overwritten (a result takes the buffer of a
//    donated argument of its type and size, as the instruction-by-instruction run does);
//  - intermediates live in the recording's own memory, allocated and freed inside it.
// A program qualifies when it issues at least two launches, has no effects and no collectives,
// runs outside shard_map bodies, and its arguments and results (which each replay copies) come to
// at most kGraphCopyBytesPerLaunch per launch (a program of few large kernels gains nothing).
// A recording that fails (an operation that reads device memory on the host, a host fallback, a
// library that cannot be recorded) leaves the program to run instruction by instruction, for
// good; CJAX_LOG_GRAPHS=1 prints each program recorded and each refusal with its reason.
// CJAX_CUDA_GRAPHS=0 turns recording off.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdio>

#include "cjax/errors.h"
#include "core/array/array_impl.h"
#include "core/array/kernel_table.h"
#include "core/array/spmd.h"
#include "core/array/util.h"
#include "jit/executable.h"

namespace cjax {
namespace {

constexpr size_t kGraphCopyBytesPerLaunch = size_t(4) << 20;

std::atomic<int64_t> g_replays{0};

void log_graph(const std::string& line) {
  static const bool on = env_flag("CJAX_LOG_GRAPHS");
  if (on) std::fprintf(stderr, "cjax: %s\n", line.c_str());
}

size_t bytes_of(const AbstractValue& a) { return size_t(a.size()) * itemsize(a.dtype); }

}  // namespace

int64_t Executable::graph_replays() { return g_replays.load(); }

void Executable::plan_graph(bool collectives) {
  bool literal_outputs = std::any_of(out_slots_.begin(), out_slots_.end(), [](int s) { return s < 0; });
  if (has_effects_ || collectives || literal_outputs || program_.size() < 2) return;
  size_t copy_bytes = 0;  // what each replay copies in and out
  for (const Var& v : optimized_->invars()) copy_bytes += bytes_of(v.aval());
  for (const Atom& a : optimized_->outvars()) {
    graph_out_avals_.push_back(std::get<Var>(a).aval());
    graph_out_avals_.back().vma.clear();
    copy_bytes += bytes_of(graph_out_avals_.back());
  }
  if (copy_bytes <= program_.size() * kGraphCopyBytesPerLaunch) graph_launches_ = program_.size();
}

std::optional<std::vector<Array>> Executable::run_as_graph(const DeviceProgram& program, const Device& d,
                                                           std::span<const Array> args,
                                                           std::span<const size_t> donated) const {
  if (graph_launches_ < 2 || args.size() != in_slots_.size() || current_spmd() || !env_not_off("CJAX_CUDA_GRAPHS"))
    return std::nullopt;
  for (const Array& a : args)
    if (ConcreteArray* c = concrete(a); !c || c->buffers.size() != 1) return std::nullopt;
  std::vector<Array> placed(args.begin(), args.end());

  std::lock_guard lock(program.graph_mu);
  // Recorded once a call has run to its end: its kernels are loaded and the libraries' lazy state
  // (cuBLASLt's handle and workspace) exists, so none of it is made inside the recording.
  if (program.graph_failed || (!program.graph && !program.ran_once)) return std::nullopt;
  // Uncommitted host arguments follow to the device first (outside the recording).
  for (size_t i = 0; i < placed.size(); ++i)
    if (concrete(placed[i])->device() != d) {
      note_follow_transfer(name_, placed[i], d);
      placed[i] = device_put(placed[i], SingleDeviceSharding(d));
    }
  // Results: a donated argument's buffer where type and size match, else new buffers.
  std::vector<Array> results;
  std::vector<bool> taken(placed.size(), false);
  for (const AbstractValue& aval : graph_out_avals_) {
    std::shared_ptr<Buffer> reuse;
    for (size_t k : donated)
      if (k < placed.size() && !taken[k] && placed[k].dtype() == aval.dtype && placed[k].aval().size() == aval.size() &&
          exclusively_held(concrete(placed[k])->buffer())) {
        taken[k] = true;
        reuse = concrete(placed[k])->buffer();
        break;
      }
    results.push_back(reuse ? Array(std::make_shared<ConcreteArray>(aval, reuse)) : make_uninitialized(aval, d));
  }
  if (!program.graph) {
    try {
      program.graph = record_on_device(program, d, placed, results);
      log_graph(
          fmt::format("jit '{}' on {}: recorded as one CUDA graph ({} launches)", name_, d.str(), graph_launches_));
    } catch (const Error& e) {
      program.graph_failed = true;
      log_graph(fmt::format("jit '{}' on {}: runs instruction by instruction: {}", name_, d.str(), e.what()));
      return std::nullopt;
    }
  }
  std::vector<const void*> in_ptrs;
  std::vector<void*> out_ptrs;
  for (const Array& a : placed) in_ptrs.push_back(raw_ptr(a));
  for (const Array& r : results) out_ptrs.push_back(raw_ptr(r));
  try {
    program.graph->replay(in_ptrs, out_ptrs);
  } catch (const Error& e) {  // nothing was launched: run it instruction by instruction
    program.graph.reset();
    program.graph_failed = true;
    log_graph(fmt::format("jit '{}' on {}: a replay failed, runs instruction by instruction from now on: {}", name_,
                          d.str(), e.what()));
    return std::nullopt;
  }
  g_replays.fetch_add(1, std::memory_order_relaxed);
  return results;
}

std::unique_ptr<RecordedWork> Executable::record_on_device(const DeviceProgram& program, const Device& d,
                                                           std::span<const Array> args,
                                                           std::span<const Array> results) const {
  std::unique_ptr<WorkRecording> recording = backend_for(d.platform()).begin_recording(d);
  if (!recording) throw BackendError(fmt::format("{} cannot record work", d.str()));
  {
    // Everything below is released before the recording ends (declared inside it).
    std::vector<Array> slots(num_slots_);
    std::vector<bool> donated(num_slots_, false);
    for (size_t i = 0; i < program.consts.size(); ++i) slots[i] = program.consts[i];
    for (size_t i = 0; i < args.size(); ++i) {
      Array copy = make_uninitialized(args[i].aval(), d);
      recording->copy_in(raw_ptr(args[i]), raw_ptr(copy), bytes_of(args[i].aval()));
      slots[size_t(in_slots_[i])] = std::move(copy);
    }
    run_device_instrs(program, d, slots, donated);
    std::vector<Array> outs = collect_outputs(slots);
    slots.clear();
    for (size_t i = 0; i < outs.size(); ++i) {
      ConcreteArray* c = concrete(outs[i]);
      if (!c || c->buffers.size() != 1 || c->device() != d)
        throw BackendError(fmt::format("output {} is not in {}'s memory (a host fallback?)", i, d.str()));
      recording->copy_out(raw_ptr(outs[i]), raw_ptr(results[i]), bytes_of(outs[i].aval()));
    }
  }
  return recording->finish();
}

}  // namespace cjax
