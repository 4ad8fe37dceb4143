#!/bin/bash
# tinylm's command line refuses what it cannot do, before any work: each
# case gives the arguments, the exit status expected and text the message
# must contain (the flag and what it accepts). Then one tiny training run
# and a generation from its model; with grad_hf, the Hugging Face round trip
# (export --hf, finetune/merge/generate --from, export --gguf); a CSV that
# cannot be written fails it.
#
#   tinylm_args.sh PATH/TO/tinylm
set -u
tinylm=$(realpath "$1")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
mkdir adir
: >empty.txt
truncate -s 65M big.txt
printf 'hello tinylm\n' >prompt.txt
fail=0

# expect STATUS TEXT ARGS...: tinylm ARGS exits STATUS and its output contains TEXT.
expect() {
  local want=$1 text=$2
  shift 2
  local out status
  out=$(timeout 60 "$tinylm" "$@" 2>&1)
  status=$?
  if [ $status -ne "$want" ] || ! grep -qF -- "$text" <<<"$out"; then
    echo "FAIL: tinylm $* exited $status (expected $want); output (expected to contain '$text'):"
    sed 's/^/    /' <<<"$out" | head -20
    fail=1
  else
    echo "ok: tinylm $*  ->  $status: $(grep -F -- "$text" <<<"$out" | head -1)"
  fi
}

expect 2 "commands: train, finetune, merge, generate, all, bench"
expect 0 "train" --help
expect 2 "commands: train, finetune" --stepz 1
expect 0 "--max-seq" train --help
expect 2 "--steps: '0' is not a whole number in [1, 10000000]" train --steps 0
expect 2 "--steps: 'abc' is not a whole number in [1, 10000000]" train --steps abc
expect 2 "--steps: '99999999999999999999999' is not a whole number" train --steps 99999999999999999999999
expect 2 "--lr: 'x' is not a number in" train --lr x
expect 2 "--stepz" train --stepz 1
expect 2 "valid options: --help, " train --stepz 1
expect 2 ", --text, --out, --csv, --svg, --steps, " train --stepz 1
expect 2 "--seq: '0' is not a whole number in [1, 1024]" train --seq 0
expect 2 "--d: '100000000000' is not a whole number in [2, 1024]" train --d 100000000000
expect 2 "--batch: '100000' is not a whole number in [1, 64]" train --batch 100000
expect 2 "--max-seq: '1' is not a whole number in [2, 1024]" train --max-seq 1
expect 2 "--seq 300: more than --max-seq 256" train --seq 300
expect 2 "--batch x --seq is 16384; at most 8192" train --batch 64 --seq 256
expect 2 "--d, --heads, --kv-heads" train --heads 3
expect 2 "'/dev/zero' is not a regular file" train --text /dev/zero
expect 2 "'adir' is a directory, not a file" train --text adir
expect 2 "'big.txt' has 68157440 bytes; the limit is 67108864" train --text big.txt
expect 1 "'empty.txt' is empty" train --text empty.txt
expect 2 "--csv: cannot write 'nodir/x.csv': no directory 'nodir'" train --csv nodir/x.csv
expect 2 "--svg: cannot write 'nodir/x.svg': no directory 'nodir'" train --svg nodir/x.svg
expect 2 "--out: cannot write 'nodir/m.model': no directory 'nodir'" train --out nodir/m.model
expect 2 "--out: 'adir' is a directory" merge --out adir
expect 2 "--out: a path is needed" train --out ''
expect 2 "--csv: cannot write 'nodir/f.csv'" finetune --csv nodir/f.csv
expect 2 "unknown projection 'zz'" finetune --targets q,zz
expect 2 "--rank: '0' is not a whole number in [1, 256]" finetune --rank 0
expect 2 "'/dev/zero' is not a regular file" generate --prompt-file /dev/zero
expect 2 "excludes" generate --prompt hi --prompt-file prompt.txt
expect 2 "--prompt: empty prompt" generate --prompt ''
expect 2 "--temperature: '-1' is not a number in [0, 100]" generate --temperature -1
expect 2 "--threads: '0' is not a whole number in [1, 256]" bench --threads 0
expect 2 "--seq: '257' is not a whole number in [1, 256]" bench --seq 257

# A tiny model end to end: the outputs are written, a generation reads the model.
tiny=(--steps 2 --seq 8 --batch 1 --d 8 --layers 1 --heads 2 --kv-heads 1 --ffn 8 --max-seq 16)
expect 0 "saved tiny.model" train "${tiny[@]}" --out tiny.model --csv tiny.csv --svg tiny.svg
[ -s tiny.csv ] && [ -s tiny.svg ] || { echo "FAIL: train did not write tiny.csv and tiny.svg"; fail=1; }
expect 0 "tokens/s" generate --model tiny.model --prompt hi --count 5
# The Hugging Face round trip (when tinylm has grad_hf): the tiny model as a
# Hugging Face directory, LoRA from it until it recalls a text (PEFT
# adapters), merged into a directory, generated from, exported as GGUF.
if "$tinylm" export --in tiny.model 2>&1 | grep -qF "built without grad_hf"; then
  echo "skipped: the Hugging Face round trip (tinylm built without grad_hf)"
  expect 2 "built without grad_hf" generate --from adir
else
  printf 'grad and llama.cpp: the round trip.' >note.txt
  expect 0 "saved small.model" train --steps 2 --seq 8 --batch 1 --d 16 --layers 1 --heads 2 --kv-heads 1 --ffn 16 \
    --max-seq 64 --out small.model --csv '' --svg ''
  expect 1 "saved small_lora.model" finetune --base small.model --text note.txt --out small_lora.model --steps 1 \
    --csv '' --svg ''
  expect 0 "byte-level tokenizer.json" export --in small.model --hf tinyhf
  expect 0 "reproduces the rest" finetune --from tinyhf --text note.txt --out adapter --csv '' --svg '' --lr 0.05
  [ -s adapter/adapter_config.json ] && [ -s adapter/adapter_model.safetensors ] ||
    { echo "FAIL: finetune --from did not write PEFT's adapter files"; fail=1; }
  expect 0 "the tokenizer files copied" merge --from tinyhf --in adapter --out merged
  expect 0 "reproduced exactly" generate --from merged --prompt-file note.txt
  expect 0 "(GGUF, qwen2, F16, 256 tokens)" export --in merged --gguf merged.gguf --f16
  expect 1 "fold them in first" export --in small_lora.model --gguf x.gguf
  expect 2 "--gguf, --hf: nothing to write" export --in merged
  expect 2 "--base" finetune --from tinyhf --base small.model
fi
# A write that fails after the work is reported, with a non-zero status.
expect 1 "cannot write /dev/full" train "${tiny[@]}" --out tiny2.model --csv /dev/full --svg ''
exit $fail
