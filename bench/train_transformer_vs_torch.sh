#!/usr/bin/env bash
# Training throughput of samples/train_transformer against its PyTorch CPU peer
# (bench/peers/torch_transformer.py), same model and config, measured in the same run.
#   bench/train_transformer_vs_torch.sh [build dir] [steps]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
steps=${2:-60}
bin=$build/samples/train_transformer
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# PyTorch with one intra-op thread and with one per core; the ratio is against the faster of the two.
torch_tps=""
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "PyTorch is not installed (python3-torch); cjax numbers only"
fi
printf "%-22s %14s %10s\n" "config" "tokens/s" "vs torch"
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  for t in 1 $(nproc); do
    tps=$(/usr/bin/python3 "$here/peers/torch_transformer.py" --steps "$steps" --threads "$t" | sed -n 's/^tokens_per_s=//p')
    printf "%-22s %14.0f\n" "pytorch 1.13, $t thr" "$tps"
    if [ -z "$torch_tps" ] || python3 -c "import sys; sys.exit(0 if $tps > $torch_tps else 1)"; then torch_tps=$tps; fi
  done
fi
# The sharded layouts twice: as the sample's shard_maps, and as plain jit partitioned by cjax (--mode auto).
for run in single dp fsdp fsdp_tp dp:auto fsdp:auto fsdp_tp:auto; do
  layout=${run%%:*}
  mode=shard_map
  [ "$run" != "$layout" ] && mode=auto
  line=$("$bin" --layout "$layout" --mode "$mode" --steps "$steps" --checkpoint-every 0 --sample-len 0 \
           --out "$out/$run" 2>/dev/null | grep '^final loss')
  tps=$(echo "$line" | sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p')
  if [ -n "$torch_tps" ]; then ratio=$(python3 -c "print('%.2fx' % ($tps / $torch_tps))"); else ratio="-"; fi
  name="cjax $layout"
  [ "$mode" = auto ] && name="cjax $layout (auto)"
  printf "%-22s %14.0f %10s\n" "$name" "$tps" "$ratio"
done
