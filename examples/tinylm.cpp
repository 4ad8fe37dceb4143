// tinylm: a byte-level transformer language model, the whole ladder.
//
//   tinylm train    [--text /usr/share/common-licenses/GPL-3] [--out tinylm_base.model]
//   tinylm finetune [--base tinylm_base.model] [--text examples/tinylm_finetune.txt] [--out tinylm_lora.model]
//   tinylm merge    [--in tinylm_lora.model] [--out tinylm_merged.model]
//   tinylm generate [--model tinylm_merged.model] [--prompt TEXT | --prompt-file F [--prompt-bytes 16]]
//                   [--count N] [--temperature 0] [--top-k 0] [--seed 1]
//   tinylm all      the four above with their defaults
//   tinylm bench    training and generation tokens/s at the default size (bench/peer_torch_lm.py)
//
// train: pretrains on a text file (the last tenth held out), printing loss,
// bits per byte and tokens/s, and reports validation bits per byte against
// the uniform (8) and unigram baselines; writes the loss curve as CSV and
// SVG. finetune: LoRA adapters on every projection of a pretrained model
// (the base frozen: no gradient for it) until greedy generation from the
// text's first 16 bytes reproduces the rest. merge: folds the adapters into
// the base weights. generate: a KV-cache decoder, greedy or sampled.
// Options: --steps, --batch, --seq, --lr, --seed, --d, --layers, --heads,
// --kv-heads, --ffn, --max-seq (train), --rank, --scale (finetune),
// --csv/--svg (train, finetune), --threads.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <grad/grad.hpp>
#include <grad/lm.hpp>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "report.hpp"

