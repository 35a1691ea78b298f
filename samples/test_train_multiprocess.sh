#!/usr/bin/env bash
# ctest: train_transformer as 4 processes x 2 CPU devices (one 8-device mesh, Gloo between the
# processes) logs the losses of one process with 8 virtual devices, for the fsdp and fsdp_tp
# layouts as the sample's shard_maps and fsdp as sharded jit (--mode auto); its checkpoint (each
# process writes its own blocks) resumes on 2 processes x 4 devices with the losses of the
# single-process run resumed from its own checkpoint.
#   samples/test_train_multiprocess.sh <train_transformer binary> <cjax_launch binary>
set -euo pipefail
bin=$1
launch=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
flags=(--layers 1 --d-model 64 --heads 8 --head-dim 8 --d-ff 128 --seq-len 32 --batch 16
       --checkpoint-every 0 --sample-len 0)
# The losses of two log.csv files agree to 1e-5 relative (the CSV keeps 6 significant digits).
same_losses() {
  python3 - "$1" "$2" <<'PY'
import sys
def losses(p):
    rows = [l.split(",") for l in open(p).read().split("\n")[1:] if l]
    return {int(r[0]): float(r[1]) for r in rows}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert a.keys() == b.keys() and a, f"steps differ: {sorted(a)[:3]}... vs {sorted(b)[:3]}..."
worst = max(abs(a[k] - b[k]) / max(abs(a[k]), 1e-30) for k in a)
print(f"{len(a)} steps, largest relative difference {worst:.2e}")
sys.exit(0 if worst <= 1e-5 else 1)
PY
}
for run in fsdp fsdp_tp fsdp:auto; do
  layout=${run%%:*}
  mode=shard_map
  [ "$run" != "$layout" ] && mode=auto
  name=${layout}_$mode
  CJAX_NUM_CPU_DEVICES=8 "$bin" "${flags[@]}" --layout "$layout" --mode "$mode" --steps 50 --out "$dir/one_$name" \
    > "$dir/one_$name.log" 2>&1 || { echo "FAIL: the one-process run failed:"; cat "$dir/one_$name.log"; exit 1; }
  "$launch" -n 4 --devices-per-process 2 --timeout 600 -- "$bin" "${flags[@]}" --layout "$layout" --mode "$mode" \
    --steps 50 --out "$dir/four_$name" > "$dir/four_$name.log" 2>&1 ||
    { echo "FAIL: the 4-process run failed:"; cat "$dir/four_$name.log"; exit 1; }
  echo -n "$layout ($mode), 4 processes x 2 devices vs 1 x 8: "
  same_losses "$dir/one_$name/log.csv" "$dir/four_$name/log.csv" || { echo "FAIL: losses differ"; exit 1; }
done
# The 4-process runs wrote sharded checkpoints: one file of blocks per process, and the index.
for k in 0 1 2 3; do
  [ -f "$dir/four_fsdp_shard_map/ckpt/process$k.0.safetensors" ] || { echo "FAIL: no checkpoint file of process $k"; ls -R "$dir/four_fsdp_shard_map"; exit 1; }
done
[ -f "$dir/four_fsdp_shard_map/ckpt/index.json" ] || { echo "FAIL: no checkpoint index"; exit 1; }
[ ! -e "$dir/four_fsdp_shard_map/ckpt.safetensors" ] || { echo "FAIL: a gathered checkpoint was written"; exit 1; }
# Resume the 4-process fsdp checkpoint on 2 processes x 4 devices; the one-process run resumes too.
CJAX_NUM_CPU_DEVICES=8 "$bin" "${flags[@]}" --layout fsdp --steps 60 --resume --out "$dir/one_fsdp_shard_map" \
  > "$dir/one_resume.log" 2>&1 || { echo "FAIL:"; cat "$dir/one_resume.log"; exit 1; }
"$launch" -n 2 --devices-per-process 4 --timeout 600 -- "$bin" "${flags[@]}" --layout fsdp --steps 60 --resume \
  --out "$dir/four_fsdp_shard_map" > "$dir/two_resume.log" 2>&1 || { echo "FAIL:"; cat "$dir/two_resume.log"; exit 1; }
grep -m1 "resumed" "$dir/two_resume.log"
echo -n "fsdp resumed on 2 processes x 4 devices vs 1 x 8: "
same_losses "$dir/one_fsdp_shard_map/log.csv" "$dir/four_fsdp_shard_map/log.csv" || { echo "FAIL: resumed losses differ"; exit 1; }
echo PASS
