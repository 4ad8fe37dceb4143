#!/bin/sh
# Every way people configure grad, checked in about two minutes (CI runs it
# after scripts/test.sh, whose build/ it installs from):
#  1. sweep: meson setup alone for every combination of tests, device,
#     benchmarks and cuda (examples, mpi and peer_bench varied along), nvcc
#     off PATH. Each must configure, or stop with an ERROR that names one of
#     the -D options it was given (the option to change);
#  2. rows: configure + build one small target for each way in the README
#     names: top-level default (nvcc on PATH, as scripts/build.sh), demo's
#     options, -Ddevice=false, -Dmpi=disabled, -Dcuda=disabled, -Dhf=disabled
#     (configure only), no nvcc on
#     PATH, grad as a meson subproject with no options and with
#     -Dgrad:tests=true, and no python3-torch (the oracle suites of build/
#     on their golden data alone);
#  3. pkg-config: an installed copy (meson install of build/, else a lean
#     build of its libraries) and one small program per .pc file: grad,
#     grad-kernels, grad-device, grad-dist (when Open MPI is there), grad-hf
#     (when nlohmann-json and PCRE2 are); and the CMake package: a CMake
#     project (test/consumer/cmake) that finds the copy with
#     find_package(grad CONFIG), builds and runs.
# usage: scripts/config-matrix.sh [sweep|rows|pkgconfig]...  (default: all)
set -eu
cd "$(dirname "$0")/.."
src=$(pwd)
work=$src/build-matrix
jobs=$(nproc 2>/dev/null || echo 2)
# PATH without any directory that holds an nvcc (a wrapper may sit in /usr/local/bin too).
nocuda_path=$(printf '%s' "$PATH" | tr ':' '\n' | while read -r d; do [ -x "$d/nvcc" ] || echo "$d"; done | paste -sd: -)
cuda_path=/usr/local/cuda/bin:$PATH
failed=0
fail() { echo "config-matrix: FAIL: $*"; failed=1; }

# One configure of the sweep: $1 = row name, the rest meson options. Prints
# "ok", "refused" (with the option named) or "FAIL".
sweep_one() {
  dir=$work/sweep/$1; shift
  rm -rf "$dir"
  if PATH=$nocuda_path meson setup "$dir" "$src" "$@" >"$dir.log" 2>&1; then
    echo "ok       $*"
  else
    err=$(grep -m1 'ERROR' "$dir.log" || echo "(no ERROR line)")
    named=no
    for o in "$@"; do
      case "$err" in *"${o%%=*}="*) named=yes ;; esac
    done
    if [ $named = yes ]; then echo "refused  $* :: ${err#*ERROR: }"; else echo "FAIL     $* :: $err"; fi
  fi
  rm -rf "$dir"
}

pick() { shift $(($1 + 1)); echo "$1"; }  # pick K A B C: the K-th (from 0) of A B C

sweep() {
  mkdir -p "$work/sweep"
  : >"$work/sweep.list"
  i=0
  for ti in 0 1 2; do for di in 0 1 2; do for bi in 0 1 2; do for ci in 0 1 2; do
    # examples, mpi and peer_bench vary along, each a different sum of the other
    # four indices mod 3, so that every value of theirs meets every value of each of the four.
    t=$(pick $ti auto true false) d=$(pick $di auto true false)
    b=$(pick $bi auto enabled disabled) c=$(pick $ci auto enabled disabled)
    e=$(pick $(((ti + di + bi + ci) % 3)) auto true false)
    m=$(pick $(((ti + 2 * di + ci) % 3)) auto enabled disabled)
    p=$(pick $(((di + 2 * bi + ci) % 3)) disabled disabled enabled)
    echo "s$i -Dtests=$t -Ddevice=$d -Dbenchmarks=$b -Dcuda=$c -Dexamples=$e -Dmpi=$m -Dpeer_bench=$p" >>"$work/sweep.list"
    i=$((i + 1))
  done; done; done; done
  # Two configures at a time: each is mostly meson's own start-up and probes.
  xargs -P "$jobs" -L 1 "$src/scripts/config-matrix.sh" sweep-one <"$work/sweep.list" >"$work/sweep.out"
  # What each refusal said, once per message; every line is in build-matrix/sweep.out.
  grep '^refused' "$work/sweep.out" | sed 's/.* :: /  refused: /' | sort | uniq -c
  grep '^FAIL' "$work/sweep.out" || true
  n_ok=$(grep -c '^ok' "$work/sweep.out" || true)
  n_ref=$(grep -c '^refused' "$work/sweep.out" || true)
  echo "config-matrix: sweep: $(wc -l <"$work/sweep.list") combinations: $n_ok configure, $n_ref refused naming the option"
  grep -q '^FAIL' "$work/sweep.out" && fail "a combination failed without naming the option to change (above)"
  [ "$(wc -l <"$work/sweep.out")" -eq "$(wc -l <"$work/sweep.list")" ] || fail "the sweep lost rows"
}

