#!/usr/bin/env python3
"""The autoencoder training step of bench_device (d-64-32-64-d tanh, batch 200,
float64, Adam, mse) in PyTorch on CUDA: eager, and replayed with
torch.cuda.graphs (the whole step, optimizer included, captured once).

Prints one line per case, "<name> <median us>", for scripts/device-check.sh.
Without torch or without a CUDA device it says so and exits 0 (a skip).
Usage: peer_torch_ae.py [--steps N] [--reps R]
"""
import argparse
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200, help="steps per repetition")
    ap.add_argument("--reps", type=int, default=5, help="repetitions (the median is reported)")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("peer_torch_ae: skipped (no torch)")
        return 0
    if not torch.cuda.is_available():
        print("peer_torch_ae: skipped (torch sees no CUDA device)")
        return 0

    dev = torch.device("cuda")
    dim, batch, widths = 6, 200, [6, 64, 32, 64, 6]
    torch.manual_seed(7)
    data = torch.randn(2000, dim, dtype=torch.float64, device=dev)
    batches = [data[i:i + batch].contiguous() for i in range(0, 2000, batch)]

    def make():
        layers = []
        for i in range(4):
            lin = torch.nn.Linear(widths[i], widths[i + 1], dtype=torch.float64, device=dev)
            layers.append(lin)
            if i < 3:
                layers.append(torch.nn.Tanh())
        model = torch.nn.Sequential(*layers)
        # capturable=True keeps Adam's step count on the device, as graphs need.
        opt = torch.optim.Adam(model.parameters(), lr=0.005, capturable=True)
        return model, opt

    def step(model, opt, x):
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.mse_loss(model(x), x)
        loss.backward()
        opt.step()
        return loss

    def time_case(run_one):
        medians = []
        for _ in range(args.reps):
            torch.cuda.synchronize()
            t = time.perf_counter()
            for k in range(args.steps):
                run_one(k)
            torch.cuda.synchronize()
            medians.append((time.perf_counter() - t) / args.steps * 1e6)
        return statistics.median(medians)

    # Eager: upload the minibatch (a device copy here), step, read the loss.
    model, opt = make()
    static_x = batches[0].clone()

    def eager(k):
        static_x.copy_(batches[k % len(batches)])
        step(model, opt, static_x).item()

    for k in range(20):
        eager(k)
    print(f"torch_eager_ae_f64 {time_case(eager):.2f}")

    # Graph: warm up on a side stream, capture one whole step, replay it.
    model, opt = make()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for k in range(3):
            static_x.copy_(batches[k])
            step(model, opt, static_x)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=False)
    with torch.cuda.graph(graph):
        static_loss = step(model, opt, static_x)

    def replay(k):
        static_x.copy_(batches[k % len(batches)])
        graph.replay()
        static_loss.item()

    for k in range(20):
        replay(k)
    print(f"torch_graph_ae_f64 {time_case(replay):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
