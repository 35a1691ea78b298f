// Registry of backends and per-platform kernels, and the device functions of cjax/device.h that
// dispatch through it.
#include "core/backend.h"

#include <absl/container/flat_hash_map.h>
#include <absl/container/node_hash_map.h>
#include <fmt/format.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "cjax/errors.h"
#include "cjax/profiler.h"
#include "core/array_impl.h"
#include "core/buffer.h"
#include "core/primitive.h"

namespace cjax {
namespace {
constexpr size_t kNumPlatforms = 2;
std::array<std::atomic<Backend*>, kNumPlatforms>& backends() {
  static std::array<std::atomic<Backend*>, kNumPlatforms> table{};
  return table;
}

struct KernelTable {
  std::mutex mu;
  absl::node_hash_map<std::string, std::array<PrimitiveKernel, kNumPlatforms>> kernels;  // stable addresses
};
KernelTable& kernel_table() {
  static KernelTable t;
  return t;
}

std::atomic<int64_t> g_host_fallbacks{0};
bool log_fallbacks() {
  static const bool on = [] {
    const char* v = std::getenv("CJAX_LOG_FALLBACKS");
    return v && *v && std::string_view(v) != "0";
  }();
  return on;
}
}  // namespace

std::string_view platform_name(Platform platform) { return platform == Platform::cpu ? "cpu" : "cuda"; }

bool register_backend(Backend* backend) {
  backends()[size_t(backend->platform())].store(backend);
  return true;
}

Backend* find_backend(Platform platform) { return backends()[size_t(platform)].load(); }

Backend& backend_for(Platform platform) {
  if (Backend* b = find_backend(platform)) return *b;
  throw BackendError(fmt::format("platform '{}' is not built into this cjax (the {} backend is compiled only "
                                 "when its toolkit is found at build time)",
                                 platform_name(platform), platform_name(platform)));
}

void check_device(const Device& d) {
  Backend& b = backend_for(d.platform());
  std::vector<Device> devs = b.devices();
  if (d.id() >= 0 && d.id() < int(devs.size())) return;
  std::string reason = b.unavailable_reason();
  if (devs.empty())
    throw BackendError(fmt::format("no such device {}: the {} platform has no devices here ({})", d.str(),
                                   platform_name(d.platform()), reason.empty() ? "none found" : reason));
  throw BackendError(fmt::format("no such device {}: this process has {} {} devices{}", d.str(), devs.size(),
                                 platform_name(d.platform()),
                                 d.platform() == Platform::cpu ? " (CJAX_NUM_CPU_DEVICES)" : ""));
}

void register_kernel(std::string_view primitive, Platform platform, PrimitiveKernel fn) {
  KernelTable& t = kernel_table();
  std::lock_guard lock(t.mu);
  t.kernels[std::string(primitive)][size_t(platform)] = std::move(fn);
}

const PrimitiveKernel* find_kernel(std::string_view primitive, Platform platform) {
  KernelTable& t = kernel_table();
  std::lock_guard lock(t.mu);
  auto it = t.kernels.find(std::string(primitive));
  if (it == t.kernels.end() || !it->second[size_t(platform)]) return nullptr;
  return &it->second[size_t(platform)];  // entries are never erased: stable
}

const PrimitiveKernel* find_implementation(const PrimitiveDef& def, Platform platform) {
  // Eager dispatch asks once per primitive call: a per-thread cache of the answers found (a
  // kernel registered later, by a library loaded at run time, is still found on a miss).
  thread_local absl::flat_hash_map<std::pair<const PrimitiveDef*, Platform>, const PrimitiveKernel*> found;
  auto key = std::pair(&def, platform);
  if (auto it = found.find(key); it != found.end()) return it->second;
  const PrimitiveKernel* k = find_kernel(def.name, platform);
  if (!k && def.impl) k = &def.impl;
  if (k) found.emplace(key, k);
  return k;
}

const PrimitiveKernel& implementation_for(const PrimitiveDef& def, Platform platform) {
  if (const PrimitiveKernel* k = find_implementation(def, platform)) return *k;
  throw BackendError(fmt::format("primitive '{}' has no kernel for platform '{}'{}", def.name, platform_name(platform),
                                 platform == Platform::cpu ? "" : "; device_put its operands to a cpu device"));
}

void note_follow_transfer(std::string_view primitive, const Array& value, const Device& to) {
  if (value.size() > 1 && log_fallbacks())
    std::fprintf(stderr, "cjax: '%.*s' copied an uncommitted cpu:0 operand %s to %s\n", int(primitive.size()),
                 primitive.data(), value.aval().str().c_str(), to.str().c_str());
}

std::vector<Array> run_on_host(const PrimitiveDef& def, Platform platform, std::span<const Array> in,
                               std::span<const AbstractValue> out_avals, const Params& params) {
  const PrimitiveKernel& cpu_kernel = implementation_for(def, Platform::cpu);
  std::vector<Array> host;
  host.reserve(in.size());
  for (const Array& a : in) host.push_back(to_host(a));
  std::vector<Array> outs = cpu_kernel(host, out_avals, params);
  int64_t n = ++g_host_fallbacks;
  if (log_fallbacks())
    std::fprintf(stderr, "cjax: host fallback #%lld: '%s' has no %.*s kernel for these operands; ran on cpu:0\n",
                 static_cast<long long>(n), def.name.c_str(), int(platform_name(platform).size()),
                 platform_name(platform).data());
  Device home = concrete(in[0])->device();
  for (Array& o : outs) o = make_from_host(raw_ptr(o), o.aval(), home);  // CPU kernel outputs: host memory
  return outs;
}

namespace profiler {
int64_t host_fallback_count() { return g_host_fallbacks.load(); }
}  // namespace profiler

void* device_allocate(const Device& d, size_t nbytes) { return backend_for(d.platform()).allocate(d, nbytes); }
void device_deallocate(const Device& d, void* p, size_t nbytes) {
  backend_for(d.platform()).deallocate(d, p, nbytes);
}

std::string Device::str() const { return fmt::format("{}:{}", platform_name(platform_), id_); }
std::string Device::repr() const {
  return fmt::format("{}(id={})", platform_ == Platform::cpu ? "CpuDevice" : "CudaDevice", id_);
}

namespace {
Platform parse_platform(std::string_view platform, std::string_view where) {
  if (platform == "cpu") return Platform::cpu;
  if (platform == "cuda" || platform == "gpu") return Platform::cuda;
  throw BackendError(fmt::format("{}: unknown platform '{}'; the platforms are 'cpu' and 'cuda' (alias 'gpu')", where,
                                 platform));
}
// The devices of `p`, or BackendError naming why it has none.
std::vector<Device> require_devices(Platform p, std::string_view where) {
  Backend* b = find_backend(p);
  if (!b) throw BackendError(fmt::format("{}: this build of cjax has no {} backend", where, platform_name(p)));
  std::vector<Device> ds = b->devices();
  if (ds.empty())
    throw BackendError(fmt::format("{}: no {} device here ({})", where, platform_name(p), b->unavailable_reason()));
  return ds;
}
std::atomic<int> g_default_platform{-1};  // -1: not chosen yet (CJAX_PLATFORM decides at first use)
Platform default_platform_value() {
  int v = g_default_platform.load();
  if (v >= 0) return Platform(v);
  static const Platform from_env = [] {
    const char* e = std::getenv("CJAX_PLATFORM");
    if (!e || !*e) return Platform::cpu;
    Platform p = parse_platform(e, "CJAX_PLATFORM");
    require_devices(p, fmt::format("CJAX_PLATFORM={}", e));
    return p;
  }();
  return from_env;
}
}  // namespace

namespace config {
void set_default_platform(std::string_view platform) {
  Platform p = parse_platform(platform, "config::set_default_platform");
  require_devices(p, fmt::format("config::set_default_platform(\"{}\")", platform));
  g_default_platform = int(p);
}
std::string default_platform() { return std::string(platform_name(default_platform_value())); }
}  // namespace config

std::vector<Device> devices(std::string_view platform) {
  Platform p = platform.empty() ? default_platform_value() : parse_platform(platform, "devices");
  if (p == Platform::cpu) return backend_for(Platform::cpu).devices();
  Backend* b = find_backend(p);
  return b ? b->devices() : std::vector<Device>{};
}
int device_count() { return int(devices().size()); }
Device default_device() {
  Platform p = default_platform_value();
  return p == Platform::cpu ? Device(Platform::cpu, 0) : require_devices(p, "default_device")[0];
}
Device host_device() { return Device(Platform::cpu, 0); }

MemoryStats memory_stats(const Device& d) { return backend_for(d.platform()).memory_stats(d); }
void reset_peak_memory(const Device& d) { backend_for(d.platform()).reset_peak_memory(d); }

}  // namespace cjax