namespace {

using T = float;
using Clock = std::chrono::steady_clock;
namespace nn = grad::nn;

struct Args {
  std::map<std::string, std::string> kv;
  std::string get(const std::string& k, const std::string& d) const {
    auto it = kv.find(k);
    return it == kv.end() ? d : it->second;
  }
  long num(const std::string& k, long d) const {
    const std::string v = get(k, "");
    if (v.empty()) return d;
    std::size_t used = 0;
    const long x = std::stol(v, &used);
    if (used != v.size() || x < 0) throw std::invalid_argument("--" + k + " " + v + ": expected a whole number >= 0");
    return x;
  }
  double real(const std::string& k, double d) const {
    const std::string v = get(k, "");
    return v.empty() ? d : std::stod(v);
  }
};

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open the text file '" + path + "'");
  std::stringstream s;
  s << in.rdbuf();
  if (s.str().empty()) throw std::runtime_error("the text file '" + path + "' is empty: nothing to train on");
  return s.str();
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
std::string continuation(const nn::Lm<T>& model, std::span<const int> text, std::size_t prompt) {
  nn::KvDecoder<T> dec(model);
  const std::vector<int> out = nn::generate(dec, text.first(prompt), text.size() - prompt);
  return nn::ByteTokenizer::decode(out);
}

// One live line: step, loss, bits/byte, tokens/s.
struct Live {
  bool tty = isatty(fileno(stdout)) == 1;
  Clock::time_point drawn = Clock::now();
  void draw(long step, long steps, double loss, double tokens_per_s, bool force = false) {
    const auto now = Clock::now();
    if (!force && (!tty || now - drawn < std::chrono::milliseconds(100))) return;
    drawn = now;
    const int width = 30, filled = static_cast<int>(width * step / std::max(1L, steps));
    std::printf("%s step %5ld/%ld [%.*s%.*s] loss %.3f  %.3f bits/byte  %.0f tokens/s%s", tty ? "\r" : "", step, steps,
                filled, "##############################", width - filled, "------------------------------", loss,
                loss / std::log(2.0), tokens_per_s, tty ? "\033[K" : "\n");
    std::fflush(stdout);
  }
};

struct Curve {
  std::vector<double> step, train_bpb, val_bpb;
  void write(const std::string& csv, const std::string& svg, const std::string& title, double unigram) const {
    if (!csv.empty()) {
      std::ofstream f(csv);
      f << "step,train_bits_per_byte,val_bits_per_byte\n";
      for (std::size_t i = 0; i < step.size(); ++i)
        f << step[i] << "," << train_bpb[i] << ","
          << (std::isnan(val_bpb[i]) ? std::string() : std::to_string(val_bpb[i])) << "\n";
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
      if (!report::write_svg(svg, p)) std::fprintf(stderr, "tinylm: cannot write %s\n", svg.c_str());
    }
  }
};

void check_saved(const grad::ModelFileResult& r) {
  if (!r) throw std::runtime_error(r.error);
}

int train(const Args& a) {
  const std::string path = a.get("text", "/usr/share/common-licenses/GPL-3");
  const std::vector<int> tokens = nn::ByteTokenizer::encode(read_text(path));
  nn::LmConfig c;
  c.d_model = static_cast<std::size_t>(a.num("d", 64));
  c.layers = static_cast<std::size_t>(a.num("layers", 2));
  c.heads = static_cast<std::size_t>(a.num("heads", 4));
  c.kv_heads = static_cast<std::size_t>(a.num("kv-heads", 2));
  c.ffn = static_cast<std::size_t>(a.num("ffn", 176));
  c.max_seq = static_cast<std::size_t>(a.num("max-seq", 256));
  const std::size_t seq = static_cast<std::size_t>(a.num("seq", 256)),
                    batch = static_cast<std::size_t>(a.num("batch", 4));
  const long steps = a.num("steps", 600);
  const double lr = a.real("lr", 3e-3);
  const std::uint64_t seed = static_cast<std::uint64_t>(a.num("seed", 1));
  const std::size_t held = tokens.size() / 10;
  if (tokens.size() < 2 * (seq + 1) + held)
    throw std::runtime_error("the text '" + path + "' has " + std::to_string(tokens.size()) +
                             " bytes: too short for windows of " + std::to_string(seq) + " plus a held-out tenth");
  const std::span<const int> train_part = std::span(tokens).first(tokens.size() - held),
                             val_part = std::span(tokens).last(held);
  const double unigram = unigram_bpb(train_part, val_part);

  grad::Tape<T> tp;
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
    auto r = model.forward(model.ids(in, batch, seq), model.ids(out, batch * seq, 0));
    if (!tp.backward(r.loss) || !opt.step()) throw std::runtime_error(tp.error());
    const double loss = static_cast<double>(tp.scalar(r.loss));
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
  curve.write(a.get("csv", "tinylm_train.csv"), a.get("svg", "tinylm_train.svg"), "tinylm pretraining on " + path,
              unigram);
  const std::string to = a.get("out", "tinylm_base.model");
  check_saved(nn::save_lm(to, model));
  std::printf("saved %s\n", to.c_str());
  return 0;
}

int finetune(const Args& a) {
  const std::string base = a.get("base", "tinylm_base.model"), path = a.get("text", GRAD_TINYLM_FINETUNE_TEXT);
  const std::vector<int> tokens = nn::ByteTokenizer::encode(read_text(path));
  nn::LmConfig c;
  if (std::string why = nn::read_lm_config(base, c); !why.empty()) throw std::runtime_error(why);
  c.lora_rank = static_cast<std::size_t>(a.num("rank", 8));
  c.lora_scale = a.real("scale", 2.0);
  c.lora_targets = nn::parse_projections(a.get("targets", "all"));
  const std::size_t prompt = 16;
  if (tokens.size() <= prompt + 1 || tokens.size() > c.max_seq)
    throw std::runtime_error("the finetune text '" + path + "' has " + std::to_string(tokens.size()) +
                             " bytes; expected more than " + std::to_string(prompt + 1) + " and at most max_seq " +
                             std::to_string(c.max_seq));
  grad::Tape<T> tp;
  nn::Lm<T> model(tp, c, static_cast<std::uint64_t>(a.num("seed", 1)), nn::Lm<T>::Train::lora);
  check_saved(nn::load_lm(base, model));
  grad::Adam<T> opt(static_cast<T>(a.real("lr", 1e-2)));
  opt.set_clip(T(1));
  std::size_t adapter_elements = 0;
  for (const auto& p : model.trainable()) {
    opt.add(p.var);
    adapter_elements += tp.value(p.var).size();
  }
  const long steps = a.num("steps", 400);
  std::printf("tinylm finetune: %s (%zu bytes) on %s\nmodel: %s; %zu adapter parameters of %zu\n", path.c_str(),
              tokens.size(), base.c_str(), c.describe().c_str(), adapter_elements, model.parameter_count());
  const std::size_t n = tokens.size() - 1;
  const std::span<const int> all(tokens);
  std::printf("before: greedy from the first %zu bytes gives \"%s\"\n", prompt,
              continuation(model, all, prompt).substr(0, 60).c_str());
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
    if (step % 25 == 0 && continuation(model, all, prompt) == nn::ByteTokenizer::decode(all.subspan(prompt))) break;
  }
  if (live.tty) std::printf("\r\033[K");
  const bool exact = continuation(model, all, prompt) == nn::ByteTokenizer::decode(all.subspan(prompt));
  std::size_t base_bytes = 0;
  for (const auto& p : model.base()) base_bytes += tp.value(p.var).size() * sizeof(T);
  std::printf("finetuned %ld steps in %.1f s (%.0f tokens/s); greedy from the first %zu bytes %s the rest\n", done,
              seconds, tokens_done / seconds, prompt, exact ? "reproduces" : "does NOT reproduce");
  std::printf(
      "gradient buffers: adapters %zu bytes (the whole tape %zu), base weights 0 bytes (full finetuning: %zu)\n",
      adapter_elements * sizeof(T), grad_bytes, base_bytes);
  curve.write(a.get("csv", "tinylm_finetune.csv"), a.get("svg", "tinylm_finetune.svg"),
              "tinylm LoRA finetune on " + path, 0);
  const std::string to = a.get("out", "tinylm_lora.model");
  check_saved(nn::save_lm(to, model));
  std::printf("saved %s\n", to.c_str());
  return exact ? 0 : 1;
}

