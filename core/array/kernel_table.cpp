#include "core/array/kernel_table.h"

#include <absl/container/flat_hash_map.h>
#include <absl/container/node_hash_map.h>
#include <fmt/format.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "cjax/errors.h"
#include "cjax/profiler.h"
#include "core/array/array_impl.h"
#include "core/backend/backend.h"

namespace cjax {
namespace {
constexpr size_t kNumPlatforms = 2;

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

}  // namespace cjax
