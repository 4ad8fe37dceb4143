// The real-scale workloads of issue 27 on grad's side: a Qwen2.5-0.5B-sized
// model (or a tiny one of the same kind) with random weights, read from a
// Hugging Face directory through grad::hf.
//
//   bench_real_scale write    --out DIR [--small] [--hidden N --layers N --heads N --kv-heads N --head-width N
//                             --ffn N --vocab N]               config.json, model.safetensors, model.gguf (F32)
//   bench_real_scale finetune --model DIR --threads N --reps R [--recompute | --memory-budget GIB] [--base bf16|f16]
//                                                               L1: LoRA rank 16 on every projection, Adam
//                                                               (--recompute: every layer, nn::Lm::set_recompute;
//                                                               --memory-budget: as few as fit; by default as few
//                                                               as fit the machine's available memory)
//   bench_real_scale generate --model DIR --threads N --reps R [--base bf16|f16]
//                                                               L2: prefill 512 tokens, 128 greedy tokens
// (--base bf16 / f16: the frozen base held as bfloat16 / half, nn::Lm's
// base_storage; the F32 checkpoint's values rounded to it as they load.)
//
// bench/real_scale.sh runs these beside PyTorch (bench/peer_torch_real_scale.py)
// and llama.cpp (bench/peer_llama_real_scale.mjs) and prints the table. The
// token ids are the same formula in all three (token_at), so every
// implementation sees the same prompt and targets. Each repetition is one
// Google Benchmark iteration (one Adam step; one prefill and decode),
// after one untimed warm-up (a step, which sizes the tape's arenas; a short
// generation of 16 prompt and 4 new tokens, which touches every weight).
// Besides the figures, each program prints lines the driver checks:
// "loss STEP HEX" (every step's loss, hexadecimal float: the same bits at
// 1 and 2 threads is grad's contract) and "tokens ..." (the greedy ids, which
// the peers should mostly agree with).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <grad/grad.hpp>
#include <grad/hf/gguf.hpp>
#include <grad/hf/gguf_load.hpp>
#include <grad/hf/model.hpp>
#include <grad/inspect.hpp>
#include <grad/lm.hpp>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "bench_cli.hpp"