int merge(const Args& a) {
  const std::string from = a.get("in", "tinylm_lora.model"), to = a.get("out", "tinylm_merged.model");
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

int generate(const Args& a) {
  const std::string from = a.get("model", "tinylm_merged.model");
  nn::LmConfig c;
  if (std::string why = nn::read_lm_config(from, c); !why.empty()) throw std::runtime_error(why);
  grad::Tape<T> tp;
  nn::Lm<T> model(tp, c, 1);
  check_saved(nn::load_lm(from, model));
  std::string prompt = a.get("prompt", ""), expected;
  if (prompt.empty()) {
    const std::string text = read_text(a.get("prompt-file", GRAD_TINYLM_FINETUNE_TEXT));
    const std::size_t k = std::min<std::size_t>(static_cast<std::size_t>(a.num("prompt-bytes", 16)), text.size());
    prompt = text.substr(0, k);
    expected = text.substr(k);
  }
  const std::size_t count =
      static_cast<std::size_t>(a.num("count", expected.empty() ? 200 : static_cast<long>(expected.size())));
  nn::SampleOptions o;
  o.temperature = a.real("temperature", 0);
  o.top_k = static_cast<std::size_t>(a.num("top-k", 0));
  o.seed = static_cast<std::uint64_t>(a.num("seed", 1));
  nn::KvDecoder<T> dec(model);
  const std::vector<int> p = nn::ByteTokenizer::encode(prompt);
  const auto t0 = Clock::now();
  const std::vector<int> out = nn::generate(dec, p, count, o);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  const std::string text = nn::ByteTokenizer::decode(out);
  std::printf("%s%s\n", prompt.c_str(), text.c_str());
  std::fprintf(stderr, "[%zu tokens in %.3f s: %.0f tokens/s, KV cache, %s]\n", p.size() + out.size(), s,
               static_cast<double>(p.size() + out.size()) / s, o.temperature > 0 ? "sampled" : "greedy");
  if (!expected.empty() && o.temperature <= 0 && count == expected.size())
    std::fprintf(stderr, "[the rest of the prompt file: %s]\n",
                 text == expected ? "reproduced exactly" : "NOT reproduced");
  return 0;
}

// Speed at the default size, one thread: training steps (forward, backward,
// Adam) on batch x seq windows, and greedy KV-cache generation.
int bench(const Args& a) {
  nn::LmConfig c;  // the example's default size (train)
  c.max_seq = 256;
  const std::size_t seq = static_cast<std::size_t>(a.num("seq", 256)),
                    batch = static_cast<std::size_t>(a.num("batch", 4));
  const long steps = a.num("steps", 20);
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
  nn::KvDecoder<T> dec(model);
  const std::size_t gen = c.max_seq - 1;
  const std::vector<int> prompt = {84};
  nn::generate(dec, prompt, gen);  // warm
  const auto t0 = Clock::now();
  const int reps = 3;
  for (int i = 0; i < reps; ++i) nn::generate(dec, prompt, gen);
  const double gen_rate =
      static_cast<double>(reps * (gen + 1)) / std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("tinylm bench: %s, %zu parameters, float32, 1 thread\n", c.describe().c_str(), model.parameter_count());
  std::printf("train_tokens_per_s %.0f (batch %zu x %zu, forward + backward + Adam)\n", train_rate, batch, seq);
  std::printf("generate_tokens_per_s %.0f (greedy, KV cache, %zu positions)\n", gen_rate, gen + 1);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: tinylm train|finetune|merge|generate|all [--option value ...] (see examples/tinylm.cpp)\n");
    return 2;
  }
  const std::string cmd = argv[1];
  Args a;
  for (int i = 2; i < argc; i += 2) {
    const std::string k = argv[i];
    if (k.rfind("--", 0) != 0 || i + 1 >= argc) {
      std::fprintf(stderr, "tinylm: expected --option value pairs, got '%s'\n", k.c_str());
      return 2;
    }
    a.kv[k.substr(2)] = argv[i + 1];
  }
  try {
    grad::set_num_threads(static_cast<std::size_t>(a.num("threads", 1)));
    if (cmd == "train") return train(a);
    if (cmd == "finetune") return finetune(a);
    if (cmd == "merge") return merge(a);
    if (cmd == "generate") return generate(a);
    if (cmd == "bench") return bench(a);
    if (cmd == "all") {
      if (int r = train(a); r != 0) return r;
      if (int r = finetune(Args{}); r != 0) return r;
      if (int r = merge(Args{}); r != 0) return r;
      return generate(Args{});
    }
    std::fprintf(stderr, "tinylm: unknown command '%s' (train, finetune, merge, generate, all)\n", cmd.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tinylm %s: %s\n", cmd.c_str(), e.what());
    return 1;
  }
}
