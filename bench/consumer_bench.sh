#!/bin/sh
# Workloads A and B built the way an outside project builds them, against the
# project's own -O3 figures and libtorch, all timed in the same run.
#
#   bench/consumer_bench.sh <meson build dir (release)> <scratch dir> [rounds]
#
# The build dir must hold bench/bench_workloads (the project's flags) and
# libgrad_kernels.a. Consumer builds: bench/consumer_workloads.cpp compiled
# with ${CXX:-g++} and only what grad.pc / grad-kernels.pc give
# (-std=c++20 -ffp-contract=off -Wno-psabi [-DGRAD_COMPILED_KERNELS]),
# at -O2 and -O3, with and without -march=native, header-only and compiled
# kernels. With TORCH_ROOT set (a libtorch-dev tree: include/ and the
# libtorch .so files, see bench/HISTORY.md) bench/peer_libtorch.cpp is also
# built at a consumer's -O2 (header-only): grad's A step beside libtorch's
# in one binary. Runs are pinned (PIN, default cpu 1), interleaved in
# rounds, and every figure is CPU time; the summary prints medians over
# rounds of each binary's median.
set -eu
src=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$1" && pwd)
work=$2
rounds=${3:-3}
pin=${PIN:-1}
cxx=${CXX:-g++}
mkdir -p "$work"
base="-std=c++20 -ffp-contract=off -Wno-psabi -DNDEBUG -I$src/include"

compile() {  # name, flags, libraries
  name=$1
  if [ ! -x "$work/$name" ]; then
    start=$(date +%s)
    $cxx $base $2 "$src/bench/consumer_workloads.cpp" -o "$work/$name" $3 -lbenchmark -pthread
    echo "built $name in $(($(date +%s) - start)) s (wall)"
  fi
}
for o in O2 O3; do
  for m in "" native; do
    tag=$o${m:+-$m}
    march=${m:+-march=native}
    compile "header-only-$tag" "-$o $march" ""
    compile "compiled-$tag" "-$o $march -DGRAD_COMPILED_KERNELS" "$build/libgrad_kernels.a"
  done
done
ln -sf "$build/bench/bench_workloads" "$work/project-O3"
if [ -n "${TORCH_ROOT:-}" ] && [ ! -x "$work/peer-O2" ]; then
  $cxx $base -O2 -isystem "$TORCH_ROOT/include" -isystem "$TORCH_ROOT/include/torch/csrc/api/include" \
    "$src/bench/peer_libtorch.cpp" -o "$work/peer-O2" -L"$TORCH_ROOT/lib" -ltorch -ltorch_cpu -lc10 \
    -lbenchmark -pthread
fi

bins="project-O3"
for v in header-only compiled; do
  for t in O2 O3 O2-native O3-native; do bins="$bins $v-$t"; done
done
[ -x "$work/peer-O2" ] && bins="$bins peer-O2"
: >"$work/results.csv"
r=1
while [ "$r" -le "$rounds" ]; do
  for b in $bins; do
    taskset -c "$pin" "$work/$b" --benchmark_repetitions=3 --benchmark_enable_random_interleaving=true \
      --benchmark_report_aggregates_only=true --benchmark_format=csv 2>/dev/null |
      awk -F, -v b="$b" -v r="$r" '/_median"?,/ { gsub(/"/, "", $1); print r "," b "," $1 "," $3 "," $4 }' \
        >>"$work/results.csv"
  done
  r=$((r + 1))
done
python3 "$src/bench/consumer_summary.py" "$work/results.csv"
