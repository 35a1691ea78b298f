// The coordinator's key-value store: the rendezvous point of the processes of one multi-process
// cjax run (PyTorch's TCPStore, JAX's coordination service). Process 0 runs a KvStoreServer; every
// process, 0 included, connects a KvStoreClient and registers its process id. The store holds
// byte values by key, atomic counters and named barriers, and tells which processes have joined
// and which lost their connection without saying goodbye (crashed or were killed).
//
// The wire protocol is private to kv_store.cpp: length-prefixed binary frames over TCP (IPv4).
#pragma once
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace cjax::distributed {

struct HostPort {
  std::string host;
  int port = 0;
};
// "host:port" (the host may be a name); ValueError naming the address and CJAX_COORDINATOR_ADDRESS
// otherwise.
HostPort parse_coordinator_address(const std::string& address);

// Runs on process 0. Binds host:port (port 0: any free port; host "127.0.0.1", "0.0.0.0" or a
// name) and serves every client on its own thread until destroyed.
class KvStoreServer {
 public:
  // CollectiveError naming host:port and the system's reason if it cannot listen there (e.g.
  // "Address already in use"); ValueError for a port outside [0, 65535] or num_processes < 1.
  KvStoreServer(const std::string& host, int port, int num_processes);
  // Stops serving: answers requests already decided, closes every connection, joins its threads.
  ~KvStoreServer();
  KvStoreServer(const KvStoreServer&) = delete;
  KvStoreServer& operator=(const KvStoreServer&) = delete;

  int port() const;  // the bound port (the chosen one when constructed with port 0)
  // Waits until no process but `self` is connected (each said goodbye or lost its connection),
  // or until `timeout`.
  void wait_for_others_to_leave(int self, std::chrono::milliseconds timeout);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// One process's connection to the coordinator. Thread-safe: requests from several threads are
// sent one at a time (a blocking get or barrier holds up the others of the same client).
// Every method raises CollectiveError "lost the connection to the coordinator (process 0) at
// HOST:PORT: it exited or crashed" when the server goes away, also while blocked in get/barrier.
class KvStoreClient {
 public:
  // Connects to `address` ("host:port"; the host may be a name), retrying every ~50 ms until
  // connect_timeout since process 0 may start later, then registers process_id.
  // ValueError: a malformed address, process_id outside [0, num_processes), num_processes < 1.
  // CollectiveError: the coordinator cannot be reached in time; num_processes differs from the
  // server's; another live client already registered process_id.
  KvStoreClient(const std::string& address, int process_id, int num_processes,
                std::chrono::milliseconds connect_timeout);
  // Says goodbye (so the server does not count this process as crashed) and closes. Never throws.
  ~KvStoreClient();
  KvStoreClient(const KvStoreClient&) = delete;
  KvStoreClient& operator=(const KvStoreClient&) = delete;

  void set(const std::string& key, const std::vector<char>& value);
  // Blocks until `key` exists and returns its value; CollectiveError naming the key after `timeout`.
  std::vector<char> get(const std::string& key, std::chrono::milliseconds timeout);
  bool check(const std::string& key);  // whether `key` exists now
  // Adds delta to the counter `key` (0 when absent) atomically and returns the new value. The
  // counter is stored as decimal text, so get(key) reads it as e.g. "3".
  int64_t add(const std::string& key, int64_t delta);
  // Every process calls barrier(name) once; returns when all num_processes have arrived (at once
  // for a barrier that already completed). CollectiveError after `timeout` naming exactly the
  // processes that did not arrive, or at once when one of them disconnected without goodbye.
  void barrier(const std::string& name, std::chrono::milliseconds timeout);
  // Processes that registered and then lost their connection without saying goodbye, sorted.
  std::vector<int> dead_processes();
  // Processes that have registered so far (whether still connected or not), sorted.
  std::vector<int> joined_processes();
  int process_id() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace cjax::distributed
