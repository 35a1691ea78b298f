#include "jit/executable.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <string_view>
#include <thread>
#include <unordered_map>

#include "cjax/profiler.h"
#include "cjax/sharding.h"
#include "core/array/array_impl.h"
#include "core/array/spmd.h"
#include "core/array/trace.h"
#include "core/array/util.h"
#include "core/backend/parallel.h"
#include "core/lax/linalg.h"
#include "core/spmd/collectives.h"
#include "jit/passes/passes.h"
#include "jit/profile_internal.h"
#include "jit/schedule_collectives.h"
#include "trace/phase.h"
#include "trace/shard_map.h"

namespace cjax {
namespace {

std::atomic<int> g_fusion{-1};  // -1: read CJAX_DISABLE_FUSION

// CJAX_NO_IN_PLACE=1 turns off writing outputs over dying inputs (for debugging).
bool fusion_in_place() {
  static const bool on = !env_flag("CJAX_NO_IN_PLACE");
  return on;
}

bool check_fusion() {
  static const bool on = env_flag("CJAX_CHECK_FUSION");
  return on;
}

// CJAX_DUMP=<dir>: where compilations write their jaxpr, fusion plan and LLVM IR ("" = off).
std::string dump_dir() {
  const char* d = std::getenv("CJAX_DUMP");
  return d ? d : "";
}

// "fused[mul add tanh ...]" (the first equations of a kernel) for profiles.
std::string kernel_label(const FusedKernel& k) {
  std::string s = "fused[";
  for (size_t i = 0; i < k.eqns.size() && i < 6; ++i) s += (i ? " " : "") + k.eqns[i].primitive->name;
  if (k.eqns.size() > 6) s += fmt::format(" +{}", k.eqns.size() - 6);
  return s + "]";
}

bool jaxpr_has_effects(const Jaxpr& j) {
  for (const JaxprEqn& e : j.eqns()) {
    if (e.primitive->effectful) return true;
    for (const Jaxpr* sub : jaxprs_in_params(e.params))
      if (jaxpr_has_effects(*sub)) return true;
  }
  return false;
}

// A rough count of the scalar operations one run performs: elements produced, plus 2*M*N*K for
// contractions (over-estimated from the operand sizes), bodies of calls and shard_maps once (they
// run concurrently per device), loops as unbounded. Only used to tell cheap programs apart.
double estimated_cost(const Jaxpr& j) {
  double cost = 0;
  for (const JaxprEqn& e : j.eqns()) {
    const std::string& name = e.primitive->name;
    if (name == "while" || name == "scan") return std::numeric_limits<double>::infinity();
    double out = 0;
    for (const Var& v : e.outputs) out += double(v.aval().size());
    cost += out;
    if (e.primitive->kind == PrimKind::Linalg && e.inputs.size() >= 2)
      cost += 2.0 * double(atom_aval(e.inputs[0]).size()) * double(atom_aval(e.inputs[1]).size()) / std::max(1.0, out);
    for (const Jaxpr* sub : jaxprs_in_params(e.params)) cost += estimated_cost(*sub);
  }
  return cost;
}

void write_file(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }

// Is `in` read at (row, col) -> row * C + col, the layout the kernel writes full outputs in?
bool same_layout_as_output(const KernelSpec& spec, const KernelInput& in) {
  if (spec.cols > 1 && in.col_stride != 1) return false;
  int64_t expect = spec.cols;
  for (size_t d = spec.outer.size(); d-- > 0;) {
    if (in.outer_strides[d] != expect) return false;
    expect *= spec.outer[d];
  }
  return true;
}

}  // namespace

void set_fusion_enabled(bool enabled) { g_fusion = enabled ? 1 : 0; }
bool fusion_enabled() {
  int v = g_fusion.load();
  if (v >= 0) return v == 1;
  return !env_flag("CJAX_DISABLE_FUSION");
}

Executable::Executable(const ClosedJaxpr& traced, std::string name, std::vector<std::vector<std::string>> input_axes)
    : input_axes_(std::move(input_axes)),
      name_(std::move(name)),
      optimized_(optimize(*splat_constants(*traced, traced.consts), traced.consts)),
      consts_(traced.consts) {
  optimized_ = pretranspose_shared_operands(std::move(optimized_));
  const Jaxpr& j = *optimized_;
  has_effects_ = jaxpr_has_effects(j);
  // Constants created on a device (CJAX_PLATFORM=cuda) get host copies for runs on the CPU.
  bool device_consts = std::any_of(consts_.begin(), consts_.end(), [](const Array& c) {
    ConcreteArray* cc = concrete(c);
    return cc && cc->buffers.size() == 1 && !host_accessible(cc->device());
  });
  if (device_consts)
    for (const Array& c : consts_) host_consts_.push_back(host_accessible(concrete(c)->device()) ? c : to_host(c));
  cheap_ = estimated_cost(j) < kCheapProgramCost;
  if (fusion_enabled()) {
    plan_ = plan_fusion(j);
  } else {
    for (const JaxprEqn& e : j.eqns()) plan_.steps.push_back({-1, e});
  }
  if (!has_effects_) schedule_collectives(plan_, collective_group_bytes());
  lower_to_program();
  lockstep_ = !has_effects_ && std::none_of(program_.begin(), program_.end(), [](const Instr& i) {
    return i.def && i.def->kind == PrimKind::HigherOrder && needs_communicator(*i.def, i.params);
  });
  bool collectives = std::any_of(program_.begin(), program_.end(), [](const Instr& i) {
    return i.def && (needs_all_devices(*i.def) ||
                     (i.def->kind == PrimKind::HigherOrder && needs_communicator(*i.def, i.params)));
  });
  plan_graph(collectives);
  if (lockstep_) plan_lockstep_phases();
  std::string dir = dump_dir();
  if (!dir.empty()) {
    static std::atomic<int> counter{0};
    std::filesystem::create_directories(dir);
    dump_base_ = fmt::format("{}/{:04d}.{}", dir, counter++, name_);
    write_file(dump_base_ + ".jaxpr.txt", j.pretty_print());
    std::string fusion = plan_.describe() + "\n";
    for (const FusedKernel& k : plan_.kernels) fusion += k.spec.name + ": " + k.spec.canonical() + "\n";
    write_file(dump_base_ + ".fusion.txt", fusion);
  }
  // The CPU's kernels are compiled now (a CPU call needs no further compilation); a device's on
  // its first call there (device_program). Meanwhile, on a thread of its own, the backend sets up
  // the libraries the program's primitives run on (backend.h: preparation), which the first run
  // would otherwise wait for: LIBXSMM's ~7 ms for a GEMM (a fresh process's first MLP step from
  // the disk cache: 21-23 ms -> 17-18 ms on a 2-core Zen 5).
  if (!plan_.kernels.empty()) {
    std::vector<std::string_view> primitives;
    for (const Instr& i : program_)
      if (i.def) primitives.push_back(i.def->name);
    std::jthread preparing;
    if (std::function<void()> job = backend_for(Platform::cpu).preparation(primitives))
      preparing = std::jthread(std::move(job));
    std::vector<const KernelSpec*> specs;
    for (const FusedKernel& k : plan_.kernels) specs.push_back(&k.spec);
    module_ = backend_for(Platform::cpu).kernel_compiler()->compile(host_device(), specs, dump_base_);
  }
}

const KernelModule& Executable::compiled() const {
  struct NoKernels final : KernelModule {
    void launch(size_t, std::span<void* const>, Stream&) const override {}
    bool has_kernel(size_t) const override { return false; }
  };
  static const NoKernels none;
  return module_ ? *module_ : none;
}

void Executable::lower_to_program() {
  const Jaxpr& j = *optimized_;
  std::unordered_map<const void*, int> slot;
  auto new_slot = [&](const Var& v) {
    int s = int(num_slots_++);
    slot[v.id()] = s;
    return s;
  };
  auto run_time_aval = [](const Var& v) {
    AbstractValue a = v.aval();
    a.vma.clear();  // run-time values are per device: varying axes are a trace-time type
    return a;
  };
  for (const Var& v : j.constvars()) new_slot(v);
  for (const Var& v : j.invars()) in_slots_.push_back(new_slot(v));
  for (const PlanStep& step : plan_.steps) {
    Instr in;
    if (step.kernel >= 0) {
      const FusedKernel& k = plan_.kernels[size_t(step.kernel)];
      in.kernel = step.kernel;
      for (const Var& v : k.inputs) {
        in.inputs.push_back(slot.at(v.id()));
        in.literals.emplace_back();
      }
      for (const Var& v : k.outputs) {
        in.out_avals.push_back(run_time_aval(v));
        in.outputs.push_back(new_slot(v));
      }
    } else {
      const JaxprEqn& e = step.eqn;
      in.def = e.primitive;
      in.cpu_kernel = find_implementation(*e.primitive, Platform::cpu);
      in.params = e.params;
      in.backward = e.primitive->kind == PrimKind::Collective && is_backward(e.source_info.get());
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
        in.out_avals.push_back(run_time_aval(v));
        in.outputs.push_back(new_slot(v));
      }
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
  // In-place candidates: a full output may take the buffer of an input read with the same layout
  // and type that dies here (checked again at run time: nothing else may hold that buffer).
  // Only single-pass kernels: a later pass would read an input the first pass overwrote.
  for (size_t i = 0; i < program_.size(); ++i) {
    Instr& in = program_[i];
    if (in.kernel < 0) continue;
    const KernelSpec& spec = plan_.kernels[size_t(in.kernel)].spec;
    if (!fusion_in_place()) continue;
    if (spec.num_passes != 1) continue;
    std::vector<bool> taken(in.inputs.size(), false);
    for (size_t o = 0; o < spec.outputs.size(); ++o) {
      if (!spec.outputs[o].full) continue;
      for (size_t k = 0; k < in.inputs.size(); ++k) {
        int s = in.inputs[k];
        bool dies = std::count(in.release.begin(), in.release.end(), s) > 0;
        bool once = std::count(in.inputs.begin(), in.inputs.end(), s) == 1;
        if (taken[k] || !dies || !once || spec.inputs[k].dtype != spec.outputs[o].dtype ||
            !same_layout_as_output(spec, spec.inputs[k]))
          continue;
        taken[k] = true;
        plan_.kernels[size_t(in.kernel)].spec.outputs[o].in_place_of = int(k);
        break;
      }
    }
  }
}

void Executable::run_kernel_unfused(const Instr& in, std::vector<Array>& slots) const {
  // Sharded operands (an intermediate a shard_map left split over devices): the member equations
  // run one by one through the eager per-shard path, until sharded jit partitions programs.
  const FusedKernel& k = plan_.kernels[size_t(in.kernel)];
  std::unordered_map<const void*, Array> env;
  for (size_t i = 0; i < k.inputs.size(); ++i) env[k.inputs[i].id()] = slots[size_t(in.inputs[i])];
  for (const JaxprEqn& e : k.eqns) {
    std::vector<Array> ins;
    for (const Atom& a : e.inputs)
      ins.push_back(std::holds_alternative<Var>(a) ? env.at(std::get<Var>(a).id()) : std::get<Literal>(a).value());
    std::vector<Array> outs = cjax::bind(*e.primitive, ins, e.params);
    for (size_t o = 0; o < outs.size(); ++o) env[e.outputs[o].id()] = std::move(outs[o]);
  }
  for (size_t o = 0; o < k.outputs.size(); ++o) slots[size_t(in.outputs[o])] = env.at(k.outputs[o].id());
}

// An in-place output takes its input's buffer when nothing else holds it (an intermediate that
// dies here, or a donated argument); otherwise the kernel writes a buffer of its own.
bool Executable::may_write_in_place(const Instr& in, const std::vector<Array>& slots,
                                    const std::vector<bool>& donated) const {
  for (const KernelOutput& ko : plan_.kernels[size_t(in.kernel)].spec.outputs) {
    if (ko.in_place_of < 0) continue;
    int s = in.inputs[size_t(ko.in_place_of)];
    const Array& a = slots[size_t(s)];
    ConcreteArray* c = concrete(a);
    if (!(exclusively_held(c->buffer()) && (a.impl_ptr().use_count() == 1 || donated[size_t(s)]))) return false;
  }
  return true;
}

void Executable::run_kernel(const KernelModule& module, const Device* target, const Instr& in,
                            std::vector<Array>& slots, std::vector<bool>& donated) const {
  if (!module.has_kernel(size_t(in.kernel))) return run_kernel_unfused(in, slots);  // no code for it here
  const KernelSpec& spec = plan_.kernels[size_t(in.kernel)].spec;
  std::vector<Array> reference;
  bool checking = check_fusion() && !target;
  if (checking) {  // on copies, before the kernel, which may write over a dying input
    reference.resize(slots.size());
    for (int s : in.inputs) {
      const Array& x = slots[size_t(s)];
      ConcreteArray* c = concrete(x);
      reference[size_t(s)] = c->buffers.size() == 1 ? make_from_host(c->buffer()->data(), x.aval(), c->device()) : x;
    }
    run_kernel_unfused(in, reference);
  }
  std::vector<void*> bufs;
  bufs.reserve(in.inputs.size() + in.outputs.size());
  Device dev = target ? *target : host_device();
  bool have_dev = target != nullptr;
  for (int s : in.inputs) {
    ConcreteArray* c = concrete(slots[size_t(s)]);
    if (c->buffers.empty()) raise_deleted(fmt::format("jit '{}'", name_));
    if (c->buffers.size() > 1) return run_kernel_unfused(in, slots);
    if (target && c->device() != *target) {  // an uncommitted host value (a host fallback's) follows
      note_follow_transfer(kernel_label(plan_.kernels[size_t(in.kernel)]), slots[size_t(s)], *target);
      slots[size_t(s)] = device_put(slots[size_t(s)], SingleDeviceSharding(*target));
      c = concrete(slots[size_t(s)]);
    }
    bufs.push_back(c->buffer()->data());
    if (!have_dev) dev = c->device();
    have_dev = true;
  }
  bool in_place = may_write_in_place(in, slots, donated);
  std::vector<Array> outs;
  for (size_t o = 0; o < in.outputs.size(); ++o) {
    if (int r = spec.outputs[o].in_place_of; r >= 0 && in_place) {
      outs.emplace_back(
          std::make_shared<ConcreteArray>(in.out_avals[o], concrete(slots[size_t(in.inputs[size_t(r)])])->buffer()));
      continue;
    }
    outs.push_back(make_uninitialized(in.out_avals[o], dev));
  }
  for (const Array& o : outs) bufs.push_back(raw_ptr(o));
  module.launch(size_t(in.kernel), bufs, backend_for(dev.platform()).stream(dev));
  if (checking) {
    // CJAX_CHECK_FUSION=1: the member equations again, one by one, compared with the kernel.
    const FusedKernel& k = plan_.kernels[size_t(in.kernel)];
    for (size_t o = 0; o < outs.size(); ++o) {
      std::vector<double> got = outs[o].to_vector<double>(),
                          want = reference[size_t(in.outputs[o])].to_vector<double>();
      for (size_t i = 0; i < got.size(); ++i)
        if (!(std::fabs(got[i] - want[i]) <= 1e-5 * (1 + std::fabs(want[i]))) &&
            !(std::isnan(got[i]) && std::isnan(want[i])))
          throw Error(
              fmt::format("CJAX_CHECK_FUSION: kernel {} of jit '{}' output {} element {} is {}, its equations give "
                          "{}\n{}\n{}",
                          spec.name, name_, o, i, got[i], want[i], plan_.describe(), k.spec.canonical()));
    }
  }
  for (size_t o = 0; o < outs.size(); ++o) slots[size_t(in.outputs[o])] = std::move(outs[o]);
}

void Executable::bind_inputs(std::span<const Array> args, std::span<const size_t> donated_args,
                             std::vector<Array>& slots, std::vector<bool>& donated) const {
  if (args.size() != in_slots_.size())
    throw ValueError(fmt::format("jit: the compiled function takes {} arrays, got {}", in_slots_.size(), args.size()));
  slots.assign(num_slots_, Array());
  donated.assign(num_slots_, false);
  for (size_t i = 0; i < consts_.size(); ++i) slots[i] = host_consts_.empty() ? consts_[i] : host_consts_[i];
  for (size_t i = 0; i < args.size(); ++i) {
    ConcreteArray* c = concrete(args[i]);
    if (!c) throw Error("internal: Executable::run on a non-concrete argument");
    if (c->buffers.empty()) raise_deleted(fmt::format("jit argument {}", i));
    slots[size_t(in_slots_[i])] = args[i];
  }
  for (size_t i : donated_args) donated[size_t(in_slots_[i])] = true;
}

// dot_general_accumulate (jit/passes.h fuse_gemm_updates) over an accumulator that nothing else
// holds (an intermediate dying here, or a donated argument): the GEMM adds into its buffer, which
// becomes the output. Otherwise the primitive's kernel accumulates into a new buffer.
bool Executable::gemm_update_may_reuse(const Instr& instr, const std::vector<Array>& slots,
                                       const std::vector<bool>& donated) const {
  int s = instr.inputs[2];
  if (s < 0 || std::find(instr.release.begin(), instr.release.end(), s) == instr.release.end()) return false;
  for (int k : {instr.inputs[0], instr.inputs[1]})
    if (k < 0 || k == s) return false;
  const Array& acc = slots[size_t(s)];
  ConcreteArray* c = concrete(acc);
  if (c->buffers.size() != 1 || !exclusively_held(c->buffer()) ||
      !(acc.impl_ptr().use_count() == 1 || donated[size_t(s)]))
    return false;
  const Array &lhs = slots[size_t(instr.inputs[0])], &rhs = slots[size_t(instr.inputs[1])];
  return concrete(lhs)->buffers.size() == 1 && concrete(rhs)->buffers.size() == 1;
}

bool Executable::run_gemm_update_in_place(const Instr& instr, std::vector<Array>& slots,
                                          std::vector<bool>& donated) const {
  if (!gemm_update_may_reuse(instr, slots, donated)) return false;
  const PrimitiveKernel* update = find_kernel(instr.def->name, Platform::cpu);
  if (!update) return false;
  std::vector<Array> in = operands(instr, slots);
  // The GEMM adds into the accumulator's buffer, which nothing else holds.
  Params params = instr.params;
  params.set("accumulate_in_place", true);
  slots[size_t(instr.outputs[0])] = (*update)(in, instr.out_avals, params)[0];
  for (int r : instr.release) slots[size_t(r)] = Array();
  return true;
}

std::vector<Array> Executable::operands(const Instr& instr, const std::vector<Array>& slots) const {
  std::vector<Array> in;
  in.reserve(instr.inputs.size());
  for (size_t k = 0; k < instr.inputs.size(); ++k)
    in.push_back(instr.inputs[k] >= 0 ? slots[size_t(instr.inputs[k])] : instr.literals[k]);
  return in;
}

std::string Executable::instr_shapes(const Instr& instr, const std::vector<Array>& slots) const {
  // Formatted at the step's first profiled run and kept: the shapes are the same on every run, and
  // formatting them each time would widen the gaps between a profile's events.
  size_t i = size_t(&instr - program_.data());
  std::lock_guard lock(shapes_->mu);
  if (shapes_->labels.size() != program_.size()) shapes_->labels.resize(program_.size());
  std::optional<std::string>& label = shapes_->labels[i];
  if (!label) label = shapes_label(operands(instr, slots), instr.out_avals);
  return *label;
}

void Executable::run_instr(const Instr& instr, std::vector<Array>& slots, std::vector<bool>& donated) const {
  bool profiling = profiler::enabled();
  std::string shapes = profiling ? instr_shapes(instr, slots) : std::string();
  ProfileScope timing(profiling);
  if (instr.kernel >= 0) {
    run_kernel(*module_, nullptr, instr, slots, donated);
    if (profiling) timing.record(kernel_label(plan_.kernels[size_t(instr.kernel)]), name_, std::move(shapes));
  } else if (instr.def == gemm_update_ && run_gemm_update_in_place(instr, slots, donated)) {
    if (profiling) timing.record(instr.def->name, name_, std::move(shapes));
  } else {
    std::vector<Array> in = operands(instr, slots);
    // Kernels read one buffer: an intermediate sharded by a shard_map goes through the eager
    // per-shard path (or its ShardingError) rather than being read from its first shard.
    bool sharded = false;
    for (const Array& x : in) sharded = sharded || concrete(x)->buffers.size() > 1;
    std::optional<SpmdScope> phase;  // a backward pass's collective in a program that is not one
    if (instr.backward)
      if (const SpmdContext* ctx = current_spmd(); ctx && !ctx->backward) {
        SpmdContext backward = *ctx;
        backward.backward = true;
        phase.emplace(backward);
      }
    std::vector<Array> outs = instr.cpu_kernel && !sharded ? (*instr.cpu_kernel)(in, instr.out_avals, instr.params)
                                                           : cjax::bind(*instr.def, in, instr.params);
    for (size_t k = 0; k < outs.size(); ++k) slots[size_t(instr.outputs[k])] = std::move(outs[k]);
    if (profiling) timing.record(instr.def->name, name_, std::move(shapes));
  }
  for (int s : instr.release) slots[size_t(s)] = Array();
}

std::vector<Array> Executable::collect_outputs(const std::vector<Array>& slots) const {
  std::vector<Array> result;
  result.reserve(out_slots_.size());
  for (size_t i = 0; i < out_slots_.size(); ++i)
    result.push_back(out_slots_[i] >= 0 ? slots[size_t(out_slots_[i])] : out_literals_[i]);
  return result;
}

std::vector<Array> Executable::run(std::span<const Array> args, std::span<const size_t> donated_args) const {
  if (std::optional<Device> d = device_of_arguments(args)) return run_on_device(*d, args, donated_args);
  std::vector<Array> slots;
  std::vector<bool> donated;
  bind_inputs(args, donated_args, slots, donated);
  TraceScope scope(eval_trace());
  for (const Instr& instr : program_) run_instr(instr, slots, donated);
  return collect_outputs(slots);
}

std::optional<Device> Executable::device_of_arguments(std::span<const Array> args) {
  std::optional<Device> found;
  std::optional<size_t> committed_at;
  for (size_t i = 0; i < args.size(); ++i) {
    auto* c = dynamic_cast<const ConcreteArray*>(args[i].impl());
    if (!c || c->buffers.size() != 1) continue;
    const Device& d = c->buffers[0]->device();
    if (host_accessible(d)) {
      if (c->committed && !committed_at) committed_at = i;
      continue;
    }
    if (!found) {
      found = d;
    } else if (*found != d) {
      throw BackendError(
          fmt::format("jit: arguments live on {} and {} (argument {}): a jit program runs on one device; "
                      "device_put them to one device",
                      found->str(), d.str(), i));
    }
  }
  if (found && committed_at)
    throw BackendError(
        fmt::format("jit: argument {} was placed on {} (device_put) but other arguments live on {}; a jit "
                    "program runs on one device: device_put it to {}",
                    *committed_at, concrete(args[*committed_at])->device().str(), found->str(), found->str()));
  // No argument placed anywhere (only uncommitted host values, or none): the default device, as
  // in JAX, when that is a device (CJAX_PLATFORM=cuda).
  if (!found && !committed_at) {
    Device def = default_device();
    if (!host_accessible(def)) found = def;
  }
  return found;
}

const Executable::DeviceProgram& Executable::device_program(const Device& d) const {
  std::lock_guard lock(device_programs_->mu);
  auto& slot = device_programs_->by_device[{int(d.platform()), d.id()}];
  if (slot) return *slot;
  auto p = std::make_unique<DeviceProgram>();
  if (!plan_.kernels.empty()) {
    std::vector<const KernelSpec*> specs;
    for (const FusedKernel& k : plan_.kernels) specs.push_back(&k.spec);
    p->module = backend_for(d.platform())
                    .kernel_compiler()
                    ->compile(d, specs, dump_base_.empty() ? "" : dump_base_ + "." + d.str());
  }
  for (const Array& c : consts_) p->consts.push_back(device_put(c, SingleDeviceSharding(d)));
  slot = std::move(p);
  return *slot;
}

std::vector<Array> Executable::run_on_device(const Device& d, std::span<const Array> args,
                                             std::span<const size_t> donated_args) const {
  const DeviceProgram& program = device_program(d);
  if (std::optional<std::vector<Array>> outs = run_as_graph(program, d, args, donated_args)) return std::move(*outs);
  std::vector<Array> slots;
  std::vector<bool> donated;
  bind_inputs(args, donated_args, slots, donated);
  for (size_t i = 0; i < program.consts.size(); ++i) slots[i] = program.consts[i];
  // Uncommitted host arguments follow to the device once, not at every kernel that reads them.
  for (int s : in_slots_)
    if (ConcreteArray* c = concrete(slots[size_t(s)]); c->buffers.size() == 1 && c->device() != d) {
      note_follow_transfer(name_, slots[size_t(s)], d);
      slots[size_t(s)] = device_put(slots[size_t(s)], SingleDeviceSharding(d));
    }
  run_device_instrs(program, d, slots, donated);
  if (!program.ran_once) {
    std::lock_guard lock(program.graph_mu);
    program.ran_once = true;
  }
  std::vector<Array> outs = collect_outputs(slots);
  // Outputs that stayed on the host (literal outputs, host fallbacks) join the program's device.
  for (Array& o : outs)
    if (auto* c = dynamic_cast<ConcreteArray*>(o.impl()); c && c->buffers.size() == 1 && c->device() != d)
      o = device_put(o, SingleDeviceSharding(d));
  return outs;
}

void Executable::run_device_instrs(const DeviceProgram& program, const Device& d, std::vector<Array>& slots,
                                   std::vector<bool>& donated) const {
  TraceScope scope(eval_trace());
  bool profiling = profiler::enabled();
  for (const Instr& instr : program_) {
    std::string shapes = profiling ? instr_shapes(instr, slots) : std::string();
    ProfileScope timing(profiling);
    if (instr.kernel >= 0) {
      run_kernel(*program.module, &d, instr, slots, donated);
      if (profiling) timing.record(kernel_label(plan_.kernels[size_t(instr.kernel)]), name_, std::move(shapes));
    } else {
      std::vector<Array> in = operands(instr, slots);
      std::vector<Array> outs;
      const PrimitiveKernel* update = nullptr;
      auto on_device = [&] {
        return std::all_of(in.begin(), in.end(), [&](const Array& x) {
          ConcreteArray* c = concrete(x);
          return c->buffers.size() == 1 && c->device() == d;
        });
      };
      if (instr.def == gemm_update_ && on_device() && gemm_update_may_reuse(instr, slots, donated) &&
          (update = find_kernel(instr.def->name, d.platform()))) {
        // The platform's GEMM adds into the accumulator's buffer (D = C), which nothing else holds.
        Params params = instr.params;
        params.set("accumulate_in_place", true);
        outs = (*update)(in, instr.out_avals, params);
      } else {
        outs = cjax::bind(*instr.def, in, instr.params);
      }
      for (size_t k = 0; k < outs.size(); ++k) slots[size_t(instr.outputs[k])] = std::move(outs[k]);
      if (profiling) timing.record(instr.def->name, name_, std::move(shapes));
    }
    for (int s : instr.release) slots[size_t(s)] = Array();
  }
}

void delete_array(const Array& a, std::string_view donated_to) {
  ConcreteArray* c = concrete(a);
  if (!c) return;
  (void)donated_to;
  c->buffers.clear();
}

}  // namespace cjax
