"""Float64 PyTorch oracle for grad's core ops.

Rebuilds three composite graphs (mirrored op for op by test/test_oracle.cpp)
that together touch every op in OpList, numpy broadcasting on either operand
and on both at once (rank 2 and rank 3), the scalar forms on both sides and
fan-out. Inputs come from splitmix64 (the generator in test/support.hpp), not
from torch's RNG, so they are the same bits under any torch version; the
inputs, each graph's loss and every parameter's gradient go to the golden
file as hex floats (golden.py).

Names in the golden file: "<graph>.param.<p>" and "<graph>.const.<c>" are
inputs (a parameter gets a gradient, a constant does not), "<graph>.loss" is
the loss, "<graph>.grad.<p>" the gradient of parameter p.

Run with Debian's interpreter (the only one that sees python3-torch):
    /usr/bin/python3 test/oracle/graphs.py [output path]
Without an argument it rewrites graphs_golden.txt beside this script.
"""

import os
import sys

import torch

from golden import write_golden

MASK64 = (1 << 64) - 1


class Rng:
    """splitmix64, bit for bit the generator of test/support.hpp."""

    def __init__(self, seed):
        self.state = seed & MASK64

    def next(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def uniform(self, lo, hi):
        # Same evaluation order as the C++: lo + ((hi - lo) * u) * 2^-53.
        return lo + (hi - lo) * float(self.next() >> 11) * 2.0**-53

    def tensor(self, shape, lo, hi):
        n = 1
        for d in shape:
            n *= d
        return torch.tensor([self.uniform(lo, hi) for _ in range(n)], dtype=torch.float64).reshape(shape)


def mlp(rng):
    """Two-layer perceptron with an mse loss and an L2 term.
    Broadcast on the right operand (z + b1, z + b2), scalar forms on both
    sides of * and a + s, fan-out of z1 (tanh and relu) and of W1 (matmul and
    the L2 term)."""
    const = {
        "x": rng.tensor([4, 3], -1.0, 1.0),
        "target": rng.tensor([4, 2], 0.2, 0.8),
    }
    param = {
        "W1": rng.tensor([3, 5], -1.0, 1.0),
        "b1": rng.tensor([5], -0.5, 0.5),
        "W2": rng.tensor([5, 2], -1.0, 1.0),
        "b2": rng.tensor([1, 2], -0.5, 0.5),
    }

    def build(c, p):
        z1 = torch.matmul(c["x"], p["W1"]) + p["b1"]
        h = torch.tanh(z1)
        a = torch.relu(z1)
        m = 0.5 * h + a * 0.25 + 0.125
        o = torch.sigmoid(torch.matmul(m, p["W2"]) + p["b2"])
        d = o - c["target"]
        return torch.mean(d * d) + torch.sum(p["W1"] * p["W1"]) * 0.01

    return const, param, build


def attention(rng):
    """Rank-3 single-head attention followed by layout ops and a row sum.
    u [2,1,4] + w [3,1] broadcasts both operands into a rank-3 result;
    bias is kept below o so y > 0 and the loss terms do not cancel."""
    const = {}
    param = {
        "q": rng.tensor([2, 3, 4], -1.0, 1.0),
        "k": rng.tensor([2, 3, 4], -1.0, 1.0),
        "v": rng.tensor([2, 3, 4], -1.0, 1.0),
        "u": rng.tensor([2, 1, 4], -1.5, -0.5),
        "w": rng.tensor([3, 1], -1.5, -0.5),
    }

    def build(c, p):
        s = torch.bmm(p["q"], p["k"].transpose(-2, -1)) / 2.0
        attn = torch.softmax(s, -1)
        o = torch.bmm(attn, p["v"])
        bias = p["u"] + p["w"]
        y = o - bias
        flat = y.reshape(6, 4)
        top = flat[0:3, 0:4]
        bottom = flat[3:6, 1:4]
        joined = torch.cat([top, bottom], 1)
        rows = y.sum(-1, keepdim=True)
        return torch.mean(joined * joined) + torch.mean(rows) * 0.1

    return const, param, build


def pointwise(rng):
    """Every transcendental and every scalar form, with a the value fanned out
    to all of them. b / a and c * a broadcast the left operand, a / b the
    right; softmax runs along axis 0. a stays in [0.5, 2] so log, sqrt and the
    divisions are well conditioned, and every summand of the loss is positive."""
    const = {}
    param = {
        "a": rng.tensor([3, 4], 0.5, 2.0),
        "b": rng.tensor([4], 0.5, 1.5),
        "c": rng.tensor([3, 1], -1.0, 1.0),
    }

    def build(c_, p):
        a, b, c = p["a"], p["b"], p["c"]
        e1 = torch.log(a + 0.5) + torch.sqrt(1.0 + a)
        e2 = torch.exp(-a) * (3.0 - a)
        e3 = a / b + 2.0 / a
        e4 = b / (a - 0.25)
        e5 = torch.softmax(c * a, 0)
        return torch.mean(e1 * e2 + e3 + e4 * e5 + e4 / 3.0)

    return const, param, build


def tokens(rng):
    """embedding by integer ids (a repeated id sums its rows' gradients) and
    cross_entropy with integer class ids, one row ignored (id -1)."""
    const = {
        "ids": torch.tensor([[1.0, 4.0, 1.0], [0.0, 4.0, 2.0]], dtype=torch.float64),
        "targets": torch.tensor([2.0, -1.0, 0.0, 3.0, 3.0, 1.0], dtype=torch.float64),
    }
    param = {
        "E": rng.tensor([5, 3], -1.0, 1.0),
        "W": rng.tensor([3, 4], -1.0, 1.0),
    }

    def build(c, p):
        x = p["E"][c["ids"].long()].reshape(6, 3)
        logits = torch.tanh(x) @ p["W"] * 2.0
        return torch.nn.functional.cross_entropy(logits, c["targets"].long(), ignore_index=-1)

    return const, param, build


GRAPHS = [("mlp", mlp, 0x6D6C70), ("attention", attention, 0x617474), ("pointwise", pointwise, 0x707477),
          ("tokens", tokens, 0x746F6B)]


def main():
    torch.set_num_threads(1)
    out_path = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                                 "graphs_golden.txt")
    tensors = {}
    for name, make, seed in GRAPHS:
        const, param, build = make(Rng(seed))
        leaves = {k: v.clone().requires_grad_(True) for k, v in param.items()}
        loss = build(const, leaves)
        loss.backward()
        for k, v in const.items():
            tensors[name + ".const." + k] = v
        for k, v in param.items():
            tensors[name + ".param." + k] = v
        # grad's losses have shape [1]; torch's are 0-d.
        tensors[name + ".loss"] = loss.detach().reshape(1)
        for k, v in leaves.items():
            tensors[name + ".grad." + k] = v.grad
    header = ("Generated by test/oracle/graphs.py with torch " + torch.__version__ + " (float64).\n" +
              "Do not edit: rerun the script. test/test_oracle.cpp rebuilds the same graphs.")
    write_golden(out_path, tensors, header)


if __name__ == "__main__":
    main()
