// grad::hf's GGUF export without llama.cpp: F16 rounding against the
// compiler's _Float16, GPT-2's byte alphabet, the file read back by a
// reader written here from the format's description (header, every
// metadata value, tensor infos, 32-byte alignment, transposed data), and
// every refusal leaving nothing behind. test/llama_cpp/ runs the files
// through llama.cpp itself.
#include <doctest/doctest.h>
#include <sys/stat.h>

#include <fstream>
#include <grad/hf/gguf.hpp>
#include <grad/hf/gguf_load.hpp>
#include <grad/lm.hpp>
#include <map>
#include <set>
#include <sstream>
#include <variant>

#include "support.hpp"

using namespace grad;
using namespace grad::testing;

namespace {

// ---- a GGUF reader, independent of the writer ----
using Value = std::variant<std::uint32_t, std::int32_t, float, bool, std::string, std::vector<std::string>,
                           std::vector<std::int32_t>>;
struct TensorInfo {
  std::vector<std::uint64_t> ne;
  std::uint32_t type = 0;
  std::uint64_t offset = 0;
};
struct Gguf {
  std::uint32_t version = 0;
  std::map<std::string, Value> kv;
  std::vector<std::string> order;  // tensor names in file order
  std::map<std::string, TensorInfo> tensors;
  std::size_t data_start = 0;
  std::vector<unsigned char> bytes;

  template <class U>
  std::vector<U> data(const std::string& name) const {
    const TensorInfo& t = tensors.at(name);
    std::size_t n = 1;
    for (auto d : t.ne) n *= d;
    std::vector<U> v(n);
    REQUIRE(data_start + t.offset + n * sizeof(U) <= bytes.size());
    std::memcpy(v.data(), bytes.data() + data_start + t.offset, n * sizeof(U));
    return v;
  }
};

Gguf read_gguf(const std::string& path) {
  Gguf g;
  g.bytes = read_bytes(path);
  std::size_t at = 0;
  auto get = [&]<class U>(U) {
    U v;
    REQUIRE(at + sizeof(U) <= g.bytes.size());
    std::memcpy(&v, g.bytes.data() + at, sizeof(U));
    at += sizeof(U);
    return v;
  };
  auto str = [&] {
    const auto n = get(std::uint64_t{});
    REQUIRE(at + n <= g.bytes.size());
    std::string s(reinterpret_cast<const char*>(g.bytes.data() + at), n);
    at += n;
    return s;
  };
  REQUIRE(g.bytes.size() >= 24);
  CHECK(std::string(g.bytes.begin(), g.bytes.begin() + 4) == "GGUF");
  at = 4;
  g.version = get(std::uint32_t{});
  const auto tensors = get(std::uint64_t{}), kvs = get(std::uint64_t{});
  for (std::uint64_t i = 0; i < kvs; ++i) {
    const std::string key = str();
    const auto type = get(std::uint32_t{});
    Value v;
    switch (type) {
      case 4:
        v = get(std::uint32_t{});
        break;
      case 5:
        v = get(std::int32_t{});
        break;
      case 6:
        v = get(float{});
        break;
      case 7:
        v = get(std::uint8_t{}) != 0;
        break;
      case 8:
        v = str();
        break;
      case 9: {
        const auto elem = get(std::uint32_t{});
        const auto n = get(std::uint64_t{});
        if (elem == 8) {
          std::vector<std::string> s;
          for (std::uint64_t j = 0; j < n; ++j) s.push_back(str());
          v = s;
        } else {
          REQUIRE(elem == 5);
          std::vector<std::int32_t> s;
          for (std::uint64_t j = 0; j < n; ++j) s.push_back(get(std::int32_t{}));
          v = s;
        }
        break;
      }
      default:
        FAIL("metadata '" << key << "' has type " << type);
    }
    CHECK_MESSAGE(g.kv.emplace(key, v).second, key << " twice");
  }
  for (std::uint64_t i = 0; i < tensors; ++i) {
    const std::string name = str();
    TensorInfo t;
    const auto dims = get(std::uint32_t{});
    for (std::uint32_t j = 0; j < dims; ++j) t.ne.push_back(get(std::uint64_t{}));
    t.type = get(std::uint32_t{});
    t.offset = get(std::uint64_t{});
    CHECK(t.offset % 32 == 0);
    g.order.push_back(name);
    g.tensors[name] = t;
  }
  g.data_start = (at + 31) / 32 * 32;
  return g;
}

nn::LmConfig small(std::size_t vocab) {
  nn::LmConfig c;
  c.vocab = vocab;
  c.d_model = 8;
  c.layers = 2;
  c.heads = 2;
  c.kv_heads = 1;
  c.ffn = 12;
  c.max_seq = 16;
  return c;
}

bool nothing_left(const ScratchDir& dir) { return std::filesystem::is_empty(dir.dir); }

}  // namespace

TEST_CASE("f16_bits rounds to nearest, ties to even, as the compiler's _Float16 does") {
  // Every half, its neighbours' midpoints (the ties) and the floats beside them.
  std::size_t checked = 0;
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float v = hf::f16_value(static_cast<std::uint16_t>(h));
    const _Float16 ref = std::bit_cast<_Float16>(static_cast<std::uint16_t>(h));
    if (std::isnan(v)) {
      CHECK(std::isnan(static_cast<float>(ref)));
      CHECK(std::isnan(hf::f16_value(hf::f16_bits(v))));
      continue;
    }
    REQUIRE(v == static_cast<float>(ref));
    REQUIRE(hf::f16_bits(v) == h);
    if ((h & 0x7fff) >= 0x7c00) continue;
    const float next = hf::f16_value(static_cast<std::uint16_t>(h + 1));
    const float mid = std::isinf(next) ? std::copysign(65520.0f, v) : (v + next) / 2;  // exact in float
    for (const float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 2 * mid)}) {
      CAPTURE(x);
      REQUIRE(hf::f16_bits(x) == std::bit_cast<std::uint16_t>(static_cast<_Float16>(x)));
      ++checked;
    }
  }
  // Random floats over the whole range of exponents.
  Rng g(5);
  for (int i = 0; i < 2'000'000; ++i) {
    const float x = std::bit_cast<float>(static_cast<std::uint32_t>(g.next()));
    if (std::isnan(x)) continue;
    CAPTURE(x);
    REQUIRE(hf::f16_bits(x) == std::bit_cast<std::uint16_t>(static_cast<_Float16>(x)));
    ++checked;
  }
  MESSAGE(checked << " floats rounded as _Float16 rounds them");
  CHECK(hf::f16_bits(65504.0f) == 0x7bff);
  CHECK(hf::f16_bits(65519.99f) == 0x7bff);
  CHECK(hf::f16_bits(65520.0f) == 0x7c00);  // the tie above the largest half goes to even: infinity
  CHECK(hf::f16_bits(-0.0f) == 0x8000);
  CHECK(hf::f16_bits(std::ldexp(1.0f, -25)) == 0);       // half the least subnormal: the tie goes to even (zero)
  CHECK(hf::f16_bits(std::ldexp(1.5f, -25)) == 1);       // above it: the least subnormal
  CHECK(hf::f16_bits(std::ldexp(1.0f, -14)) == 0x0400);  // the least normal
}

TEST_CASE("byte_token is GPT-2's byte-to-unicode map: printable bytes as themselves, the rest from U+0100") {
  CHECK(hf::byte_token('A') == "A");
  CHECK(hf::byte_token('!') == "!");
  CHECK(hf::byte_token(' ') == "\xc4\xa0");   // Ġ
  CHECK(hf::byte_token('\n') == "\xc4\x8a");  // Ċ
  CHECK(hf::byte_token(0) == "\xc4\x80");     // Ā
  CHECK(hf::byte_token(0xad) == "\xc5\x83");  // Ń, the last one that does not print
  CHECK(hf::byte_token(0xff) == "\xc3\xbf");  // ÿ
  const hf::BpeVocab v = hf::byte_level_vocab({"<|endoftext|>"});
  CHECK(v.tokens.size() == 257);
  CHECK(v.eos == 256u);
  CHECK(hf::check_vocab(v, 257).empty());  // 257 distinct texts
}