namespace {

using T = float;
namespace nn = grad::nn;
namespace hf = grad::hf;
using Clock = std::chrono::steady_clock;

// The checkpoint's shape: Qwen2.5-0.5B's (its config.json), or --small: the
// same head layout (14 query and 2 key-value heads of width 64, q/k/v
// biases, tied embeddings) at hidden 128, 2 layers, MLP 512 and vocabulary
// 2000. Each size option replaces one of those (0: the preset's), so other
// shapes of the kind can be written too (llama.cpp's qwen2 loader takes only
// heads x head width = hidden; bench/real_scale.sh leaves its row out
// otherwise).
struct Shape {
  bool small = false;
  std::size_t hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_width = 0, ffn = 0, vocab = 0;
};
nn::LmConfig qwen_config(const Shape& s) {
  const auto pick = [](std::size_t given, std::size_t preset) { return given != 0 ? given : preset; };
  nn::LmConfig c;
  c.vocab = pick(s.vocab, s.small ? 2000 : 151936);
  c.d_model = pick(s.hidden, s.small ? 128 : 896);
  c.layers = pick(s.layers, s.small ? 2 : 24);
  c.heads = pick(s.heads, 14);
  c.kv_heads = pick(s.kv_heads, 2);
  c.head_width = pick(s.head_width, 64);
  c.ffn = pick(s.ffn, s.small ? 512 : 4864);
  c.max_seq = 1024;
  c.rope_base = 1e6;
  c.eps = 1e-6;
  c.qkv_bias = true;
  c.tied_embeddings = true;
  return c;
}

// The i-th token of the benchmark's text: a fixed scramble of the vocabulary
// (bench/peer_torch_real_scale.py and peer_llama_real_scale.mjs use the same).
int token_at(std::size_t i, std::size_t vocab) { return static_cast<int>((i * 7919 + 13) % vocab); }

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// What `write` writes: the GGUF's type (f32, or quantized in llama.cpp's
// mix), and whether the Hugging Face directory (F32 safetensors) too.
struct WriteOptions {
  std::string type = "f32";
  bool gguf_only = false;
};

int write_checkpoint(const std::string& dir, const Shape& shape, const WriteOptions& w) {
  const nn::LmConfig c = qwen_config(shape);
  hf::GgufType type = hf::GgufType::f32;
  for (const hf::GgufType t : {hf::GgufType::f32, hf::GgufType::q8_0, hf::GgufType::q4_0, hf::GgufType::q4_k_m})
    if (hf::gguf_type_name(t) == w.type) type = t;
  grad::Tape<T> tp;
  // Seeded uniform weights (nn::Lm's initialisation), norms 1. A quantized
  // file's base is held as the file holds it, each matrix rounded as it is
  // drawn: a 7B model never exists in f32 (write_gguf copies the blocks).
  // The values differ from the f32 model's by the rounding alone.
  const bool held = type != hf::GgufType::f32;
  nn::Lm<T> model(tp, c, 2027, held ? nn::Lm<T>::Train::none : nn::Lm<T>::Train::full,
                  [&](const std::string& name) {
                    return held ? hf::storage_for(hf::gguf_tensor_type(c, type, name)) : grad::Storage::native;
                  });
  // nn::Lm starts its q/k/v biases at zero; Qwen2's are not, so give them values too.
  grad::SplitMix64 rng(7);
  for (std::size_t l = 0; l < c.layers; ++l)
    for (const nn::Proj p : {nn::Proj::q, nn::Proj::k, nn::Proj::v})
      for (T& b : tp.leaf_value(model.layer(l).bias[static_cast<std::size_t>(p)]))
        b = static_cast<T>(rng.uniform(-0.1, 0.1));
  std::printf("model: %s, %zu parameters\n", c.describe().c_str(), model.parameter_count());
  std::filesystem::create_directories(dir);
  if (!w.gguf_only) {
    const auto t0 = Clock::now();
    hf::save_pretrained(dir, model);
    std::printf("wrote %s/config.json and model.safetensors (F32) in %.1f s\n", dir.c_str(), seconds_since(t0));
  }
  // llama.cpp needs a vocabulary: the 256 bytes, an end-of-text token, then
  // unused "[PAD<id>]" tokens up to the model's vocabulary, as llama.cpp's
  // converter writes a checkpoint's padding rows.
  hf::BpeVocab vocab = hf::byte_level_vocab({"<|endoftext|>"});
  for (std::size_t id = vocab.tokens.size(); id < c.vocab; ++id) {
    vocab.tokens.push_back("[PAD" + std::to_string(id) + "]");
    vocab.token_types.push_back(hf::TokenType::unused);
  }
  const auto t1 = Clock::now();
  const std::string file = dir + (held ? "/model-" + w.type + ".gguf" : "/model.gguf");
  if (auto r = hf::write_gguf(file, model, vocab, {.type = type}); !r.ok()) {
    std::fprintf(stderr, "%s\n", r.error.c_str());
    return 1;
  }
  std::printf("wrote %s (%s) in %.1f s\n", file.c_str(), w.type.c_str(), seconds_since(t1));
  return 0;
}

struct Options {
  std::string model;  // a Hugging Face directory, or a .gguf file
  std::size_t threads = 1, reps = 5, seq = 512, prompt = 512, new_tokens = 128, rank = 16;
  bool recompute = false;  // finetune: each layer in a recompute scope (nn::Lm::set_recompute)
  double budget_gib = 0;   // finetune: the tape's memory budget (nn::Lm::set_memory_budget); 0: what the machine has
  grad::Storage base = grad::Storage::native;  // how the frozen base's matrices are held
  bool as_stored = false;  // a GGUF's matrices held as the file holds them (--base stored: its quantized blocks)
  std::string profile;  // finetune: print grad's profile of one step (by op and by scope) and write a Chrome trace here
  bool digest = false;  // generate: after the timed runs, one more that hashes every logits vector's bits
};

bool is_gguf(const std::string& path) { return path.size() > 5 && path.ends_with(".gguf"); }

// The model of o.model with `config`'s adapters and max_seq: a Hugging Face
// directory's weights (load_weights), or a GGUF's (load_gguf; --base stored
// keeps its quantized blocks).
nn::Lm<T> load_model(grad::Tape<T>& tp, const Options& o, const nn::LmConfig& config,
                     typename nn::Lm<T>::Train train) {
  if (!is_gguf(o.model)) {
    nn::Lm<T> model(tp, config, 1, train, o.base);
    hf::load_weights(o.model, model);
    return model;
  }
  hf::GgufLoadOptions g;
  g.max_seq = config.max_seq;
  g.lora_rank = config.lora_rank;
  g.lora_scale = config.lora_scale;
  g.lora_targets = config.lora_targets;
  g.base_storage = o.base;
  g.as_stored = o.as_stored;
  g.tokenizer = hf::GgufLoadOptions::TokenizerMode::skip;
  return std::move(hf::load_gguf(o.model, tp, train, g).model);
}
// The config of o.model (a directory's config.json, or a GGUF's metadata) with this max_seq.
nn::LmConfig model_config(const Options& o, std::size_t max_seq) {
  if (!is_gguf(o.model)) return hf::read_config(o.model, {.max_seq = max_seq}).config;
  return hf::read_gguf_config(hf::GgufFile(o.model), {.max_seq = max_seq}).config;
}

// L1: LoRA finetuning, batch 1 x seq; step() is one Adam step. The model
// is loaded and one warm-up step (which sizes the tape's arenas) taken when
// constructed, once per process: every repetition reuses them.
class Finetune {
 public:
  explicit Finetune(const Options& o)
      : o_(o), model_(load_model(tp_, o, config(o), nn::Lm<T>::Train::lora)), opt_(T(1e-4)) {
    if (o.recompute)
      model_.set_recompute(true);
    else
      model_.set_memory_budget(static_cast<std::size_t>(o.budget_gib * 1073741824.0));
    for (const auto& p : model_.trainable()) opt_.add(p.var);
    const std::size_t vocab = model_.config().vocab;
    for (std::size_t i = 0; i < o.seq; ++i) {
      in_.push_back(token_at(i, vocab));
      out_.push_back(token_at(i + 1, vocab));
    }
    mark_ = tp_.mark();
    if (!step()) throw std::runtime_error(tp_.error());
    std::printf("tape arenas after the warm-up step: %.1f MiB (recompute scopes' share %.1f MiB); %zu of %zu layers "
                "in recompute scopes\n",
                static_cast<double>(tp_.arena_bytes()) / 1048576.0, static_cast<double>(tp_.recompute_bytes()) / 1048576.0,
                model_.recomputed_layers(), model_.config().layers);
  }
  // false when the tape refused the step (tp.error() says why).
  bool step(bool profiled = false) {
    tp_.profile(profiled);
    const auto t0 = Clock::now();
    // The loss without the [seq, vocab] logits (forward_loss: forward's loss bit for bit).
    const grad::Var<T> loss = model_.forward_loss(model_.ids(in_, 1, o_.seq), model_.ids(out_, o_.seq, 0));
    const auto t1 = Clock::now();
    if (!tp_.backward(loss)) return false;
    const auto t2 = Clock::now();
    if (!opt_.step()) return false;
    const double forward = std::chrono::duration<double>(t1 - t0).count(),
                 backward = std::chrono::duration<double>(t2 - t1).count(), adam = seconds_since(t2);
    std::printf("loss %d %a\n", ++steps_, static_cast<double>(tp_.scalar(loss)));
    // Where a step's time goes (the thread scaling of each phase).
    std::printf("phases %d: forward %.3f s, backward %.3f s, Adam %.3f s\n", steps_, forward, backward, adam);
    if (profiled) {
      tp_.profile(false);
      std::printf("profile of one step (forward and backward; Adam not timed), by op:\n%s",
                  grad::profile_table(grad::profile_by_op(tp_)).c_str());
      std::printf("by part of the model (nn::Lm's name scopes):\n%s",
                  grad::profile_table(grad::profile_by_scope(tp_)).c_str());
      grad::write_chrome_trace(tp_, o_.profile);
    }
    tp_.reset_to(mark_);
    return true;
  }
  const std::string& error() const { return tp_.error(); }

