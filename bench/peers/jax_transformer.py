# JAX peer of samples/train_transformer --layout single (and of bench/peers/torch_transformer.py):
# the same byte-level transformer (token + position embeddings, post-norm blocks with causal
# multi-head attention and a GELU(tanh) MLP, RMSNorm with a gain, output projection, token-mean
# softmax cross-entropy), the same initialisation scales and Adam (standard form, lr warmup), on the
# same text, on one device. The whole step (loss, value_and_grad, Adam) is one jax.jit that donates
# the parameters and the Adam state. Prints the throughput measured from the end of the first step
# (which includes compilation) to the end of the last, and the model FLOP/s.
#
#   python3 bench/peers/jax_transformer.py [--steps N] [--batch B] [--seq-len S] [--d-model D]
#       [--heads N] [--head-dim H] [--d-ff F] [--layers L] [--lr X] [--warmup N] [--data FILE]
#       [--dtype f32|bf16] [--platform cpu|gpu|cuda] [--matmul-precision default|high|highest]
import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from peer_timing import transformer_arguments

p = transformer_arguments()
p.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
p.add_argument("--platform", default=None)  # cpu | gpu | cuda | ...; default: JAX's default backend
# JAX lets XLA use TF32 for f32 matmuls on GPU by default; cjax and PyTorch compute them in strict
# f32 ('highest' here). Left unset: JAX's default, as a JAX user would run it.
p.add_argument("--matmul-precision", choices=["default", "high", "highest"], default=None)
a = p.parse_args()
if a.steps < 2:
    p.error("--steps must be >= 2 (the first step, with compilation, is not timed)")
if a.threads:
    print("jax_transformer: --threads is ignored (XLA chooses its own thread count)", file=sys.stderr)
if a.matmul_precision:
    jax.config.update("jax_default_matmul_precision", a.matmul_precision)
dev = jax.devices(a.platform)[0]
dtype = jnp.bfloat16 if a.dtype == "bf16" else jnp.float32
V, S, D, N, H, Fd, L = 256, a.seq_len, a.d_model, a.heads, a.head_dim, a.d_ff, a.layers
B1, B2, EPS = 0.9, 0.999, 1e-8

# Parameters: normal * scale drawn in f32 (one key per leaf), then cast to the compute dtype.
shapes = {"embed": ((V, D), 1.0), "pos": ((S, D), 0.1), "out": ((D, V), D ** -0.5)}
for l in range(L):
    shapes[f"qkv{l}"] = ((3, D, N, H), D ** -0.5)
    shapes[f"o{l}"] = ((N, H, D), (N * H) ** -0.5)
    shapes[f"in{l}"] = ((D, Fd), D ** -0.5)
    shapes[f"outm{l}"] = ((Fd, D), Fd ** -0.5)
keys = jax.random.split(jax.random.key(0), len(shapes))
params = {k: (jax.random.normal(keys[i], shp, jnp.float32) * sc).astype(dtype)
          for i, (k, (shp, sc)) in enumerate(shapes.items())}
for l in range(L):
    params[f"g1{l}"] = jnp.ones((D,), dtype)
    params[f"g2{l}"] = jnp.ones((D,), dtype)
params = jax.device_put(params, dev)
# Adam state (mu, nu, step count). The moments are kept in the parameters' dtype (bf16 under
# --dtype bf16), as optax's adam does by default and as the C++ sample's --bf16 does; the update
# arithmetic is done in f32 as in the sample.
opt = jax.device_put((jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params),
                      jnp.zeros((), jnp.int32)), dev)


def rms(x, g):  # RMSNorm computed in f32 (as cjax's nn::rms_norm), cast back to x's dtype
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6) * g.astype(jnp.float32)).astype(x.dtype)


