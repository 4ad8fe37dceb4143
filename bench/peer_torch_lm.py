"""PyTorch eager peer for examples/tinylm: the identical model (test/oracle/lm_torch.py,
float32, one thread) timed side by side with `tinylm bench` in the same run.

    /usr/bin/python3 bench/peer_torch_lm.py [path/to/tinylm] [--d 64] [--layers 2]
        [--batch 4] [--seq 256] [--train-only]

Training: forward, cross-entropy, backward and Adam on batch x seq byte
windows (default 4 x 256). Generation: greedy decoding with a KV cache
(torch.no_grad), 256 positions from a one-byte prompt (--train-only skips
it on both sides). --d and --layers change the model's width and depth (the
other sizes stay tinylm's defaults); both sides get the same options.
Skipped (exit 0 with a note) when torch is absent."""

import argparse
import os
import re
import subprocess
import sys
import time

try:
    import torch
    import torch.nn.functional as F
except ImportError:
    print("peer_torch_lm: torch is not installed; skipped")
    sys.exit(0)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "test", "oracle"))
from lm_torch import causal_mask, forward, init_params, rmsnorm, rope, rope_tables  # noqa: E402

CFG = {"vocab": 256, "d": 64, "layers": 2, "heads": 4, "kv": 2, "ffn": 176, "eps": 1e-6, "base": 10000.0}
MAX_SEQ, BATCH, SEQ, STEPS = 256, 4, 256, 20


def train_rate(p, cos, sin, mask):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 256, (BATCH, SEQ), generator=g)
    targets = torch.randint(0, 256, (BATCH * SEQ,), generator=g)
    params = list(p.values())
    for t in params:
        t.requires_grad_(True)
    opt = torch.optim.Adam(params, lr=1e-3)
    total = 0.0
    for s in range(-2, STEPS):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(forward(CFG, p, ids, cos, sin, mask), targets)
        loss.backward()
        opt.step()
        if s >= 0:
            total += time.perf_counter() - t0
    for t in params:
        t.requires_grad_(False)
    return BATCH * SEQ * STEPS / total


@torch.no_grad()
def generate(p, cos, sin, prompt, count):
    H, KV, d = CFG["heads"], CFG["kv"], CFG["d"]
    hd = d // H
    keys = [torch.zeros(KV, MAX_SEQ, hd) for _ in range(CFG["layers"])]
    vals = [torch.zeros(KV, MAX_SEQ, hd) for _ in range(CFG["layers"])]
    out = list(prompt)
    scale = 1.0 / hd ** 0.5
    logits = None
    for pos in range(len(prompt) + count - 1):
        x = p["embed"][out[pos]].reshape(1, d)
        for l in range(CFG["layers"]):
            w = lambda m: p[f"layers.{l}.{m}"]  # noqa: E731
            h = rmsnorm(x, w("attn_norm"), CFG["eps"])
            q = rope((h @ w("q")).view(H, 1, hd), cos[pos], sin[pos])
            keys[l][:, pos] = rope((h @ w("k")).view(KV, 1, hd), cos[pos], sin[pos])[:, 0]
            vals[l][:, pos] = (h @ w("v")).view(KV, hd)
            k = keys[l][:, : pos + 1].repeat_interleave(H // KV, dim=0)
            v = vals[l][:, : pos + 1].repeat_interleave(H // KV, dim=0)
            a = torch.softmax((q @ k.transpose(-1, -2)) * scale, dim=-1) @ v
            x = x + a.reshape(1, H * hd) @ w("o")
            h = rmsnorm(x, w("mlp_norm"), CFG["eps"])
            x = x + (F.silu(h @ w("gate")) * (h @ w("up"))) @ w("down")
        logits = rmsnorm(x, p["final_norm"], CFG["eps"]) @ p["head"]
        if pos + 1 >= len(out):
            out.append(int(logits.argmax()))
    return out


def generate_rate(p, cos, sin):
    generate(p, cos, sin, [84], MAX_SEQ - 1)
    t0 = time.perf_counter()
    reps = 3
    for _ in range(reps):
        generate(p, cos, sin, [84], MAX_SEQ - 1)
    return reps * MAX_SEQ / (time.perf_counter() - t0)


def main():
    global BATCH, SEQ
    ap = argparse.ArgumentParser(description="PyTorch eager peer for examples/tinylm")
    ap.add_argument("tinylm", nargs="?", help="path to examples/tinylm (omitted: torch's figures only)")
    ap.add_argument("--d", type=int, default=CFG["d"], help="model width")
    ap.add_argument("--layers", type=int, default=CFG["layers"], help="transformer blocks")
    ap.add_argument("--batch", type=int, default=BATCH, help="windows per training step")
    ap.add_argument("--seq", type=int, default=SEQ, help="bytes per window (at most 256)")
    ap.add_argument("--train-only", action="store_true", help="time training only, no generation")
    args = ap.parse_args()
    CFG["d"], CFG["layers"], BATCH, SEQ = args.d, args.layers, args.batch, args.seq
    torch.set_num_threads(1)
    p = init_params(CFG, torch.Generator().manual_seed(1), torch.float32)
    cos, sin = rope_tables(MAX_SEQ, CFG["d"] // CFG["heads"], CFG["base"], torch.float32)
    mask = causal_mask(SEQ, torch.float32)
    n = sum(t.numel() for t in p.values())
    torch_train = train_rate(p, cos, sin, mask)
    torch_gen = None if args.train_only else generate_rate(p, cos, sin)
    print(f"model: vocab 256, d_model {CFG['d']}, layers {CFG['layers']}, heads 4, kv_heads 2, ffn 176, max_seq 256; "
          f"{n} parameters; batch {BATCH} x {SEQ}; float32, 1 thread; torch {torch.__version__}")
    grad_train = grad_gen = None
    if args.tinylm:
        cmd = [args.tinylm, "bench", "--d", str(CFG["d"]), "--layers", str(CFG["layers"]), "--batch", str(BATCH),
               "--seq", str(SEQ)] + (["--train-only"] if args.train_only else [])
        text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        grad_train = float(re.search(r"train_tokens_per_s (\d+)", text).group(1))
        if not args.train_only:
            grad_gen = float(re.search(r"generate_tokens_per_s (\d+)", text).group(1))
    print(f"{'':28}{'grad':>10}{'torch eager':>14}{'ratio':>8}")
    for name, g, t in [("training tokens/s", grad_train, torch_train), ("KV-cache generation tok/s", grad_gen, torch_gen)]:
        if t is None:
            continue
        gs = f"{g:10.0f}" if g else f"{'-':>10}"
        rs = f"{g / t:7.2f}x" if g else f"{'-':>8}"
        print(f"{name:28}{gs}{t:14.0f}{rs}")


if __name__ == "__main__":
    main()
