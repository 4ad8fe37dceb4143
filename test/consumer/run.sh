#!/bin/sh
# Builds test/consumer/consumer.cpp against grad the ways a downstream
# project can, and checks that every build prints the same result bits:
#  1. as a meson subproject: dependency('grad') (header-only) and
#     dependency('grad-kernels') (the compiled kernel library), at -O2;
#  2. against an installed copy through pkg-config: grad.pc (header-only)
#     and grad-kernels.pc, with ${CXX:-c++} at -O1 and -O2 (-O3 and
#     -march=native are the benchmark script's, bench/consumer_bench.sh).
# usage: run.sh <grad source root> <scratch dir>
set -eu
src=$(cd "$1" && pwd)
work=$2
rm -rf "$work"
mkdir -p "$work/sub/subprojects"
grad_off="-Dgrad:tests=false -Dgrad:examples=false -Dgrad:benchmarks=disabled -Dgrad:cuda=disabled"

# 1. subproject, both modes
cp "$src/test/consumer/consumer.cpp" "$work/sub/"
ln -s "$src" "$work/sub/subprojects/grad"
cat > "$work/sub/meson.build" <<'MESON'
project('consumer', 'cpp', default_options: ['cpp_std=c++20', 'buildtype=debugoptimized'])
executable('consumer', 'consumer.cpp', dependencies: dependency('grad', fallback: ['grad', 'grad_dep']))
executable('consumer-compiled', 'consumer.cpp',
  dependencies: dependency('grad-kernels', fallback: ['grad', 'grad_kernels_dep']))
MESON
meson setup "$work/sub/build" "$work/sub" --force-fallback-for=grad,grad-kernels $grad_off >"$work/sub.log" 2>&1 ||
  { cat "$work/sub.log"; exit 1; }
ninja -C "$work/sub/build" >>"$work/sub.log" 2>&1 || { cat "$work/sub.log"; exit 1; }
"$work/sub/build/consumer" >"$work/out-sub-header-only"
"$work/sub/build/consumer-compiled" >"$work/out-sub-compiled"

# 2. installed, found by pkg-config, both modes
meson setup "$work/grad-build" "$src" --prefix="$work/prefix" --libdir=lib \
  -Dtests=false -Dexamples=false -Dbenchmarks=disabled -Dcuda=disabled >"$work/install.log" 2>&1 ||
  { cat "$work/install.log"; exit 1; }
meson install -C "$work/grad-build" >>"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
test -f "$work/prefix/include/grad/grad.hpp"
test -f "$work/prefix/lib/libgrad_kernels.a"
for opt in -O1 -O2; do
  ${CXX:-c++} $opt $(pkg-config --cflags grad) "$src/test/consumer/consumer.cpp" -o "$work/consumer-pc" \
    $(pkg-config --libs grad) -pthread
  "$work/consumer-pc" >"$work/out-pc-header-only$opt"
  ${CXX:-c++} $opt $(pkg-config --cflags grad-kernels) "$src/test/consumer/consumer.cpp" -o "$work/consumer-pc-k" \
    $(pkg-config --libs grad-kernels) -pthread
  "$work/consumer-pc-k" >"$work/out-pc-compiled$opt"
done

# Every build trained the same bits.
cat "$work/out-sub-header-only"
for f in "$work"/out-*; do
  cmp -s "$work/out-sub-header-only" "$f" || { echo "consumer: $f differs:"; cat "$f"; exit 1; }
done
echo "consumer: subproject and pkg-config, header-only and compiled kernels, -O1/-O2: same bits"
