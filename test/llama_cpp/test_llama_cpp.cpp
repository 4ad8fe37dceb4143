// grad's GGUF export served by llama.cpp: a grad nn::Lm written with
// hf::write_gguf, greedy-decoded by llama.cpp (decode.mjs, node-llama-cpp's
// prebuilt CPU binary), must continue a prompt token for token as grad's own
// KV-cache decoder does, with first-step log-probabilities close; in F32,
// in F16 (grad decoding the F16-rounded weights), tied to the embedding,
// for a LoRA-finetuned, merged model that recalls a text (and for its base
// with the adapters as llama.cpp's LoRA adapter file: hf::write_lora_gguf),
// random adapters on qwen2 and llama bases, and end to end
// from a Hugging Face directory (config.json, model.safetensors, a
// tokenizer.json with learned merges) through LoRA, save_pretrained and the
// tokenizer's vocabulary; a model whose heads have a width of their own
// (Llama's head_dim) as llama.cpp's llama architecture; and tokenizers with
// GPT-2's and Llama 3's pre-tokenizers, which llama.cpp must split as grad
// does. The same files read back with hf::load_gguf decode and tokenize as
// llama.cpp does too (F16 into an f16 base: the file's bits). run.sh
// installs llama.cpp and runs this with GRAD_LLAMA_DECODE set to the script.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <grad/grad.hpp>
#include <grad/hf/gguf.hpp>
#include <grad/hf/gguf_load.hpp>
#include <grad/hf/model.hpp>
#include <grad/hf/tokenizer.hpp>
#include <grad/lm.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../support.hpp"

using namespace grad;
using namespace grad::testing;

namespace {

struct LlamaRun {
  std::vector<int> tokens, tokenized;
  std::vector<double> logprobs;               // the first step's, by id
  std::vector<std::vector<double>> position;  // every_position: after each prompt position, by id
};

// Runs decode.mjs on `gguf`; REQUIREs that it succeeds.
LlamaRun llama_decode(const std::string& gguf, std::span<const int> prompt, std::size_t count,
                      const std::string& kv = "f32", const std::string& tokenize = "", const std::string& lora = "",
                      bool every_position = false) {
  const char* script = std::getenv("GRAD_LLAMA_DECODE");
  REQUIRE_MESSAGE(script != nullptr, "GRAD_LLAMA_DECODE is not set: run this through test/llama_cpp/run.sh");
  std::string ids;
  for (int t : prompt) {  // not "," + std::to_string(t): GCC 12's -Wrestrict misreads it (a false positive)
    if (!ids.empty()) ids += ',';
    ids += std::to_string(t);
  }
  std::string command = "node '" + std::string(script) + "' --model '" + gguf + "' --prompt " + ids + " --count " +
                        std::to_string(count) + " --kv " + kv + " --logits";
  if (!tokenize.empty()) command += " --tokenize '" + tokenize + "'";  // the test's texts have no quote
  if (!lora.empty()) command += " --lora '" + lora + "'";
  if (every_position) command += " --every-position";
  FILE* pipe = ::popen(command.c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  char buffer[4096];
  while (const std::size_t n = std::fread(buffer, 1, sizeof buffer, pipe)) out.append(buffer, n);
  const int status = ::pclose(pipe);
  CAPTURE(command);
  REQUIRE_MESSAGE(status == 0, "decode.mjs failed (its message is above)");
  LlamaRun r;
  std::istringstream lines(out);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string name, word;
    words >> name;
    if (name == "logprobs_at") {  // "logprobs_at <position> <logprobs...>", positions in order
      std::size_t position = 0;
      words >> position;
      REQUIRE(position == r.position.size());
      r.position.emplace_back();
    }
    while (words >> word) {
      if (name == "logprobs")
        r.logprobs.push_back(std::strtod(word.c_str(), nullptr));  // "-Infinity" included
      else if (name == "logprobs_at")                              // after the position's index (read below)
        r.position.back().push_back(std::strtod(word.c_str(), nullptr));
      else if (name == "tokens")
        r.tokens.push_back(std::stoi(word));
      else if (name == "tokenized")
        r.tokenized.push_back(std::stoi(word));
    }
  }
  return r;
}

// grad's greedy continuation and the log-softmax of its logits after the prompt.
template <class T>
std::pair<std::vector<int>, std::vector<double>> grad_decode(const nn::Lm<T>& model, std::span<const int> prompt,
                                                             std::size_t count) {
  nn::KvDecoder<T> dec(model);
  std::span<const T> logits;
  for (int t : prompt) logits = dec.step(t);
  double top = -INFINITY, sum = 0;
  for (T x : logits) top = std::max(top, static_cast<double>(x));
  for (T x : logits) sum += std::exp(static_cast<double>(x) - top);
  std::vector<double> logprobs;
  for (T x : logits) logprobs.push_back(static_cast<double>(x) - top - std::log(sum));
  nn::KvDecoder<T> fresh(model);
  return {nn::generate(fresh, prompt, count), logprobs};
}

std::string ids_text(const std::vector<int>& ids) {
  std::string s = "[";
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) s += ' ';
    s += std::to_string(ids[i]);
  }
  s += ']';
  return s;
}
#define CHECK_SAME_IDS(theirs, ours) \
  CHECK_MESSAGE((theirs) == (ours), "llama.cpp " << ids_text(theirs) << "\n     grad " << ids_text(ours))

