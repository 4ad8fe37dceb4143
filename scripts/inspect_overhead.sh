#!/bin/sh
# Workload A's steps/s with the inspection hooks off / anomaly / profile, and
# on the tree before the hooks (the given git revision, default the commit
# before include/grad/inspect/ appeared). Header-only, -O2.
#   scripts/inspect_overhead.sh [base-revision] [steps] [rounds]
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
base=${1:-$(git -C "$root" rev-list -n 1 HEAD -- include/grad/inspect/hooks.hpp)~1}
steps=${2:-200}
rounds=${3:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
git -C "$root" archive "$base" include examples/autoencoder.hpp | tar -x -C "$work"
cxx=${CXX:-c++}
flags="-std=c++20 -O2 -DNDEBUG"
$cxx $flags -I"$root/include" "$root/bench/inspect_overhead.cpp" -o "$work/new" -pthread
mkdir -p "$work/bench" && cp "$root/bench/inspect_overhead.cpp" "$work/bench/"
$cxx $flags -DGRAD_NO_INSPECT -I"$work/include" "$work/bench/inspect_overhead.cpp" -o "$work/old" -pthread

for r in $(seq "$rounds"); do
  "$work/old" "$steps" 1
  "$work/new" "$steps" 1
done