TEST_CASE("write_gguf writes a qwen2 GGUF v3: metadata, llama.cpp's names and dims, transposed matrices") {
  ScratchDir dir("gguf");
  nn::LmConfig c = small(259);
  Tape<float> tp;
  nn::Lm<float> m(tp, c, 3);
  hf::BpeVocab vocab = hf::byte_level_vocab({"<|endoftext|>"});
  // One merge: "Ġ" + "t" -> "Ġt", which must be a token too.
  vocab.tokens.insert(vocab.tokens.begin() + 256, "\xc4\xa0t");
  vocab.token_types.insert(vocab.token_types.begin() + 256, hf::TokenType::normal);
  vocab.tokens.push_back("<|im_end|>");
  vocab.token_types.push_back(hf::TokenType::control);
  vocab.merges = {"\xc4\xa0 t"};
  vocab.eos = 257;
  vocab.pad = 258;
  const std::string path = dir.file("m.gguf");
  const ModelFileResult written = hf::write_gguf(path, m, vocab);
  REQUIRE_MESSAGE(written.ok(), written.error);
  const Gguf g = read_gguf(path);
  CHECK(g.version == 3);
  auto u32 = [&](const std::string& k) { return std::get<std::uint32_t>(g.kv.at(k)); };
  auto f32 = [&](const std::string& k) { return std::get<float>(g.kv.at(k)); };
  auto text = [&](const std::string& k) { return std::get<std::string>(g.kv.at(k)); };
  CHECK(text("general.architecture") == "qwen2");
  CHECK(u32("general.file_type") == 0);
  CHECK(u32("general.alignment") == 32);
  CHECK(u32("qwen2.context_length") == 16);
  CHECK(u32("qwen2.embedding_length") == 8);
  CHECK(u32("qwen2.block_count") == 2);
  CHECK(u32("qwen2.feed_forward_length") == 12);
  CHECK(u32("qwen2.attention.head_count") == 2);
  CHECK(u32("qwen2.attention.head_count_kv") == 1);
  CHECK(u32("qwen2.rope.dimension_count") == 4);
  CHECK(f32("qwen2.rope.freq_base") == 10000.0f);
  CHECK(f32("qwen2.attention.layer_norm_rms_epsilon") == 1e-6f);
  CHECK(text("tokenizer.ggml.model") == "gpt2");
  CHECK(text("tokenizer.ggml.pre") == "qwen2");
  CHECK(std::get<std::vector<std::string>>(g.kv.at("tokenizer.ggml.tokens")) == vocab.tokens);
  CHECK(std::get<std::vector<std::string>>(g.kv.at("tokenizer.ggml.merges")) == vocab.merges);
  const auto types = std::get<std::vector<std::int32_t>>(g.kv.at("tokenizer.ggml.token_type"));
  REQUIRE(types.size() == 259);
  CHECK(types[0] == 1);
  CHECK(types[256] == 1);
  CHECK(types[257] == 3);
  CHECK(u32("tokenizer.ggml.eos_token_id") == 257);
  CHECK(u32("tokenizer.ggml.padding_token_id") == 258);
  CHECK_FALSE(g.kv.contains("tokenizer.ggml.bos_token_id"));
  CHECK(std::get<bool>(g.kv.at("tokenizer.ggml.add_bos_token")) == false);

  // 1 + 2 * (2 norms + 7 projections + 3 biases) + 2 tensors, in llama.cpp's names.
  CHECK(g.tensors.size() == 1 + 2 * 12 + 2);
  CHECK(g.order.front() == "token_embd.weight");
  CHECK(g.order.back() == "output.weight");
  const std::map<std::string, std::vector<std::uint64_t>> dims = {
      {"token_embd.weight", {8, 259}},    {"blk.0.attn_norm.weight", {8}},    {"blk.1.attn_q.weight", {8, 8}},
      {"blk.1.attn_q.bias", {8}},         {"blk.1.attn_k.weight", {8, 4}},    {"blk.1.attn_k.bias", {4}},
      {"blk.1.attn_v.weight", {8, 4}},    {"blk.1.attn_v.bias", {4}},         {"blk.1.attn_output.weight", {8, 8}},
      {"blk.1.ffn_norm.weight", {8}},     {"blk.1.ffn_gate.weight", {8, 12}}, {"blk.1.ffn_up.weight", {8, 12}},
      {"blk.1.ffn_down.weight", {12, 8}}, {"output_norm.weight", {8}},        {"output.weight", {8, 259}}};
  for (const auto& [name, ne] : dims) {
    CAPTURE(name);
    REQUIRE(g.tensors.contains(name));
    CHECK(g.tensors.at(name).ne == ne);
    CHECK(g.tensors.at(name).type == 0);
  }
  // The embedding keeps its bytes; a projection and the head are transposed:
  // GGUF's element (row r, column k) of an ne = {in, out} tensor is grad's [k, r].
  auto values = [&](const char* name) { return tp.value(m.tensor(name)).data; };
  const auto embd = g.data<float>("token_embd.weight");
  CHECK(std::equal(embd.begin(), embd.end(), values("embed").begin()));
  auto transposed = [&](const char* gguf, const char* grad_name, std::size_t in, std::size_t out) {
    CAPTURE(gguf);
    const auto t = g.data<float>(gguf);
    const auto w = values(grad_name);
    for (std::size_t r = 0; r < out; ++r)
      for (std::size_t k = 0; k < in; ++k) REQUIRE(t[r * in + k] == w[k * out + r]);
  };
  transposed("blk.1.attn_k.weight", "layers.1.k", 8, 4);
  transposed("blk.0.ffn_down.weight", "layers.0.down", 12, 8);
  transposed("blk.0.ffn_gate.weight", "layers.0.gate", 8, 12);
  transposed("output.weight", "head", 8, 259);
  for (const float b : g.data<float>("blk.0.attn_v.bias")) CHECK(b == 0.0f);
  const auto norm = g.data<float>("blk.1.ffn_norm.weight");
  CHECK(std::equal(norm.begin(), norm.end(), values("layers.1.mlp_norm").begin()));
  // The file ends with the last tensor's data, padded to 32 bytes.
  const TensorInfo& last = g.tensors.at("output.weight");
  CHECK(g.bytes.size() == g.data_start + last.offset + (8 * 259 * 4 + 31) / 32 * 32);
}

TEST_CASE("write_gguf F16: matrices as round-to-nearest-even halves, vectors F32; round_like_gguf matches") {
  ScratchDir dir("gguf");
  const nn::LmConfig c = small(257);
  Tape<float> tp;
  nn::Lm<float> m(tp, c, 4);
  const std::string path = dir.file("h.gguf");
  REQUIRE(hf::write_gguf(path, m, hf::byte_level_vocab({"<|endoftext|>"}), {.type = hf::GgufType::f16}).ok());
  const Gguf g = read_gguf(path);
  CHECK(std::get<std::uint32_t>(g.kv.at("general.file_type")) == 1);
  CHECK(g.tensors.at("blk.0.attn_q.weight").type == 1);
  CHECK(g.tensors.at("token_embd.weight").type == 1);
  CHECK(g.tensors.at("blk.0.attn_norm.weight").type == 0);
  CHECK(g.tensors.at("blk.0.attn_q.bias").type == 0);
  const auto q = g.data<std::uint16_t>("blk.0.attn_q.weight");
  const auto w = tp.value(m.tensor("layers.0.q")).data;  // [8, 8]: element (r, k) is w[k * 8 + r]
  for (std::size_t r = 0; r < 8; ++r)
    for (std::size_t k = 0; k < 8; ++k) REQUIRE(q[r * 8 + k] == hf::f16_bits(w[k * 8 + r]));
  // What round_like_gguf leaves in the model is what the file holds.
  hf::round_like_gguf(m, hf::GgufType::f16);
  const auto e = g.data<std::uint16_t>("token_embd.weight");
  const auto rounded = tp.value(m.embed()).data;
  for (std::size_t i = 0; i < e.size(); ++i) REQUIRE(hf::f16_value(e[i]) == rounded[i]);
  // A float64 model exports the same file as its float32 rounding.
  Tape<double> tp64;
  nn::Lm<double> m64(tp64, c, 4);
  const std::string p64 = dir.file("d.gguf");
  REQUIRE(hf::write_gguf(p64, m64, hf::byte_level_vocab({"<|endoftext|>"}), {.type = hf::GgufType::f16}).ok());
  Tape<float> tp32;
  nn::Lm<float> m32(tp32, c, 4);
  for (const auto& p : m64.base()) {
    const auto from = tp64.value(p.var).data;
    const auto to = tp32.leaf_value(m32.tensor(p.name));
    for (std::size_t i = 0; i < from.size(); ++i) to[i] = static_cast<float>(from[i]);
  }
  const std::string p32 = dir.file("f.gguf");
  REQUIRE(hf::write_gguf(p32, m32, hf::byte_level_vocab({"<|endoftext|>"}), {.type = hf::GgufType::f16}).ok());
  CHECK(read_bytes(p64) == read_bytes(p32));
}

