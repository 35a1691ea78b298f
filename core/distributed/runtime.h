// The state of a multi-process run (include/cjax/distributed.h) for the layers that need it: the
// backends place devices with it, the CPU backend's process communicator rendezvouses through the
// coordinator's store.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "cjax/device.h"

namespace cjax::distributed {
class KvStoreClient;

bool initialized();
// Whether this process drives device d (always, on one process).
bool is_local(const Device& d);
// Whether some of `devices` belong to other processes.
bool spans_processes(const std::vector<Device>& devices);
// The first global id of this process's devices of `platform` (0 on one process).
int first_local_device_id(Platform platform);
// How many devices every process has of `platform`, by process (empty on one process).
const std::vector<int>& device_counts(Platform platform);
// The coordinator's store (null on one process).
KvStoreClient* store();
// The address peers reach this process at, for the collectives' TCP transport.
const std::string& transport_hostname();
// Backends call it when their runtime starts: initialize() after that raises BackendError.
void mark_runtime_started();
// A number that changes with every initialize(), so that rendezvous keys of an earlier run are
// never reused.
int generation();
// Runs `hook` at every shutdown(), before the connections close (backends drop their transports).
void on_shutdown(void (*hook)());
}  // namespace cjax::distributed
