// tinylm: a byte-level transformer language model, the whole ladder.
//
//   tinylm train    [--text /usr/share/common-licenses/GPL-3] [--out tinylm_base.model]
//   tinylm finetune [--base tinylm_base.model] [--text examples/tinylm_finetune.txt] [--out tinylm_lora.model]
//                   [--from HF_DIR --out PEFT_DIR | --from MODEL.gguf --out ADAPTER.gguf]  (a GGUF's base as it is
//                   held, quantized or not; the adapters as llama.cpp's --lora file; peak memory at the end)
//   tinylm merge    [--in tinylm_lora.model] [--out tinylm_merged.model]
//   tinylm generate [--model tinylm_merged.model] [--prompt TEXT | --prompt-file F [--prompt-bytes 16]]
//                   [--count N] [--temperature 0] [--top-k 0] [--seed 1]
//   tinylm all      train (with its options), then the other three on its model
//   tinylm bench    training and generation tokens/s at the default size (bench/peer_torch_lm.py)
//   tinylm export   [--in tinylm_merged.model | --in HF_DIR] [--gguf FILE [--f16 | --type q4_k_m]] [--hf DIR]
//                   [--in tinylm_lora.model --lora-gguf ADAPTER.gguf [--gguf BASE.gguf]]
//
// A Hugging Face model directory (Qwen2ForCausalLM or LlamaForCausalLM:
// config.json, model.safetensors, tokenizer.json) goes through the same
// ladder with --from: its tokenizer.json tokenizes the texts, the adapters
// are PEFT's, the merged model is a Hugging Face directory again:
//
//   tinylm finetune --from Qwen2-0.5B --text notes.txt --out adapter       (PEFT adapter directory)
//   tinylm merge    --from Qwen2-0.5B --in adapter --out merged            (Hugging Face directory)
//   tinylm generate --from merged --prompt-file notes.txt
//   tinylm export   --in merged --gguf merged.gguf                         (llama.cpp)
//
// train: pretrains on a text file (the last tenth held out), printing loss,
// bits per byte and tokens/s, and reports validation bits per byte against
// the uniform (8) and unigram baselines; writes the loss curve as CSV and
// SVG. finetune: LoRA adapters on every projection of a pretrained model
// (the base frozen: no gradient for it) until greedy generation from the
// text's first 16 bytes reproduces the rest. merge: folds the adapters into
// the base weights. generate: a KV-cache decoder, greedy or sampled.
// `tinylm COMMAND --help` lists each command's options with their defaults
// and ranges. --from and export need grad_hf (meson defines GRAD_TINYLM_HF
// when -Dhf found nlohmann-json and PCRE2); without it they say so and exit 2.
#include <sys/resource.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <grad/grad.hpp>
#include <grad/inspect.hpp>
#include <grad/lm.hpp>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "cli.hpp"
#include "report.hpp"

#ifdef GRAD_TINYLM_HF
#include <grad/hf/gguf.hpp>
#include <grad/hf/gguf_load.hpp>
#include <grad/hf/model.hpp>
#include <grad/hf/tokenizer.hpp>
#endif

