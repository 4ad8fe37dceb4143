#!/bin/sh
# The llama.cpp round trip (test_llama_cpp.cpp): installs node-llama-cpp,
# pinned, into WORK (the build directory, never the source tree), checks that
# its prebuilt CPU binary runs here, then runs the suite with
# GRAD_LLAMA_DECODE pointing at decode.mjs. Exit 77 (skipped), saying why,
# when node (20 or later) or npm is missing, npm cannot install the package,
# or the binary cannot run on this machine.
#
#   run.sh TEST_EXE WORK SOURCE_DIR
set -u
exe=$1 work=$2 src=$3
version=3.21.1  # node-llama-cpp: llama.cpp release v0.4.0's CPU build (ggml-org/llama.cpp)

skip() { echo "SKIP: $*"; exit 77; }
command -v node >/dev/null 2>&1 || skip "node is not installed (Debian: apt-get install nodejs npm)"
command -v npm >/dev/null 2>&1 || skip "npm is not installed (Debian: apt-get install npm)"
node_major=$(node -p "process.versions.node.split('.')[0]")
[ "$node_major" -ge 20 ] 2>/dev/null || skip "node $(node --version) is older than node-llama-cpp $version needs (20 or later)"
case $(uname -s)-$(uname -m) in
  Linux-x86_64) binary=@node-llama-cpp/linux-x64 ;;
  Linux-aarch64) binary=@node-llama-cpp/linux-arm64 ;;
  *) skip "no prebuilt llama.cpp CPU binary for $(uname -s) $(uname -m) in node-llama-cpp" ;;
esac

mkdir -p "$work" || exit 1
# (Read as a file: the package's exports do not include its package.json.)
installed=$(cd "$work" &&
  node -p "JSON.parse(require('fs').readFileSync('node_modules/node-llama-cpp/package.json', 'utf8')).version" 2>/dev/null)
if [ "$installed" != "$version" ]; then
  echo "installing node-llama-cpp $version and $binary into $work"
  # Only the CPU binary of this machine (the package's optional dependencies
  # are every platform's and GPU's builds, 700 MB); no install scripts: they
  # would look for GPUs or build llama.cpp from source.
  [ -f "$work/package.json" ] || echo '{"private": true}' > "$work/package.json"
  (cd "$work" && npm install --no-audit --no-fund --ignore-scripts --omit=optional --save-exact \
      "node-llama-cpp@$version" "$binary@$version") > "$work/npm-install.log" 2>&1 ||
    skip "npm could not install node-llama-cpp $version (the registry unreachable?): see $work/npm-install.log"
fi
cp "$src/decode.mjs" "$work/decode.mjs" || exit 1
probe=$(node "$work/decode.mjs" --probe 2>&1)
case $? in
  0) ;;
  3) skip "llama.cpp's prebuilt binary does not run here: $probe" ;;
  *) echo "decode.mjs --probe failed: $probe"; exit 1 ;;
esac
GRAD_LLAMA_DECODE=$work/decode.mjs exec "$exe"
