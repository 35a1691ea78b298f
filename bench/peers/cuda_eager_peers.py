"""The operations of bench/bench_cuda.cpp in PyTorch and JAX on the same GPU, and the ratios.

usage: python3 cuda_eager_peers.py <bench_cuda output file>
Times are medians of 20 runs after a warm-up, each synchronised like cjax's (wall clock around
the op and a device synchronisation).
"""
import os
import statistics
import sys
import time


def median_time(fn, reps=20):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def torch_rows():
    import torch
    dev = torch.device("cuda")
    rows = {}
    for n in (1 << 24, 1 << 26, 1 << 28):
        x = torch.ones(n, device=dev)
        y = torch.ones(n, device=dev)
        rows[f"add f32[{n >> 20}M]"] = median_time(lambda: (x + y, torch.cuda.synchronize()))
    n = 1 << 26
    xb = torch.ones(n, device=dev, dtype=torch.bfloat16)
    yb = xb * 2
    rows["mul bf16[64M]"] = median_time(lambda: (xb * yb, torch.cuda.synchronize()))
    xf = torch.ones(n, device=dev)
    rows["tanh f32[64M]"] = median_time(lambda: (torch.tanh(xf), torch.cuda.synchronize()))
    for n, dt, name in ((8192, torch.bfloat16, "bfloat16"), (4096, torch.bfloat16, "bfloat16"),
                        (4096, torch.float32, "float32"), (1024, torch.bfloat16, "bfloat16")):
        a = torch.ones(n, n, device=dev, dtype=dt)
        b = torch.ones(n, n, device=dev, dtype=dt) * 0.5
        rows[f"matmul {name}[{n}^3]"] = median_time(lambda: (a @ b, torch.cuda.synchronize()))
    m = torch.ones(512, 2048, device=dev)
    bias = torch.ones(2048, device=dev)
    for name, f in (("sum f32[512,2048] all", lambda: m.sum()), ("sum f32[512,2048] axis 0", lambda: m.sum(0)),
                    ("sum f32[512,2048] axis 1", lambda: m.sum(1)), ("bias add f32[512,2048]+[2048]", lambda: m + bias),
                    ("transpose f32[512,2048]", lambda: m.t().contiguous())):
        rows[name] = median_time(lambda: (f(), torch.cuda.synchronize()), 50)
    torch.manual_seed(0)
    batch, width = 512, 2048
    ps = [torch.randn(width, width, device=dev) * 0.02, torch.zeros(width, device=dev),
          torch.randn(width, width, device=dev) * 0.02, torch.zeros(width, device=dev),
          torch.randn(width, width, device=dev) * 0.02]
    for p in ps:
        p.requires_grad_(True)
    x = torch.randn(batch, width, device=dev)
    y = torch.randn(batch, width, device=dev)

    def step():
        h = torch.tanh(x @ ps[0] + ps[1])
        h = torch.tanh(h @ ps[2] + ps[3])
        loss = ((h @ ps[4] - y) ** 2).mean()
        grads = torch.autograd.grad(loss, ps)
        with torch.no_grad():
            for p, g in zip(ps, grads):
                p -= 0.01 * g
        torch.cuda.synchronize()
    rows["mlp step f32"] = median_time(step)
    a = torch.ones(1, device=dev)

    def chain():
        b = a
        for _ in range(10000):
            b = b + a
        torch.cuda.synchronize()
    rows["add f32[1] per op"] = median_time(chain, 5) / 10000
    return rows


def jax_rows():
    import jax
    import jax.numpy as jnp
    rows = {}
    for n in (1 << 24, 1 << 26, 1 << 28):
        x = jnp.ones(n)
        y = jnp.ones(n)
        rows[f"add f32[{n >> 20}M]"] = median_time(lambda: (x + y).block_until_ready())
    n = 1 << 26
    xb = jnp.ones(n, dtype=jnp.bfloat16)
    yb = xb * 2
    rows["mul bf16[64M]"] = median_time(lambda: (xb * yb).block_until_ready())
    xf = jnp.ones(n)
    rows["tanh f32[64M]"] = median_time(lambda: jnp.tanh(xf).block_until_ready())
    for n, dt, name in ((8192, jnp.bfloat16, "bfloat16"), (4096, jnp.bfloat16, "bfloat16"),
                        (4096, jnp.float32, "float32"), (1024, jnp.bfloat16, "bfloat16")):
        a = jnp.ones((n, n), dtype=dt)
        b = jnp.ones((n, n), dtype=dt) * 0.5
        rows[f"matmul {name}[{n}^3]"] = median_time(lambda: (a @ b).block_until_ready())
    a = jnp.ones(1)

    def chain():
        b = a
        for _ in range(10000):
            b = b + a
        b.block_until_ready()
    rows["add f32[1] per op"] = median_time(chain, 5) / 10000
    return rows


def main():
    ours = {}
    with open(sys.argv[1]) as f:
        for line in f:
            if line.startswith("ROW,"):
                name, t = line.strip()[len("ROW,"):].rsplit(",", 1)
                ours[name] = float(t)
    peers = {}
    for label, fn in (("torch", torch_rows), ("jax", jax_rows)):
        try:
            peers[label] = fn()
        except Exception as e:  # a missing peer is reported, not fatal
            print(f"{label}: not measured ({type(e).__name__}: {e})")
    import platform
    print(f"host: {platform.processor() or platform.machine()}")
    for label in peers:
        try:
            import importlib
            print(f"{label} {importlib.import_module(label).__version__}")
        except Exception:
            pass
    header = f"{'eager op':<24} {'cjax':>10}" + "".join(f" {p:>10} {'cjax/' + p:>11}" for p in peers)
    print(header)
    for name, t in ours.items():
        line = f"{name:<24} {t * 1e6:8.2f}us"
        for p, rows in peers.items():
            if name in rows:
                line += f" {rows[name] * 1e6:8.2f}us {t / rows[name]:10.2f}x"
        print(line)
    print("(cjax/peer < 1: cjax is faster)")


if __name__ == "__main__":
    main()