namespace {

using T = float;
using Clock = std::chrono::steady_clock;
namespace nn = grad::nn;

// Text files are read whole; the bound keeps /dev/zero-sized mistakes out.
constexpr std::uintmax_t max_text_bytes = 64u << 20;
// Sizes are bounded so that a typo fails at the command line, not in
// std::bad_alloc halfway through: the largest model (--d 1024, --layers 16,
// --ffn 4096) has about 270M parameters.
constexpr std::size_t max_tokens_per_step = 8192;  // --batch x --seq

// An output that is a file, or a directory (Hugging Face's, PEFT's): the
// command checks which one it needs once it knows.
const CLI::Validator output_file_or_dir(
    [](const std::string& path) {
      return cli::output_dir_problem(path).empty() ? std::string() : cli::required_output_file_problem(path);
    },
    "PATH", "OUTPUT_FILE_OR_DIR");

struct TrainOptions {
  std::string text = "/usr/share/common-licenses/GPL-3", out = "tinylm_base.model", csv = "tinylm_train.csv",
              svg = "tinylm_train.svg";
  std::size_t d = 64, layers = 2, heads = 4, kv_heads = 2, ffn = 176, max_seq = 256, seq = 256, batch = 4;
  long steps = 600;
  double lr = 3e-3;
  std::uint64_t seed = 1;
  bool detect_anomalies = false;
  std::string profile;
};

void add_options(CLI::App& c, TrainOptions& o) {
  c.add_flag("--detect-anomalies", o.detect_anomalies,
             "stop at the first op or backward step that makes a NaN or inf, naming it (docs/inspect.md)");
  c.add_option("--profile", o.profile,
               "profile the second step: print times per op and per part of the model, write a Chrome trace "
               "(Perfetto) to this file")
      ->check(cli::output_file);
  c.add_option("--text", o.text, "text to train on (the last tenth held out for validation)")
      ->check(cli::input_file(max_text_bytes));
  c.add_option("--out", o.out, "where to write the trained model")->check(cli::required_output_file);
  c.add_option("--csv", o.csv, "loss curve as CSV ('' for none)")->check(cli::output_file);
  c.add_option("--svg", o.svg, "loss curve as an SVG plot ('' for none)")->check(cli::output_file);
  c.add_option("--steps", o.steps, "Adam steps")->check(cli::range(1L, 10'000'000L));
  c.add_option("--batch", o.batch, "windows per step (--batch x --seq at most 8192)")
      ->check(cli::range<std::size_t>(1, 64));
  c.add_option("--seq", o.seq, "bytes per window (at most --max-seq)")->check(cli::range<std::size_t>(1, 1024));
  c.add_option("--lr", o.lr, "Adam's peak learning rate (warm-up over 5% of the steps, cosine decay to a tenth)")
      ->check(cli::range(1e-7, 1.0));
  c.add_option("--seed", o.seed, "initial weights and window sampling")->check(cli::seed());
  c.add_option("--d", o.d, "model width (d_model; a multiple of 2 x --heads)")->check(cli::range<std::size_t>(2, 1024));
  c.add_option("--layers", o.layers, "transformer blocks")->check(cli::range<std::size_t>(1, 16));
  c.add_option("--heads", o.heads, "attention heads")->check(cli::range<std::size_t>(1, 32));
  c.add_option("--kv-heads", o.kv_heads, "key/value heads (grouped-query attention; divides --heads)")
      ->check(cli::range<std::size_t>(1, 32));
  c.add_option("--ffn", o.ffn, "feed-forward width")->check(cli::range<std::size_t>(1, 4096));
  c.add_option("--max-seq", o.max_seq, "positions the model holds (its context; generation needs 2)")
      ->check(cli::range<std::size_t>(2, 1024));
}

struct FinetuneOptions {
  std::string from;  // a Hugging Face directory or a GGUF file, instead of base
  std::string base = "tinylm_base.model", text = GRAD_TINYLM_FINETUNE_TEXT, out = "tinylm_lora.model",
              csv = "tinylm_finetune.csv", svg = "tinylm_finetune.svg", targets = "all";
  std::size_t rank = 8;
  double scale = 2.0, lr = 1e-2;
  long steps = 400;
  std::uint64_t seed = 1;
};

// A GGUF file (--from): a regular file named *.gguf.
const CLI::Validator gguf_file(
    [](const std::string& path) -> std::string {
      if (!path.ends_with(".gguf")) return "not a directory, nor a file named *.gguf";
      return CLI::ExistingFile(path);
    },
    "GGUF");

bool is_gguf(const std::string& path) { return path.ends_with(".gguf"); }

void add_options(CLI::App& c, FinetuneOptions& o) {
  auto* base = c.add_option("--base", o.base, "the pretrained model (tinylm train)")->check(CLI::ExistingFile);
  c.add_option("--from", o.from,
               "a Hugging Face model directory to finetune instead of --base (its tokenizer.json tokenizes the "
               "text; --out is then a PEFT adapter directory), or a GGUF file (llama.cpp's, quantized or not: the "
               "base stays as the file holds it; its vocabulary tokenizes the text; --out is then llama.cpp's LoRA "
               "adapter GGUF)")
      ->check(CLI::ExistingDirectory | gguf_file)
      ->excludes(base);
  c.add_option("--text", o.text, "text to memorise (more than 17 bytes, at most the model's max-seq)")
      ->check(cli::input_file(max_text_bytes));
  c.add_option("--out", o.out, "where to write the model with its adapters (with --from: a directory)")
      ->check(output_file_or_dir);
  c.add_option("--csv", o.csv, "loss curve as CSV ('' for none)")->check(cli::output_file);
  c.add_option("--svg", o.svg, "loss curve as an SVG plot ('' for none)")->check(cli::output_file);
  c.add_option("--rank", o.rank, "LoRA rank")->check(cli::range<std::size_t>(1, 256));
  c.add_option("--scale", o.scale, "LoRA scale (alpha / rank)")->check(cli::range(1e-6, 1e3));
  c.add_option("--targets", o.targets,
               "adapted projections: all, or a comma-separated list of q, k, v, o, gate, up, down")
      ->check(CLI::Validator(
          [](const std::string& v) {
            try {
              return nn::parse_projections(v) == 0 ? std::string("no projection named") : std::string();
            } catch (const std::invalid_argument& e) {
              return std::string(e.what());
            }
          },
          "LIST"));
  c.add_option("--steps", o.steps, "at most this many Adam steps (stops once the text is reproduced)")
      ->check(cli::range(1L, 1'000'000L));
  c.add_option("--lr", o.lr, "Adam learning rate")->check(cli::range(1e-7, 1.0));
  c.add_option("--seed", o.seed, "initial adapter weights")->check(cli::seed());
}

struct MergeOptions {
  std::string from, in = "tinylm_lora.model", out = "tinylm_merged.model";
};

void add_options(CLI::App& c, MergeOptions& o) {
  c.add_option("--in", o.in, "a model with adapters (tinylm finetune; with --from, its PEFT adapter directory)")
      ->check(CLI::ExistingPath);
  c.add_option("--from", o.from,
               "the Hugging Face model directory the adapters of --in were trained on; --out is then a Hugging "
               "Face directory (the tokenizer files copied)")
      ->check(CLI::ExistingDirectory);
  c.add_option("--out", o.out, "where to write the merged model (with --from: a directory)")->check(output_file_or_dir);
}

struct GenerateOptions {
  std::string from, model = "tinylm_merged.model", prompt, prompt_file = GRAD_TINYLM_FINETUNE_TEXT;
  std::size_t prompt_bytes = 16, count = 200, top_k = 0;
  bool count_given = false;
  double temperature = 0;
  std::uint64_t seed = 1;
};

void add_options(CLI::App& c, GenerateOptions& o) {
  auto* model = c.add_option("--model", o.model, "the model to generate with")->check(CLI::ExistingFile);
  c.add_option("--from", o.from,
               "a Hugging Face model directory to generate with instead of --model (its tokenizer.json: "
               "--count and --top-k count its tokens; --prompt-bytes stays bytes)")
      ->check(CLI::ExistingDirectory)
      ->excludes(model);
  auto* prompt =
      c.add_option("--prompt", o.prompt, "the prompt itself (instead of --prompt-file)")
          ->check(CLI::Validator(
              [](const std::string& v) { return v.empty() ? std::string("empty prompt") : std::string(); }, "TEXT"));
  c.add_option("--prompt-file", o.prompt_file,
               "the prompt is this file's first --prompt-bytes bytes; the rest is what greedy decoding should give")
      ->check(cli::input_file(max_text_bytes))
      ->excludes(prompt);
  c.add_option("--prompt-bytes", o.prompt_bytes, "prompt bytes taken from --prompt-file")
      ->check(cli::range<std::size_t>(1, max_text_bytes))
      ->excludes(prompt);
  c.add_option("--count", o.count,
               "tokens to generate: bytes with --model, the tokenizer's tokens with --from (200 after --prompt)")
      ->check(cli::range<std::size_t>(0, 1'000'000))
      ->default_str("the rest of --prompt-file")
      ->each([&o](const std::string&) { o.count_given = true; });
  c.add_option("--temperature", o.temperature, "0: greedy; above 0: sampled")->check(cli::range(0.0, 100.0));
  c.add_option("--top-k", o.top_k,
               "sample among the k likeliest tokens (bytes with --model, tokens with --from; 0: all)")
      ->check(cli::range<std::size_t>(0, 1'000'000));
  c.add_option("--seed", o.seed, "sampling")->check(cli::seed());
}

struct BenchOptions {
  std::size_t seq = 256, batch = 4, d = nn::LmConfig{}.d_model, layers = nn::LmConfig{}.layers;
  long steps = 20;
  bool train_only = false;
};

void add_options(CLI::App& c, BenchOptions& o) {
  c.add_option("--seq", o.seq, "bytes per window")->check(cli::range<std::size_t>(1, 256));
  c.add_option("--batch", o.batch, "windows per step")->check(cli::range<std::size_t>(1, 32));
  c.add_option("--steps", o.steps, "timed steps (after 2 untimed)")->check(cli::range(1L, 100'000L));
  c.add_option("--d", o.d, "model width (d_model; a multiple of 2 x the 4 heads)")
      ->check(cli::range<std::size_t>(8, 1024));
  c.add_option("--layers", o.layers, "transformer blocks")->check(cli::range<std::size_t>(1, 16));
  c.add_flag("--train-only", o.train_only, "time training only (no generation)");
}

struct ExportOptions {
  std::string in = "tinylm_merged.model", gguf, hf, type, lora_gguf;
  bool f16 = false;
};

// The GGUF file types --type takes (llama.cpp's quantize tool's names, lower case).
constexpr const char* gguf_types[] = {"f32", "f16", "q8_0", "q4_0", "q4_k_m"};

void add_options(CLI::App& c, ExportOptions& o) {
  c.add_option("--in", o.in, "a model without adapters: grad's model file (tinylm merge) or a Hugging Face directory")
      ->check(CLI::ExistingPath);
  c.add_option("--gguf", o.gguf,
               "write a GGUF file for llama.cpp (qwen2, or llama for a head_dim of its own; the vocabulary: bytes, "
               "or the directory's tokenizer.json, whose pre-tokenizer must be GPT-2's, Qwen2's or Llama 3's)")
      ->check(cli::output_file);
  c.add_flag("--f16", o.f16, "GGUF matrices in F16 (norms and biases stay F32; --type f16)");
  c.add_option("--type", o.type,
               "the GGUF file's type: f32, f16, or quantized as llama.cpp's quantize tool would (q8_0, q4_0, q4_k_m: "
               "its mix of types per tensor; norms and biases stay F32)")
      ->check(CLI::Validator(
          [](const std::string& t) {
            for (const char* name : gguf_types)
              if (t == name) return std::string();
            return "'" + t + "' is not a GGUF file type (expected f32, f16, q8_0, q4_0 or q4_k_m)";
          },
          "TYPE", "GGUF_TYPE"));
  c.add_option("--lora-gguf", o.lora_gguf,
               "for a model file with adapters (tinylm finetune): write them as llama.cpp's LoRA adapter GGUF (F32; "
               "llama-cli -m BASE.gguf --lora FILE), and with --gguf its base without them")
      ->check(cli::output_file);
  c.add_option("--hf", o.hf,
               "write a Hugging Face directory (config.json, model.safetensors, F32; the tokenizer files, or for "
               "grad's model file a byte-level tokenizer.json)")
      ->check(output_file_or_dir);
}

std::string read_text(const std::string& path) {
  std::string s = cli::read_file(path, max_text_bytes);
  if (s.empty()) throw std::runtime_error("the text file '" + path + "' is empty");
  return s;
}

// Every output path is checked before the work, defaults included.
void check_outputs(const TrainOptions& o) {
  cli::check_output_file("--out", o.out, true);
  cli::check_output_file("--csv", o.csv);
  cli::check_output_file("--svg", o.svg);
}
void check_outputs(const FinetuneOptions& o) {
  cli::check_output_file("--out", o.out, true);
  cli::check_output_file("--csv", o.csv);
  cli::check_output_file("--svg", o.svg);
}

// A save that fails is an error: the program exits non-zero.
void check_saved(const grad::ModelFileResult& r) {
  if (!r) throw std::runtime_error(r.error);
}

// A Hugging Face directory or a GGUF file needs grad_hf: without it, the
// option that asks for one is a usage error that says so.
void require_hf([[maybe_unused]] const std::string& what) {
#ifndef GRAD_TINYLM_HF
  throw cli::UsageError(what +
                        ": this tinylm was built without grad_hf (Hugging Face directories and GGUF); "
                        "install nlohmann-json3-dev and libpcre2-dev and configure with -Dhf=auto or enabled");
#endif
}

// An output directory (Hugging Face's, PEFT's): an existing writable one,
// or a path whose parent is (the writer creates it).
void check_output_dir(const std::string& flag, const std::string& path) {
  if (!cli::output_dir_problem(path).empty()) cli::check_output_file(flag, path, true);
}

// How a text becomes ids and back: bytes (grad's own models), or a Hugging
// Face directory's tokenizer.json (its NFC normalizer applied, as Hugging
// Face does; a grad_hf without utf8proc refuses text that is not ASCII).
// has_token: whether an id decodes to something; a checkpoint pads its
// embedding with rows no token has (Qwen2: 151936 for 151665 tokens).
struct Codec {
  std::function<std::vector<int>(std::string_view)> encode;
  std::function<std::string(std::span<const int>)> decode;
  std::function<bool(int)> has_token;
};

Codec byte_codec() {
  return {[](std::string_view s) { return nn::ByteTokenizer::encode(s); },
          [](std::span<const int> ids) { return nn::ByteTokenizer::decode(ids); },
          [](int id) { return id >= 0 && id < 256; }};
}

// Sampling that never picks an id the codec cannot decode (the padding rows).
nn::SampleOptions sampling_for(const Codec& codec, std::size_t vocab) {
  nn::SampleOptions so;
  std::vector<bool> allowed(vocab);
  bool all = true;
  for (std::size_t i = 0; i < vocab; ++i) all &= allowed[i] = codec.has_token(static_cast<int>(i));
  if (!all) so.allowed = std::move(allowed);
  return so;
}

Codec codec_of([[maybe_unused]] const std::string& hf_dir) {
  if (hf_dir.empty()) return byte_codec();
#ifdef GRAD_TINYLM_HF
  // (assume_nfc matters only to a grad_hf without utf8proc: then ASCII text is taken, other text refused.)
  // A GGUF's vocabulary (tokenizer.ggml.*, the gpt2 kind) tokenizes as llama.cpp does.
  auto tok = std::make_shared<const grad::hf::Tokenizer>(
      is_gguf(hf_dir) ? grad::hf::bpe_tokenizer(grad::hf::read_gguf_vocab(grad::hf::GgufFile(hf_dir)))
                      : grad::hf::Tokenizer::from_file(hf_dir + "/tokenizer.json", {.assume_nfc = true}));
  return {[tok](std::string_view s) { return tok->encode(s); },
          [tok](std::span<const int> ids) { return tok->decode(ids); },
          [tok](int id) { return tok->id_to_token(id).has_value(); }};
#else
  require_hf("--from");
  return byte_codec();
#endif
}

// Cross-entropy of a unigram byte model (counts from `train`, add-one
// smoothed) on `val`, in bits per byte.
double unigram_bpb(std::span<const int> train, std::span<const int> val) {
  std::vector<double> count(256, 1.0);
  for (int t : train) count[static_cast<std::size_t>(t)] += 1;
  const double total = static_cast<double>(train.size()) + 256;
  double bits = 0;
  for (int t : val) bits -= std::log2(count[static_cast<std::size_t>(t)] / total);
  return bits / static_cast<double>(val.size());
}

// Mean loss (nats per byte) over consecutive windows of `seq` predictions.
double evaluate(nn::Lm<T>& model, std::span<const int> tokens, std::size_t seq) {
  grad::Tape<T>& tp = model.tape();
  const auto mark = tp.mark();
  double sum = 0;
  std::size_t n = 0;
  grad::InferenceGuard<T> guard(tp);
  for (std::size_t at = 0; at + 1 < tokens.size(); at += seq) {
    const std::size_t len = std::min(seq, tokens.size() - 1 - at);
    auto r = model.forward(model.ids(tokens.subspan(at, len), 1, len), model.ids(tokens.subspan(at + 1, len), len, 0));
    if (!tp.ok()) throw std::runtime_error(tp.error());
    sum += static_cast<double>(tp.scalar(r.loss)) * static_cast<double>(len);
    n += len;
    tp.reset_to(mark);
  }
  return sum / static_cast<double>(n);
}

// Greedy continuation of the first `prompt` tokens: does it reproduce the rest?
std::string continuation(const nn::Lm<T>& model, std::span<const int> text, std::size_t prompt, const Codec& codec) {
  nn::KvDecoder<T> dec(model);
  const std::vector<int> out =
      nn::generate(dec, text.first(prompt), text.size() - prompt, sampling_for(codec, model.config().vocab));
  return codec.decode(out);
}

// One live line: step, loss, bits/byte, tokens/s.
// "1 h 02 min", "3 min 05 s", "12 s".
std::string duration_text(double seconds) {
  const long s = std::lround(std::max(0.0, seconds));
  char text[48];
  if (s >= 3600)
    std::snprintf(text, sizeof text, "%ld h %02ld min", s / 3600, s / 60 % 60);
  else if (s >= 60)
    std::snprintf(text, sizeof text, "%ld min %02ld s", s / 60, s % 60);
  else
    std::snprintf(text, sizeof text, "%ld s", s);
  return text;
}

// The process's peak resident memory so far, for the last line of a run.
void print_peak_memory() {
  rusage u{};
  if (getrusage(RUSAGE_SELF, &u) == 0)
    std::printf("peak memory: %.0f MiB resident\n", static_cast<double>(u.ru_maxrss) / 1024.0);
}

struct Live {
  bool tty = isatty(fileno(stdout)) == 1;
  Clock::time_point drawn = Clock::now();
  Clock::time_point started = Clock::now();
  void draw(long step, long steps, double loss, double tokens_per_s, bool force = false) {
    const auto now = Clock::now();
    if (!force && (!tty || now - drawn < std::chrono::milliseconds(100))) return;
    drawn = now;
    const int width = 30, filled = static_cast<int>(width * step / std::max(1L, steps));
    // The time left at the pace so far (an upper bound where a run stops early once it has learned its text).
    const double eta = std::chrono::duration<double>(now - started).count() / static_cast<double>(std::max(1L, step)) *
                       static_cast<double>(steps - step);
    std::printf("%s step %5ld/%ld [%.*s%.*s] loss %.3f  %.3f bits/byte  %.0f tokens/s  ETA %s%s", tty ? "\r" : "", step,
                steps, filled, "##############################", width - filled, "------------------------------", loss,
                loss / std::log(2.0), tokens_per_s, duration_text(eta).c_str(), tty ? "\033[K" : "\n");
    std::fflush(stdout);
  }
};

struct Curve {
  std::vector<double> step, train_bpb, val_bpb;
  void write(const std::string& csv, const std::string& svg, const std::string& title, double unigram) const {
    if (!csv.empty()) {
      std::FILE* f = std::fopen(csv.c_str(), "w");
      if (!f) throw std::runtime_error("cannot write " + csv);
      std::fprintf(f, "step,train_bits_per_byte,val_bits_per_byte\n");
      for (std::size_t i = 0; i < step.size(); ++i) {
        std::fprintf(f, "%g,%g,", step[i], train_bpb[i]);
        if (!std::isnan(val_bpb[i])) std::fprintf(f, "%f", val_bpb[i]);
        std::fprintf(f, "\n");
      }
      if (std::ferror(f) != 0 || std::fclose(f) != 0) throw std::runtime_error("cannot write " + csv);
      std::printf("loss curve: %s\n", csv.c_str());
    }
    if (!svg.empty()) {
      report::Plot p{title, "step", "bits per byte", false, {}, {}};
      p.series.push_back({"train (smoothed)", "#1f77b4", step, train_bpb});
      report::Series v{"validation", "#d62728", {}, {}};
      for (std::size_t i = 0; i < step.size(); ++i)
        if (!std::isnan(val_bpb[i])) {
          v.x.push_back(step[i]);
          v.y.push_back(val_bpb[i]);
        }
      if (!v.x.empty()) p.series.push_back(v);
      if (unigram > 0) p.references.push_back({unigram, "unigram baseline"});
      if (!report::write_svg(svg, p)) throw std::runtime_error("cannot write " + svg);
      std::printf("loss plot: %s\n", svg.c_str());
    }
  }
};

// The options that depend on each other; UsageError names them.
nn::LmConfig model_config(const TrainOptions& o) {
  nn::LmConfig c;
  c.d_model = o.d;
  c.layers = o.layers;
  c.heads = o.heads;
  c.kv_heads = o.kv_heads;
  c.ffn = o.ffn;
  c.max_seq = o.max_seq;
  if (std::string why = c.check(); !why.empty()) throw cli::UsageError("--d, --heads, --kv-heads: " + why);
  if (o.seq > o.max_seq)
    throw cli::UsageError("--seq " + std::to_string(o.seq) + ": more than --max-seq " + std::to_string(o.max_seq));
  if (o.batch * o.seq > max_tokens_per_step)
    throw cli::UsageError("--batch x --seq is " + std::to_string(o.batch * o.seq) + "; at most " +
                          std::to_string(max_tokens_per_step) + " bytes per step");
  return c;
}

int train(const TrainOptions& o) {
  const nn::LmConfig c = model_config(o);
  check_outputs(o);
  const std::string& path = o.text;
  const std::vector<int> tokens = nn::ByteTokenizer::encode(read_text(path));
  const std::size_t seq = o.seq, batch = o.batch;
  const long steps = o.steps;
  const double lr = o.lr;
  const std::uint64_t seed = o.seed;
  const std::size_t held = tokens.size() / 10;
  if (tokens.size() < 2 * (seq + 1) + held)
    throw std::runtime_error("the text '" + path + "' has " + std::to_string(tokens.size()) +
                             " bytes: too short for windows of " + std::to_string(seq) + " plus a held-out tenth");
  const std::span<const int> train_part = std::span(tokens).first(tokens.size() - held),
                             val_part = std::span(tokens).last(held);
  const double unigram = unigram_bpb(train_part, val_part);

  grad::Tape<T> tp;
  tp.detect_anomalies(o.detect_anomalies);
  nn::Lm<T> model(tp, c, seed);
  grad::Adam<T> opt(static_cast<T>(lr));
  opt.set_clip(T(1));
  // Linear warm-up over the first 5% of the steps, then cosine decay to a tenth (grad::LrSchedule).
  opt.set_schedule({.base_lr = lr,
                    .min_lr = lr / 10,
                    .warmup = static_cast<std::uint64_t>(steps / 20),
                    .total = static_cast<std::uint64_t>(std::max(1L, steps))});
  for (const auto& p : model.trainable()) opt.add(p.var);
  std::printf(
      "tinylm train: %s (%zu bytes; last %zu held out)\nmodel: %s, %zu parameters; batch %zu x %zu, %ld steps\n",
      path.c_str(), tokens.size(), held, c.describe().c_str(), model.parameter_count(), batch, seq, steps);
  const auto mark = tp.mark();
  grad::SplitMix64 rng(seed + 1000);
  std::vector<int> in(batch * seq), out(batch * seq);
  Curve curve;
  Live live;
  double smooth = std::log(256.0), tokens_done = 0, seconds = 0;
  const long eval_every = std::max(1L, steps / 12);
  for (long step = 1; step <= steps; ++step) {
    const auto t0 = Clock::now();
    for (std::size_t b = 0; b < batch; ++b) {
      const std::size_t at = static_cast<std::size_t>(rng.next() % (train_part.size() - seq));
      for (std::size_t i = 0; i < seq; ++i) {
        in[b * seq + i] = train_part[at + i];
        out[b * seq + i] = train_part[at + i + 1];
      }
    }
    const bool profiled = !o.profile.empty() && step == std::min(2L, steps);  // the first step warms the arenas
    tp.profile(profiled);
    auto r = model.forward(model.ids(in, batch, seq), model.ids(out, batch * seq, 0));
    if (!tp.backward(r.loss) || !opt.step()) throw std::runtime_error(tp.error());
    const double loss = static_cast<double>(tp.scalar(r.loss));
    if (profiled) {
      tp.profile(false);
      std::printf("\nprofile of step %ld (forward and backward; the optimizer is not timed), by op:\n%s", step,
                  grad::profile_table(grad::profile_by_op(tp)).c_str());
      std::printf("by part of the model (nn::Lm's name scopes):\n%s",
                  grad::profile_table(grad::profile_by_scope(tp)).c_str());
      grad::write_chrome_trace(tp, o.profile);
      std::printf("Chrome trace: %s (open it in https://ui.perfetto.dev)\n", o.profile.c_str());
    }
    tp.reset_to(mark);
    seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    tokens_done += static_cast<double>(batch * seq);
    smooth = step == 1 ? loss : 0.95 * smooth + 0.05 * loss;
    live.draw(step, steps, smooth, tokens_done / seconds, false);
    if (step % eval_every == 0 || step == steps || step == 1) {
      const double val = evaluate(model, val_part, seq) / std::log(2.0);
      curve.step.push_back(static_cast<double>(step));
      curve.train_bpb.push_back(smooth / std::log(2.0));
      curve.val_bpb.push_back(val);
      if (live.tty) std::printf("\r\033[K");
      std::printf(" step %5ld/%ld  train %.3f bits/byte  validation %.3f bits/byte  %.0f tokens/s\n", step, steps,
                  smooth / std::log(2.0), val, tokens_done / seconds);
    }
  }
  const double val = curve.val_bpb.back();
  std::printf("validation: %.3f bits/byte (uniform 8.000, unigram %.3f); training %.0f tokens/s, %.1f s\n", val,
              unigram, tokens_done / seconds, seconds);
  check_saved(nn::save_lm(o.out, model));
  std::printf("saved %s\n", o.out.c_str());
  curve.write(o.csv, o.svg, "tinylm pretraining on " + path, unigram);
  return 0;
}

int finetune(const FinetuneOptions& o) {
  const bool hf = !o.from.empty(), gguf = hf && is_gguf(o.from);
  if (gguf) {
    require_hf("--from");
    cli::check_output_file("--out", o.out, true);
    cli::check_output_file("--csv", o.csv);
    cli::check_output_file("--svg", o.svg);
  } else if (hf) {
    require_hf("--from");
    check_output_dir("--out", o.out);
    cli::check_output_file("--csv", o.csv);
    cli::check_output_file("--svg", o.svg);
  } else {
    check_outputs(o);
  }
  const std::string &base = hf ? o.from : o.base, &path = o.text;
  const Codec codec = codec_of(o.from);
  const std::vector<int> tokens = codec.encode(read_text(path));
  nn::LmConfig c;
  // A BF16 or F16 checkpoint's frozen base stays 16-bit (half the memory, the same bits).
  grad::Storage base_storage = grad::Storage::native;
#ifdef GRAD_TINYLM_HF
  if (gguf) {  // max_seq: the text's tokens, at most the file's context_length
    c = grad::hf::read_gguf_config(grad::hf::GgufFile(base)).config;
    c.max_seq = std::clamp<std::size_t>(tokens.size(), 2, c.max_seq);
  } else if (hf) {  // max_seq: the text's tokens (the decoder's cache), at most max_position_embeddings
    const grad::hf::ModelInfo info = grad::hf::read_config(base);
    c = info.config;
    c.max_seq = std::clamp<std::size_t>(tokens.size(), 2, c.max_seq);
    base_storage = grad::hf::storage_for(info.dtype);
  }
#endif
  if (!hf)
    if (std::string why = nn::read_lm_config(base, c); !why.empty()) throw std::runtime_error(why);
  c.lora_rank = o.rank;
  c.lora_scale = o.scale;
  c.lora_targets = nn::parse_projections(o.targets);
  // The prompt: the tokens of the text's first 16 bytes (16 tokens for bytes).
  const std::size_t prompt_bytes = 16;
  std::size_t prompt = 0;
  while (prompt < tokens.size() && codec.decode(std::span(tokens).first(prompt)).size() < prompt_bytes) ++prompt;
  if (tokens.size() <= prompt + 1 || tokens.size() > c.max_seq)
    throw std::runtime_error("the finetune text '" + path + "' has " + std::to_string(tokens.size()) +
                             (hf ? " tokens" : " bytes") + "; expected more than " + std::to_string(prompt + 1) +
                             " and at most max_seq " + std::to_string(c.max_seq));
  grad::Tape<T> tp;
  // A GGUF's base held as the file holds it (its quantized blocks byte for byte).
  auto load = [&]() -> nn::Lm<T> {
#ifdef GRAD_TINYLM_HF
    if (gguf)
      return std::move(grad::hf::load_gguf(base, tp, nn::Lm<T>::Train::lora,
                                           {.max_seq = c.max_seq,
                                            .lora_rank = c.lora_rank,
                                            .lora_scale = c.lora_scale,
                                            .lora_targets = c.lora_targets,
                                            .as_stored = true,
                                            .tokenizer = grad::hf::GgufLoadOptions::TokenizerMode::skip,
                                            .seed = o.seed})
                           .model);
#endif
    nn::Lm<T> m(tp, c, o.seed, nn::Lm<T>::Train::lora, base_storage);
#ifdef GRAD_TINYLM_HF
    if (hf) grad::hf::load_weights(base, m);
#endif
    if (!hf) check_saved(nn::load_lm(base, m));
    return m;
  };
  nn::Lm<T> model = load();
  grad::Adam<T> opt(static_cast<T>(o.lr));
  opt.set_clip(T(1));
  std::size_t adapter_elements = 0;
  for (const auto& p : model.trainable()) {
    opt.add(p.var);
    adapter_elements += tp.value(p.var).size();
  }
  const long steps = o.steps;
  std::printf("tinylm finetune: %s (%zu bytes) on %s\nmodel: %s; %zu adapter parameters of %zu%s\n", path.c_str(),
              tokens.size(), base.c_str(), c.describe().c_str(), adapter_elements, model.parameter_count(),
              grad::narrow(model.base_storage())
                  ? (" (the frozen base held as " + std::string(grad::storage_name(model.base_storage())) +
                     ", as the file holds it)")
                        .c_str()
                  : "");
  const std::size_t n = tokens.size() - 1;
  const std::span<const int> all(tokens);
  std::printf("before: greedy from the first %zu tokens gives \"%s\"\n", prompt,
              continuation(model, all, prompt, codec).substr(0, 60).c_str());
  const auto mark = tp.mark();
  Curve curve;
  Live live;
  double seconds = 0, tokens_done = 0;
  long done = 0;
  std::size_t grad_bytes = 0;
  for (long step = 1; step <= steps; ++step) {
    const auto t0 = Clock::now();
    auto r = model.forward(model.ids(all.first(n), 1, n), model.ids(all.subspan(1, n), n, 0));
    if (!tp.backward(r.loss) || !opt.step()) throw std::runtime_error(tp.error());
    const double loss = static_cast<double>(tp.scalar(r.loss));
    grad_bytes = tp.grad_bytes();
    tp.reset_to(mark);
    seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    tokens_done += static_cast<double>(n);
    curve.step.push_back(static_cast<double>(step));
    curve.train_bpb.push_back(loss / std::log(2.0));
    curve.val_bpb.push_back(std::nan(""));
    live.draw(step, steps, loss, tokens_done / seconds, step % 50 == 0);
    done = step;
    if (step % 25 == 0 && continuation(model, all, prompt, codec) == codec.decode(all.subspan(prompt))) break;
  }
  if (live.tty) std::printf("\r\033[K");
  const bool exact = continuation(model, all, prompt, codec) == codec.decode(all.subspan(prompt));
  std::size_t base_bytes = 0;  // what full finetuning's gradients would take: every base tensor in T
  for (const auto& p : model.base()) base_bytes += tp.dims(p.var).size() * sizeof(T);
  std::printf("finetuned %ld steps in %.1f s (%.0f tokens/s); greedy from the first %zu tokens %s the rest\n", done,
              seconds, tokens_done / seconds, prompt, exact ? "reproduces" : "does NOT reproduce");
  std::printf(
      "gradient buffers: adapters %zu bytes (the whole tape %zu), base weights 0 bytes (full finetuning: %zu)\n",
      adapter_elements * sizeof(T), grad_bytes, base_bytes);
  if (model.recomputed_layers() != 0)
    std::printf("activation recompute: %zu of %zu layers computed again in backward, to fit the memory available\n",
                model.recomputed_layers(), model.config().layers);
#ifdef GRAD_TINYLM_HF
  if (gguf) {  // llama.cpp's adapter file: llama-cli -m BASE.gguf --lora OUT
    if (const auto r = grad::hf::write_lora_gguf(o.out, model); !r.ok()) throw std::runtime_error(r.error);
  } else if (hf) {
    grad::hf::save_adapters(o.out, model);  // PEFT's adapter_config.json and adapter_model.safetensors
  }
#endif
  if (!hf) check_saved(nn::save_lm(o.out, model));
  std::printf("saved %s%s\n", o.out.c_str(),
              gguf ? " (llama.cpp's LoRA adapter GGUF: --lora beside the base)" : hf ? " (PEFT adapters)" : "");
  print_peak_memory();
  curve.write(o.csv, o.svg, "tinylm LoRA finetune on " + path, 0);
  return exact ? 0 : 1;
}

// A Hugging Face base and its PEFT adapters, merged into a Hugging Face directory.
int merge_hf([[maybe_unused]] const MergeOptions& o) {
  require_hf("--from");
  check_output_dir("--out", o.out);
#ifdef GRAD_TINYLM_HF
  namespace hf = grad::hf;
  const hf::ModelInfo info = hf::read_config(o.from);
  const nn::LmConfig c = hf::with_adapters(info.config, hf::read_adapter_config(o.in));
  grad::Tape<T> tp, out_tp;
  // A BF16 or F16 checkpoint's base stays 16-bit until the merge widens it.
  const grad::Storage base_storage = hf::storage_for(info.dtype);
  nn::Lm<T> lora(tp, c, 1, nn::Lm<T>::Train::lora, base_storage);
  hf::load_weights(o.from, lora);
  hf::load_adapters(o.in, lora);
  nn::Lm<T> merged(out_tp, info.config, 1);
  nn::merge_lora(lora, merged);
  hf::SaveOptions save;
  save.architecture = info.architecture;
  save.copy_from = o.from;
  hf::save_pretrained(o.out, merged, save);
  std::printf("tinylm merge: %s + adapters %s (%s) -> %s (F32; the tokenizer files copied)\n", o.from.c_str(),
              o.in.c_str(), c.describe().c_str(), o.out.c_str());
#endif
  return 0;
}

int merge(const MergeOptions& o) {
  if (!o.from.empty()) return merge_hf(o);
  cli::check_output_file("--out", o.out, true);
  const std::string &from = o.in, &to = o.out;
  nn::LmConfig c;
  if (std::string why = nn::read_lm_config(from, c); !why.empty()) throw std::runtime_error(why);
  if (c.lora_rank == 0) throw std::runtime_error("'" + from + "' has no adapters to merge");
  grad::Tape<T> tp, out_tp;
  nn::Lm<T> lora(tp, c, 1, nn::Lm<T>::Train::lora);
  check_saved(nn::load_lm(from, lora));
  nn::LmConfig b = c;
  b.lora_rank = 0;
  nn::Lm<T> merged(out_tp, b, 1);
  nn::merge_lora(lora, merged);
  check_saved(nn::save_lm(to, merged));
  std::printf("tinylm merge: %s (%s) -> %s (w = w0 + %g * A.B on every adapted projection)\n", from.c_str(),
              c.describe().c_str(), to.c_str(), c.lora_scale);
  return 0;
}

int generate(const GenerateOptions& o) {
  const bool hf = !o.from.empty();
  const std::string& from = hf ? o.from : o.model;
  const Codec codec = codec_of(o.from);
  std::string prompt = o.prompt, expected;
  if (prompt.empty()) {
    const std::string text = read_text(o.prompt_file);
    const std::size_t k = std::min(o.prompt_bytes, text.size());
    prompt = text.substr(0, k);
    expected = text.substr(k);
  }
  const std::vector<int> p = codec.encode(prompt);
  // The rest of the prompt file, in tokens (bytes: its length).
  const std::size_t expected_tokens = expected.empty() ? 0 : codec.encode(prompt + expected).size() - p.size();
  const std::size_t count = o.count_given || expected.empty() ? o.count : expected_tokens;
  nn::LmConfig c;
#ifdef GRAD_TINYLM_HF
  if (hf) {
    c = grad::hf::read_config(from).config;  // max_seq: max_position_embeddings; the cache needs no more than this
    c.max_seq = std::clamp<std::size_t>(p.size() + count, 2, c.max_seq);
  }
#endif
  if (!hf)
    if (std::string why = nn::read_lm_config(from, c); !why.empty()) throw std::runtime_error(why);
  grad::Tape<T> tp;
  nn::Lm<T> model(tp, c, 1);
#ifdef GRAD_TINYLM_HF
  if (hf) grad::hf::load_weights(from, model);
#endif
  if (!hf) check_saved(nn::load_lm(from, model));
  nn::SampleOptions so = sampling_for(codec, c.vocab);  // ids with no token (padding rows) never come out
  so.temperature = o.temperature;
  so.top_k = o.top_k;
  so.seed = o.seed;
  nn::KvDecoder<T> dec(model);
  const auto t0 = Clock::now();
  const std::vector<int> out = nn::generate(dec, p, count, so);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string text = codec.decode(out);
  std::printf("%s%s\n", prompt.c_str(), text.c_str());
  std::fprintf(stderr, "[%zu tokens in %.3f s: %.0f tokens/s, KV cache, %s]\n", p.size() + out.size(), s,
               static_cast<double>(p.size() + out.size()) / s, so.temperature > 0 ? "sampled" : "greedy");
  if (!expected.empty() && so.temperature <= 0 && count == expected_tokens)
    std::fprintf(stderr, "[the rest of the prompt file: %s]\n",
                 text == expected ? "reproduced exactly" : "NOT reproduced");
  return 0;
}

// A model without adapters, grad's model file or a Hugging Face directory,
// as a GGUF file and/or a Hugging Face directory.
int export_model([[maybe_unused]] const ExportOptions& o) {
  require_hf("tinylm export");
  if (o.gguf.empty() && o.hf.empty() && o.lora_gguf.empty())
    throw cli::UsageError(
        "--gguf, --hf, --lora-gguf: nothing to write (name a GGUF file, a Hugging Face directory, or both; or an "
        "adapter file)");
  if ((o.f16 || !o.type.empty()) && o.gguf.empty())
    throw cli::UsageError(std::string(o.f16 ? "--f16" : "--type") +
                          ": it is the GGUF file's type; name one with --gguf");
  if (o.f16 && !o.type.empty() && o.type != "f16")
    throw cli::UsageError("--f16, --type " + o.type + ": two GGUF file types (give one)");
  if (!o.gguf.empty()) cli::check_output_file("--gguf", o.gguf, true);
  if (!o.lora_gguf.empty()) cli::check_output_file("--lora-gguf", o.lora_gguf, true);
  if (!o.hf.empty()) check_output_dir("--hf", o.hf);
#ifdef GRAD_TINYLM_HF
  namespace hf = grad::hf;
  const bool from_hf = std::filesystem::is_directory(o.in);
  nn::LmConfig c;
  if (from_hf)
    c = hf::read_config(o.in).config;
  else if (std::string why = nn::read_lm_config(o.in, c); !why.empty())
    throw std::runtime_error(why);
  if (!o.lora_gguf.empty() && c.lora_rank == 0)
    throw std::runtime_error("--lora-gguf: '" + o.in + "' has no adapters (" + c.describe() +
                             "): a model file of tinylm finetune has");
  if (c.lora_rank > 0 && (o.lora_gguf.empty() || !o.hf.empty()))
    throw std::runtime_error("'" + o.in + "' has adapters (" + c.describe() + "): fold them in first (tinylm merge)" +
                             (o.hf.empty() ? ", or write them as llama.cpp's adapter file (--lora-gguf)" : ""));
  nn::LmConfig base_config = c;  // the model --gguf and --hf write: the base, without adapters
  base_config.lora_rank = 0;
  grad::Tape<T> tp, tl;
  nn::Lm<T> model(tp, base_config, 1);
  if (c.lora_rank > 0) {  // the adapters to their file, the base (the same tensors) into `model`
    nn::Lm<T> tuned(tl, c, 1);
    check_saved(nn::load_lm(o.in, tuned));
    check_saved(hf::write_lora_gguf(o.lora_gguf, tuned));
    std::printf("tinylm export: %s (%s) -> %s (llama.cpp's LoRA adapter GGUF, F32, alpha %g)\n", o.in.c_str(),
                c.describe().c_str(), o.lora_gguf.c_str(), c.lora_scale * static_cast<double>(c.lora_rank));
    for (const auto& p : model.base()) {
      const grad::Tensor<T> v = tl.widened_value(tuned.tensor(p.name));
      std::copy(v.data().begin(), v.data().end(), tp.leaf_value(p.var).begin());
    }
  } else if (from_hf) {
    hf::load_weights(o.in, model);
  } else {
    check_saved(nn::load_lm(o.in, model));
  }
  if (!o.gguf.empty()) {
    // The vocabulary: the directory's tokenizer.json (its pre-tokenizer
    // named as llama.cpp names it, or refused), or grad's 256 bytes.
    const hf::BpeVocab vocab =
        from_hf ? hf::bpe_vocab(hf::Tokenizer::from_file(o.in + "/tokenizer.json", {.assume_nfc = true}), c.vocab)
                : hf::byte_level_vocab();
    hf::GgufType type = o.f16 ? hf::GgufType::f16 : hf::GgufType::f32;
    for (const hf::GgufType t :
         {hf::GgufType::f32, hf::GgufType::f16, hf::GgufType::q8_0, hf::GgufType::q4_0, hf::GgufType::q4_k_m})
      if (o.type == hf::gguf_type_name(t)) type = t;
    check_saved(hf::write_gguf(o.gguf, model, vocab, {.type = type}));
    std::string type_name(hf::gguf_type_name(type));
    for (char& ch : type_name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
    std::printf("tinylm export: %s (%s) -> %s (GGUF, %s, %s, %zu tokens, pre-tokenizer %s)\n", o.in.c_str(),
                c.describe().c_str(), o.gguf.c_str(), std::string(hf::gguf_architecture(c)).c_str(), type_name.c_str(),
                vocab.tokens.size(), vocab.pre.c_str());
  }
  if (!o.hf.empty()) {
    hf::SaveOptions save;
    if (from_hf) save.copy_from = o.in;
    hf::save_pretrained(o.hf, model, save);
    if (!from_hf) {  // grad's bytes as a tokenizer.json: the directory is whole for --from and transformers
      const std::string path = o.hf + "/tokenizer.json";
      std::ofstream out(path, std::ios::binary);
      out << hf::byte_level_tokenizer_json();
      if (!out.flush()) throw std::runtime_error("cannot write '" + path + "'");
    }
    std::printf("tinylm export: %s (%s) -> %s (Hugging Face directory, F32, %s)\n", o.in.c_str(), c.describe().c_str(),
                o.hf.c_str(), from_hf ? "its tokenizer files copied" : "byte-level tokenizer.json");
  }
#endif
  return 0;
}

// Speed at the default size, one thread: training steps (forward, backward,
// Adam) on batch x seq windows, and greedy KV-cache generation.
int bench(const BenchOptions& o) {
  nn::LmConfig c;  // the example's default size (train), --d and --layers aside
  c.max_seq = 256;
  c.d_model = o.d;
  c.layers = o.layers;
  const std::size_t seq = o.seq, batch = o.batch;
  const long steps = o.steps;
  grad::Tape<T> tp;
  nn::Lm<T> model(tp, c, 1);
  grad::Adam<T> opt(T(1e-3));
  for (const auto& p : model.trainable()) opt.add(p.var);
  const auto mark = tp.mark();
  grad::SplitMix64 rng(5);
  std::vector<int> in(batch * seq), out(batch * seq);
  for (int& x : in) x = static_cast<int>(rng.next() % 256);
  for (int& x : out) x = static_cast<int>(rng.next() % 256);
  double seconds = 0;
  for (long s = -2; s < steps; ++s) {
    const auto t0 = Clock::now();
    auto r = model.forward(model.ids(in, batch, seq), model.ids(out, batch * seq, 0));
    if (!tp.backward(r.loss) || !opt.step()) throw std::runtime_error(tp.error());
    tp.reset_to(mark);
    if (s >= 0) seconds += std::chrono::duration<double>(Clock::now() - t0).count();
  }
  const double train_rate = static_cast<double>(batch * seq) * static_cast<double>(steps) / seconds;
  std::printf("tinylm bench: %s, %zu parameters, float32, 1 thread\n", c.describe().c_str(), model.parameter_count());
  std::printf("train_tokens_per_s %.0f (batch %zu x %zu, forward + backward + Adam)\n", train_rate, batch, seq);
  if (o.train_only) return 0;
  nn::KvDecoder<T> dec(model);
  const std::size_t gen = c.max_seq - 1;
  const std::vector<int> prompt = {84};
  nn::generate(dec, prompt, gen);  // warm
  const auto t0 = Clock::now();
  const int reps = 3;
  for (int i = 0; i < reps; ++i) nn::generate(dec, prompt, gen);
  const double gen_rate =
      static_cast<double>(reps * (gen + 1)) / std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("generate_tokens_per_s %.0f (greedy, KV cache, %zu positions)\n", gen_rate, gen + 1);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tinylm: a byte-level transformer language model: pretrain, LoRA finetune, merge, generate", "tinylm"};
  cli::setup(app);
  app.require_subcommand(1);
  app.footer("tinylm COMMAND --help lists the command's options with their defaults and ranges.");
  TrainOptions train_o;
  FinetuneOptions finetune_o;
  MergeOptions merge_o;
  GenerateOptions generate_o;
  BenchOptions bench_o;
  ExportOptions export_o;
  std::size_t threads = 1;
  auto* train_cmd = app.add_subcommand("train", "pretrain on a text file; write the model and its loss curve");
  auto* finetune_cmd = app.add_subcommand("finetune", "LoRA adapters until greedy decoding reproduces a text");
  auto* merge_cmd = app.add_subcommand("merge", "fold a finetuned model's adapters into its weights");
  auto* generate_cmd = app.add_subcommand("generate", "continue a prompt, greedy or sampled (KV cache)");
  auto* all_cmd =
      app.add_subcommand("all", "train (with train's options), then finetune, merge and generate on its model");
  auto* bench_cmd = app.add_subcommand("bench", "training and generation tokens/s at the default size");
  auto* export_cmd =
      app.add_subcommand("export", "write a model as GGUF for llama.cpp and/or as a Hugging Face directory");
  add_options(*train_cmd, train_o);
  add_options(*all_cmd, train_o);
  add_options(*finetune_cmd, finetune_o);
  add_options(*merge_cmd, merge_o);
  add_options(*generate_cmd, generate_o);
  add_options(*bench_cmd, bench_o);
  add_options(*export_cmd, export_o);
  for (CLI::App* cmd : {train_cmd, finetune_cmd, merge_cmd, generate_cmd, all_cmd, bench_cmd, export_cmd})
    cmd->add_option("--threads", threads, "worker threads")->check(cli::range<std::size_t>(1, 256));
  if (auto status = cli::parse(app, argc, argv)) return *status;

  const std::string cmd = app.get_subcommands().front()->get_name();
  try {
    grad::set_num_threads(threads);
    if (cmd == "train") return train(train_o);
    if (cmd == "finetune") return finetune(finetune_o);
    if (cmd == "merge") return merge(merge_o);
    if (cmd == "generate") return generate(generate_o);
    if (cmd == "bench") return bench(bench_o);
    if (cmd == "export") return export_model(export_o);
    // all: each step reads the model the one before wrote; every path is checked before training.
    finetune_o.base = train_o.out;
    merge_o.in = finetune_o.out;
    generate_o.model = merge_o.out;
    model_config(train_o);
    check_outputs(finetune_o);
    cli::check_output_file("--out", merge_o.out, true);
    if (int r = train(train_o); r != 0) return r;
    if (int r = finetune(finetune_o); r != 0) return r;
    if (int r = merge(merge_o); r != 0) return r;
    return generate(generate_o);
  } catch (const cli::UsageError& e) {
    std::fprintf(stderr, "tinylm %s: %s\nRun with --help for every option with its default and range.\n", cmd.c_str(),
                 e.what());
    return 2;
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "tinylm %s: out of memory: try a smaller --batch, --seq, --d, --layers or --ffn\n",
                 cmd.c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tinylm %s: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
