#!/bin/sh
# Issue 56's speed table: bench_second_order (grad: gradient, HVP, forward,
# jvp of workloads A and B, float64, one thread) beside PyTorch's
# torch.autograd.functional.hvp and forward-mode jvp (bench/peer_torch_hvp.py),
# interleaved round by round; prints the medians, grad's HVP / gradient and
# jvp / forward, and PyTorch / grad.
#   bench/second_order.sh [build dir] [rounds]
# PyTorch as a user runs it: on OpenBLAS's serial library, unpacked (nothing
# installed) unless OPENBLAS_DIR names a directory holding a libblas.so.3:
#   apt-get download libopenblas0-serial && dpkg-deb -x libopenblas0-serial_*.deb /tmp/ob
# (Debian's python3-torch otherwise reaches the reference BLAS, ten times slower.)
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
rounds=${2:-5}
ob=${OPENBLAS_DIR:-/tmp/ob/usr/lib/x86_64-linux-gnu/openblas-serial}
[ -e "$ob/libblas.so.3" ] || { echo "no $ob/libblas.so.3: set OPENBLAS_DIR (see the comment above)" >&2; exit 1; }
out=$(mktemp)
echo "$(date -u +%FT%TZ) $(lscpu | sed -n 's/^Model name: *//p'), load: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in $(seq "$rounds"); do
  "$build/bench/bench_second_order" --benchmark_min_time=0.5 --benchmark_format=csv 2>/dev/null |
    awk -F, '/^"BM_/ { gsub(/"/, "", $1); sub(/^BM_/, "", $1); print "grad", $1, $4 }' >>"$out"
  LD_LIBRARY_PATH=$ob OMP_NUM_THREADS=1 /usr/bin/python3 "$here/bench/peer_torch_hvp.py" --reps 3 |
    awk '{ print "torch", $1, $2 }' >>"$out"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
/usr/bin/python3 - "$out" <<'EOF'
import statistics, sys
t = {}
for line in open(sys.argv[1]):
    who, case, us = line.split()
    t.setdefault((who, case), []).append(float(us))
m = {k: statistics.median(v) for k, v in t.items()}
print("| workload | what | grad (us) | PyTorch (us) | PyTorch / grad | grad / its own |")
print("|---|---|---:|---:|---:|---:|")
for w in "AB":
    for what, base in [("gradient", None), ("hvp", "gradient"), ("forward", None), ("jvp", "forward"),
                       ("jvp_input", "forward")]:
        g, p = m.get(("grad", w + "_" + what)), m.get(("torch", w + "_" + what))
        own = "%.2fx %s" % (g / m[("grad", w + "_" + base)], base) if base else ""
        print("| %s | %s | %.1f | %s | %s | %s |" % (w, what, g, "%.1f" % p if p else "-",
                                                  "%.2f" % (p / g) if p else "-", own))
print("(medians of %d rounds; spread of grad's HVP: %s)" % (len(t[("grad", "A_hvp")]),
      ", ".join("%s %.0f-%.0f" % (w, min(t[("grad", w + "_hvp")]), max(t[("grad", w + "_hvp")])) for w in "AB")))
EOF
rm -f "$out"
