# PyTorch CPU peer numbers for bench_foundation (single process, default threads).
import torch

from peer_timing import median

a, b = torch.ones(8), torch.ones(8)
n_ops = 100000
def dispatch():
    for _ in range(n_ops):
        c = a + b
print("add8_us=%f" % (median(dispatch, 5) / n_ops * 1e6))
x, y = torch.ones(16 << 20), torch.ones(16 << 20)
print("add16m_ms=%f" % (median(lambda: x + y, 9) * 1e3))
A, B = torch.full((1024, 1024), 0.5), torch.full((1024, 1024), 0.25)
print("mm1024_ms=%f" % (median(lambda: A @ B, 7) * 1e3))
print("sum16m_ms=%f" % (median(lambda: x.sum(), 9) * 1e3))
