#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main sample.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$(nproc)" --target mlp_strategies
exec ./build/samples/mlp_strategies "$@"
