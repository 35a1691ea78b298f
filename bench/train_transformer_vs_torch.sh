#!/usr/bin/env bash
# Training throughput of samples/train_transformer against its PyTorch CPU peer
# (bench/peers/torch_transformer.py), same model and config, measured in the same run.
#   bench/train_transformer_vs_torch.sh [build dir] [steps] [runs]
# With runs > 1 every configuration runs that many times, each run followed by a PyTorch run of
# its own; the table gives the median tokens/s and the median and lowest of the ratios (on a
# shared VM one run's ratio moves by 10-20% with the neighbours' load).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
steps=${2:-60}
runs=${3:-1}
bin=$build/samples/train_transformer
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# PyTorch's settings: ATen's intra-op threads (torch.set_num_threads) and, apart from them, the
# threads of Debian's OpenBLAS (pthread build), which runs every GEMM on all cores unless
# OPENBLAS_NUM_THREADS says otherwise. So "1 ATen thread" still uses every core for the GEMMs
# (measured on a 2-core Zen 4: 25-27k tokens/s, against 19.5k with OPENBLAS_NUM_THREADS=1), and
# 2 ATen threads with OpenBLAS's 2 oversubscribe the cores (11.6k). The three settings below are
# measured once; the fastest is then run again right before each cjax configuration, and each ratio
# is against that neighbouring run (this VM's speed drifts by 10-30% over a minute, so one PyTorch
# figure for the whole table skewed the ratios).
torch_tps=""
torch_setting=""
# Under CJAX_ISA=avx2 (an AVX2-only host, emulated) the peer is held to AVX2 as well: ATen's kernels
# (ATEN_CPU_CAPABILITY=avx2) and OpenBLAS's (OPENBLAS_CORETYPE=Haswell, unless set). Without it
# ATen ran its AVX-512 kernels against cjax's AVX2 ones (2-core Zen 4: the peer 4-11% faster than
# with AVX2 kernels only, and torch.tanh 7x slower).
torch_isa=()
if [ "${CJAX_ISA:-native}" = avx2 ]; then
  torch_isa=(ATEN_CPU_CAPABILITY=avx2 "OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-Haswell}")
fi
torch_run() {  # torch_run ATEN_THREADS OPENBLAS_THREADS ("" = OpenBLAS's default: one per core)
  env "${torch_isa[@]}" ${2:+OPENBLAS_NUM_THREADS=$2} /usr/bin/python3 "$here/peers/torch_transformer.py" \
    --steps "$steps" --threads "$1" | sed -n 's/^tokens_per_s=//p'
}
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "PyTorch is not installed (python3-torch); cjax numbers only"
fi
model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
family=$(sed -n 's/^cpu family[[:space:]]*: //p' /proc/cpuinfo | head -1)
cpu_model=$(sed -n 's/^model[[:space:]]*: //p' /proc/cpuinfo | head -1)
isa=AVX2
grep -qw avx512f /proc/cpuinfo && isa=AVX-512
echo "host: $model (family $family, model $cpu_model), $isa, $(nproc) logical cores; cjax kernels: CJAX_ISA=${CJAX_ISA:-native}${torch_isa:+; PyTorch: ${torch_isa[*]}}"
if [ "$runs" -gt 1 ]; then
  printf "%-34s %14s %10s %14s %10s\n" "config" "tokens/s" "vs torch" "torch tokens/s" "lowest"
else
  printf "%-34s %14s %10s %14s\n" "config" "tokens/s" "vs torch" "torch tokens/s"
fi
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  for setting in "1:" "$(nproc):" "$(nproc):1"; do
    aten=${setting%%:*} blas=${setting##*:}
    tps=$(torch_run "$aten" "$blas")
    printf "%-34s %14.0f\n" "pytorch 1.13, ATen $aten thr, BLAS ${blas:-$(nproc)}" "$tps"
    if [ -z "$torch_tps" ] || python3 -c "import sys; sys.exit(0 if $tps > $torch_tps else 1)"; then
      torch_tps=$tps
      torch_setting=$setting
    fi
  done
fi
median() { python3 -c "import statistics, sys; print(statistics.median(float(v) for v in sys.argv[1:]))" "$@"; }
# The sharded layouts twice: as the sample's shard_maps, and as plain jit partitioned by cjax (--mode auto).
for run in single dp fsdp fsdp_tp dp:auto fsdp:auto fsdp_tp:auto; do
  layout=${run%%:*}
  mode=shard_map
  [ "$run" != "$layout" ] && mode=auto
  all_tps=() all_torch=() all_ratio=()
  for ((r = 0; r < runs; ++r)); do
    line=$("$bin" --layout "$layout" --mode "$mode" --steps "$steps" --checkpoint-every 0 --sample-len 0 \
             --out "$out/$run" 2>/dev/null | grep '^final loss')
    tps=$(echo "$line" | sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p')
    all_tps+=("$tps")
    if [ -n "$torch_tps" ]; then
      torch_tps=$(torch_run "${torch_setting%%:*}" "${torch_setting##*:}")
      all_torch+=("$torch_tps")
      all_ratio+=("$(python3 -c "print($tps / $torch_tps)")")
    fi
  done
  name="cjax $layout"
  [ "$mode" = auto ] && name="cjax $layout (auto)"
  if [ -n "$torch_tps" ]; then
    ratio=$(python3 -c "print('%.2fx' % $(median "${all_ratio[@]}"))")
    lowest=$(python3 -c "import sys; print('%.2fx' % min(float(v) for v in sys.argv[1:]))" "${all_ratio[@]}")
    torch_col=$(median "${all_torch[@]}")
  else
    ratio="-" lowest="-" torch_col=0
  fi
  if [ "$runs" -gt 1 ]; then
    printf "%-34s %14.0f %10s %14.0f %10s\n" "$name" "$(median "${all_tps[@]}")" "$ratio" "$torch_col" "$lowest"
  else
    printf "%-34s %14.0f %10s %14.0f\n" "$name" "$(median "${all_tps[@]}")" "$ratio" "$torch_col"
  fi
done