 private:
  static nn::LmConfig config(const Options& o) {
    nn::LmConfig c = model_config(o, o.seq);
    c.lora_rank = o.rank;
    c.lora_scale = 32.0 / static_cast<double>(o.rank);  // lora_alpha 32: PEFT's scale alpha / r
    c.lora_targets = nn::all_projections;
    return c;
  }
  const Options& o_;
  grad::Tape<T> tp_;
  nn::Lm<T> model_;
  grad::Adam<T> opt_;
  std::vector<int> in_, out_;
  grad::Tape<T>::Mark mark_{};
  int steps_ = 0;
};

// L2: the prompt through grad's KV-cache decoder, then greedy tokens.
// Prefill: the whole prompt through KvDecoder::prefill (its projections and
// MLP as [prompt, width] matrix products) up to the logits of the first new
// token; decode: the remaining
// new_tokens - 1 steps, each feeding the previous greedy token. Loaded and
// warmed up (a short run: 16 prompt tokens, 4 new) when constructed.
class Generate {
 public:
  explicit Generate(const Options& o)
      : o_(o),
        model_(load_model(tp_, o, model_config(o, o.prompt + o.new_tokens), nn::Lm<T>::Train::none)) {
    dec_ = std::make_unique<nn::KvDecoder<T>>(model_);
    for (std::size_t i = 0; i < o.prompt; ++i) prompt_.push_back(token_at(i, model_.config().vocab));
    run(std::min<std::size_t>(o.prompt, 16), 4);  // warm-up: a short run touches every weight and buffer
  }
  struct Seconds {
    double prefill, decode;
  };
  // The first `prompt` tokens of the prompt, then new_tokens greedy ones;
  // with `hashes`, each logits vector's bits hashed into it (the timed runs
  // pass none).
  Seconds run(std::size_t prompt, std::size_t new_tokens, std::vector<std::uint64_t>* hashes = nullptr) {
    dec_->reset();
    tokens_.clear();
    auto next = [&](std::span<const T> logits) {
      if (hashes) hashes->push_back(grad::detail::fnv1a(grad::detail::bytes_of(logits)));
      return nn::argmax_token(logits);
    };
    const auto t0 = Clock::now();
    tokens_.push_back(next(dec_->prefill(std::span<const int>(prompt_).first(prompt))));
    const auto t1 = Clock::now();
    for (std::size_t n = 1; n < new_tokens; ++n) tokens_.push_back(next(dec_->step(tokens_.back())));
    return {std::chrono::duration<double>(t1 - t0).count(), seconds_since(t1)};
  }
  // One more run, untimed: a hash of every logits vector's bits, so that two
  // runs can be compared bit for bit.
  std::uint64_t digest(std::size_t prompt, std::size_t new_tokens) {
    std::vector<std::uint64_t> hashes;
    run(prompt, new_tokens, &hashes);
    return grad::detail::fnv1a(grad::detail::bytes_of(std::span<const std::uint64_t>(hashes)));
  }
  const std::vector<int>& tokens() const { return tokens_; }

