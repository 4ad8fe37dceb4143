#!/bin/sh
# The README's first command: install, build, run the main example.
set -eu
cd "$(dirname "$0")/.."
GRAD_WITH_TORCH=0 scripts/setup.sh
scripts/build.sh
if [ -x build/examples/autoencoder ]; then
  exec build/examples/autoencoder "$@"
fi
exec build/examples/quickstart
