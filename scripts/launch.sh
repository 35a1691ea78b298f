#!/usr/bin/env bash
# Starts N processes of one program on this machine as one multi-process cjax run
# (include/cjax/distributed.h, docs/distributed.md):
#   scripts/launch.sh -n 4 [--devices-per-process 2] [--timeout SECONDS] -- program args...
# Each process gets CJAX_COORDINATOR_ADDRESS (127.0.0.1, a free port), CJAX_NUM_PROCESSES and
# CJAX_PROCESS_ID; output lines carry a "[process k]" prefix; when one process fails the others
# are stopped. The launcher is build/cjax_launch (built here when missing; CJAX_LAUNCH overrides).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
launcher=${CJAX_LAUNCH:-$root/build/cjax_launch}
if [[ ! -x $launcher ]]; then
  bash "$root/scripts/setup.sh" >&2
  cmake -S "$root" -B "$root/build" -G Ninja >/dev/null
  cmake --build "$root/build" --target cjax_launch >&2
fi
exec "$launcher" "$@"
