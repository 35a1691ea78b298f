// Registry of backends, and the device functions of cjax/device.h that dispatch through it.
#include "core/backend/backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "cjax/distributed.h"
#include "cjax/errors.h"
#include "core/backend/buffer.h"
#include "core/distributed/runtime.h"

namespace cjax {
namespace {
constexpr size_t kNumPlatforms = 2;
std::array<std::atomic<Backend*>, kNumPlatforms>& backends() {
  static std::array<std::atomic<Backend*>, kNumPlatforms> table{};
  return table;
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
  throw BackendError(
      fmt::format("platform '{}' is not built into this cjax (the {} backend is compiled only "
                  "when its toolkit is found at build time)",
                  platform_name(platform), platform_name(platform)));
}

std::shared_ptr<BufferCommunicator> Backend::communicator(std::span<const Device>) {
  throw BackendError(fmt::format("the {} platform has no buffer communicator yet; run the collectives on cpu devices",
                                 platform_name(platform())));
}

int positive_env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  if (*end || x <= 0 || x > 4096)
    throw BackendError(fmt::format("{}={} is not a positive integer; set it to e.g. 8", name, v));
  return int(x);
}

void Backend::copy_between_devices(const Device& from, const void* src, const Device& to, void* dst, size_t nbytes) {
  std::vector<std::byte> staging(nbytes);
  copy_to_host(from, src, staging.data(), nbytes);
  copy_from_host(to, dst, staging.data(), nbytes);
}

void check_device(const Device& d) {
  Backend& b = backend_for(d.platform());
  std::vector<Device> devs = b.devices();
  if (std::find(devs.begin(), devs.end(), d) != devs.end()) return;
  if (int p = process_index_of(d); p != process_index())
    throw BackendError(
        fmt::
            format("device {} belongs to process {}: process {} holds data only on its own devices ({} to {}); build a "
                   "global array with make_array_from_process_local_data or make_array_from_callback",
                   d.str(), p, process_index(), devs.front().str(), devs.back().str()));
  std::string reason = b.unavailable_reason();
  if (devs.empty())
    throw BackendError(fmt::format("no such device {}: the {} platform has no devices here ({})", d.str(),
                                   platform_name(d.platform()), reason.empty() ? "none found" : reason));
  throw BackendError(fmt::format("no such device {}: this process has {} {} devices{}", d.str(), devs.size(),
                                 platform_name(d.platform()),
                                 d.platform() == Platform::cpu ? " (CJAX_NUM_CPU_DEVICES)" : ""));
}

void* device_allocate(const Device& d, size_t nbytes) { return backend_for(d.platform()).allocate(d, nbytes); }
void device_deallocate(const Device& d, void* p, size_t nbytes) { backend_for(d.platform()).deallocate(d, p, nbytes); }

std::string Device::str() const { return fmt::format("{}:{}", platform_name(platform_), id_); }
std::string Device::repr() const {
  return fmt::format("{}(id={})", platform_ == Platform::cpu ? "CpuDevice" : "CudaDevice", id_);
}

namespace {
Platform parse_platform(std::string_view platform, std::string_view where) {
  if (platform == "cpu") return Platform::cpu;
  if (platform == "cuda" || platform == "gpu") return Platform::cuda;
  throw BackendError(
      fmt::format("{}: unknown platform '{}'; the platforms are 'cpu' and 'cuda' (alias 'gpu')", where, platform));
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

std::vector<Device> local_devices(std::string_view platform) {
  Platform p = platform.empty() ? default_platform_value() : parse_platform(platform, "local_devices");
  if (p == Platform::cpu) return backend_for(Platform::cpu).devices();
  Backend* b = find_backend(p);
  return b ? b->devices() : std::vector<Device>{};
}
int local_device_count() { return int(local_devices().size()); }
std::vector<Device> devices(std::string_view platform) {
  Platform p = platform.empty() ? default_platform_value() : parse_platform(platform, "devices");
  const std::vector<int>& counts = distributed::device_counts(p);
  if (counts.empty()) return local_devices(platform_name(p));
  std::vector<Device> out;
  int id = 0;
  for (int n : counts)
    for (int k = 0; k < n; ++k) out.emplace_back(p, id++);
  return out;
}
int device_count() { return int(devices().size()); }
Device host_device() { return Device(Platform::cpu, distributed::first_local_device_id(Platform::cpu)); }
Device default_device() {
  Platform p = default_platform_value();
  return p == Platform::cpu ? host_device() : require_devices(p, "default_device")[0];
}

MemoryStats memory_stats(const Device& d) { return backend_for(d.platform()).memory_stats(d); }
void reset_peak_memory(const Device& d) { backend_for(d.platform()).reset_peak_memory(d); }

}  // namespace cjax
