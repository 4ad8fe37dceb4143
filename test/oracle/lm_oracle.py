"""Float64 PyTorch oracle for grad::nn::Lm (include/grad/lm.hpp): a two-layer
model at small, odd sizes through the new ops (embedding, cross_entropy with
integer ids and an ignored position). Mirrored by test/test_lm.cpp ("the LM
matches PyTorch float64"), from the very bits written here.

Names in the golden file: "sizes" (vocab, d, layers, heads, kv_heads, ffn,
batch, seq), "scalars" (eps, rope base), "ids" [batch, seq], "targets"
[batch*seq] (-100 = ignored), every model tensor by its grad name,
"logits", "loss", and "grad.<name>" for every tensor.

    /usr/bin/python3 test/oracle/lm_oracle.py [output path]
Without an argument it rewrites lm_golden.txt beside this script."""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden import write_golden  # noqa: E402
from lm_torch import causal_mask, forward, init_params, rope_tables  # noqa: E402

CFG = {"vocab": 13, "d": 10, "layers": 2, "heads": 5, "kv": 1, "ffn": 7, "eps": 1e-6, "base": 10000.0}
B, T = 2, 5


def main():
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "lm_golden.txt")
    g = torch.Generator().manual_seed(20261201)
    p = init_params(CFG, g, torch.float64)
    ids = torch.randint(0, CFG["vocab"], (B, T), generator=g)
    targets = torch.randint(0, CFG["vocab"], (B * T,), generator=g)
    targets[3] = -100
    for t in p.values():
        t.requires_grad_(True)
    cos, sin = rope_tables(T, CFG["d"] // CFG["heads"], CFG["base"], torch.float64)
    logits = forward(CFG, p, ids, cos, sin, causal_mask(T, torch.float64))
    loss = F.cross_entropy(logits, targets, ignore_index=-100)
    loss.backward()
    out = {
        "sizes": torch.tensor([CFG["vocab"], CFG["d"], CFG["layers"], CFG["heads"], CFG["kv"], CFG["ffn"], B, T],
                              dtype=torch.float64),
        "scalars": torch.tensor([CFG["eps"], CFG["base"]], dtype=torch.float64),
        "ids": ids.to(torch.float64),
        "targets": targets.to(torch.float64),
    }
    for name, t in p.items():
        out[name] = t.detach()
    out["logits"] = logits.detach()
    out["loss"] = loss.detach().reshape(1)
    for name, t in p.items():
        out["grad." + name] = t.grad
    write_golden(out_path, out, f"grad::nn::Lm, two layers, float64, torch {torch.__version__}\n"
                                "written by test/oracle/lm_oracle.py")


if __name__ == "__main__":
    main()
