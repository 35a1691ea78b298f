#!/usr/bin/env bash
# Builds what scripts/gpu_check.sh runs on a GPU machine that has the CUDA toolkit and driver but
# no LLVM, fmt, Abseil or OpenBLAS: libcjax with LLVM linked statically, the cuda tests and
# bench_cuda, their non-system shared libraries, all in .gpu_bundle/cjax_gpu.tar.xz (git-ignored
# through .git/info/exclude; carried by the device tool). Kernels are built for x86-64-v3 (AVX2),
# which every GPU host runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export CCACHE_BASEDIR="$PWD"
build=build-gpu
cmake -S . -B "$build" -G Ninja -DCJAX_MARCH=x86-64-v3 -DCJAX_STATIC_LLVM=ON -DCJAX_BUILD_SAMPLES=ON -DCJAX_BUILD_BENCH=ON -DCJAX_BUILD_TESTS=ON >/dev/null
targets=(test_cuda_offline test_cuda_device test_cuda_kernels test_cuda_jit test_cuda_mesh test_cuda_nccl bench_cuda test_core test_jit test_examples_shard_map train_transformer)
cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
stage=$(mktemp -d)
mkdir -p "$stage/bin" "$stage/lib"
cp "$build"/tests/test_cuda_offline "$build"/tests/test_cuda_device "$build"/tests/test_cuda_kernels "$build"/tests/test_cuda_jit "$build"/tests/test_cuda_mesh "$build"/tests/test_cuda_nccl "$build"/tests/test_core "$build"/tests/test_jit "$build"/tests/test_examples_shard_map \
   "$build"/bench/bench_cuda "$build"/samples/train_transformer "$stage/bin/"
cp -L "$build"/libcjax.so.0 "$stage/lib/"
# Every shared library the binaries need except the C runtime that every Linux host has.
for f in "$stage"/bin/* "$stage"/lib/libcjax.so.0; do
  LD_LIBRARY_PATH="$build" ldd "$f" | awk '/=> \// {print $3}'
done | sort -u | grep -v -E '/(libc|libm|libdl|librt|libpthread|ld-linux-x86-64)\.so' | grep -v libcjax |
  while read -r lib; do cp -L "$lib" "$stage/lib/"; done
strip --strip-unneeded "$stage"/bin/* "$stage"/lib/*
mkdir -p .gpu_bundle
grep -qx '/.gpu_bundle/' .git/info/exclude 2>/dev/null || echo '/.gpu_bundle/' >> .git/info/exclude
tar -C "$stage" -cf - bin lib | xz -T0 -6 > .gpu_bundle/cjax_gpu.tar.xz
rm -rf "$stage"
ls -la .gpu_bundle/cjax_gpu.tar.xz
