#!/usr/bin/env bash
# ctest: train_transformer killed with SIGKILL mid-training and resumed with --resume logs exactly the
# losses of an uninterrupted run; a truncated checkpoint is an IoError naming the file (exit 1).
#   samples/test_train_resume.sh <train_transformer binary>
set -euo pipefail
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
flags=(--layout fsdp --layers 1 --d-model 64 --heads 8 --head-dim 8 --d-ff 128 --seq-len 32 --batch 16
       --steps 400 --checkpoint-every 50 --sample-len 0)
"$bin" "${flags[@]}" --out "$dir/a" > "$dir/a.log" 2>&1 || { echo "FAIL: the uninterrupted run failed:"; cat "$dir/a.log"; exit 1; }
"$bin" "${flags[@]}" --out "$dir/b" > "$dir/b.log" 2>&1 &
pid=$!
while ! [ -f "$dir/b/log.csv" ] || [ "$(wc -l < "$dir/b/log.csv")" -lt 180 ]; do
  kill -0 $pid 2>/dev/null || { echo "FAIL: the run ended before it could be killed:"; cat "$dir/b.log"; exit 1; }
  sleep 0.01
done
kill -9 $pid
wait $pid 2>/dev/null || true
killed_at=$(($(wc -l < "$dir/b/log.csv") - 1))
"$bin" "${flags[@]}" --out "$dir/b" --resume > "$dir/b2.log" 2>&1
grep resumed "$dir/b2.log"
if ! diff <(cut -d, -f1,2 "$dir/a/log.csv") <(cut -d, -f1,2 "$dir/b/log.csv"); then
  echo "FAIL: killed after $killed_at logged steps, the resumed run's losses differ"
  exit 1
fi
echo "killed after $killed_at logged steps; resumed losses identical for $(($(wc -l < "$dir/a/log.csv") - 1)) steps"
head -c 2000 "$dir/b/ckpt.safetensors" > "$dir/trunc.safetensors"
mkdir "$dir/c" && mv "$dir/trunc.safetensors" "$dir/c/ckpt.safetensors"
set +e
"$bin" "${flags[@]}" --out "$dir/c" --resume > "$dir/c.log" 2>&1
rc=$?
set -e
if [ $rc -ne 1 ] || ! grep -q "ckpt.safetensors" "$dir/c.log"; then
  echo "FAIL: a truncated checkpoint gave exit $rc:"; cat "$dir/c.log"; exit 1
fi
grep "ckpt.safetensors" "$dir/c.log"
echo PASS