// A base held as bfloat16 or half (nn::Lm's base_storage) exports its
// widened values: the file of a float model that holds them.
TEST_CASE("write_gguf from a 16-bit base writes the file of the float model holding its widened values") {
  ScratchDir dir("gguf");
  const nn::LmConfig c = small(257);
  for (const Storage storage : {Storage::bf16, Storage::f16}) {
    CAPTURE(storage_name(storage));
    Tape<float> th, tf;
    nn::Lm<float> held(th, c, 4, nn::Lm<float>::Train::none, storage), as_float(tf, c, 4);
    for (const auto& p : held.base()) {
      const Tensor<float> w = th.widened_value(p.var);
      std::copy(w.data().begin(), w.data().end(), tf.leaf_value(as_float.tensor(p.name)).begin());
    }
    for (const hf::GgufType type : {hf::GgufType::f32, hf::GgufType::f16}) {
      const auto vocab = hf::byte_level_vocab({"<|endoftext|>"});
      REQUIRE(hf::write_gguf(dir.file("h.gguf"), held, vocab, {.type = type}).ok());
      REQUIRE(hf::write_gguf(dir.file("f.gguf"), as_float, vocab, {.type = type}).ok());
      CHECK(read_bytes(dir.file("h.gguf")) == read_bytes(dir.file("f.gguf")));
    }
    // round_like_gguf leaves the 16-bit-held matrices as they are (and the rest rounded as ever).
    const std::vector<std::uint16_t> before(th.leaf_bits(held.embed()).begin(), th.leaf_bits(held.embed()).end());
    REQUIRE(!before.empty());
    hf::round_like_gguf(held, hf::GgufType::q4_0);
    CHECK(std::equal(before.begin(), before.end(), th.leaf_bits(held.embed()).begin()));
  }
}

TEST_CASE(
    "write_gguf refuses a bad vocabulary, adapters, missing or extra tensors, NaN and F16 overflow; nothing written") {
  ScratchDir dir("gguf");
  const std::string path = dir.file("bad.gguf");
  const nn::LmConfig c = small(257);
  Tape<float> tp;
  nn::Lm<float> m(tp, c, 5);
  const hf::BpeVocab good = hf::byte_level_vocab({"<|endoftext|>"});
  auto refused = [&](const ModelFileResult& r, std::initializer_list<const char*> fragments) {
    CAPTURE(r.error);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error.find("grad: GGUF '" + path + "'") == 0);
    for (const char* f : fragments) CHECK(r.error.find(f) != std::string::npos);
    CHECK(nothing_left(dir));
  };
  refused(hf::write_gguf(path, m, hf::byte_level_vocab()), {"256 tokens", "vocabulary 257"});
  hf::BpeVocab v = good;
  v.tokens[7] = v.tokens[3];
  refused(hf::write_gguf(path, m, v), {"token 7 has the text of token 3"});
  v = good;
  v.merges = {"\xc4\xa0t"};
  refused(hf::write_gguf(path, m, v), {"merge 0", "not two tokens"});
  v.merges = {"\xc4\xa0 t"};  // both halves are tokens, "Ġt" is not
  refused(hf::write_gguf(path, m, v), {"merge 0", "'\xc4\xa0t' is not a token"});
  v = good;
  v.eos = 257;
  refused(hf::write_gguf(path, m, v), {"eos id 257", "< 257"});
  v = good;
  v.token_types.pop_back();
  refused(hf::write_gguf(path, m, v), {"256 token types for 257 tokens"});

  nn::LmConfig lc = c;
  lc.lora_rank = 2;
  Tape<float> tl;
  nn::Lm<float> lora(tl, lc, 5);
  refused(hf::write_gguf(path, lora, good), {"LoRA adapters", "nn::merge_lora"});

  // The tensor-list form: a missing, a misshapen and an unknown tensor.
  std::vector<hf::LmTensor> list;
  for (const auto& p : m.base()) {
    const View<float> val = tp.value(p.var);
    list.push_back({p.name, std::vector<std::size_t>(val.shape.begin(), val.shape.end()), val.data});
  }
  REQUIRE(hf::write_gguf(path, c, list, good).ok());
  std::filesystem::remove(path);
  auto named = [](std::vector<hf::LmTensor>& l, std::string_view name) {
    return std::find_if(l.begin(), l.end(), [&](const hf::LmTensor& t) { return t.name == name; });
  };
  auto without = list;
  without.erase(named(without, "layers.0.k"));
  // Named as Hugging Face names them, grad's name beside.
  refused(
      hf::write_gguf(path, c, without, good),
      {"tensor 'model.layers.0.self_attn.k_proj.weight' (grad's 'layers.0.k'), [4, 8] (grad's [8, 4]), is missing"});
  auto misshapen = list;
  named(misshapen, "layers.0.k")->shape = {4, 8};
  refused(
      hf::write_gguf(path, c, misshapen, good),
      {"'model.layers.0.self_attn.k_proj.weight' (grad's 'layers.0.k') is [4, 8] as grad holds it (expected [8, 4], "
       "grad's [in, out]: Hugging Face's [4, 8])"});
  auto extra = list;
  extra.push_back({"layers.0.q.lora_a", {8, 2}, named(list, "layers.0.q")->values.first(16)});  // 16 of q's values
  refused(hf::write_gguf(path, c, extra, good), {"'layers.0.q.lora_a' is not part of a qwen2 model"});
  auto twice = list;
  twice.push_back(list[0]);
  refused(hf::write_gguf(path, c, twice, good), {"'embed' is given twice"});
  // Without "head" the output is tied: no output.weight.
  auto tied = list;
  tied.erase(named(tied, "head"));
  REQUIRE(hf::write_gguf(path, c, tied, good).ok());
  CHECK_FALSE(read_gguf(path).tensors.contains("output.weight"));
  std::filesystem::remove(path);

  // Values: NaN anywhere; beyond F16's range only in an F16 file. An element
  // is named as Hugging Face's [row][column]: grad's up [8, 12] element 17 is
  // its [1, 5], up_proj.weight [12, 8]'s [5][1].
  tp.leaf_value(m.tensor("layers.1.up"))[17] = std::nanf("");
  refused(hf::write_gguf(path, m, good), {"tensor 'model.layers.1.mlp.up_proj.weight' [5][1] is nan", "finite"});
  tp.leaf_value(m.tensor("layers.1.up"))[17] = 70000.0f;
  refused(hf::write_gguf(path, m, good, {.type = hf::GgufType::f16}),
          {"'model.layers.1.mlp.up_proj.weight' [5][1] is 70000", "beyond F16's range"});
  REQUIRE(hf::write_gguf(path, m, good).ok());  // F32 holds it
  std::filesystem::remove(path);
  tp.leaf_value(m.tensor("layers.1.up"))[17] = 0.0f;
  tp.leaf_value(m.tensor("embed"))[8 * 3 + 2] = INFINITY;  // not transposed: embed_tokens [257, 8]'s [3][2]
  refused(hf::write_gguf(path, m, good), {"tensor 'model.embed_tokens.weight' [3][2] is inf"});
  tp.leaf_value(m.tensor("embed"))[8 * 3 + 2] = 0.0f;
  tp.leaf_value(m.tensor("layers.0.mlp_norm"))[6] = std::nanf("");
  refused(hf::write_gguf(path, m, good), {"tensor 'model.layers.0.post_attention_layernorm.weight' [6] is nan"});
  tp.leaf_value(m.tensor("layers.0.mlp_norm"))[6] = 1.0f;

  // A path that cannot be written: the message says why, nothing is left.
  const ModelFileResult r = hf::write_gguf(dir.file("no/such/dir/m.gguf"), m, good);
  CAPTURE(r.error);
  CHECK_FALSE(r.ok());
  CHECK(r.error.find("cannot create a temporary file") != std::string::npos);
  CHECK(nothing_left(dir));
}

TEST_CASE("write_gguf refuses rope_base and eps that float32 cannot hold, naming the field and the value") {
  ScratchDir dir("gguf");
  const std::string path = dir.file("reals.gguf");
  const hf::BpeVocab vocab = hf::byte_level_vocab({"<|endoftext|>"});
  struct Case {
    double rope_base, eps;
    const char* field;
    const char* value;
    const char* why;
  };
  for (const Case& k : {Case{1e39, 1e-6, "rope_base (config.json's rope_theta)", "1e+39", "would become inf"},
                        Case{1e4, 1e300, "eps (config.json's rms_norm_eps)", "1e+300", "would become inf"},
                        Case{1e4, 1e-50, "eps (config.json's rms_norm_eps)", "1e-50", "would become 0"},
                        Case{1e4, 1e-40, "eps (config.json's rms_norm_eps)", "1e-40", "would become a subnormal"}}) {
    CAPTURE(k.value);
    nn::LmConfig c = small(257);
    c.rope_base = k.rope_base;
    c.eps = k.eps;
    Tape<float> tp;
    nn::Lm<float> m(tp, c, 5);
    const ModelFileResult r = hf::write_gguf(path, m, vocab);
    CAPTURE(r.error);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error.find(std::string(k.field) + " " + k.value + " is ") != std::string::npos);
    CHECK(r.error.find(k.why) != std::string::npos);
    CHECK(r.error.find("float32") != std::string::npos);
    CHECK(nothing_left(dir));
  }
  // The smallest normal float32 and the largest are held as they are.
  nn::LmConfig c = small(257);
  c.eps = 1.1754944e-38;
  c.rope_base = 3.4e38;
  Tape<float> tp;
  nn::Lm<float> m(tp, c, 5);
  REQUIRE(hf::write_gguf(path, m, vocab).ok());
  CHECK(std::get<float>(read_gguf(path).kv.at("qwen2.attention.layer_norm_rms_epsilon")) == 1.1754944e-38f);
}

