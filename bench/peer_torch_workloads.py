#!/usr/bin/python3
"""Workloads A and B (bench/consumer_workloads.cpp) in PyTorch eager on the
CPU, one thread: the peer that any machine with Debian's python3-torch has
(bench/peer_libtorch*.cpp need libtorch-dev, which is not installable here).

  A: autoencoder 6-64-32-64-6 tanh, batch 200, mse, Adam
  B: MLP 512-1024-1024-512 relu, batch 256, mse, Adam

Prints "<name> <median CPU us per step>" per case, the median over --reps
repetitions of --steps steps each. Without torch it says so and exits 0.
Usage: /usr/bin/python3 bench/peer_torch_workloads.py [--reps R] [--only A|B]
"""
import argparse
import statistics
import sys
import time


def step_fn(torch, sizes, act, batch, dtype):
    g = torch.Generator().manual_seed(1)
    layers = []
    for i in range(len(sizes) - 1):
        w = (torch.rand(sizes[i], sizes[i + 1], generator=g, dtype=dtype) - 0.5) * (2.0 / sizes[i] ** 0.5)
        b = torch.zeros(sizes[i + 1], dtype=dtype)
        layers += [w.requires_grad_(), b.requires_grad_()]
    x = torch.rand(batch, sizes[0], generator=g, dtype=dtype)
    target = torch.rand(batch, sizes[-1], generator=g, dtype=dtype)
    opt = torch.optim.Adam(layers, lr=1e-3)

    def step():
        h = x
        for i in range(0, len(layers), 2):
            h = h @ layers[i] + layers[i + 1]
            if i + 2 < len(layers):
                h = act(h)
        loss = ((h - target) ** 2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss

    return step


def measure(step, steps, reps):
    for _ in range(3):
        step()
    times = []
    for _ in range(reps):
        start = time.process_time()
        for _ in range(steps):
            step()
        times.append((time.process_time() - start) / steps * 1e6)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--only", choices=["A", "B"])
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("peer_torch_workloads: skipped (no torch)")
        return 0
    torch.set_num_threads(1)
    cases = []
    if args.only in (None, "A"):
        for dtype, name in ((torch.float64, "A<double>"), (torch.float32, "A<float>")):
            cases.append((name, step_fn(torch, [6, 64, 32, 64, 6], torch.tanh, 200, dtype), 200))
    if args.only in (None, "B"):
        for dtype, name in ((torch.float32, "B<float>"), (torch.float64, "B<double>")):
            cases.append((name, step_fn(torch, [512, 1024, 1024, 512], torch.relu, 256, dtype), 5))
    for name, step, steps in cases:
        print(f"torch-eager {name} {measure(step, steps, args.reps):.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
