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

# hf_edit DIR KIND: a copy of tinyhf as DIR, edited: pad (8 embedding rows
# past the tokenizer's 256, which the head makes the likeliest: +-10 times
# the head's row for "a", every other real row zero), nfc (tokenizer.json
# declares an NFC normalizer), split (its pre-tokenizer a Split on [a-z]+),
# theta (config.json's rope_theta 1e39).
hf_edit() {
  rm -rf "$1" && cp -r tinyhf "$1" && python3 - "$1" "$2" <<'PY'
import json, struct, sys
d, kind = sys.argv[1], sys.argv[2]
def rewrite(path, f):
    with open(path) as fh: j = json.load(fh)
    f(j)
    with open(path, "w") as fh: json.dump(j, fh)
if kind == "pad":
    raw = open(d + "/model.safetensors", "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n]); meta = header.pop("__metadata__", None)
    data = raw[8 + n:]
    tensors = {k: (v, bytearray(data[v["data_offsets"][0]:v["data_offsets"][1]])) for k, v in header.items()}
    assert all(v["dtype"] == "F32" for v, _ in tensors.values())
    def rows(name):
        info, b = tensors[name]
        width = info["shape"][1]
        return info, [list(struct.unpack("<%df" % width, b[i:i + 4 * width])) for i in range(0, len(b), 4 * width)]
    info, head = rows("lm_head.weight")
    a = head[ord("a")]
    head = [r if i == ord("a") else [0.0] * len(r) for i, r in enumerate(head)]
    head += [[s * 10 * x for x in a] for s in (1, -1)] * 4
    _, embed = rows("model.embed_tokens.weight")
    embed += [[0.0] * len(embed[0])] * 8
    for name, m in (("lm_head.weight", head), ("model.embed_tokens.weight", embed)):
        tensors[name][0]["shape"] = [len(m), len(m[0])]
        tensors[name] = (tensors[name][0], bytearray(b"".join(struct.pack("<%df" % len(r), *r) for r in m)))
    out, at = {}, 0
    for k, (v, b) in tensors.items():
        out[k] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [at, at + len(b)]}
        at += len(b)
    if meta is not None: out["__metadata__"] = meta
    h = json.dumps(out).encode(); h += b" " * (-len(h) % 8)
    with open(d + "/model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(h)) + h + b"".join(b for _, b in tensors.values()))
    rewrite(d + "/config.json", lambda j: j.update(vocab_size=264))
elif kind == "nfc":
    rewrite(d + "/tokenizer.json", lambda j: j.update(normalizer={"type": "NFC"}))
elif kind == "split":
    rewrite(d + "/tokenizer.json", lambda j: j.update(pre_tokenizer={"type": "Split", "pattern": {"Regex": "[a-z]+"},
                                                                      "behavior": "Isolated", "invert": False}))
elif kind == "theta":
    rewrite(d + "/config.json", lambda j: j.update(rope_theta=1e39))
PY
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
  expect 0 "(GGUF, qwen2, F16, 256 tokens, pre-tokenizer gpt-2)" export --in merged --gguf merged.gguf --f16
  expect 0 "(GGUF, qwen2, Q4_K_M, 256 tokens" export --in merged --gguf merged_q.gguf --type q4_k_m
  # A quantized GGUF finetuned as it is (its q8_0 blocks kept), the adapters out as llama.cpp's adapter file.
  expect 0 "saved q.model" train --steps 2 --seq 8 --batch 1 --d 32 --layers 1 --heads 2 --kv-heads 1 --ffn 64 \
    --max-seq 64 --out q.model --csv '' --svg '' --seed 3
  expect 0 "(GGUF, qwen2, Q8_0, 256 tokens" export --in q.model --gguf q8.gguf --type q8_0
  expect 0 "the frozen base held as q8_0, as the file holds it" finetune --from q8.gguf --text note.txt \
    --out q8_lora.gguf --csv '' --svg ''
  expect 0 "reproduces the rest" finetune --from q8.gguf --text note.txt --out q8_lora.gguf --csv '' --svg ''
  expect 0 "peak memory:" finetune --from q8.gguf --text note.txt --out q8_lora.gguf --csv '' --svg ''
  [ -s q8_lora.gguf ] || { echo "FAIL: finetune --from q8.gguf wrote no adapter file"; fail=1; }
  expect 2 "not a directory, nor a file named *.gguf" finetune --from note.txt --text note.txt --out x.gguf
  expect 2 "'q5_1' is not a GGUF file type" export --in merged --gguf x.gguf --type q5_1
  expect 2 "--f16, --type q8_0: two GGUF file types" export --in merged --gguf x.gguf --f16 --type q8_0
  expect 2 "--type: it is the GGUF file's type; name one with --gguf" export --in merged --hf y --type q8_0
  expect 1 "fold them in first (tinylm merge), or write them as llama.cpp's adapter file (--lora-gguf)" \
    export --in small_lora.model --gguf x.gguf
  expect 0 "(llama.cpp's LoRA adapter GGUF, F32, alpha" \
    export --in small_lora.model --lora-gguf small_lora.gguf --gguf small_base.gguf
  [ -s small_lora.gguf ] && [ -s small_base.gguf ] || { echo "FAIL: export --lora-gguf wrote no files"; fail=1; }
  expect 1 "--lora-gguf: 'small.model' has no adapters" export --in small.model --lora-gguf x.gguf
  expect 2 "--gguf, --hf, --lora-gguf: nothing to write" export --in merged
  expect 2 "--base" finetune --from tinyhf --base small.model
  expect 0 "pre-tokenizer gpt-2" export --in tinyhf --gguf tiny.gguf  # its tokenizer.json: GPT-2's ByteLevel
  if command -v python3 >/dev/null; then
    # Hugging Face directories edited from tinyhf (hf_edit below): padded
    # embedding rows that the head prefers, a decomposed normalizer input,
    # a pre-tokenizer llama.cpp has no name for, a rope_theta float32 cannot hold.
    hf_edit padded pad
    expect 0 "tokens/s" generate --from padded --prompt hi --count 8  # a padding id never comes out
    hf_edit nfc nfc
    # "cafe" + U+0301 is composed to "caf" + U+00e9 as Hugging Face's NFC does: 5 byte tokens, not 6.
    expect 0 "[5 tokens in" generate --from nfc --prompt "$(printf 'cafe\xcc\x81')" --count 0
    expect 0 "[5 tokens in" generate --from nfc --prompt "$(printf 'caf\xc3\xa9')" --count 0
    hf_edit split split
    expect 1 "pre-tokenizer [Split(Regex \"[a-z]+\", Isolated)] is none that GGUF names" \
      export --in split --gguf split.gguf
    [ -e split.gguf ] && { echo "FAIL: a refused export left split.gguf"; fail=1; }
    hf_edit theta theta
    expect 1 "rope_base (config.json's rope_theta) 1e+39 is beyond float32's range" export --in theta --gguf theta.gguf
    [ -e theta.gguf ] && { echo "FAIL: a refused export left theta.gguf"; fail=1; }
  else
    echo "skipped: the edited Hugging Face directories (no python3)"
  fi
fi
# A write that fails after the work is reported, with a non-zero status.
expect 1 "cannot write /dev/full" train "${tiny[@]}" --out tiny2.model --csv /dev/full --svg ''
exit $fail
