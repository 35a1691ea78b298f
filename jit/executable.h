// Executable: what jit runs for one signature (docs/design.md §5.5).
//
// Construction: passes (jit/passes.h) -> fusion plan (jit/fusion.h) -> one module with every
// fused kernel of the program, from the platform's KernelCompiler (core/backend/backend.h; the CPU's is
// LLVM, compiled at construction; a GPU's NVRTC, on the first call there; cached in memory and
// on disk). The plan is
// lowered once into a flat list of instructions over numbered value slots (inputs, literals and
// output types resolved ahead of time, each slot released after its last use), so a call does
// no lookups and no abstract evaluation and keeps no dead intermediate alive. An instruction is
// either a fused kernel, run over the intra-op thread pool (rows, or columns for elementwise
// kernels with few rows), or one equation run by its library kernel (BLAS, gather, sort,
// collectives, control flow).
//
// Memory: a kernel writes its output into the buffer of an input that dies at that instruction
// (or was donated) when the two have the same type and index map; other buffers come from the
// device's caching allocator, so steady-state steps allocate nothing new.
//
// CJAX_DUMP=<dir> writes, per compilation, the jaxpr after passes, the fusion plan, each
// kernel's KernelSpec and the LLVM IR before and after optimization.
#pragma once
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cjax/make_jaxpr.h"
#include "cjax/sharding.h"
#include "core/array/kernel_table.h"
#include "core/array/spmd.h"
#include "core/backend/backend.h"
#include "jit/fusion.h"
#include "trace/jaxpr.h"

namespace cjax {

class Executable {
 public:
  // `name` labels dumps and profiles (the jit function's name).
  // `input_axes`: for a shard_map body, the mesh axes each input's block varies along (its
  // in_spec's), where known; they decide which steps a lockstep run shares between devices.
  explicit Executable(const ClosedJaxpr& traced, std::string name = "jit",
                      std::vector<std::vector<std::string>> input_axes = {});
  // Runs on concrete inputs (one per invar of the traced jaxpr) on the caller's thread. The
  // buffers of `donated` arguments may be reused for outputs. Arguments on a device platform
  // (a GPU) run the program there: see run_on_device.
  std::vector<Array> run(std::span<const Array> args, std::span<const size_t> donated = {}) const;
  // The device of the arguments when it is not host memory (the program then runs there); with
  // no argument placed anywhere, the default device if it is not host memory; else nullopt.
  // Committed arguments on two devices raise BackendError naming both.
  static std::optional<Device> device_of_arguments(std::span<const Array> args);
  // A shard_map body run for every device of `mesh` in lockstep: the program splits at its
  // collectives into segments; each segment runs for devices 0..n-1 (on the caller's thread, or
  // with `parallel` on the thread pool, one device per task, the device's instructions in order),
  // then the collective once for all devices from their blocks. This replaces n worker threads
  // that meet at every collective: with 8 devices on 2 cores those spend their time in context
  // switches and waits (cached dispatch of a tiny body: ~140 us -> 13 us; the FSDP transformer
  // sample: +20%, and +25% more from meeting only at collectives instead of every instruction). `can_run_lockstep()`
  // says whether the body qualifies: no effects (debug prints keep their per-device order on threads) and no collective
  // inside control flow (a device's branch or trip count decides which collectives it reaches).
  bool can_run_lockstep() const { return lockstep_; }
  // `axes`: the manual axes bound while it runs. With `parallel`, each instruction's per-device
  // instances run on the thread pool.
  std::vector<std::vector<Array>> run_lockstep(const Mesh& mesh, const std::vector<ManualAxis>& axes, bool backward,
                                               bool parallel, std::vector<std::vector<Array>> inputs) const;
  const Jaxpr& jaxpr() const { return *optimized_; }
  const FusionPlan& plan() const { return plan_; }
  // The CPU's kernel module (compile_ms, from_cache).
  const KernelModule& compiled() const;
  const std::string& name() const { return name_; }
  // The program has effects (debug::print...): jit runs it synchronously, so what it prints is
  // ordered with what the host prints.
  bool has_effects() const { return has_effects_; }
  // The program does so little work (estimated below kCheapProgramCost scalar operations) that
  // handing it to a dispatch thread would cost more than running it: jit runs it on the caller's
  // thread, as XLA's CPU client does with its cheap computations.
  bool cheap() const { return cheap_; }
  static constexpr double kCheapProgramCost = 2000;

