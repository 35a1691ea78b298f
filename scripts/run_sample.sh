#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main sample: samples/train_transformer (a byte-level
# transformer trained with FSDP on 8 virtual CPU devices; flags are passed through, see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja >/dev/null
cmake --build build -j "$(nproc)" --target train_transformer
exec ./build/samples/train_transformer "$@"