# One row: $1 name, $2 PATH, $3 target ('' = configure only), rest options.
# Its build directory sits beside build/ (build-matrix-NAME), so a unit's
# command line is the one build/ ran (../include, ../examples/...) and ccache
# serves it: the rows check that each way configures and links, and compile
# nothing build/ did not compile the same way already.
row() {
  name=$1 path=$2 target=$3; shift 3
  dir=$src/build-matrix-$name log=$work/row-$name.log
  mkdir -p "$work"; rm -rf "$dir"
  start=$(date +%s)
  if PATH=$path meson setup "$dir" "$src" "$@" >"$log" 2>&1 &&
     { [ -z "$target" ] || PATH=$path meson compile -C "$dir" "$target" >>"$log" 2>&1; }; then
    echo "config-matrix: row $name ($*): built ${target:-nothing} in $(($(date +%s) - start)) s"
  else
    tail -20 "$log"; fail "row $name ($*)"
  fi
  rm -rf "$dir"
}

# A consumer project with grad as its subproject: $1 name, rest -D options.
subproject_row() {
  name=$1; shift
  dir=$work/rows/$name
  rm -rf "$dir"; mkdir -p "$dir/subprojects"
  ln -s "$src" "$dir/subprojects/grad"
  printf '#include <grad/core.hpp>\nint main() { grad::Tape<double> tp; return tp.ok() ? 0 : 1; }\n' >"$dir/app.cpp"
  cat >"$dir/meson.build" <<'MESON'
project('app', 'cpp', default_options: ['cpp_std=c++20'])
executable('app', 'app.cpp', dependencies: dependency('grad', fallback: ['grad', 'grad_dep']))
MESON
  start=$(date +%s)
  if PATH=$nocuda_path meson setup "$dir/build" "$dir" "$@" >"$dir.log" 2>&1 &&
     meson compile -C "$dir/build" app >>"$dir.log" 2>&1 && "$dir/build/app"; then
    echo "config-matrix: row $name ($*): built app in $(($(date +%s) - start)) s"
  else
    tail -20 "$dir.log"; fail "row $name ($*)"
  fi
}

rows() {
  mkdir -p "$work/rows"
  small=examples/quickstart
  if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; then
    row default "$cuda_path" $small
  else
    echo "config-matrix: row default: no nvcc on this machine (the no-nvcc row covers it)"
  fi
  row demo "$PATH" examples/autoencoder -Dtests=false -Dbenchmarks=disabled -Dcuda=disabled -Ddevice=false -Dmpi=disabled
  row device-false "$nocuda_path" $small -Ddevice=false
  row mpi-disabled "$nocuda_path" $small -Dmpi=disabled
  row cuda-disabled "$cuda_path" $small -Dcuda=disabled
  row hf-disabled "$nocuda_path" '' -Dhf=disabled
  row no-nvcc "$nocuda_path" $small
  subproject_row subproject
  # With the suites asked for, grad builds them (and the device library) inside the consumer: build the smallest.
  subproject_row subproject-tests -Dgrad:tests=true
  if ninja -C "$work/rows/subproject-tests/build" -t targets all 2>/dev/null | grep -q 'subprojects/grad/test/test_tape'; then
    echo "config-matrix: row subproject-tests: grad's suites are defined"
  else
    fail "row subproject-tests: -Dgrad:tests=true defines no suite"
  fi
  rm -rf "$work/rows/subproject" "$work/rows/subproject-tests"
  no_torch_row
}