TEST_CASE(
    "write_gguf writes a model whose heads have a width of their own as llama, q and k rows in llama's RoPE order") {
  // head_width 6 x 2 heads = 12 != d_model 8: llama.cpp's qwen2 would want q [8, 8].
  ScratchDir dir("gguf");
  nn::LmConfig c = small(257);
  c.head_width = 6;
  for (const bool bias : {false, true}) {
    CAPTURE(bias);
    c.qkv_bias = bias;
    Tape<float> tp;
    nn::Lm<float> m(tp, c, 7);
    randomize_biases(tp, m, 8, -1, 1);
    const std::string path = dir.file(bias ? "llama_bias.gguf" : "llama.gguf");
    const ModelFileResult written = hf::write_gguf(path, m, hf::byte_level_vocab({"<|endoftext|>"}));
    REQUIRE_MESSAGE(written.ok(), written.error);
    CHECK(hf::gguf_architecture(c) == "llama");
    const Gguf g = read_gguf(path);
    auto u32 = [&](const std::string& k) { return std::get<std::uint32_t>(g.kv.at(k)); };
    CHECK(std::get<std::string>(g.kv.at("general.architecture")) == "llama");
    CHECK_FALSE(g.kv.contains("qwen2.embedding_length"));
    CHECK(u32("llama.embedding_length") == 8);
    CHECK(u32("llama.attention.head_count") == 2);
    CHECK(u32("llama.attention.head_count_kv") == 1);
    CHECK(u32("llama.attention.key_length") == 6);
    CHECK(u32("llama.attention.value_length") == 6);
    CHECK(u32("llama.rope.dimension_count") == 6);
    CHECK(g.tensors.at("blk.0.attn_q.weight").ne == std::vector<std::uint64_t>{8, 12});
    CHECK(g.tensors.at("blk.0.attn_k.weight").ne == std::vector<std::uint64_t>{8, 6});
    CHECK(g.tensors.at("blk.0.attn_output.weight").ne == std::vector<std::uint64_t>{12, 8});
    // Biases only where the model has them (llama's are optional; qwen2's would be zeros).
    CHECK(g.tensors.contains("blk.1.attn_q.bias") == bias);
    CHECK(g.tensors.size() == 1 + 2 * (9 + (bias ? 3 : 0)) + 2);
    // Within each head of width 6, output row 2j + s is grad's column s * 3 + j
    // (rotate-half pairs (j, j + 3) become adjacent); v and o keep their order.
    auto values = [&](const std::string& name) { return tp.value(m.tensor(name)).data; };
    auto check_rows = [&](const std::string& gguf, const std::string& grad_name, std::size_t in, std::size_t out,
                          bool permuted) {
      CAPTURE(gguf);
      const auto t = g.data<float>(gguf);
      const auto w = values(grad_name);
      for (std::size_t r = 0; r < out; ++r) {
        const std::size_t head = r / 6, j = r % 6, from = permuted ? head * 6 + (j % 2) * 3 + j / 2 : r;
        for (std::size_t k = 0; k < in; ++k) REQUIRE(t[r * in + k] == w[k * out + from]);
      }
    };
    check_rows("blk.1.attn_q.weight", "layers.1.q", 8, 12, true);
    check_rows("blk.1.attn_k.weight", "layers.1.k", 8, 6, true);
    check_rows("blk.1.attn_v.weight", "layers.1.v", 8, 6, false);
    check_rows("blk.1.attn_output.weight", "layers.1.o", 12, 8, false);
    if (bias) {
      check_rows("blk.0.attn_q.bias", "layers.0.q_bias", 1, 12, true);
      check_rows("blk.0.attn_k.bias", "layers.0.k_bias", 1, 6, true);
      check_rows("blk.0.attn_v.bias", "layers.0.v_bias", 1, 6, false);
    }
  }
}

TEST_CASE("write_gguf refuses an output path that is a FIFO or a device instead of replacing it") {
  // The rename that puts a written file in place replaces whatever the path
  // names: as root, export to /dev/null would have destroyed /dev/null.
  ScratchDir dir("gguf");
  Tape<float> tp;
  nn::Lm<float> m(tp, small(257), 5);
  const hf::BpeVocab vocab = hf::byte_level_vocab({"<|endoftext|>"});
  const std::string fifo = dir.file("fifo.gguf"), null_link = dir.file("null.gguf");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  std::filesystem::create_symlink("/dev/null", null_link);
  for (const auto& [path, what] : {std::pair{fifo, "it is a FIFO"}, std::pair{null_link, "it is a character device"}}) {
    const ModelFileResult r = hf::write_gguf(path, m, vocab);
    CAPTURE(r.error);
    CHECK_FALSE(r.ok());
    CHECK(r.error.find("grad: GGUF '" + path + "': " + what + ", and only a regular file is replaced") == 0);
  }
  CHECK(std::filesystem::is_fifo(fifo));
  CHECK(std::filesystem::is_symlink(null_link));
  CHECK(std::filesystem::is_character_file(null_link));
  CHECK(std::distance(std::filesystem::directory_iterator(dir.dir), {}) == 2);  // no temporary left behind
  // A regular file is replaced as before.
  write_bytes(dir.file("m.gguf"), {1, 2, 3});
  CHECK(hf::write_gguf(dir.file("m.gguf"), m, vocab).ok());
}

namespace {

// The matrix of a GGUF tensor (F32) as rows of ne[0] values.
std::vector<std::vector<double>> rows_of(const Gguf& g, const std::string& name) {
  const auto v = g.data<float>(name);
  const auto& ne = g.tensors.at(name).ne;
  REQUIRE(ne.size() == 2);
  std::vector<std::vector<double>> m(ne[1], std::vector<double>(ne[0]));
  for (std::size_t r = 0; r < ne[1]; ++r)
    for (std::size_t k = 0; k < ne[0]; ++k) m[r][k] = v[r * ne[0] + k];
  return m;
}

}  // namespace

