#!/usr/bin/env bash
# Installs what is missing, configures, builds and runs the whole test suite.
#   scripts/test.sh              release build in build/
#   scripts/test.sh --sanitize   ASan+UBSan build in build-asan/
#   scripts/test.sh --isa avx2   the AVX2 code paths on any x86-64 host (build-avx2/): the C++ kernels
#                                compiled for x86-64-v3, generated LLVM kernels for x86-64-v3
#                                (CJAX_ISA=avx2), LIBXSMM and OpenBLAS pinned to their Haswell kernels
# Extra arguments after these go to ctest (e.g. -R test_jit).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export CCACHE_BASEDIR="$PWD"  # cache hits across clones in different directories
build=build
extra=()
case "${1:-}" in
  --sanitize)
    shift
    build=build-asan
    extra=(-DCJAX_SANITIZE=ON -DCJAX_BUILD_BENCH=OFF -DCMAKE_BUILD_TYPE=Debug -DCJAX_BUILD_SAMPLES=ON)
    ;;
  --isa)
    [ "${2:-}" = avx2 ] || { echo "usage: scripts/test.sh --isa avx2" >&2; exit 2; }
    shift 2
    build=build-avx2
    extra=(-DCJAX_MARCH=x86-64-v3 -DCJAX_BUILD_BENCH=OFF)
    export CJAX_ISA=avx2 OPENBLAS_CORETYPE=Haswell LIBXSMM_TARGET=hsw
    ;;
esac
cmake -S . -B "$build" -G Ninja "${extra[@]}" >/dev/null
cmake --build "$build" -j "$(nproc)"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
ctest --test-dir "$build" --output-on-failure -j 2 --timeout 900 "$@"
