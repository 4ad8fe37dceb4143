#!/bin/bash
# Issue 27's real-scale workloads, grad against PyTorch eager and llama.cpp:
#   L1: LoRA finetune (rank 16 on q,k,v,o,gate,up,down; batch 1, sequence 512, f32, Adam), tokens/s
#       (grad as a user gets it: activation recompute on as few layers as fit the machine's memory,
#       none where the step fits; --recompute: every layer computed again in backward, nn::Lm::set_recompute)
#   L2: prefill a 512-token prompt, then 128 greedy tokens with the KV cache (f32), tokens/s of each phase
# on a Qwen2.5-0.5B-sized model (hidden 896, 24 layers, 14/2 heads of width 64,
# MLP 4864, vocabulary 151,936, tied embeddings, q/k/v biases) with random
# weights, written once by bench_real_scale into SCRATCH/model as a Hugging
# Face directory (config.json + model.safetensors) and an F32 GGUF.
#
#   bench/real_scale.sh [--small] [--recompute] [--shape "WRITE-OPTIONS"] [--seq N] [--prompt N] [--new N] [--rounds R] [--reps N]
#                       [--l1-threads "1 2"] [--l2-threads "1 2"] [--build DIR] SCRATCH
#
# --small: a tiny model of the same kind (hidden 128, 2 layers, vocabulary
# 2000; sequence and prompt 64, 16 new tokens), under a minute: for checking
# the script. --shape: other sizes, as bench_real_scale write's options
# (e.g. "--hidden 1536 --layers 28 --heads 12 --ffn 8960": Qwen2.5-1.5B's
# shape; each option replaces the preset's), in a model directory of their
# own. --seq (L1's tokens per step), --prompt and --new (L2's) replace the
# preset's 512 / 512 / 128 (64 / 64 / 16 at --small). llama.cpp's qwen2
# loader needs heads x head width = hidden (896 at the presets), so for a
# shape without it (--small's) its row is left out.
#
# Every configuration is one process per round (peak RSS from /usr/bin/time -v,
# the largest over its rounds), rounds interleaved (round 1 of every
# configuration, then round 2, ...); each process loads the model, takes one
# untimed warm-up, then N timed repetitions. The table's figure is the median
# over all rounds' repetitions. PyTorch runs with OMP_WAIT_POLICY=passive: on
# this shared 2-core machine its OpenMP workers otherwise spin for the
# core the other worker needs (grad's pool spins about half a millisecond, then sleeps).
# Run from the repository root; needs the build directory configured
# (meson setup), python3 with torch, node 20 and npm.
set -eu
small=0 recompute=() rounds=5 reps=1 build=build l1_threads="1 2" l2_threads="1 2" shape="" seq="" prompt="" new=""
while [ $# -gt 1 ]; do
  case $1 in
    --small) small=1; shift ;;
    --recompute) recompute=(--recompute); shift ;;
    --shape) shape=$2; shift 2 ;;
    --seq) seq=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --new) new=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --l1-threads) l1_threads=$2; shift 2 ;;
    --l2-threads) l2_threads=$2; shift 2 ;;
    *) echo "real_scale.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[ $# -eq 1 ] || { echo "usage: bench/real_scale.sh [--small] [--recompute] [--shape OPTIONS] [--seq N] [--prompt N] [--new N] [--rounds R] [--reps N] [--l1-threads LIST] [--l2-threads LIST] [--build DIR] SCRATCH" >&2; exit 2; }
