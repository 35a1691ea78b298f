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
#include <llvm/Support/xxhash.h>
#include <llvm/Support/raw_ostream.h>
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
#include <thread>
#include <unordered_map>

#include "cjax/errors.h"
#include "core/util.h"

namespace cjax::cpu {
namespace {

constexpr std::string_view kCacheMagic = "CJAXOBJ1";
constexpr const char* kCjaxCodegenVersion = "cjax-codegen-11";

[[noreturn]] void fail(std::string_view what, llvm::Error err) {
  std::string msg;
  llvm::raw_string_ostream os(msg);
  os << err;
  throw Error(fmt::format("LLVM JIT: {}: {}", what, os.str()));
}

struct Host {
  std::unique_ptr<llvm::orc::LLJIT> jit;
  std::unique_ptr<llvm::TargetMachine> tm;
  std::string cpu, features, id;
  std::mutex compile_mu;  // a TargetMachine is not thread safe

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
    jtmb->getOptions().AllowFPOpFusion = llvm::FPOpFusion::Fast;
    cpu = jtmb->getCPU();
    features = jtmb->getFeatures().getString();
    auto machine = jtmb->createTargetMachine();
    if (!machine) fail("creating the target machine", machine.takeError());
    tm = std::move(*machine);
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

// ---- object cache ----
struct Cache {
  std::mutex mu;
  // In memory: most recently used first, bounded by bytes.
  std::list<std::pair<std::string, std::string>> lru;
  std::unordered_map<std::string, decltype(lru)::iterator> index;
  size_t bytes = 0;
  static constexpr size_t kMaxBytes = size_t(256) << 20;
  std::atomic<int64_t> memory_hits{0}, disk_hits{0}, misses{0}, disk_writes{0};

