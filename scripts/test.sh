#!/bin/sh
# Everything the test suite needs, then every test: the README's test command.
set -eu
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
meson test -C build --print-errorlogs "$@"
