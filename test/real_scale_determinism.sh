#!/bin/bash
# Issue 27's determinism, end to end: a small model of Qwen2.5-0.5B's kind
# (bench_real_scale write --small: grouped heads, tied embeddings, q/k/v
# biases, random weights), three LoRA + Adam steps with activation recompute
# and the fused loss, gives the same loss bits on every instruction set
# (GRAD_ISA baseline, avx2, avx512, each capped at what this CPU has) and on
# 1, 2 and 3 threads; for a frozen base held as f32, bf16 and f16 (each
# against itself: rounding the base to 16 bits changes the model). The later
# steps' losses follow the earlier steps' gradients through Adam, so equal
# losses mean equal updates too. Then the same for generation: a 64-token
# prompt through the KV-cache decoder's prefill, 8 greedy tokens, and a hash
# of every logits vector's bits (bench_real_scale generate --digest). At this
# size the prefill's products are split over the threads; the decoding
# steps' are below the size that wakes the pool. Then once more, f32 base
# only, for a shape whose every size is off the vector widths (hidden 72,
# 3 query heads of width 24 on one key/value head, MLP 200, vocabulary 997;
# sequence 61, prompt 37): the products' and attention's tail paths.
#
#   test/real_scale_determinism.sh BENCH_REAL_SCALE
set -eu
bench=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
# check KIND WORDS: $got (this run's output) has WORDS words and equals the
# first run's of its kind for this base.
check() {
  local first
  if [ "$(echo "$got" | wc -w)" != "$2" ]; then
    echo "FAILED: $1, base $base, GRAD_ISA=$isa, $threads threads: expected $2 words, got '$got'"
    differ=1
    return
  fi
  first=${want[$1]:-}
  if [ -z "$first" ]; then
    want[$1]=$got
    echo "$1, base $base: $got(GRAD_ISA=$isa, $threads thread(s))"
  elif [ "$got" != "$first" ]; then
    echo "DIFFER: $1, base $base, GRAD_ISA=$isa, $threads threads: $got"
    differ=1
  fi
}
# model SHAPE-OPTIONS SEQ PROMPT BASES: writes the model, then every base,
# instruction set and thread count against the first run.
model() {
  local shape=$1 seq=$2 prompt=$3 bases=$4
  # shellcheck disable=SC2086
  "$bench" write --out "$dir" --small $shape > /dev/null
  for base in $bases; do
    declare -A want=()
    differ=0
    for isa in baseline avx2 avx512; do
      for threads in 1 2 3; do
        got=$(GRAD_ISA=$isa "$bench" finetune --model "$dir" --threads $threads --reps 2 --seq "$seq" --recompute \
                --base $base 2>&1 | grep '^loss ' | tr '\n' ' ' || true)
        check "finetune" 9
        got=$(GRAD_ISA=$isa "$bench" generate --model "$dir" --threads $threads --reps 1 --prompt "$prompt" --new 8 \
                --base $base --digest 2>&1 | grep -E '^(tokens|logits digest) ' | tr '\n' ' ' || true)
        check "generate" 12
      done
    done
    if [ $differ = 1 ]; then
      fail=1
    else
      echo "${shape:---small}, base $base: the same bits on every instruction set and 1, 2 and 3 threads (finetune and generate)"
    fi
  done
}
fail=0
model "" 64 64 "native bf16 f16"
model "--hidden 72 --heads 3 --kv-heads 1 --head-width 24 --ffn 200 --vocab 997" 61 37 native
exit $fail
