#!/bin/sh
# The README's first command: install what is missing, build the demo, run it.
# It builds only the demo program, header-only, in its own directory
# (build-demo/: no tests, benchmarks, CUDA, MPI or device library, and nothing of
# ./build, which scripts/build.sh and scripts/test.sh use), and writes the
# loss curve there: build-demo/autoencoder_loss.{csv,svg}.
set -eu
cd "$(dirname "$0")/.."
# ccache (when installed) hashes paths under the clone relative to it, so
# build directories share objects: build-demo's program is not compiled again in build/.
: "${CCACHE_BASEDIR:=$(pwd)}"
export CCACHE_BASEDIR
GRAD_WITH_TORCH=0 GRAD_WITH_SKLEARN=0 GRAD_WITH_MPI=0 GRAD_WITH_DOCS=0 scripts/setup.sh
dir=build-demo
[ -f "$dir/build.ninja" ] || meson setup "$dir" -Dtests=false -Dbenchmarks=disabled -Dcuda=disabled -Ddevice=false -Dmpi=disabled
meson compile -C "$dir" autoencoder
exec "$dir/examples/autoencoder" --csv "$dir/autoencoder_loss.csv" --svg "$dir/autoencoder_loss.svg" "$@"