TEST_CASE("write_lora_gguf writes llama.cpp's LoRA adapter: its metadata, names, PEFT's layouts, alpha = scale * r") {
  // Two architectures: qwen2, and llama (heads of a width of their own),
  // whose q and k rows the base writer permutes within each head.
  for (const std::size_t head_width : {std::size_t{0}, std::size_t{6}}) {
    CAPTURE(head_width);
    ScratchDir dir("gguf");
    nn::LmConfig c = small(257);
    c.head_width = head_width;
    c.lora_rank = 3;
    c.lora_scale = 2.5;
    c.lora_targets = nn::parse_projections("q,k,v,down");
    Tape<float> tp;
    nn::Lm<float> m(tp, c, 21, nn::Lm<float>::Train::lora);
    randomize_adapters(tp, m, 22, -1, 1);
    const std::string path = dir.file("adapter.gguf");
    const ModelFileResult written = hf::write_lora_gguf(path, m);
    REQUIRE_MESSAGE(written.ok(), written.error);
    const Gguf g = read_gguf(path);
    auto text = [&](const std::string& k) { return std::get<std::string>(g.kv.at(k)); };
    const std::string arch = head_width ? "llama" : "qwen2";
    CHECK(text("general.architecture") == arch);
    CHECK(text("general.type") == "adapter");
    CHECK(text("adapter.type") == "lora");
    CHECK(std::get<float>(g.kv.at("adapter.lora.alpha")) == 7.5f);  // llama.cpp's scale alpha / r = 2.5
    CHECK(std::get<std::uint32_t>(g.kv.at("general.file_type")) == 0);
    // 2 layers x 4 projections x (a, b), nothing else (no tokenizer, no norms).
    CHECK(g.tensors.size() == 16);
    const std::size_t hd = c.head_dim(), q_out = c.heads * hd, kv_out = c.kv_heads * hd;
    const std::map<std::string, std::vector<std::uint64_t>> dims = {
        {"blk.0.attn_q.weight.lora_a", {8, 3}},      {"blk.0.attn_q.weight.lora_b", {3, q_out}},
        {"blk.1.attn_k.weight.lora_a", {8, 3}},      {"blk.1.attn_k.weight.lora_b", {3, kv_out}},
        {"blk.1.attn_v.weight.lora_b", {3, kv_out}}, {"blk.1.ffn_down.weight.lora_a", {12, 3}},
        {"blk.1.ffn_down.weight.lora_b", {3, 8}}};
    for (const auto& [name, ne] : dims) {
      CAPTURE(name);
      REQUIRE(g.tensors.contains(name));
      CHECK(g.tensors.at(name).ne == ne);
      CHECK(g.tensors.at(name).type == 0);
    }
    CHECK_FALSE(g.tensors.contains("blk.0.attn_output.weight.lora_a"));  // o is not targeted
    // lora_a's rows are grad's lora_a columns (PEFT's lora_A [r, in]).
    const auto a = rows_of(g, "blk.1.ffn_down.weight.lora_a");
    const auto ga = tp.value(m.tensor("layers.1.down.lora_a")).data;  // [12, 3]
    for (std::size_t j = 0; j < 3; ++j)
      for (std::size_t k = 0; k < 12; ++k) REQUIRE(a[j][k] == ga[k * 3 + j]);

    // What llama.cpp computes from the two files, base rows + (alpha / r) B A,
    // is the merged model's file: for every adapted projection, the rows of
    // the merged GGUF less the base's are alpha / r times lora_b . lora_a (up
    // to float rounding; llama's permuted q and k rows included).
    nn::LmConfig base_config = c;
    base_config.lora_rank = 0;
    Tape<float> tb;
    nn::Lm<float> merged(tb, base_config, 1);
    nn::merge_lora(m, merged);
    Tape<float> t0;
    nn::Lm<float> base(t0, base_config, 21);  // the same seed: the tuned model's base
    const auto vocab = hf::byte_level_vocab({"<|endoftext|>"});
    REQUIRE(hf::write_gguf(dir.file("merged.gguf"), merged, vocab).ok());
    REQUIRE(hf::write_gguf(dir.file("base.gguf"), base, vocab).ok());
    const Gguf gm = read_gguf(dir.file("merged.gguf")), gb = read_gguf(dir.file("base.gguf"));
    const float alpha = std::get<float>(g.kv.at("adapter.lora.alpha"));
    double worst = 0;
    for (const std::string l : {"0", "1"})
      for (const std::string proj : {"attn_q", "attn_k", "attn_v", "ffn_down"}) {
        const std::string w = "blk." + l + "." + proj + ".weight";
        CAPTURE(w);
        const auto A = rows_of(g, w + ".lora_a"), B = rows_of(g, w + ".lora_b");
        const auto M = rows_of(gm, w), W0 = rows_of(gb, w);
        REQUIRE(B.size() == M.size());
        for (std::size_t r = 0; r < M.size(); ++r)
          for (std::size_t k = 0; k < M[r].size(); ++k) {
            double ab = 0;
            for (std::size_t j = 0; j < 3; ++j) ab += B[r][j] * A[j][k];
            worst = std::max(worst, std::abs(W0[r][k] + alpha / 3 * ab - M[r][k]));
          }
      }
    MESSAGE(arch << ": base + (alpha / r) B A from the adapter file is the merged file within " << worst);
    CHECK(worst < 1e-5);
  }
}

TEST_CASE("write_lora_gguf F16 and float64: halves of the adapters; a float64 model writes its float32 rounding") {
  ScratchDir dir("gguf");
  nn::LmConfig c = small(257);
  c.lora_rank = 2;
  c.lora_scale = 0.5;
  Tape<double> t64;
  nn::Lm<double> m64(t64, c, 31, nn::Lm<double>::Train::lora);
  randomize_adapters(t64, m64, 32, -1, 1);
  Tape<float> t32;
  nn::Lm<float> m32(t32, c, 31, nn::Lm<float>::Train::lora);
  for (const auto& p : m64.adapters()) {
    const auto from = t64.value(p.var).data;
    const auto to = t32.leaf_value(m32.tensor(p.name));
    for (std::size_t i = 0; i < from.size(); ++i) to[i] = static_cast<float>(from[i]);
  }
  for (const hf::GgufType type : {hf::GgufType::f32, hf::GgufType::f16}) {
    REQUIRE(hf::write_lora_gguf(dir.file("d.gguf"), m64, {.type = type}).ok());
    REQUIRE(hf::write_lora_gguf(dir.file("f.gguf"), m32, {.type = type}).ok());
    CHECK(read_bytes(dir.file("d.gguf")) == read_bytes(dir.file("f.gguf")));
  }
  const Gguf g = read_gguf(dir.file("f.gguf"));  // the F16 one
  CHECK(std::get<std::uint32_t>(g.kv.at("general.file_type")) == 1);
  CHECK(std::get<float>(g.kv.at("adapter.lora.alpha")) == 1.0f);
  CHECK(g.tensors.size() == 2 * 7 * 2);
  const auto b = g.data<std::uint16_t>("blk.0.ffn_up.weight.lora_b");  // ne {2, 12}: row o, column j = grad [j, o]
  const auto gb = t32.value(m32.tensor("layers.0.up.lora_b")).data;
  CHECK(g.tensors.at("blk.0.ffn_up.weight.lora_b").type == 1);
  for (std::size_t o = 0; o < 12; ++o)
    for (std::size_t j = 0; j < 2; ++j) REQUIRE(b[o * 2 + j] == hf::f16_bits(gb[j * 12 + o]));
}

TEST_CASE("write_lora_gguf refuses a model without adapters, scale 0, bad tensors and values; nothing written") {
  ScratchDir dir("gguf");
  const std::string path = dir.file("bad.gguf");
  auto refused = [&](const ModelFileResult& r, std::initializer_list<const char*> fragments) {
    CAPTURE(r.error);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error.find("grad: LoRA GGUF '" + path + "': ") == 0);
    CHECK(r.error.find("nothing written") != std::string::npos);
    for (const char* f : fragments) CHECK(r.error.find(f) != std::string::npos);
    CHECK(nothing_left(dir));
  };
  {
    Tape<float> tp;
    nn::Lm<float> plain(tp, small(257), 5);
    refused(hf::write_lora_gguf(path, plain), {"no adapters (lora_rank 0"});
  }
  nn::LmConfig c = small(257);
  c.lora_rank = 2;
  c.lora_targets = nn::parse_projections("q,up");
  for (const auto& [scale, fragment] :
       {std::pair{0.0, "lora_scale is 0: llama.cpp reads adapter.lora.alpha 0 as no alpha"},
        std::pair{2e38, "adapter.lora.alpha (lora_scale * lora_rank) 4e+38 is beyond float32's range"}}) {
    nn::LmConfig s = c;
    s.lora_scale = scale;
    Tape<float> tp;
    nn::Lm<float> m(tp, s, 5, nn::Lm<float>::Train::lora);
    refused(hf::write_lora_gguf(path, m), {fragment});
  }
  Tape<float> tp;
  nn::Lm<float> m(tp, c, 5, nn::Lm<float>::Train::lora);
  randomize_adapters(tp, m, 6, -1, 1);
  refused(hf::write_lora_gguf(path, m, {.type = hf::GgufType(7)}), {"tensor type 7 (expected f32 or f16"});
  std::vector<hf::LmTensor> list;
  for (const auto& p : m.adapters()) {
    const View<float> v = tp.value(p.var);
    list.push_back({p.name, std::vector<std::size_t>(v.shape.begin(), v.shape.end()), v.data});
  }
  REQUIRE(hf::write_lora_gguf(path, c, list).ok());
  std::filesystem::remove(path);
  auto named = [](std::vector<hf::LmTensor>& l, std::string_view name) {
    return std::find_if(l.begin(), l.end(), [&](const hf::LmTensor& t) { return t.name == name; });
  };
  auto without = list;
  without.erase(named(without, "layers.1.up.lora_b"));
  refused(hf::write_lora_gguf(path, c, without),
          {"tensor 'base_model.model.model.layers.1.mlp.up_proj.lora_B.weight' (grad's 'layers.1.up.lora_b'), [12, 2] "
           "(grad's [2, 12]), is missing"});
  auto misshapen = list;
  named(misshapen, "layers.0.q.lora_a")->shape = {2, 8};
  refused(hf::write_lora_gguf(path, c, misshapen),
          {"(grad's 'layers.0.q.lora_a') is [2, 8] as grad holds it (expected [8, 2]: PEFT's [2, 8])"});
  auto extra = list;
  extra.push_back({"layers.0.k.lora_a", {8, 2}, list[0].values});  // k is not targeted
  refused(hf::write_lora_gguf(path, c, extra), {"tensor 'layers.0.k.lora_a' is not an adapter of"});
  auto twice = list;
  twice.push_back(list[1]);
  refused(hf::write_lora_gguf(path, c, twice), {"is given twice"});
  auto no_adapters = c;
  no_adapters.lora_rank = 0;
  refused(hf::write_lora_gguf(path, no_adapters, list), {"no adapters"});
  // A value: named as PEFT's [row][column] (grad's q.lora_b [2, 8] element 11 is its [1, 3]: lora_B [8, 2]'s [3][1]).
  tp.leaf_value(m.tensor("layers.0.q.lora_b"))[11] = std::nanf("");
  refused(hf::write_lora_gguf(path, m),
          {"tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight' [3][1] is nan"});
  tp.leaf_value(m.tensor("layers.0.q.lora_b"))[11] = 1e5f;
  refused(hf::write_lora_gguf(path, m, {.type = hf::GgufType::f16}), {"[3][1] is 100000, beyond F16's range"});
  REQUIRE(hf::write_lora_gguf(path, m).ok());  // F32 holds it
}