 private:
  struct Instr {
    const PrimitiveDef* def = nullptr;            // library step
    const PrimitiveKernel* cpu_kernel = nullptr;  // its CPU implementation (null: bind it)
    int kernel = -1;                              // fused kernel step
    std::vector<int> inputs;                      // slot per input (-1: a literal from `literals`)
    std::vector<Array> literals;                  // by input position
    std::vector<AbstractValue> out_avals;
    std::vector<int> outputs;  // slot per output (-1: unused)
    std::vector<int> release;  // slots dead after this instruction
    Params params;
    bool backward = false;  // a collective of a backward pass (trace/phase.h): recorded as such
  };
  void lower_to_program();
  void bind_inputs(std::span<const Array> args, std::span<const size_t> donated_args, std::vector<Array>& slots,
                   std::vector<bool>& donated) const;
  void run_instr(const Instr& instr, std::vector<Array>& slots, std::vector<bool>& donated) const;
  // In a shard_map body: GEMM operands shared by devices, transposed once (executable_lockstep.cpp).
  std::shared_ptr<const Jaxpr> pretranspose_shared_operands(std::shared_ptr<const Jaxpr> jaxpr) const;
  // The instruction's operands: its slots' values, literals where it has them.
  std::vector<Array> operands(const Instr& instr, const std::vector<Array>& slots) const;
  std::string instr_shapes(const Instr& instr, const std::vector<Array>& slots) const;  // for profiles
  struct ShapeLabels {
    std::mutex mu;
    std::vector<std::optional<std::string>> labels;  // by instruction, once profiled
  };
  std::unique_ptr<ShapeLabels> shapes_ = std::make_unique<ShapeLabels>();
  std::vector<Array> collect_outputs(const std::vector<Array>& slots) const;
  bool run_gemm_update_in_place(const Instr& instr, std::vector<Array>& slots, std::vector<bool>& donated) const;
  bool gemm_update_may_reuse(const Instr& instr, const std::vector<Array>& slots,
                             const std::vector<bool>& donated) const;
  const PrimitiveDef* gemm_update_ = find_primitive("dot_general_accumulate");
  // Fused kernel step with `module`'s code; `target`: the device a device program runs on (its
  // host inputs follow there), null for the CPU.
  void run_kernel(const KernelModule& module, const Device* target, const Instr& in, std::vector<Array>& slots,
                  std::vector<bool>& donated) const;
  void run_kernel_unfused(const Instr& in, std::vector<Array>& slots) const;

  // On a device platform: the fused kernels compiled by the platform's KernelCompiler on first
  // use (one module per device), and the program's constants copied there once. Library steps
  // run through the eager dispatcher: the platform's kernel, or a counted host fallback.
  struct DeviceProgram {
    std::shared_ptr<const KernelModule> module;
    std::vector<Array> consts;
    // The program recorded as a CUDA graph (run_as_graph), replayed under graph_mu.
    mutable std::mutex graph_mu;
    mutable std::unique_ptr<RecordedWork> graph;
    mutable bool ran_once = false;  // a call ran to its end instruction by instruction
    mutable bool graph_failed = false;
  };
  const DeviceProgram& device_program(const Device& d) const;
  std::vector<Array> run_on_device(const Device& d, std::span<const Array> args, std::span<const size_t> donated) const;
  void run_device_instrs(const DeviceProgram& program, const Device& d, std::vector<Array>& slots,
                         std::vector<bool>& donated) const;
  // The program as one recorded launch (jit/executable_graph.cpp): from its second call on a
  // device that records (CUDA graphs), where it qualifies; nullopt: run it instruction by
  // instruction.
  std::optional<std::vector<Array>> run_as_graph(const DeviceProgram& program, const Device& d,
                                                 std::span<const Array> args, std::span<const size_t> donated) const;
  std::unique_ptr<RecordedWork> record_on_device(const DeviceProgram& program, const Device& d,
                                                 std::span<const Array> args, std::span<const Array> results) const;
  // Whether output o of the kernel may take its input's buffer (nothing else holds it).
  bool may_write_in_place(const Instr& in, const std::vector<Array>& slots, const std::vector<bool>& donated) const;