// The largest difference of log-probabilities, over the ids llama.cpp's
// float probabilities can still tell apart from zero.
double max_logprob_diff(const std::vector<double>& ours, const std::vector<double>& theirs) {
  REQUIRE(ours.size() == theirs.size());
  double worst = 0;
  for (std::size_t i = 0; i < ours.size(); ++i)
    if (ours[i] > -30) worst = std::max(worst, std::abs(ours[i] - theirs[i]));
  return worst;
}

// grad's log-softmax after every position of `tokens` (teacher-forced).
template <class T>
std::vector<std::vector<double>> grad_position_logprobs(const nn::Lm<T>& model, std::span<const int> tokens) {
  nn::KvDecoder<T> dec(model);
  std::vector<std::vector<double>> out;
  for (int t : tokens) {
    const std::span<const T> logits = dec.step(t);
    double top = -INFINITY, sum = 0;
    for (T x : logits) top = std::max(top, static_cast<double>(x));
    for (T x : logits) sum += std::exp(static_cast<double>(x) - top);
    std::vector<double>& lp = out.emplace_back();
    for (T x : logits) lp.push_back(static_cast<double>(x) - top - std::log(sum));
  }
  return out;
}

// The largest difference over every position (max_logprob_diff's ids).
double max_position_diff(const std::vector<std::vector<double>>& ours, const std::vector<std::vector<double>>& theirs) {
  REQUIRE(ours.size() == theirs.size());
  double worst = 0;
  for (std::size_t i = 0; i < ours.size(); ++i) worst = std::max(worst, max_logprob_diff(ours[i], theirs[i]));
  return worst;
}

// How many greedy tokens agree before the first that does not.
std::size_t agreeing(const std::vector<int>& a, const std::vector<int>& b) {
  std::size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// A tiny byte-level BPE: the 256 bytes, four merged tokens, an end-of-text.
hf::BpeVocab tiny_bpe() {
  hf::BpeVocab v = hf::byte_level_vocab();
  const std::string G = hf::byte_token(' ');  // "Ġ"
  v.merges = {"h e", "l l", "he ll", G + " w"};
  for (const std::string& t : std::vector<std::string>{"he", "ll", "hell", G + "w"}) {
    v.tokens.push_back(t);
    v.token_types.push_back(hf::TokenType::normal);
  }
  v.tokens.push_back("<|endoftext|>");
  v.token_types.push_back(hf::TokenType::control);
  v.eos = 260;
  return v;
}

nn::LmConfig random_config() {
  nn::LmConfig c;
  c.vocab = 261;
  c.d_model = 64;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 128;
  c.max_seq = 64;
  return c;
}

const std::vector<int> prompt = nn::ByteTokenizer::encode("grad -> GGUF");
constexpr std::size_t steps = 24;

}  // namespace

TEST_CASE("F32: llama.cpp greedy-decodes grad's random model token for token; its tokenizer reads the merges") {
  ScratchDir dir("llama_cpp");
  Tape<float> tp;
  nn::Lm<float> m(tp, random_config(), 11);
  const std::string path = dir.file("random_f32.gguf");
  REQUIRE(hf::write_gguf(path, m, tiny_bpe()).ok());
  const auto [ours, our_logprobs] = grad_decode(m, prompt, steps);
  const LlamaRun llama = llama_decode(path, prompt, steps, "f32", "hello world\n");
  CHECK_SAME_IDS(llama.tokens, ours);
  {  // grad reading the file llama.cpp read: the same continuation and tokenization
    Tape<float> tq;
    auto g = hf::load_gguf(path, tq);
    CHECK_SAME_IDS(llama.tokens, grad_decode(g.model, prompt, steps).first);
    REQUIRE_MESSAGE(g.tokenizer.has_value(), g.tokenizer_problem);
    CHECK_SAME_IDS(llama.tokenized, g.tokenizer->encode("hello world\n"));
  }
  const double diff = max_logprob_diff(our_logprobs, llama.logprobs);
  MESSAGE("F32, " << steps << " greedy tokens: first-step log-probabilities differ by at most " << diff);
  CHECK(diff < 1e-4);
  // "hello" -> "hell" "o" (h e -> he, l l -> ll, he ll -> hell), " world" -> "Ġw" o r l d, "\n" -> byte 10.
  CHECK_SAME_IDS(llama.tokenized, (std::vector<int>{258, 'o', 259, 'o', 'r', 'l', 'd', '\n'}));
  // llama.cpp's default KV cache is F16 (rounded keys and values): the same tokens here.
  const LlamaRun f16_cache = llama_decode(path, prompt, steps, "f16");
  CHECK_SAME_IDS(f16_cache.tokens, ours);
  MESSAGE("F32 weights, F16 KV cache: log-probabilities differ by at most "
          << max_logprob_diff(our_logprobs, f16_cache.logprobs));
}

