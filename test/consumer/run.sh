#!/bin/sh
# Builds test/consumer/consumer.cpp against grad the ways a downstream
# project can, and checks that every build prints the same result bits:
#  1. as a meson subproject with grad's default options (no -Dgrad:...):
#     dependency('grad') (header-only) and dependency('grad-kernels') (the
#     compiled kernel library), at -O2. The defaults must be lean: no test,
#     benchmark, example, CUDA or device-library target may even be defined,
#     and nothing of grad's but the kernel library may be compiled; the
#     compiled-kernels unit must define none of the library's loops;
#  2. against an installed copy through pkg-config: grad.pc (header-only)
#     and grad-kernels.pc, with ${CXX:-c++} -std=c++20 (the consumer's own
#     standard: the .pc files must not set one) at -O1 and -O2, linked with
#     nothing but what `pkg-config --libs` says (-pthread included).
#     (-O3 and -march=native are the benchmark script's, bench/consumer_bench.sh.)
# Every build compiles consumer.cpp (which includes grad/grad.hpp, every
# header-only header) with -Wall -Wextra -Wshadow -Wconversion -Werror: a
# strict project must be able to include grad.
# usage: run.sh <grad source root> <scratch dir> [<grad build dir to install from>]
set -eu
src=$(cd "$1" && pwd)
work=$2
install_from=${3:-}
rm -rf "$work"
mkdir -p "$work/sub/subprojects"
fail() { echo "consumer: $*"; exit 1; }
strict="-Wall -Wextra -Wshadow -Wconversion -Werror"

# The two parts are independent: the pkg-config builds (2.) run one after
# another in the background while the subproject (1.) builds with two jobs:
# three compilers at once keep CI's two cores busy, where the parts one
# after the other left a core idle for a minute and more of each.
pkg_config_part() {
  # 2. installed, found by pkg-config, both modes: the build that runs this
  # test, staged with --destdir (nothing compiled again), or a lean build of its
  # own when no build directory is given
  if [ -n "$install_from" ]; then
    meson install -C "$install_from" --no-rebuild --destdir "$work/stage" >"$work/install.log" 2>&1 ||
      { cat "$work/install.log"; exit 1; }
    # The .pc files name the build's prefix: point copies of them at the stage.
    pcdir=$("$src/scripts/stage-pc.sh" "$work/stage" "$work/pc")
    export PKG_CONFIG_PATH="$work/pc"
  else
    meson setup "$work/grad-build" "$src" --prefix="$work/stage" --libdir=lib \
      -Dtests=false -Dexamples=false -Dbenchmarks=disabled -Dcuda=disabled >"$work/install.log" 2>&1 ||
      { cat "$work/install.log"; exit 1; }
    meson install -C "$work/grad-build" >>"$work/install.log" 2>&1 || { cat "$work/install.log"; exit 1; }
    pcdir="$work/stage/lib/pkgconfig"
    export PKG_CONFIG_PATH="$pcdir"
  fi
  libdir=$(dirname "$pcdir")
  [ -n "$(find "$work/stage" -path '*/include/grad/grad.hpp')" ] || fail "no include/grad/grad.hpp installed"
  test -f "$libdir/libgrad_kernels.a" || fail "no libgrad_kernels.a in $libdir"
  # The device library is installed when it is built, with its own .pc.
  test -f "$libdir/libgrad_device.a" || fail "no libgrad_device.a in $libdir"
  pkg-config --libs grad-device | grep -q -- '-lgrad_device' || fail "grad-device.pc does not link libgrad_device"
  for pc in grad grad-kernels grad-device; do
    case " $(pkg-config --cflags $pc) " in *" -std="*) fail "$pc.pc sets the consumer's -std: $(pkg-config --cflags $pc)" ;; esac
    case " $(pkg-config --libs $pc) " in *" -pthread "*) ;; *) fail "$pc.pc Libs lack -pthread: $(pkg-config --libs $pc)" ;; esac
  done
  pc_build() { # pc, opt, name
    ${CXX:-c++} -std=c++20 $2 $strict $(pkg-config --cflags $1) "$src/test/consumer/consumer.cpp" -o "$work/$3$2" \
      $(pkg-config --libs $1) >"$work/$3$2.log" 2>&1 || { cat "$work/$3$2.log"; fail "the $1.pc build at $2 failed"; }
    "$work/$3$2" >"$work/out-$3$2"
  }
  for opt in -O1 -O2; do
    pc_build grad $opt pc-header-only
    pc_build grad-kernels $opt pc-compiled
  done
}
pkg_config_part >"$work/pkg-config-part.log" 2>&1 &
pkg_config_pid=$!
trap 'kill $pkg_config_pid 2>/dev/null || true' EXIT

