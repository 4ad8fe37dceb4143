#!/bin/sh
# Builds test/consumer/consumer.cpp against grad two ways:
#  1. as a meson subproject, through dependency('grad') (meson.override_dependency);
#  2. against an installed copy, through the generated grad.pc.
# usage: run.sh <grad source root> <scratch dir>
set -eu
src=$(cd "$1" && pwd)
work=$2
rm -rf "$work"
mkdir -p "$work/sub/subprojects"
grad_off="-Dgrad:tests=false -Dgrad:examples=false -Dgrad:benchmarks=disabled -Dgrad:cuda=disabled"

# 1. subproject
cp "$src/test/consumer/consumer.cpp" "$work/sub/"
ln -s "$src" "$work/sub/subprojects/grad"
cat > "$work/sub/meson.build" <<'MESON'
project('consumer', 'cpp', default_options: ['cpp_std=c++20'])
executable('consumer', 'consumer.cpp', dependencies: dependency('grad', fallback: ['grad', 'grad_dep']))
MESON
meson setup "$work/sub/build" "$work/sub" --force-fallback-for=grad $grad_off >"$work/sub.log" 2>&1 || { cat "$work/sub.log"; exit 1; }
ninja -C "$work/sub/build" >>"$work/sub.log" 2>&1 || { cat "$work/sub.log"; exit 1; }
"$work/sub/build/consumer"

# 2. installed, found by pkg-config
meson setup "$work/grad-build" "$src" --prefix="$work/prefix" --libdir=lib \
  -Dtests=false -Dexamples=false -Dbenchmarks=disabled -Dcuda=disabled >"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
meson install -C "$work/grad-build" >>"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
test -f "$work/prefix/include/grad/grad.hpp"
${CXX:-c++} $(pkg-config --cflags grad) "$src/test/consumer/consumer.cpp" -o "$work/consumer-pc" $(pkg-config --libs grad)
"$work/consumer-pc"
