// Lockstep runs of shard_map bodies (Executable::run_lockstep): the body's instructions between two
// collectives run for every device, devices spread over the thread pool, then the collectives run
// once for all devices.
//
// Values that are the same on several devices are computed once and shared. A step's results
// vary along a set of the body's manual axes, worked out from how values flow at run time rather
// than from their types: an all_gather's or a psum's result is the same on every member of its
// group (the group is combined once and every member gets a view), so it varies only along the
// axes its operand varies along, less the collective's axes; a pvary changes the type, not the
// value; a body input varies along the axes its in_spec names (also where the body's types are
// unchecked, as sharded jit's are); each result of a fused kernel varies as the inputs it reads.
// Each step then runs
//  - once, on device 0, with its kernels spread over the pool, when its results vary along no
//    axis (an optimizer update of a replicated parameter, the transpose of an all-gathered weight
//    in FSDP);
//  - on one device per class, when they vary along some axes only: the devices whose coordinates
//    along the other axes are 0 compute it, and the devices that differ from them only along
//    those axes get views of their results. Under tensor parallelism, the activations after the
//    psum over 'tensor' (the residual add, the norm, the logits and the loss) are computed on the
//    fsdp devices of tensor index 0, not twice over, as Megatron's sequence parallelism would
//    avoid too, without changing the program;
//  - on every device otherwise.
// A step that a class-wise step of the same segment reads runs on every device that reads it (its
// class includes the reader's), so each device's class-wise steps need no other device's results.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <string_view>
#include <unordered_map>

#include "cjax/profiler.h"
#include "cjax/sharding.h"
#include "core/array/array_impl.h"
#include "core/array/spmd.h"
#include "core/array/trace.h"
#include "core/backend/parallel.h"
#include "core/lax/linalg.h"
#include "core/spmd/collectives.h"
#include "jit/executable.h"
#include "jit/profile_internal.h"

