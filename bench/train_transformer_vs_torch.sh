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
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "PyTorch is not installed (python3-torch); cjax numbers only"
  torch_tps=""
else
  torch_tps=$(/usr/bin/python3 "$here/peers/torch_transformer.py" --steps "$steps" | sed -n 's/^tokens_per_s=//p')
fi
printf "%-22s %14s %10s\n" "config" "tokens/s" "vs torch"
[ -n "$torch_tps" ] && printf "%-22s %14.0f %10s\n" "pytorch (1 process)" "$torch_tps" "1.00x"
for layout in single dp fsdp fsdp_tp; do
  line=$("$bin" --layout "$layout" --steps "$steps" --checkpoint-every 0 --sample-len 0 --out "$out/$layout" 2>/dev/null |
         grep '^final loss')
  tps=$(echo "$line" | sed -n 's/.* \([0-9.]*\) tokens\/s.*/\1/p')
  if [ -n "$torch_tps" ]; then ratio=$(python3 -c "print('%.2fx' % ($tps / $torch_tps))"); else ratio="-"; fi
  printf "%-22s %14.0f %10s\n" "cjax $layout" "$tps" "$ratio"
done
