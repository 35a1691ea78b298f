#include "jit/executable.h"

#include <fmt/format.h>

#include <unordered_map>

#include "cjax/sharding.h"
#include "core/array_impl.h"
#include "jit/passes.h"
#include "trace/trace.h"

namespace cjax {

Executable::Executable(const ClosedJaxpr& traced) : optimized_(optimize(*traced)), consts_(traced.consts) {
  const Jaxpr& j = *optimized_;
  std::unordered_map<const void*, int> slot;
  auto new_slot = [&](const Var& v) {
    int s = int(num_slots_++);
    slot[v.id()] = s;
    return s;
  };
  for (const Var& v : j.constvars()) new_slot(v);
  for (const Var& v : j.invars()) {
    in_slots_.push_back(new_slot(v));
    in_avals_.push_back(v.aval());
  }
  for (const JaxprEqn& e : j.eqns()) {
    Instr in{e.primitive, {}, {}, {}, {}, {}, e.params};
    for (const Atom& a : e.inputs) {
      if (auto* v = std::get_if<Var>(&a)) {
        in.inputs.push_back(slot.at(v->id()));
        in.literals.emplace_back();
      } else {
        in.inputs.push_back(-1);
        in.literals.push_back(std::get<Literal>(a).value());
      }
    }
    for (const Var& v : e.outputs) {
      in.out_avals.push_back(v.aval());
      in.out_avals.back().vma.clear();  // run-time values are per device: varying axes are a trace-time type
      in.outputs.push_back(new_slot(v));
    }
    program_.push_back(std::move(in));
  }
  for (const Atom& a : j.outvars()) {
    if (auto* v = std::get_if<Var>(&a)) {
      out_slots_.push_back(slot.at(v->id()));
      out_literals_.emplace_back();
    } else {
      out_slots_.push_back(-1);
      out_literals_.push_back(std::get<Literal>(a).value());
    }
  }
  // Liveness: each slot is released after the last instruction reading it, unless it is an output.
  std::vector<int> last_use(num_slots_, -1);
  for (size_t i = 0; i < program_.size(); ++i)
    for (int s : program_[i].inputs)
      if (s >= 0) last_use[size_t(s)] = int(i);
  for (int s : out_slots_)
    if (s >= 0) last_use[size_t(s)] = int(program_.size());
  for (size_t s = 0; s < num_slots_; ++s)
    if (last_use[s] >= 0 && last_use[s] < int(program_.size())) program_[size_t(last_use[s])].release.push_back(int(s));
}

std::vector<Array> Executable::run(std::span<const Array> args) const {
  if (args.size() != in_slots_.size())
    throw ValueError(fmt::format("jit: the compiled function takes {} arrays, got {}", in_slots_.size(), args.size()));
  std::vector<Array> slots(num_slots_);
  for (size_t i = 0; i < consts_.size(); ++i) slots[i] = consts_[i];
  for (size_t i = 0; i < args.size(); ++i) {
    ConcreteArray* c = concrete(args[i]);
    if (!c) throw Error("internal: Executable::run on a non-concrete argument");
    if (c->buffers.empty()) raise_deleted(fmt::format("jit argument {}", i));
    slots[size_t(in_slots_[i])] = args[i];
  }
  TraceScope scope(eval_trace());
  std::vector<Array> in;
  for (const Instr& instr : program_) {
    in.clear();
    for (size_t k = 0; k < instr.inputs.size(); ++k)
      in.push_back(instr.inputs[k] >= 0 ? slots[size_t(instr.inputs[k])] : instr.literals[k]);
    // Kernels read one buffer: an intermediate sharded by a shard_map goes through the eager
    // per-shard path (or its ShardingError) rather than being read from its first shard.
    bool sharded = false;
    for (const Array& x : in) sharded = sharded || concrete(x)->buffers.size() > 1;
    std::vector<Array> outs = instr.def->cpu_impl && !sharded
                                  ? instr.def->cpu_impl(in, instr.out_avals, instr.params)
                                  : cjax::bind(*instr.def, in, instr.params);
    for (size_t k = 0; k < outs.size(); ++k) slots[size_t(instr.outputs[k])] = std::move(outs[k]);
    for (int s : instr.release) slots[size_t(s)] = Array();
  }
  std::vector<Array> result;
  result.reserve(out_slots_.size());
  for (size_t i = 0; i < out_slots_.size(); ++i)
    result.push_back(out_slots_[i] >= 0 ? slots[size_t(out_slots_[i])] : out_literals_[i]);
  return result;
}

void delete_array(const Array& a, std::string_view donated_to) {
  ConcreteArray* c = concrete(a);
  if (!c) return;
  (void)donated_to;
  c->buffers.clear();
}

}  // namespace cjax
