#!/bin/sh
# The sanitizer runs CI adds to the test suite (after scripts/test.sh, which
# installs what they need):
#   build-asan  AddressSanitizer + UndefinedBehaviorSanitizer, with libstdc++'s
#               own bounds checks (_GLIBCXX_ASSERTIONS), every suite but the
#               slow bit-comparing tables that add no new code paths
#   build-tsan  ThreadSanitizer over the suites that run the thread pool
# Both build at -O1 (the kernel library too: meson.build keeps a sanitized
# build's level; under ASan + UBSan most suites' own units at -O0,
# test/meson.build: 24 -> 14 s for test_tape) without CUDA, benchmarks or examples, with line tables
# only (-g1: reports still name file and line; full -g's variable tracking
# cost a quarter of the compile time of the gemm's units), and one copy of
# each kernel, for this machine's widest instruction set (GRAD_ONLY_ISA,
# numerics/isa.hpp: a run uses no other; the kernel library's float unit
# under ASan + UBSan: 240 -> 140 s). UBSan leaves object-size to ASan, which
# checks every access against its object's bounds (the same unit: 289 ->
# 224 s without it). Compile time is what limits this on a 2-core CI
# machine. Any report fails the run.
# Usage: scripts/sanitize.sh [asan|tsan]...   (default: both)
set -eu
cd "$(dirname "$0")/.."

# Every suite (test/test_*.cpp) but those that add compile time and no code
# path of their own (each runs in the plain build):
#   transcendental      millions of inputs through the same few functions
#   finite_differences  the case table's ops again (op_cases runs them all),
#                       against central differences: ~8 min to compile here
#   identities          the same ops again, in algebraic identities
#   emit                its time is the compiler it runs on generated programs,
#                       which are not built with the sanitizers
# On CI's two cores this keeps the whole run inside its 90 minutes.
asan_skip='transcendental|finite_differences|identities|emit'
asan_suites=$(cd test && ls test_*.cpp | sed 's/^test_//; s/\.cpp$//' | grep -Ev "^($asan_skip)\$" | tr '\n' ' ')
# The suites that run the thread pool with more than one thread.
tsan_suites="gemm optimizers properties device_reduction"

# The widest instruction set this machine has, as isa.hpp's supported() decides it.
has() { grep -qw "$1" /proc/cpuinfo 2>/dev/null; }
only_isa=0
if has fma && has avx2; then only_isa=1; fi
if has fma && has avx512f && has avx512dq; then only_isa=2; fi

configure() { # dir, sanitizer, extra cpp args
  [ -f "$1/build.ninja" ] && return 0
  meson setup "$1" -Dcuda=disabled -Dbenchmarks=disabled -Dexamples=false -Dbuildtype=plain \
    -Doptimization=1 -Ddebug=false -Db_sanitize="$2" -Db_lundef=false \
    -Dcpp_args="-g1 -DGRAD_ONLY_ISA=$only_isa $3" >/dev/null
}

run_asan() {
  configure build-asan address,undefined \
    "-fno-sanitize=object-size -D_GLIBCXX_ASSERTIONS -fno-sanitize-recover=all -fno-omit-frame-pointer"
  targets=""
  for s in $asan_suites; do targets="$targets test/test_$s"; done
  # shellcheck disable=SC2086
  meson compile -C build-asan $targets
  # Property graphs: fewer under ASan (each is ~10x slower); the full count runs in the plain build.
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 GRAD_PROPERTY_GRAPHS=100 \
    meson test -C build-asan --print-errorlogs --no-rebuild $asan_suites
}

run_tsan() {
  configure build-tsan thread "-fno-omit-frame-pointer"
  targets=""
  for s in $tsan_suites; do targets="$targets test/test_$s"; done
  # shellcheck disable=SC2086
  meson compile -C build-tsan $targets
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 GRAD_PROPERTY_GRAPHS=60 \
    meson test -C build-tsan --print-errorlogs --no-rebuild $tsan_suites
}

[ $# -eq 0 ] && set -- asan tsan
for which in "$@"; do
  case "$which" in
    asan) run_asan ;;
    tsan) run_tsan ;;
    *) echo "sanitize.sh: unknown run '$which' (expected asan or tsan)" >&2; exit 2 ;;
  esac
done
