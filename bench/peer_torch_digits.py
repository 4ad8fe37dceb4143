#!/usr/bin/env python3
"""examples/digits' model in PyTorch, on the same data and split, for the
README's comparison: 64-128-64-10 relu (torch.nn.Linear's default init)
with dropout 0.2 after each hidden relu (model.eval() to measure), Adam lr 1e-3, batch 64 reshuffled each epoch (the short last batch kept),
30 epochs, float32, cross-entropy; pixels / 16; every 5th row (row % 5 == 0)
is the test set. Training time excludes evaluation, as in examples/digits.

With --grad BUILD/examples/digits it runs grad's example on the same seeds in
the same run, interleaved, and prints both side by side (accuracy, training
seconds), then the mean and spread over the seeds.

Without torch it says so and exits 0 (a skip). Debian's python3-torch is for
/usr/bin/python3 (not a pyenv interpreter).
Usage: peer_torch_digits.py [--data FILE] [--seeds 1,2,3,4,5] [--epochs 30] [--dropout 0.2] [--threads 1]
                            [--grad BINARY]
"""
import argparse
import gzip
import re
import statistics
import subprocess
import sys
import time

DEFAULT_DATA = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    rows = []
    with opener(path, "rt") as f:
        for line in f:
            fields = line.strip().split(",")
            if fields and fields[0]:
                rows.append([float(x) for x in fields])
    return rows


def run_torch(torch, rows, seed, epochs, batch, lr, dropout):
    x = torch.tensor([r[:-1] for r in rows], dtype=torch.float32) / 16.0
    y = torch.tensor([int(r[-1]) for r in rows], dtype=torch.long)
    test_mask = torch.tensor([i % 5 == 0 for i in range(len(rows))])
    xtr, ytr, xte, yte = x[~test_mask], y[~test_mask], x[test_mask], y[test_mask]
    torch.manual_seed(seed)
    nn = torch.nn
    def drop():  # grad's nn::mlp places one after each hidden relu
        return [nn.Dropout(dropout)] if dropout > 0 else []
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), *drop(), nn.Linear(128, 64), nn.ReLU(), *drop(),
                          nn.Linear(64, 10))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    seconds = 0.0
    n = xtr.shape[0]
    for _ in range(epochs):
        start = time.perf_counter()
        perm = torch.randperm(n, generator=gen)
        for first in range(0, n, batch):
            idx = perm[first:first + batch]
            loss = nn.functional.cross_entropy(model(xtr[idx]), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        seconds += time.perf_counter() - start
    model.eval()
    with torch.inference_mode():
        acc = (model(xte).argmax(1) == yte).float().mean().item()
    return acc, seconds


def run_grad(binary, data, seed, epochs, dropout):
    out = subprocess.run([binary, "--data", data, "--seed", str(seed), "--epochs", str(epochs), "--dropout",
                          str(dropout), "--svg", ""],
                         capture_output=True, text=True, check=True).stdout
    m = re.search(r"test accuracy ([0-9.]+)% after \d+ epochs, ([0-9.]+) s training", out)
    if not m:
        raise RuntimeError("unexpected output from " + binary + ":\n" + out)
    return float(m.group(1)) / 100, float(m.group(2))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=DEFAULT_DATA)
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--dropout", type=float, default=0.2, help="after each hidden relu, as examples/digits")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (grad runs on 1 by default)")
    ap.add_argument("--grad", help="path of the built examples/digits, to run it on the same seeds")
    args = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("peer_torch_digits: skipped (no torch for " + sys.executable + "; apt-get install python3-torch)")
        return 0
    torch.set_num_threads(args.threads)
    rows = load(args.data)
    seeds = [int(s) for s in args.seeds.split(",")]
    results = {"torch": [], "grad": []}
    print(f"digits: {len(rows)} rows, torch {torch.__version__} on {args.threads} thread(s), {args.epochs} epochs")
    print("seed   torch acc  torch s" + ("    grad acc   grad s" if args.grad else ""))
    for seed in seeds:
        acc, sec = run_torch(torch, rows, seed, args.epochs, args.batch, args.lr, args.dropout)
        results["torch"].append((acc, sec))
        line = f"{seed:4d}   {100 * acc:7.2f}%  {sec:7.3f}"
        if args.grad:
            gacc, gsec = run_grad(args.grad, args.data, seed, args.epochs, args.dropout)
            results["grad"].append((gacc, gsec))
            line += f"    {100 * gacc:7.2f}%  {gsec:7.3f}"
        print(line)
    for name, rs in results.items():
        if not rs:
            continue
        accs = [100 * a for a, _ in rs]
        secs = [s for _, s in rs]
        spread = statistics.stdev(accs) if len(accs) > 1 else 0.0
        print(f"{name:5s}: accuracy {statistics.mean(accs):.2f}% +- {spread:.2f} (min {min(accs):.2f}, "
              f"max {max(accs):.2f}), training {statistics.median(secs):.3f} s median")
    if args.grad:
        t = statistics.median(s for _, s in results["torch"])
        g = statistics.median(s for _, s in results["grad"])
        print(f"grad trains {t / g:.2f}x as fast as torch (median training seconds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
