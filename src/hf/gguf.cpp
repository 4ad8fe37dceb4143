// GGUF v3 export of a grad::nn::Lm as llama.cpp's qwen2 or llama architecture
// (include/grad/hf/gguf.hpp has the tensor table and the rules).
#include "grad/hf/gguf.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_set>

namespace grad::hf {

// ---- F16 ----

std::uint16_t f16_bits(float x) {
  const std::uint32_t u = std::bit_cast<std::uint32_t>(x);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u | static_cast<std::uint16_t>((a >> 13) & 0x3ffu);  // NaN, kept quiet
  if (a >= 0x47800000u) return sign | 0x7c00u;  // >= 2^16 (and inf): beyond every half
  // The half as an integer count of its last place, before rounding: the
  // bits below it are dropped with round to nearest, ties to even. A carry
  // out of the mantissa lands in the exponent, which is right (up to inf).
  std::uint32_t kept, dropped, half;
  const std::uint32_t exponent = a >> 23;
  if (exponent >= 113) {  // a normal half (>= 2^-14): 13 of the 23 mantissa bits go
    kept = ((exponent - 112) << 10) | ((a & 0x7fffffu) >> 13);
    dropped = a & 0x1fffu;
    half = 0x1000u;
  } else {                            // a subnormal half (or zero): the value in units of 2^-24
    if (exponent < 102) return sign;  // below 2^-25: nearer zero than the least subnormal
    const std::uint32_t m = (a & 0x7fffffu) | 0x800000u;
    const std::uint32_t shift = 126 - exponent;  // 14 .. 24
    kept = m >> shift;
    dropped = m & ((1u << shift) - 1);
    half = 1u << (shift - 1);
  }
  if (dropped > half || (dropped == half && (kept & 1u) != 0)) ++kept;
  return sign | static_cast<std::uint16_t>(kept);
}

float f16_value(std::uint16_t bits) {
  const float sign = (bits & 0x8000u) != 0 ? -1.0f : 1.0f;
  const int exponent = (bits >> 10) & 0x1f;
  const int mantissa = bits & 0x3ff;
  if (exponent == 31)
    return mantissa == 0 ? sign * INFINITY
                         : std::bit_cast<float>(0x7fc00000u | (bits & 0x8000u) << 16 |
                                                static_cast<std::uint32_t>(mantissa) << 13);
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  return sign * std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
}

// ---- the tokenizer ----

namespace {
// GPT-2's bytes_to_unicode: the bytes that print as themselves.
bool prints_as_itself(unsigned b) { return (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || b >= 0xae; }
void append_utf8(std::string& s, std::uint32_t cp) {
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else {  // the map stays below U+0800: two bytes
    s += static_cast<char>(0xc0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3f));
  }
}
}  // namespace

std::string byte_token(unsigned char b) {
  std::uint32_t cp = b;
  if (!prints_as_itself(b)) {  // the n-th byte that does not print: U+0100 + n
    cp = 256;
    for (unsigned c = 0; c < b; ++c) cp += prints_as_itself(c) ? 0 : 1;
  }
  std::string s;
  append_utf8(s, cp);
  return s;
}

BpeVocab byte_level_vocab(std::span<const std::string> specials) {
  BpeVocab v;
  for (unsigned b = 0; b < 256; ++b) {
    v.tokens.push_back(byte_token(static_cast<unsigned char>(b)));
    v.token_types.push_back(TokenType::normal);
  }
  for (const std::string& s : specials) {
    v.tokens.push_back(s);
    v.token_types.push_back(TokenType::control);
  }
  if (!specials.empty()) v.eos = 256;
  return v;
}

namespace {
// The Split patterns llama.cpp knows by these names (its llama-vocab.cpp's
// regexes for LLAMA_VOCAB_PRE_TYPE_GPT2, _QWEN2 and _LLAMA3), as
// tokenizer.json files spell them.
constexpr std::string_view gpt2_split = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view qwen2_split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view llama3_split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::string describe(const PreTokenizerStep& s) {
  if (s.kind == PreTokenizerStep::Kind::byte_level)
    return std::string("ByteLevel(add_prefix_space ") + (s.add_prefix_space ? "true" : "false") + ", use_regex " +
           (s.use_regex ? "true" : "false") + ")";
  std::string pattern = s.pattern.size() > 120 ? s.pattern.substr(0, 120) + "..." : s.pattern;
  return "Split(" + std::string(s.regex ? "Regex" : "String") + " \"" + pattern + "\", " + s.behavior +
         (s.invert ? ", inverted)" : ")");
}
}  // namespace

std::string llama_cpp_pre(const Tokenizer& tokenizer) {
  using Kind = PreTokenizerStep::Kind;
  const std::vector<PreTokenizerStep> steps = tokenizer.pre_tokenizer();
  auto plain_byte_level = [](const PreTokenizerStep& s, bool use_regex) {
    return s.kind == Kind::byte_level && !s.add_prefix_space && s.use_regex == use_regex;
  };
  // GPT-2's: ByteLevel with its own pattern.
  if (steps.size() == 1 && plain_byte_level(steps[0], true)) return "gpt-2";
  // A Split on a known pattern (Isolated), then ByteLevel without a pattern.
  if (steps.size() == 2 && plain_byte_level(steps[1], false) && steps[0].kind == Kind::split && steps[0].regex &&
      steps[0].behavior == "Isolated" && !steps[0].invert) {
    if (steps[0].pattern == gpt2_split) return "gpt-2";
    if (steps[0].pattern == qwen2_split) return "qwen2";
    if (steps[0].pattern == llama3_split) return "llama-bpe";
  }
  std::string what;
  for (const PreTokenizerStep& s : steps) what += (what.empty() ? "" : ", ") + describe(s);
  throw TokenizerError("grad::hf: the tokenizer's pre-tokenizer [" + (what.empty() ? "none" : what) +
                       "] is none that GGUF names here (GPT-2's ByteLevel, or a Split on GPT-2's, Qwen2's or "
                       "Llama 3's pattern then ByteLevel: llama.cpp's \"gpt-2\", \"qwen2\", \"llama-bpe\"); "
                       "llama.cpp would split text differently: name llama.cpp's pre-tokenizer yourself "
                       "(hf::bpe_vocab's `pre`) if you know it");
}

BpeVocab bpe_vocab(const Tokenizer& tokenizer, std::size_t vocab, std::string_view pre) {
  BpeVocab v;
  v.pre = pre.empty() ? llama_cpp_pre(tokenizer) : std::string(pre);
  const std::size_t n = std::max(vocab, tokenizer.vocab_size());
  v.tokens.reserve(n);
  v.token_types.reserve(n);
  for (std::size_t i = 0; i < n; ++i) {
    const int id = static_cast<int>(i);
    const std::optional<std::string> t = tokenizer.id_to_token(id);
    v.tokens.push_back(t ? *t : "[PAD" + std::to_string(i) + "]");
    v.token_types.push_back(!t                         ? TokenType::unused
                            : tokenizer.is_special(id) ? TokenType::control
                            : tokenizer.is_added(id)   ? TokenType::user_defined
                                                       : TokenType::normal);
  }
  for (const auto& [left, right] : tokenizer.merges()) v.merges.push_back(left + " " + right);
  auto first_added = [&](std::initializer_list<std::string_view> names) -> std::optional<std::uint32_t> {
    for (std::string_view name : names)
      if (const auto id = tokenizer.token_to_id(name); id && tokenizer.is_added(*id)) return std::uint32_t(*id);
    return std::nullopt;
  };
  v.eos = first_added({"<|endoftext|>", "<|end_of_text|>", "</s>"});
  v.bos = first_added({"<|begin_of_text|>", "<s>"});
  // A template that puts bos before the text (Llama 3's): llama.cpp adds it too.
  const std::vector<int> around = tokenizer.encode("", true);
  v.add_bos = v.bos && around.size() == 1 && std::uint32_t(around[0]) == *v.bos;
  return v;
}

std::string check_vocab(const BpeVocab& v, std::size_t vocab) {
  auto n = [](std::size_t x) { return std::to_string(x); };
  if (v.tokens.size() != vocab)
    return "the tokenizer has " + n(v.tokens.size()) + " tokens, the model's vocabulary " + n(vocab) +
           " (expected one token per id)";
  std::map<std::string_view, std::size_t> seen;  // llama.cpp maps texts to ids: each text once
  for (std::size_t i = 0; i < v.tokens.size(); ++i) {
    if (v.tokens[i].empty()) return "token " + n(i) + " is empty (expected its text)";
    if (const auto [it, fresh] = seen.emplace(v.tokens[i], i); !fresh)
      return "token " + n(i) + " has the text of token " + n(it->second) + " (expected unique texts)";
  }
  if (!v.token_types.empty() && v.token_types.size() != v.tokens.size())
    return n(v.token_types.size()) + " token types for " + n(v.tokens.size()) + " tokens (expected one each, or none)";
  for (std::size_t i = 0; i < v.token_types.size(); ++i) {
    const auto t = static_cast<std::int32_t>(v.token_types[i]);
    if (t < 1 || t > 6) return "token " + n(i) + " has type " + std::to_string(t) + " (expected 1 .. 6)";
  }
  for (std::size_t i = 0; i < v.merges.size(); ++i) {
    const std::string& m = v.merges[i];
    // llama.cpp splits at the first space after the first byte.
    const std::size_t space = m.find(' ', 1);
    if (space == std::string::npos || space + 1 == m.size() || m.find(' ', space + 1) != std::string::npos)
      return "merge " + n(i) + " '" + m + "' is not two tokens joined by one space";
    const std::string left = m.substr(0, space), right = m.substr(space + 1);
    for (const std::string& t : {left, right, left + right})
      if (!seen.contains(t)) return "merge " + n(i) + " '" + m + "': '" + t + "' is not a token";
  }
  if (v.pre.empty()) return "no pre-tokenizer name (tokenizer.ggml.pre; Qwen2's is \"qwen2\")";
  const std::pair<const char*, const std::optional<std::uint32_t>*> ids[] = {
      {"bos", &v.bos}, {"eos", &v.eos}, {"pad", &v.pad}};
  for (const auto& [name, id] : ids)
    if (*id && **id >= vocab)
      return std::string(name) + " id " + n(**id) + " is not a token (expected < " + n(vocab) + ")";
  if (v.add_bos && !v.bos) return "add_bos without a bos id";
  return "";
}

Tokenizer bpe_tokenizer(const BpeVocab& v) {
  using nlohmann::json;
  auto fail = [](const std::string& why) -> Tokenizer {
    throw TokenizerError("grad::hf: GGUF tokenizer: " + why);
  };
  if (std::string why = check_vocab(v, v.tokens.size()); !why.empty()) return fail(why);
  const json byte_level_plain = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  auto split_then_bytes = [&](std::string_view pattern) {
    const json split = {{"type", "Split"},
                        {"pattern", {{"Regex", std::string(pattern)}}},
                        {"behavior", "Isolated"},
                        {"invert", false}};
    return json{{"type", "Sequence"}, {"pretokenizers", json::array({split, byte_level_plain})}};
  };
  json pre;
  bool ignore_merges = false;
  if (v.pre == "gpt-2") {
    pre = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  } else if (v.pre == "qwen2") {
    pre = split_then_bytes(qwen2_split);
  } else if (v.pre == "llama-bpe" || v.pre == "llama3" || v.pre == "llama-v3") {
    pre = split_then_bytes(llama3_split);
    ignore_merges = true;  // llama.cpp's LLAMA3 pre-tokenizer, as Llama 3's tokenizer.json
  } else {
    return fail("tokenizer.ggml.pre \"" + v.pre +
                "\" is a pre-tokenizer grad does not know (expected \"gpt-2\", \"qwen2\" or \"llama-bpe\" "
                "(\"llama3\", \"llama-v3\")): its split of text into pieces would be guessed");
  }
  json vocab = json::object(), added = json::array(), merges = json::array();
  for (std::size_t id = 0; id < v.tokens.size(); ++id) {
    const TokenType type = v.token_types.empty() ? TokenType::normal : v.token_types[id];
    if (type == TokenType::unused) continue;
    if (type == TokenType::control || type == TokenType::user_defined)
      added.push_back({{"id", id},
                       {"content", v.tokens[id]},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", type != TokenType::control},
                       {"special", type == TokenType::control}});
    else
      vocab[v.tokens[id]] = id;
  }
  for (const std::string& m : v.merges) {
    const std::size_t space = m.find(' ', 1);  // as llama.cpp splits it (check_vocab: one space, two tokens)
    merges.push_back(json::array({m.substr(0, space), m.substr(space + 1)}));
  }
  json post = nullptr;
  if (v.add_bos && v.bos) {
    const std::string& bos = v.tokens[*v.bos];
    json entry = json::object();
    entry["id"] = bos;
    entry["ids"] = json::array({*v.bos});
    entry["tokens"] = json::array({bos});
    json special = json::object();
    special[bos] = entry;
    json single = json::array();
    single.push_back(json{{"SpecialToken", json{{"id", bos}, {"type_id", 0}}}});
    single.push_back(json{{"Sequence", json{{"id", "A"}, {"type_id", 0}}}});
    post = json::object();
    post["type"] = "TemplateProcessing";
    post["single"] = single;
    post["pair"] = json::array();
    post["special_tokens"] = special;
  }
  const json root = {{"version", "1.0"},
                     {"truncation", nullptr},
                     {"padding", nullptr},
                     {"added_tokens", added},
                     {"normalizer", nullptr},
                     {"pre_tokenizer", pre},
                     {"post_processor", post},
                     {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                  {"use_regex", true}}},
                     {"model", {{"type", "BPE"},
                                {"dropout", nullptr},
                                {"ignore_merges", ignore_merges},
                                {"vocab", vocab},
                                {"merges", merges}}}};
  std::string text;
  try {
    text = root.dump();
  } catch (const json::exception&) {
    // nlohmann refuses to write a string that is not UTF-8: find which.
    for (std::size_t id = 0; id < v.tokens.size(); ++id) try {
        (void)json(v.tokens[id]).dump();
      } catch (const json::exception&) {
        return fail("token " + std::to_string(id) + " is not UTF-8 text (expected GPT-2's byte alphabet)");
      }
    return fail("a merge is not UTF-8 text");
  }
  return Tokenizer::from_json(text, "the GGUF tokenizer (as tokenizer.json)");
}

