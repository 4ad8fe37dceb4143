// GGUF v3 export of a grad::nn::Lm as llama.cpp's qwen2 or llama architecture
// (include/grad/hf/gguf.hpp has the tensor table and the rules).
#include "grad/hf/gguf.hpp"

#include "grad/atomic_file.hpp"

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
  auto fail = [](const std::string& why) -> Tokenizer { throw TokenizerError("grad::hf: GGUF tokenizer: " + why); };
  if (std::string why = check_vocab(v, v.tokens.size()); !why.empty()) return fail(why);
  const json byte_level_plain = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}};
  auto split_then_bytes = [&](std::string_view pattern) {
    const json split = {
        {"type", "Split"}, {"pattern", {{"Regex", std::string(pattern)}}}, {"behavior", "Isolated"}, {"invert", false}};
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
  const json root = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", pre},
      {"post_processor", post},
      {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
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
  std::uint64_t flushed = 0;              // bytes already handed to sink
  detail::AtomicFile* sink = nullptr;     // where drain() hands them (a file written in pieces)
  std::uint64_t position() const { return flushed + out.size(); }
  // Hands what is buffered to the sink once it holds at least `at_least`
  // bytes (0: whatever it holds); "" or why not.
  std::string drain(std::size_t at_least) {
    if (!sink || out.size() < at_least || out.empty()) return {};
    if (std::string why = sink->write(out); !why.empty()) return why;
    flushed += out.size();
    out.clear();
    return {};
  }
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
  void pad_to(std::size_t a) { out.resize(out.size() + (a - position() % a) % a, 0); }
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

// What a matrix is to llama.cpp's choice of quantized types (its tensor_category).
enum class Role { embed, output, attn_v, ffn_down, other };

// One tensor to write: where its values are in grad's layout and how they go out.
struct Planned {
  std::string gguf_name, hf_name;  // hf_name: Hugging Face's (PEFT's for an adapter), for messages
  std::vector<std::uint64_t> ne;   // GGUF order: ne[0] fastest
  const LmTensor* from = nullptr;  // null: zeros (a bias grad's block does not have)
  bool transpose = false;          // grad [in, out] -> rows of outputs
  // > 0: the output rows are `heads` heads, each reordered from rotate-half
  // pairs (j, j + w/2) to adjacent pairs (2j, 2j + 1), as llama.cpp's
  // converter permutes Llama's q and k for its interleaved RoPE.
  std::size_t heads = 0;
  Role role = Role::other;
  std::size_t layer = 0;
  GgmlType type = GgmlType::f32;
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

// A block's projections as llama.cpp and Hugging Face name them, in nn::Proj's order.
constexpr const char* gguf_proj[nn::proj_count] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                                   "ffn_gate", "ffn_up", "ffn_down"};
constexpr const char* hf_proj[nn::proj_count] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                 "self_attn.o_proj", "mlp.gate_proj",    "mlp.up_proj",
                                                 "mlp.down_proj"};

// Planned::heads for projection p's output rows: llama's q and k heads, else none.
std::size_t permuted_heads(const nn::LmConfig& c, nn::Proj p) {
  if (gguf_architecture(c) != "llama") return 0;
  return p == nn::Proj::q ? c.heads : p == nn::Proj::k ? c.kv_heads : 0;
}

// The failure of a real that GGUF holds as float32, or "".
std::string real_problem(const char* field, double v) {
  const std::string why = float32_problem(v);
  if (why.empty()) return "";
  char number[32];
  std::snprintf(number, sizeof number, "%.9g", v);
  return std::string(field) + " " + number + " is " + why + ", and GGUF holds it as float32";
}

// "" or what is wrong with a value to be written: not finite, or beyond
// F16's range where it becomes F16. An element is named as Hugging Face's
// [row][column] (grad's [in, out] transposed), as GGUF's rows hold it.
std::string check_values(std::span<const Planned> plan) {
  for (const Planned& p : plan) {
    if (!p.from || p.from->values.empty()) continue;  // held in blocks only: checked row by row (assemble)
    const std::span<const float> v = p.from->values;
    auto element = [&](std::size_t i) {
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
      if (!std::isfinite(v[i])) return element(i) + " (expected finite values)";
      if (p.type == GgmlType::f16 && std::isinf(round_to_f16(v[i])))
        return element(i) + ", beyond F16's range (it would become infinite; write F32)";
    }
  }
  return "";
}

// llama.cpp's use_more_bits: the layers (i of n) its Q4_K_M gives more bits.
bool more_bits(std::size_t i, std::size_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

std::size_t block_elements(GgmlType t) {
  const std::optional<QuantFormat> q = quant_format(t);
  return q ? quant_info(*q).block_elements : 1;
}

// The type of a matrix with rows of `cols` values in a file of `file`: see
// gguf_tensor_type in the header, llama.cpp's llama_tensor_get_type.
GgmlType matrix_type(GgufType file, Role role, std::size_t layer, std::size_t layers, std::size_t cols, bool tied) {
  if (file == GgufType::f32) return GgmlType::f32;
  if (file == GgufType::f16) return GgmlType::f16;
  const GgmlType base = file == GgufType::q8_0   ? GgmlType::q8_0
                        : file == GgufType::q4_0 ? GgmlType::q4_0
                                                 : GgmlType::q4_k;
  GgmlType t = base;
  if (role == Role::output || (tied && role == Role::embed))
    t = cols % block_elements(base) != 0 || base == GgmlType::q8_0 ? GgmlType::q8_0 : GgmlType::q6_k;
  else if (file == GgufType::q4_k_m && (role == Role::attn_v || role == Role::ffn_down) && more_bits(layer, layers))
    t = GgmlType::q6_k;
  if (cols % block_elements(t) != 0) {  // llama.cpp's tensor_type_fallback
    t = t == GgmlType::q4_k || t == GgmlType::q6_k ? GgmlType::q8_0 : GgmlType::f16;  // q4_K: llama.cpp's q5_0
    if (cols % block_elements(t) != 0) t = GgmlType::f16;
  }
  return t;
}

// What a grad tensor is: its role, layer, GGUF row length and whether
// GGUF's rows are grad's columns; nothing for a name that is no tensor of a
// model of `c`; rank 1 for a vector.
struct TensorPlace {
  Role role = Role::other;
  std::size_t layer = 0, rank = 2, in = 0, out = 0;  // grad's shape [in, out] ([in] for a vector)
  bool transposed = true;
};
std::optional<TensorPlace> place_of(const nn::LmConfig& c, std::string_view name) {
  if (name == "embed") return TensorPlace{Role::embed, 0, 2, c.vocab, c.d_model, false};
  if (name == "head") return TensorPlace{Role::output, 0, 2, c.d_model, c.vocab, true};
  if (name == "final_norm") return TensorPlace{Role::other, 0, 1, c.d_model, 0, false};
  if (!name.starts_with("layers.")) return std::nullopt;
  name.remove_prefix(7);
  std::size_t layer = 0, digits = 0;
  while (digits < name.size() && digits < 8 && name[digits] >= '0' && name[digits] <= '9')
    layer = layer * 10 + static_cast<std::size_t>(name[digits++] - '0');
  if (digits == 0 || digits >= name.size() || name[digits] != '.' || layer >= c.layers) return std::nullopt;
  name.remove_prefix(digits + 1);
  if (name == "attn_norm" || name == "mlp_norm") return TensorPlace{Role::other, layer, 1, c.d_model, 0, false};
  for (std::size_t p = 0; p < nn::proj_count; ++p) {
    const auto [in, out] = c.proj_shape(nn::Proj(p));
    if (name == nn::proj_names[p]) {
      const Role role = nn::Proj(p) == nn::Proj::v      ? Role::attn_v
                        : nn::Proj(p) == nn::Proj::down ? Role::ffn_down
                                                        : Role::other;
      return TensorPlace{role, layer, 2, in, out, true};
    }
    if (p <= static_cast<std::size_t>(nn::Proj::v) && name == std::string(nn::proj_names[p]) + "_bias")
      return TensorPlace{Role::other, layer, 1, out, 0, false};
  }
  return std::nullopt;
}

// The bytes of one row of `n` values of `type`.
std::size_t row_bytes(GgmlType type, std::size_t n) {
  if (const std::optional<QuantFormat> q = quant_format(type)) return quant_bytes(*q, n);
  return n * (type == GgmlType::f16 ? 2 : 4);
}

// The whole file into `file`, in pieces of up to file_piece bytes (a 7B
// model's file is never whole in memory): header, metadata, tensor infos,
// then each tensor's rows (GGUF's rows: ne[0] values each) at a multiple of
// `alignment`. "" or why it cannot be: a quantized row whose scales are not
// finite (values too large for the format's F16 scales), a failed write.
constexpr std::size_t file_piece = std::size_t{64} << 20;
std::string assemble(std::span<const Planned> plan, const Metadata& m, detail::AtomicFile& file) {
  Bytes f;
  f.sink = &file;
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
    const std::size_t cols = static_cast<std::size_t>(p.ne[0]);
    const std::size_t bytes = p.elements() / cols * row_bytes(p.type, cols);
    offset += (bytes + alignment - 1) / alignment * alignment;
  }
  f.pad_to(alignment);
  f.out.reserve(f.out.size() + std::min<std::uint64_t>(offset, file_piece + (std::size_t{1} << 20)));
  std::vector<float> row, back;
  std::vector<std::uint8_t> ungrouped;
  for (const Planned& p : plan) {
    const std::size_t cols = static_cast<std::size_t>(p.ne[0]), rows = p.elements() / cols;
    const std::optional<QuantFormat> q = quant_format(p.type);
    row.resize(cols);
    // Held row `held`'s blocks in GGUF's layout (a tape's rows lie in groups: numerics/quant_rows.hpp).
    auto held_blocks = [&](std::size_t held) -> const std::uint8_t* {
      const QuantRows m{*p.from->format, rows, cols};
      if (!p.from->grouped) return p.from->blocks.data() + held * m.row_bytes();
      ungrouped.resize(m.row_bytes());
      get_row_blocks(m, p.from->blocks.data(), held, ungrouped.data());
      return ungrouped.data();
    };
    for (std::size_t r = 0; r < rows; ++r) {
      // Element (r, k) of the GGUF tensor: grad's [in, out] holds it at
      // (k, r), at (k, source row) when its heads are permuted; a vector is
      // one row, itself permuted when its heads are. A row is quantized on
      // its own (whole blocks), so permuting rows commutes with quantizing.
      const bool blocks_only = p.from && p.from->values.empty();  // a quantized base's matrix: no floats
      if (blocks_only) {
        // GGUF row r is held row source_row(r) (the embedding's: row r), dequantized exactly.
        const QuantFormat held_format = *p.from->format;
        const std::size_t bytes = quant_bytes(held_format, cols), held = p.transpose ? source_row(r, rows, p.heads) : r;
        if (r == 0 && p.from->blocks.size() != rows * bytes)
          return "tensor '" + p.hf_name + "' has " + std::to_string(p.from->blocks.size()) + " bytes of its " +
                 std::string(quant_info(held_format).name) + " blocks (expected " + std::to_string(rows) +
                 " rows of " + std::to_string(bytes) + ")";
        dequantize(held_format, held_blocks(held), row.data(), cols);
        for (std::size_t k = 0; k < cols; ++k)
          if (!std::isfinite(row[k]) || (p.type == GgmlType::f16 && std::isinf(round_to_f16(row[k]))))
            return "tensor '" + p.hf_name + "' row " + std::to_string(r) + " element " + std::to_string(k) +
                   " of its blocks is " + std::to_string(row[k]) +
                   (std::isfinite(row[k]) ? ", beyond F16's range (write F32)" : " (expected finite values)");
      } else {
        for (std::size_t k = 0; k < cols; ++k)
          row[k] = !p.from            ? 0.0f
                   : p.ne.size() == 1 ? p.from->values[source_row(k, cols, p.heads)]
                   : p.transpose      ? p.from->values[k * rows + source_row(r, rows, p.heads)]
                                      : p.from->values[r * cols + k];
      }
      if (q && p.from && p.from->format == *q) {
        // Held in this format: the row's blocks as they are (GGUF row r is
        // held row source_row(r): Llama's q and k rows move whole), which
        // must dequantize to the row's values.
        const std::size_t bytes = quant_bytes(*q, cols), held = p.transpose ? source_row(r, rows, p.heads) : r;
        if (r == 0 && p.from->blocks.size() != rows * bytes)
          return "tensor '" + p.hf_name + "' has " + std::to_string(p.from->blocks.size()) + " bytes of " +
                 ggml_type_name(static_cast<std::uint32_t>(p.type)) + " blocks (expected " + std::to_string(rows) +
                 " rows of " + std::to_string(bytes) + ")";
        const std::uint8_t* from = held_blocks(held);
        back.resize(cols);
        dequantize(*q, from, back.data(), cols);
        for (std::size_t k = 0; k < cols; ++k)
          if (std::bit_cast<std::uint32_t>(back[k]) != std::bit_cast<std::uint32_t>(row[k]))
            return "tensor '" + p.hf_name + "': its " + ggml_type_name(static_cast<std::uint32_t>(p.type)) +
                   " blocks' row " + std::to_string(held) + " does not dequantize to its values (element " +
                   std::to_string(k) + "; expected the blocks in GGUF's rows: [out, in] for a projection or the head)";
        f.out.insert(f.out.end(), from, from + bytes);
      } else if (q) {
        const std::size_t at = f.out.size();
        f.out.resize(at + quant_bytes(*q, cols));
        quantize(*q, row.data(), f.out.data() + at, cols);  // finite values: checked first
        // ggml's scales are halves: values beyond what they reach quantize to inf or NaN.
        back.resize(cols);
        dequantize(*q, f.out.data() + at, back.data(), cols);
        for (std::size_t k = 0; k < cols; ++k)
          if (!std::isfinite(back[k])) {
            float top = 0;
            for (const float x : row) top = std::max(top, std::abs(x));
            char number[32];
            std::snprintf(number, sizeof number, "%.9g", static_cast<double>(top));
            return "tensor '" + p.hf_name + "' row " + std::to_string(r) + " (values up to " + number +
                   " in magnitude) does not fit " + ggml_type_name(static_cast<std::uint32_t>(p.type)) +
                   "'s F16 scales (it would dequantize to " + (std::isnan(back[k]) ? "nan" : "inf") + "; write F32)";
          }
      } else {
        for (const float x : row) {
          if (p.type == GgmlType::f16)
            f.put(f16_bits(x));
          else
            f.put(x);
        }
      }
      if (std::string why = f.drain(file_piece); !why.empty()) return why;
    }
    f.pad_to(alignment);
  }
  return f.drain(0);
}

// Writes the file of `plan` and `m` to path, whole or not at all; the
// message when that fails. (Not "nothing written": when only the
// directory's flush fails, the file is there.)
ModelFileResult write_file(const std::string& path, std::span<const Planned> plan, const Metadata& m,
                           std::string_view what) {
  detail::AtomicFile file;
  std::string why = file.open(path);
  if (why.empty()) {
    why = assemble(plan, m, file);
    if (!why.empty()) return {"grad: " + std::string(what) + " '" + path + "': " + why + "; nothing written"};
    why = file.commit("GGUF file");
  }
  if (!why.empty()) return {"grad: " + std::string(what) + " '" + path + "': " + why};
  return {};
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
  switch (options.type) {
    case GgufType::f32:
    case GgufType::f16:
    case GgufType::q8_0:
    case GgufType::q4_0:
    case GgufType::q4_k_m:
      break;
    default:
      return failed("file type " + std::to_string(static_cast<std::uint32_t>(options.type)) +
                    " (expected f32, f16, q8_0, q4_0 or q4_k_m)");
  }
  if (std::string why = check_vocab(vocab, c.vocab); !why.empty()) return failed("tokenizer: " + why);

  // llama.cpp's qwen2 makes q [d, d]: a model whose heads are not d wide
  // between them (LmConfig::head_width, HF's head_dim) is a llama, whose q
  // is [d, heads * head_dim], with q and k rows in llama.cpp's RoPE order.
  const std::size_t d = c.d_model;
  const std::string arch(gguf_architecture(c));
  const bool llama = arch == "llama";
  for (const auto& [field, v] : {std::pair{"rope_base (config.json's rope_theta)", c.rope_base},
                                 std::pair{"eps (config.json's rms_norm_eps)", c.eps}})
    if (std::string why = real_problem(field, v); !why.empty()) return failed(why);

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
      // A quantized base's matrix may come as its blocks alone (LmTensor::format, no values).
      const bool blocks_only = t.values.empty() && t.format && shape.size() == 2;
      if (t.values.size() != count && !blocks_only)
        return who + " has " + std::to_string(t.values.size()) + " values for " + shape_text(shape);
      p.from = &t;
    }
    if (shape.size() == 2)
      p.ne =
          p.transpose ? std::vector<std::uint64_t>{shape[0], shape[1]} : std::vector<std::uint64_t>{shape[1], shape[0]};
    else
      p.ne = {shape[0]};
    const std::optional<TensorPlace> place = place_of(c, grad_name);
    p.role = place ? place->role : Role::other;  // (always there: the names are the table's)
    p.layer = place ? place->layer : 0;
    plan.push_back(std::move(p));
    return "";
  };
  std::string why = add("embed", {c.vocab, d}, "token_embd.weight", "model.embed_tokens.weight", Missing::error);
  for (std::size_t l = 0; l < c.layers && why.empty(); ++l) {
    const std::string g = "layers." + std::to_string(l) + ".", blk = "blk." + std::to_string(l) + ".",
                      hf = "model.layers." + std::to_string(l) + ".";
    why = add(g + "attn_norm", {d}, blk + "attn_norm.weight", hf + "input_layernorm.weight", Missing::error);
    for (std::size_t p = 0; p < nn::proj_count && why.empty(); ++p) {
      const auto [in, out] = c.proj_shape(nn::Proj(p));
      const std::string name = g + std::string(nn::proj_names[p]);
      const std::size_t heads = permuted_heads(c, nn::Proj(p));
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

  // ---- each matrix's type: llama.cpp's mix for the file type (tied: no output.weight) ----
  const bool tied = std::none_of(plan.begin(), plan.end(), [](const Planned& p) { return p.role == Role::output; });
  for (Planned& p : plan)
    if (p.ne.size() == 2) p.type = matrix_type(options.type, p.role, p.layer, c.layers, p.ne[0], tied);

  // ---- values: finite, and within F16's range where they become F16 ----
  if (std::string why = check_values(plan); !why.empty()) return failed(why);

  // ---- metadata ----
  Metadata m;
  m.string("general.architecture", arch);
  m.string("general.name", options.name);
  m.u32("general.file_type", static_cast<std::uint32_t>(options.type));  // llama_ftype
  if (options.type != GgufType::f32 && options.type != GgufType::f16)
    m.u32("general.quantization_version", 2);  // GGML_QNT_VERSION, as llama.cpp's quantize writes it
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

  return write_file(path, plan, m, "GGUF");
}

// ---- LoRA adapters ----

ModelFileResult write_lora_gguf(const std::string& path, const nn::LmConfig& c, std::span<const LmTensor> adapters,
                                const LoraGgufOptions& options) {
  auto failed = [&](const std::string& why) {
    return ModelFileResult{"grad: LoRA GGUF '" + path + "': " + why + "; nothing written"};
  };
  if (std::string why = c.check(); !why.empty()) return failed("bad model config: " + why);
  if (c.lora_rank == 0) return failed("the config has no adapters (lora_rank 0: " + c.describe() + ")");
  if (options.type != GgufType::f32 && options.type != GgufType::f16)
    return failed("tensor type " + std::to_string(static_cast<std::uint32_t>(options.type)) +
                  " (expected f32 or f16: llama.cpp adds the adapter's product in float)");
  // llama.cpp scales an adapter's product by alpha / r (r: lora_b's ne[0]),
  // or by 1 when alpha is 0 (its "no alpha"): grad's lora_scale times r,
  // which must be a nonzero float32 (a scale of 0 would read as "no alpha").
  const double alpha = c.lora_scale * static_cast<double>(c.lora_rank);
  if (c.lora_scale == 0)
    return failed(
        "lora_scale is 0: llama.cpp reads adapter.lora.alpha 0 as no alpha and would scale by 1 "
        "(an adapter that does nothing need not be exported)");
  if (std::string why = real_problem("adapter.lora.alpha (lora_scale * lora_rank)", alpha); !why.empty())
    return failed(why);

  std::map<std::string_view, const LmTensor*> by_name;
  for (const LmTensor& t : adapters)
    if (!by_name.emplace(t.name, &t).second) return failed("tensor '" + t.name + "' is given twice");
  const std::size_t r = c.lora_rank;
  std::vector<Planned> plan;
  std::unordered_set<std::string_view> used;
  for (std::size_t l = 0; l < c.layers; ++l)
    for (std::size_t p = 0; p < nn::proj_count; ++p) {
      if (!c.has_adapter(nn::Proj(p))) continue;
      const auto [in, out] = c.proj_shape(nn::Proj(p));
      const std::string name = "layers." + std::to_string(l) + "." + std::string(nn::proj_names[p]);
      const std::string gguf = "blk." + std::to_string(l) + "." + gguf_proj[p] + ".weight";
      const std::string peft = "base_model.model.model.layers." + std::to_string(l) + "." + hf_proj[p];
      // PEFT's lora_A [r, in] and lora_B [out, r] (rows of outputs, as every
      // GGUF matrix): grad's lora_a [in, r] and lora_b [r, out] transposed.
      // lora_b's rows are the projection's outputs: llama's q and k heads
      // are permuted there as in the base matrix, so (A . B)'s columns land
      // on the base's rows.
      for (const bool b : {false, true}) {
        const std::string grad_name = name + (b ? ".lora_b" : ".lora_a");
        const std::vector<std::size_t> shape = b ? std::vector<std::size_t>{r, out} : std::vector<std::size_t>{in, r};
        const std::vector<std::size_t> peft_shape = {shape[1], shape[0]};
        Planned pl;
        pl.gguf_name = gguf + (b ? ".lora_b" : ".lora_a");
        pl.hf_name = peft + (b ? ".lora_B.weight" : ".lora_A.weight");
        const std::string who = "tensor '" + pl.hf_name + "' (grad's '" + grad_name + "')";
        const auto it = by_name.find(grad_name);
        if (it == by_name.end())
          return failed(who + ", " + shape_text(peft_shape) + " (grad's " + shape_text(shape) + "), is missing");
        const LmTensor& t = *it->second;
        if (t.shape != shape)
          return failed(who + " is " + shape_text(t.shape) + " as grad holds it (expected " + shape_text(shape) +
                        ": PEFT's " + shape_text(peft_shape) + ")");
        if (t.values.size() != shape[0] * shape[1])
          return failed(who + " has " + std::to_string(t.values.size()) + " values for " + shape_text(shape));
        used.insert(t.name);
        pl.from = &t;
        pl.transpose = true;
        pl.ne = {shape[0], shape[1]};
        pl.heads = b ? permuted_heads(c, nn::Proj(p)) : 0;
        pl.type = options.type == GgufType::f16 ? GgmlType::f16 : GgmlType::f32;
        plan.push_back(std::move(pl));
      }
    }
  for (const LmTensor& t : adapters)
    if (!used.contains(t.name))
      return failed("tensor '" + t.name + "' is not an adapter of " + c.describe() +
                    " (expected layers.N.<projection>.lora_a and .lora_b of the targeted projections)");
  if (std::string why = check_values(plan); !why.empty()) return failed(why);

  Metadata m;
  m.string("general.architecture", gguf_architecture(c));  // llama.cpp refuses an adapter of another architecture
  m.string("general.type", "adapter");
  m.string("general.name", options.name);
  m.u32("general.file_type", options.type == GgufType::f16 ? 1 : 0);
  m.u32("general.alignment", alignment);
  m.string("adapter.type", "lora");
  m.f32("adapter.lora.alpha", static_cast<float>(alpha));
  return write_file(path, plan, m, "LoRA GGUF");
}

// ---- tensor types ----

std::string_view gguf_type_name(GgufType type) {
  switch (type) {
    case GgufType::f32:
      return "f32";
    case GgufType::f16:
      return "f16";
    case GgufType::q8_0:
      return "q8_0";
    case GgufType::q4_0:
      return "q4_0";
    case GgufType::q4_k_m:
      return "q4_k_m";
  }
  return "unknown";
}

std::optional<QuantFormat> quant_format(GgmlType type) {
  return quant_format_from_ggml(static_cast<std::uint32_t>(type));
}

namespace {
TensorPlace place_or_throw(const nn::LmConfig& c, std::string_view name, const char* who) {
  const std::optional<TensorPlace> place = place_of(c, name);
  if (!place)
    throw std::invalid_argument(std::string("grad::hf::") + who + ": '" + std::string(name) +
                                "' is no tensor of a model of " + c.describe() +
                                " (expected embed, head, final_norm or layers.N.<attn_norm, mlp_norm, q, k, v, o, "
                                "gate, up, down, q_bias, k_bias, v_bias>)");
  return *place;
}
}  // namespace

GgmlType gguf_tensor_type(const nn::LmConfig& c, GgufType type, std::string_view grad_name, bool tied) {
  const TensorPlace place = place_or_throw(c, grad_name, "gguf_tensor_type");
  if (place.rank == 1) return GgmlType::f32;
  const std::size_t cols = place.transposed ? place.in : place.out;  // GGUF's row: a projection's input
  return matrix_type(type, place.role, place.layer, c.layers, cols, tied);
}

void round_like_gguf(const nn::LmConfig& c, GgufType type, std::string_view grad_name, std::span<float> values,
                     bool tied) {
  const TensorPlace place = place_or_throw(c, grad_name, "round_like_gguf");
  const std::size_t count = place.rank == 1 ? place.in : place.in * place.out;
  if (values.size() != count)
    throw std::invalid_argument("grad::hf::round_like_gguf: '" + std::string(grad_name) + "' has " +
                                std::to_string(values.size()) + " values (expected " + std::to_string(count) + ")");
  const GgmlType t = gguf_tensor_type(c, type, grad_name, tied);
  if (t == GgmlType::f32) return;
  if (t == GgmlType::f16) {
    for (float& x : values) x = round_to_f16(x);
    return;
  }
  // GGUF's rows: grad's columns of a transposed [in, out], grad's rows of the embedding.
  const QuantFormat q = *quant_format(t);
  const std::size_t rows = place.transposed ? place.out : place.in, cols = place.transposed ? place.in : place.out;
  const std::size_t stride = place.transposed ? place.out : 1, step = place.transposed ? 1 : cols;
  std::vector<float> row(cols);
  std::vector<std::uint8_t> blocks(quant_bytes(q, cols));
  for (std::size_t r = 0; r < rows; ++r) {
    for (std::size_t k = 0; k < cols; ++k) row[k] = values[r * step + k * stride];
    quantize(q, row.data(), blocks.data(), cols);
    dequantize(q, blocks.data(), row.data(), cols);
    for (std::size_t k = 0; k < cols; ++k) values[r * step + k * stride] = row[k];
  }
}

}  // namespace grad::hf
