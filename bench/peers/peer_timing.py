# The timing rule every CPU peer script shares with bench/harness.h: one warm-up call, then the
# median of `reps` timed calls, in seconds.
import argparse
import os
import time


def median(fn, reps, clock=time.perf_counter):
    fn()
    ts = []
    for _ in range(reps):
        t = clock()
        fn()
        ts.append(clock() - t)
    ts.sort()
    return ts[len(ts) // 2]


def transformer_arguments():
    """The flags of samples/train_transformer's model that its peers share (same defaults)."""
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=16)
    p.add_argument("--d-ff", type=int, default=512)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--data", default=os.path.join(os.path.dirname(__file__), "..", "..", "samples", "data", "kjv.txt"))
    return p
