#!/bin/sh
# stage-pc.sh STAGE DIR: copies the .pc files of an install staged with
# `meson install --destdir STAGE` into DIR, their prefix moved into STAGE, so
# that PKG_CONFIG_PATH=DIR finds the staged copy; prints the directory they
# came from (the staged libdir's pkgconfig/). PKG_CONFIG_SYSROOT_DIR would move
# every -L and -I, the CUDA toolkit's -L/usr/local/cuda/lib64 as well.
# Used by scripts/config-matrix.sh and test/consumer/run.sh.
set -eu
from=$(dirname "$(find "$1" -name grad.pc | head -1)")
rm -rf "$2"
mkdir -p "$2"
for f in "$from"/*.pc; do
  sed "s|^prefix=\(.*\)|prefix=$1\1|" "$f" >"$2/$(basename "$f")"
done
echo "$from"