TEST_CASE("F16: llama.cpp on the F16 file decodes as grad does on the F16-rounded weights") {
  ScratchDir dir("llama_cpp");
  Tape<float> tp;
  nn::Lm<float> m(tp, random_config(), 12);
  const std::string path = dir.file("random_f16.gguf");
  REQUIRE(hf::write_gguf(path, m, tiny_bpe(), {.type = hf::GgufType::f16}).ok());
  hf::round_like_gguf(m, hf::GgufType::f16);
  const auto [ours, our_logprobs] = grad_decode(m, prompt, steps);
  const LlamaRun llama = llama_decode(path, prompt, steps);
  CHECK_SAME_IDS(llama.tokens, ours);
  {  // the F16 file read back into an f16 base (its bits) decodes as llama.cpp does
    Tape<float> tq;
    auto g = hf::load_gguf(path, tq, nn::Lm<float>::Train::none, {.base_storage = Storage::f16});
    CHECK_SAME_IDS(llama.tokens, grad_decode(g.model, prompt, steps).first);
  }
  // llama.cpp also rounds the activations to F16 before an F16 matrix product.
  const double diff = max_logprob_diff(our_logprobs, llama.logprobs);
  MESSAGE("F16, " << steps << " greedy tokens: first-step log-probabilities differ by at most " << diff);
  CHECK(diff < 1e-2);
}

TEST_CASE("tied: without a head tensor llama.cpp computes the logits with the embedding, as grad with head = embed^T") {
  ScratchDir dir("llama_cpp");
  Tape<float> tp;
  const nn::LmConfig c = random_config();
  nn::Lm<float> m(tp, c, 13);
  // grad's Lm has its own head; tie it by hand: head [d, vocab] = embed [vocab, d] transposed.
  const auto embed = tp.value(m.embed()).data;
  const std::span<float> head = tp.leaf_value(m.head());
  for (std::size_t v = 0; v < c.vocab; ++v)
    for (std::size_t k = 0; k < c.d_model; ++k) head[k * c.vocab + v] = embed[v * c.d_model + k];
  std::vector<hf::LmTensor> tensors;
  for (const auto& p : m.base()) {
    if (p.name == "head") continue;
    const View<float> v = tp.value(p.var);
    tensors.push_back({p.name, std::vector<std::size_t>(v.shape.begin(), v.shape.end()), v.data});
  }
  const std::string path = dir.file("tied.gguf");
  REQUIRE(hf::write_gguf(path, c, tensors, tiny_bpe()).ok());
  const auto [ours, our_logprobs] = grad_decode(m, prompt, steps);
  const LlamaRun llama = llama_decode(path, prompt, steps);
  CHECK_SAME_IDS(llama.tokens, ours);
  const double diff = max_logprob_diff(our_logprobs, llama.logprobs);
  MESSAGE("tied, " << steps << " greedy tokens: first-step log-probabilities differ by at most " << diff);
  CHECK(diff < 1e-4);
}

TEST_CASE("a LoRA-finetuned, merged model recalls its text under llama.cpp as under grad") {
  const std::string text = "llama.cpp serves what grad trained: LoRA, merged, in GGUF.";
  const std::vector<int> tokens = nn::ByteTokenizer::encode(text);
  nn::LmConfig c;
  c.vocab = 257;
  c.d_model = 16;
  c.layers = 2;
  c.heads = 2;
  c.kv_heads = 1;
  c.ffn = 32;
  c.max_seq = 64;
  c.lora_rank = 8;
  c.lora_scale = 2.0;
  Tape<float> tp;
  nn::Lm<float> m(tp, c, 31, nn::Lm<float>::Train::lora);
  Adam<float> opt(0.02f);
  for (const auto& p : m.trainable()) opt.add(p.var);
  const std::size_t n = tokens.size() - 1, prompt_bytes = 16;
  const std::span<const int> all(tokens);
  const std::vector<int> rest(tokens.begin() + prompt_bytes, tokens.end());
  auto recalled = [&](const nn::Lm<float>& model) {
    return grad_decode(model, all.first(prompt_bytes), rest.size()).first;
  };
  const auto mark = tp.mark();
  int step = 0;
  for (; step < 600; ++step) {
    auto r = m.forward(m.ids(all.first(n), 1, n), m.ids(all.subspan(1, n), n, 0));
    REQUIRE(tp.backward(r.loss));
    REQUIRE(opt.step());
    tp.reset_to(mark);
    if (step % 20 == 19 && recalled(m) == rest) break;
  }
  REQUIRE(recalled(m) == rest);
  nn::LmConfig b = c;
  b.lora_rank = 0;
  Tape<float> tp2;
  nn::Lm<float> merged(tp2, b, 1);
  nn::merge_lora(m, merged);
  REQUIRE(recalled(merged) == rest);
  ScratchDir dir("llama_cpp");
  const std::string f32 = dir.file("recall_f32.gguf"), f16 = dir.file("recall_f16.gguf");
  REQUIRE(hf::write_gguf(f32, merged, hf::byte_level_vocab({"<|endoftext|>"})).ok());
  REQUIRE(hf::write_gguf(f16, merged, hf::byte_level_vocab({"<|endoftext|>"}), {.type = hf::GgufType::f16}).ok());
  const LlamaRun a = llama_decode(f32, all.first(prompt_bytes), rest.size());
  const LlamaRun h = llama_decode(f16, all.first(prompt_bytes), rest.size(), "f16");
  CHECK_SAME_IDS(a.tokens, rest);
  CHECK_SAME_IDS(h.tokens, rest);
  // Unmerged: the untouched base (the same seed) and the adapters as llama.cpp's LoRA adapter file.
  Tape<float> tp3;
  const nn::Lm<float> base(tp3, b, 31);
  REQUIRE(recalled(base) != rest);
  const std::string base_file = dir.file("recall_base.gguf"), adapter = dir.file("recall_adapter.gguf");
  REQUIRE(hf::write_gguf(base_file, base, hf::byte_level_vocab({"<|endoftext|>"})).ok());
  const ModelFileResult written = hf::write_lora_gguf(adapter, m);
  REQUIRE_MESSAGE(written.ok(), written.error);
  const LlamaRun with_adapter = llama_decode(base_file, all.first(prompt_bytes), rest.size(), "f32", "", adapter);
  CHECK_SAME_IDS(with_adapter.tokens, rest);
  MESSAGE("recalled after " << step + 1 << " LoRA steps; llama.cpp's continuation of '" << text.substr(0, prompt_bytes)
                            << "' checked from the F32 file, from the F16 file (F16 KV cache), and from the base "
                               "file with the LoRA adapter file");
}

