#!/usr/bin/env bash
# The GPU check, in two halves, so that the GPU machine (offline, bare, lent
# for minutes) only runs binaries:
#
#   scripts/device-check.sh [--dry-run | --build-only] [--worktree]   here (nvcc, meson, ninja)
#   scripts/device-check.sh --run build-device/carry                   on the GPU machine
#
# Here: takes the committed tree (HEAD, copied into build-device/src, so the
# binaries are one commit's, whatever else is being edited; --worktree builds
# the working tree instead), configures it (CUDA for sm_90, release, no
# downloads), builds the device suites, the NCCL checks and bench_device, and
# assembles one folder, build-device/carry/ (at most 64 MiB: stripped binaries
# with static cudart, the shared libraries they need beyond glibc and libnccl,
# a manifest), then prints its size and the exact device command. --dry-run
# stops there; --build-only too, silently; with neither it goes on to run the
# device half on this machine, which stops at the preflight when no GPU answers.
#
# On the GPU machine (--run DIR; no meson, no compiler, no network needed):
#   1. preflight: driver, cuda_available(), compute capability (9.0), name
#   2. every device suite with GRAD_REQUIRE_CUDA=1: a CUDA case that would
#      skip, or a graph fallback, fails; a failing suite is rerun with
#      GRAD_DEVICE_SYNC=1 so that the faulting kernel is named
#   2b. emit_cuda_check: the CUDA source grad::emit writes, built here from the
#      generated programs and the tape's answers, run there, compared bitwise
#   2c. grad::dist over NCCL, one rank (no MPI there): nccl_check (the NCCL
#      fold = the host fold, bitwise) and nccl_program_check (ProgramParallel
#      through the NCCL reducer = LocalShards on the tape = HostReduction,
#      bitwise). libnccl.so.2 is not carried (218 MB): it is looked for there
#      (ldconfig -p, then python3's nvidia/nccl/lib from the pip package
#      nvidia-nccl-cu13, then a bounded find under /usr /opt /usr/local); a
#      row says "skipped" when it is not found, which is not a failure
#   3. bench_device in all four modes (CPU tape, per-node, graph, fused)
#   4. compute-sanitizer memcheck / racecheck / synccheck on a short fused
#      run, when the tool is there
#   5. two identical fingerprint runs (bits of loss traces and weights in
#      every mode and precision), compared with each other
#   6. a short table, last (the logs are copied to $OUT when it is set)
# Sized for < 5 minutes; every step has its own timeout.
#
#   env: GPU_ARCH (sm_90), EXPECT_CC (9.0), JOBS (nproc), REPS (bench repetitions, 3)
set -u -o pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
arch=${GPU_ARCH:-sm_90}
expect_cc=${EXPECT_CC:-9.0}
reps=${REPS:-3}
limit_mib=64
suites=(test_device_parity test_device_training test_fusion test_device_reduction test_device_sampling)

now() { date +%s; }
rows=()
row() { rows+=("$(printf '%-30s %-44s %s' "$1" "$2" "$3")"); }
table() {
  echo
  echo "== grad device-check: $(date -u '+%Y-%m-%d %H:%M UTC'), $1 =="
  printf '%-30s %-44s %s\n' "step" "result" "time"
  for r in "${rows[@]}"; do echo "$r"; done
}

# ---------------------------------------------------------------- device half
# The device tool brings back what is under $OUT: the logs go there too.
keep_logs() {
  if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then cp -r "$1" "$OUT/device-check-logs" 2> /dev/null; fi
}