// ---- quantized files ----

TEST_CASE("gguf_tensor_type is llama.cpp's mix for Q8_0, Q4_0 and Q4_K_M, with its per-tensor fallbacks") {
  using T = hf::GgmlType;
  using F = hf::GgufType;
  // Rows of whole Q4_K blocks: d_model 256, ffn 512; eight layers.
  nn::LmConfig c;
  c.vocab = 300;
  c.d_model = 256;
  c.layers = 8;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 512;
  // llama.cpp's use_more_bits(i, 8): i < 1, i >= 7, (i - 1) % 3 == 2.
  const std::set<std::size_t> more = {0, 3, 6, 7};
  for (std::size_t l = 0; l < 8; ++l) {
    CAPTURE(l);
    const std::string L = "layers." + std::to_string(l) + ".";
    const T v_down = more.contains(l) ? T::q6_k : T::q4_k;
    CHECK(hf::gguf_tensor_type(c, F::q4_k_m, L + "v") == v_down);
    CHECK(hf::gguf_tensor_type(c, F::q4_k_m, L + "down") == v_down);
    for (const char* p : {"q", "k", "o", "gate", "up"}) CHECK(hf::gguf_tensor_type(c, F::q4_k_m, L + p) == T::q4_k);
    for (const char* p : {"q", "v", "down"}) {
      CHECK(hf::gguf_tensor_type(c, F::q4_0, L + p) == T::q4_0);
      CHECK(hf::gguf_tensor_type(c, F::q8_0, L + p) == T::q8_0);
      CHECK(hf::gguf_tensor_type(c, F::f16, L + p) == T::f16);
      CHECK(hf::gguf_tensor_type(c, F::f32, L + p) == T::f32);
    }
    for (const char* vec : {"attn_norm", "mlp_norm", "q_bias", "v_bias"})
      CHECK(hf::gguf_tensor_type(c, F::q4_k_m, L + vec) == T::f32);
  }
  // The output (or the embedding standing in for it when tied) gets more bits.
  CHECK(hf::gguf_tensor_type(c, F::q4_k_m, "head") == T::q6_k);
  CHECK(hf::gguf_tensor_type(c, F::q4_k_m, "embed") == T::q4_k);
  CHECK(hf::gguf_tensor_type(c, F::q4_k_m, "embed", true) == T::q6_k);
  CHECK(hf::gguf_tensor_type(c, F::q4_0, "head") == T::q6_k);
  CHECK(hf::gguf_tensor_type(c, F::q4_0, "embed") == T::q4_0);
  CHECK(hf::gguf_tensor_type(c, F::q4_0, "embed", true) == T::q6_k);
  CHECK(hf::gguf_tensor_type(c, F::q8_0, "head") == T::q8_0);
  CHECK(hf::gguf_tensor_type(c, F::q8_0, "embed", true) == T::q8_0);
  CHECK(hf::gguf_tensor_type(c, F::q4_k_m, "final_norm") == T::f32);
  // A 32-layer model (Llama 2 7B's count): use_more_bits(i, 32).
  c.layers = 32;
  std::vector<std::size_t> six;
  for (std::size_t l = 0; l < 32; ++l)
    if (hf::gguf_tensor_type(c, F::q4_k_m, "layers." + std::to_string(l) + ".v") == T::q6_k) six.push_back(l);
  CHECK(six == std::vector<std::size_t>{0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31});

  // Rows that are not whole blocks: d_model 96 (3 blocks of 32, not of 256), ffn 80 (not of 32).
  nn::LmConfig s = c;
  s.d_model = 96;
  s.heads = 2;
  s.kv_heads = 1;
  s.ffn = 80;
  s.layers = 1;
  CHECK(hf::gguf_tensor_type(s, F::q4_k_m, "layers.0.q") == T::q8_0);    // q4_K -> (llama.cpp: q5_0) q8_0
  CHECK(hf::gguf_tensor_type(s, F::q4_k_m, "layers.0.v") == T::q8_0);    // q6_K (layer 0 of 1) -> q8_0
  CHECK(hf::gguf_tensor_type(s, F::q4_k_m, "layers.0.up") == T::q8_0);   // rows of d_model
  CHECK(hf::gguf_tensor_type(s, F::q4_k_m, "layers.0.down") == T::f16);  // rows of ffn 80: not blocks of 32
  CHECK(hf::gguf_tensor_type(s, F::q4_k_m, "head") == T::q8_0);          // 96 % 256: q8_0 directly
  CHECK(hf::gguf_tensor_type(s, F::q4_k_m, "embed") == T::q8_0);
  CHECK(hf::gguf_tensor_type(s, F::q4_0, "head") == T::q8_0);  // q6_K -> q8_0
  CHECK(hf::gguf_tensor_type(s, F::q4_0, "layers.0.gate") == T::q4_0);
  CHECK(hf::gguf_tensor_type(s, F::q4_0, "layers.0.down") == T::f16);
  CHECK(hf::gguf_tensor_type(s, F::q8_0, "layers.0.down") == T::f16);
  CHECK(hf::gguf_tensor_type(s, F::q8_0, "layers.0.o") == T::q8_0);
  CHECK(hf::gguf_tensor_type(small(257), F::q8_0, "layers.1.q") == T::f16);  // d_model 8

  CHECK_THROWS_WITH_AS(hf::gguf_tensor_type(s, F::q8_0, "layers.1.q"), doctest::Contains("'layers.1.q' is no tensor"),
                       std::invalid_argument);
  CHECK_THROWS_AS(hf::gguf_tensor_type(s, F::q8_0, "layers.0.q.lora_a"), std::invalid_argument);
  CHECK_THROWS_AS(hf::gguf_tensor_type(s, F::q8_0, "layers.0"), std::invalid_argument);
  CHECK(hf::ggml_type_name(std::uint32_t(T::q4_k)) == "q4_K");
  CHECK(hf::ggml_type_name(std::uint32_t(T::f16)) == "f16");
  CHECK(hf::gguf_type_name(F::q4_k_m) == "q4_k_m");
  CHECK(hf::gguf_type_name(F(3)) == "unknown");
}