TEST_CASE("a LoRA adapter file on the base file: llama.cpp decodes as grad's LoRA model and as the merged file") {
  // Random adapters on every projection, large enough to change what the
  // model says; qwen2, and llama (heads of their own width: q's and k's
  // lora_b rows permuted as the base's), adapters in F32 and F16, and the
  // F32 adapter on a Q4_0 base.
  for (const std::size_t head_width : {std::size_t{0}, std::size_t{32}}) {
    CAPTURE(head_width);
    nn::LmConfig c = random_config();
    c.head_width = head_width;
    c.lora_rank = 4;
    c.lora_scale = 1.5;
    Tape<float> tp;
    nn::Lm<float> m(tp, c, 17, nn::Lm<float>::Train::lora);
    randomize_adapters(tp, m, 18, -0.3, 0.3);
    nn::LmConfig b = c;
    b.lora_rank = 0;
    Tape<float> tb, tm;
    nn::Lm<float> base(tb, b, 17), merged(tm, b, 1);
    nn::merge_lora(m, merged);
    const auto [ours, our_logprobs] = grad_decode(m, prompt, steps);
    REQUIRE(grad_decode(base, prompt, steps).first != ours);  // the adapters matter
    ScratchDir dir("llama_cpp");
    const std::string base_file = dir.file("base.gguf"), merged_file = dir.file("merged.gguf");
    REQUIRE(hf::write_gguf(base_file, base, tiny_bpe()).ok());
    REQUIRE(hf::write_gguf(merged_file, merged, tiny_bpe()).ok());
    const LlamaRun from_merged = llama_decode(merged_file, prompt, steps);
    CHECK_SAME_IDS(from_merged.tokens, ours);
    for (const hf::GgufType type : {hf::GgufType::f32, hf::GgufType::f16}) {
      const bool half = type == hf::GgufType::f16;
      CAPTURE(half);
      const std::string adapter = dir.file(half ? "adapter_f16.gguf" : "adapter.gguf");
      const ModelFileResult written = hf::write_lora_gguf(adapter, m, {.type = type});
      REQUIRE_MESSAGE(written.ok(), written.error);
      std::vector<int> expected = ours;
      std::vector<double> expected_logprobs = our_logprobs;
      if (half) {  // grad on the F16-rounded adapters
        Tape<float> th;
        nn::Lm<float> rounded(th, c, 17, nn::Lm<float>::Train::lora);
        for (const auto& p : m.adapters()) {
          const auto from = tp.value(p.var).data;
          const auto to = th.leaf_value(rounded.tensor(p.name));
          for (std::size_t i = 0; i < from.size(); ++i) to[i] = hf::round_to_f16(from[i]);
        }
        std::tie(expected, expected_logprobs) = grad_decode(rounded, prompt, steps);
      }
      const LlamaRun llama = llama_decode(base_file, prompt, steps, "f32", "", adapter);
      CHECK_SAME_IDS(llama.tokens, expected);
      const double diff = max_logprob_diff(expected_logprobs, llama.logprobs);
      MESSAGE(hf::gguf_architecture(c) << " base + " << (half ? "F16" : "F32") << " LoRA adapter (rank 4, scale 1.5), "
                                       << steps << " greedy tokens: log-probabilities differ by at most " << diff
                                       << " (merged file: " << max_logprob_diff(our_logprobs, from_merged.logprobs)
                                       << ")");
      // llama.cpp rounds the activations to F16 before an F16 matrix product (the F16 adapter's A x).
      CHECK(diff < (half ? 1e-2 : 1e-4));
    }
    // A quantized base (Q4_0) under the F32 adapter: grad's LoRA model on
    // the dequantized base (llama.cpp rounds activations too: close, not the same bits).
    const std::string q_base = dir.file("base_q4_0.gguf"), adapter = dir.file("adapter.gguf");
    REQUIRE(hf::write_gguf(q_base, base, tiny_bpe(), {.type = hf::GgufType::q4_0}).ok());
    const auto f32_positions = grad_position_logprobs(m, prompt);
    hf::round_like_gguf(m, hf::GgufType::q4_0);  // the base's matrices; the adapters are no base tensors
    const auto q_positions = grad_position_logprobs(m, prompt);
    const std::vector<int> q_tokens = grad_decode(m, prompt, steps).first;
    const LlamaRun llama = llama_decode(q_base, prompt, steps, "f32", "", adapter, true);
    const double to_dequantized = max_position_diff(q_positions, llama.position);
    const double to_f32 = max_position_diff(f32_positions, llama.position);
    MESSAGE(hf::gguf_architecture(c) << " Q4_0 base + F32 LoRA adapter: teacher-forced log-probabilities over "
                                     << prompt.size() << " positions: llama.cpp vs grad on the dequantized base "
                                     << to_dequantized << ", vs grad's F32 base " << to_f32
                                     << "; greedy tokens agreeing " << agreeing(llama.tokens, q_tokens) << " of "
                                     << steps);
    CHECK(to_dequantized < 0.1);
    CHECK(to_dequantized < to_f32);
  }
}

