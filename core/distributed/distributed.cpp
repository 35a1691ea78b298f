// distributed::initialize / shutdown and the process-level device queries (include/cjax/distributed.h).
// Process 0 runs the coordinator (core/distributed/kv_store.h); every process registers its device
// counts there, and the global device ids follow process order: process p's devices come after
// those of processes 0..p-1.
#include "cjax/distributed.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>

#include "cjax/errors.h"
#include "core/backend/backend.h"
#include "core/distributed/kv_store.h"
#include "core/distributed/runtime.h"

namespace cjax {
namespace distributed {
namespace {

struct State {
  int process_id = 0;
  int num_processes = 1;
  std::vector<int> cpu_counts;  // devices per process
  std::vector<int> cpu_first;   // first global id per process
  std::unique_ptr<KvStoreServer> server;
  std::unique_ptr<KvStoreClient> client;
  std::string hostname;
  std::chrono::milliseconds timeout{0};
};

std::mutex g_mu;
std::unique_ptr<State> g_state;  // set while initialized
std::atomic<bool> g_initialized{false};
std::atomic<bool> g_runtime_started{false};
std::atomic<int> g_generation{0};
const std::vector<int> g_no_counts;
std::vector<void (*)()>& shutdown_hooks() {
  static std::vector<void (*)()> hooks;
  return hooks;
}

std::string env_or(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}

int env_int(const char* name, int fallback, int lo) {
  std::string v = env_or(name);
  if (v.empty()) return fallback;
  char* end = nullptr;
  long x = std::strtol(v.c_str(), &end, 10);
  if (*end || x < lo || x > 1 << 20) throw ValueError(fmt::format("{}={} is not an integer ≥ {}", name, v, lo));
  return int(x);
}

double timeout_seconds(const Options& o) {
  if (o.initialization_timeout_s > 0) return o.initialization_timeout_s;
  std::string v = env_or("CJAX_DISTRIBUTED_TIMEOUT_S");
  if (v.empty()) return 300;
  char* end = nullptr;
  double s = std::strtod(v.c_str(), &end);
  if (*end || !(s > 0)) throw ValueError(fmt::format("CJAX_DISTRIBUTED_TIMEOUT_S={} is not a positive number", v));
  return s;
}

bool is_loopback(const std::string& host) { return host == "127.0.0.1" || host == "localhost" || host == "::1"; }

std::vector<char> int_bytes(int v) {
  std::string s = std::to_string(v);
  return {s.begin(), s.end()};
}
}  // namespace

void initialize(const Options& options) {
  std::lock_guard lk(g_mu);
  if (g_initialized) throw ValueError("distributed::initialize was called twice; call distributed::shutdown first");
  if (g_runtime_started)
    throw BackendError(
        "distributed::initialize must run before the first array is created (the devices of every process are "
        "numbered when the runtime starts); call it at the top of main");
  if (!options.local_device_ids.empty())
    throw ValueError(
        fmt::format("distributed::initialize: local_device_ids {} selects GPUs, which multi-process runs do not drive "
                    "yet "
                    "(NCCL); leave it empty, and set each process's CPU devices with CJAX_NUM_CPU_DEVICES",
                    options.local_device_ids));
  auto st = std::make_unique<State>();
  std::string address =
      options.coordinator_address.empty() ? env_or("CJAX_COORDINATOR_ADDRESS") : options.coordinator_address;
  if (address.empty())
    throw ValueError(
        "distributed::initialize: no coordinator address; pass Options::coordinator_address or set "
        "CJAX_COORDINATOR_ADDRESS=host:port (process 0 listens there)");
  st->num_processes = options.num_processes > 0 ? options.num_processes : env_int("CJAX_NUM_PROCESSES", 0, 1);
  if (st->num_processes <= 0)
    throw ValueError(
        "distributed::initialize: the number of processes is unknown; pass Options::num_processes or set "
        "CJAX_NUM_PROCESSES");
  st->process_id = options.process_id >= 0 ? options.process_id : env_int("CJAX_PROCESS_ID", -1, 0);
  if (st->process_id < 0 || st->process_id >= st->num_processes)
    throw ValueError(
        fmt::format("distributed::initialize: process id {} is not in [0, {}); pass Options::process_id or set "
                    "CJAX_PROCESS_ID",
                    st->process_id, st->num_processes));
  auto [host, port] = parse_coordinator_address(address);
  st->timeout = std::chrono::milliseconds(int64_t(timeout_seconds(options) * 1000));
  st->hostname = is_loopback(host) ? "127.0.0.1" : [] {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    return std::string(name);
  }();
  int generation = g_generation.load() + 1;
  std::string prefix = fmt::format("init{}/", generation);
  try {
    if (st->process_id == 0)
      st->server = std::make_unique<KvStoreServer>(is_loopback(host) ? host : "0.0.0.0", port, st->num_processes);
    st->client = std::make_unique<KvStoreClient>(address, st->process_id, st->num_processes, st->timeout);
    st->client->set(fmt::format("{}cpu_devices/{}", prefix, st->process_id), int_bytes(config::num_cpu_devices()));
    st->client->barrier(prefix + "join", st->timeout);
  } catch (const CollectiveError& e) {  // say which run and which step failed
    throw CollectiveError(fmt::format("distributed::initialize (process {} of {}, coordinator {}): {}", st->process_id,
                                      st->num_processes, address, e.what()));
  }
  int first = 0;
  for (int p = 0; p < st->num_processes; ++p) {
    std::vector<char> v = st->client->get(fmt::format("{}cpu_devices/{}", prefix, p), st->timeout);
    int n = std::stoi(std::string(v.begin(), v.end()));
    st->cpu_counts.push_back(n);
    st->cpu_first.push_back(first);
    first += n;
  }
  g_generation = generation;
  g_state = std::move(st);
  g_initialized = true;
}

void shutdown() {
  std::unique_ptr<State> st;
  {
    std::lock_guard lk(g_mu);
    if (!g_initialized) return;
    st = std::move(g_state);
    g_initialized = false;
  }
  std::exception_ptr error;
  try {
    st->client->barrier(fmt::format("init{}/shutdown", g_generation.load()), st->timeout);
  } catch (...) {
    error = std::current_exception();
  }
  for (void (*hook)() : shutdown_hooks()) hook();
  st->client.reset();
  // A process died: the coordinator keeps serving until the others have left too (up to the
  // timeout), so that a process still in a collective with the dead one learns from the store
  // which process failed, rather than only that the coordinator is gone.
  if (error && st->server) st->server->wait_for_others_to_leave(st->process_id, st->timeout);
  st->server.reset();
  if (error) std::rethrow_exception(error);
}

bool is_initialized() { return g_initialized; }
bool is_local(const Device& d) { return !g_initialized || process_index_of(d) == g_state->process_id; }
bool spans_processes(const std::vector<Device>& devices) {
  if (!g_initialized) return false;
  for (const Device& d : devices)
    if (!is_local(d)) return true;
  return false;
}
bool initialized() { return g_initialized; }

int first_local_device_id(Platform platform) {
  if (!g_initialized || platform != Platform::cpu) return 0;
  return g_state->cpu_first[size_t(g_state->process_id)];
}
const std::vector<int>& device_counts(Platform platform) {
  if (!g_initialized || platform != Platform::cpu) return g_no_counts;
  return g_state->cpu_counts;
}
KvStoreClient* store() { return g_initialized ? g_state->client.get() : nullptr; }
const std::string& transport_hostname() {
  static const std::string none;
  return g_initialized ? g_state->hostname : none;
}
void mark_runtime_started() { g_runtime_started = true; }
void on_shutdown(void (*hook)()) { shutdown_hooks().push_back(hook); }
int generation() { return g_generation; }
}  // namespace distributed

int process_index() { return distributed::g_initialized ? distributed::g_state->process_id : 0; }
int process_count() { return distributed::g_initialized ? distributed::g_state->num_processes : 1; }

int process_index_of(const Device& d) {
  const std::vector<int>& counts = distributed::device_counts(d.platform());
  int first = 0;
  for (size_t p = 0; p < counts.size(); ++p) {
    if (d.id() >= first && d.id() < first + counts[p]) return int(p);
    first += counts[p];
  }
  return process_index();
}

}  // namespace cjax
