// The CPU's KernelCompiler/KernelModule (core/backend/backend.h): jit's fused kernels as one LLVM module
// (llvm_codegen.cpp), launched over the intra-op thread pool.
//
// A kernel whose output may be written over an input (KernelOutput::in_place_of) is compiled for
// that aliasing; when jit gives the output a buffer of its own (the input is still held
// elsewhere), the launch runs a variant that writes every output to its own buffer, compiled on
// first need.
#include <fmt/format.h>

#include <fstream>
#include <mutex>

#include "backends/cpu/kernels/scratch.h"
#include "backends/cpu/llvm_codegen.h"
#include "core/backend/parallel.h"

namespace cjax {
namespace {

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

class CpuKernelModule final : public KernelModule {
 public:
  CpuKernelModule(std::span<const KernelSpec* const> specs, std::string dump_base) : dump_base_(std::move(dump_base)) {
    for (const KernelSpec* s : specs) specs_.push_back(*s);
    std::vector<const KernelSpec*> ptrs;
    for (const KernelSpec& s : specs_) ptrs.push_back(&s);
    std::string ir;
    compiled_ = compile_kernels(ptrs, dump_base_.empty() ? nullptr : &ir);
    if (!ir.empty()) write_file(dump_base_ + ".ll", ir);
    from_cache = compiled_.from_cache;
    compile_ms = compiled_.compile_ms;
    for (size_t k = 0; k < specs_.size(); ++k) out_of_place_.push_back(std::make_unique<Variant>());
  }

  bool has_kernel(size_t) const override { return true; }

  void launch(size_t k, std::span<void* const> buffers, Stream&) const override {
    const KernelSpec& spec = specs_[k];
    bool aliased = true;
    for (size_t o = 0; o < spec.outputs.size(); ++o)
      if (int r = spec.outputs[o].in_place_of; r >= 0)
        aliased = aliased && buffers[spec.inputs.size() + o] == buffers[size_t(r)];
    KernelFn fn = aliased ? compiled_.fns[k] : out_of_place(k);
    int64_t rows = spec.rows(), cols = spec.cols;
    if (rows == 0 || (cols == 0 && !spec.has_reduction)) return;
    size_t scratch_bytes = size_t(spec.scratch_bytes());
    void** bufs = const_cast<void**>(buffers.data());
    auto call = [&](int64_t rb, int64_t re, int64_t cb, int64_t ce) {
      // 64-byte aligned: a row pass stores whole vectors there (softmax's exps), and from a
      // 16-byte aligned block every 64-byte vector split over two cache lines (~11% slower rows).
      thread_local cpu::ScratchBuffer scratch;
      scratch.reserve(scratch_bytes);
      fn(bufs, scratch.data(), rb, re, cb, ce);
    };
    constexpr int64_t kGrain = int64_t(1) << 14;  // elements per task
    if (!spec.has_reduction && rows < 4 * num_threads() && cols >= 2 * kGrain)
      kernel_parallel_for(cols, kGrain, [&](int64_t b, int64_t e) { call(0, rows, b, e); });
    else
      kernel_parallel_for(rows, std::max<int64_t>(1, kGrain / std::max<int64_t>(cols, 1)),
                          [&](int64_t b, int64_t e) { call(b, e, 0, cols); });
  }

 private:
  struct Variant {
    std::once_flag once;
    CompiledKernels compiled;
  };

  KernelFn out_of_place(size_t k) const {
    const KernelSpec& spec = specs_[k];
    bool has_in_place = false;
    for (const KernelOutput& o : spec.outputs) has_in_place = has_in_place || o.in_place_of >= 0;
    if (!has_in_place) return compiled_.fns[k];
    Variant& v = *out_of_place_[k];
    std::call_once(v.once, [&] {
      KernelSpec fresh = spec;
      fresh.name += "_out_of_place";
      for (KernelOutput& o : fresh.outputs) o.in_place_of = -1;
      const KernelSpec* one = &fresh;
      std::string ir;
      v.compiled = compile_kernels(std::span<const KernelSpec* const>(&one, 1), dump_base_.empty() ? nullptr : &ir);
      if (!ir.empty()) write_file(dump_base_ + "." + fresh.name + ".ll", ir);
    });
    return v.compiled.fns[0];
  }

  std::vector<KernelSpec> specs_;
  std::string dump_base_;
  CompiledKernels compiled_;
  std::vector<std::unique_ptr<Variant>> out_of_place_;
};

class LlvmKernelCompiler final : public KernelCompiler {
 public:
  std::shared_ptr<const KernelModule> compile(const Device&, std::span<const KernelSpec* const> specs,
                                              const std::string& dump_base) override {
    return std::make_shared<CpuKernelModule>(specs, dump_base);
  }
};

}  // namespace

KernelCompiler& llvm_kernel_compiler() {
  static LlvmKernelCompiler c;
  return c;
}

}  // namespace cjax
