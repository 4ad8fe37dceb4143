"""Golden data for test_optimizers: 20 steps of torch.optim.Adam / SGD in float64
on a small tanh network, with per-parameter L2 (weight_decay), optional
global-norm clipping and one parameter the loss never uses (torch leaves its
.grad None and skips it, as grad skips a parameter backward never reached).

Accounting for the formula differences (see include/grad/opt.hpp):
- Adam: grad adds eps to sqrt(v) before bias correction; torch adds it after.
  Setting torch's eps to eps / sqrt(1 - b2^t) before step t makes the two
  equal in exact arithmetic, so torch.optim.Adam itself is the oracle.
- Clipping: torch's clip_grad_norm_ divides by norm + 1e-6; grad divides by
  the norm. The script scales .grad by max_norm / norm itself.

Run with Debian's /usr/bin/python3 (it has torch):
  /usr/bin/python3 test/oracle/optim_oracle.py [output path]
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden import write_golden  # noqa: E402

torch.set_default_dtype(torch.float64)
STEPS = 20


def initial():
    g = torch.Generator().manual_seed(20261130)
    u = lambda *shape: torch.rand(*shape, generator=g) * 2 - 1  # noqa: E731
    return {"x": u(8, 3), "target": u(8, 2) * 0.5, "w1": u(3, 4), "b1": u(4) * 0.1,
            "w2": u(4, 2), "b2": u(2) * 0.1, "unused": u(3)}


PARAMS = ["w1", "b1", "w2", "b2", "unused"]


def run(init, optimizer, l2, clip):
    ps = {k: init[k].clone().requires_grad_(True) for k in PARAMS}
    groups = [{"params": [ps[k]], "weight_decay": l2[k]} for k in PARAMS]
    opt = optimizer(groups)
    losses = []
    for t in range(1, STEPS + 1):
        opt.zero_grad(set_to_none=True)
        h = torch.tanh(init["x"] @ ps["w1"] + ps["b1"])
        y = h @ ps["w2"] + ps["b2"]
        loss = ((y - init["target"]) ** 2).mean()
        loss.backward()
        losses.append(loss.item())
        if clip > 0:
            acc = torch.zeros(())
            for k in PARAMS:
                if ps[k].grad is not None:
                    acc = acc + (ps[k].grad * ps[k].grad).sum()
            norm = acc.sqrt().item()
            if norm > clip:
                for k in PARAMS:
                    if ps[k].grad is not None:
                        ps[k].grad.mul_(clip / norm)
        if isinstance(opt, torch.optim.Adam):
            for group in opt.param_groups:
                group["eps"] = ADAM_EPS / math.sqrt(1 - group["betas"][1] ** t)
        opt.step()
    return ps, losses


ADAM_EPS = 1e-3  # large enough that the eps mapping matters


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "optim_golden.txt")
    init = initial()
    tensors = dict(init)
    cases = {
        "adam": (lambda g: torch.optim.Adam(g, lr=0.05, betas=(0.9, 0.999)),
                 {"w1": 0.01, "b1": 0.0, "w2": 0.02, "b2": 0.0, "unused": 0.5}, 0.0),
        "adam_clip": (lambda g: torch.optim.Adam(g, lr=0.05, betas=(0.8, 0.99)),
                      {"w1": 0.01, "b1": 0.0, "w2": 0.0, "b2": 0.0, "unused": 0.5}, 0.05),
        "sgd_clip": (lambda g: torch.optim.SGD(g, lr=0.3),
                     {"w1": 0.01, "b1": 0.0, "w2": 0.02, "b2": 0.0, "unused": 0.5}, 0.2),
    }
    for name, (make, l2, clip) in cases.items():
        ps, losses = run(init, make, l2, clip)
        for k in PARAMS:
            tensors[name + "." + k] = ps[k]
        tensors[name + ".loss"] = torch.tensor(losses)
    write_golden(out, tensors, header=__doc__.splitlines()[0] + "\ntorch " + torch.__version__)


if __name__ == "__main__":
    main()