 private:
  const Options& o_;
  grad::Tape<T> tp_;
  nn::Lm<T> model_;
  std::unique_ptr<nn::KvDecoder<T>> dec_;
  std::vector<int> prompt_, tokens_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_real_scale: issue 27's L1 (LoRA finetune) and L2 (prefill, decode) on grad", "bench_real_scale"};
  cli::allow_benchmark_flags(app);
  app.require_subcommand(1);
  std::string out;
  Shape shape;
  auto* write_cmd = app.add_subcommand("write", "write the random-weight checkpoint (Hugging Face directory + GGUF)");
  write_cmd->add_option("--out", out, "the directory to write")->required();
  write_cmd->add_flag("--small", shape.small,
                      "the tiny model of the same kind (hidden 128, 2 layers, MLP 512, vocabulary 2000)");
  const std::pair<const char*, std::size_t*> sizes[] = {
      {"--hidden", &shape.hidden},     {"--layers", &shape.layers},         {"--heads", &shape.heads},
      {"--kv-heads", &shape.kv_heads}, {"--head-width", &shape.head_width}, {"--ffn", &shape.ffn},
      {"--vocab", &shape.vocab}};
  for (const auto& [flag, value] : sizes)
    write_cmd->add_option(flag, *value, "instead of the preset's (Qwen2.5-0.5B's, or --small's)")
        ->check(cli::range<std::size_t>(1, 1u << 20));
  WriteOptions write;
  write_cmd
      ->add_option("--type", write.type,
                   "the GGUF's type: f32, or q8_0, q4_0, q4_k_m (llama.cpp's mix; the base drawn straight into it, "
                   "written as model-TYPE.gguf)")
      ->check(CLI::IsMember({"f32", "q8_0", "q4_0", "q4_k_m"}));
  write_cmd->add_flag("--gguf-only", write.gguf_only, "no Hugging Face directory (config.json, model.safetensors)");
  Options o;
  // --base: a storage by name (q4_k for q4_K), or "stored" (a GGUF's own types).
  constexpr grad::Storage storages[] = {grad::Storage::native, grad::Storage::bf16, grad::Storage::f16,
                                        grad::Storage::q8_0,   grad::Storage::q4_0, grad::Storage::q4_k,
                                        grad::Storage::q5_k,   grad::Storage::q6_k};
  const std::vector<std::string> holdings{"native", "bf16", "f16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "stored"};
  std::string base = "native";
  auto* finetune_cmd = app.add_subcommand("finetune", "L1: LoRA finetune steps (batch 1) with Adam");
  auto* generate_cmd = app.add_subcommand("generate", "L2: prefill a prompt, then greedy tokens with the KV cache");
  for (CLI::App* cmd : {finetune_cmd, generate_cmd}) {
    cmd->add_option("--model", o.model, "the Hugging Face directory (bench_real_scale write), or a .gguf file")
        ->required();
    cmd->add_option("--threads", o.threads, "grad's worker threads")->check(cli::range<std::size_t>(1, 256));
    cmd->add_option("--reps", o.reps, "timed repetitions after one warm-up")->check(cli::range<std::size_t>(1, 1000));
    cmd->add_option("--base", base,
                    "how the frozen base's matrices are held: native (f32), bf16, f16, q8_0, q4_0, q4_k, q5_k, q6_k, "
                    "or (a GGUF) stored: as the file holds them")
        ->check(CLI::IsMember(holdings));
  }
  finetune_cmd->add_option("--seq", o.seq, "tokens per step")->check(cli::range<std::size_t>(2, 32768));
  finetune_cmd->add_option("--rank", o.rank, "LoRA rank")->check(cli::range<std::size_t>(1, 4096));
  finetune_cmd->add_flag("--recompute", o.recompute,
                         "activation recompute: each layer's inside computed again in backward instead of kept "
                         "(the same bits, less memory)");
  finetune_cmd
      ->add_option("--memory-budget", o.budget_gib,
                   "GiB the tape may hold: as few layers as fit it are computed again in backward (default: as fit "
                   "the memory the machine has available)")
      ->check(CLI::Range(0.0, 1e6))
      ->excludes("--recompute");
  finetune_cmd->add_option("--profile", o.profile,
                           "after the timed steps, profile one more and write its Chrome trace to this file");
  generate_cmd->add_option("--prompt", o.prompt, "prompt tokens")->check(cli::range<std::size_t>(1, 32768));
  generate_cmd->add_option("--new", o.new_tokens, "greedy tokens")->check(cli::range<std::size_t>(2, 32768));
  generate_cmd->add_flag("--digest", o.digest,
                         "after the timed runs, run once more and print a hash of every logits vector's bits");
  for (CLI::App* cmd : {finetune_cmd, generate_cmd}) cmd->allow_extras();
  CLI11_PARSE(app, argc, argv);
  if (base == "stored" && !is_gguf(o.model)) {
    std::fprintf(stderr, "bench_real_scale: --base stored needs a .gguf --model\n");
    return 2;
  }
  o.as_stored = base == "stored";
  for (const grad::Storage s : storages)
    if (grad::storage_name(s) == base || (base.ends_with("_k") && grad::storage_name(s) == base.substr(0, 2) + "_K"))
      o.base = s;
  // Google Benchmark's flags are what the subcommand left.
  std::vector<std::string> rest = (finetune_cmd->parsed() ? finetune_cmd : generate_cmd)->remaining();
  std::vector<char*> bench_argv = {argv[0]};
  for (std::string& a : rest) bench_argv.push_back(a.data());
  int bench_argc = static_cast<int>(bench_argv.size());
  benchmark::Initialize(&bench_argc, bench_argv.data());
  if (benchmark::ReportUnrecognizedArguments(bench_argc, bench_argv.data())) return 2;
  try {
    if (write_cmd->parsed()) return write_checkpoint(out, shape, write);
    grad::set_num_threads(o.threads);
    // One process per configuration: the model loaded once, each
    // repetition a single iteration (a full-size step takes seconds).
    std::unique_ptr<Finetune> tune;
    std::unique_ptr<Generate> gen;
    benchmark::internal::Benchmark* b = nullptr;
    if (finetune_cmd->parsed()) {
      tune = std::make_unique<Finetune>(o);
      b = benchmark::RegisterBenchmark("L1_finetune", [&](benchmark::State& s) {
        for (auto _ : s)
          if (!tune->step()) s.SkipWithError(tune->error().c_str());
        s.SetItemsProcessed(static_cast<std::int64_t>(s.iterations() * o.seq));
      });
    } else {
      gen = std::make_unique<Generate>(o);
      b = benchmark::RegisterBenchmark("L2_generate", [&](benchmark::State& s) {
        double prefill = 0, decode = 0;
        for (auto _ : s) {
          const Generate::Seconds t = gen->run(o.prompt, o.new_tokens);
          prefill += t.prefill;
          decode += t.decode;
        }
        const auto n = static_cast<double>(s.iterations());
        s.counters["prefill_tok_s"] = static_cast<double>(o.prompt) * n / prefill;
        s.counters["decode_tok_s"] = static_cast<double>(o.new_tokens - 1) * n / decode;
      });
    }
    b->Iterations(1)->Repetitions(static_cast<int>(o.reps))->Unit(benchmark::kSecond)->UseRealTime();
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    if (gen) {
      std::printf("tokens");
      for (const int t : gen->tokens()) std::printf(" %d", t);
      std::printf("\n");
      if (o.digest)
        std::printf("logits digest %016llx\n", static_cast<unsigned long long>(gen->digest(o.prompt, o.new_tokens)));
    }
    if (tune && !o.profile.empty() && !tune->step(true)) throw std::runtime_error(tune->error());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_real_scale: %s\n", e.what());
    return 1;
  }
  return 0;
}
