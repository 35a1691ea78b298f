#!/usr/bin/env bash
# Runs on the GPU machine (the device tool), from the repository root, after
#   scripts/gpu_bundle.sh   (here, on the development machine).
# Unpacks the bundle, runs the cuda tests (jit's fused kernels under compute-sanitizer too; CPU
# suites named in GPU_CHECK_CPU_SUITES), and bench_cuda with its PyTorch/JAX peers. Writes logs under
# $OUT (or ./gpu_out) and prints a summary last. GPU_CHECK_ONLY="tests train mesh bench sanitizer"
# (any of them) runs those sections only; GPU_CHECK_TESTS names the GPU test programs;
# GPU_CHECK_STEP_LIMIT caps every step's time limit (seconds).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu_out}
mkdir -p "$out" /tmp/cjax_gpu
: > "$out/figures.txt"
tar -xJf .gpu_bundle/cjax_gpu.tar.xz -C /tmp/cjax_gpu || exit 1
export LD_LIBRARY_PATH=/tmp/cjax_gpu/lib:${LD_LIBRARY_PATH:-}
export CJAX_NUM_CPU_DEVICES=8 CJAX_ISA=avx2 CJAX_CACHE_DIR=/tmp/cjax_cache
bin=/tmp/cjax_gpu/bin
# NCCL from the toolkit, or else from Python's nvidia-nccl wheel (PyTorch's).
if [ -z "${CJAX_NCCL_LIBRARY:-}" ] && [ ! -e /usr/local/cuda/lib64/libnccl.so.2 ]; then
  lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
  [ -f "$lib" ] && export CJAX_NCCL_LIBRARY=$lib
fi
summary=()
want() { [ -z "${GPU_CHECK_ONLY:-}" ] || [[ " $GPU_CHECK_ONLY " == *" $1 "* ]]; }
step() {  # step <name> <timeout s> <command...>
  local name=$1 limit=$2
  shift 2
  [ -n "${GPU_CHECK_STEP_LIMIT:-}" ] && [ "$GPU_CHECK_STEP_LIMIT" -lt "$limit" ] && limit=$GPU_CHECK_STEP_LIMIT
  local t0=$SECONDS
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  local rc=$?
  summary+=("$(printf '%-28s rc=%-3s %4ss' "$name" "$rc" "$((SECONDS - t0))")")
  tail -n 25 "$out/$name.log"
}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
lscpu | grep -E 'Model name|^CPU\(s\)' | tee -a "$out/gpu.txt"
if want tests; then
  for t in ${GPU_CHECK_TESTS:-test_cuda_jit test_cuda_nccl test_cuda_mesh test_cuda_offline test_cuda_device test_cuda_kernels} ${GPU_CHECK_CPU_SUITES:-}; do
    [ -x "$bin/$t" ] && step "$t" 300 env CJAX_LOG_FALLBACKS=1 CJAX_LOG_GRAPHS=1 "$bin/$t"
  done
  # CPU suites with the GPU as the default platform (CJAX_PLATFORM=cuda): created arrays live on the
  # GPU; primitives without a cuda kernel run as counted host fallbacks.
  for t in ${GPU_CHECK_PLATFORM_SUITES:-test_core}; do
    [ -x "$bin/$t" ] && step "cuda_default_$t" 240 env CJAX_PLATFORM=cuda "$bin/$t"
  done
