"""The grad::nn::Lm model (include/grad/lm.hpp) in PyTorch, shared by the
float64 oracle (lm_oracle.py) and the speed peer (bench/peer_torch_lm.py).

Per block (pre-norm, Qwen2 without q/k/v biases):
    h = rmsnorm(x, attn_norm); x = x + attention(h.Wq, h.Wk, h.Wv) . Wo
    h = rmsnorm(x, mlp_norm);  x = x + (silu(h.Wgate) * h.Wup) . Wdown
logits = rmsnorm(x, final_norm) . head. Attention: RoPE (NEOX half split,
inv_freq = 1 / base^(2j/hd)), each key/value head repeated for its group of
query heads, q.k^T / sqrt(hd) + causal mask (-1e9 above the diagonal),
softmax, times v. Weights are [in, out]."""

import math

import torch
import torch.nn.functional as F

MODULES = ["q", "k", "v", "o", "gate", "up", "down"]


def proj_shape(cfg, m):
    d, hd = cfg["d"], cfg["d"] // cfg["heads"]
    return {"q": (d, cfg["heads"] * hd), "k": (d, cfg["kv"] * hd), "v": (d, cfg["kv"] * hd),
            "o": (cfg["heads"] * hd, d), "gate": (d, cfg["ffn"]), "up": (d, cfg["ffn"]), "down": (cfg["ffn"], d)}[m]


def init_params(cfg, gen, dtype):
    def u(shape, bound):
        return ((torch.rand(*shape, generator=gen, dtype=torch.float64) * 2 - 1) * bound).to(dtype)

    p = {"embed": u((cfg["vocab"], cfg["d"]), 0.5 * math.sqrt(3))}
    for l in range(cfg["layers"]):
        p[f"layers.{l}.attn_norm"] = (1 + 0.1 * u((cfg["d"],), 1)).to(dtype)
        p[f"layers.{l}.mlp_norm"] = (1 + 0.1 * u((cfg["d"],), 1)).to(dtype)
        for m in MODULES:
            i, o = proj_shape(cfg, m)
            p[f"layers.{l}.{m}"] = u((i, o), math.sqrt(3 / i))
    p["final_norm"] = (1 + 0.1 * u((cfg["d"],), 1)).to(dtype)
    p["head"] = u((cfg["d"], cfg["vocab"]), math.sqrt(3 / cfg["d"]))
    return p


def rope_tables(t, hd, base, dtype):
    inv = 1.0 / (base ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    ang = torch.arange(t, dtype=torch.float64)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rmsnorm(x, w, eps):
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps) * w


def rope(h, cos, sin):
    half = h.shape[-1] // 2
    return h * cos + torch.cat([-h[..., half:], h[..., :half]], dim=-1) * sin


def forward(cfg, p, ids, cos, sin, mask):
    """ids [B, t] (long) -> logits [B*t, vocab]."""
    B, t = ids.shape
    H, KV, d = cfg["heads"], cfg["kv"], cfg["d"]
    hd = d // H
    x = p["embed"][ids].reshape(B * t, d)
    for l in range(cfg["layers"]):
        w = lambda m: p[f"layers.{l}.{m}"]  # noqa: E731
        h = rmsnorm(x, w("attn_norm"), cfg["eps"])
        q = (h @ w("q")).view(B, t, H, hd).transpose(1, 2)
        k = (h @ w("k")).view(B, t, KV, hd).transpose(1, 2)
        v = (h @ w("v")).view(B, t, KV, hd).transpose(1, 2)
        q, k = rope(q, cos[:t], sin[:t]), rope(k, cos[:t], sin[:t])
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        s = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(hd)) + mask[:t, :t]
        ctx = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B * t, H * hd)
        x = x + ctx @ w("o")
        h = rmsnorm(x, w("mlp_norm"), cfg["eps"])
        x = x + (F.silu(h @ w("gate")) * (h @ w("up"))) @ w("down")
    return rmsnorm(x, p["final_norm"], cfg["eps"]) @ p["head"]


def causal_mask(t, dtype):
    return torch.triu(torch.full((t, t), -1e9, dtype=dtype), diagonal=1)
