#!/bin/sh
# grad::emit's figures in one run: bench_emit (the autoencoder's training step
# on the tape, emitted with item loops, emitted with host loops) and PyTorch
# eager (CPU, one thread: bench/peer_torch_workloads.py, workload A) on the
# same machine, one after the other; then the compile time of an emitted
# program with g++ -O2 alone. Prints medians of CPU time and the ratios (the
# repetitions of the benchmarks interleaved at random, so that a change of
# load on a shared machine falls on all of them alike).
#
# Usage: bench/emit_bench.sh [BUILD_DIR]   (default: build; needs bench_emit and
#        examples/ae_model.hpp built: ninja -C BUILD_DIR bench/bench_emit examples/emit_model_call)
#        REPS=5 by default.
set -eu
cd "$(dirname "$0")/.."
build=${1:-build}
reps=${REPS:-5}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$build/bench/bench_emit" --benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true \
  --benchmark_enable_random_interleaving=true --benchmark_min_time=0.2 \
  --benchmark_format=csv > "$tmp/bench.csv" 2> /dev/null
/usr/bin/python3 bench/peer_torch_workloads.py --only A --reps "$reps" > "$tmp/torch.txt" 2>&1 || true

# Compile cost: the emitted autoencoder step (examples/emit_model_call.cpp
# over the generated header), g++ -O2, grad's include/ alone; both loop modes.
compile_seconds() {
  /usr/bin/time -f %U -o "$tmp/t" g++ -std=c++20 -O2 -ffp-contract=off -Wno-psabi "$@" -I include \
    -I "$build/examples" examples/emit_model_call.cpp -o "$tmp/call"
  cat "$tmp/t"
}
items=$(compile_seconds)
host=$(compile_seconds -DGRAD_EMITTED_HOST_LOOPS)

python3 - "$tmp/bench.csv" "$tmp/torch.txt" "$items" "$host" <<'PY'
import csv, sys
rows = {}
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"') or l.startswith('name')]
for r in csv.DictReader(lines):
    if r["name"].endswith("_median"):
        rows[r["name"][:-len("_median")]] = float(r["cpu_time"])
torch = {}
for line in open(sys.argv[2]):
    parts = line.split()
    if len(parts) == 3 and parts[0] == "torch-eager":
        torch[parts[1]] = float(parts[2])
print("autoencoder training step, CPU time per step (median of the repetitions, one thread)")
print(f"{'program':<14} {'tape us':>9} {'items us':>9} {'host us':>9} {'torch us':>9}  tape/items tape/host torch/host")
for prog, tname in (("ae_b200_f64", "A<double>"), ("ae_b200_f32", "A<float>"), ("ae_b20_f64", None),
                    ("ae_b2_f64", None)):
    key = prog.split("/")[-1]
    tape = next((v for k, v in rows.items() if k.startswith("tape/" + key)), float("nan"))
    items = rows.get("emitted_items/" + key, float("nan"))
    host = rows.get("emitted_host_loops/" + key, float("nan"))
    tt = torch.get(tname, float("nan")) if tname else float("nan")
    print(f"{prog:<14} {tape:9.1f} {items:9.1f} {host:9.1f} {tt:9.1f}  {tape/items:10.3f} {tape/host:9.3f} {tt/host:10.3f}")
print(f"compile, g++ -O2, emitted autoencoder step + caller: item loops {sys.argv[3]} s, host loops {sys.argv[4]} s (CPU)")
PY