fi
# The transformer sample on one GPU (f32 and bf16), and on this host's CPU cores for comparison.
train() {  # train <name> <steps> <flags...>
  local name=$1 steps=$2
  shift 2
  step "$name" 300 env CJAX_LOG_FALLBACKS=1 CJAX_LOG_GRAPHS=1 ${train_env:-} ${GPU_CHECK_PRELOAD:+LD_PRELOAD=$GPU_CHECK_PRELOAD} "$bin/train_transformer" --steps "$steps" \
    --data samples/data/kjv.txt --out "$out/$name" --checkpoint-every 100000 "$@"
  grep -h "first step" "$out/$name.log" | sed "s/^/$name: /" >> "$out/figures.txt"
}
# losses <a> <b>: the largest relative difference between two runs' loss columns.
losses() {
  python3 - "$out/$1/log.csv" "$out/$2/log.csv" <<'PY' | tee -a "$out/figures.txt"
import csv, sys
def col(p):
    try:
        return [float(r["loss"]) for r in csv.DictReader(open(p))]
    except OSError:
        return []
a, b = col(sys.argv[1]), col(sys.argv[2])
name = lambda p: p.split("/")[-2]
if not a or len(a) != len(b):
    print(f"{name(sys.argv[1])} vs {name(sys.argv[2])}: missing or unequal runs ({len(a)} and {len(b)} steps)")
else:
    d = max(abs(x - y) / max(abs(y), 1e-30) for x, y in zip(a, b))
    print(f"{name(sys.argv[1])} vs {name(sys.argv[2])}: {len(a)} steps, final {a[-1]:.5f} / {b[-1]:.5f}, "
          f"max relative difference {d:.3g}{' (identical)' if a == b else ''}")
PY
}
steps=${GPU_CHECK_TRAIN_STEPS:-300}
# jax_peer <name> <flags...>: the same model in JAX (bench/peers/jax_transformer.py), on the GPU.
jax_peer() {
  local name=$1
  shift
  step "$name" 300 env PYTHONUNBUFFERED=1 python3 bench/peers/jax_transformer.py --steps "$steps" \
    --data samples/data/kjv.txt --platform gpu "$@"
  grep -h "jax_transformer:" "$out/$name.log" | sed "s/^/$name: /" >> "$out/figures.txt"
}
if want train; then
  train train_cuda "$steps" --layout single --platform cuda
  # The step instruction by instruction (no CUDA graph): the same bits, slower.
  train_env=CJAX_CUDA_GRAPHS=0
  train train_cuda_nographs "$steps" --layout single --platform cuda
  train_env=
  losses train_cuda train_cuda_nographs
  jax_peer jax_f32_highest --dtype f32 --matmul-precision highest
  jax_peer jax_f32 --dtype f32
  train train_cuda_bf16 "$steps" --layout single --platform cuda --bf16
  jax_peer jax_bf16 --dtype bf16
  # A second process: the step's kernels come from the disk cache (CJAX_CACHE_DIR).
  train train_cuda_cached 20 --layout single --platform cuda
  train train_cpu "$steps" --layout single --platform cpu
  losses train_cuda train_cpu
fi
# The sharded layouts on 8 virtual devices of the GPU: losses as the CPU mesh's (to the GEMMs'
# rounding) and bitwise equal between two GPU runs; then the tutorial's MLP strategies on them.
mesh_steps=${GPU_CHECK_MESH_STEPS:-100}
want mesh && for layout in ${GPU_CHECK_MESH_LAYOUTS:-dp fsdp fsdp_tp fsdp:auto}; do
  flags=(--layout "${layout%%:*}" --devices 8)
  [[ $layout == *:auto ]] && flags+=(--mode auto)
  name=${layout/:/_}
  train "train_cuda_$name" "$mesh_steps" --platform cuda "${flags[@]}"
  train "train_cuda_${name}_again" "$mesh_steps" --platform cuda "${flags[@]}"
  train "train_cpu_$name" "$mesh_steps" --platform cpu "${flags[@]}"
  losses "train_cuda_$name" "train_cuda_${name}_again"
  losses "train_cuda_$name" "train_cpu_$name"
done
want mesh && for t in ${GPU_CHECK_MESH_SUITES:-test_examples_shard_map}; do
  [ -x "$bin/$t" ] && step "cuda_mesh_$t" 180 env CJAX_PLATFORM=cuda CJAX_NUM_CUDA_VIRTUAL_DEVICES=8 "$bin/$t"
done
[ -n "${GPU_CHECK_QUICK:-}" ] && { echo "==== figures"; cat "$out/figures.txt"; echo "==== summary"; printf '%s\n' "${summary[@]}"; exit 0; }
if want bench; then
  step bench_cuda 300 env CJAX_LOG_FALLBACKS=1 "$bin/bench_cuda"
  [ -z "${GPU_CHECK_NO_PEERS:-}" ] && step peers 300 env PYTHONUNBUFFERED=1 python3 bench/peers/cuda_eager_peers.py "$out/bench_cuda.log"
fi
if want sanitizer && command -v compute-sanitizer >/dev/null; then
  # The fused-kernel corpus under memcheck, racecheck (shared memory of the row reductions) and
  # synccheck (barriers); GPU_CHECK_FULL_SANITIZER=1 adds the eager kernels' suites.
  for tool in memcheck racecheck synccheck; do
    step "$tool"_jit 300 compute-sanitizer --tool "$tool" --error-exitcode 9 "$bin/test_cuda_jit" -tc='*corpus*'
  done
  if [ -n "${GPU_CHECK_FULL_SANITIZER:-}" ]; then
    step memcheck 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_cuda_device" \
      -tc='*device_put*,*weak scalars*,*host*,*errors*'
    step memcheck_kernels 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$bin/test_cuda_kernels"
  fi
fi
echo "==== figures"
cat "$out/figures.txt"
echo "==== summary"
printf '%s\n' "${summary[@]}"
