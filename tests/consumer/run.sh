#!/usr/bin/env bash
# Builds and runs the consumer against (1) the build tree and (2) an installed copy.
set -euo pipefail
src=$(cd "$(dirname "$0")" && pwd)
build_dir=$1
shift
extra=("$@")  # extra cmake arguments (sanitizer flags when the library is instrumented)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake -S "$src" -B "$work/from-build" -G Ninja -Dcjax_DIR="$build_dir" "${extra[@]}" >/dev/null
cmake --build "$work/from-build" >/dev/null
"$work/from-build/consumer"
cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
cmake -S "$src" -B "$work/from-install" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" "${extra[@]}" >/dev/null
cmake --build "$work/from-install" >/dev/null
LD_LIBRARY_PATH="$work/prefix/lib:${LD_LIBRARY_PATH:-}" "$work/from-install/consumer"
echo "consumer: OK from the build tree and from the install prefix"
