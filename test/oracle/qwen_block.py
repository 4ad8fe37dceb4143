"""Float64 PyTorch oracle for a Qwen2-style transformer block with LoRA adapters.

Mirrored by test/test_nn.cpp ("the block matches PyTorch float64"), layer for
layer, from the very input bits written here:

    h   = rmsnorm(x, norm_in)
    q,k,v = lora(h, W, A, B) + bias          (Qwen2 has q/k/v biases)
    ctx = grouped-query attention: RoPE (NEOX half split) on q and k,
          q.k^T / sqrt(head_dim) + causal mask, softmax, times v
    x2  = x + lora(ctx, Wo, Ao, Bo)
    h2  = rmsnorm(x2, norm_post)
    x3  = x2 + lora(silu(lora(h2, Wg)) * lora(h2, Wu), Wd)
    logits = x3 . W_vocab
    loss = cross_entropy(logits[:-1], tokens[1:])     (next-token prediction)

lora(x, W, A, B) = x.W + scale * (x.A).B. The 14 adapter tensors A_*, B_* are
the only parameters; everything else is a constant.

Names in the golden file: "sizes" (t, d, n_heads, n_kv_heads, head_dim, ffn,
vocab, rank), "scalars" (eps, lora scale, rope base), "tokens", "x", the base
weights, the adapters "a_<m>" and "b_<m>" for m in q k v o gate up down,
"rope_cos" and "rope_sin" (the tables, for checking nn::rope_tables),
"logits", "loss" and the gradients "grad_a_<m>", "grad_b_<m>".

Run with Debian's interpreter (the only one that sees python3-torch):
    /usr/bin/python3 test/oracle/qwen_block.py [output path]
Without an argument it rewrites qwen_block_golden.txt beside this script.
"""

import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden import write_golden  # noqa: E402

T, D, N_HEADS, N_KV, HD, FFN, VOCAB, RANK = 6, 16, 4, 2, 4, 24, 11, 2
EPS, SCALE, BASE = 1e-6, 2.0, 10000.0
MODULES = ["q", "k", "v", "o", "gate", "up", "down"]


def make_inputs():
    g = torch.Generator().manual_seed(20261130)

    def randn(*shape, std=1.0):
        return torch.randn(*shape, generator=g, dtype=torch.float64) * std

    def near_one(n):
        return 1.0 + 0.1 * randn(n)

    dims = {  # module -> (in, out)
        "q": (D, N_HEADS * HD), "k": (D, N_KV * HD), "v": (D, N_KV * HD), "o": (N_HEADS * HD, D),
        "gate": (D, FFN), "up": (D, FFN), "down": (FFN, D),
    }
    inp = {}
    inp["tokens"] = torch.randint(0, VOCAB, (T,), generator=g).to(torch.float64)
    inp["x"] = randn(T, D)
    inp["norm_in"] = near_one(D)
    inp["norm_post"] = near_one(D)
    for m, (i, o) in dims.items():
        inp["w_" + m] = randn(i, o, std=1 / math.sqrt(i))
    for m in ["q", "k", "v"]:
        inp["bias_" + m] = randn(dims[m][1], std=0.1)
    inp["w_vocab"] = randn(D, VOCAB, std=1 / math.sqrt(D))
    for m, (i, o) in dims.items():
        # B is nonzero here (PEFT would start it at 0) so that every gradient is.
        inp["a_" + m] = randn(i, RANK, std=1 / math.sqrt(i))
        inp["b_" + m] = randn(RANK, o, std=0.1)
    return inp


def rope_tables():
    inv_freq = 1.0 / (BASE ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD))
    angles = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat([angles, angles], dim=-1)
    return emb.cos(), emb.sin()


def rotate_half(h):
    return torch.cat([-h[..., HD // 2:], h[..., : HD // 2]], dim=-1)


def forward(p, cos, sin):
    def rmsnorm(x, w):
        return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w

    def lora(x, m):
        return x @ p["w_" + m] + (x @ p["a_" + m]) @ p["b_" + m] * SCALE

    x = p["x"]
    h = rmsnorm(x, p["norm_in"])
    q = lora(h, "q") + p["bias_q"]
    k = lora(h, "k") + p["bias_k"]
    v = lora(h, "v") + p["bias_v"]
    q = q.view(T, N_HEADS, HD).transpose(0, 1)
    k = k.view(T, N_KV, HD).transpose(0, 1)
    v = v.view(T, N_KV, HD).transpose(0, 1)
    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    group = N_HEADS // N_KV  # query head i reads key/value head i // group (HF repeat_kv)
    k = k.repeat_interleave(group, dim=0)
    v = v.repeat_interleave(group, dim=0)
    mask = torch.triu(torch.full((T, T), -1e9, dtype=torch.float64), diagonal=1)
    scores = q @ k.transpose(-1, -2) * (1 / math.sqrt(HD)) + mask
    ctx = (torch.softmax(scores, dim=-1) @ v).transpose(0, 1).reshape(T, N_HEADS * HD)
    x2 = x + lora(ctx, "o")
    h2 = rmsnorm(x2, p["norm_post"])
    x3 = x2 + lora(F.silu(lora(h2, "gate")) * lora(h2, "up"), "down")
    logits = x3 @ p["w_vocab"]
    tokens = p["tokens"].long()
    return logits, F.cross_entropy(logits[:-1], tokens[1:])


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                             "qwen_block_golden.txt")
    p = make_inputs()
    adapters = [p[s + "_" + m] for m in MODULES for s in ("a", "b")]
    for a in adapters:
        a.requires_grad_(True)
    cos, sin = rope_tables()
    logits, loss = forward(p, cos, sin)
    loss.backward()
    golden = {
        "sizes": torch.tensor([T, D, N_HEADS, N_KV, HD, FFN, VOCAB, RANK], dtype=torch.float64),
        "scalars": torch.tensor([EPS, SCALE, BASE], dtype=torch.float64),
    }
    golden.update(p)
    golden["rope_cos"], golden["rope_sin"] = cos, sin
    golden["logits"] = logits
    golden["loss"] = loss.reshape(1)
    for m in MODULES:
        for s in ("a", "b"):
            golden["grad_" + s + "_" + m] = p[s + "_" + m].grad
    write_golden(out, golden, header="Qwen2-style block with LoRA adapters, float64, torch " + torch.__version__ +
                 "\nwritten by test/oracle/qwen_block.py")


if __name__ == "__main__":
    main()