TEST_CASE("LoRA on a quantized base (Storage::q8_0): the held blocks as the base file, the adapters beside it") {
  // grad trains adapters over a base held in llama.cpp's Q8_0 blocks; the
  // base file copies those blocks, so llama.cpp's weights are grad's
  // (llama.cpp still rounds activations to Q8_0 in its products).
  nn::LmConfig c = random_config();
  c.lora_rank = 4;
  c.lora_scale = 1.5;
  Tape<float> tp;
  nn::Lm<float> m(tp, c, 19, nn::Lm<float>::Train::lora, Storage::q8_0);
  randomize_adapters(tp, m, 20, -0.3, 0.3);
  nn::LmConfig b = c;
  b.lora_rank = 0;
  Tape<float> tb;
  const nn::Lm<float> base(tb, b, 19, nn::Lm<float>::Train::none, Storage::q8_0);  // the same blocks
  REQUIRE(std::ranges::equal(tb.leaf_blocks(base.tensor("layers.1.v")), tp.leaf_blocks(m.tensor("layers.1.v"))));
  ScratchDir dir("llama_cpp");
  const std::string base_file = dir.file("base_q8_0.gguf"), adapter = dir.file("adapter.gguf");
  REQUIRE(hf::write_gguf(base_file, base, tiny_bpe(), {.type = hf::GgufType::q8_0}).ok());
  REQUIRE(hf::write_lora_gguf(adapter, m).ok());
  const auto ours = grad_position_logprobs(m, prompt);
  const std::vector<int> our_tokens = grad_decode(m, prompt, steps).first;
  REQUIRE(grad_decode(base, prompt, steps).first != our_tokens);  // the adapters matter
  const LlamaRun llama = llama_decode(base_file, prompt, steps, "f32", "", adapter, true);
  const double diff = max_position_diff(ours, llama.position);
  MESSAGE("Q8_0-held base + F32 LoRA adapter: teacher-forced log-probabilities over "
          << prompt.size() << " positions differ by at most " << diff << "; greedy tokens agreeing "
          << agreeing(llama.tokens, our_tokens) << " of " << steps);
  CHECK(diff < 0.1);
}

TEST_CASE("quantized files: llama.cpp serves q8_0, q4_0 and q4_k_m as grad computes on the dequantized weights") {
  // Rows of whole Q4_K blocks (d_model 256, ffn 512), three layers: the
  // Q4_K_M mix has q4_K, q6_K (head, layer 2's attn_v and ffn_down).
  nn::LmConfig c = random_config();
  c.d_model = 256;
  c.ffn = 512;
  c.layers = 3;
  c.qkv_bias = true;
  Tape<float> tp;
  nn::Lm<float> m(tp, c, 51);
  randomize_biases(tp, m, 52, -0.5, 0.5);
  // Teacher-forced over a text, then 24 greedy tokens after it.
  const std::vector<int> text = nn::ByteTokenizer::encode("grad -> GGUF, quantized: q8_0 q4_0 q4_K_M");
  const auto f32_positions = grad_position_logprobs(m, text);
  const std::vector<int> f32_tokens = grad_decode(m, text, steps).first;
  ScratchDir dir("llama_cpp");
  {  // the unquantized file: llama.cpp computes what grad does
    const std::string path = dir.file("f32.gguf");
    REQUIRE(hf::write_gguf(path, m, tiny_bpe()).ok());
    const LlamaRun llama = llama_decode(path, text, steps, "f32", "", "", true);
    CHECK_SAME_IDS(llama.tokens, f32_tokens);
    MESSAGE("F32 (d_model 256): teacher-forced log-probabilities over "
            << text.size() << " positions differ by at most " << max_position_diff(f32_positions, llama.position));
  }
  for (const hf::GgufType type : {hf::GgufType::q8_0, hf::GgufType::q4_0, hf::GgufType::q4_k_m}) {
    const std::string name(hf::gguf_type_name(type));
    CAPTURE(name);
    const std::string path = dir.file(name + ".gguf");
    const ModelFileResult written = hf::write_gguf(path, m, tiny_bpe(), {.type = type});
    REQUIRE_MESSAGE(written.ok(), written.error);
    // grad on the file's weights: each matrix quantized and dequantized exactly.
    Tape<float> tq;
    nn::Lm<float> q(tq, c, 51);
    randomize_biases(tq, q, 52, -0.5, 0.5);
    hf::round_like_gguf(q, type);
    const auto q_positions = grad_position_logprobs(q, text);
    const std::vector<int> q_tokens = grad_decode(q, text, steps).first;
    const LlamaRun llama = llama_decode(path, text, steps, "f32", "", "", true);
    // llama.cpp rounds the activations too (to Q8_0 or Q8_K blocks in its
    // quantized dot products): close to grad on the dequantized weights, not
    // the same bits; the weights' own rounding is the larger difference.
    const double to_dequantized = max_position_diff(q_positions, llama.position);
    const double to_f32 = max_position_diff(f32_positions, llama.position);
    const double weights = max_position_diff(f32_positions, q_positions);
    MESSAGE(name << " (" << std::filesystem::file_size(path) << " bytes): teacher-forced log-probabilities over "
                 << text.size() << " positions: llama.cpp vs grad on the dequantized weights " << to_dequantized
                 << ", vs grad's F32 model " << to_f32 << " (grad dequantized vs F32: " << weights
                 << "); greedy tokens agreeing with grad dequantized " << agreeing(llama.tokens, q_tokens) << " of "
                 << steps << ", with grad F32 " << agreeing(llama.tokens, f32_tokens));
    CHECK(to_dequantized < 0.1);
    if (type != hf::GgufType::q8_0) CHECK(to_dequantized < to_f32);  // q4: the weights' rounding dominates
  }
}

