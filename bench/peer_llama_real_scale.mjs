// llama.cpp peer of bench_real_scale's L2 (issue 27): the same model as an
// F32 GGUF (bench_real_scale write), through node-llama-cpp's prebuilt CPU
// binary (bench/real_scale.sh installs it as test/llama_cpp/run.sh does).
//
//   node peer_llama_real_scale.mjs --model M.gguf --vocab V --threads N --reps R [--prompt 512] [--new 128]
//
// Prefill: the prompt in one batch (llama.cpp's own batching, its default
// batch size), up to the first greedy token; decode: the remaining new - 1
// tokens one at a time through the KV cache (F32, as grad's). One short
// warm-up run (16 prompt tokens, 4 new), then R timed ones, each on a cleared context. The prompt is
// bench_real_scale's token_at formula. Prints "tokens ..." and one line
// "result {json}" that bench/real_scale.sh reads.
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

const o = { threads: 1, reps: 5, prompt: 512, new: 128, vocab: 0 };
const argv = process.argv.slice(2);
for (let i = 0; i < argv.length; i += 2) {
  const key = argv[i].replace(/^--/, ""), value = argv[i + 1];
  if (!(key in o) && key !== "model") {
    console.error(`peer_llama_real_scale.mjs: unknown argument '${argv[i]}'`);
    process.exit(2);
  }
  o[key] = key === "model" ? value : Number(value);
}
if (!o.model || !(o.vocab > 0)) {
  console.error("peer_llama_real_scale.mjs: --model and --vocab (config.json's vocab_size) are required");
  process.exit(2);
}

const llama = await getLlama({ gpu: false, build: "never", usePrebuiltBinaries: true, progressLogs: false,
                               logLevel: LlamaLogLevel.error });
const model = await llama.loadModel({ modelPath: o.model, gpuLayers: 0, useMmap: true });
const context = await model.createContext({
  contextSize: o.prompt + o.new, sequences: 1, flashAttention: false, threads: o.threads,
  batchSize: o.prompt, experimentalKvCacheKeyType: "F32", experimentalKvCacheValueType: "F32",
});
const sequence = context.getSequence();
const greedy = { temperature: 0 };

function tokenAt(i, v) { return (i * 7919 + 13) % v; }

async function run(prompt, count) {
  await sequence.clearHistory();
  const t0 = performance.now();
  let input = prompt.map((t, i) => i + 1 < prompt.length ? t : [t, { generateNext: { token: true, options: greedy } }]);
  const tokens = [];
  let t1 = 0;
  for (let n = 0; n < count; n++) {
    const results = await sequence.controlledEvaluate(input);
    const next = results[results.length - 1]?.next;
    if (next?.token == null) throw new Error(`no token at step ${n}`);
    tokens.push(next.token);
    if (n === 0) t1 = performance.now();
    input = [[next.token, { generateNext: { token: true, options: greedy } }]];
  }
  const t2 = performance.now();
  return { prefill: prompt.length / ((t1 - t0) / 1000), decode: (count - 1) / ((t2 - t1) / 1000), tokens };
}

const v = o.vocab;
const prompt = Array.from({ length: o.prompt }, (_, i) => tokenAt(i, v));
await run(prompt.slice(0, 16), 4);  // warm-up: a short run, as bench_real_scale's
const result = { prefill_tok_s: [], decode_tok_s: [], threads: o.threads, vocab: v };
let last;
for (let r = 0; r < o.reps; r++) {
  last = await run(prompt, o.new);
  result.prefill_tok_s.push(last.prefill);
  result.decode_tok_s.push(last.decode);
}
result.tokens = last.tokens;
console.log(`tokens ${last.tokens.join(" ")}`);
console.log(`result ${JSON.stringify(result)}`);
await context.dispose();
await model.dispose();
