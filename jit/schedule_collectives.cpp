#include "jit/schedule_collectives.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <unordered_map>

#include "core/spmd/collectives.h"
#include "trace/shard_map.h"

namespace cjax {
namespace {

struct StepIo {
  std::vector<const void*> inputs, outputs;
  bool collective = false;
  int64_t in_bytes = 0, out_bytes = 0;
};

int64_t bytes_of(const AbstractValue& a) { return a.size() * int64_t(itemsize(a.dtype)); }

StepIo io_of(const PlanStep& s, const std::vector<FusedKernel>& kernels) {
  StepIo io;
  if (s.kernel >= 0) {
    const FusedKernel& k = kernels[size_t(s.kernel)];
    for (const Var& v : k.inputs) io.inputs.push_back(v.id());
    for (const Var& v : k.outputs) io.outputs.push_back(v.id());
    return io;
  }
  for (const Atom& a : s.eqn.inputs)
    if (const Var* v = std::get_if<Var>(&a)) {
      io.inputs.push_back(v->id());
      io.in_bytes += bytes_of(v->aval());
    }
  for (const Var& v : s.eqn.outputs) {
    io.outputs.push_back(v.id());
    io.out_bytes += bytes_of(v.aval());
  }
  io.collective = needs_all_devices(*s.eqn.primitive);
  return io;
}

// The order keeps steps whose relative position matters where they are: effects (debug prints
// keep their order) and control flow whose body meets the other devices.
bool pins_order(const PlanStep& s) {
  if (s.kernel >= 0) return false;
  const PrimitiveDef& p = *s.eqn.primitive;
  return p.effectful || (p.kind == PrimKind::HigherOrder && needs_communicator(p, s.eqn.params));
}

class Scheduler {
 public:
  Scheduler(const FusionPlan& plan, int64_t max_group_bytes) : n_(plan.steps.size()), max_bytes_(max_group_bytes) {
    io_.reserve(n_);
    for (size_t i = 0; i < n_; ++i) {
      io_.push_back(io_of(plan.steps[i], plan.kernels));
      for (const void* v : io_[i].outputs) producer_[v] = i;
      if (io_[i].collective) waiting_.push_back(i);
    }
    emitted_.assign(n_, false);
    is_pending_.assign(n_, false);
  }

  std::vector<size_t> order() {
    refresh();
    for (size_t s = 0; s < n_; ++s) {
      if (io_[s].collective) continue;
      // Collectives the program ran before this step hold their operands alive until they run.
      std::vector<size_t> late;
      int64_t held = 0;
      for (size_t c : pending_)
        if (c < s) {
          late.push_back(c);
          held += io_[c].in_bytes;
        }
      if (held > max_bytes_) flush(late);
      while (waits_for_collective(s)) {
        std::vector<size_t> needed;
        std::vector<bool> seen(n_, false);
        for (const void* v : io_[s].inputs) collect_needed(v, needed, seen);
        if (needed.empty()) throw Error("internal: schedule_collectives found no collective to run");
        flush(needed);
      }
      emit(s);
      refresh();
    }
    while (!pending_.empty()) flush(pending_);
    if (order_.size() != n_) throw Error("internal: schedule_collectives left steps unscheduled");
    return std::move(order_);
  }

 private:
  bool waits_for_collective(size_t s) const {
    return std::any_of(io_[s].inputs.begin(), io_[s].inputs.end(), [&](const void* v) {
      auto it = producer_.find(v);
      return it != producer_.end() && !emitted_[it->second];
    });
  }

  // The pending collectives step `v`'s value waits for (through collectives not yet ready).
  void collect_needed(const void* v, std::vector<size_t>& needed, std::vector<bool>& seen) {
    auto it = producer_.find(v);
    if (it == producer_.end() || emitted_[it->second] || seen[it->second]) return;
    size_t p = it->second;
    seen[p] = true;
    if (!io_[p].collective) throw Error("internal: schedule_collectives reached a step out of order");
    if (is_pending_[p]) {
      needed.push_back(p);
      return;
    }
    for (const void* u : io_[p].inputs) collect_needed(u, needed, seen);
  }

  void emit(size_t i) {
    emitted_[i] = true;
    order_.push_back(i);
  }

  // Collectives whose operands are all computed become pending (in program order).
  void refresh() {
    std::vector<size_t> still;
    for (size_t c : waiting_) {
      bool ready = std::all_of(io_[c].inputs.begin(), io_[c].inputs.end(), [&](const void* v) {
        auto it = producer_.find(v);
        return it == producer_.end() || emitted_[it->second];
      });
      if (!ready) {
        still.push_back(c);
        continue;
      }
      is_pending_[c] = true;
      pending_.insert(std::upper_bound(pending_.begin(), pending_.end(), c), c);
    }
    waiting_ = std::move(still);
  }

  // Runs `required` now, with the other pending collectives that fit in the group's bytes.
  void flush(std::vector<size_t> required) {
    std::vector<bool> take(n_, false);
    int64_t bytes = 0;
    for (size_t c : required) {
      take[c] = true;
      bytes += io_[c].out_bytes;
    }
    for (size_t c : pending_)
      if (!take[c] && bytes + io_[c].out_bytes <= max_bytes_) {
        take[c] = true;
        bytes += io_[c].out_bytes;
      }
    std::vector<size_t> rest;
    for (size_t c : pending_) {
      if (!take[c]) {
        rest.push_back(c);
        continue;
      }
      is_pending_[c] = false;
      emit(c);
    }
    pending_ = std::move(rest);
    refresh();
  }

  size_t n_;
  int64_t max_bytes_;
  std::vector<StepIo> io_;
  std::unordered_map<const void*, size_t> producer_;
  std::vector<bool> emitted_, is_pending_;
  std::vector<size_t> waiting_, pending_, order_;  // collectives: not ready, ready
};

}  // namespace

void schedule_collectives(FusionPlan& plan, int64_t max_group_bytes) {
  if (max_group_bytes <= 0) return;
  size_t collectives = 0;
  for (const PlanStep& s : plan.steps) {
    if (pins_order(s)) return;
    collectives += s.kernel < 0 && needs_all_devices(*s.eqn.primitive);
  }
  if (collectives < 2) return;
  std::vector<size_t> order = Scheduler(plan, max_group_bytes).order();
  std::vector<PlanStep> steps;
  steps.reserve(order.size());
  for (size_t i : order) steps.push_back(std::move(plan.steps[i]));
  plan.steps = std::move(steps);
}

int64_t collective_group_bytes() {
  static const int64_t bytes = [] {
    const char* v = std::getenv("CJAX_COLLECTIVE_GROUP_MB");
    if (!v || !*v) return int64_t(32) << 20;
    char* end = nullptr;
    double mb = std::strtod(v, &end);
    if (*end || !std::isfinite(mb) || mb < 0)
      throw ValueError(fmt::format(
          "CJAX_COLLECTIVE_GROUP_MB='{}' is not a size in MiB; use a number >= 0 (0 keeps collectives in place)", v));
    return int64_t(mb * 1024 * 1024);
  }();
  return bytes;
}

}  // namespace cjax
