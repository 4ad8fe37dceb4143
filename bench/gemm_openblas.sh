#!/bin/sh
# Builds bench/gemm_openblas.cpp against this tree's headers (and, with
# BEFORE=<another tree>, against that tree's too) with the project's flags
# (-O3 -ffp-contract=off, baseline x86-64 with grad's run-time dispatch) and
# runs it beside OpenBLAS, interleaved. OpenBLAS: Debian's
# libopenblas0-serial, unpacked (nothing installed) unless OPENBLAS names a
# libblas.so.3:
#   apt-get download libopenblas0-serial && dpkg-deb -x libopenblas0-serial_*.deb /tmp/ob
#   OPENBLAS=/tmp/ob/usr/lib/x86_64-linux-gnu/openblas-serial/libblas.so.3 bench/gemm_openblas.sh [rounds] [threads]
# OpenBLAS picks its own kernels (the program prints the core it chose): the
# OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE of the caller's environment are dropped
# unless KEEP_OPENBLAS_ENV=1 (the development machine's shell had them set to
# Haswell / 512, which would hand the peer its AVX2 kernels on an AVX-512 CPU).
set -eu
here=$(cd "$(dirname "$0")/.." && pwd)
out=${OUT_DIR:-/tmp/gemm_openblas}
mkdir -p "$out"
: "${OPENBLAS:?set OPENBLAS to OpenBLAS's libblas.so.3}"
[ "${KEEP_OPENBLAS_ENV:-0}" = 1 ] || unset OPENBLAS_CORETYPE OPENBLAS_L2_SIZE
cxx=${CXX:-g++}
flags="-std=c++20 -O3 -ffp-contract=off -fno-math-errno -Wno-psabi -pthread"
$cxx $flags -I "$here/include" "$here/bench/gemm_openblas.cpp" -o "$out/after" -ldl
[ -n "${BEFORE:-}" ] && $cxx $flags -I "$BEFORE/include" "$here/bench/gemm_openblas.cpp" -o "$out/before" -ldl
echo "$(date -u +%FT%TZ) $(lscpu | sed -n 's/^Model name: *//p') load: $(cut -d' ' -f1-3 /proc/loadavg)"
for i in 1 2; do
  [ -n "${BEFORE:-}" ] && { echo "== before ($BEFORE)"; "$out/before" "$OPENBLAS" "${1:-7}" "${2:-1}"; }
  echo "== after"; "$out/after" "$OPENBLAS" "${1:-7}" "${2:-1}"
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