// ---- the file ----

namespace {

constexpr std::uint32_t gguf_version = 3;
constexpr std::size_t alignment = 32;  // general.alignment's default, which llama.cpp assumes when it is absent

// The metadata value types of the format.
enum class Kind : std::uint32_t { u32 = 4, i32 = 5, f32 = 6, boolean = 7, string = 8, array = 9 };

// Little-endian bytes (x86-64 and aarch64 are; GGUF is, unless it says otherwise).
struct Bytes {
  std::vector<unsigned char> out;
  template <class U>
  void put(U v) {
    static_assert(std::is_trivially_copyable_v<U>);
    const auto* p = reinterpret_cast<const unsigned char*>(&v);
    out.insert(out.end(), p, p + sizeof v);
  }
  void put_string(std::string_view s) {
    put(static_cast<std::uint64_t>(s.size()));
    out.insert(out.end(), s.begin(), s.end());
  }
  void pad_to(std::size_t a) { out.resize((out.size() + a - 1) / a * a, 0); }
};

// The metadata, written as it is added.
struct Metadata {
  Bytes b;
  std::uint64_t count = 0;
  void key(std::string_view k, Kind kind) {
    b.put_string(k);
    b.put(static_cast<std::uint32_t>(kind));
    ++count;
  }
  void u32(std::string_view k, std::uint32_t v) { key(k, Kind::u32), b.put(v); }
  void f32(std::string_view k, float v) { key(k, Kind::f32), b.put(v); }
  void boolean(std::string_view k, bool v) { key(k, Kind::boolean), b.put(static_cast<std::uint8_t>(v)); }
  void string(std::string_view k, std::string_view v) { key(k, Kind::string), b.put_string(v); }
  void strings(std::string_view k, std::span<const std::string> v) {
    key(k, Kind::array);
    b.put(static_cast<std::uint32_t>(Kind::string));
    b.put(static_cast<std::uint64_t>(v.size()));
    for (const std::string& s : v) b.put_string(s);
  }
  void i32s(std::string_view k, std::span<const std::int32_t> v) {
    key(k, Kind::array);
    b.put(static_cast<std::uint32_t>(Kind::i32));
    b.put(static_cast<std::uint64_t>(v.size()));
    for (std::int32_t x : v) b.put(x);
  }
};

// One tensor to write: where its values are in grad's layout and how they go out.
struct Planned {
  std::string gguf_name, hf_name;  // hf_name: Hugging Face's, for messages
  std::vector<std::uint64_t> ne;   // GGUF order: ne[0] fastest
  const LmTensor* from = nullptr;  // null: zeros (a bias grad's block does not have)
  bool transpose = false;          // grad [in, out] -> rows of outputs
  // > 0: the output rows are `heads` heads, each reordered from rotate-half
  // pairs (j, j + w/2) to adjacent pairs (2j, 2j + 1), as llama.cpp's
  // converter permutes Llama's q and k for its interleaved RoPE.
  std::size_t heads = 0;
  GgufType type = GgufType::f32;
  std::size_t elements() const {
    std::size_t n = 1;
    for (std::uint64_t d : ne) n *= static_cast<std::size_t>(d);
    return n;
  }
};

std::string shape_text(std::span<const std::size_t> s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// The row of a head-permuted tensor (Planned::heads) that output row r comes from.
std::size_t source_row(std::size_t r, std::size_t rows, std::size_t heads) {
  if (heads == 0) return r;
  const std::size_t width = rows / heads, head = r / width, j = r % width;
  return head * width + (j % 2) * (width / 2) + j / 2;
}

// "" or why a real that GGUF holds as float32 would not be itself there:
// beyond float32's range (inf), or a nonzero that would become 0 or a subnormal.
std::string float32_problem(double v) {
  const float f = static_cast<float>(v);
  if (std::isinf(f) && std::isfinite(v)) return "beyond float32's range (it would become inf)";
  if (v != 0 && !std::isnormal(f))
    return f == 0 ? "too small for float32 (it would become 0)"
                  : "below float32's normal range (it would become a subnormal)";
  return "";
}

}  // namespace

ModelFileResult write_gguf(const std::string& path, const nn::LmConfig& c, std::span<const LmTensor> tensors,
                           const BpeVocab& vocab, const GgufOptions& options) {
  auto failed = [&](const std::string& why) {
    return ModelFileResult{"grad: GGUF '" + path + "': " + why + "; nothing written"};
  };
  if (std::string why = c.check(); !why.empty()) return failed("bad model config: " + why);
  if (c.lora_rank > 0)
    return failed("the config has LoRA adapters (" + c.describe() + "): fold them in first (nn::merge_lora)");
  if (options.type != GgufType::f32 && options.type != GgufType::f16)
    return failed("tensor type " + std::to_string(static_cast<std::uint32_t>(options.type)) + " (expected f32 or f16)");
  if (std::string why = check_vocab(vocab, c.vocab); !why.empty()) return failed("tokenizer: " + why);

  // llama.cpp's qwen2 makes q [d, d]: a model whose heads are not d wide
  // between them (LmConfig::head_width, HF's head_dim) is a llama, whose q
  // is [d, heads * head_dim], with q and k rows in llama.cpp's RoPE order.
  const std::size_t d = c.d_model;
  const std::string arch(gguf_architecture(c));
  const bool llama = arch == "llama";
  {
    const std::pair<const char*, double> reals[] = {{"rope_base (config.json's rope_theta)", c.rope_base},
                                                    {"eps (config.json's rms_norm_eps)", c.eps}};
    for (const auto& [field, v] : reals)
      if (std::string why = float32_problem(v); !why.empty()) {
        char number[32];
        std::snprintf(number, sizeof number, "%.9g", v);
        return failed(std::string(field) + " " + number + " is " + why + ", and GGUF holds it as float32");
      }
  }

  // ---- the tensors, by name, each with the shape grad gives it ----
  std::map<std::string_view, const LmTensor*> by_name;
  for (const LmTensor& t : tensors)
    if (!by_name.emplace(t.name, &t).second) return failed("tensor '" + t.name + "' is given twice");
  std::vector<Planned> plan;
  std::unordered_set<std::string_view> used;
  // Adds the tensor `grad_name` of grad shape `shape` as `gguf_name`; a
  // missing optional one is written as zeros (bias) or left out (head).
  enum class Missing { error, zeros, omit };
  auto add = [&](const std::string& grad_name, std::vector<std::size_t> shape, std::string gguf_name,
                 std::string hf_name, Missing missing, std::size_t heads = 0) -> std::string {
    const auto it = by_name.find(grad_name);
    Planned p;
    p.gguf_name = std::move(gguf_name);
    p.hf_name = std::move(hf_name);
    p.heads = heads;
    // GGUF lists dimensions fastest first: a grad [rows, cols] matrix that
    // keeps its bytes is {cols, rows}; a transposed one {rows, cols}.
    p.transpose = shape.size() == 2 && p.gguf_name != "token_embd.weight";
    std::vector<std::size_t> hf_shape = shape;  // Hugging Face's [out, in]
    if (p.transpose) std::swap(hf_shape[0], hf_shape[1]);
    const std::string who = "tensor '" + p.hf_name + "' (grad's '" + grad_name + "')";
    if (it == by_name.end()) {
      if (missing == Missing::error)
        return who + ", " + shape_text(hf_shape) + " (grad's " + shape_text(shape) + "), is missing";
      if (missing == Missing::omit) return "";
    } else {
      const LmTensor& t = *it->second;
      used.insert(t.name);
      if (t.shape != shape)
        return who + " is " + shape_text(t.shape) + " as grad holds it (expected " + shape_text(shape) +
               (p.transpose ? ", grad's [in, out]: Hugging Face's " + shape_text(hf_shape) : std::string()) + ")";
      std::size_t count = 1;
      for (std::size_t x : shape) count *= x;  // bounded: LmConfig::check
      if (t.values.size() != count)
        return who + " has " + std::to_string(t.values.size()) + " values for " + shape_text(shape);
      p.from = &t;
    }
    if (shape.size() == 2)
      p.ne =
          p.transpose ? std::vector<std::uint64_t>{shape[0], shape[1]} : std::vector<std::uint64_t>{shape[1], shape[0]};
    else
      p.ne = {shape[0]};
    p.type = shape.size() == 2 ? options.type : GgufType::f32;
    plan.push_back(std::move(p));
    return "";
  };
  std::string why = add("embed", {c.vocab, d}, "token_embd.weight", "model.embed_tokens.weight", Missing::error);
  static constexpr const char* gguf_proj[nn::proj_count] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                                            "ffn_gate", "ffn_up", "ffn_down"};
  static constexpr const char* hf_proj[nn::proj_count] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                          "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                          "mlp.down_proj"};
  for (std::size_t l = 0; l < c.layers && why.empty(); ++l) {
    const std::string g = "layers." + std::to_string(l) + ".", blk = "blk." + std::to_string(l) + ".",
                      hf = "model.layers." + std::to_string(l) + ".";
    why = add(g + "attn_norm", {d}, blk + "attn_norm.weight", hf + "input_layernorm.weight", Missing::error);
    for (std::size_t p = 0; p < nn::proj_count && why.empty(); ++p) {
      const auto [in, out] = c.proj_shape(nn::Proj(p));
      const std::string name = g + std::string(nn::proj_names[p]);
      const std::size_t heads = !llama                                       ? 0
                                : p == static_cast<std::size_t>(nn::Proj::q) ? c.heads
                                : p == static_cast<std::size_t>(nn::Proj::k) ? c.kv_heads
                                                                             : 0;
      why = add(name, {in, out}, blk + gguf_proj[p] + ".weight", hf + hf_proj[p] + ".weight", Missing::error, heads);
      // llama.cpp's qwen2 reads q/k/v biases (zeros where the model has none:
      // LmConfig::qkv_bias off); its llama takes them when they are there.
      if (why.empty() && p <= static_cast<std::size_t>(nn::Proj::v))
        why = add(name + "_bias", {out}, blk + gguf_proj[p] + ".bias", hf + hf_proj[p] + ".bias",
                  llama ? Missing::omit : Missing::zeros, heads);
    }
    if (why.empty())
      why = add(g + "mlp_norm", {d}, blk + "ffn_norm.weight", hf + "post_attention_layernorm.weight", Missing::error);
  }
  if (why.empty()) why = add("final_norm", {d}, "output_norm.weight", "model.norm.weight", Missing::error);
  if (why.empty()) why = add("head", {d, c.vocab}, "output.weight", "lm_head.weight", Missing::omit);
  if (!why.empty()) return failed(why);
  for (const LmTensor& t : tensors)
    if (!used.contains(t.name))
      return failed("tensor '" + t.name + "' is not part of a " + arch + " model (an adapter? merge it first)");

