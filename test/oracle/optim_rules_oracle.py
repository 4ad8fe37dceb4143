"""Golden data for test_optimizers: torch.optim.AdamW, Adam, SGD (momentum,
dampening, Nesterov) and torch.optim.lr_scheduler in float64.

The optimizer cases feed fixed gradients (a seeded sequence, one per step
and parameter), so that only the update rules meet: 20 steps over several
parameters with per-parameter weight decay and a schedule. One parameter
("late") gets its first gradient at step 4 (torch starts its momentum
buffer then, as grad does) in the SGD cases; in the Adam cases it has one
from step 1, since torch counts Adam's steps per parameter and grad once
per step() (opt.hpp); one ("unused") never gets one.
The schedule cases record the rate each of 40 optimizer steps uses, with
scheduler.step() after every optimizer.step() (scheduler.step(metric) for
ReduceLROnPlateau, metrics from METRICS).

Run with Debian's /usr/bin/python3 (it has torch):
  /usr/bin/python3 test/oracle/optim_rules_oracle.py [output path]
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from golden import write_golden  # noqa: E402

torch.set_default_dtype(torch.float64)
STEPS = 20
SCHEDULE_STEPS = 40
PARAMS = ["w1", "b1", "w2", "late", "unused"]
SHAPES = {"w1": (3, 4), "b1": (4,), "w2": (4, 2), "late": (5,), "unused": (3,)}
DECAY = {"w1": 0.1, "b1": 0.0, "w2": 0.05, "late": 0.02, "unused": 0.5}
FIRST_STEP = {"w1": 1, "b1": 1, "w2": 1, "late": 4, "unused": STEPS + 1}
# A plateau, a drop, another plateau: ReduceLROnPlateau reduces twice.
METRICS = [1.0, 0.9, 0.95, 0.9, 0.91, 0.9, 0.5, 0.5, 0.6, 0.7, 0.45, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.2, 0.3, 0.3]


def initial():
    g = torch.Generator().manual_seed(20261202)
    # magnitudes 1..2 with random signs: no parameter crosses zero in 20 steps,
    # so relative errors stay meaningful
    def param(shape):
        mag = torch.rand(*shape, generator=g) + 1
        sign = torch.where(torch.rand(*shape, generator=g) < 0.5, -1.0, 1.0)
        return mag * sign
    init = {k: param(SHAPES[k]) for k in PARAMS}
    grads = {k: torch.rand(STEPS, *SHAPES[k], generator=g) * 2 - 1 for k in PARAMS}
    return init, grads


def run(init, grads, make_opt, make_sched, plateau, late_first):
    ps = {k: init[k].clone().requires_grad_(True) for k in PARAMS}
    groups = [{"params": [ps[k]], "weight_decay": DECAY[k]} for k in PARAMS]
    opt = make_opt(groups)
    sched = make_sched(opt)
    lrs = []
    for t in range(1, STEPS + 1):
        for k in PARAMS:
            first = late_first if k == "late" else FIRST_STEP[k]
            ps[k].grad = grads[k][t - 1].clone() if t >= first else None
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        if plateau:
            sched.step(METRICS[t - 1])
        else:
            sched.step()
    return ps, lrs


def schedule_lrs(make_sched, plateau=False, base_lr=0.1):
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.SGD([p], lr=base_lr)
    sched = make_sched(opt)
    lrs = []
    for t in range(1, SCHEDULE_STEPS + 1):
        lrs.append(opt.param_groups[0]["lr"])
        p.grad = torch.zeros(1)
        opt.step()
        if plateau:
            sched.step(METRICS[(t - 1) % len(METRICS)])
        else:
            sched.step()
    return lrs


def warmup_cosine(base, low, warmup, total):
    # grad's own schedule (include/grad/opt.hpp), written out for LambdaLR
    def at(t):
        if t <= warmup:
            return base * t / warmup
        if t >= total:
            return low
        p = (t - warmup) / (total - warmup)
        return low + (base - low) * (0.5 * (1 + math.cos(math.pi * p)))
    return lambda e: at(e + 1) / base


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                             "optim_rules_golden.txt")
    S = torch.optim.lr_scheduler
    init, grads = initial()
    tensors = {}
    for k in PARAMS:
        tensors[k] = init[k]
        tensors["grad." + k] = grads[k]
    tensors["metrics"] = torch.tensor(METRICS)
    cases = {
        "adamw": (lambda g: torch.optim.AdamW(g, lr=0.01, betas=(0.9, 0.999), eps=1e-8),
                  lambda o: S.ExponentialLR(o, gamma=0.95), False),
        "adam_pytorch": (lambda g: torch.optim.Adam(g, lr=0.01, betas=(0.8, 0.99), eps=1e-3),
                         lambda o: S.MultiStepLR(o, milestones=[5, 12], gamma=0.5), False),
        "sgd_momentum": (lambda g: torch.optim.SGD(g, lr=0.003, momentum=0.9, dampening=0.25),
                         lambda o: S.StepLR(o, step_size=6, gamma=0.5), False),
        "sgd_nesterov": (lambda g: torch.optim.SGD(g, lr=0.003, momentum=0.8, nesterov=True),
                         lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=2, cooldown=1), True),
    }
    for name, (make_opt, make_sched, plateau) in cases.items():
        ps, lrs = run(init, grads, make_opt, make_sched, plateau, 4 if name.startswith("sgd") else 1)
        for k in PARAMS:
            tensors[name + "." + k] = ps[k]
        tensors[name + ".lr"] = torch.tensor(lrs)
    schedules = {
        "step": (lambda o: S.StepLR(o, step_size=7, gamma=0.3), False),
        "multi_step": (lambda o: S.MultiStepLR(o, milestones=[3, 10, 25], gamma=0.2), False),
        "exponential": (lambda o: S.ExponentialLR(o, gamma=0.9), False),
        "one_cycle": (lambda o: S.OneCycleLR(o, max_lr=0.1, total_steps=40, pct_start=0.25, anneal_strategy="cos",
                                             cycle_momentum=False, div_factor=20, final_div_factor=100), False),
        "plateau_min_rel": (lambda o: S.ReduceLROnPlateau(o, mode="min", factor=0.5, patience=1, threshold=0.05,
                                                          cooldown=2, min_lr=0.01), True),
        "plateau_max_abs": (lambda o: S.ReduceLROnPlateau(o, mode="max", factor=0.3, patience=0, threshold=0.02,
                                                          threshold_mode="abs"), True),
        "warmup_cosine": (lambda o: S.LambdaLR(o, warmup_cosine(0.1, 0.002, 5, 30)), False),
    }
    for name, (make_sched, plateau) in schedules.items():
        tensors["schedule." + name] = torch.tensor(schedule_lrs(make_sched, plateau))
    write_golden(out, tensors, header=__doc__.splitlines()[0] + "\ntorch " + torch.__version__)


if __name__ == "__main__":
    main()
