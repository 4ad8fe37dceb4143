// grad::hf's GGUF reader: write_gguf's files read back (config, every
// tensor's bits, the logits' bits, the tokenizer's ids), llama.cpp's layouts
// (transposed projections, llama's interleaved q/k rows), and every
// corruption refused with a message, never a crash (CI runs this suite
// under ASan + UBSan: scripts/sanitize.sh).
#include <doctest/doctest.h>

#include <grad/hf/gguf_load.hpp>
#include <grad/lm.hpp>
#include <grad/numerics/quant.hpp>
#include <nlohmann/json.hpp>

#include "support.hpp"

using namespace grad;
using namespace grad::testing;

namespace {

nn::LmConfig small(std::size_t vocab) {
  nn::LmConfig c;
  c.vocab = vocab;
  c.d_model = 8;
  c.layers = 2;
  c.heads = 2;
  c.kv_heads = 1;
  c.ffn = 12;
  c.max_seq = 16;
  c.rope_base = 500000.0;
  c.eps = 1e-5;
  return c;
}

// Every base tensor of m given random values (the biases, which Lm starts at zero, too).
template <class T>
void randomize(nn::Lm<T>& m, std::uint64_t seed) {
  Rng rng(seed);
  for (const auto& p : m.base())
    for (T& x : m.tape().leaf_value(p.var)) x = static_cast<T>(static_cast<float>(rng.uniform(-1, 1)));
}

// The bits of every base tensor, as T (16-bit ones widened).
template <class T>
std::map<std::string, std::vector<T>> values(const nn::Lm<T>& m) {
  std::map<std::string, std::vector<T>> out;
  for (const auto& p : m.base()) {
    const Tensor<T> v = m.tape().widened_value(p.var);
    out[p.name] = std::vector<T>(v.data().begin(), v.data().end());
  }
  return out;
}

template <class T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

template <class T>
std::vector<T> logits(nn::Lm<T>& m) {
  const std::vector<int> ids = {1, 7, 3, 250, 0, 42, 9, 11};
  auto out = m.forward(m.ids(ids, 2, 4));
  REQUIRE_MESSAGE(m.tape().ok(), m.tape().error());
  const auto v = m.tape().value(out.logits).data;
  return std::vector<T>(v.begin(), v.end());
}

void check_same_config(const nn::LmConfig& a, const nn::LmConfig& b) {
  CHECK(a.describe() == b.describe());
  CHECK(a.vocab == b.vocab);
  CHECK(a.head_dim() == b.head_dim());
  CHECK(a.head_width == b.head_width);
  CHECK(a.qkv_bias == b.qkv_bias);
  CHECK(a.tied_embeddings == b.tied_embeddings);
  CHECK(a.max_seq == b.max_seq);
  CHECK(a.rope_base == b.rope_base);
  CHECK(a.eps == b.eps);
}

hf::BpeVocab vocab_of(std::size_t n) {
  hf::BpeVocab v = hf::byte_level_vocab({"<|endoftext|>"});
  v.tokens.insert(v.tokens.begin() + 256, "\xc4\xa0t");  // "Ġt": one merge
  v.token_types.insert(v.token_types.begin() + 256, hf::TokenType::normal);
  v.merges = {"\xc4\xa0 t"};
  v.eos = 257;
  while (v.tokens.size() < n) {
    v.tokens.push_back("[PAD" + std::to_string(v.tokens.size()) + "]");
    v.token_types.push_back(hf::TokenType::unused);
  }
  return v;
}

// write_gguf then load_gguf, in T, checking what every round trip must give.
template <class T>
void round_trip(const nn::LmConfig& c, hf::GgufType type, const std::string& arch) {
  ScratchDir dir("gguf_read");
  Tape<T> tp;
  nn::Lm<T> m(tp, c, 5);
  randomize(m, 11);
  const std::string path = dir.file("m.gguf");
  const ModelFileResult w = hf::write_gguf(path, m, vocab_of(c.vocab), {.type = type});
  REQUIRE_MESSAGE(w.ok(), w.error);
  hf::round_like_gguf(m, type);  // what the file holds (float32 values, F16 matrices)
  Tape<T> tq;
  auto g = hf::load_gguf(path, tq);
  CHECK(g.architecture == arch);
  check_same_config(g.config, c);
  const auto want = values(m), got = values(g.model);
  REQUIRE(want.size() == got.size());
  for (const auto& [name, v] : want) {
    CAPTURE(name);
    REQUIRE(got.contains(name));
    CHECK(same_bits(v, got.at(name)));
  }
  CHECK(same_bits(logits(m), logits(g.model)));
  REQUIRE(g.tokenizer.has_value());
}

// ---- crafting files by hand: a minimal writer of the format ----
struct Bytes {
  std::vector<unsigned char> b;
  template <class U>
  Bytes& put(U v) {
    const auto* p = reinterpret_cast<const unsigned char*>(&v);
    b.insert(b.end(), p, p + sizeof v);
    return *this;
  }
  Bytes& str(std::string_view s) {
    put<std::uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  void pad(std::size_t a) { b.resize((b.size() + a - 1) / a * a, 0); }
};

// A GGUF with the given metadata bytes (kv_count pairs) and one F32 tensor "t" of ne {4}.
std::vector<unsigned char> crafted(std::uint64_t kv_count, const Bytes& kvs, std::uint32_t version = 3) {
  Bytes f;
  f.b = {'G', 'G', 'U', 'F'};
  f.put<std::uint32_t>(version).put<std::uint64_t>(1).put<std::uint64_t>(kv_count);
  f.b.insert(f.b.end(), kvs.b.begin(), kvs.b.end());
  f.str("t").put<std::uint32_t>(1).put<std::uint64_t>(4).put<std::uint32_t>(0).put<std::uint64_t>(0);
  f.pad(32);
  for (float x : {1.0f, 2.0f, 3.0f, 4.0f}) f.put(x);
  return f.b;
}

// The message hf::GgufFile gives for these bytes ("" when it opens them).
std::string open_error(const ScratchDir& dir, const std::vector<unsigned char>& bytes) {
  const std::string path = dir.file("x.gguf");
  std::filesystem::remove(path);  // a new file (see load_error)
  write_bytes(path, bytes);
  try {
    hf::GgufFile f(path);
  } catch (const hf::Error& e) {
    return e.what();
  }
  return "";
}

// The message load_gguf gives for these bytes ("" when it loads them).
std::string load_error(const ScratchDir& dir, const std::vector<unsigned char>& bytes) {
  const std::string path = dir.file("x.gguf");
  std::filesystem::remove(path);  // a new file: truncating one that was mapped costs far more
  write_bytes(path, bytes);
  try {
    Tape<float> tp;
    auto g = hf::load_gguf(path, tp);
  } catch (const hf::Error& e) {
    return e.what();
  }
  return "";
}

// Where `key`'s value starts in a file write_gguf wrote (after the key and its type).
std::size_t value_at(const std::vector<unsigned char>& bytes, std::string_view key) {
  const auto it = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
  REQUIRE(it != bytes.end());
  return static_cast<std::size_t>(it - bytes.begin()) + key.size() + 4;
}

template <class U>
void poke(std::vector<unsigned char>& bytes, std::size_t at, U v) {
  REQUIRE(at + sizeof v <= bytes.size());
  std::memcpy(bytes.data() + at, &v, sizeof v);
}

}  // namespace

TEST_CASE("load_gguf reads write_gguf's qwen2 back: config, tensors' bits, logits' bits (biases, untied, F32)") {
  nn::LmConfig c = small(300);
  c.qkv_bias = true;
  round_trip<float>(c, hf::GgufType::f32, "qwen2");
  round_trip<double>(c, hf::GgufType::f32, "qwen2");
}

TEST_CASE("load_gguf: a qwen2 without biases (written as zeros) and tied embeddings reads back as one") {
  nn::LmConfig c = small(260);
  c.tied_embeddings = true;
  round_trip<float>(c, hf::GgufType::f32, "qwen2");
  SUBCASE("zero biases kept when asked") {
    ScratchDir dir("gguf_read");
    Tape<float> tp;
    nn::Lm<float> m(tp, c, 2);
    REQUIRE(hf::write_gguf(dir.file("m.gguf"), m, vocab_of(260)).ok());
    const hf::GgufFile f(dir.file("m.gguf"));
    CHECK(hf::read_gguf_config(f, {.zero_biases_as_none = false}).config.qkv_bias);
    CHECK_FALSE(hf::read_gguf_config(f).config.qkv_bias);
  }
}

TEST_CASE("load_gguf reads a llama (head_dim != d_model / heads): q/k rows back from llama.cpp's RoPE order") {
  nn::LmConfig c = small(270);
  c.head_width = 6;  // heads 2 * 6 = 12 != d_model 8: written as llama.cpp's llama
  round_trip<float>(c, hf::GgufType::f32, "llama");
  c.qkv_bias = true;  // permuted biases too
  c.kv_heads = 2;
  round_trip<float>(c, hf::GgufType::f32, "llama");
  round_trip<double>(c, hf::GgufType::f32, "llama");
}

TEST_CASE("load_gguf reads F16 files exactly: the matrices' halves, into float, double and 16-bit bases") {
  nn::LmConfig c = small(280);
  c.qkv_bias = true;
  round_trip<float>(c, hf::GgufType::f16, "qwen2");
  round_trip<double>(c, hf::GgufType::f16, "qwen2");
  c.head_width = 6;
  round_trip<float>(c, hf::GgufType::f16, "llama");

  ScratchDir dir("gguf_read");
  Tape<float> tp;
  nn::Lm<float> m(tp, c, 5);
  randomize(m, 3);
  const std::string path = dir.file("m.gguf");
  REQUIRE(hf::write_gguf(path, m, vocab_of(c.vocab), {.type = hf::GgufType::f16}).ok());
  // An f16 base holds the file's bits (copied); a bf16 one their rounding.
  for (const Storage s : {Storage::f16, Storage::bf16}) {
    CAPTURE(storage_name(s));
    Tape<float> tq;
    auto g = hf::load_gguf(path, tq, nn::Lm<float>::Train::none, {.base_storage = s});
    for (const auto& p : m.base()) {
      CAPTURE(p.name);
      const auto want = tp.value(p.var).data;
      if (tq.dims(g.model.tensor(p.name)).rank != 2) continue;
      const auto bits = tq.leaf_bits(g.model.tensor(p.name));
      REQUIRE(bits.size() == want.size());
      for (std::size_t i = 0; i < want.size(); ++i) {
        const std::uint16_t half = hf::f16_bits(want[i]);
        REQUIRE(bits[i] == (s == Storage::f16 ? half : round_to_bf16(F16::widen(half))));
      }
    }
  }
  // An F32 file into an f16 base is rounded; a value beyond F16's range is refused, naming it.
  tp.leaf_value(m.tensor("layers.1.up"))[5] = 70000.0f;
  REQUIRE(hf::write_gguf(path, m, vocab_of(c.vocab)).ok());
  Tape<float> tq;
  CHECK_THROWS_WITH_AS(hf::load_gguf(path, tq, nn::Lm<float>::Train::none, {.base_storage = Storage::f16}),
                       doctest::Contains("tensor 'blk.1.ffn_up.weight' (grad's 'layers.1.up')"), hf::Error);
  Tape<float> tr;
  auto g = hf::load_gguf(path, tr, nn::Lm<float>::Train::none, {.base_storage = Storage::bf16});
  CHECK(tr.widened_value(g.model.tensor("layers.1.up"))[5] == 70144.0f);  // bf16's nearest
}

TEST_CASE("load_gguf: options give adapters, max_seq and Train; load_gguf_weights refuses a model of another shape") {
  ScratchDir dir("gguf_read");
  nn::LmConfig c = small(260);
  Tape<float> tp;
  nn::Lm<float> m(tp, c, 5);
  randomize(m, 4);
  const std::string path = dir.file("m.gguf");
  REQUIRE(hf::write_gguf(path, m, vocab_of(260)).ok());
  Tape<float> tq;
  auto g = hf::load_gguf(path, tq, nn::Lm<float>::Train::lora, {.max_seq = 8, .lora_rank = 2, .lora_scale = 4.0});
  CHECK(g.config.max_seq == 8);
  CHECK(g.config.lora_rank == 2);
  CHECK(g.model.adapters().size() == 2 * 2 * nn::proj_count);
  CHECK(tq.value(g.model.tensor("layers.0.q")).data[3] == tp.value(m.tensor("layers.0.q")).data[3]);

  nn::LmConfig other = c;
  other.ffn = 16;
  Tape<float> tr;
  nn::Lm<float> wrong(tr, other, 1);
  const auto before = values(wrong);
  const hf::GgufFile f(path);
  CHECK_THROWS_WITH_AS(hf::load_gguf_weights(f, wrong),
                       doctest::Contains("tensor 'blk.0.ffn_gate.weight' (grad's 'layers.0.gate') is ne {8, 12}, but "
                                         "the qwen2 model (vocab 260, d_model 8, layers 2, heads 2, kv_heads 1, ffn "
                                         "16, max_seq 16) makes it ne {8, 16}"),
                       hf::Error);
  CHECK(values(wrong) == before);  // nothing written
}

TEST_CASE("the GGUF tokenizer encodes as the tokenizer.json it was written from") {
  using nlohmann::json;
  // A byte-level BPE with merges, Qwen2's split, an added special token.
  json vocab = json::object();
  for (unsigned b = 0; b < 256; ++b) vocab[hf::byte_to_symbol(static_cast<unsigned char>(b))] = b;
  const std::vector<std::pair<std::string, std::string>> merges = {{"\xc4\xa0", "t"}, {"h", "e"},  {"\xc4\xa0t", "he"},
                                                                   {"l", "l"},        {"ll", "o"}, {"1", "2"}};
  json merge_list = json::array();
  int id = 256;
  for (const auto& [l, r] : merges) {
    vocab[l + r] = id++;
    merge_list.push_back(l + " " + r);
  }
  const json split = {
      {"type", "Split"},
      {"pattern",
       {{"Regex",
         R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
      {"behavior", "Isolated"},
      {"invert", false}};
  const json bytes = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", false}, {"use_regex", false}};
  const json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}},
                  {"added_tokens", json::array({{{"id", id}, {"content", "<|endoftext|>"}, {"special", true}}})},
                  {"pre_tokenizer", {{"type", "Sequence"}, {"pretokenizers", json::array({split, bytes})}}},
                  {"decoder", {{"type", "ByteLevel"}}}};
  const hf::Tokenizer original = hf::Tokenizer::from_json(j.dump(), "original.json");
  const hf::BpeVocab v = hf::bpe_vocab(original, 270);  // ids 263 .. 269 unused
  CHECK(v.pre == "qwen2");

  ScratchDir dir("gguf_read");
  nn::LmConfig c = small(270);
  Tape<float> tp;
  nn::Lm<float> m(tp, c, 1);
  REQUIRE(hf::write_gguf(dir.file("m.gguf"), m, v).ok());
  Tape<float> tq;
  auto g = hf::load_gguf(dir.file("m.gguf"), tq, nn::Lm<float>::Train::none,
                         {.tokenizer = hf::GgufLoadOptions::TokenizerMode::required});
  REQUIRE(g.tokenizer.has_value());
  REQUIRE(g.vocab.has_value());
  CHECK(g.vocab->tokens == v.tokens);
  CHECK(g.vocab->merges == v.merges);
  CHECK(g.vocab->eos == v.eos);
  for (const std::string& text :
       std::vector<std::string>{"the hello 12 world<|endoftext|>tell", "  hello\n\nthe  123 'll", "",
                                "caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd!", std::string("\xff\xfe bytes \x01", 10)}) {
    CAPTURE(text);
    CHECK(g.tokenizer->encode(text) == original.encode(text));
    CHECK(g.tokenizer->decode(g.tokenizer->encode(text)) == text);
  }
  CHECK(g.tokenizer->encode("<|endoftext|>") == std::vector<int>{262});
  CHECK(g.tokenizer->vocab_size() == 263);
  CHECK_FALSE(g.tokenizer->id_to_token(265).has_value());  // unused ids have no token

  SUBCASE("add_bos puts bos before the text; llama-bpe ignores merges for whole tokens") {
    hf::BpeVocab w = v;
    w.bos = 262;
    w.add_bos = true;
    w.pre = "llama-bpe";
    const hf::Tokenizer t = hf::bpe_tokenizer(w);
    CHECK(t.encode("hello") == std::vector<int>{262, 257, 260});  // bos, "he", "llo"
  }
  SUBCASE("a pre-tokenizer name grad does not know is refused by name") {
    hf::BpeVocab w = v;
    w.pre = "deepseek-llm";
    CHECK_THROWS_WITH_AS(hf::bpe_tokenizer(w), doctest::Contains("tokenizer.ggml.pre \"deepseek-llm\""),
                         hf::TokenizerError);
  }
}

TEST_CASE("GgufFile reads every metadata value type, nested arrays, and hands tensors over as mapped bytes") {
  ScratchDir dir("gguf_read");
  Bytes kv;
  kv.str("a.u8").put<std::uint32_t>(0).put<std::uint8_t>(200);
  kv.str("a.i8").put<std::uint32_t>(1).put<std::int8_t>(-5);
  kv.str("a.u16").put<std::uint32_t>(2).put<std::uint16_t>(60000);
  kv.str("a.i16").put<std::uint32_t>(3).put<std::int16_t>(-30000);
  kv.str("a.u32").put<std::uint32_t>(4).put<std::uint32_t>(4000000000u);
  kv.str("a.i32").put<std::uint32_t>(5).put<std::int32_t>(-7);
  kv.str("a.f32").put<std::uint32_t>(6).put<float>(0.1f);
  kv.str("a.bool").put<std::uint32_t>(7).put<std::uint8_t>(1);
  kv.str("a.string").put<std::uint32_t>(8).str("hello");
  kv.str("a.u64").put<std::uint32_t>(10).put<std::uint64_t>(UINT64_MAX);
  kv.str("a.i64").put<std::uint32_t>(11).put<std::int64_t>(INT64_MIN);
  kv.str("a.f64").put<std::uint32_t>(12).put<double>(0.1);
  kv.str("a.ints")
      .put<std::uint32_t>(9)
      .put<std::uint32_t>(3)
      .put<std::uint64_t>(2)
      .put<std::int16_t>(-1)
      .put<std::int16_t>(9);
  kv.str("a.strings").put<std::uint32_t>(9).put<std::uint32_t>(8).put<std::uint64_t>(2).str("x").str("");
  // [[1, 2], []] as arrays of u8
  kv.str("a.nested").put<std::uint32_t>(9).put<std::uint32_t>(9).put<std::uint64_t>(2);
  kv.put<std::uint32_t>(0).put<std::uint64_t>(2).put<std::uint8_t>(1).put<std::uint8_t>(2);
  kv.put<std::uint32_t>(0).put<std::uint64_t>(0);
  const std::string path = dir.file("all.gguf");
  write_bytes(path, crafted(15, kv));
  const hf::GgufFile f(path);
  CHECK(f.version() == 3);
  CHECK(f.metadata().size() == 15);
  CHECK(f.find("a.u8")->as_size() == 200u);
  CHECK(f.find("a.i8")->integer == -5);
  CHECK_FALSE(f.find("a.i8")->as_size().has_value());
  CHECK(f.find("a.u16")->as_size() == 60000u);
  CHECK(f.find("a.i16")->integer == -30000);
  CHECK(f.find("a.u32")->as_size() == 4000000000u);
  CHECK(f.find("a.i32")->integer == -7);
  CHECK(f.find("a.f32")->as_real() == static_cast<double>(0.1f));
  CHECK(f.find("a.bool")->integer == 1);
  CHECK(f.find("a.string")->string == "hello");
  CHECK(f.find("a.u64")->as_size() == UINT64_MAX);
  CHECK(f.find("a.i64")->integer == INT64_MIN);
  CHECK(f.find("a.f64")->as_real() == 0.1);
  CHECK(f.find("a.ints")->integer_at(0) == -1);
  CHECK(f.find("a.ints")->integer_at(1) == 9);
  CHECK(f.find("a.strings")->strings == std::vector<std::string>{"x", ""});
  const hf::GgufValue& nested = *f.find("a.nested");
  REQUIRE(nested.items.size() == 2);
  CHECK(nested.items[0].integer_at(1) == 2);
  CHECK(nested.items[1].count == 0);
  CHECK(nested.describe() == "array of 2 array");
  const hf::GgufTensorInfo* t = f.tensor("t");
  REQUIRE(t != nullptr);
  CHECK(t->ne == std::vector<std::uint64_t>{4});
  const auto bytes = f.bytes(*t);
  REQUIRE(bytes.size() == 16);
  float x[4];
  std::memcpy(x, bytes.data(), 16);
  CHECK(x[3] == 4.0f);
  CHECK(f.tensor("u") == nullptr);
}

TEST_CASE("GgufFile refuses malformed headers by name: magic, version, lengths, counts, types, depth, tensors") {
  ScratchDir dir("gguf_read");
  auto refused = [&](const std::vector<unsigned char>& bytes, const std::string& part) {
    const std::string why = open_error(dir, bytes);
    CAPTURE(why);
    CHECK_FALSE(why.empty());
    CHECK(why.find(part) != std::string::npos);
  };
  const std::vector<unsigned char> good = crafted(0, {});
  CHECK(open_error(dir, good).empty());
  {
    auto b = good;
    b[0] = 'X';
    refused(b, "the magic is 58 47 55 46 (expected \"GGUF\"");
  }
  refused(crafted(0, {}, 1), "GGUF version 1");
  refused(crafted(0, {}, 4), "GGUF version 4 (expected 2 or 3)");
  refused(crafted(0, {}, 0x03000000u), "big-endian");
  CHECK(open_error(dir, crafted(0, {}, 2)).empty());
  refused({'G', 'G'}, "shorter than GGUF's magic");
  {
    Bytes kv;
    kv.put<std::uint64_t>(std::uint64_t{1} << 60);  // a key of 2^60 bytes
    refused(crafted(1, kv), "metadata pair 0's key: a string of 1152921504606846976 bytes");
  }
  {
    Bytes kv;
    kv.str("s").put<std::uint32_t>(8).put<std::uint64_t>(std::uint64_t{1} << 60);
    refused(crafted(1, kv), "metadata 's': 1152921504606846976 bytes at byte");
  }
  {
    Bytes kv;
    kv.str("a").put<std::uint32_t>(9).put<std::uint32_t>(4).put<std::uint64_t>(std::uint64_t{1} << 60);
    refused(crafted(1, kv), "metadata 'a' (array of 1152921504606846976 u32): at least 4 bytes each");
  }
  {
    Bytes kv;
    kv.str("a").put<std::uint32_t>(13).put<std::uint32_t>(0);
    refused(crafted(1, kv), "metadata 'a''s value type 13 is no GGUF value type");
  }
  {
    Bytes kv;
    kv.str("a").put<std::uint32_t>(7).put<std::uint8_t>(2);
    refused(crafted(1, kv), "metadata 'a': a bool of 2 (expected 0 or 1)");
  }
  {
    Bytes kv;  // 20 levels of arrays of one array
    kv.str("deep").put<std::uint32_t>(9);
    for (int i = 0; i < 20; ++i) kv.put<std::uint32_t>(9).put<std::uint64_t>(1);
    kv.put<std::uint32_t>(0).put<std::uint64_t>(0);
    refused(crafted(1, kv), "arrays nested deeper than 8 levels");
  }
  {
    Bytes kv;
    kv.str("k").put<std::uint32_t>(4).put<std::uint32_t>(1).str("k").put<std::uint32_t>(4).put<std::uint32_t>(2);
    refused(crafted(2, kv), "metadata 'k' (pair 1) is given twice");
  }
  {
    Bytes kv;
    kv.str("general.alignment").put<std::uint32_t>(4).put<std::uint32_t>(24);
    refused(crafted(1, kv), "metadata 'general.alignment' is u32 24 (expected a u32 power of two)");
  }
  {
    auto b = good;
    poke<std::uint64_t>(b, 16, std::uint64_t{1} << 62);  // the metadata count
    refused(b, "the metadata count 4611686018427387904: at least 14 bytes each");
  }
  {
    auto b = good;
    poke<std::uint64_t>(b, 8, std::uint64_t{1} << 62);  // the tensor count
    refused(b, "the tensor count 4611686018427387904");
  }
  // The tensor info of crafted(0, {}): name at 24 (8 + 1), n_dims at 33, ne[0] at 37, type at 45, offset at 49.
  {
    auto b = good;
    poke<std::uint32_t>(b, 33, 5);
    refused(b, "tensor 't': n_dims 5 (expected 1 .. 4)");
  }
  {
    auto b = good;
    poke<std::uint64_t>(b, 37, 0);
    refused(b, "tensor 't': ne[0] is 0");
  }
  {
    auto b = good;
    poke<std::uint32_t>(b, 45, 99);
    refused(b, "tensor 't': type 99 is no ggml type this reader knows");
  }
  {
    auto b = good;
    poke<std::uint32_t>(b, 45, 12);  // q4_K: 256-value blocks
    refused(b, "tensor 't': ne {4} of type q4_K: ne[0] is not a multiple of its 256-value blocks");
  }
  {
    auto b = good;
    poke<std::uint64_t>(b, 49, 8);
    refused(b, "tensor 't': offset 8 is not a multiple of the alignment 32");
  }
  {
    auto b = good;
    poke<std::uint64_t>(b, 49, 32);
    refused(b, "tensor 't': bytes [32, 48) of the data section, which holds 16");
  }
  {
    auto b = good;
    poke<std::uint64_t>(b, 37, std::uint64_t{1} << 62);
    refused(b, "tensor 't': ne {4611686018427387904} of type f32 is more than 2^64 bytes");
  }
  {  // two tensors on the same bytes
    Bytes f;
    f.b = {'G', 'G', 'U', 'F'};
    f.put<std::uint32_t>(3).put<std::uint64_t>(2).put<std::uint64_t>(0);
    f.str("a").put<std::uint32_t>(1).put<std::uint64_t>(4).put<std::uint32_t>(0).put<std::uint64_t>(0);
    f.str("b").put<std::uint32_t>(1).put<std::uint64_t>(2).put<std::uint32_t>(0).put<std::uint64_t>(0);
    f.pad(32);
    f.b.resize(f.b.size() + 64);
    refused(f.b, "overlap in the data section");
    poke<std::uint64_t>(f.b, 4 + 4 + 16 + 9 + 4 + 8 + 4 + 8 + 9 + 4 + 8 + 4, 32);  // b's offset: 32
    CHECK(open_error(dir, f.b) == "");  // and apart they are fine (b ends at 40 <= 64)
  }
  refused({'G', 'G', 'U', 'F', 3, 0, 0, 0, 1}, "the tensor count: 8 bytes at byte 8, but the file ends at byte 9");
  // A FIFO is refused, not waited on.
  const std::string fifo = dir.file("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THROWS_WITH_AS(hf::GgufFile{fifo}, doctest::Contains("is a FIFO, not a regular file"), hf::Error);
}

TEST_CASE("load_gguf refuses metadata the tensors do not bear out, and keys grad cannot honour, by name") {
  ScratchDir dir("gguf_read");
  nn::LmConfig c = small(260);
  c.qkv_bias = true;
  Tape<float> tp;
  nn::Lm<float> m(tp, c, 5);
  randomize(m, 6);
  const std::string path = dir.file("m.gguf");
  REQUIRE(hf::write_gguf(path, m, vocab_of(260)).ok());
  const std::vector<unsigned char> good = read_bytes(path);
  CHECK(load_error(dir, good).empty());
  auto refused = [&](const std::vector<unsigned char>& bytes, const std::string& part) {
    const std::string why = load_error(dir, bytes);
    CAPTURE(why);
    CHECK_FALSE(why.empty());
    CHECK(why.find(part) != std::string::npos);
  };
  {
    auto b = good;
    poke<std::uint32_t>(b, value_at(b, "qwen2.feed_forward_length"), 13);
    refused(b, "tensor 'blk.0.ffn_gate.weight' is ne {8, 12}, but the qwen2 model the metadata describes");
  }
  {
    auto b = good;
    poke<std::uint32_t>(b, value_at(b, "qwen2.feed_forward_length"),
                        1u << 23);  // 2^23 * 8 * 3 * 2 floats: no allocation
    refused(b, "tensor 'blk.0.ffn_gate.weight' is ne {8, 12}, but the qwen2 model the metadata describes");
  }
  {
    auto b = good;
    const std::string key = "qwen2.block_count";
    const auto at = value_at(b, key) - 4 - key.size();
    b[at + key.size() - 1] = '_';  // qwen2.block_coun_
    refused(b, "metadata 'qwen2.block_count' is missing");
  }
  {
    auto b = good;
    const std::string key = "general.architecture";
    poke<std::uint8_t>(b, value_at(b, key) + 8, 'Q');
    refused(b, "metadata 'general.architecture' is \"Qwen2\": an architecture grad does not read");
  }
  {
    auto b = good;
    poke<std::uint32_t>(b, value_at(b, "qwen2.attention.head_count_kv"), 3);
    refused(b, "heads 2 and kv_heads 3");
  }
  {
    auto b = good;
    poke<std::uint32_t>(b, value_at(b, "qwen2.rope.dimension_count"), 2);
    refused(b, "metadata 'qwen2.rope.dimension_count' is 2 for heads 4 wide");
  }
  {
    auto b = good;
    const std::string key = "qwen2.embedding_length";
    poke<std::uint32_t>(b, value_at(b, key) - 4, 8);  // its type: a string now
    refused(b, "grad::hf: GGUF '");                   // some refusal: the bytes no longer parse as the same pairs
  }
  {  // a tensor the model has no place for: rename output_norm
    auto b = good;
    const std::string name = "output_norm.weight";
    auto it = std::search(b.begin(), b.end(), name.begin(), name.end());
    REQUIRE(it != b.end());
    *it = 'O';
    refused(b, "tensor 'output_norm.weight' is missing");
  }
  {  // nonzero biases dropped from one layer
    auto b = good;
    const std::string name = "blk.1.attn_v.bias";
    auto it = std::search(b.begin(), b.end(), name.begin(), name.end());
    REQUIRE(it != b.end());
    *(it + 4) = 'x';  // blk.1.xttn_v.bias
    refused(b, "tensor 'blk.1.attn_v.bias' is missing, but 'blk.1.attn_k.bias' is there");
  }
  {  // a quantized type where F32 was: refused by name (until grad dequantizes)
    auto b = good;
    const std::string name = "blk.0.attn_norm.weight";
    auto it = std::search(b.begin(), b.end(), name.begin(), name.end());
    REQUIRE(it != b.end());
    const std::size_t type_at = static_cast<std::size_t>(it - b.begin()) + name.size() + 4 + 8;
    poke<std::uint32_t>(b, type_at, 24);  // i8: 8 bytes
    refused(b, "tensor 'blk.0.attn_norm.weight' (grad's 'layers.0.attn_norm') is type i8");
  }
  // A SentencePiece tokenizer: the weights load, the tokenizer is absent and says why.
  {
    auto b = good;
    const auto at = value_at(b, "tokenizer.ggml.model");
    REQUIRE(std::string(b.begin() + at + 8, b.begin() + at + 12) == "gpt2");
    std::memcpy(b.data() + at + 8, "xxxx", 4);
    write_bytes(dir.file("spm.gguf"), b);
    Tape<float> tq;
    auto g = hf::load_gguf(dir.file("spm.gguf"), tq);
    CHECK_FALSE(g.tokenizer.has_value());
    CHECK(g.tokenizer_problem.find("tokenizer.ggml.model is \"xxxx\"") != std::string::npos);
    Tape<float> tr;
    CHECK_THROWS_AS(hf::load_gguf(dir.file("spm.gguf"), tr, nn::Lm<float>::Train::none,
                                  {.tokenizer = hf::GgufLoadOptions::TokenizerMode::required}),
                    hf::TokenizerError);
  }
}

TEST_CASE("load_gguf on a file truncated anywhere, or with any header byte changed, refuses or loads: never a crash") {
  ScratchDir dir("gguf_read");
  nn::LmConfig c = small(260);
  c.qkv_bias = true;
  c.head_width = 6;
  Tape<float> tp;
  nn::Lm<float> m(tp, c, 5);
  randomize(m, 7);
  const std::string path = dir.file("m.gguf");
  REQUIRE(hf::write_gguf(path, m, vocab_of(260), {.type = hf::GgufType::f16}).ok());
  const std::vector<unsigned char> good = read_bytes(path);
  const std::size_t data = hf::GgufFile(path).data_offset();
  // Every length a truncation can leave in the header, and every 97th in the data.
  std::size_t refusals = 0, loads = 0;
  for (std::size_t n = 0; n < good.size(); n += n < data + 64 ? 1 : 97) {
    const std::vector<unsigned char> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    const std::string why = load_error(dir, cut);
    if (why.empty()) {
      ++loads;
    } else {
      ++refusals;
      REQUIRE_MESSAGE(why.find("grad::hf: GGUF '") == 0, why);
    }
  }
  CHECK(refusals > data);
  CHECK(loads == 0);  // the last tensor's bytes run to the end of the file (or its padding)
  // Every byte of the header (metadata and tensor infos) set to three values.
  std::size_t changed = 0;
  for (std::size_t i = 4; i < data; ++i)
    for (const unsigned char x : {0x00, 0xff, 0x41}) {
      if (good[i] == x) continue;
      std::vector<unsigned char> b = good;
      b[i] = x;
      const std::string why = load_error(dir, b);
      if (!why.empty()) {
        ++changed;
        REQUIRE_MESSAGE(why.find("grad::hf: GGUF '") == 0, why);
      }
    }
  CHECK(changed > data);
}

namespace {

// A value back into the format's bytes (the scalar and array kinds write_gguf uses).
void put_value(Bytes& b, const hf::GgufValue& v) {
  using VT = hf::GgufValueType;
  switch (v.type) {
    case VT::u32:
      b.put(static_cast<std::uint32_t>(v.unsigned_integer));
      break;
    case VT::f32:
      b.put(static_cast<float>(v.real));
      break;
    case VT::boolean:
      b.put(static_cast<std::uint8_t>(v.integer));
      break;
    case VT::string:
      b.str(v.string);
      break;
    case VT::array:
      b.put(static_cast<std::uint32_t>(v.element_type)).put(v.count);
      if (v.element_type == VT::string)
        for (const std::string& s : v.strings) b.str(s);
      else
        b.b.insert(b.b.end(), v.raw.begin(), v.raw.end());
      break;
    default:
      FAIL("a value type write_gguf does not write");
  }
}

}  // namespace

TEST_CASE("load_gguf dequantizes q8_0, q4_0, q4_K, q5_K and q6_K tensors exactly, transposed as the others") {
  ScratchDir dir("gguf_read");
  CHECK(hf::ggml_type_info(8)->block_bytes == quant_info(QuantFormat::q8_0).block_bytes);
  for (const QuantFormat q : quant_formats) {
    const hf::GgmlTypeInfo* info = hf::ggml_type_info(quant_info(q).ggml_type);
    REQUIRE(info != nullptr);
    CHECK(info->name == quant_info(q).name);
    CHECK(info->block_elements == quant_info(q).block_elements);
    CHECK(info->block_bytes == quant_info(q).block_bytes);
  }
  // A model whose rows are 256 wide (K-quants' blocks), written F32, then
  // rewritten with every matrix quantized, the formats taking turns.
  nn::LmConfig c = small(260);
  c.d_model = 256;
  c.ffn = 256;
  c.heads = 4;
  c.kv_heads = 2;
  c.layers = 1;
  c.qkv_bias = true;
  c.head_width = 128;  // 4 * 128 != 256: a llama, its q and k rows permuted
  Tape<float> tp;
  nn::Lm<float> m(tp, c, 5);
  randomize(m, 9);
  REQUIRE(hf::write_gguf(dir.file("f32.gguf"), m, vocab_of(260)).ok());
  const hf::GgufFile f32(dir.file("f32.gguf"));
  // The file again, each matrix quantized (quantized) or holding its
  // dequantized values as F32 (not): the F32 file's load the round trips prove.
  auto rewrite = [&](bool quantized) {
    Bytes out;
    out.b = {'G', 'G', 'U', 'F'};
    out.put<std::uint32_t>(3).put<std::uint64_t>(f32.tensors().size()).put<std::uint64_t>(f32.metadata().size());
    for (const auto& kv : f32.metadata()) {
      out.str(kv.key).put(static_cast<std::uint32_t>(kv.value.type));
      put_value(out, kv.value);
    }
    std::vector<std::vector<unsigned char>> data;
    std::uint64_t offset = 0;
    std::size_t turn = 0;
    for (const hf::GgufTensorInfo& t : f32.tensors()) {
      std::vector<float> x(t.elements);
      std::memcpy(x.data(), f32.bytes(t).data(), t.byte_count);
      std::vector<unsigned char> bytes(f32.bytes(t).begin(), f32.bytes(t).end());
      std::uint32_t type = 0;
      if (t.ne.size() == 2) {
        const QuantFormat q = quant_formats[turn++ % quant_formats.size()];
        std::vector<unsigned char> blocks(quant_bytes(q, x.size()));
        quantize(q, x.data(), blocks.data(), x.size());
        if (quantized) {
          type = quant_info(q).ggml_type;
          bytes = blocks;
        } else {
          dequantize(q, blocks.data(), x.data(), x.size());
          std::memcpy(bytes.data(), x.data(), bytes.size());
        }
      }
      out.str(t.name).put<std::uint32_t>(static_cast<std::uint32_t>(t.ne.size()));
      for (auto d : t.ne) out.put(d);
      out.put(type).put(offset);
      bytes.resize((bytes.size() + 31) / 32 * 32, 0);
      offset += bytes.size();
      data.push_back(std::move(bytes));
    }
    CHECK(turn == 9);  // embedding, 7 projections, head
    out.pad(32);
    for (const auto& d : data) out.b.insert(out.b.end(), d.begin(), d.end());
    return out.b;
  };
  write_bytes(dir.file("q.gguf"), rewrite(true));
  write_bytes(dir.file("deq.gguf"), rewrite(false));
  Tape<float> tr;
  auto expected = hf::load_gguf(dir.file("deq.gguf"), tr);
  const auto want = values(expected.model);
  for (const Storage s : {Storage::native, Storage::bf16}) {
    CAPTURE(storage_name(s));
    Tape<float> tq;
    auto g = hf::load_gguf(dir.file("q.gguf"), tq, nn::Lm<float>::Train::none, {.base_storage = s});
    check_same_config(g.config, c);
    const auto got = values(g.model);
    for (const auto& [name, v] : want) {
      CAPTURE(name);
      std::vector<float> w = v;
      if (s == Storage::bf16 && tq.dims(g.model.tensor(name)).rank == 2)
        for (float& x : w) x = Bf16::widen(round_to_bf16(x));
      CHECK(same_bits(w, got.at(name)));
    }
    if (s == Storage::native) CHECK(same_bits(logits(expected.model), logits(g.model)));
  }
  {  // as_stored: every matrix keeps the file's blocks (the same values, the same logits' bits)
    Tape<float> tq;
    auto g = hf::load_gguf(dir.file("q.gguf"), tq, nn::Lm<float>::Train::none, {.as_stored = true});
    const hf::GgufFile q(dir.file("q.gguf"));
    const auto got = values(g.model);
    for (const auto& [name, v] : want) {
      CAPTURE(name);
      CHECK(same_bits(v, got.at(name)));
    }
    CHECK(same_bits(logits(expected.model), logits(g.model)));
    std::size_t kept = 0;
    for (const auto& p : g.model.base()) {
      if (tq.dims(p.var).rank != 2) continue;
      CAPTURE(p.name);
      const bool embed = p.name == "embed";
      const hf::GgufTensorInfo* t = q.tensor(embed ? "token_embd.weight"
                                             : p.name == "head" ? "output.weight"
                                                                : "blk.0.ffn_" + p.name.substr(9) + ".weight");
      if (!t) continue;  // the attention's names differ: the others suffice
      REQUIRE(quant_format_from_ggml(t->type).has_value());
      CHECK(tq.storage(p.var) == storage_of(*quant_format_from_ggml(t->type)));
      CHECK(tq.transposed(p.var) == !embed);
      // Byte for byte, row by row (the tape's rows lie in groups of sixteen: numerics/quant_rows.hpp).
      const QuantRows m = tq.held_rows(p.var);
      REQUIRE(m.rows * m.row_bytes() == q.bytes(*t).size());
      std::vector<std::uint8_t> row(m.row_bytes());
      bool same = true;
      for (std::size_t r = 0; r < m.rows; ++r) {
        get_row_blocks(m, tq.leaf_blocks(p.var).data(), r, row.data());
        same = same && std::equal(row.begin(), row.end(), q.bytes(*t).begin() + static_cast<std::ptrdiff_t>(r * row.size()));
      }
      CHECK(same);
      ++kept;
    }
    CHECK(kept == 5);  // embed, gate, up, down, head
    // Into a quantized base of one format: each matrix rounded again by ggml's quantizer from the file's values.
    Tape<float> t8;
    auto r = hf::load_gguf(dir.file("q.gguf"), t8, nn::Lm<float>::Train::none, {.base_storage = Storage::q8_0});
    const auto again = values(r.model);
    for (const auto& p : r.model.base()) {
      if (t8.dims(p.var).rank != 2) continue;
      CAPTURE(p.name);
      CHECK(t8.storage(p.var) == Storage::q8_0);
      // The memory rows (the transpose's, but for the embedding), rounded as ggml rounds them.
      const std::vector<float>& v = want.at(p.name);
      const std::size_t rows = t8.dims(p.var).d[0], cols = t8.dims(p.var).d[1];
      const bool transposed = p.name != "embed";
      std::vector<float> memory(v.size()), blocks_back(v.size());
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j) (transposed ? memory[j * rows + i] : memory[i * cols + j]) = v[i * cols + j];
      std::vector<std::uint8_t> blocks(quant_bytes(QuantFormat::q8_0, v.size()));
      quantize(QuantFormat::q8_0, memory.data(), blocks.data(), v.size());
      dequantize(QuantFormat::q8_0, blocks.data(), blocks_back.data(), v.size());
      for (std::size_t i = 0; i < rows; ++i)
        for (std::size_t j = 0; j < cols; ++j)
          CHECK(again.at(p.name)[i * cols + j] == (transposed ? blocks_back[j * rows + i] : blocks_back[i * cols + j]));
    }
    // A quantized base trains its adapters (Train::lora) as stored.
    Tape<float> tl;
    auto lora = hf::load_gguf(dir.file("q.gguf"), tl, nn::Lm<float>::Train::lora, {.lora_rank = 4, .as_stored = true});
    CHECK(tl.storage(lora.model.tensor("layers.0.q")) != Storage::native);
    Tape<float> tf;
    CHECK_THROWS_WITH(hf::load_gguf(dir.file("q.gguf"), tf, nn::Lm<float>::Train::full, {.as_stored = true}),
                      doctest::Contains("needs Train::lora"));
  }
  {  // a quantized format grad does not dequantize: refused by name (iq4_xs where q4_K was: fewer bytes, so it parses)
    std::vector<unsigned char> b = read_bytes(dir.file("q.gguf"));
    const std::string name = "blk.0.attn_k.weight";
    const auto it = std::search(b.begin(), b.end(), name.begin(), name.end());
    REQUIRE(it != b.end());
    const std::size_t type_at = static_cast<std::size_t>(it - b.begin()) + name.size() + 4 + 2 * 8;
    std::uint32_t type = 0;
    std::memcpy(&type, b.data() + type_at, 4);
    REQUIRE(type == quant_info(QuantFormat::q4_k).ggml_type);
    poke<std::uint32_t>(b, type_at, 23);
    CHECK(open_error(dir, b).empty());
    CHECK(load_error(dir, b).find("tensor 'blk.0.attn_k.weight' (grad's 'layers.0.k') is type iq4_xs, a quantized "
                                  "format grad does not read") != std::string::npos);
  }
  // The quantized values are not the F32 ones (the test would be empty if they were).
  CHECK_FALSE(same_bits(values(m).at("layers.0.q"), want.at("layers.0.q")));
}