TEST_CASE("a quantized llama file (q and k rows permuted, then quantized) is served as grad computes it") {
  nn::LmConfig c = random_config();
  c.d_model = 256;
  c.ffn = 512;
  c.layers = 2;
  c.head_width = 128;  // 4 heads of 128 over d_model 256: llama.cpp's llama
  Tape<float> tp;
  nn::Lm<float> m(tp, c, 53);
  ScratchDir dir("llama_cpp");
  const std::string path = dir.file("llama_q4_k_m.gguf");
  const ModelFileResult written = hf::write_gguf(path, m, tiny_bpe(), {.type = hf::GgufType::q4_k_m});
  REQUIRE_MESSAGE(written.ok(), written.error);
  REQUIRE(hf::gguf_architecture(c) == "llama");
  const std::vector<int> f32_tokens = grad_decode(m, prompt, steps).first;
  const auto f32_positions = grad_position_logprobs(m, prompt);
  hf::round_like_gguf(m, hf::GgufType::q4_k_m);
  const std::vector<int> q_tokens = grad_decode(m, prompt, steps).first;
  const auto q_positions = grad_position_logprobs(m, prompt);
  const LlamaRun llama = llama_decode(path, prompt, steps, "f32", "", "", true);
  const double to_dequantized = max_position_diff(q_positions, llama.position);
  const double to_f32 = max_position_diff(f32_positions, llama.position);
  MESSAGE("llama q4_k_m: teacher-forced log-probabilities over "
          << prompt.size() << " positions: llama.cpp vs grad "
          << "on the dequantized weights " << to_dequantized << ", vs grad's F32 model " << to_f32
          << "; greedy tokens agreeing with grad dequantized " << agreeing(llama.tokens, q_tokens) << " of " << steps
          << ", with grad F32 " << agreeing(llama.tokens, f32_tokens));
  CHECK(to_dequantized < 0.1);
  CHECK(to_dequantized < to_f32);
}

