#!/usr/bin/python3
"""Issue 56's peer: bench/bench_second_order.cpp's workloads in PyTorch
eager, float64, one thread, the same inputs (the same hash fill):

  A: autoencoder 6-64-32-64-6 tanh, batch 200, mse
  B: MLP 512-1024-1024-512 relu, batch 256, mse

For each: the gradient (forward + backward), the Hessian-vector product
with respect to every weight and bias by torch.autograd.functional.hvp
(what the issue names; double backward), the forward alone, and the jvp
along the same direction by forward-mode AD (torch.autograd.forward_ad),
and the jvp along the input (the weights fixed).
Prints "<workload>_<what> <median us>" per case: the median over --reps
repetitions of CPU time per call. Without torch it says so and exits 0.
Usage: /usr/bin/python3 bench/peer_torch_hvp.py [--reps R] [--only A|B]
"""
import argparse
import statistics
import sys
import time


def filled(torch, shape, scale, salt):
    n = 1
    for d in shape:
        n *= d
    i = torch.arange(n, dtype=torch.int64)
    h = (i + salt) * 2654435761 % 1000003
    return (scale * (h.double() / 500001.5 - 1)).reshape(shape)


WORKLOADS = {"A": ([6, 64, 32, 64, 6], 200, "tanh"), "B": ([512, 1024, 1024, 512], 256, "relu")}


def setup(torch, name):
    widths, batch, act = WORKLOADS[name]
    x = filled(torch, [batch, widths[0]], 1.0, 1)
    target = filled(torch, [batch, widths[-1]], 0.5, 2)
    params, direction = [], []
    for l in range(len(widths) - 1):
        ws, bs = [widths[l], widths[l + 1]], [widths[l + 1]]
        params += [filled(torch, ws, 1.7 / widths[l], 10 + l), filled(torch, bs, 0.1, 20 + l)]
        direction += [filled(torch, ws, 1.0, 30 + l), filled(torch, bs, 1.0, 40 + l)]
    f_act = torch.tanh if act == "tanh" else torch.relu

    def loss(*ps, x=x):
        h = x
        for l in range(0, len(ps), 2):
            h = h @ ps[l] + ps[l + 1]
            if l + 2 < len(ps):
                h = f_act(h)
        return ((h - target) ** 2).mean()

    return loss, tuple(params), tuple(direction), (x, filled(torch, [batch, widths[0]], 1.0, 3))


def measure(fn, reps, calls):
    for _ in range(2):
        fn()
    times = []
    for _ in range(reps):
        start = time.process_time()
        for _ in range(calls):
            fn()
        times.append((time.process_time() - start) / calls * 1e6)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", choices=["A", "B"])
    args = ap.parse_args()
    try:
        import torch
        import torch.autograd.forward_ad as fwAD
    except ImportError:
        print("torch not importable: no peer figures", file=sys.stderr)
        return 0
    torch.set_num_threads(1)
    for name in ["A", "B"]:
        if args.only and name != args.only:
            continue
        loss, params, direction, inputs = setup(torch, name)
        calls = 200 if name == "A" else 3

        def gradient():
            ps = [p.detach().requires_grad_() for p in params]
            return torch.autograd.grad(loss(*ps), ps)

        def hvp():
            return torch.autograd.functional.hvp(loss, params, direction)

        def forward():
            with torch.no_grad():
                return loss(*params)

        def jvp():
            with fwAD.dual_level():
                return fwAD.unpack_dual(loss(*[fwAD.make_dual(p, v) for p, v in zip(params, direction)])).tangent

        x, vx = inputs

        def jvp_input():
            with fwAD.dual_level():
                return fwAD.unpack_dual(loss(*params, x=fwAD.make_dual(x, vx))).tangent

        for what, fn in [("gradient", gradient), ("hvp", hvp), ("forward", forward), ("jvp", jvp),
                         ("jvp_input", jvp_input)]:
            print("%s_%s %.1f" % (name, what, measure(fn, args.reps, calls)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