# The directory of a libnccl.so.2 on this machine, or nothing.
find_nccl() {
  local lib dir
  lib=$({ ldconfig -p || /sbin/ldconfig -p; } 2> /dev/null | awk '$1 == "libnccl.so.2" && $NF ~ /^\// { print $NF; exit }')
  if [ -n "$lib" ] && [ -f "$lib" ]; then
    dirname "$lib"
    return
  fi
  # The pip package nvidia-nccl-cu13 (or -cu12): <site-packages>/nvidia/nccl/lib, or wherever under nvidia/.
  if command -v python3 > /dev/null; then
    dir=$(timeout 20 python3 -c '
import os, nvidia
for top in list(nvidia.__path__):
    for d, _, files in os.walk(top):
        if "libnccl.so.2" in files:
            print(d)
            raise SystemExit
' 2> /dev/null | head -1)
    if [ -n "$dir" ] && [ -f "$dir/libnccl.so.2" ]; then
      echo "$dir"
      return
    fi
  fi
  lib=$(timeout 30 find /usr /opt /usr/local -maxdepth 8 -name 'libnccl.so.2' \( -type f -o -type l \) \
    2> /dev/null | head -1)
  if [ -n "$lib" ]; then dirname "$lib"; fi
}

run_device() {
  local carry=$1 t0 t status failed=0
  carry=$(cd "$carry" 2>/dev/null && pwd) || {
    echo "device-check: no carried folder at '$1' (build it first: scripts/device-check.sh --build-only)" >&2
    exit 2
  }
  local bin=$carry/bin logs=${LOGS:-$carry/../logs}
  mkdir -p "$logs" && logs=$(cd "$logs" && pwd)
  export LD_LIBRARY_PATH="$carry/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  t0=$(now)
  [ -f "$carry/BUILD_INFO" ] && sed 's/^/build: /' "$carry/BUILD_INFO"
  if ! (cd "$carry" && sha256sum --quiet -c MANIFEST) > "$logs/manifest.log" 2>&1; then
    row "manifest" "FAILED: carried files differ from the build" "-"
    cat "$logs/manifest.log"
    table "no GPU run"
    exit 2
  fi
  # libnccl.so.2 is not carried: the NCCL checks use this machine's (step 2c).
  local nccl_dir
  nccl_dir=$(find_nccl)
  # Every binary's shared libraries must resolve here (nothing to install; libnccl: above).
  local missing
  missing=$(for f in "$bin"/*; do
    LD_LIBRARY_PATH="${nccl_dir:+$nccl_dir:}$LD_LIBRARY_PATH" ldd "$f" 2>&1 |
      grep -E 'not found|version .* not found' | grep -v -E '^\s*libnccl\.so\.2 => not found'
  done | sort -u)
  if [ -n "$missing" ]; then
    row "libraries" "FAILED: $missing" "-"
    table "no GPU run"
    exit 2
  fi

  # 1. preflight
  local driver="no nvidia-smi"
  if command -v nvidia-smi > /dev/null; then
    driver=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1)
  fi
  t=$(now)
  if timeout 60 "$bin/bench_device" --preflight --expect-cc "$expect_cc" > "$logs/preflight.log" 2>&1; then
    row "preflight" "ok: $(sed -n 's/^preflight: //p' "$logs/preflight.log" | cut -c1-60)" "$(($(now) - t)) s"
  else
    row "preflight" "STOPPED (nvidia-smi: $driver)" "$(($(now) - t)) s"
    cat "$logs/preflight.log"
    echo "device-check: stopped at the preflight: no usable CUDA device (see above); nothing else was run." >&2
    table "GPU: none usable, total $(($(now) - t0)) s"
    keep_logs "$logs"
    exit 3
  fi
  local gpu
  gpu=$(sed -n 's/^preflight: \([^,]*\),.*/\1/p' "$logs/preflight.log")

  # 2. suites, CUDA required
  for s in "${suites[@]}"; do
    t=$(now)
    if GRAD_REQUIRE_CUDA=1 timeout 120 "$bin/$s" > "$logs/$s.log" 2>&1; then
      status=ok
    else
      status=FAILED
      failed=1
      tail -40 "$logs/$s.log"
      # Name the faulting kernel: synchronise after every launch.
      GRAD_REQUIRE_CUDA=1 GRAD_DEVICE_SYNC=1 timeout 120 "$bin/$s" > "$logs/$s.sync.log" 2>&1
      grep -m3 -E 'grad::device \(cuda\)' "$logs/$s.sync.log"
    fi
    row "$s" "$status ($(grep -E '^\[doctest\] test cases:' "$logs/$s.log" | sed -E 's/.*cases: *//; s/ +/ /g'))" \
      "$(($(now) - t)) s"
  done

  # 2b. the emitted CUDA source (grad::emit): per-node kernels and value_and_grad, bitwise against the tape
  t=$(now)
  if [ -x "$bin/emit_cuda_check" ]; then
    if timeout 60 "$bin/emit_cuda_check" > "$logs/emit_cuda_check.log" 2>&1; then
      row "emit_cuda_check" "ok (emitted CUDA = tape, bitwise)" "$(($(now) - t)) s"
    else
      row "emit_cuda_check" "FAILED (see $logs/emit_cuda_check.log)" "$(($(now) - t)) s"
      failed=1
      tail -20 "$logs/emit_cuda_check.log"
    fi
  else
    row "emit_cuda_check" "not in the carried folder" "-"
  fi

  # 2c. grad::dist over NCCL, one rank (SoloGroup; the GPU machine has no MPI)
  local nccl_bin rc
  for nccl_bin in nccl_check nccl_program_check; do
    t=$(now)
    if [ ! -x "$bin/$nccl_bin" ]; then
      row "$nccl_bin" "not in the carried folder" "-"
      continue
    fi
    if [ -z "$nccl_dir" ]; then
      row "$nccl_bin" "skipped: libnccl.so.2 not found" "-"
      continue
    fi
    # NCCL_DEBUG=WARN: NCCL says why in the log when it fails.
    NCCL_DEBUG=${NCCL_DEBUG:-WARN} GRAD_REQUIRE_CUDA=1 LD_LIBRARY_PATH="$nccl_dir:$LD_LIBRARY_PATH" \
      timeout 120 "$bin/$nccl_bin" > "$logs/$nccl_bin.log" 2>&1
    rc=$?
    case $rc in
      0) row "$nccl_bin" "ok ($(grep -c 'bitwise equal' "$logs/$nccl_bin.log") cases bitwise equal)" "$(($(now) - t)) s" ;;
      77) row "$nccl_bin" "FAILED: exit 77, no CUDA device (preflight: one)" "$(($(now) - t)) s" ;;
      124 | 137) row "$nccl_bin" "FAILED: timed out (120 s)" "$(($(now) - t)) s" ;;
      *) row "$nccl_bin" "FAILED (exit $rc; see $logs/$nccl_bin.log)" "$(($(now) - t)) s" ;;
    esac
    if [ $rc -ne 0 ]; then
      failed=1
      tail -20 "$logs/$nccl_bin.log"
    else
      cat "$logs/$nccl_bin.log"
    fi
  done
  if [ -n "$nccl_dir" ]; then echo "libnccl.so.2 from $nccl_dir"; fi

  # 3. bench_device: tape, per-node, graph, fused (exit status non-zero on a fallback)
  t=$(now)
  if timeout 150 "$bin/bench_device" --benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true \
    --benchmark_min_time=0.2 > "$logs/bench_device.log" 2>&1; then
    row "bench_device" "ok (median of $reps)" "$(($(now) - t)) s"
  else
    row "bench_device" "FAILED (a mode fell back or threw)" "$(($(now) - t)) s"
    failed=1
    tail -20 "$logs/bench_device.log"
  fi

  # 4. compute-sanitizer, when the GPU machine has it
  local san
  san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2> /dev/null | head -1)
  for tool in memcheck racecheck synccheck; do
    t=$(now)
    if [ -z "$san" ]; then
      row "sanitizer $tool" "not on this machine" "-"
      continue
    fi
    if timeout 90 "$san" --tool "$tool" --error-exitcode 1 "$bin/bench_device" --short-fused-run \
      > "$logs/sanitizer-$tool.log" 2>&1; then
      row "sanitizer $tool" "ok ($(grep -m1 -o 'ERROR SUMMARY: [0-9]* errors\|RACECHECK SUMMARY.*' "$logs/sanitizer-$tool.log" || echo clean))" "$(($(now) - t)) s"
    else
      row "sanitizer $tool" "FAILED (see $logs/sanitizer-$tool.log)" "$(($(now) - t)) s"
      failed=1
      tail -20 "$logs/sanitizer-$tool.log"
    fi
  done

  # 5. determinism: two identical runs, bit for bit
  t=$(now)
  timeout 90 "$bin/bench_device" --fingerprint --steps 20 > "$logs/fingerprint-1.log" 2>&1
  local rc1=$?
  timeout 90 "$bin/bench_device" --fingerprint --steps 20 > "$logs/fingerprint-2.log" 2>&1
  local rc2=$?
  if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && cmp -s "$logs/fingerprint-1.log" "$logs/fingerprint-2.log"; then
    row "second run, bitwise" "ok (12 runs, same bits; CUDA = CPU backend)" "$(($(now) - t)) s"
  else
    row "second run, bitwise" "FAILED (rc $rc1/$rc2; diff below)" "$(($(now) - t)) s"
    failed=1
    diff "$logs/fingerprint-1.log" "$logs/fingerprint-2.log"
    grep -E 'FAILED|MISMATCH' "$logs/fingerprint-1.log"
  fi

  table "GPU: $gpu ($driver), arch $arch, total $(($(now) - t0)) s"
  if grep -q '_median' "$logs/bench_device.log"; then
    echo "one training step, median (autoencoder batch 200 / MLP 32-256-256-32 batch 256, Adam, clip):"
    grep -E '_median' "$logs/bench_device.log" |
      awk '{ c = ($NF ~ /=/) ? $NF : ""; printf "  %-40s %10s %s %s\n", $1, $2, $3, c }'
    local tape fused
    tape=$(awk '/^BM_tape_step\/200_median/ { print $2 }' "$logs/bench_device.log")
    for mode in per_node graph fused; do
      fused=$(awk -v n="BM_ae_cuda_${mode}_median" '$1 == n { print $2 }' "$logs/bench_device.log")
      [ -n "$tape" ] && [ -n "$fused" ] &&
        awk -v a="$tape" -v b="$fused" -v m="$mode" 'BEGIN { printf "  CUDA %-8s vs CPU tape: %.2fx (targets: graph >= 5x, fused >= 18x)\n", m, a / b }'
    done
  fi
  echo "logs: $logs"
  keep_logs "$logs"
  exit $failed
}