  void remember(const std::string& key, std::string object) {
    std::lock_guard lk(mu);
    if (index.count(key)) return;
    bytes += object.size() + key.size();
    lru.emplace_front(key, std::move(object));
    index[key] = lru.begin();
    while (bytes > kMaxBytes && lru.size() > 1) {
      bytes -= lru.back().first.size() + lru.back().second.size();
      index.erase(lru.back().first);
      lru.pop_back();
    }
  }
};
Cache& cache() {
  static Cache c;
  return c;
}

std::string full_key(const std::string& key) { return host_target_id() + "\n" + key; }

std::filesystem::path cache_dir() {
  if (const char* d = std::getenv("CJAX_CACHE_DIR")) return d;  // "" disables the disk cache
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::filesystem::path(x) / "cjax";
  if (const char* h = std::getenv("HOME"); h && *h) return std::filesystem::path(h) / ".cache" / "cjax";
  return {};
}

// CJAX_CACHE_MAX_MB (default 512; fractions allowed): the disk cache's size cap.
uint64_t disk_cache_limit() {
  const char* v = std::getenv("CJAX_CACHE_MAX_MB");
  double mb = v && *v ? std::strtod(v, nullptr) : 512.0;
  return uint64_t(std::max(0.0, mb) * 1024.0 * 1024.0);
}

std::filesystem::path cache_file(const std::filesystem::path& dir, const std::string& fkey) {
  auto h = llvm::xxh3_128bits(llvm::ArrayRef<uint8_t>(reinterpret_cast<const uint8_t*>(fkey.data()), fkey.size()));
  return dir / fmt::format("{:016x}{:016x}.o", h.high64, h.low64);
}

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
}

std::unique_ptr<llvm::MemoryBuffer> compile_to_object(llvm::Module& m) {
  Host& h = host();
  std::lock_guard lk(h.compile_mu);
  {
    llvm::LoopAnalysisManager lam;
    llvm::FunctionAnalysisManager fam;
    llvm::CGSCCAnalysisManager cgam;
    llvm::ModuleAnalysisManager mam;
    llvm::PipelineTuningOptions pto;
    pto.LoopVectorization = true;
    pto.SLPVectorization = true;
    pto.LoopUnrolling = true;
    llvm::PassBuilder pb(h.tm.get(), pto);
    pb.registerModuleAnalyses(mam);
    pb.registerCGSCCAnalyses(cgam);
    pb.registerFunctionAnalyses(fam);
    pb.registerLoopAnalyses(lam);
    pb.crossRegisterProxies(lam, fam, cgam, mam);
    llvm::ModulePassManager mpm = pb.buildPerModuleDefaultPipeline(llvm::OptimizationLevel::O3);
    mpm.run(m, mam);
  }
  llvm::SmallVector<char, 0> out;
  llvm::raw_svector_ostream os(out);
  llvm::legacy::PassManager pm;
  if (h.tm->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::ObjectFile))
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
  Cache& c = cache();
  std::string fkey = full_key(key);
  {
    std::lock_guard lk(c.mu);
    if (auto it = c.index.find(fkey); it != c.index.end()) {
      c.lru.splice(c.lru.begin(), c.lru, it->second);
      ++c.memory_hits;
      return llvm::MemoryBuffer::getMemBufferCopy(it->second->second, "cjax-kernels");
    }
  }
  std::filesystem::path dir = cache_dir();
  if (!dir.empty()) {
    std::ifstream in(cache_file(dir, fkey), std::ios::binary);
    if (in) {
      std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      // Layout: magic, key length (decimal) '\n', key, object bytes.
      size_t nl = data.find('\n', kCacheMagic.size());
      if (data.compare(0, kCacheMagic.size(), kCacheMagic) == 0 && nl != std::string::npos) {
        size_t klen = std::strtoull(data.c_str() + kCacheMagic.size(), nullptr, 10);
        if (nl + 1 + klen <= data.size() && data.compare(nl + 1, klen, fkey) == 0) {
          std::string object = data.substr(nl + 1 + klen);
          ++c.disk_hits;
          std::error_code ec;  // recency for trim_disk_kernel_cache (least recently used goes first)
          std::filesystem::last_write_time(cache_file(dir, fkey), std::filesystem::file_time_type::clock::now(), ec);
          auto buf = llvm::MemoryBuffer::getMemBufferCopy(object, "cjax-kernels");
          c.remember(fkey, std::move(object));
          return buf;
        }
      }
    }
  }
  ++c.misses;
  return nullptr;
}

void store_object(const std::string& key, const llvm::MemoryBuffer& object) {
  Cache& c = cache();
  std::string fkey = full_key(key);
  c.remember(fkey, object.getBuffer().str());
  std::filesystem::path dir = cache_dir();
  if (dir.empty()) return;
  // The disk cache is an optimisation: an unwritable directory only costs recompiles.
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return;
  std::filesystem::path file = cache_file(dir, fkey);
  std::filesystem::path tmp = file;
  tmp += fmt::format(".tmp{}.{}", ::getpid(), std::hash<std::thread::id>()(std::this_thread::get_id()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return;
    out << kCacheMagic << fkey.size() << '\n' << fkey;
    out.write(object.getBufferStart(), std::streamsize(object.getBufferSize()));
    if (!out) {
      out.close();
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, file, ec);
  if (ec) std::filesystem::remove(tmp, ec);
  else ++c.disk_writes;
  // Trim on this process's first write and every 64th after: a directory listing per write would
  // cost more than it saves.
  if ((c.disk_writes.load() - 1) % 64 == 0) trim_disk_kernel_cache();
}

void trim_disk_kernel_cache() {
  std::filesystem::path dir = cache_dir();
  if (dir.empty()) return;
  uint64_t limit = disk_cache_limit();
  struct Entry {
    std::filesystem::file_time_type time;
    uint64_t size;
    std::filesystem::path path;
  };
  std::vector<Entry> entries;
  uint64_t total = 0;
  std::error_code ec;
  auto now = std::filesystem::file_time_type::clock::now();
  for (auto it = std::filesystem::directory_iterator(dir, ec); !ec && it != std::filesystem::directory_iterator();
       it.increment(ec)) {
    std::error_code fe;
    const std::filesystem::path& path = it->path();
    auto time = it->last_write_time(fe);
    uint64_t size = it->file_size(fe);
    if (fe) continue;
    // A temporary file an hour old belongs to a writer that died.
    if (path.filename().string().find(".o.tmp") != std::string::npos) {
      if (now - time > std::chrono::hours(1)) std::filesystem::remove(path, fe);
      continue;
    }
    if (path.extension() != ".o") continue;
    entries.push_back({time, size, path});
    total += size;
  }
  if (total <= limit) return;
  // Least recently used first, down to 80% of the cap (so that trims stay rare).
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.time < b.time; });
  for (const Entry& e : entries) {
    if (total <= limit / 5 * 4) break;
    std::error_code fe;
    if (std::filesystem::remove(e.path, fe)) total -= e.size;
  }
}

KernelCacheStats kernel_cache_stats() {
  Cache& c = cache();
  return {c.memory_hits.load(), c.disk_hits.load(), c.misses.load(), c.disk_writes.load()};
}

void clear_memory_kernel_cache() {
  Cache& c = cache();
  std::lock_guard lk(c.mu);
  c.lru.clear();
  c.index.clear();
  c.bytes = 0;
}

}  // namespace cjax::cpu
