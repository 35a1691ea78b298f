#include "backends/cpu/llvm_jit.h"

#include <fmt/format.h>
#include <llvm/ADT/StringMap.h>
#include <llvm/Analysis/CGSCCPassManager.h>
#include <llvm/Analysis/LoopAnalysisManager.h>
#include <llvm/ExecutionEngine/Orc/ExecutionUtils.h>
#include <llvm/ExecutionEngine/Orc/JITTargetMachineBuilder.h>
#include <llvm/ExecutionEngine/Orc/LLJIT.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/Passes/PassBuilder.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/SmallVectorMemoryBuffer.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Support/xxhash.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/TargetParser/Host.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <list>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "cjax/errors.h"
#include "core/array/util.h"
#include "core/backend/kernel_cache.h"

namespace cjax::cpu {
namespace {

constexpr const char* kCjaxCodegenVersion = "cjax-codegen-18";

[[noreturn]] void fail(std::string_view what, llvm::Error err) {
  std::string msg;
  llvm::raw_string_ostream os(msg);
  os << err;
  throw Error(fmt::format("LLVM JIT: {}: {}", what, os.str()));
}

struct Host {
  std::unique_ptr<llvm::orc::LLJIT> jit;
  std::unique_ptr<llvm::TargetMachine> tm;  // for the triple; compilations take their own
  std::optional<llvm::orc::JITTargetMachineBuilder> builder;
  std::string cpu, features, id;
  // A TargetMachine is not thread safe: each concurrent compilation takes one of these (made on
  // demand, kept for the next).
  std::mutex machines_mu;
  std::vector<std::unique_ptr<llvm::TargetMachine>> free_machines;

  std::unique_ptr<llvm::TargetMachine> acquire_machine() {
    std::lock_guard lk(machines_mu);
    if (!free_machines.empty()) {
      auto m = std::move(free_machines.back());
      free_machines.pop_back();
      return m;
    }
    auto made = builder->createTargetMachine();
    if (!made) fail("creating a target machine", made.takeError());
    return std::move(*made);
  }
  void release_machine(std::unique_ptr<llvm::TargetMachine> m) {
    std::lock_guard lk(machines_mu);
    free_machines.push_back(std::move(m));
  }

  Host() {
    llvm::InitializeNativeTarget();
    llvm::InitializeNativeTargetAsmPrinter();
    auto jtmb = llvm::orc::JITTargetMachineBuilder::detectHost();
    if (!jtmb) fail("detecting the host CPU", jtmb.takeError());
    if (requested_cpu_isa() == CpuIsa::Avx2) {
      llvm::StringMap<bool> host_features = llvm::sys::getHostCPUFeatures();
      if (!host_features.lookup("avx2") || !host_features.lookup("fma"))
        throw BackendError("CJAX_ISA=avx2: this CPU has no AVX2/FMA; unset CJAX_ISA");
      jtmb->setCPU("x86-64-v3");
      jtmb->setFeatures("");
    }
    jtmb->setCodeGenOptLevel(llvm::CodeGenOptLevel::Aggressive);
    // A TargetMachine made for a JIT defaults to the large code model on x86-64: every constant
    // is then reached through a 64-bit absolute address in a register, and in a vector loop with
    // many constants (exp's polynomial) the registers run out, so each iteration rematerialized
    // ~10 addresses and reloaded the constants (a row softmax ran 1.6x slower than the same IR
    // compiled ahead of time). JITLink places an object's code and constants in one block and
    // builds stubs and GOT entries for external symbols, so the small PIC model links anywhere.
    jtmb->setCodeModel(llvm::CodeModel::Small);
    jtmb->setRelocationModel(llvm::Reloc::PIC_);
    jtmb->getOptions().AllowFPOpFusion = llvm::FPOpFusion::Fast;
    cpu = jtmb->getCPU();
    features = jtmb->getFeatures().getString();
    auto machine = jtmb->createTargetMachine();
    if (!machine) fail("creating the target machine", machine.takeError());
    tm = std::move(*machine);
    builder = *jtmb;
    auto built = llvm::orc::LLJITBuilder().setJITTargetMachineBuilder(*jtmb).create();
    if (!built) fail("creating the JIT", built.takeError());
    jit = std::move(*built);
    // Kernels may call libm (the few ops without an inline approximation) and the C library.
    auto gen = llvm::orc::DynamicLibrarySearchGenerator::GetForCurrentProcess(jit->getDataLayout().getGlobalPrefix());
    if (!gen) fail("resolving process symbols", gen.takeError());
    jit->getMainJITDylib().addGenerator(std::move(*gen));
    id = fmt::format("{} {} {} llvm-{} {}", jtmb->getTargetTriple().str(), cpu, features, LLVM_VERSION_STRING,
                     kCjaxCodegenVersion);
  }
};

// Never destroyed: executables held by other statics unload their code during exit.
Host& host() {
  static Host* h = new Host;
  return *h;
}

// Each linked object gets its own JITDylib, so objects that define the same kernel names (the
// same cached module linked twice) never clash. Unloading removes the object's resource tracker
// (code, data and symbols) and returns the then empty JITDylib to a free list for the next link:
// removing JITDylibs can block on the session's dispatch in LLVM 19, and never reusing them grew
// the process by the size of one JITDylib per jit object ever built.
struct FreeDylibs {
  std::mutex mu;
  std::vector<llvm::orc::JITDylib*> free;
};
std::atomic<size_t> g_libraries_created{0};
FreeDylibs& free_dylibs() {
  static FreeDylibs* f = new FreeDylibs;  // never destroyed, like host()
  return *f;
}

class LinkedCode final : public JitCode {
 public:
  LinkedCode(llvm::orc::JITDylib* jd, llvm::orc::ResourceTrackerSP rt) : jd_(jd), rt_(std::move(rt)) {}
  ~LinkedCode() override {
    if (auto err = rt_->remove()) {
      llvm::consumeError(std::move(err));
      return;  // not known to be empty: never reused
    }
    FreeDylibs& f = free_dylibs();
    std::lock_guard lk(f.mu);
    f.free.push_back(jd_);
  }
  void* lookup(std::string_view symbol) const override {
    auto addr = host().jit->lookup(*jd_, llvm::StringRef(symbol.data(), symbol.size()));
    if (!addr) fail(fmt::format("looking up kernel '{}'", symbol), addr.takeError());
    return addr->toPtr<void*>();
  }

