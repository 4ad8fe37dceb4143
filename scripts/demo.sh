#!/bin/sh
# The README's first command: install, build, run the main example.
set -eu
cd "$(dirname "$0")/.."
GRAD_WITH_TORCH=0 scripts/setup.sh
scripts/build.sh
# The loss curve lands next to the build: build/autoencoder_loss.{csv,svg}.
exec build/examples/autoencoder --csv build/autoencoder_loss.csv --svg build/autoencoder_loss.svg "$@"