namespace cjax {
namespace {

// How a collective's result varies across its group: the same on every member (combined or
// gathered once), one per member, or as its type says (a collective this table does not know).
enum class GroupResult { Same, PerMember, Typed };
GroupResult group_result(const PrimitiveDef& def) {
  static const std::unordered_map<std::string_view, GroupResult> known{
      {"psum", GroupResult::Same},
      {"psum_invariant", GroupResult::Same},
      {"pmax", GroupResult::Same},
      {"pmin", GroupResult::Same},
      {"all_gather", GroupResult::Same},
      {"all_gather_invariant", GroupResult::Same},
      {"pbroadcast", GroupResult::Same},
      {"reduce_scatter", GroupResult::PerMember},
      {"ppermute", GroupResult::PerMember},
      {"all_to_all", GroupResult::PerMember},
      {"axis_index", GroupResult::PerMember},
  };
  auto it = known.find(def.name);
  return it == known.end() ? GroupResult::Typed : it->second;
}

// How output `o` of collective `def` over `group` (an axis mask) varies, its operands varying
// along `in`; `typed`: the output's type says (`typed_vma`, where every axis checks types).
uint64_t collective_variation(const PrimitiveDef& def, uint64_t in, uint64_t group, bool typed, uint64_t typed_vma) {
  switch (group_result(def)) {
    case GroupResult::Same: return in & ~group;
    case GroupResult::PerMember: return in | group;
    case GroupResult::Typed: break;
  }
  return typed ? typed_vma : ~uint64_t(0);
}

// Bit k set for each of `names` that is axes[k].
uint64_t axes_mask(const std::vector<ManualAxis>& axes, const std::vector<std::string>& names) {
  uint64_t m = 0;
  for (const std::string& n : names)
    for (size_t k = 0; k < axes.size(); ++k)
      if (axes[k].name == n) m |= uint64_t(1) << k;
  return m;
}

// Whether the variation of a body's values can be worked out: by their in_specs where the runner
// gave them (`by_spec`), else by their types, which say so only where every manual axis checks
// varying axes (with check_vma off, every type is unvarying).
bool variation_known(const std::vector<ManualAxis>& axes, bool by_spec) {
  bool typed = std::all_of(axes.begin(), axes.end(), [](const ManualAxis& a) { return a.check_vma; });
  return !axes.empty() && axes.size() <= 64 && (typed || by_spec) &&
         std::none_of(axes.begin(), axes.end(), [](const ManualAxis& a) { return a.batch; });
}

}  // namespace

std::vector<uint64_t> Executable::step_variation(const std::vector<ManualAxis>& axes) const {
  constexpr uint64_t kEveryAxis = ~uint64_t(0);
  std::vector<uint64_t> vary(program_.size(), kEveryAxis);
  bool typed = std::all_of(axes.begin(), axes.end(), [](const ManualAxis& a) { return a.check_vma; });
  bool by_spec = input_axes_.size() == in_slots_.size() && !in_slots_.empty();
  if (!variation_known(axes, by_spec)) return vary;
  auto mask_of = [&](const std::vector<std::string>& names) { return axes_mask(axes, names); };
  const Jaxpr& j = *optimized_;
  std::vector<uint64_t> slot(num_slots_, 0);  // constants: the same everywhere
  for (size_t k = 0; k < in_slots_.size(); ++k)
    slot[size_t(in_slots_[k])] = mask_of(by_spec ? input_axes_[k] : j.invars()[k].aval().vma);
  for (size_t i = 0; i < program_.size(); ++i) {
    const Instr& instr = program_[i];
    uint64_t in = 0;
    for (int s : instr.inputs)
      if (s >= 0) in |= slot[size_t(s)];
    std::vector<uint64_t> out(instr.outputs.size(), in);
    if (instr.kernel >= 0) {
      // A fused kernel may compute independent results side by side: each varies only as the
      // inputs it reads do.
      const KernelSpec& spec = plan_.kernels[size_t(instr.kernel)].spec;
      std::vector<uint64_t> node(spec.nodes.size(), 0);
      for (size_t n = 0; n < spec.nodes.size(); ++n) {
        const KernelNode& kn = spec.nodes[n];
        if (kn.op == KernelNode::Op::Load && instr.inputs[size_t(kn.input)] >= 0)
          node[n] = slot[size_t(instr.inputs[size_t(kn.input)])];
        for (int a : kn.args) node[n] |= node[size_t(a)];
      }
      for (size_t o = 0; o < out.size(); ++o) out[o] = node[size_t(spec.outputs[o].node)];
    } else if (instr.def && needs_all_devices(*instr.def)) {
      uint64_t group = mask_of(collective_axes(instr.params));
      for (size_t o = 0; o < out.size(); ++o)
        out[o] = collective_variation(*instr.def, in, group, typed, mask_of(plan_.steps[i].eqn.outputs[o].aval().vma));
    }
    vary[i] = 0;
    for (size_t o = 0; o < out.size(); ++o) {
      vary[i] |= out[o];
      if (instr.outputs[o] >= 0) slot[size_t(instr.outputs[o])] = out[o];
    }
  }
  return vary;
}

// A GEMM copies its right operand into [batch, K, N] order when it is stored otherwise (a weight's
// dX product, B = W^T: LIBXSMM's packing; a q/k/v projection's [3, D, n, H] weight: a permuted
// copy). In a body run in lockstep every device did so for its own GEMM, also where the operand is
// the same on several devices (a replicated or all-gathered weight): 8 virtual devices transposed
// each weight 8 times a step (2-core Zen 4, AVX2, FSDP transformer sample: 2.5% of the step's
// CPU time). Here such an operand gets an explicit transpose into that order, which the lockstep
// runs once per class of devices that share the operand (plan_lockstep_phases), and the GEMM
// reads it in place. Operands varying along every axis of the mesh, and bodies whose values'
// variation is unknown (unchecked types and no in_specs), are left as they were.
std::shared_ptr<const Jaxpr> Executable::pretranspose_shared_operands(std::shared_ptr<const Jaxpr> jaxpr) const {
  // Not for GPUs: cuBLASLt reads a transposed operand in place.
  if (default_device().platform() != Platform::cpu) return jaxpr;
  std::vector<ManualAxis> axes = manual_axes_in_scope();
  uint64_t every_axis = 0;
  for (size_t k = 0; k < axes.size() && k < 64; ++k)
    if (axes[k].size > 1) every_axis |= uint64_t(1) << k;
  bool typed = std::all_of(axes.begin(), axes.end(), [](const ManualAxis& a) { return a.check_vma; });
  bool by_spec = input_axes_.size() == jaxpr->invars().size() && !input_axes_.empty();
  if (every_axis == 0 || !variation_known(axes, by_spec)) return jaxpr;
  auto mask_of = [&](const std::vector<std::string>& names) { return axes_mask(axes, names); };
  std::unordered_map<const void*, uint64_t> vary;  // by Var; constants vary along no axis
  for (size_t k = 0; k < jaxpr->invars().size(); ++k)
    vary[jaxpr->invars()[k].id()] = mask_of(by_spec ? input_axes_[k] : jaxpr->invars()[k].aval().vma);
  auto vary_of = [&](const Atom& a) -> uint64_t {
    auto* v = std::get_if<Var>(&a);
    if (!v) return 0;
    auto it = vary.find(v->id());
    return it == vary.end() ? 0 : it->second;
  };
  std::unordered_map<std::string, Var> transposed;  // "<operand id>/<permutation>" -> its transpose
  std::vector<JaxprEqn> eqns;
  bool changed = false;
  for (const JaxprEqn& e : jaxpr->eqns()) {
    uint64_t in = 0;
    for (const Atom& a : e.inputs) in |= vary_of(a);
    for (size_t o = 0; o < e.outputs.size(); ++o) {
      uint64_t out = in;
      if (needs_all_devices(*e.primitive))
        out = collective_variation(*e.primitive, in, mask_of(collective_axes(e.params)), typed,
                                   mask_of(e.outputs[o].aval().vma));
      vary[e.outputs[o].id()] = out;
    }
    const std::string& name = e.primitive->name;
    const Var* rhs = e.inputs.size() >= 2 ? std::get_if<Var>(&e.inputs[1]) : nullptr;
    if ((name != "dot_general" && name != "dot_general_accumulate") || !rhs ||
        (vary_of(*rhs) & every_axis) == every_axis) {
      eqns.push_back(e);
      continue;
    }
    const auto& dn = *e.params.object<DotDimsParam>("dimension_numbers");
    const AbstractValue& rv = rhs->aval();
    GemmDims d = gemm_dims(atom_aval(e.inputs[0]).shape, rv.shape, dn);
    std::optional<GemmOperand> view = gemm_operand_view(rv.shape, dn.rhs_batch, dn.rhs_contracting, d.rhs_free);
    if (d.K == 0 || (view && !view->trans)) {
      eqns.push_back(e);
      continue;
    }
    std::vector<int64_t> perm = dn.rhs_batch;  // [batch..., K..., N...]
    perm.insert(perm.end(), dn.rhs_contracting.begin(), dn.rhs_contracting.end());
    perm.insert(perm.end(), d.rhs_free.begin(), d.rhs_free.end());
    std::string key = fmt::format("{}/{}", rhs->id(), fmt::join(perm, ","));
    auto it = transposed.find(key);
    if (it == transposed.end()) {
      AbstractValue t = rv;
      for (size_t k = 0; k < perm.size(); ++k) t.shape[k] = rv.shape[size_t(perm[k])];
      Var out(std::move(t));
      JaxprEqn tr;
      tr.primitive = find_primitive("transpose");
      tr.inputs = {*rhs};
      tr.outputs = {out};
      tr.params = Params{{"permutation", perm}};
      tr.source_info = e.source_info;
      vary[out.id()] = vary_of(*rhs);
      eqns.push_back(std::move(tr));
      it = transposed.emplace(key, out).first;
    }
    auto laid_out = std::make_shared<DotDimsParam>(dn);
    int64_t nb = int64_t(dn.rhs_batch.size()), nk = int64_t(dn.rhs_contracting.size());
    for (int64_t k = 0; k < nb; ++k) laid_out->rhs_batch[size_t(k)] = k;
    for (int64_t k = 0; k < nk; ++k) laid_out->rhs_contracting[size_t(k)] = nb + k;
    JaxprEqn dot = e;
    dot.inputs[1] = it->second;
    dot.params.set("dimension_numbers", std::shared_ptr<const ParamObject>(std::move(laid_out)));
    eqns.push_back(std::move(dot));
    changed = true;
  }
  if (!changed) return jaxpr;
  return std::make_shared<const Jaxpr>(jaxpr->constvars(), jaxpr->invars(), std::move(eqns), jaxpr->outvars());
}

void Executable::plan_lockstep_phases() {
  LockstepPhase phase;
  std::vector<bool> group_output(num_slots_, false);
  auto next_phase = [&](size_t i) {
    lockstep_phases_.push_back(std::move(phase));
    phase = LockstepPhase();
    phase.begin = phase.end = i;
    std::fill(group_output.begin(), group_output.end(), false);
  };
  for (size_t i = 0; i < program_.size(); ++i) {
    const Instr& instr = program_[i];
    if (!instr.def || !needs_all_devices(*instr.def)) {
      if (!phase.collectives.empty()) next_phase(i);  // compute after a group
      phase.end = i + 1;
      continue;
    }
    bool reads_group =
        std::any_of(instr.inputs.begin(), instr.inputs.end(), [&](int s) { return s >= 0 && group_output[size_t(s)]; });
    if (reads_group) next_phase(i);  // a collective of a collective's result: a group of its own
    phase.collectives.push_back(i);
    for (int s : instr.outputs)
      if (s >= 0) group_output[size_t(s)] = true;
  }
  lockstep_phases_.push_back(std::move(phase));

  std::vector<ManualAxis> axes = manual_axes_in_scope();
  uint64_t every_axis = 0;  // the axes along which devices differ (size 1 axes never do)
  for (size_t k = 0; k < axes.size() && k < 64; ++k) {
    lockstep_axes_.push_back(axes[k].name);
    if (axes[k].size > 1) every_axis |= uint64_t(1) << k;
  }
  std::vector<uint64_t> vary = step_variation(axes);
  for (LockstepPhase& p : lockstep_phases_) {
    // Classes: a step runs wherever a class-wise reader in its segment does (its class grows to
    // include the reader's), and a step reading a result of its segment runs where that result's
    // step does, or on every device if that step does (it runs after them); until neither changes.
    std::vector<uint64_t> cls(p.end - p.begin);
    std::unordered_map<int, size_t> producer;  // slot -> step of this segment
    for (size_t i = p.begin; i < p.end; ++i) {
      cls[i - p.begin] = vary[i] & every_axis;
      for (int s : program_[i].outputs)
        if (s >= 0) producer[s] = i;
    }
    for (bool changed = true; changed;) {
      changed = false;
      auto widen = [&](size_t i, uint64_t c) {
        uint64_t& mine = cls[i - p.begin];
        if ((mine | c) != mine) mine |= c, changed = true;
      };
      for (size_t i = p.end; i-- > p.begin;) {
        uint64_t c = cls[i - p.begin];
        for (int s : program_[i].inputs) {
          auto it = s >= 0 ? producer.find(s) : producer.end();
          if (it == producer.end()) continue;
          uint64_t pc = cls[it->second - p.begin];
          if (c != 0 && c != every_axis && pc != 0) widen(it->second, c);
          if (pc != 0) widen(i, pc == every_axis ? every_axis : pc);
        }
      }
    }
    for (size_t i = p.begin; i < p.end; ++i) {
      uint64_t c = cls[i - p.begin];
      if (c == 0) {
        p.once.push_back(i);
      } else if (c == every_axis) {
        p.each.push_back(i);
      } else {
        auto known = std::find(lockstep_classes_.begin(), lockstep_classes_.end(), c);
        p.by_class.push_back(i);
        p.by_class_kind.push_back(size_t(known - lockstep_classes_.begin()));
        if (known == lockstep_classes_.end()) lockstep_classes_.push_back(c);
      }
    }
    // Steps run ahead of per-device steps that precede them in the program keep the operands
    // those still read, and release theirs after the segment.
    auto held_operands = [&](size_t i, const std::vector<size_t>& earlier_readers) {
      std::vector<int> held;
      for (int s : program_[i].release) {
        p.late_release.push_back(s);
        bool read_before = std::any_of(earlier_readers.begin(), earlier_readers.end(), [&](size_t e) {
          return e < i && std::count(program_[e].inputs.begin(), program_[e].inputs.end(), s) > 0;
        });
        if (read_before) held.push_back(s);
      }
      return held;
    };
    std::vector<size_t> after_once = p.each;
    after_once.insert(after_once.end(), p.by_class.begin(), p.by_class.end());
    for (size_t i : p.once) {
      p.held.push_back(held_operands(i, after_once));
      for (int s : program_[i].outputs)
        if (s >= 0) p.shared_outputs.push_back(s);
    }
    for (size_t i : p.by_class) p.by_class_held.push_back(held_operands(i, p.each));
  }
}
void Executable::run_collective_group(const LockstepPhase& phase, const Mesh& mesh, const std::vector<ManualAxis>& axes,
                                      bool backward, std::vector<std::vector<Array>>& slots) const {
  size_t n = slots.size(), m = phase.collectives.size();
  std::vector<std::vector<std::vector<Array>>> outs(m);
  auto run_one = [&](size_t g) {
    const Instr& instr = program_[phase.collectives[g]];
    std::vector<std::vector<Array>> group_in(n);
    for (size_t d = 0; d < n; ++d) group_in[d] = operands(instr, slots[d]);
    bool profiling = profiler::enabled();
    std::string shapes = profiling ? instr_shapes(instr, slots[0]) : std::string();
    ProfileScope timing(profiling);
    outs[g] = run_collective_on_all_devices(*instr.def, instr.params, group_in, instr.out_avals, mesh, true,
                                            backward || instr.backward);
    if (profiling) timing.record(instr.def->name, name_, std::move(shapes));
  };
  // Each collective of the group on its own pool task (its own work then runs serially); the
  // collective recorder sees them one at a time, in program order.
  if (m == 1 || collective_observer_set()) {
    for (size_t g = 0; g < m; ++g) run_one(g);
  } else {
    parallel_for(int64_t(m), 1, [&](int64_t b, int64_t e) {
      AxisEnvScope env(axes);
      TraceScope eval(eval_trace());
      for (int64_t g = b; g < e; ++g) run_one(size_t(g));
    });
  }
  for (size_t g = 0; g < m; ++g) {
    const Instr& instr = program_[phase.collectives[g]];
    for (size_t d = 0; d < n; ++d) {
      for (size_t k = 0; k < outs[g][d].size(); ++k) slots[d][size_t(instr.outputs[k])] = std::move(outs[g][d][k]);
    }
  }
  for (size_t c : phase.collectives)
    for (size_t d = 0; d < n; ++d)
      for (int s : program_[c].release) slots[d][size_t(s)] = Array();
}

std::vector<std::vector<int64_t>> Executable::class_leaders(const Mesh& mesh) const {
  size_t n = size_t(mesh.size());
  std::vector<std::vector<int64_t>> leaders;
  for (uint64_t c : lockstep_classes_) {
    // The mesh axes a class keeps (the others are set to 0 in its leader's coordinates).
    std::vector<bool> kept(mesh.shape().size(), false);
    for (size_t k = 0; k < lockstep_axes_.size(); ++k)
      if (int a = mesh.axis_index(lockstep_axes_[k]); a >= 0 && (c >> k & 1)) kept[size_t(a)] = true;
    std::vector<int64_t> leader(n);
    for (size_t d = 0; d < n; ++d) {
      std::vector<int64_t> coords = mesh.coords(int64_t(d));
      int64_t flat = 0;
      for (size_t a = 0; a < coords.size(); ++a) flat = flat * mesh.shape()[a] + (kept[a] ? coords[a] : 0);
      leader[d] = flat;
    }
    leaders.push_back(std::move(leader));
  }
  return leaders;
}

std::vector<std::vector<Array>> Executable::run_lockstep(const Mesh& mesh, const std::vector<ManualAxis>& axes,
                                                         bool backward, bool parallel,
                                                         std::vector<std::vector<Array>> inputs) const {
  size_t n = inputs.size();
  AxisEnvScope env(axes);
  std::vector<std::vector<Array>> slots(n);
  std::vector<std::vector<bool>> donated(n);
  for (size_t d = 0; d < n; ++d) {
    bind_inputs(inputs[d], {}, slots[d], donated[d]);
    inputs[d].clear();
  }
  TraceScope scope(eval_trace());
  std::vector<std::vector<int64_t>> leaders = class_leaders(mesh);  // per class kind, per device
  // Runs `body(d)` for every device, one pool task per device when `parallel`.
  auto for_devices = [&](const auto& body) {
    auto range = [&](int64_t b, int64_t e) {
      for (int64_t d = b; d < e; ++d) {
        SpmdScope spmd({&mesh, d, nullptr, backward});
        body(size_t(d));
      }
    };
    if (!parallel) return range(0, int64_t(n));
    parallel_for(int64_t(n), 1, [&](int64_t b, int64_t e) {
      AxisEnvScope env(axes);
      TraceScope eval(eval_trace());
      range(b, e);
    });
  };
  // Runs a step ahead of its place in the program, keeping the operands in `held` alive.
  auto run_ahead = [&](size_t i, const std::vector<int>& held_slots, size_t d) {
    std::vector<Array> held;
    for (int s : held_slots) held.push_back(slots[d][size_t(s)]);
    run_instr(program_[i], slots[d], donated[d]);
    for (size_t h = 0; h < held.size(); ++h) slots[d][size_t(held_slots[h])] = std::move(held[h]);
  };
  // The program splits at its collectives into segments in which the devices are independent:
  // each device runs a whole segment on one pool thread (its kernels serially: the devices are
  // the parallelism), and the devices meet only at the collectives, which schedule_collectives
  // gathered into as few groups as the data allows. Meeting at every instruction instead cost a
  // pool barrier per instruction (~25% idle time in the transformer's FSDP step, mostly in small
  // optimizer kernels).
  auto run_segment = [&](const LockstepPhase& phase) {
    if (!phase.once.empty()) {  // on device 0, each kernel spread over the pool
      SpmdScope spmd({&mesh, 0, nullptr, backward});
      for (size_t k = 0; k < phase.once.size(); ++k) run_ahead(phase.once[k], phase.held[k], 0);
      for (int s : phase.shared_outputs)
        if (slots[0][size_t(s)].defined())
          for (size_t d = 1; d < n; ++d) slots[d][size_t(s)] = shared_on_device(slots[0][size_t(s)], mesh.devices()[d]);
    }
    if (!phase.by_class.empty()) {  // on each class's leader, then shared with its members
      for_devices([&](size_t d) {
        for (size_t k = 0; k < phase.by_class.size(); ++k)
          if (size_t(leaders[phase.by_class_kind[k]][d]) == d) run_ahead(phase.by_class[k], phase.by_class_held[k], d);
      });
      for (size_t k = 0; k < phase.by_class.size(); ++k)
        for (int s : program_[phase.by_class[k]].outputs)
          for (size_t d = 0; s >= 0 && d < n; ++d)
            if (size_t l = size_t(leaders[phase.by_class_kind[k]][d]); l != d && slots[l][size_t(s)].defined())
              slots[d][size_t(s)] = shared_on_device(slots[l][size_t(s)], mesh.devices()[d]);
    }
    if (!phase.each.empty())
      for_devices([&](size_t d) {
        for (size_t i : phase.each) run_instr(program_[i], slots[d], donated[d]);
      });
    for (int s : phase.late_release)
      for (size_t d = 0; d < n; ++d) slots[d][size_t(s)] = Array();
  };
  for (const LockstepPhase& phase : lockstep_phases_) {
    run_segment(phase);
    if (!phase.collectives.empty()) run_collective_group(phase, mesh, axes, backward, slots);
  }
  std::vector<std::vector<Array>> outs(n);
  for (size_t d = 0; d < n; ++d) outs[d] = collect_outputs(slots[d]);
  return outs;
}

}  // namespace cjax