namespace {

// The grad tensor behind each GGUF name of a model of `c`.
std::map<std::string, std::string> grad_names(const nn::LmConfig& c) {
  std::map<std::string, std::string> m = {{"token_embd.weight", "embed"}, {"output.weight", "head"}};
  const char* gguf[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
  for (std::size_t l = 0; l < c.layers; ++l)
    for (std::size_t p = 0; p < nn::proj_count; ++p)
      m["blk." + std::to_string(l) + "." + gguf[p] + ".weight"] =
          "layers." + std::to_string(l) + "." + std::string(nn::proj_names[p]);
  return m;
}

}  // namespace

TEST_CASE(
    "write_gguf q8_0, q4_0, q4_k_m: llama.cpp's mix, each row ggml's quantization of it; round_like_gguf agrees") {
  // qwen2 with rows of whole Q4_K blocks (and ffn_down's not: 320), and
  // llama (heads 128 wide: q's and k's rows permuted before quantizing).
  for (const std::size_t head_width : {std::size_t{0}, std::size_t{128}}) {
    CAPTURE(head_width);
    nn::LmConfig c;
    c.vocab = 261;
    c.d_model = 256;
    c.layers = 3;
    c.heads = 4;
    c.kv_heads = 2;
    c.ffn = 320;
    c.max_seq = 32;
    c.head_width = head_width;
    c.qkv_bias = true;
    Tape<float> tp;
    nn::Lm<float> m(tp, c, 41);
    randomize_biases(tp, m, 42, -0.5, 0.5);
    const std::map<std::string, std::string> names = grad_names(c);
    for (const hf::GgufType type : {hf::GgufType::q8_0, hf::GgufType::q4_0, hf::GgufType::q4_k_m}) {
      CAPTURE(hf::gguf_type_name(type));
      ScratchDir dir("gguf");
      const std::string path = dir.file("q.gguf");
      const ModelFileResult written =
          hf::write_gguf(path, m, hf::byte_level_vocab({"<s1>", "<s2>", "<s3>", "<s4>", "<s5>"}), {.type = type});
      REQUIRE_MESSAGE(written.ok(), written.error);
      const Gguf g = read_gguf(path);
      CHECK(std::get<std::uint32_t>(g.kv.at("general.file_type")) == static_cast<std::uint32_t>(type));
      CHECK(std::get<std::uint32_t>(g.kv.at("general.quantization_version")) == 2);
      // The model as the file holds it: every matrix rounded in grad's layout.
      Tape<float> tr;
      nn::Lm<float> rounded(tr, c, 41);
      randomize_biases(tr, rounded, 42, -0.5, 0.5);
      hf::round_like_gguf(rounded, type);
      std::map<std::string, std::size_t> counts;
      for (const auto& [gguf, grad_name] : names) {
        CAPTURE(gguf);
        const TensorInfo& info = g.tensors.at(gguf);
        const hf::GgmlType expected = hf::gguf_tensor_type(c, type, grad_name);
        REQUIRE(info.type == static_cast<std::uint32_t>(expected));
        ++counts[hf::ggml_type_name(std::uint32_t(expected))];
        const auto q = hf::quant_format(expected);
        REQUIRE(q);  // every matrix of these shapes is quantized
        const std::size_t cols = info.ne[0], rows = info.ne[1], row_bytes = quant_bytes(*q, cols);
        const auto w = tp.value(m.tensor(grad_name)).data;
        const auto wr = tr.value(rounded.tensor(grad_name)).data;
        const bool embd = grad_name == "embed";
        const std::size_t heads = head_width == 0             ? 0
                                  : grad_name.ends_with(".q") ? c.heads
                                  : grad_name.ends_with(".k") ? c.kv_heads
                                                              : 0;
        std::vector<float> row(cols), back(cols);
        std::vector<std::uint8_t> blocks(row_bytes);
        for (std::size_t r = 0; r < rows; ++r) {
          // GGUF row r is grad's column (row of the embedding) `from`; a
          // permuted head's rows are whole rows moved, quantized as they are.
          const std::size_t width = heads ? rows / heads : 1, j = r % width;
          const std::size_t from = heads ? r / width * width + (j % 2) * (width / 2) + j / 2 : r;
          for (std::size_t k = 0; k < cols; ++k) row[k] = embd ? w[from * cols + k] : w[k * rows + from];
          quantize(*q, row.data(), blocks.data(), cols);
          const unsigned char* at = g.bytes.data() + g.data_start + info.offset + r * row_bytes;
          REQUIRE(std::memcmp(at, blocks.data(), row_bytes) == 0);
          // round_like_gguf left the dequantized row in the model.
          dequantize(*q, at, back.data(), cols);
          for (std::size_t k = 0; k < cols; ++k)
            REQUIRE(std::bit_cast<std::uint32_t>(embd ? wr[from * cols + k] : wr[k * rows + from]) ==
                    std::bit_cast<std::uint32_t>(back[k]));
        }
      }
      std::string mix;
      for (const auto& [name, n] : counts) mix += " " + std::to_string(n) + " " + name;
      MESSAGE(hf::gguf_architecture(c) << " " << hf::gguf_type_name(type) << ":" << mix << "; "
                                       << read_bytes(path).size() << " bytes");
      // Vectors stay F32 and exact.
      CHECK(g.tensors.at("blk.0.attn_norm.weight").type == 0);
      CHECK(g.tensors.at("blk.2.attn_v.bias").type == 0);
    }
  }
}

TEST_CASE("write_gguf refuses an unknown file type, and rows a quantized type's F16 scales cannot hold") {
  ScratchDir dir("gguf");
  const std::string path = dir.file("bad.gguf");
  nn::LmConfig c = small(257);
  c.d_model = 32;
  c.heads = 2;
  c.ffn = 64;
  Tape<float> tp;
  nn::Lm<float> m(tp, c, 5);
  const hf::BpeVocab vocab = hf::byte_level_vocab({"<|endoftext|>"});
  auto refused = [&](const ModelFileResult& r, std::initializer_list<const char*> fragments) {
    CAPTURE(r.error);
    REQUIRE_FALSE(r.ok());
    CHECK(r.error.find("grad: GGUF '" + path + "': ") == 0);
    for (const char* f : fragments) CHECK(r.error.find(f) != std::string::npos);
    CHECK(nothing_left(dir));
  };
  refused(hf::write_gguf(path, m, vocab, {.type = hf::GgufType(3)}),
          {"file type 3 (expected f32, f16, q8_0, q4_0 or q4_k_m)"});
  // q8_0's scale is the row block's largest magnitude / 127, a half: 1e7 / 127 > 65504.
  tp.leaf_value(m.tensor("layers.1.gate"))[64 * 3 + 5] = 1e7f;  // grad's [3, 5]: gate_proj [64, 32]'s row 5
  refused(hf::write_gguf(path, m, vocab, {.type = hf::GgufType::q8_0}),
          {"tensor 'model.layers.1.mlp.gate_proj.weight' row 5 (values up to 10000000 in magnitude) does not fit "
           "q8_0's F16 scales (it would dequantize to"});
  REQUIRE(hf::write_gguf(path, m, vocab).ok());  // F32 holds it
  std::filesystem::remove(path);
  tp.leaf_value(m.tensor("layers.1.gate"))[64 * 3 + 5] = std::nanf("");
  refused(hf::write_gguf(path, m, vocab, {.type = hf::GgufType::q4_0}), {"[5][3] is nan", "finite"});
  // round_like_gguf: names and counts checked.
  std::vector<float> v(10);
  CHECK_THROWS_WITH_AS(hf::round_like_gguf(c, hf::GgufType::q8_0, "layers.0.q", v, false),
                       doctest::Contains("'layers.0.q' has 10 values (expected 1024)"), std::invalid_argument);
  CHECK_THROWS_AS(hf::round_like_gguf(c, hf::GgufType::q8_0, "nonsense", v, false), std::invalid_argument);
}

TEST_CASE("write_gguf's quantized files are llama.cpp's quantize's: the same types and bytes (test/gguf's fixture)") {
  // test/gguf/README.md: llama.cpp's own quantize of these models' F32
  // files, each quantized tensor's type and the FNV-1a 64 hash of its bytes.
  const char* fixtures = std::getenv("GRAD_GGUF_FIXTURES");
  REQUIRE_MESSAGE(fixtures != nullptr, "GRAD_GGUF_FIXTURES is not set: run this through meson test");
  struct Row {
    std::string tensor;
    std::uint32_t type = 0;
    std::size_t bytes = 0;
    std::uint64_t hash = 0;
  };
  std::map<std::pair<std::string, std::string>, std::vector<Row>> expected;  // (case, file type) -> rows
  {
    std::ifstream in(std::string(fixtures) + "/llama_cpp_quantize.txt");
    REQUIRE(in);
    for (std::string line; std::getline(in, line);) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream words(line);
      std::string name, type, hash;
      Row r;
      words >> name >> type >> r.tensor >> r.type >> r.bytes >> hash;
      REQUIRE_MESSAGE(words, line);
      r.hash = std::stoull(hash, nullptr, 16);
      expected[{name, type}].push_back(r);
    }
  }
  auto fnv1a64 = [](const unsigned char* p, std::size_t n) {
    std::uint64_t h = 0xcbf29ce484222325u;
    for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 0x100000001b3u;
    return h;
  };
  struct Case {
    const char* name;
    std::size_t d_model, layers, ffn, head_width;
    bool tied;
  };
  std::size_t same = 0, q5_0 = 0;
  for (const Case& k :
       {Case{"qwen2_d256_l8", 256, 8, 512, 0, false}, Case{"llama_tied_d256_l3", 256, 3, 512, 128, true},
        Case{"qwen2_d96_ffn80", 96, 2, 80, 0, false}}) {
    CAPTURE(k.name);
    nn::LmConfig c;  // test/gguf/grad_files.cpp's
    c.vocab = 257;
    c.d_model = k.d_model;
    c.layers = k.layers;
    c.heads = 4;
    c.kv_heads = 2;
    c.ffn = k.ffn;
    c.max_seq = 64;
    c.head_width = k.head_width;
    c.tied_embeddings = k.tied;
    Tape<float> tp;
    nn::Lm<float> m(tp, c, 77);
    ScratchDir dir("gguf");
    for (const hf::GgufType type : {hf::GgufType::q8_0, hf::GgufType::q4_0, hf::GgufType::q4_k_m}) {
      const std::string type_name(hf::gguf_type_name(type));
      CAPTURE(type_name);
      const std::vector<Row>& rows = expected[{k.name, type_name}];
      REQUIRE(!rows.empty());
      const std::string path = dir.file(type_name + ".gguf");
      REQUIRE(hf::write_gguf(path, m, hf::byte_level_vocab({"<|endoftext|>"}), {.type = type}).ok());
      const Gguf g = read_gguf(path);
      std::size_t matrices = 0;
      for (const auto& [name, info] : g.tensors) matrices += info.type != 0;
      CHECK(matrices == rows.size());  // the same tensors quantized (or f16), the vectors F32
      for (const Row& r : rows) {
        CAPTURE(r.tensor);
        REQUIRE(g.tensors.contains(r.tensor));
        const TensorInfo& info = g.tensors.at(r.tensor);
        if (r.type == 6) {  // llama.cpp's q5_0 fallback for q4_K: grad writes q8_0
          CHECK(info.type == 8);
          ++q5_0;
          continue;
        }
        REQUIRE(info.type == r.type);
        REQUIRE(g.data_start + info.offset + r.bytes <= g.bytes.size());
        CHECK(fnv1a64(g.bytes.data() + g.data_start + info.offset, r.bytes) == r.hash);
        ++same;
      }
    }
  }
  MESSAGE(same << " matrices (quantized, or f16 where a row is not whole blocks) byte-identical to llama.cpp's "
               << "quantize's; " << q5_0 << " that llama.cpp writes q5_0 are q8_0");
  CHECK(q5_0 == 12);
}

