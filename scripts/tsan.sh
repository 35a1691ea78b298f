#!/usr/bin/env bash
# ThreadSanitizer run of the runtime, dispatch, shard_map and concurrency tests (build-tsan/).
#   scripts/tsan.sh            build and run; exits non-zero on any data race report
# Generated (LLVM JIT) kernels are not instrumented: races inside a kernel are not seen, races on
# the buffers and queues around them are. OpenBLAS and LIBXSMM run uninstrumented too.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export CCACHE_BASEDIR="$PWD"
tests=(test_runtime test_concurrency test_jit test_shard_map test_shard_map_collectives test_compiler)
cmake -S . -B build-tsan -G Ninja -DCJAX_TSAN=ON -DCJAX_BUILD_BENCH=OFF -DCJAX_BUILD_SAMPLES=OFF \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
present=()
for t in "${tests[@]}"; do
  [ -f "tests/$t.cpp" ] && present+=("$t")
done
cmake --build build-tsan -j "$(nproc)" --target "${present[@]}"
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1:report_signal_unsafe=0}
export CJAX_NUM_CPU_DEVICES=8 CJAX_CHECK_JAXPRS=1
status=0
for t in "${present[@]}"; do
  echo "== $t (ThreadSanitizer)"
  if ! "build-tsan/tests/$t"; then
    echo "FAIL: $t under ThreadSanitizer"
    status=1
  fi
done
[ "$status" = 0 ] && echo "PASS: no data race reported in ${present[*]}"
exit $status