  // ---- values: finite, and within F16's range where they become F16 ----
  for (const Planned& p : plan) {
    if (!p.from) continue;
    const std::span<const float> v = p.from->values;
    auto element = [&](std::size_t i) {  // named as Hugging Face's [row][column] (grad's [in, out] transposed)
      char number[32];
      std::snprintf(number, sizeof number, "%.9g", static_cast<double>(v[i]));
      std::string at;
      if (p.ne.size() == 1) {
        at = "[" + std::to_string(i) + "]";
      } else {
        const std::size_t cols = p.from->shape[1];
        const std::size_t r = i / cols, k = i % cols;  // grad's [r, k]
        at = p.transpose ? "[" + std::to_string(k) + "][" + std::to_string(r) + "]"
                         : "[" + std::to_string(r) + "][" + std::to_string(k) + "]";
      }
      return "tensor '" + p.hf_name + "' " + at + " is " + number;
    };
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (!std::isfinite(v[i])) return failed(element(i) + " (expected finite values)");
      if (p.type == GgufType::f16 && std::isinf(round_to_f16(v[i])))
        return failed(element(i) + ", beyond F16's range (it would become infinite; write F32)");
    }
  }

  // ---- metadata ----
  Metadata m;
  m.string("general.architecture", arch);
  m.string("general.name", options.name);
  m.u32("general.file_type", options.type == GgufType::f16 ? 1 : 0);  // llama_ftype: ALL_F32, MOSTLY_F16
  m.u32("general.alignment", alignment);
  auto u32 = [](std::size_t v) { return static_cast<std::uint32_t>(v); };  // check() bounds every size by 2^24
  m.u32(arch + ".context_length", u32(c.max_seq));
  m.u32(arch + ".embedding_length", u32(d));
  m.u32(arch + ".block_count", u32(c.layers));
  m.u32(arch + ".feed_forward_length", u32(c.ffn));
  m.u32(arch + ".attention.head_count", u32(c.heads));
  m.u32(arch + ".attention.head_count_kv", u32(c.kv_heads));
  m.u32(arch + ".rope.dimension_count", u32(c.head_dim()));
  if (c.head_dim() * c.heads != d) {  // a head width of its own (LmConfig::head_width): llama.cpp reads it here
    m.u32(arch + ".attention.key_length", u32(c.head_dim()));
    m.u32(arch + ".attention.value_length", u32(c.head_dim()));
  }
  m.f32(arch + ".rope.freq_base", static_cast<float>(c.rope_base));
  m.f32(arch + ".attention.layer_norm_rms_epsilon", static_cast<float>(c.eps));
  m.string("tokenizer.ggml.model", "gpt2");
  m.string("tokenizer.ggml.pre", vocab.pre);
  m.strings("tokenizer.ggml.tokens", vocab.tokens);
  std::vector<std::int32_t> types(vocab.tokens.size(), static_cast<std::int32_t>(TokenType::normal));
  for (std::size_t i = 0; i < vocab.token_types.size(); ++i) types[i] = static_cast<std::int32_t>(vocab.token_types[i]);
  m.i32s("tokenizer.ggml.token_type", types);
  m.strings("tokenizer.ggml.merges", vocab.merges);
  if (vocab.bos) m.u32("tokenizer.ggml.bos_token_id", *vocab.bos);
  if (vocab.eos) m.u32("tokenizer.ggml.eos_token_id", *vocab.eos);
  if (vocab.pad) m.u32("tokenizer.ggml.padding_token_id", *vocab.pad);
  m.boolean("tokenizer.ggml.add_bos_token", vocab.add_bos);

  // ---- header, metadata, tensor infos, data ----
  Bytes f;
  f.out.insert(f.out.end(), {'G', 'G', 'U', 'F'});
  f.put(gguf_version);
  f.put(static_cast<std::uint64_t>(plan.size()));
  f.put(m.count);
  f.out.insert(f.out.end(), m.b.out.begin(), m.b.out.end());
  std::uint64_t offset = 0;  // from the start of the data section
  for (const Planned& p : plan) {
    f.put_string(p.gguf_name);
    f.put(static_cast<std::uint32_t>(p.ne.size()));
    for (std::uint64_t x : p.ne) f.put(x);
    f.put(static_cast<std::uint32_t>(p.type));
    f.put(offset);
    const std::size_t bytes = p.elements() * (p.type == GgufType::f16 ? 2 : 4);
    offset += (bytes + alignment - 1) / alignment * alignment;
  }
  f.pad_to(alignment);
  f.out.reserve(f.out.size() + offset);
  for (const Planned& p : plan) {
    const std::size_t n = p.elements();
    const std::size_t rows = p.transpose ? p.ne[1] : 1, cols = n / rows;  // output order: rows of ne[0] values
    const std::size_t out_rows = p.ne.size() == 2 ? static_cast<std::size_t>(p.ne[1]) : n;  // vectors: one per "row"
    for (std::size_t i = 0; i < n; ++i) {
      // Output element i is (row r, column k) of the GGUF tensor; grad's
      // [in, out] holds it at (k, r), at (k, source row) when its heads are permuted.
      const std::size_t r = i / cols, k = i % cols;
      const float x = !p.from            ? 0.0f
                      : p.transpose      ? p.from->values[k * rows + source_row(r, rows, p.heads)]
                      : p.ne.size() == 1 ? p.from->values[source_row(i, out_rows, p.heads)]
                                         : p.from->values[i];
      if (p.type == GgufType::f16)
        f.put(f16_bits(x));
      else
        f.put(x);
    }
    f.pad_to(alignment);
  }
  // (Not failed(): when only the directory's flush fails, the file is there.)
  if (std::string err = grad::detail::write_atomically(path, f.out, "GGUF file"); !err.empty())
    return {"grad: GGUF '" + path + "': " + err};
  return {};
}

}  // namespace grad::hf