# No python3-torch: the suites with live PyTorch oracles (built in build/)
# must pass on their checked-in golden data alone. `python3 -S` leaves out
# site-packages, where Debian's python3-torch lives (GRAD_PYTHON: test/golden.hpp).
no_torch_row() {
  if [ ! -x build/test/test_op_cases ]; then
    echo "config-matrix: row no-torch: no build/test/ suites (scripts/build.sh first)"; return
  fi
  start=$(date +%s)
  for s in op_cases nn optimizers; do
    if ! GRAD_PYTHON="/usr/bin/python3 -S" GRAD_ORACLE_DIR="$src/test/oracle" "build/test/test_$s" \
        >"$work/no-torch-$s.log" 2>&1; then
      tail -20 "$work/no-torch-$s.log"; fail "row no-torch: test_$s"
    fi
  done
  grep -q 'cannot import torch' "$work/no-torch-op_cases.log" ||
    fail "row no-torch: test_op_cases did not say that it skipped its live oracle"
  echo "config-matrix: row no-torch: test_op_cases, test_nn, test_optimizers pass on golden data in $(($(date +%s) - start)) s"
}

pkgconfig() {
  prefix=$work/prefix
  rm -rf "$prefix"
  if [ -f build/build.ninja ]; then
    from=build
    meson install -C build --destdir "$prefix" >"$work/install.log" 2>&1 || { tail -20 "$work/install.log"; fail "install"; return; }
  else
    from=$work/lean
    [ -f "$from/build.ninja" ] || PATH=$nocuda_path meson setup "$from" -Dtests=false -Dexamples=false \
      -Dbenchmarks=disabled -Dcuda=disabled >"$work/install.log" 2>&1
    meson install -C "$from" --destdir "$prefix" >>"$work/install.log" 2>&1 || { tail -20 "$work/install.log"; fail "install"; return; }
  fi
  # --destdir keeps the build's prefix inside the .pc files: point copies of them at the stage.
  "$src/scripts/stage-pc.sh" "$prefix" "$work/pc" >/dev/null
  export PKG_CONFIG_PATH="$work/pc"
  cat >"$work/pc-grad.cpp" <<'CPP'
#include <grad/grad.hpp>
int main() {
  grad::Tape<double> tp;
  auto w = tp.param(grad::Tensor<double>({2}, {1.0, 2.0}));
  return tp.backward(grad::sum(w * w)) && tp.grad(w).data[1] == 4.0 ? 0 : 1;
}
CPP
  cat >"$work/pc-grad-device.cpp" <<'CPP'
#include <grad/device/device.hpp>
#include <cstdio>
int main() { std::printf("cuda_available: %d\n", grad::device::cuda_available() ? 1 : 0); }
CPP
  cat >"$work/pc-grad-dist.cpp" <<'CPP'
#include <grad/dist.hpp>
// Linked against libgrad_dist (the Communicator lives there); run without MPI.
int main(int argc, char** argv) {
  if (argc > 1) { grad::dist::Communicator comm(&argc, &argv); return comm.rank(); }
  return grad::dist::shard_rows(10, 3, 0).size() == 4 ? 0 : 1;
}
CPP
  cat >"$work/pc-grad-hf.cpp" <<'CPP'
#include <grad/hf/tokenizer.hpp>
// Linked against libgrad_hf (nlohmann-json parses, PCRE2 is linked through Requires).
int main() {
  try {
    grad::hf::Tokenizer::from_json("{}", "t.json");
  } catch (const grad::hf::TokenizerError&) {
    return grad::hf::byte_to_symbol(' ') == "\xC4\xA0" ? 0 : 1;
  }
  return 1;
}
CPP
  for pc in grad grad-kernels grad-device grad-dist grad-hf; do
    if ! pkg-config --exists $pc; then
      if [ $pc = grad-dist ]; then echo "config-matrix: pkg-config $pc: not installed (no Open MPI in $from)"; continue; fi
      if [ $pc = grad-hf ]; then echo "config-matrix: pkg-config $pc: not installed (no nlohmann-json or PCRE2 in $from)"; continue; fi
      fail "pkg-config $pc: no $pc.pc in the installed copy"; continue
    fi
    prog=$work/pc-grad.cpp
    [ $pc = grad-device ] && prog=$work/pc-grad-device.cpp
    [ $pc = grad-dist ] && prog=$work/pc-grad-dist.cpp
    [ $pc = grad-hf ] && prog=$work/pc-grad-hf.cpp
    start=$(date +%s)
    # shellcheck disable=SC2046
    if ${CXX:-c++} -std=c++20 -O1 $(pkg-config --cflags $pc) "$prog" -o "$work/pc-$pc" $(pkg-config --libs $pc) \
        >"$work/pc-$pc.log" 2>&1 && "$work/pc-$pc" >"$work/pc-$pc.out"; then
      echo "config-matrix: pkg-config $pc: built and ran in $(($(date +%s) - start)) s"
    else
      cat "$work/pc-$pc.log"; fail "pkg-config $pc"
    fi
  done
  cmake_package
  unset PKG_CONFIG_PATH
}