# ---------------------------------------------------------------- build half
# The committed tree in build-device/src; only files whose content changed
# are rewritten, so that an unchanged file keeps its time and is not rebuilt.
sync_head() {
  local src=$1 fresh
  fresh=$(mktemp -d)
  git -C "$root" archive HEAD | tar -x -C "$fresh" || {
    rm -rf "$fresh"
    echo "device-check: cannot read HEAD of $root (use --worktree outside git)" >&2
    exit 2
  }
  mkdir -p "$src"
  (cd "$fresh" && find . -type f) | while read -r f; do
    if ! cmp -s "$fresh/$f" "$src/$f"; then
      mkdir -p "$(dirname "$src/$f")"
      cp "$fresh/$f" "$src/$f"
    fi
  done
  (cd "$src" && find . -type f) | while read -r f; do [ -e "$fresh/$f" ] || rm -f "$src/$f"; done
  rm -rf "$fresh"
}

build_carry() {
  # --worktree builds in build-carry/, beside build/ and configured like it
  # but shared: every unit compiles with the same command as in build/, so
  # ccache serves them (CI checks the folder's size this way in a minute).
  local build=$root/build-carry carry=$root/build-device/carry src=$root t
  for tool in meson ninja nvcc strip sha256sum; do
    if ! command -v "$tool" > /dev/null; then
      echo "device-check: '$tool' is not on PATH (nvcc: /usr/local/cuda/bin); the build half needs it" >&2
      exit 2
    fi
  done
  t=$(now)
  if [ "$worktree" = 0 ]; then
    src=$root/build-device/src
    build=$root/build-device/build
    sync_head "$src"
  fi
  if [ ! -f "$build/build.ninja" ] || [ "$(cat "$build/.source" 2> /dev/null)" != "$src" ]; then
    rm -rf "$build"
    # Shared libraries: the binaries share one libgrad_device.so (the kernels'
    # fatbin, ~10 MB), one libgrad_kernels.so (~4 MB of loops) and one
    # libcudart, where static linking put a copy of each in every binary
    # (nine binaries of 12-18 MB: 120 MiB, over the device tool's 64).
    meson setup "$build" "$src" --wrap-mode=nodownload -Dcuda=enabled -Dgpu_arch="$arch" --buildtype=release \
      -Ddefault_library=shared -Dexamples=false -Dbenchmarks=enabled -Dtests=true > "$build-setup.log" 2>&1 || {
      tail -30 "$build-setup.log"
      echo "device-check: meson setup failed (log: $build-setup.log)" >&2
      exit 2
    }
    echo "$src" > "$build/.source"
  fi
  local targets=(bench/bench_device test/emit_cuda_check)
  for s in "${suites[@]}"; do targets+=("test/$s"); done
  # The NCCL checks, when meson found NCCL (grad_dist_nccl).
  for s in nccl_check nccl_program_check; do
    if grep -q "^build test/$s:" "$build/build.ninja"; then targets+=("test/$s"); fi
  done
  if ! ninja -C "$build" -j "${JOBS:-$(nproc)}" "${targets[@]}" > "$build.log" 2>&1; then
    grep -E 'error|FAILED' -A5 "$build.log" | head -40
    echo "device-check: the build failed (log: $build.log)" >&2
    exit 2
  fi
  rm -rf "$carry" && mkdir -p "$carry/bin" "$carry/lib"
  for t2 in "${targets[@]}"; do
    cp "$build/$t2" "$carry/bin/"
    strip --strip-unneeded "$carry/bin/$(basename "$t2")"
  done
  # Shared libraries beyond glibc (grad's own, cudart, libstdc++): carried,
  # found through LD_LIBRARY_PATH on the GPU machine. Asked of the binaries
  # where they were built: their run path ($ORIGIN/../kernels) finds grad's
  # libraries there, not beside the copies.
  for t2 in "${targets[@]}"; do ldd "$build/$t2"; done | awk '$3 ~ /^\// { print $3 }' | sort -u | while read -r lib; do
    case $(basename "$lib") in
      libc.so* | libm.so* | libdl.so* | librt.so* | libpthread.so* | ld-linux*) ;;
      libnccl.so*) ;; # 218 MB: the GPU machine's own is used (run_device, find_nccl)
      *) cp -L "$lib" "$carry/lib/" && strip --strip-unneeded "$carry/lib/$(basename "$lib")" ;;
    esac
  done
  {
    if [ "$worktree" = 0 ]; then
      echo "commit $(git -C "$root" rev-parse --short HEAD 2> /dev/null) (the committed tree)"
    else
      echo "commit $(git -C "$root" rev-parse --short HEAD 2> /dev/null || echo unknown), working tree$(git -C "$root" diff --quiet 2> /dev/null || echo ' with uncommitted changes')"
    fi
    echo "built $(date -u '+%Y-%m-%d %H:%M UTC') on $(uname -n), arch $arch, $(nvcc --version | tail -2 | head -1)"
  } > "$carry/BUILD_INFO"
  (cd "$carry" && find bin lib -type f | sort | xargs sha256sum > MANIFEST)
  local kib
  kib=$(du -sk "$carry" | cut -f1)
  echo "device-check: built in $(($(now) - t)) s; carried folder build-device/carry: $((kib / 1024)) MiB ($kib KiB) of ${limit_mib} MiB"
  (cd "$carry" && ls -l bin lib | awk 'NF > 5 { printf "  %10d  %s\n", $5, $NF }')
  if [ "$kib" -gt $((limit_mib * 1024)) ]; then
    echo "device-check: the carried folder is over ${limit_mib} MiB" >&2
    exit 2
  fi
  echo "device command (device tool's run): carry [\"build-device/carry\"], timeout_s 420, command:"
  echo "  scripts/device-check.sh --run build-device/carry"
}

worktree=0
args=()
for a in "$@"; do
  if [ "$a" = --worktree ]; then worktree=1; else args+=("$a"); fi
done
set -- "${args[@]}"

case "${1:-}" in
  --run)
    [ $# -ge 2 ] || {
      echo "usage: $0 --run CARRIED_FOLDER" >&2
      exit 2
    }
    run_device "$2"
    ;;
  --dry-run | --build-only)
    case ":$PATH:" in *:/usr/local/cuda/bin:*) ;; *) export PATH="$PATH:/usr/local/cuda/bin" ;; esac
    if [ "$1" = --build-only ]; then build_carry > /dev/null; else build_carry; fi
    ;;
  "")
    case ":$PATH:" in *:/usr/local/cuda/bin:*) ;; *) export PATH="$PATH:/usr/local/cuda/bin" ;; esac
    build_carry
    echo
    echo "device-check: running the device half here"
    run_device "$root/build-device/carry"
    ;;
  *)
    echo "usage: $0 [--dry-run | --build-only] [--worktree] | $0 --run CARRIED_FOLDER" >&2
    exit 2
    ;;
esac