# 1. subproject, both modes
cp "$src/test/consumer/consumer.cpp" "$work/sub/"
ln -s "$src" "$work/sub/subprojects/grad"
cat > "$work/sub/meson.build" <<'MESON'
project('consumer', 'cpp', default_options: ['cpp_std=c++20', 'buildtype=debugoptimized'])
strict = ['-Wall', '-Wextra', '-Wshadow', '-Wconversion', '-Werror']
executable('consumer', 'consumer.cpp', cpp_args: strict,
  dependencies: dependency('grad', fallback: ['grad', 'grad_dep']))
executable('consumer-compiled', 'consumer.cpp', cpp_args: strict,
  dependencies: dependency('grad-kernels', fallback: ['grad', 'grad_kernels_dep']))
MESON
meson setup "$work/sub/build" "$work/sub" --force-fallback-for=grad,grad-kernels >"$work/sub.log" 2>&1 ||
  { cat "$work/sub.log"; exit 1; }
# Lean by default: no such target is defined at all...
ninja -C "$work/sub/build" -t targets all | cut -d: -f1 >"$work/sub-targets"
if grep -E '(^|/)(test_|bench_)|doctest|google-benchmark|examples/|grad_device|\.cu(\.o)?$|/kernels/' "$work/sub-targets"; then
  fail "a grad subproject with default options defines the targets above"
fi
start=$(date +%s)
ninja -j 2 -C "$work/sub/build" >>"$work/sub.log" 2>&1 || { cat "$work/sub.log"; exit 1; }
# ...and what was compiled is the consumer's two programs plus the kernel library they asked for.
cut -f4 "$work/sub/build/.ninja_log" | grep -v '^#' | sort -u >"$work/sub-built"
if grep -vE '^(consumer(-compiled)?(\.p/consumer\.cpp\.o)?|subprojects/grad/(libgrad_kernels\.a|libgrad_kernels\.a\.p/src_(kernels|extras)_(float|double)\.cpp\.o))$' \
  "$work/sub-built"; then
  fail "the subproject build compiled the outputs above (only the consumer and libgrad_kernels expected)"
fi
echo "consumer: subproject build (default grad options): $(wc -l <"$work/sub-built") outputs, $(($(date +%s) - start)) s"
# grad_dep adds no -std: the consumer's own (cpp_std=c++20) is the only one on its command lines.
python3 - "$work/sub/build/compile_commands.json" <<'PY' || fail "a -std other than the consumer's reached its units"
import json, sys
for c in json.load(open(sys.argv[1])):
    if c["file"].endswith("consumer.cpp"):
        stds = [a for a in c["command"].split() if a.startswith("-std=")]
        if stds != ["-std=c++20"]:
            print(c["output"], stds); sys.exit(1)
PY
# With the compiled kernels the consumer's unit compiles no op's loop, the
# gemm, the reverse walk or the forward dispatch: the library holds them
# (kernels_extern.hpp, core.hpp). A loop defined here again means a tag's
# loops are reached by a path that bypasses them (compile time, not bits).
nm -C "$work/sub/build/consumer-compiled.p/consumer.cpp.o" |
  grep -E ' [TtWw] .*(::(forward|backward)_tensor<|gemm_detail::multiply|Tape<[a-z]+>::walk\(|forward_by_code)' &&
  fail "the compiled-kernels consumer's unit defines the loops above itself"
"$work/sub/build/consumer" >"$work/out-sub-header-only"
"$work/sub/build/consumer-compiled" >"$work/out-sub-compiled"

wait $pkg_config_pid || { cat "$work/pkg-config-part.log"; exit 1; }
trap - EXIT

# Every build trained the same bits.
cat "$work/out-sub-header-only"
for f in "$work"/out-*; do
  cmp -s "$work/out-sub-header-only" "$f" || { echo "consumer: $f differs:"; cat "$f"; exit 1; }
done
echo "consumer: subproject and pkg-config, header-only and compiled kernels, -O1/-O2: same bits"