  std::vector<std::vector<std::string>> input_axes_;  // as given to the constructor
  std::string name_;
  std::shared_ptr<const Jaxpr> optimized_;
  FusionPlan plan_;
  std::shared_ptr<const KernelModule> module_;  // the CPU's, null without kernels
  std::vector<Array> consts_;
  std::vector<Array> host_consts_;  // host copies when some constant lives on a device, else empty
  std::vector<Instr> program_;
  std::vector<int> in_slots_;
  std::vector<int> out_slots_;  // -1: literal output
  std::vector<Array> out_literals_;
  size_t num_slots_ = 0;
  struct DevicePrograms {
    std::mutex mu;
    std::map<std::pair<int, int>, std::unique_ptr<DeviceProgram>> by_device;  // (platform, id)
  };
  std::unique_ptr<DevicePrograms> device_programs_ = std::make_unique<DevicePrograms>();
  std::string dump_base_;  // CJAX_DUMP: path prefix of this executable's files, else empty
  bool has_effects_ = false;
  bool cheap_ = false;
  bool lockstep_ = false;
  // A lockstep run (jit/executable_lockstep.cpp): each phase runs program_[begin, end) per device,
  // then its collectives (one group: none reads another's result) once for all devices, side by
  // side. Steps whose results vary along no manual axis run once, on device 0, before the
  // others; steps whose results vary along some axes only run on one device per class of devices
  // that differ only along those axes; the other devices get views of their results.
  struct LockstepPhase {
    size_t begin = 0, end = 0;
    std::vector<size_t> collectives;
    std::vector<size_t> once, each;               // the segment's steps the same everywhere, and per device
    std::vector<std::vector<int>> held;           // per `once` step: its dying operands a later-run step still reads
    std::vector<int> shared_outputs;              // results of `once` steps
    std::vector<size_t> by_class;                 // the steps run once per class
    std::vector<size_t> by_class_kind;            // per such step: its class, an index into lockstep_classes_
    std::vector<std::vector<int>> by_class_held;  // per such step: its dying operands a per-device step reads
    std::vector<int> late_release;  // operands dying at steps run ahead of their place, released after the segment
  };
  // Per instruction: the manual axes (bit k: axes[k]) along which any of its results differs
  // between devices; every bit where unknown.
  std::vector<uint64_t> step_variation(const std::vector<ManualAxis>& axes) const;
  std::vector<LockstepPhase> lockstep_phases_;
  std::vector<std::string> lockstep_axes_;  // the manual axes, in the order of the class bits
  std::vector<uint64_t> lockstep_classes_;  // the distinct classes of by_class steps (their axes)
  // Per class: each device's class leader (flat mesh index), which runs the class's steps.
  std::vector<std::vector<int64_t>> class_leaders(const Mesh& mesh) const;
  void plan_lockstep_phases();
  void run_collective_group(const LockstepPhase& phase, const Mesh& mesh, const std::vector<ManualAxis>& axes,
                            bool backward, std::vector<std::vector<Array>>& slots) const;
  // Launches the program issues (instructions), or 0 where it never runs as a recorded graph
  // (effects, collectives, literal outputs, too much to copy per replay: plan_graph), and the
  // result types a replay allocates.
  void plan_graph(bool collectives);
  size_t graph_launches_ = 0;
  std::vector<AbstractValue> graph_out_avals_;

 public:
  // Calls that ran as a replay of a recorded graph, in this process (tests, benchmarks).
  static int64_t graph_replays();
};

// Fusion and code generation on (default) or off (CJAX_DISABLE_FUSION=1: every equation runs its
// library kernel; for debugging and side-by-side benchmarks).
void set_fusion_enabled(bool enabled);
bool fusion_enabled();

// Marks a donated array deleted: its buffers are released and later uses raise ValueError.
void delete_array(const Array& a, std::string_view donated_to);

}  // namespace cjax