namespace {

// A byte-level BPE tokenizer.json with `count` merges learned from `text`:
// the byte symbols as ids 0 .. 255, each merge's token next, then
// <|endoftext|> (special). The words are pieces as Qwen2's pattern splits
// them (a leading space joins the letters after it), so the merges apply.
std::string learned_tokenizer_json(const std::string& text, std::size_t count) {
  using json = nlohmann::json;
  std::vector<std::vector<std::string>> words;  // each piece as its symbols
  for (std::size_t i = 0; i < text.size();) {
    std::size_t j = i + 1;
    auto letter = [&](std::size_t k) { return k < text.size() && std::isalpha(static_cast<unsigned char>(text[k])); };
    if (letter(i) || (text[i] == ' ' && letter(i + 1)))
      while (letter(j)) ++j;
    std::vector<std::string> w;
    for (std::size_t k = i; k < j; ++k) w.push_back(hf::byte_to_symbol(static_cast<unsigned char>(text[k])));
    words.push_back(std::move(w));
    i = j;
  }
  json vocab = json::object(), merges = json::array();
  for (int b = 0; b < 256; ++b) vocab[hf::byte_to_symbol(static_cast<unsigned char>(b))] = b;
  for (std::size_t m = 0; m < count; ++m) {
    std::map<std::pair<std::string, std::string>, int> pairs;
    for (const auto& w : words)
      for (std::size_t k = 0; k + 1 < w.size(); ++k) ++pairs[{w[k], w[k + 1]}];
    const auto best = std::max_element(pairs.begin(), pairs.end(),  // the most frequent; the first of a tie
                                       [](const auto& a, const auto& b) { return a.second < b.second; });
    if (best == pairs.end() || best->second < 2) break;
    const auto [left, right] = best->first;
    merges.push_back(left + " " + right);
    vocab[left + right] = vocab.size();
    for (auto& w : words)
      for (std::size_t k = 0; k + 1 < w.size(); ++k)
        if (w[k] == left && w[k + 1] == right) w.erase(w.begin() + k + 1), w[k] = left + right;
  }
  const std::string qwen2_pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  return json{
      {"version", "1.0"},
      {"added_tokens", {{{"id", vocab.size()}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "Split"}, {"pattern", {{"Regex", qwen2_pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"vocab", vocab}, {"merges", merges}}}}
      .dump(1);
}

}  // namespace

TEST_CASE(
    "end to end: a Qwen2 Hugging Face directory, LoRA-finetuned in grad, served by llama.cpp with its tokenizer") {
  // The text the model learns; its first tokens are the prompt. (No quote: --tokenize takes it in quotes.)
  const std::string text = "grad tunes the Qwen2 model, then llama.cpp greedily recalls the tuned text.";
  ScratchDir dir("llama_cpp");
  const std::string source = dir.file("qwen2"), saved = dir.file("merged"), gguf = dir.file("merged.gguf");
  std::filesystem::create_directories(source);
  std::ofstream(source + "/tokenizer.json") << learned_tokenizer_json(text + " " + text, 24);
  const hf::Tokenizer tok = hf::Tokenizer::from_file(source + "/tokenizer.json");
  const std::vector<int> ids = tok.encode(text);
  REQUIRE(ids.size() < text.size());  // the merges apply
  REQUIRE(tok.decode(ids) == text);

  // The checkpoint: random weights and q/k/v biases, three embedding rows
  // more than the tokenizer's ids (checkpoints pad theirs), as
  // save_pretrained lays out Qwen2 (test_hf checks that layout against
  // PyTorch's): config.json and model.safetensors.
  nn::LmConfig c;
  c.vocab = tok.vocab_size() + 3;
  c.d_model = 32;
  c.layers = 2;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 64;
  c.max_seq = 64;
  c.qkv_bias = true;
  {
    Tape<float> tp;
    nn::Lm<float> random(tp, c, 41);
    randomize_biases(tp, random, 42, -0.5, 0.5);
    hf::save_pretrained(source, random);
  }

  // grad loads it with adapters and finetunes them until greedy decoding recalls the text.
  const hf::ModelInfo info = hf::read_config(source);
  REQUIRE(info.architecture == hf::Architecture::qwen2);
  REQUIRE(info.config.qkv_bias);
  Tape<float> tp;
  nn::Lm<float> m(tp, hf::with_adapters(info.config, {8, 16.0, nn::all_projections}), 3, nn::Lm<float>::Train::lora);
  hf::load_weights(source, m);
  const std::size_t prompt_tokens = 4, n = ids.size() - 1;
  const std::span<const int> all(ids), prompt = all.first(prompt_tokens);
  const std::vector<int> rest(ids.begin() + prompt_tokens, ids.end());
  auto recalled = [&](const nn::Lm<float>& model) { return grad_decode(model, prompt, rest.size()).first; };
  REQUIRE(recalled(m) != rest);  // the random model does not know the text yet
  Adam<float> opt(0.02f);
  for (const auto& p : m.trainable()) opt.add(p.var);
  const auto mark = tp.mark();
  int step = 0;
  for (; step < 600; ++step) {
    auto r = m.forward(m.ids(all.first(n), 1, n), m.ids(all.subspan(1, n), n, 0));
    REQUIRE(tp.backward(r.loss));
    REQUIRE(opt.step());
    tp.reset_to(mark);
    if (step % 20 == 19 && recalled(m) == rest) break;
  }
  REQUIRE(recalled(m) == rest);

  // Merged, saved as a Hugging Face directory (the tokenizer copied), loaded back.
  Tape<float> tm;
  nn::Lm<float> merged(tm, info.config, 1);
  nn::merge_lora(m, merged);
  hf::SaveOptions save;
  save.copy_from = source;
  hf::save_pretrained(saved, merged, save);
  Tape<float> tr;
  nn::Lm<float> reloaded(tr, hf::read_config(saved).config, 2);
  hf::load_weights(saved, reloaded);
  REQUIRE(recalled(reloaded) == rest);

  // Exported with the saved directory's tokenizer; llama.cpp continues the same prompt ids.
  const hf::Tokenizer saved_tok = hf::Tokenizer::from_file(saved + "/tokenizer.json");
  const ModelFileResult written = hf::write_gguf(gguf, reloaded, hf::bpe_vocab(saved_tok, c.vocab));
  REQUIRE_MESSAGE(written.ok(), written.error);
  // Tokenized too: the text, then its words run together (long pieces, where merges compete by rank).
  std::string run_together = text;
  std::erase(run_together, ' ');
  const std::string probe = text + " " + run_together;
  const LlamaRun llama = llama_decode(gguf, prompt, rest.size(), "f32", probe);
  CHECK_SAME_IDS(llama.tokens, rest);
  // llama.cpp's own tokenizer (qwen2's pattern, the exported merges) splits the texts as grad's.
  CHECK_SAME_IDS(llama.tokenized, tok.encode(probe));
  MESSAGE("recalled after " << step + 1 << " LoRA steps; " << ids.size() << " tokens of " << tok.vocab_size() << " ("
                            << saved_tok.merges().size() << " merges); llama.cpp continued '"
                            << tok.decode(std::vector<int>(prompt.begin(), prompt.end())) << "' with '"
                            << tok.decode(llama.tokens) << "'");
}

TEST_CASE("a model with a head width of its own (Llama's head_dim) is served as llama.cpp's llama, token for token") {
  // 4 heads of 32 = 128 wide over d_model 64: llama.cpp's qwen2 refuses such
  // a file (attn_q.weight has wrong shape); its llama rotates adjacent pairs,
  // so the writer reorders q's and k's rows (and biases) within each head.
  for (const bool bias : {false, true}) {
    CAPTURE(bias);
    nn::LmConfig c = random_config();
    c.head_width = 32;
    c.qkv_bias = bias;
    Tape<float> tp;
    nn::Lm<float> m(tp, c, 14);
    randomize_biases(tp, m, 15, -0.5, 0.5);
    ScratchDir dir("llama_cpp");
    const std::string path = dir.file(bias ? "head_dim_bias.gguf" : "head_dim.gguf");
    const ModelFileResult written = hf::write_gguf(path, m, tiny_bpe());
    REQUIRE_MESSAGE(written.ok(), written.error);
    REQUIRE(hf::gguf_architecture(c) == "llama");
    const auto [ours, our_logprobs] = grad_decode(m, prompt, steps);
    const LlamaRun llama = llama_decode(path, prompt, steps);
    CHECK_SAME_IDS(llama.tokens, ours);
    const double diff = max_logprob_diff(our_logprobs, llama.logprobs);
    MESSAGE("head_dim 32 x 4 heads over d_model 64" << std::string(bias ? ", q/k/v biases" : "") << ", " << steps
                                                    << " greedy tokens: log-probabilities differ by at most " << diff);
    CHECK(diff < 1e-4);
    Tape<float> tq;  // read back: q/k rows out of llama.cpp's order again, the same continuation
    auto g = hf::load_gguf(path, tq);
    CHECK(g.architecture == "llama");
    CHECK_SAME_IDS(llama.tokens, grad_decode(g.model, prompt, steps).first);
  }
}

namespace {

// A byte-level tokenizer.json: the 256 byte symbols, a token per merge
// (given as byte strings), <|endoftext|>, and `pre_tokenizer`.
std::string tokenizer_json(const std::vector<std::pair<std::string, std::string>>& merges,
                           const nlohmann::json& pre_tokenizer, bool ignore_merges = false) {
  using json = nlohmann::json;
  auto spell = [](const std::string& bytes) {
    std::string t;
    for (char ch : bytes) t += hf::byte_to_symbol(static_cast<unsigned char>(ch));
    return t;
  };
  json vocab = json::object(), list = json::array();
  for (int b = 0; b < 256; ++b) vocab[hf::byte_to_symbol(static_cast<unsigned char>(b))] = b;
  for (const auto& [l, r] : merges) {
    if (!vocab.contains(spell(l + r))) vocab[spell(l + r)] = vocab.size();
    list.push_back(spell(l) + " " + spell(r));
  }
  return json{
      {"version", "1.0"},
      {"added_tokens", {{{"id", vocab.size()}, {"content", "<|endoftext|>"}, {"special", true}}}},
      {"normalizer", nullptr},
      {"pre_tokenizer", pre_tokenizer},
      {"post_processor", nullptr},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"}, {"dropout", nullptr}, {"vocab", vocab}, {"merges", list}, {"ignore_merges", ignore_merges}}}}
      .dump();
}

}  // namespace

TEST_CASE("llama.cpp splits text as grad does under GPT-2's and Llama 3's pre-tokenizers (tokenizer.ggml.pre)") {
  using json = nlohmann::json;
  auto byte_level = [](bool use_regex) {
    return json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", use_regex}};
  };
  const std::string llama3_pattern =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  // Merges that join a space to digits and digits to digits: GPT-2 keeps " 2007"
  // one piece, Llama 3 cuts digits in threes, Qwen2 (what was always written) one by one.
  const std::vector<std::pair<std::string, std::string>> merges = {{"G", "P"},   {"GP", "L"},   {" ", "2"}, {" 2", "0"},
                                                                   {" 20", "0"}, {" 200", "7"}, {"2", "0"}, {"20", "0"},
                                                                   {"1", "2"},   {"12", "3"},   {"4", "5"}};
  struct Case {
    const char* name;
    json pre;
    bool ignore_merges;
    const char* llama_cpp_name;
  };
  const Case cases[] = {
      {"GPT-2", byte_level(true), false, "gpt-2"},
      {"Llama 3",
       json{
           {"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"}, {"pattern", {{"Regex", llama3_pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
             byte_level(false)}}},
       true, "llama-bpe"}};
  const std::string text = "GPL 2007, 12345 and 2007\nGPL";
  for (const Case& k : cases) {
    CAPTURE(k.name);
    const hf::Tokenizer tok = hf::Tokenizer::from_json(tokenizer_json(merges, k.pre, k.ignore_merges));
    const hf::BpeVocab vocab = hf::bpe_vocab(tok);
    CHECK(vocab.pre == k.llama_cpp_name);
    nn::LmConfig c = random_config();
    c.vocab = tok.vocab_size();
    Tape<float> tp;
    nn::Lm<float> m(tp, c, 16);
    ScratchDir dir("llama_cpp");
    const std::string path = dir.file("pre.gguf");
    const ModelFileResult written = hf::write_gguf(path, m, vocab);
    REQUIRE_MESSAGE(written.ok(), written.error);
    const std::vector<int> ours = tok.encode(text);
    const LlamaRun llama = llama_decode(path, std::vector<int>{'G'}, 1, "f32", text);
    CHECK_SAME_IDS(llama.tokenized, ours);
    Tape<float> tq;  // the file's vocabulary read back: llama.cpp's split too
    auto g = hf::load_gguf(path, tq);
    REQUIRE_MESSAGE(g.tokenizer.has_value(), g.tokenizer_problem);
    CHECK_SAME_IDS(llama.tokenized, g.tokenizer->encode(text));
    MESSAGE(std::string(k.name) << "'s pre-tokenizer (\"" << vocab.pre << "\"): '" << text.substr(0, 8) << "...' in "
                                << ours.size() << " ids by grad and llama.cpp");
  }
}