def loss_fn(params, tokens):
    ids, tgt = tokens[:, :-1], tokens[:, 1:]
    T = ids.shape[1]
    x = params["embed"][ids] + params["pos"][:T]
    mask = jnp.tril(jnp.ones((T, T), bool))  # query t sees keys s <= t
    for l in range(L):
        qkv = jnp.einsum("bsd,cdnh->cbsnh", x, params[f"qkv{l}"])
        # Scale, mask and softmax in f32, the probabilities cast back to the compute dtype for the
        # second product (the usual bf16 recipe; no preferred_element_type, whose backward pass
        # would run f32 matmuls).
        logits = jnp.einsum("btnh,bsnh->bnts", qkv[0], qkv[1]).astype(jnp.float32) / H ** 0.5
        logits = jnp.where(mask, logits, -0.7 * float(np.finfo(np.float32).max))
        probs = jax.nn.softmax(logits, -1).astype(x.dtype)
        o = jnp.einsum("bnts,bsnh->btnh", probs, qkv[2])
        y = rms(jnp.einsum("bsnh,nhd->bsd", o, params[f"o{l}"]) + x, params[f"g1{l}"])
        u = jax.nn.gelu(y @ params[f"in{l}"], approximate=True)
        x = rms(u @ params[f"outm{l}"] + y, params[f"g2{l}"])
    logp = jax.nn.log_softmax((x @ params["out"]).astype(jnp.float32), -1)
    return -jnp.mean(jnp.take_along_axis(logp, tgt[..., None], -1))


@functools.partial(jax.jit, donate_argnums=(0, 1))
def train_step(params, opt, tokens, lr):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens)
    mu, nu, count = opt
    count = count + 1
    t = count.astype(jnp.float32)
    bc1, bc2 = 1 - B1 ** t, 1 - B2 ** t
    f32 = lambda z: z.astype(jnp.float32)
    mu = jax.tree.map(lambda m, g: (B1 * f32(m) + (1 - B1) * f32(g)).astype(m.dtype), mu, grads)
    nu = jax.tree.map(lambda v, g: (B2 * f32(v) + (1 - B2) * jnp.square(f32(g))).astype(v.dtype), nu, grads)
    params = jax.tree.map(
        lambda w, m, v: (f32(w) - lr * (f32(m) / bc1) / (jnp.sqrt(f32(v) / bc2) + EPS)).astype(w.dtype), params, mu, nu)
    return params, (mu, nu, count), loss


data = np.frombuffer(open(a.data, "rb").read(), dtype=np.uint8)
rng = np.random.default_rng(0)


def batch():  # a.batch random windows of S + 1 bytes, sampled on the host, placed on the device
    off = rng.integers(0, len(data) - S - 1, size=a.batch)
    return jax.device_put((data[off[:, None] + np.arange(S + 1)]).astype(np.int32), dev)


def lr_at(step):  # host-side linear warmup, passed as an f32 scalar (no recompilation)
    return np.float32(a.lr * min(1.0, (step + 1) / a.warmup) if a.warmup else a.lr)


print("jax_transformer: platform=%s device=%s dtype=%s jax=%s steps=%d batch=%d seq=%d"
      % (dev.platform, dev.device_kind, a.dtype, jax.__version__, a.steps, a.batch, S))
t_start = time.perf_counter()
params, opt, loss = train_step(params, opt, batch(), lr_at(0))
loss.block_until_ready()
t0 = time.perf_counter()
print("jax_transformer: first step %.3f s (compile included)" % (t0 - t_start))
for step in range(1, a.steps):
    params, opt, loss = train_step(params, opt, batch(), lr_at(step))
loss.block_until_ready()
el = time.perf_counter() - t0
tok_s = (a.steps - 1) * a.batch * S / el
print("jax_transformer: %d tokens/s, final loss %.4f" % (tok_s, float(loss)))
# Model FLOPs per token (the PaLM / Chinchilla estimate): 6 * N + 12 * layers * seq_len * d_model,
# N = the parameters excluding the token and position embeddings (gathers, not matmuls; the untied
# output projection and the norm gains are counted); 6 = forward 2 + backward 4 per weight, and
# 12 * L * S * D the attention scores and weighted sums (forward 4 * S * D per layer, exact when
# heads * head_dim == d_model as in the defaults; the causal mask is not discounted).
n_params = sum(v.size for k, v in params.items() if k not in ("embed", "pos"))
flops_per_token = 6 * n_params + 12 * L * S * D
print("jax_transformer: model FLOPs per token %d, %.2f TFLOP/s achieved"
      % (flops_per_token, flops_per_token * tok_s / 1e12))