# The CMake package (gradConfig.cmake, cmake/): test/consumer/cmake, configured
# by Debian's cmake with CMAKE_PREFIX_PATH at the staged copy (not the prefix
# grad was configured with: the config file must find its files from its own
# location), built at -O2 and run: a program that links grad::kernels (and
# grad::hf), and one that links grad::device, where the .pc files say grad has them.
cmake_package() {
  command -v cmake >/dev/null || { fail "cmake: not installed (scripts/setup.sh installs it)"; return; }
  start=$(date +%s)
  stage=$(sed -n 's/^prefix=//p' "$work/pc/grad.pc")  # the stage's prefix, stage-pc.sh's
  dir=$work/cmake-consumer
  rm -rf "$dir"
  if ! cmake -S "$src/test/consumer/cmake" -B "$dir" -G Ninja -DCMAKE_PREFIX_PATH="$stage" \
      -DCMAKE_CXX_FLAGS="-O2 -Wall -Wextra -Werror" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >"$dir.log" 2>&1 ||
      ! ninja -C "$dir" -j "$jobs" >>"$dir.log" 2>&1; then
    cat "$dir.log"; fail "cmake: find_package(grad) consumer did not configure or build"; return
  fi
  # What each program must print: the gradients, and for hf and device what
  # their pkg-config programs say (grad::hf and grad::device exist exactly when their .pc files do).
  { echo "kernels: grad 66 88"
    if pkg-config --exists grad-hf; then echo "hf: byte 0x20 is U+0120"; fi
  } >"$dir.want"
  "$dir/consumer" >"$dir.got" 2>&1 || true
  if pkg-config --exists grad-device; then
    cat "$work/pc-grad-device.out" >>"$dir.want"
    "$dir/consumer-device" >>"$dir.got" 2>&1 || true
  fi
  if ! cmp -s "$dir.want" "$dir.got"; then
    diff "$dir.want" "$dir.got"; fail "cmake: the find_package(grad) programs printed the above (< expected, > got)"; return
  fi
  # The targets' flags, on every unit: the stage's include directory (not the
  # configured prefix's), grad.pc's -ffp-contract=off, and GRAD_COMPILED_KERNELS where grad::kernels is linked.
  python3 - "$dir/compile_commands.json" "$stage/" <<'PY' || { fail "cmake: a unit lacks grad's flags (above)"; return; }
import json, sys
bad = 0
for c in json.load(open(sys.argv[1])):
    args = c["command"].split()
    inc = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-I", "-isystem")]
    want_kernels = c["file"].endswith("/consumer.cpp")
    if (not any(i.startswith(sys.argv[2]) for i in inc) or "-ffp-contract=off" not in args
            or ("-DGRAD_COMPILED_KERNELS" in args) != want_kernels):
        print(c["file"], inc, args); bad = 1
sys.exit(bad)
PY
  echo "config-matrix: cmake: find_package(grad) consumer ($(grep -c . "$dir.want") checks) built and ran in $(($(date +%s) - start)) s"
}

mkdir -p "$work"
[ $# -eq 0 ] && set -- sweep rows pkgconfig
if [ "${1:-}" = sweep-one ]; then shift; sweep_one "$@"; exit 0; fi
for part in "$@"; do
  case "$part" in
    sweep|rows|pkgconfig) "$part" ;;
    *) echo "config-matrix.sh: unknown part '$part' (expected sweep, rows or pkgconfig)" >&2; exit 2 ;;
  esac
done
[ $failed = 0 ] && echo "config-matrix: all rows pass"
exit $failed
