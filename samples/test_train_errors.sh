#!/usr/bin/env bash
# ctest: train_transformer's edge cases (issue 16) with a tiny model: --data naming a directory is a
# message with the path and exit 1; --resume of a finished run says it is complete, prints its sample
# and exits 0, removing temporaries left by killed saves; a diverging loss stops with exit 1 and the
# step and value, without a checkpoint.
#   samples/test_train_errors.sh <train_transformer binary>
set -euo pipefail
bin=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
flags=(--layout single --layers 1 --d-model 16 --heads 2 --head-dim 8 --d-ff 32 --seq-len 16 --batch 4
       --sample-len 8 --checkpoint-every 0)
fail() {
  echo "FAIL: $1"
  shift
  for f in "$@"; do cat "$f"; done
  exit 1
}
run() {  # run <log> <args...>: sets rc
  local log=$1
  shift
  set +e
  "$bin" "${flags[@]}" "$@" > "$log" 2>&1
  rc=$?
  set -e
}

# --data naming a directory (was: abort on an uncaught std::ios_base::failure).
mkdir "$dir/textdir"
run "$dir/dir.log" --steps 2 --data "$dir/textdir" --out "$dir/x"
[ $rc -eq 1 ] || fail "--data <directory> gave exit $rc" "$dir/dir.log"
grep -F "corpus '$dir/textdir' is a directory; pass a text file" "$dir/dir.log" ||
  fail "no message naming the directory" "$dir/dir.log"

# --resume of a finished run (was: "use of an empty Array handle").
run "$dir/a.log" --steps 3 --out "$dir/a"
[ $rc -eq 0 ] || fail "the 3-step run gave exit $rc" "$dir/a.log"
bash -c 'exit 0' &
dead=$!
wait $dead || true
touch "$dir/a/.ckpt.safetensors.cjax-tmp.$dead.0" "$dir/a/.loss.svg.cjax-tmp.$dead.0"
csv_before=$(cat "$dir/a/log.csv")
run "$dir/a2.log" --steps 3 --out "$dir/a" --resume
[ $rc -eq 0 ] || fail "--resume of the finished run gave exit $rc" "$dir/a2.log"
grep "the run is already complete at step 3" "$dir/a2.log" || fail "no 'already complete' message" "$dir/a2.log"
grep -- "---- sample" "$dir/a2.log" > /dev/null || fail "no sample printed" "$dir/a2.log"
[ "$(cat "$dir/a/log.csv")" = "$csv_before" ] || fail "log.csv changed" "$dir/a/log.csv"
for f in .ckpt.safetensors.cjax-tmp.$dead.0 .loss.svg.cjax-tmp.$dead.0; do
  [ ! -e "$dir/a/$f" ] || fail "the stale temporary $f is still there" "$dir/a2.log"
done

# A diverging loss (learning rate 1e30).
run "$dir/nan.log" --steps 6 --lr 1e30 --warmup 0 --out "$dir/n"
[ $rc -eq 1 ] || fail "the diverging run gave exit $rc" "$dir/nan.log"
grep -E "the loss became non-finite at step [0-9]+ \(loss -?(nan|inf)\)" "$dir/nan.log" ||
  fail "no message with the step and the loss" "$dir/nan.log"
[ ! -e "$dir/n/ckpt.safetensors" ] || fail "a checkpoint of the diverged state was saved" "$dir/nan.log"
echo PASS