 private:
  llvm::orc::JITDylib* jd_;
  llvm::orc::ResourceTrackerSP rt_;
};

std::string full_key(const std::string& key) { return host_target_id() + "\n" + key; }

}  // namespace

const std::string& host_target_id() { return host().id; }

void configure_for_host(llvm::Module& m) {
  m.setTargetTriple(host().tm->getTargetTriple().str());
  m.setDataLayout(host().jit->getDataLayout());
}

void set_host_attributes(llvm::Function& f) {
  f.addFnAttr("target-cpu", host().cpu);
  f.addFnAttr("target-features", host().features);
  f.addFnAttr("prefer-vector-width", "512");
  f.addFnAttr("min-legal-vector-width", "512");
  f.addFnAttr(llvm::Attribute::NoUnwind);
  // Vector spill slots aligned to their width: without this LLVM assumes a 16-byte aligned stack
  // and spills ymm/zmm registers with unaligned stores, whose cache-line and page splits depend on
  // the caller's stack depth (measured: one extra call frame made a 10-op AVX2 chain 5x slower).
  f.addFnAttr("stackrealign");
}

std::unique_ptr<llvm::MemoryBuffer> compile_to_object(llvm::Module& m) {
  Host& h = host();
  std::unique_ptr<llvm::TargetMachine> tm = h.acquire_machine();
  struct Release {
    Host& h;
    std::unique_ptr<llvm::TargetMachine>& tm;
    ~Release() { h.release_machine(std::move(tm)); }
  } release{h, tm};
  {
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    llvm::PipelineTuningOptions pto;
    pto.LoopVectorization = true;
    pto.SLPVectorization = true;
    pto.LoopUnrolling = true;
    llvm::PassBuilder pb(tm.get(), pto);
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    // O2, not O3: the kernels' hot loops come out the same (vectorized and interleaved alike; O3
    // adds argument promotion, non-trivial unswitching and larger inlining, which these loop nests
    // of one inlined body do not need), and compiling is 10-20% faster (the MLP train step,
    // AVX2 Zen 3: 143 -> 124 ms cold; its step time, the transformer's tokens/s and the fused
    // chain within noise). The machine-code level stays Aggressive.
    llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O2);
    mpm.run(m, mam);
  }
  llvm::SmallVector<char, 0> out;
  llvm::raw_svector_ostream os(out);
  llvm::legacy::PassManager pm;
  if (tm->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::ObjectFile))
    throw Error("LLVM JIT: the host target cannot emit object files");
  pm.run(m);
  return std::make_unique<llvm::SmallVectorMemoryBuffer>(std::move(out), m.getModuleIdentifier(), false);
}

std::shared_ptr<JitCode> link_object(std::unique_ptr<llvm::MemoryBuffer> object) {
  Host& h = host();
  llvm::orc::JITDylib* jd = nullptr;
  {
    FreeDylibs& f = free_dylibs();
    std::lock_guard lk(f.mu);
    if (!f.free.empty()) {
      jd = f.free.back();
      f.free.pop_back();
    }
  }
  if (!jd) {
    auto created = h.jit->createJITDylib(fmt::format("cjax_kernels_{}", g_libraries_created++));
    if (!created) fail("creating a JIT library", created.takeError());
    jd = &*created;
    // Symbols the kernels do not define (libm, libc) resolve in the process.
    jd->addToLinkOrder(h.jit->getMainJITDylib());
  }
  auto rt = jd->createResourceTracker();
  if (auto err = h.jit->addObjectFile(rt, std::move(object))) fail("linking generated code", std::move(err));
  return std::make_shared<LinkedCode>(jd, std::move(rt));
}

size_t jit_library_count() { return g_libraries_created.load(); }

std::unique_ptr<llvm::MemoryBuffer> cached_object(const std::string& key) {
  std::optional<std::string> object = cached_kernel(full_key(key));
  return object ? llvm::MemoryBuffer::getMemBufferCopy(*object, "cjax-kernels") : nullptr;
}

void store_object(const std::string& key, const llvm::MemoryBuffer& object) {
  store_kernel(full_key(key), std::string_view(object.getBufferStart(), object.getBufferSize()));
}

}  // namespace cjax::cpu
