# PyTorch CPU peer numbers for bench_compiler (eager mode) on `threads` intra-op threads:
#   python3 torch_compiler.py <threads> <tag>      (keys end in _<tag>: t1 or tN)
# Debian's torch does its matmuls in OpenBLAS, whose own thread count torch.set_num_threads does
# not change: the bench runs the 1-thread pass with OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1.
# Prints key=value lines; times are medians in ms / us.
import os
import sys
import time

import torch
import torch.nn.functional as F

nthreads = int(sys.argv[1]) if len(sys.argv) > 1 else os.cpu_count()
tag = sys.argv[2] if len(sys.argv) > 2 else "t%d" % nthreads
print("default_threads_%s=%d" % (tag, torch.get_num_threads()))


from peer_timing import median


# 1. The 10-op chain on 16M f32 (same ops and constants as bench_compiler.cpp).
x = torch.rand(16 << 20) * 4 - 2


def chain(x):
    a = x * 1.5
    b = a + 0.5
    c = torch.tanh(b)
    d = c * x
    e = d - 0.25
    r = torch.relu(e)
    g = r * 2.0
    s = torch.sigmoid(g)
    h = s + x
    return h * 0.5


# 2. Row softmax of f32[4096, 4096].
sm = torch.rand(4096, 4096)

# 3. MLP 784-128x5-8, relu, softmax cross-entropy (mean over the batch), batch 32, SGD lr 0.01.
sizes = [784, 128, 128, 128, 128, 128, 8]
torch.manual_seed(0)
params = []
for i in range(6):
    params.append((torch.randn(sizes[i], sizes[i + 1]) * 0.05).requires_grad_())
    params.append(torch.zeros(sizes[i + 1]).requires_grad_())
xb = torch.randn(32, 784)
labels = torch.randint(0, 8, (32,))


def step():
    h = xb
    for i in range(6):
        h = torch.addmm(params[2 * i + 1], h, params[2 * i])
        if i < 5:
            h = torch.relu(h)
    loss = F.cross_entropy(h, labels)
    for p in params:
        p.grad = None
    loss.backward()
    with torch.no_grad():
        for p in params:
            p.add_(p.grad, alpha=-0.01)
    return loss


def mlp_loop(n):
    def run():
        for _ in range(n):
            step()
    return run


torch.set_num_threads(nthreads)
with torch.no_grad():
    print("chain_ms_%s=%f" % (tag, median(lambda: chain(x), 5) * 1e3))
    print("softmax_ms_%s=%f" % (tag, median(lambda: torch.softmax(sm, -1), 7) * 1e3))
n = 50
print("mlp_step_us_%s=%f" % (tag, median(mlp_loop(n), 5) / n * 1e6))
if nthreads == 1:  # process CPU time: robust when other processes load the machine
    with torch.no_grad():
        print("chain_cpu_ms_%s=%f" % (tag, median(lambda: chain(x), 5, time.process_time) * 1e3))
    print("mlp_step_cpu_us_%s=%f" % (tag, median(mlp_loop(n), 5, time.process_time) / n * 1e6))
