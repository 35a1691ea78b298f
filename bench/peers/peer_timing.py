# The timing rule every CPU peer script shares with bench/harness.h: one warm-up call, then the
# median of `reps` timed calls, in seconds.
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
