#!/bin/sh
# Configures (once) and builds grad in ./build. nvcc is used when it is found
# (meson looks on PATH only, so the usual CUDA location is added to it).
set -eu
cd "$(dirname "$0")/.."
# ccache (when installed) hashes paths under the clone relative to it, so
# build directories share objects: build-demo's program is not compiled again in build/.
: "${CCACHE_BASEDIR:=$(pwd)}"
export CCACHE_BASEDIR
[ -x /usr/local/cuda/bin/nvcc ] && PATH="/usr/local/cuda/bin:$PATH" && export PATH
[ -f build/build.ninja ] || meson setup build "$@"
meson compile -C build
