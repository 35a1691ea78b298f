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
    rows.update(jit_rows_torch(torch, dev))
    return rows


def chain15(np, x):
    """bench_cuda's 15-op elementwise chain (np: torch or jax.numpy)."""
    y = x * 1.5 + 0.25
    y = np.tanh(y) * x - 0.5
    y = np.exp(y * 0.125) + x * x
    return np.sqrt(np.abs(y) + 1.0) / (y * y + 2.0)


def jit_rows_torch(torch, dev):
    """torch.compile of the jit rows that matter most (compiles are slow: two shapes only)."""
    rows = {}
    try:
        chain = torch.compile(lambda x: chain15(torch, x))
        x = torch.randn(1 << 26, device=dev)
        rows["jit chain float32[64M]"] = median_time(lambda: (chain(x), torch.cuda.synchronize()))
        softmax = torch.compile(lambda x: torch.softmax(x, -1))
        m = torch.randn(4096, 4096, device=dev)
        rows["jit softmax float32[4096,4096]"] = median_time(lambda: (softmax(m), torch.cuda.synchronize()))
    except Exception as e:
        print(f"torch.compile: not measured ({type(e).__name__}: {e})")
    return rows


def jax_jit_rows(jax, jnp):
    rows = {}
    chain = jax.jit(lambda x: chain15(jnp, x))
    for n, dt in ((1 << 24, jnp.float32), (1 << 26, jnp.float32), (1 << 28, jnp.float32), (1 << 26, jnp.bfloat16)):
        x = jax.random.normal(jax.random.key(7), (n,)).astype(dt)
        rows[f"jit chain {jnp.dtype(dt).name}[{n >> 20}M]"] = median_time(lambda: chain(x).block_until_ready())
    softmax = jax.jit(lambda x: jax.nn.softmax(x, axis=-1))
    rms = jax.jit(lambda x, g: x * jax.lax.rsqrt(jnp.mean(x * x, -1, keepdims=True) + 1e-6) * g)

    def layer_norm(x, g, b):
        mu = jnp.mean(x, -1, keepdims=True)
        var = jnp.mean(jnp.square(x - mu), -1, keepdims=True)
        return (x - mu) / jnp.sqrt(var + 1e-5) * g + b
    ln = jax.jit(layer_norm)
    for r, c, dt in ((4096, 4096, jnp.float32), (32768, 1024, jnp.float32), (1024, 32768, jnp.float32),
                     (4096, 4096, jnp.bfloat16)):
        x = jax.random.normal(jax.random.key(8), (r, c)).astype(dt)
        name = jnp.dtype(dt).name
        rows[f"jit softmax {name}[{r},{c}]"] = median_time(lambda: softmax(x).block_until_ready())
        if dt == jnp.float32 and c == 1024:
            g, b = jnp.ones(c), jnp.zeros(c)
            rows[f"jit rms_norm {name}[{r},{c}]"] = median_time(lambda: rms(x, g).block_until_ready())
            rows[f"jit layer_norm {name}[{r},{c}]"] = median_time(lambda: ln(x, g, b).block_until_ready())
    tiny = jax.jit(lambda a, b: a * 0.5 + b)
    one = jnp.ones(1)
    acc = tiny(one, one)

    def calls():
        a = acc
        for _ in range(1000):
            a = tiny(a, one)
        a.block_until_ready()
    rows["jit tiny call"] = median_time(calls, 5) / 1000

    def loss(p, x, y):
        h = jnp.tanh(x @ p[0] + p[1])
        h = jnp.tanh(h @ p[2] + p[3])
        return jnp.mean(jnp.square(h @ p[4] - y))

    @jax.jit
    def step(p, x, y):
        value, grads = jax.value_and_grad(loss)(p, x, y)
        return value, [w - 0.01 * g for w, g in zip(p, grads)]
    k = jax.random.split(jax.random.key(1), 5)
    width, batch = 2048, 512
    state = {"p": [jax.random.normal(k[0], (width, width)) * 0.02, jnp.zeros(width),
                   jax.random.normal(k[1], (width, width)) * 0.02, jnp.zeros(width),
                   jax.random.normal(k[2], (width, width)) * 0.02]}
    x, y = jax.random.normal(k[3], (batch, width)), jax.random.normal(k[4], (batch, width))

    def run():
        value, state["p"] = step(state["p"], x, y)
        state["p"][-1].block_until_ready()
    rows["jit mlp step f32"] = median_time(run)
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
    rows.update(jax_jit_rows(jax, jnp))
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
            else:  # keep the columns aligned: this peer has no such row
                line += f" {'-':>10} {'-':>11}"
        print(line)
    print("(cjax/peer < 1: cjax is faster)")


if __name__ == "__main__":
    main()