TEST_CASE("write_gguf from a quantized base: its blocks as they are where the file's type is theirs, checked") {
  // Storage::q4_k holds the projections and the head as llama.cpp's [out,
  // in] rows of blocks, the embedding as its rows: a Q4_K_M file takes the
  // q4_K matrices' blocks unchanged (Llama's q and k rows moved whole) and
  // quantizes the rest (q6_K) from their exact values.
  for (const std::size_t head_width : {std::size_t{0}, std::size_t{128}}) {
    CAPTURE(head_width);
    nn::LmConfig c;
    c.vocab = 257;
    c.d_model = 256;
    c.layers = 2;
    c.heads = 4;
    c.kv_heads = 2;
    c.ffn = 512;
    c.max_seq = 32;
    c.head_width = head_width;
    Tape<float> tp;
    nn::Lm<float> held(tp, c, 61, nn::Lm<float>::Train::none, Storage::q4_k);
    ScratchDir dir("gguf");
    const std::string path = dir.file("held.gguf");
    const ModelFileResult written =
        hf::write_gguf(path, held, hf::byte_level_vocab({"<|endoftext|>"}), {.type = hf::GgufType::q4_k_m});
    REQUIRE_MESSAGE(written.ok(), written.error);
    const Gguf g = read_gguf(path);
    std::size_t copied = 0, quantized_again = 0, would_differ = 0;
    for (const auto& [gguf, grad_name] : grad_names(c)) {
      CAPTURE(gguf);
      const TensorInfo& info = g.tensors.at(gguf);
      const auto q = hf::quant_format(hf::GgmlType(info.type));
      REQUIRE(q);
      const std::size_t cols = info.ne[0], rows = info.ne[1], row_bytes = quant_bytes(*q, cols);
      const Var<float> v = held.tensor(grad_name);
      REQUIRE(tp.storage(v) == Storage::q4_k);
      const std::span<const std::uint8_t> blocks = tp.leaf_blocks(v);
      const Tensor<float> values = tp.widened_value(v);
      const std::size_t heads = head_width == 0             ? 0
                                : grad_name.ends_with(".q") ? c.heads
                                : grad_name.ends_with(".k") ? c.kv_heads
                                                            : 0;
      std::vector<float> row(cols);
      std::vector<std::uint8_t> again(row_bytes), held_row(row_bytes);
      for (std::size_t r = 0; r < rows; ++r) {
        const std::size_t width = heads ? rows / heads : 1, j = r % width;
        const std::size_t from = heads ? r / width * width + (j % 2) * (width / 2) + j / 2 : r;
        const unsigned char* at = g.bytes.data() + g.data_start + info.offset + r * row_bytes;
        for (std::size_t k = 0; k < cols; ++k)
          row[k] = grad_name == "embed" ? values[from * cols + k] : values[k * rows + from];
        quantize(*q, row.data(), again.data(), cols);
        if (*q == QuantFormat::q4_k) {
          get_row_blocks(tp.held_rows(v), blocks.data(), from, held_row.data());  // its rows lie in groups
          REQUIRE(std::memcmp(at, held_row.data(), row_bytes) == 0);
          would_differ += std::memcmp(again.data(), held_row.data(), row_bytes) != 0;
          ++copied;
        } else {
          REQUIRE(std::memcmp(at, again.data(), row_bytes) == 0);  // from the q4_K values
          ++quantized_again;
        }
      }
    }
    MESSAGE(hf::gguf_architecture(c) << " q4_K base as Q4_K_M: " << copied << " rows' blocks copied (" << would_differ
                                     << " of them quantized again from their values would differ), " << quantized_again
                                     << " rows quantized to q6_K");
    CHECK(copied > 0);
    CHECK(quantized_again > 0);
  }

  // Blocks that do not hold the values (another tensor's, or not in GGUF's rows) are refused.
  nn::LmConfig c = small(257);
  c.d_model = 32;
  c.heads = 2;
  c.ffn = 64;
  Tape<float> tp;
  nn::Lm<float> held(tp, c, 62, nn::Lm<float>::Train::none, Storage::q8_0);
  std::vector<Tensor<float>> values;
  values.reserve(held.base().size());
  std::vector<hf::LmTensor> list;
  for (const auto& p : held.base()) {
    values.push_back(tp.widened_value(p.var));
    hf::LmTensor t{p.name, std::vector<std::size_t>(tp.dims(p.var).span().begin(), tp.dims(p.var).span().end()),
                   values.back().data()};
    if (quantized(tp.storage(p.var))) t.format = QuantFormat::q8_0, t.blocks = tp.leaf_blocks(p.var), t.grouped = true;
    list.push_back(t);
  }
  ScratchDir dir("gguf");
  const std::string path = dir.file("bad.gguf");
  const auto vocab = hf::byte_level_vocab({"<|endoftext|>"});
  REQUIRE(hf::write_gguf(path, c, list, vocab, {.type = hf::GgufType::q8_0}).ok());
  std::filesystem::remove(path);
  auto named = [&](std::string_view name) {
    return std::find_if(list.begin(), list.end(), [&](const hf::LmTensor& t) { return t.name == name; });
  };
  const auto good = named("layers.0.gate")->blocks;
  named("layers.0.gate")->blocks = named("layers.0.up")->blocks;  // the same shape, other weights
  ModelFileResult r = hf::write_gguf(path, c, list, vocab, {.type = hf::GgufType::q8_0});
  CAPTURE(r.error);
  CHECK_FALSE(r.ok());
  CHECK(r.error.find("tensor 'model.layers.0.mlp.gate_proj.weight': its q8_0 blocks' row 0 does not dequantize to its "
                     "values") != std::string::npos);
  named("layers.0.gate")->blocks = good.first(good.size() - 34);  // a block short
  r = hf::write_gguf(path, c, list, vocab, {.type = hf::GgufType::q8_0});
  CHECK(r.error.find("has 2142 bytes of q8_0 blocks (expected 64 rows of 34)") != std::string::npos);
  CHECK(nothing_left(dir));
}

TEST_CASE("a quantized file read back (hf::load_gguf): the dequantized weights, and as stored the same file again") {
  // Q4_K_M's mix (q4_K, q6_K, and q8_0 for ffn_down's rows of 320), llama
  // (permuted q and k rows), tied: load_gguf gives round_like_gguf's values;
  // held as the file stores them (each matrix in its own format), writing
  // the model again gives the file byte for byte.
  nn::LmConfig c;
  c.vocab = 257;
  c.d_model = 256;
  c.layers = 3;
  c.heads = 4;
  c.kv_heads = 2;
  c.ffn = 320;
  c.max_seq = 32;
  c.head_width = 128;
  c.tied_embeddings = true;
  Tape<float> tp;
  nn::Lm<float> m(tp, c, 71);
  ScratchDir dir("gguf");
  const std::string path = dir.file("q4_k_m.gguf"), again = dir.file("again.gguf");
  const auto vocab = hf::byte_level_vocab({"<|endoftext|>"});
  REQUIRE(hf::write_gguf(path, m, vocab, {.type = hf::GgufType::q4_k_m}).ok());
  hf::round_like_gguf(m, hf::GgufType::q4_k_m);
  Tape<float> tl;
  const hf::GgufModel<float> loaded = hf::load_gguf(path, tl);
  REQUIRE(loaded.config.tied_embeddings);
  for (const auto& p : m.base()) {
    CAPTURE(p.name);
    const Tensor<float> read = tl.widened_value(loaded.model.tensor(p.name));
    REQUIRE(bitwise_equal(read.data(), tp.value(p.var).data));
  }
  Tape<float> ts;
  const hf::GgufModel<float> stored = hf::load_gguf(path, ts, nn::Lm<float>::Train::none, {.as_stored = true});
  CHECK(ts.storage(stored.model.tensor("layers.2.v")) == Storage::q6_k);
  CHECK(ts.storage(stored.model.tensor("layers.0.v")) == Storage::q4_k);
  CHECK(ts.storage(stored.model.tensor("layers.0.down")) == Storage::q8_0);
  REQUIRE(hf::write_gguf(again, stored.model, vocab, {.type = hf::GgufType::q4_k_m}).ok());
  CHECK(read_bytes(again) == read_bytes(path));
}