scratch=$1
src=$(cd "$(dirname "$0")" && pwd)
if [ $small = 1 ]; then size=small preset="64 64 16"; else size=full preset="512 512 128"; fi
set -- $preset
seq=${seq:-$1} prompt=${prompt:-$2} new=${new:-$3}
# A shape of its own gets a directory named after its options.
[ -z "$shape" ] || size=$size$(printf '%s' "$shape" | tr -c 'a-z0-9' '_' | tr -s '_')
model=$scratch/model-$size logs=$scratch/logs-$size
mkdir -p "$model" "$logs"
rm -f "$logs"/*.out "$logs"/*.time "$logs"/*.json  # a previous run's rounds (corespeed appends)

echo "== building bench_real_scale, membw and corespeed in $build (one job)"
ninja -C "$build" -j1 bench/bench_real_scale bench/membw bench/corespeed >/dev/null
bench=$build/bench/bench_real_scale

node_dir=$build/bench/llama_node version=3.21.1
installed=$(cd "$node_dir" 2>/dev/null &&
  node -p "JSON.parse(require('fs').readFileSync('node_modules/node-llama-cpp/package.json', 'utf8')).version" 2>/dev/null || true)
if [ "$installed" != "$version" ]; then
  echo "== installing node-llama-cpp $version (prebuilt CPU binary) into $node_dir"
  mkdir -p "$node_dir"
  [ -f "$node_dir/package.json" ] || echo '{"private": true}' > "$node_dir/package.json"
  (cd "$node_dir" && npm install --no-audit --no-fund --ignore-scripts --omit=optional --save-exact \
      "node-llama-cpp@$version" "@node-llama-cpp/linux-x64@$version") > "$node_dir/npm-install.log" 2>&1
fi
cp "$src/peer_llama_real_scale.mjs" "$node_dir/"

if [ ! -f "$model/model.gguf" ]; then
  echo "== writing the $size checkpoint into $model"
  # shellcheck disable=SC2086
  $bench write --out "$model" $([ $small = 1 ] && echo --small) $shape
fi
config() { /usr/bin/python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$model/config.json" "$1"; }
vocab=$(config vocab_size)
llama=1
if [ $(($(config num_attention_heads) * $(config head_dim))) != "$(config hidden_size)" ]; then
  llama=0
  echo "== heads x head width != hidden: llama.cpp's qwen2 loader cannot read this shape, its row is left out"
fi

echo "== memory bandwidth"
for t in 1 2; do "$build/bench/membw" $t 512 > "$logs/membw-$t.out"; cat "$logs/membw-$t.out"; done

# One configuration's process: NAME, then the command (run under /usr/bin/time -v).
run() {
  local name=$1; shift
  echo "   $name (round $r)"
  if ! /usr/bin/time -v -o "$logs/$name.r$r.time" "$@" > "$logs/$name.r$r.out" 2>&1; then
    echo "real_scale.sh: $name failed (round $r): see $logs/$name.r$r.out" >&2
    tail -5 "$logs/$name.r$r.out" >&2
    exit 1
  fi
}
# Every core's arithmetic speed just before and just after a grad L1 run
# (bench/corespeed.cpp): the table's scaling lines say which rounds had a
# core slowed by the host meanwhile.
corespeed() { "$build/bench/corespeed" 300 >> "$logs/corespeed-$1.r$r.out"; }
torch=(env OMP_WAIT_POLICY=passive /usr/bin/python3 -B "$src/peer_torch_real_scale.py")
for r in $(seq 1 "$rounds"); do
  echo "== round $r of $rounds ($(uptime | sed 's/.*load/load/'))"
  for t in $l1_threads; do
    profile=()
    [ "$r" = "$rounds" ] && [ "$t" = 1 ] && profile=(--profile "$logs/L1-grad-profile.json")
    corespeed L1-grad-t$t
    run L1-grad-t$t $bench finetune --model "$model" --threads $t --reps $reps --seq $seq "${recompute[@]}" "${profile[@]}" \
      --benchmark_out="$logs/L1-grad-t$t.r$r.json" --benchmark_out_format=json
    corespeed L1-grad-t$t
    run L1-torch-t$t "${torch[@]}" finetune --model "$model" --threads $t --reps $reps --seq $seq
  done
  for t in $l2_threads; do
    run L2-grad-t$t $bench generate --model "$model" --threads $t --reps $reps --prompt $prompt --new $new \
      --benchmark_out="$logs/L2-grad-t$t.r$r.json" --benchmark_out_format=json
    run L2-torch-t$t "${torch[@]}" generate --model "$model" --threads $t --reps $reps --prompt $prompt --new $new
    [ $llama = 0 ] || run L2-llama.cpp-t$t node "$node_dir/peer_llama_real_scale.mjs" --model "$model/model.gguf" \
      --vocab "$vocab" --threads $t --reps $reps --prompt $prompt --new $new
  done
done
echo "== done ($(uptime | sed 's/.*load/load/'))"
/usr/bin/python3 -B "$src/real_scale_table.py" "$logs" "$model" "$seq" "$prompt" "$new"
