#!/usr/bin/env bash
# Collective bandwidth between 2 processes on this machine: cjax over Gloo against PyTorch's Gloo
# (Debian python3-torch) and against cjax's in-process communicator, measured in the same run.
#   bench/multiprocess_vs_torch.sh [build dir]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# cjax and PyTorch take turns, twice each, and each keeps its best time per size: this VM's speed
# drifts over a minute, and one run of each put whole rows on the two sides of 1.0x.
has_torch=1
/usr/bin/python3 -c "import torch" 2>/dev/null || { has_torch=0; echo "PyTorch is not installed (python3-torch): no peer column" >&2; }
: > "$out/torch"
for round in 1 2; do
  "$build/cjax_launch" -n 2 --devices-per-process 1 -- "$build/bench/bench_multiprocess" | sed 's/^\[process 0\] //' >> "$out/cjax"
  [ "$has_torch" = 1 ] && /usr/bin/python3 "$here/peers/torch_gloo.py" >> "$out/torch"
done
CJAX_NUM_CPU_DEVICES=2 "$build/bench/bench_multiprocess" --in-process > "$out/local"
python3 - "$out" <<'PY'
import sys, os, platform
d = sys.argv[1]
def load(name):
    t = {}
    for line in open(os.path.join(d, name)):
        parts = line.split()
        if len(parts) == 3:
            key = (parts[0], int(parts[1]))
            t[key] = min(t.get(key, float("inf")), float(parts[2]))
    return t
cjax, local, torch = load("cjax"), load("local"), load("torch")
model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
isa = "AVX-512" if any("avx512f" in l.split() for l in open("/proc/cpuinfo") if l.startswith("flags")) else "AVX2"
print(f"host: {model}, {isa}, {os.cpu_count()} logical cores; 2 processes x 1 CPU device, Gloo over TCP on 127.0.0.1; "
      "best of two alternating runs each")
print(f"{'op':<15}{'bytes':>10}{'cjax GB/s':>11}{'torch GB/s':>11}{'vs torch':>9}{'in-process GB/s':>17}")
for (op, size), t in sorted(cjax.items(), key=lambda kv: (kv[0][0], kv[0][1])):
    gbs = lambda s: size / s / 1e9
    peer = torch.get((op, size))
    loc = local.get((op, size))
    print(f"{op:<15}{size:>10}{gbs(t):>11.2f}{(gbs(peer) if peer else float('nan')):>11.2f}"
          f"{(peer / t if peer else float('nan')):>8.2f}x{(gbs(loc) if loc else float('nan')):>17.2f}")
PY
