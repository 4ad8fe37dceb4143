#!/bin/sh
# Installs what grad needs from Debian 12's repositories, skipping what is there.
# Run as root (or through sudo). python3-torch is optional: it enables the live
# PyTorch oracle comparisons (the checked-in golden data is always compared).
# python3-sklearn is optional too: it ships the data set examples/digits reads
# (GRAD_WITH_SKLEARN=0 skips it). Open MPI (libopenmpi-dev, openmpi-bin) builds
# grad::dist's library and lets the test suite run it under mpirun
# (GRAD_WITH_MPI=0 skips it: grad::dist's MPI test then reports itself skipped).
# doxygen builds the API reference (`ninja -C build docs`; GRAD_WITH_DOCS=0
# skips it). CLI11 (libcli11-dev, header-only) parses the programs' options.
# nlohmann-json (nlohmann-json3-dev) and PCRE2 (libpcre2-dev) build grad::hf:
# Hugging Face model directories, tokenizers and GGUF export; utf8proc
# (libutf8proc-dev) lets its tokenizers compose NFC (Qwen2's normalizer).
# ccache: meson puts it in front of the compilers, so a unit compiled before
# (in any build directory: scripts/build.sh sets its base directory) is not
# compiled again.
set -eu
want="meson ninja-build pkg-config cmake g++ ccache doctest-dev libboost-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev libpcre2-dev libutf8proc-dev"
[ "${GRAD_WITH_TORCH:-1}" = 1 ] && want="$want python3-torch"
[ "${GRAD_WITH_SKLEARN:-1}" = 1 ] && want="$want python3-sklearn"
[ "${GRAD_WITH_MPI:-1}" = 1 ] && want="$want libopenmpi-dev openmpi-bin"
[ "${GRAD_WITH_DOCS:-1}" = 1 ] && want="$want doxygen"
missing=""
for p in $want; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
if [ -n "$missing" ]; then
  echo "setup: installing$missing"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $missing >/dev/null
fi
