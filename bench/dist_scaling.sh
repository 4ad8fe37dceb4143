#!/bin/sh
# Workloads B and A and tinylm data-parallel, 1 rank against 2 ranks in the same run
# (bench/HISTORY.md, "grad::dist"): rounds alternate the configurations so
# that a change in the machine's load hits all of them alike.
#   bench/dist_scaling.sh [BUILD_DIR] [ROUNDS] [STEPS]
# Needs bench_dist (built when Open MPI and Google Benchmark are found).
set -eu
build=${1:-build}
rounds=${2:-3}
steps=${3:-20}
bin="$build/bench/bench_dist"
[ -x "$bin" ] || { echo "dist_scaling: $bin not built (needs -Dmpi and -Dbenchmarks)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() { mpirun --oversubscribe --bind-to none -np "$@" 2>&1 | grep '^bench_dist' ; }
for dtype in "" --f64; do
  r=1
  while [ "$r" -le "$rounds" ]; do
    run 1 "$bin" --shards 2 --steps "$steps" $dtype
    run 2 "$bin" --shards 2 --steps "$steps" $dtype
    run 1 "$bin" --shards 1 --steps "$steps" $dtype
    run 1 "$bin" --shards 1 --steps "$steps" --threads 2 $dtype
    r=$((r + 1))
  done
done
# Workload A (the autoencoder, f64): 1 rank against 2, 300 steps each.
r=1
while [ "$r" -le "$rounds" ]; do
  run 1 "$bin" --model ae --shards 2 --steps 300
  run 2 "$bin" --model ae --shards 2 --steps 300
  run 1 "$bin" --model ae --shards 1 --steps 300
  run 1 "$bin" --model lm --shards 4 --steps 6 --warmup 1   # tinylm, one sequence per shard
  run 2 "$bin" --model lm --shards 4 --steps 6 --warmup 1
  r=$((r + 1))
done
