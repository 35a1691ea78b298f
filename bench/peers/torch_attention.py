# PyTorch CPU peer rows for bench_attention: causal attention forward and forward+backward.
# PyTorch 1.13 (Debian's python3-torch) has no scaled_dot_product_attention; where it exists
# (2.x) it is used, else the math path SDPA falls back to on CPU: softmax(q k^T * scale + mask) v.
# Usage: torch_attention.py B T N H dtype(f32|bf16) reps
import sys, math
import torch

B, T, N, H = (int(a) for a in sys.argv[1:5])
dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[sys.argv[5]]
reps = int(sys.argv[6])
g = torch.Generator().manual_seed(0)
q, k, v = (torch.randn(B, N, T, H, generator=g).to(dtype).requires_grad_() for _ in range(3))
w = torch.randn(B, N, T, H, generator=g).to(dtype)
sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)
mask = torch.full((T, T), float("-inf")).triu(1).to(dtype)

def attend():
    if sdpa is not None:
        return sdpa(q, k, v, is_causal=True)
    s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(H)) + mask
    return torch.softmax(s.float(), dim=-1).to(dtype) @ v

from peer_timing import median

def fwd():
    with torch.no_grad():
        attend()

def fwd_bwd():
    q.grad = k.grad = v.grad = None
    (attend() * w).sum().backward()

print("impl=%s" % ("sdpa" if sdpa is not None else "matmul_softmax"))
print("fwd_ms=%f" % (median(fwd, reps) * 1e3))
print("fwd_bwd_ms=%f" % (median(fwd_bwd, reps) * 1e3))
