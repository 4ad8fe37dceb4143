"""Summarises bench/consumer_bench.sh's results.csv (round, binary, benchmark,
real time, CPU time per benchmark median): the median over rounds of each
CPU time, each consumer build's ratio to the project's own -O3 build
(project-O3), and libtorch against grad in the peer binary."""

import collections
import statistics
import sys

rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    _, binary, bench, _, cpu = line.strip().split(",")
    name = bench.replace("_median", "")
    rows[(binary, name)].append(float(cpu))

med = {key: statistics.median(v) for key, v in rows.items()}
columns = ["A<double>", "A<float>", "B<float>", "B<double>"]
binaries = sorted({b for b, _ in med if b != "peer-O2"}, key=lambda b: (b != "project-O3", b))
print("CPU time per step, median of rounds (A in us, B in ms); in brackets: / project-O3")
print(f"{'build':24}" + "".join(f"{c:>20}" for c in columns))
for b in binaries:
    cells = []
    for c in columns:
        v = med.get((b, c))
        ref = med.get(("project-O3", c))
        if v is None:
            cells.append(f"{'-':>20}")
        elif b == "project-O3" or ref is None:
            cells.append(f"{v:>20.1f}")
        else:
            cells.append(f"{v:>12.1f} ({v / ref:.2f})")
    print(f"{b:24}" + "".join(cells))
peer = {name: v for (b, name), v in med.items() if b == "peer-O2"}
for t in ["double", "float"]:
    g = next((v for k, v in peer.items() if k.startswith("BM_grad_step<" + t)), None)
    lt = next((v for k, v in peer.items() if k.startswith("BM_libtorch_step<" + t)), None)
    if g and lt:
        print(f"peer (consumer -O2, header-only) A {t}: grad {g:.1f} us, libtorch {lt:.1f} us: {lt / g:.2f}x")
