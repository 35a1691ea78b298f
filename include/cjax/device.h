// Devices of the runtime. The CPU platform exposes N virtual devices (CJAX_NUM_CPU_DEVICES or
// config::set_num_cpu_devices before first use; default 1), each with its own worker and memory
// accounting, so meshes of 8 devices run on any laptop.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace cjax {

enum class Platform : uint8_t { cpu, cuda };

class Device {
 public:
  Device() = default;
  Device(Platform platform, int id) : platform_(platform), id_(id) {}
  Platform platform() const { return platform_; }
  int id() const { return id_; }
  std::string str() const;   // "cpu:0"
  std::string repr() const;  // "CpuDevice(id=0)"
  bool operator==(const Device&) const = default;

 private:
  Platform platform_ = Platform::cpu;
  int id_ = 0;
};

// The devices of `platform` ("cpu", "cuda" or its alias "gpu"; "" = the default platform): in a
// multi-process run (cjax/distributed.h) those of every process, local_devices() this process's.
std::vector<Device> devices(std::string_view platform = "");
int device_count();  // of the default platform
// The first device of the default platform: where creation functions (jnp::zeros, jnp::array,
// random::key, io loads) put their results, uncommitted.
Device default_device();

// Memory accounting per device: bytes held by live arrays, their high-water mark, and bytes the
// caching allocator keeps for reuse.
struct MemoryStats {
  int64_t bytes_in_use = 0;
  int64_t peak_bytes_in_use = 0;
  int64_t bytes_cached = 0;    // freed blocks kept for reuse
  int64_t num_allocs = 0;      // requests served
  int64_t num_cache_hits = 0;  // requests served from the cache
};
MemoryStats memory_stats(const Device&);
void reset_peak_memory(const Device&);

namespace config {
// Must be called before the runtime starts (before the first array is created). Throws
// BackendError afterwards, naming the count in force.
void set_num_cpu_devices(int n);
// This process's CPU device count: the one in force, else the one requested (set_num_cpu_devices,
// CJAX_NUM_CPU_DEVICES, default 1).
int num_cpu_devices();
// Number of intra-op threads (default: hardware cores). Same timing rule as above.
void set_num_threads(int n);
// The default platform ("cpu" or "cuda"), as JAX's default backend: CJAX_PLATFORM=cuda or this
// call (before creating the arrays that should live there). Raises BackendError naming the
// reason when the platform has no device here. Default: cpu.
void set_default_platform(std::string_view platform);
std::string default_platform();
}  // namespace config

}  // namespace cjax
