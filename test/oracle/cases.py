"""Float64 PyTorch oracle for the one case table (test/op_cases.hpp).

Reads the tapes test_op_cases writes (GRAD_CASES_DUMP, or the live test's
temporary file): per case, every leaf with its exact bits and every node with
its operands, scalar, axis, shape, slice starts and the torch expression its
op tag gives (`torch` in the tag). Replays each tape in torch, node by node,
runs backward from the loss node and writes each case's loss and every
parameter's gradient (in the order the params were recorded) as hex floats
(golden.py): "<case>.loss", "<case>.grad.<k>".

Nothing here knows an op: a new op's tag carries its torch expression, so
the graph is never written twice. In an expression, a and b are the operand
tensors, s the scalar, axis the axis, dims the output shape and extra the
slice starts. second_order_cases.py replays the same tapes (read_cases,
replay) for the JVPs and HVPs.

    GRAD_CASES_DUMP=/tmp/cases.txt build/test/test_op_cases
    /usr/bin/python3 test/oracle/cases.py /tmp/cases.txt [output path]

Without an output path it rewrites cases_golden.txt beside this script.
"""

import os
import sys

import torch

from golden import write_golden


class Case:
    """One case's tape: leaves (index -> (op, tensor)), nodes in tape order
    (index, op, a, b, scalar, axis, dims, extra, torch expression) and the
    loss node's index."""

    def __init__(self, name):
        self.name, self.leaves, self.nodes, self.loss = name, {}, [], None

    def param_indices(self):
        return [i for i, (op, _) in sorted(self.leaves.items()) if op == "param"]


def read_cases(dump_path):
    """The cases of a dump, in order."""
    cases = []
    with open(dump_path) as f:
        for line in f:
            words = line.split()
            if not words:
                continue
            kind = words[0]
            if kind == "case":
                cases.append(Case(words[1]))
            elif kind == "leaf":
                i, op = int(words[1]), words[2]
                at = words.index("values")
                dims = [int(d) for d in words[4:at]]
                data = [float.fromhex(v) for v in words[at + 1:]]
                cases[-1].leaves[i] = (op, torch.tensor(data, dtype=torch.float64).reshape(dims))
            elif kind == "node":
                i, op = int(words[1]), words[2]
                ia, ib = int(words[3]), int(words[4])
                s = float.fromhex(words[5])
                axis = int(words[6])
                at_extra, at_torch = words.index("extra"), words.index("torch")
                dims = [int(d) for d in words[8:at_extra]]
                extra = [int(e) for e in words[at_extra + 1:at_torch]]
                expression = line.split(" torch ", 1)[1].strip()
                cases[-1].nodes.append((i, op, ia, ib, s, axis, dims, extra, expression))
            elif kind == "loss":
                cases[-1].loss = int(words[1])
    return cases


def replay(case, params):
    """Every value of the case's tape with `params` (tensors, in the order
    the params were recorded) in place of its params: index -> tensor."""
    values = dict((i, t) for i, (op, t) in case.leaves.items() if op != "param")
    indices = case.param_indices()
    if len(indices) != len(params):
        raise SystemExit(f"{case.name}: {len(indices)} params on the tape, {len(params)} given")
    values.update(zip(indices, params))
    for i, op, ia, ib, s, axis, dims, extra, expression in case.nodes:
        scope = {"torch": torch, "a": values.get(ia), "b": values.get(ib), "s": s, "axis": axis,
                 "dims": dims, "extra": extra}
        y = eval(expression, scope)  # the tag's own torch expression
        if list(y.shape) != dims:
            raise SystemExit(f"{case.name}: node {i} ({op}): torch gives shape {list(y.shape)}, the tape {dims}")
        values[i] = y
    return values


def run(dump_path):
    out = {}
    for case in read_cases(dump_path):
        params = [case.leaves[i][1].clone().requires_grad_(True) for i in case.param_indices()]
        loss = replay(case, params)[case.loss]
        grads = torch.autograd.grad(loss.sum(), params, allow_unused=True)
        out[case.name + ".loss"] = loss.detach().reshape(1)
        for k, (p, g) in enumerate(zip(params, grads)):
            out[f"{case.name}.grad.{k}"] = torch.zeros_like(p) if g is None else g
    return out


def main():
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    path = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                               "cases_golden.txt")
    torch.set_num_threads(1)
    write_golden(path, run(sys.argv[1]),
                 header="float64 PyTorch on the tapes of test/op_cases.hpp (test/oracle/cases.py)")


if __name__ == "__main__":
    main()
