// Greedy decoding of a GGUF model by llama.cpp (node-llama-cpp's prebuilt
// CPU binary), from token ids to token ids: the other side of grad's GGUF
// round trip (test/llama_cpp/run.sh).
//
//   node decode.mjs --model M.gguf --prompt 72,101,108 --count 16 [--kv f32|f16] [--logits] [--tokenize TEXT]
//                   [--lora ADAPTER.gguf [--lora-scale S]] [--every-position]
//   node decode.mjs --probe      (loads llama.cpp only: exit 0 when it runs here)
//
// Prints a line per result, its name then its values: "tokens" (the count
// greedy ids), "logprobs" (the first step's log-probability of every id, in
// id order, when --logits), "tokenized" (llama.cpp's ids for TEXT, when
// --tokenize), "logprobs_at" (with --every-position: a line per prompt
// position, its index then the log-probability of every id after it: the
// prompt's teacher-forced distributions). --lora: a LoRA adapter GGUF
// applied to the model (llama.cpp's --lora; its scale S, default 1,
// multiplies the file's alpha / r). Exit 3 when the binary cannot run here
// (run.sh turns that into a skip), 1 on any other failure.
//
// No GPU is probed (gpu: false), nothing is built or downloaded (build:
// "never"). One thread: the models are tiny, and llama.cpp's threads wait
// for each other spinning, which on a loaded machine costs minutes. The KV cache is F32 by default: llama.cpp's own default (F16)
// rounds keys and values, which is not what grad computes.
import { getLlama, LlamaLogLevel } from "node-llama-cpp";

function parse(argv) {
  const o = { kv: "f32", logits: false, count: 0 };
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i], next = () => {
      if (i + 1 >= argv.length) throw new Error(`${a} needs a value`);
      return argv[++i];
    };
    if (a === "--model") o.model = next();
    else if (a === "--prompt") o.prompt = next().split(",").map(s => {
      if (!/^\d+$/.test(s)) throw new Error(`--prompt: '${s}' is not a token id`);
      return Number(s);
    });
    else if (a === "--count") o.count = Number(next());
    else if (a === "--kv") o.kv = next();
    else if (a === "--logits") o.logits = true;
    else if (a === "--tokenize") o.tokenize = next();
    else if (a === "--every-position") o.everyPosition = true;
    else if (a === "--lora") o.lora = next();
    else if (a === "--lora-scale") o.loraScale = Number(next());
    else if (a === "--probe") o.probe = true;
    else throw new Error(`unknown argument '${a}'`);
  }
  if (o.probe) return o;
  if (!o.model || !o.prompt || o.prompt.length === 0) throw new Error("--model and --prompt are required");
  if (!Number.isInteger(o.count) || o.count < 0) throw new Error("--count: expected a whole number");
  if (o.kv !== "f32" && o.kv !== "f16") throw new Error("--kv: expected f32 or f16");
  if (o.everyPosition && o.count < 1) throw new Error("--every-position: needs --count 1 or more");
  if (o.loraScale !== undefined && (!o.lora || !Number.isFinite(o.loraScale)))
    throw new Error("--lora-scale: expected a number, with --lora");
  return o;
}

let o;
try {
  o = parse(process.argv.slice(2));
} catch (e) {
  console.error(`decode.mjs: ${e.message}`);
  process.exit(2);
}

let llama;
try {
  llama = await getLlama({ gpu: false, build: "never", usePrebuiltBinaries: true, progressLogs: false,
                           logLevel: LlamaLogLevel.error });
} catch (e) {
  console.error(`decode.mjs: llama.cpp's binary cannot run here: ${e.message}`);
  process.exit(3);
}

if (o.probe) process.exit(0);

try {
  const model = await llama.loadModel({ modelPath: o.model, gpuLayers: 0 });
  const kvType = o.kv === "f32" ? "F32" : "F16";
  const context = await model.createContext({
    contextSize: o.prompt.length + o.count + 1, sequences: 1, flashAttention: false, threads: 1,
    experimentalKvCacheKeyType: kvType, experimentalKvCacheValueType: kvType,
    ...(o.lora ? { lora: { adapters: [{ filePath: o.lora, scale: o.loraScale ?? 1 }] } } : {}),
  });
  const sequence = context.getSequence();
  const greedy = { temperature: 0 };
  const out = {};  // printed as lines "name v1 v2 ..."
  const tokens = [];
  // The prompt in one batch, the next token sampled after its last
  // position; then one token at a time through the KV cache.
  // With --every-position each prompt position's distribution too (no token drawn there).
  let input = o.prompt.map((t, i) =>
    i + 1 === o.prompt.length ? [t, { generateNext: { token: true, probabilities: o.logits || o.everyPosition,
                                                       options: greedy } }]
    : o.everyPosition ? [t, { generateNext: { probabilities: true, options: greedy } }]
    : t);
  const logprobs = p => Array.from({ length: p.size }, (_, id) => {
    if (!p.has(id)) throw new Error(`no probability for token ${id}`);
    return Math.log(p.get(id));
  });
  const at = [];
  for (let n = 0; n < o.count; n++) {
    const results = await sequence.controlledEvaluate(input);
    const next = results[results.length - 1]?.next;
    if (next?.token == null) throw new Error(`no token at step ${n}`);
    // The probabilities of every id (softmax of the raw logits: greedy changes none).
    if (n === 0 && o.logits) out.logprobs = logprobs(next.probabilities);
    if (n === 0 && o.everyPosition)
      for (let i = 0; i < o.prompt.length; i++) {
        const p = results[i]?.next?.probabilities;
        if (p == null) throw new Error(`no probabilities at prompt position ${i}`);
        at.push([i, ...logprobs(p)]);
      }
    tokens.push(next.token);
    input = [[next.token, { generateNext: { token: true, options: greedy } }]];
  }
  out.tokens = tokens;
  if (o.tokenize !== undefined) out.tokenized = Array.from(model.tokenize(o.tokenize, false));
  for (const [name, values] of Object.entries(out)) console.log(`${name} ${values.join(" ")}`);
  for (const values of at) console.log(`logprobs_at ${values.join(" ")}`);
  await context.dispose();
  await model.dispose();
} catch (e) {
  console.error(`decode.mjs: ${o.model}: ${e.message}`);
  process.exit(1);
}
