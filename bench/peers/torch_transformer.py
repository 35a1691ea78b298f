# PyTorch CPU peer of samples/train_transformer: the same byte-level transformer (token + position
# embeddings, post-norm blocks with causal multi-head attention and a GELU(tanh) MLP, RMSNorm with a
# gain, output projection, token-mean softmax cross-entropy), the same initialisation scales and
# Adam (standard form, lr warmup), on the same text, single process, default threads. Prints the
# training throughput after the first (warm-up) steps.
#
#   python3 bench/peers/torch_transformer.py [--steps N] [--batch B] [--seq-len S] [--d-model D]
#       [--heads N] [--head-dim H] [--d-ff F] [--layers L] [--lr X] [--data FILE]
import math
import time

import torch
import torch.nn.functional as F

from peer_timing import transformer_arguments

p = transformer_arguments()
a = p.parse_args()
if a.threads:
    torch.set_num_threads(a.threads)
torch.manual_seed(0)
V, S, D, N, H, Fd, L = 256, a.seq_len, a.d_model, a.heads, a.head_dim, a.d_ff, a.layers


def normal(shape, scale):
    return torch.nn.Parameter(torch.randn(*shape) * scale)


params = {"embed": normal((V, D), 1.0), "pos": normal((S, D), 0.1), "out": normal((D, V), D ** -0.5)}
for l in range(L):
    params[f"qkv{l}"] = normal((3, D, N, H), D ** -0.5)
    params[f"o{l}"] = normal((N, H, D), (N * H) ** -0.5)
    params[f"in{l}"] = normal((D, Fd), D ** -0.5)
    params[f"outm{l}"] = normal((Fd, D), Fd ** -0.5)
    params[f"g1{l}"] = torch.nn.Parameter(torch.ones(D))
    params[f"g2{l}"] = torch.nn.Parameter(torch.ones(D))
mask = torch.tril(torch.ones(S, S, dtype=torch.bool))


def rms(x, g):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * g


def loss_fn(tokens):
    ids, tgt = tokens[:, :-1], tokens[:, 1:]
    x = params["embed"][ids] + params["pos"][: ids.shape[1]]
    for l in range(L):
        qkv = torch.einsum("bsd,cdnh->cbnsh", x, params[f"qkv{l}"])
        logits = torch.einsum("bnth,bnsh->bnts", qkv[0], qkv[1]) / math.sqrt(H)
        logits = logits.masked_fill(~mask, -0.7 * torch.finfo(torch.float32).max)
        o = torch.einsum("bnts,bnsh->btnh", torch.softmax(logits, -1), qkv[2])
        y = rms(torch.einsum("bsnh,nhd->bsd", o, params[f"o{l}"]) + x, params[f"g1{l}"])
        u = F.gelu(y @ params[f"in{l}"], approximate="tanh")
        x = rms(u @ params[f"outm{l}"] + y, params[f"g2{l}"])
    return F.cross_entropy((x @ params["out"]).reshape(-1, V), tgt.reshape(-1))


data = torch.tensor(list(open(a.data, "rb").read()), dtype=torch.long)
opt = torch.optim.Adam(params.values(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8)
g = torch.Generator().manual_seed(0)
warm = 5
t0 = None
for step in range(a.steps):
    if step == warm:
        t0 = time.perf_counter()
    for grp in opt.param_groups:
        grp["lr"] = a.lr * min(1.0, (step + 1) / a.warmup) if a.warmup else a.lr
    off = torch.randint(0, len(data) - S - 1, (a.batch,), generator=g)
    tokens = torch.stack([data[o : o + S + 1] for o in off])
    loss = loss_fn(tokens)
    opt.zero_grad()
    loss.backward()
    opt.step()
el = time.perf_counter() - t0
print("torch_version=%s threads=%d" % (torch.__version__, torch.get_num_threads()))
print("final_loss=%f" % loss.item())
print("tokens_per_s=%f" % ((a.steps - warm) * a.batch * S / el))
