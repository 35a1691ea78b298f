#include "core/array/spmd.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <string>

#include "cjax/collectives.h"
#include "cjax/errors.h"

namespace cjax {
namespace {
thread_local std::vector<ManualAxis> tl_axes;
thread_local const SpmdContext* tl_spmd = nullptr;

double initial_timeout() {
  const char* s = std::getenv("CJAX_COLLECTIVE_TIMEOUT_S");
  return s && *s ? std::atof(s) : 300.0;
}
std::atomic<double> g_timeout{initial_timeout()};
}  // namespace

AxisEnvScope::AxisEnvScope(std::vector<ManualAxis> axes) : saved_size_(tl_axes.size()) {
  for (ManualAxis& a : axes) tl_axes.push_back(std::move(a));
}
AxisEnvScope::~AxisEnvScope() { tl_axes.resize(saved_size_); }

const ManualAxis* find_manual_axis(std::string_view name) {
  for (auto it = tl_axes.rbegin(); it != tl_axes.rend(); ++it)
    if (it->name == name) return &*it;
  return nullptr;
}

std::vector<ManualAxis> manual_axes_in_scope() {
  std::vector<ManualAxis> out;
  for (const ManualAxis& a : tl_axes)
    if (!a.batch) out.push_back(a);
  return out;
}

bool is_batch_axis(std::string_view name) {
  const ManualAxis* m = find_manual_axis(name);
  return m && m->batch;
}

int64_t bound_group_size(const std::vector<std::string>& axes, std::string_view op) {
  int64_t n = 1;
  for (const std::string& a : axes) {
    const ManualAxis* m = find_manual_axis(a);
    if (!m) {
      std::vector<std::string> bound;
      for (const ManualAxis& b : tl_axes) bound.push_back("'" + b.name + "'" + (b.batch ? " (vmap)" : ""));
      throw AxisNameError(
          fmt::format("Found an unbound axis name: {}. To fix this, call {} inside shard_map over a mesh with an axis "
                      "named "
                      "'{}', or inside vmap with axis_name '{}' (axes in scope: {}).",
                      a, op, a, a,
                      bound.empty() ? std::string("none: not inside shard_map or a named vmap")
                                    : fmt::format("{}", fmt::join(bound, ", "))));
    }
    n *= m->size;
  }
  return n;
}

bool vma_checked(const std::vector<std::string>& axes) {
  if (axes.empty()) return false;
  for (const std::string& a : axes) {
    const ManualAxis* m = find_manual_axis(a);
    if (!m || !m->check_vma) return false;
  }
  return true;
}

std::vector<std::string> sorted_axes(std::vector<std::string> a) {
  std::sort(a.begin(), a.end());
  a.erase(std::unique(a.begin(), a.end()), a.end());
  return a;
}
std::vector<std::string> vma_union(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::vector<std::string> out;
  std::set_union(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}
std::vector<std::string> vma_minus(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::vector<std::string> sb = sorted_axes(b), out;
  std::set_difference(a.begin(), a.end(), sb.begin(), sb.end(), std::back_inserter(out));
  return out;
}
bool vma_subset(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  for (const std::string& x : a)
    if (std::find(b.begin(), b.end(), x) == b.end()) return false;
  return true;
}

SpmdScope::SpmdScope(const SpmdContext& ctx) : saved_(tl_spmd), ctx_(ctx) { tl_spmd = &ctx_; }
SpmdScope::~SpmdScope() { tl_spmd = saved_; }
const SpmdContext* current_spmd() { return tl_spmd; }

int64_t axis_position(const Mesh& mesh, const std::vector<std::string>& axes, int64_t device) {
  std::vector<int64_t> c = mesh.coords(device);
  int64_t idx = 0;
  for (const std::string& a : axes) {
    int k = mesh.axis_index(a);
    idx = idx * mesh.shape()[size_t(k)] + c[size_t(k)];
  }
  return idx;
}

std::vector<int64_t> axis_group(const Mesh& mesh, const std::vector<std::string>& axes, int64_t device,
                                int64_t* position) {
  std::vector<int64_t> mine = mesh.coords(device);
  std::vector<bool> in_group(mesh.shape().size(), false);
  for (const std::string& a : axes) {
    int k = mesh.axis_index(a);
    if (k < 0) throw AxisNameError(fmt::format("axis '{}' is not an axis of {}", a, mesh.str()));
    in_group[size_t(k)] = true;
  }
  int64_t n = 1;
  for (const std::string& a : axes) n *= mesh.axis_size(a);
  std::vector<int64_t> members(size_t(n), -1);
  for (int64_t d = 0; d < mesh.size(); ++d) {
    std::vector<int64_t> c = mesh.coords(d);
    bool same = true;
    for (size_t k = 0; k < c.size(); ++k) same = same && (in_group[k] || c[k] == mine[k]);
    if (same) members[size_t(axis_position(mesh, axes, d))] = d;
  }
  if (position) *position = axis_position(mesh, axes, device);
  return members;
}

namespace config {
double collective_timeout_seconds() { return g_timeout; }
void set_collective_timeout_seconds(double s) { g_timeout = s; }
}  // namespace config

}  // namespace cjax

namespace cjax {
namespace {
SpmdRunner g_runner = nullptr;
}
void set_spmd_runner(SpmdRunner runner) { g_runner = runner; }
namespace {
std::atomic<int64_t> g_lockstep_runs{0}, g_threaded_runs{0};  // runs happen on several threads
}  // namespace
SpmdRunStats spmd_run_stats() { return {g_lockstep_runs.load(), g_threaded_runs.load()}; }
void count_spmd_run(bool lockstep) { ++(lockstep ? g_lockstep_runs : g_threaded_runs); }
std::mutex& device_mesh_run_mutex() {
  static std::mutex m;
  return m;
}
SpmdRunner spmd_runner() {
  if (!g_runner) throw BackendError("no SPMD runner is linked in: the jit layer provides it");
  return g_runner;
}
}  // namespace cjax
