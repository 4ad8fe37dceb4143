#!/usr/bin/env bash
# Builds grad's device engine for one GPU architecture in a fresh build dir,
# runs the device parity, training and fusion suites (their CUDA cases run
# when a GPU answers, and skip cleanly when none does), bench_device (every
# mode: CPU tape, per-node, graph, fused) and the PyTorch peer
# (bench/peer_torch_ae.py: eager and CUDA graphs), then prints a short
# summary table last. Sized for < 8 minutes on a 16-core GPU box.
#
#   scripts/device-check.sh [BUILD_DIR]     default: build-device-check
#   env: GPU_ARCH (default sm_90), JOBS (default: all cores), REPS (bench repetitions, default 5)
set -u -o pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-device-check}
arch=${GPU_ARCH:-sm_90}
jobs=${JOBS:-$(nproc)}
reps=${REPS:-5}
case ":$PATH:" in *:/usr/local/cuda/bin:*) ;; *) export PATH="$PATH:/usr/local/cuda/bin" ;; esac

rows=()      # summary lines, printed last
failed=0
row() { rows+=("$(printf '%-28s %-36s %s' "$1" "$2" "$3")"); }
now() { date +%s; }

for tool in meson ninja nvcc; do
  if ! command -v "$tool" > /dev/null; then
    echo "device-check: '$tool' is not on PATH; install it (see TOOLCHAIN.md)" >&2
    exit 2
  fi
done

gpu="none"
if command -v nvidia-smi > /dev/null && nvidia-smi -L > /dev/null 2>&1; then
  gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
fi

rm -rf "$build"
logs="$build-logs"
rm -rf "$logs" && mkdir -p "$logs"
t0=$(now)
if meson setup "$build" "$root" -Dcuda=enabled -Dgpu_arch="$arch" --buildtype=release -Dexamples=false \
     -Dbenchmarks=enabled -Dtests=true > "$logs/setup.log" 2>&1 &&
   timeout 420 ninja -C "$build" -j "$jobs" test/test_device_parity test/test_device_training test/test_fusion bench/bench_device \
     > "$logs/build.log" 2>&1; then
  row "build ($arch, release)" "ok" "$(( $(now) - t0 )) s"
else
  row "build ($arch, release)" "FAILED (see $logs)" "$(( $(now) - t0 )) s"
  tail -30 "$logs/setup.log" "$logs/build.log"
  failed=1
fi

# doctest's last lines: "test cases: N | P passed | F failed | S skipped".
run_suite() {
  local name=$1 exe="$build/test/$1" t=$(now)
  if [ ! -x "$exe" ]; then row "$name" "NOT BUILT" "-"; failed=1; return; fi
  if timeout 180 "$exe" > "$logs/$name.log" 2>&1; then status="ok"; else status="FAILED"; failed=1; tail -40 "$logs/$name.log"; fi
  local counts
  counts=$(grep -E '^\[doctest\] test cases:' "$logs/$name.log" | sed -E 's/.*test cases: *//; s/ +/ /g')
  row "$name" "$status ($counts)" "$(( $(now) - t )) s"
}
run_suite test_device_parity
run_suite test_device_training
run_suite test_fusion

bench_rows=()
speedups=()
if [ -x "$build/bench/bench_device" ]; then
  t=$(now)
  if timeout 240 "$build/bench/bench_device" --benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true \
       > "$logs/bench_device.log" 2>&1; then
    row "bench_device" "ok (median of $reps)" "$(( $(now) - t )) s"
    # "<name>_median  <time> us  <cpu> us  <iterations> ..."
    while read -r name time unit _; do
      bench_rows+=("$(printf '  %-40s %10s %s' "${name%_median}" "$time" "$unit")")
    done < <(grep -E '_median ' "$logs/bench_device.log")
    median() { grep -E "^$1_median" "$logs/bench_device.log" | awk '{print $2}'; }
    tape=$(median 'BM_tape_step/200')
    for mode in per_node graph fused; do
      cuda=$(median "BM_ae_cuda_$mode")
      if [ -n "$tape" ] && [ -n "$cuda" ]; then
        speedups+=("$(awk -v a="$tape" -v b="$cuda" -v m="$mode" 'BEGIN { printf "  %-40s %10.2fx", "CUDA " m " vs CPU tape", a / b }')")
      fi
    done
  else
    row "bench_device" "FAILED" "$(( $(now) - t )) s"
    tail -20 "$logs/bench_device.log"
    failed=1
  fi
else
  row "bench_device" "NOT BUILT" "-"
  failed=1
fi

# The PyTorch peer: the same autoencoder step, eager and as a CUDA graph.
peer=${PYTHON:-python3}
command -v "$peer" > /dev/null || peer=/usr/bin/python3
t=$(now)
if timeout 150 "$peer" "$root/bench/peer_torch_ae.py" --reps "$reps" > "$logs/peer_torch_ae.log" 2>&1; then
  if grep -q skipped "$logs/peer_torch_ae.log"; then status="skipped $(grep -o '(.*)' "$logs/peer_torch_ae.log")"; else status="ok (median of $reps)"; fi
  row "peer_torch_ae" "$status" "$(( $(now) - t )) s"
  while read -r name time; do
    bench_rows+=("$(printf '  %-40s %10s us' "$name" "$time")")
    fused=$(grep -E '^BM_ae_cuda_fused_median' "$logs/bench_device.log" 2>/dev/null | awk '{print $2}')
    if [ -n "$fused" ]; then
      speedups+=("$(awk -v a="$time" -v b="$fused" -v m="$name" 'BEGIN { printf "  %-40s %10.2fx", "CUDA fused vs " m, a / b }')")
    fi
  done < <(grep -E '^torch_' "$logs/peer_torch_ae.log")
else
  row "peer_torch_ae" "FAILED" "$(( $(now) - t )) s"
  tail -20 "$logs/peer_torch_ae.log"
  failed=1
fi

echo
echo "== grad device-check: $(date -u '+%Y-%m-%d %H:%M UTC'), GPU: $gpu, arch $arch, total $(( $(now) - t0 )) s =="
printf '%-28s %-36s %s\n' "step" "result" "time"
for r in "${rows[@]}"; do echo "$r"; done
if [ ${#bench_rows[@]} -gt 0 ]; then
  echo "one training step (ae: autoencoder batch 200; mlp: 32-256-256-32 batch 256; Adam), median wall time:"
  for r in "${bench_rows[@]}"; do echo "$r"; done
fi
if [ ${#speedups[@]} -gt 0 ]; then
  echo "speed-ups (autoencoder step; targets: fused >= 18x, graph >= 5x the CPU tape, fused ahead of torch eager):"
  for r in "${speedups[@]}"; do echo "$r"; done
fi
[ "$gpu" = "none" ] && echo "note: no GPU answered; CUDA cases were skipped, the CUDA code was only compiled"
exit $failed
