// A GGUF as nn::Lm and hf::Tokenizer (include/grad/hf/gguf_load.hpp).
#include "grad/hf/gguf_load.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <set>

#include "bounded_input.hpp"
#include "grad/numerics/held.hpp"
#include "grad/numerics/quant.hpp"

namespace grad::hf {

namespace {

using detail::text_excerpt;

[[noreturn]] void fail(const GgufFile& f, const std::string& why) {
  throw Error("grad::hf: GGUF '" + f.path() + "': " + why);
}

// Metadata readers: a missing key takes its default (none: required).
struct Keys {
  const GgufFile& f;
  std::string arch;
  const GgufValue* get(const std::string& key) const { return f.find(key); }
  std::size_t size(const std::string& key, std::optional<std::size_t> fallback = std::nullopt) const {
    const GgufValue* v = get(key);
    if (!v) {
      if (!fallback) fail(f, "metadata '" + key + "' is missing (a " + arch + " model needs it)");
      return *fallback;
    }
    const std::optional<std::uint64_t> n = v->as_size();
    // Bounded well below size_t's range: LmConfig::check names what is too large.
    if (!n) fail(f, "metadata '" + key + "' is " + v->describe() + " (expected one whole number >= 0)");
    if (*n > (std::uint64_t{1} << 40))
      fail(f, "metadata '" + key + "' is " + v->describe() + " (expected at most 2^40)");
    return static_cast<std::size_t>(*n);
  }
  // A float32 (or f64) key as the shortest decimal that is its float32:
  // what the config it was written from said (1e-06, not 9.99999997e-07).
  double real(const std::string& key, std::optional<double> fallback) const {
    const GgufValue* v = get(key);
    if (!v) {
      if (!fallback) fail(f, "metadata '" + key + "' is missing (a " + arch + " model needs it)");
      return *fallback;
    }
    const std::optional<double> x = v->as_real();
    if (!x) fail(f, "metadata '" + key + "' is " + v->describe() + " (expected a real, f32)");
    if (v->type != GgufValueType::f32 || !std::isfinite(*x)) return *x;
    char text[64];
    const float single = static_cast<float>(*x);
    const auto printed = std::to_chars(text, text + sizeof text, single);
    double shortest = *x;
    std::from_chars(text, printed.ptr, shortest);
    return static_cast<float>(shortest) == single ? shortest : *x;
  }
  std::optional<std::string> text(const std::string& key) const {
    const GgufValue* v = get(key);
    if (!v) return std::nullopt;
    if (v->type != GgufValueType::string)
      fail(f, "metadata '" + key + "' is " + v->describe() + " (expected a string)");
    return v->string;
  }
};

constexpr const char* gguf_proj[nn::proj_count] = {"attn_q",   "attn_k", "attn_v",  "attn_output",
                                                   "ffn_gate", "ffn_up", "ffn_down"};

bool all_zero(std::span<const unsigned char> bytes) {
  return std::all_of(bytes.begin(), bytes.end(), [](unsigned char b) { return b == 0; });
}

// Whether the file's q/k/v biases are all zero bytes (+0.0 in any float type).
bool zero_biases(const GgufFile& f, std::size_t layers) {
  for (std::size_t l = 0; l < layers; ++l)
    for (std::size_t p = 0; p < 3; ++p) {
      const GgufTensorInfo* t = f.tensor("blk." + std::to_string(l) + "." + gguf_proj[p] + ".bias");
      if (t && !all_zero(f.bytes(*t))) return false;
    }
  return true;
}

// ---- how a tensor of the file becomes a node's values ----

// The one place that decides how a tensor of the file is held, given the
// storage its node has: widened to T (decoded exactly: F32, F16, BF16), its
// 16-bit bits copied (a BF16 tensor into a bf16 node, F16 into f16), or
// decoded and rounded to the node's 16-bit format. (A node that keeps the
// file's own quantized blocks is the fourth way, to come with such storage.)
enum class Holding : std::uint8_t { widen, copy_bits, round_bits, copy_blocks, quantize_blocks };

// The GGUF name of one of nn::Lm's base matrices ("embed", "layers.N.<proj>",
// "head"; placements' table); "" for any other name.
std::string gguf_matrix_name(const std::string& name) {
  if (name == "embed") return "token_embd.weight";
  if (name == "head") return "output.weight";
  const std::size_t dot = name.rfind('.');
  if (!name.starts_with("layers.") || dot == std::string::npos || dot < 7) return "";
  std::string out = "blk.";
  out.append(name, 7, dot - 7);  // the layer's number
  for (std::size_t p = 0; p < nn::proj_count; ++p)
    if (name.compare(dot + 1, std::string::npos, nn::proj_names[p]) == 0)
      return out.append(".").append(gguf_proj[p]).append(".weight");
  return "";
}

Holding holding(const GgufTensorInfo& t, Storage node) {
  if (node == Storage::native) return Holding::widen;
  const bool same = storage_for(t.ggml_type()) == node;  // the node holds the file's own type
  if (quantized(node)) return same ? Holding::copy_blocks : Holding::quantize_blocks;
  return same ? Holding::copy_bits : Holding::round_bits;
}

// "" or why values of this type cannot be decoded here.
std::string decodable(const GgufTensorInfo& t) {
  switch (t.ggml_type()) {
    case GgmlType::f32:
    case GgmlType::f16:
    case GgmlType::bf16:
      return "";
    default: {
      if (quant_format_from_ggml(t.type)) return "";
      const GgmlTypeInfo* info = ggml_type_info(t.type);
      const bool quantized = info && info->block_elements > 1;
      return "type " + ggml_type_name(t.type) +
             (quantized ? ", a quantized format grad does not read (expected f32, f16, bf16, q8_0, q4_0, q4_K, q5_K "
                          "or q6_K)"
                        : " (expected f32, f16, bf16 or a quantized format for a model's weights)");
    }
  }
}

// n values of a decodable type from its bytes (n a whole number of its
// blocks), exactly as floats: quantized blocks as ggml's reference
// dequantization computes them (grad/numerics/quant.hpp).
void decode(const GgufTensorInfo& t, const unsigned char* bytes, std::size_t n, float* out) {
  switch (t.ggml_type()) {
    case GgmlType::f32:
      std::memcpy(out, bytes, n * sizeof(float));
      return;
    case GgmlType::f16:
    case GgmlType::bf16: {
      const Storage s = t.ggml_type() == GgmlType::f16 ? Storage::f16 : Storage::bf16;
      for (std::size_t i = 0; i < n; ++i) {
        std::uint16_t b;
        std::memcpy(&b, bytes + 2 * i, 2);
        out[i] = widen<float>(s, b);
      }
      return;
    }
    default:
      if (const std::optional<QuantFormat> q = quant_format_from_ggml(t.type)) dequantize(*q, bytes, out, n);
      return;  // others refused before (decodable)
  }
}

// One base tensor of an Lm and where it is in the file.
template <class T>
struct Placed {
  std::string gguf_name, grad_name;
  Var<T> var;
  // Where the file's element (row r, column k) of an ne = {cols, rows} tensor goes:
  //   transposed: grad's [k, column(r)] of [cols, rows] (a projection, the head)
  //   a matrix kept: grad's [r, k] (the embedding)
  //   a vector: grad's [column(k)]
  bool transposed = false;
  std::size_t heads = 0;  // > 0: llama's q/k rows, interleaved RoPE order within each of `heads` heads
  const GgufTensorInfo* info = nullptr;
};

// Where llama.cpp's interleaved-RoPE row r of a `heads`-head tensor of `rows`
// rows goes in grad's rotate-half order: row 2j of a head holds grad's
// column j, row 2j + 1 column j + width/2 (the inverse of write_gguf's).
std::size_t column(std::size_t r, std::size_t rows, std::size_t heads) {
  if (heads == 0) return r;
  const std::size_t width = rows / heads, head = r / width, j = r % width;
  return head * width + (j % 2) * (width / 2) + j / 2;
}

std::string ne_text(std::span<const std::uint64_t> ne) {
  std::string s = "{";
  for (std::size_t i = 0; i < ne.size(); ++i) s += (i ? ", " : "") + std::to_string(ne[i]);
  return s + "}";
}

template <class T>
std::vector<Placed<T>> placements(const nn::Lm<T>& m, const std::string& arch) {
  const nn::LmConfig& c = m.config();
  const bool llama = arch == "llama";
  std::vector<Placed<T>> out;
  out.push_back({"token_embd.weight", "embed", m.embed(), false, 0, nullptr});
  for (std::size_t l = 0; l < c.layers; ++l) {
    const nn::LmLayer<T>& L = m.layer(l);
    const std::string blk = "blk." + std::to_string(l) + ".", g = "layers." + std::to_string(l) + ".";
    out.push_back({blk + "attn_norm.weight", g + "attn_norm", L.attn_norm, false, 0, nullptr});
    for (std::size_t p = 0; p < nn::proj_count; ++p) {
      const std::size_t heads = !llama                                       ? 0
                                : p == static_cast<std::size_t>(nn::Proj::q) ? c.heads
                                : p == static_cast<std::size_t>(nn::Proj::k) ? c.kv_heads
                                                                             : 0;
      const std::string name = g + std::string(nn::proj_names[p]);
      out.push_back({blk + gguf_proj[p] + ".weight", name, L.w[p], true, heads, nullptr});
      if (L.bias[p].valid())
        out.push_back({blk + gguf_proj[p] + ".bias", name + "_bias", L.bias[p], false, heads, nullptr});
    }
    out.push_back({blk + "ffn_norm.weight", g + "mlp_norm", L.mlp_norm, false, 0, nullptr});
  }
  out.push_back({"output_norm.weight", "final_norm", m.final_norm(), false, 0, nullptr});
  if (!c.tied_embeddings) out.push_back({"output.weight", "head", m.head(), true, 0, nullptr});
  return out;
}

// Rows of the file's tensor decoded a tile at a time and scattered into the
// node: `store(index, float value)` or, copying bits, `store(index, bits)`.
template <class T, class Elem, class Load, class Store>
void scatter(const Placed<T>& p, Load load, Store store) {
  const GgufTensorInfo& t = *p.info;
  const std::size_t cols = static_cast<std::size_t>(t.ne[0]);
  const std::size_t rows = t.ne.size() == 2 ? static_cast<std::size_t>(t.ne[1]) : 1;
  // A tile of rows at a time: a transposed write then runs along grad's rows.
  const std::size_t tile_rows = std::max<std::size_t>(1, std::min<std::size_t>(rows, (std::size_t{1} << 18) / cols));
  std::vector<Elem> tile(tile_rows * cols);
  for (std::size_t r0 = 0; r0 < rows; r0 += tile_rows) {
    const std::size_t n = std::min(tile_rows, rows - r0);
    load(r0, n, tile.data());
    if (t.ne.size() == 1) {
      for (std::size_t k = 0; k < cols; ++k) store(column(k, cols, p.heads), tile[k]);
    } else if (p.transposed) {
      for (std::size_t k = 0; k < cols; ++k)
        for (std::size_t j = 0; j < n; ++j) store(k * rows + column(r0 + j, rows, p.heads), tile[j * cols + k]);
    } else {
      for (std::size_t j = 0; j < n * cols; ++j) store(r0 * cols + j, tile[j]);
    }
  }
}

template <class T>
void fill(const GgufFile& f, const Placed<T>& p, Tape<T>& tp) {
  const GgufTensorInfo& t = *p.info;
  const std::span<const unsigned char> bytes = f.bytes(t);
  const GgmlTypeInfo& info = *ggml_type_info(t.type);
  const std::size_t row_bytes = static_cast<std::size_t>(t.ne[0] / info.block_elements * info.block_bytes);
  const Storage storage = tp.storage(p.var);
  const Holding how = holding(t, storage);
  auto load_floats = [&](std::size_t r0, std::size_t n, float* out) {
    decode(t, bytes.data() + r0 * row_bytes, n * static_cast<std::size_t>(t.ne[0]), out);
  };
  if (how == Holding::copy_blocks || how == Holding::quantize_blocks) {
    // The node's memory rows are the file's rows (a projection held as
    // llama.cpp holds it, the embedding as its own rows), a llama q or k
    // row moved whole to its rotate-half place.
    const std::size_t cols = static_cast<std::size_t>(t.ne[0]), rows = static_cast<std::size_t>(t.ne[1]);
    if (how == Holding::copy_blocks) {
      const std::span<std::uint8_t> blocks = tp.leaf_blocks(p.var);
      const QuantRows held = tp.held_rows(p.var);  // checked: cols per row, rows of them
      for (std::size_t r = 0; r < rows; ++r)
        put_row_blocks(held, blocks.data(), column(r, rows, p.heads), bytes.data() + r * row_bytes);
      return;
    }
    std::vector<T> memory(rows * cols);
    std::vector<float> row(cols);
    for (std::size_t r = 0; r < rows; ++r) {
      decode(t, bytes.data() + r * row_bytes, cols, row.data());
      std::copy(row.begin(), row.end(), memory.begin() + static_cast<std::ptrdiff_t>(column(r, rows, p.heads) * cols));
    }
    if (std::string why = tp.store_held(p.var, memory); !why.empty())
      fail(f, "tensor '" + p.gguf_name + "' (grad's '" + p.grad_name + "'): " + why);
    return;
  }
  if (how == Holding::widen) {
    const std::span<T> to = tp.leaf_value(p.var);
    scatter<T, float>(p, load_floats, [&](std::size_t i, float x) { to[i] = static_cast<T>(x); });
    return;
  }
  const std::span<std::uint16_t> bits = tp.leaf_bits(p.var);
  if (how == Holding::copy_bits) {
    auto load_bits = [&](std::size_t r0, std::size_t n, std::uint16_t* out) {
      std::memcpy(out, bytes.data() + r0 * row_bytes, n * row_bytes);
    };
    scatter<T, std::uint16_t>(p, load_bits, [&](std::size_t i, std::uint16_t b) { bits[i] = b; });
    return;
  }
  scatter<T, float>(p, load_floats, [&](std::size_t i, float x) { bits[i] = round_to(storage, x); });
}

// Throws when a value would not survive the rounding into an f16 node (beyond its range).
template <class T>
void check_rounding(const GgufFile& f, const Placed<T>& p, Storage storage) {
  if (storage != Storage::f16) return;
  const GgufTensorInfo& t = *p.info;
  const std::span<const unsigned char> bytes = f.bytes(t);
  const GgmlTypeInfo& info = *ggml_type_info(t.type);
  const std::size_t cols = static_cast<std::size_t>(t.ne[0]);
  const std::size_t rows = static_cast<std::size_t>(t.elements / t.ne[0]);
  const std::size_t row_bytes = cols / info.block_elements * info.block_bytes;
  std::vector<float> row(cols);
  for (std::size_t r = 0; r < rows; ++r) {
    decode(t, bytes.data() + r * row_bytes, cols, row.data());
    for (std::size_t k = 0; k < cols; ++k)
      if (std::isfinite(row[k]) && std::isinf(F16::widen(round_to(storage, row[k])))) {
        char number[32];
        std::snprintf(number, sizeof number, "%.9g", static_cast<double>(row[k]));
        fail(f, "tensor '" + t.name + "' (grad's '" + p.grad_name + "') row " + std::to_string(r) + ", column " +
                    std::to_string(k) + " is " + number +
                    ", beyond F16's range: a model whose base is held f16 cannot hold it (load it as bf16 or "
                    "native)");
      }
  }
}

// The tensors a model of `c` has, with the ne the file must give each:
// checked against the file before a model is built, so that a shape in the
// metadata that the tensors do not bear out allocates nothing.
void check_shapes(const GgufFile& f, const GgufConfig& g) {
  const nn::LmConfig& c = g.config;
  const std::string described = "the " + g.architecture + " model the metadata describes (" + c.describe() + ")";
  auto want = [&](const std::string& name, std::vector<std::uint64_t> ne) {
    const GgufTensorInfo* t = f.tensor(name);
    if (!t) fail(f, "tensor '" + name + "' is missing: " + described + " has it, ne " + ne_text(ne));
    if (t->ne != ne)
      fail(f, "tensor '" + name + "' is ne " + ne_text(t->ne) + ", but " + described + " makes it ne " + ne_text(ne));
  };
  want("token_embd.weight", {c.d_model, c.vocab});
  for (std::size_t l = 0; l < c.layers; ++l) {
    const std::string blk = "blk." + std::to_string(l) + ".";
    want(blk + "attn_norm.weight", {c.d_model});
    want(blk + "ffn_norm.weight", {c.d_model});
    for (std::size_t p = 0; p < nn::proj_count; ++p) {
      const auto [in, out] = c.proj_shape(nn::Proj(p));
      want(blk + gguf_proj[p] + ".weight", {in, out});
      if (c.qkv_bias && p < 3) want(blk + gguf_proj[p] + ".bias", {out});
    }
  }
  want("output_norm.weight", {c.d_model});
  if (!c.tied_embeddings) want("output.weight", {c.d_model, c.vocab});
}

}  // namespace

GgufConfig read_gguf_config(const GgufFile& f, const GgufLoadOptions& options) {
  const Keys root{f, "GGUF"};
  const std::optional<std::string> arch = root.text("general.architecture");
  if (!arch) fail(f, "metadata 'general.architecture' is missing (expected \"qwen2\" or \"llama\")");
  if (*arch != "qwen2" && *arch != "llama")
    fail(f, "metadata 'general.architecture' is \"" + text_excerpt(*arch) +
                "\": an architecture grad does not read (expected \"qwen2\" or \"llama\")");
  const Keys k{f, *arch};
  const std::string a = *arch + ".";
  GgufConfig out;
  out.architecture = *arch;
  nn::LmConfig& c = out.config;
  c.d_model = k.size(a + "embedding_length");
  c.layers = k.size(a + "block_count");
  c.ffn = k.size(a + "feed_forward_length");
  c.heads = k.size(a + "attention.head_count");
  c.kv_heads = k.size(a + "attention.head_count_kv", c.heads);
  out.context_length = k.size(a + "context_length");
  c.max_seq = options.max_seq != 0 ? options.max_seq : out.context_length;
  c.rope_base = k.real(a + "rope.freq_base", 10000.0);
  c.eps = k.real(a + "attention.layer_norm_rms_epsilon", std::nullopt);
  if (c.heads == 0) fail(f, "metadata '" + a + "attention.head_count' is 0 (expected at least 1)");
  const std::size_t even = c.d_model % c.heads == 0 ? c.d_model / c.heads : 0;
  const std::size_t head_dim = k.size(a + "attention.key_length", even == 0 ? std::nullopt : std::optional(even));
  const std::size_t value_dim = k.size(a + "attention.value_length", head_dim);
  if (value_dim != head_dim)
    fail(f, "metadata '" + a + "attention.value_length' is " + std::to_string(value_dim) + ", key_length " +
                std::to_string(head_dim) + " (grad's heads have one width: expected the same)");
  const std::size_t rotated = k.size(a + "rope.dimension_count", head_dim);
  if (rotated != head_dim)
    fail(f, "metadata '" + a + "rope.dimension_count' is " + std::to_string(rotated) + " for heads " +
                std::to_string(head_dim) + " wide (grad's RoPE rotates the whole head: expected " +
                std::to_string(head_dim) + ")");
  if (head_dim != even) c.head_width = head_dim;
  if (const std::optional<std::string> scaling = k.text(a + "rope.scaling.type"); scaling && *scaling != "none")
    fail(f, "metadata '" + a + "rope.scaling.type' is \"" + text_excerpt(*scaling) +
                "\": grad's RoPE has no scaling (expected none)");
  if (f.tensor("rope_freqs.weight"))
    fail(f, "tensor 'rope_freqs.weight' scales RoPE's frequencies (Llama 3.1's rope scaling): grad's RoPE has none");

  // The vocabulary: the tokenizer's tokens, else the embedding's rows.
  const GgufTensorInfo* embd = f.tensor("token_embd.weight");
  if (!embd) fail(f, "tensor 'token_embd.weight' is missing (every " + *arch + " model has it)");
  const GgufValue* tokens = f.find("tokenizer.ggml.tokens");
  if (tokens && tokens->type == GgufValueType::array && tokens->element_type == GgufValueType::string)
    c.vocab = static_cast<std::size_t>(tokens->count);
  else if (embd->ne.size() == 2)
    c.vocab = static_cast<std::size_t>(std::min<std::uint64_t>(embd->ne[1], std::uint64_t{1} << 40));
  if (const GgufValue* v = f.find(a + "vocab_size"); v && v->as_size() != c.vocab)
    fail(f, "metadata '" + a + "vocab_size' is " + v->describe() + ", but the " +
                (tokens ? "tokenizer has " : "embedding has ") + std::to_string(c.vocab) + " tokens");

  c.tied_embeddings = f.tensor("output.weight") == nullptr;
  // Bounded (layers among them) before the layers' tensors are looked for.
  if (std::string why = c.check(); !why.empty()) fail(f, "the model the metadata describes: " + why);
  // q/k/v biases: in every layer or in none.
  std::size_t biases = 0;
  std::string one_missing, one_present;
  for (std::size_t l = 0; l < c.layers; ++l)
    for (std::size_t p = 0; p < 3; ++p) {
      const std::string name = "blk." + std::to_string(l) + "." + gguf_proj[p] + ".bias";
      if (f.tensor(name)) {
        ++biases;
        one_present = name;
      } else {
        one_missing = name;
      }
    }
  if (biases != 0 && !one_missing.empty())
    fail(f, "tensor '" + one_missing + "' is missing, but '" + one_present +
                "' is there (grad's q/k/v biases are in every layer or none)");
  c.qkv_bias = biases != 0 && !(options.zero_biases_as_none && zero_biases(f, c.layers));
  c.lora_rank = options.lora_rank;
  c.lora_scale = options.lora_scale;
  c.lora_targets = options.lora_targets;
  if (std::string why = c.check(); !why.empty()) fail(f, "the model the metadata describes: " + why);
  return out;
}

BpeVocab read_gguf_vocab(const GgufFile& f) {
  auto refuse = [&](const std::string& why) -> BpeVocab {
    throw TokenizerError("grad::hf: GGUF '" + f.path() + "': " + why);
  };
  const GgufValue* model = f.find("tokenizer.ggml.model");
  if (!model) return refuse("metadata 'tokenizer.ggml.model' is missing: the file has no tokenizer");
  if (model->type != GgufValueType::string)
    return refuse("metadata 'tokenizer.ggml.model' is " + model->describe() + " (expected a string)");
  if (model->string == "llama")
    return refuse(
        "tokenizer.ggml.model is \"llama\" (SentencePiece, scores and byte fallback), which hf::Tokenizer "
        "(byte-level BPE) cannot express: the weights load without it");
  if (model->string != "gpt2")
    return refuse("tokenizer.ggml.model is \"" + text_excerpt(model->string) +
                  "\" (grad reads \"gpt2\", byte-level BPE)");
  auto strings = [&](const char* key, bool required) -> const std::vector<std::string>* {
    const GgufValue* v = f.find(key);
    if (!v) {
      if (required) refuse(std::string("metadata '") + key + "' is missing");
      return nullptr;
    }
    if (v->type != GgufValueType::array || v->element_type != GgufValueType::string)
      refuse(std::string("metadata '") + key + "' is " + v->describe() + " (expected an array of strings)");
    return &v->strings;
  };
  BpeVocab v;
  v.tokens = *strings("tokenizer.ggml.tokens", true);
  v.merges = *strings("tokenizer.ggml.merges", true);
  if (const GgufValue* types = f.find("tokenizer.ggml.token_type")) {
    GgufValue element;  // of the element type, to ask whether it is an integer
    element.type = types->element_type;
    if (types->type != GgufValueType::array || !element.is_integer() || types->count != v.tokens.size())
      return refuse("metadata 'tokenizer.ggml.token_type' is " + types->describe() + " (expected " +
                    std::to_string(v.tokens.size()) + " integers, one per token)");
    v.token_types.reserve(v.tokens.size());
    for (std::size_t i = 0; i < types->count; ++i) {
      const std::int64_t t = *types->integer_at(i);
      if (t < 1 || t > 6)
        return refuse("metadata 'tokenizer.ggml.token_type' [" + std::to_string(i) + "] is " + std::to_string(t) +
                      " (expected 1 .. 6: normal, unknown, control, user-defined, unused, byte)");
      v.token_types.push_back(static_cast<TokenType>(t));
    }
  }
  const GgufValue* pre = f.find("tokenizer.ggml.pre");
  if (pre && pre->type != GgufValueType::string)
    return refuse("metadata 'tokenizer.ggml.pre' is " + pre->describe() + " (expected a string)");
  v.pre = pre ? pre->string : "default";
  const std::pair<const char*, std::optional<std::uint32_t>*> ids[] = {{"tokenizer.ggml.bos_token_id", &v.bos},
                                                                       {"tokenizer.ggml.eos_token_id", &v.eos},
                                                                       {"tokenizer.ggml.padding_token_id", &v.pad}};
  for (const auto& [key, id] : ids)
    if (const GgufValue* x = f.find(key)) {
      const std::optional<std::uint64_t> n = x->as_size();
      if (!n || *n >= v.tokens.size())
        return refuse(std::string("metadata '") + key + "' is " + x->describe() + " (expected a token id < " +
                      std::to_string(v.tokens.size()) + ")");
      *id = static_cast<std::uint32_t>(*n);
    }
  if (const GgufValue* b = f.find("tokenizer.ggml.add_bos_token")) {
    if (b->type != GgufValueType::boolean)
      return refuse("metadata 'tokenizer.ggml.add_bos_token' is " + b->describe() + " (expected a bool)");
    v.add_bos = b->integer != 0;
  }
  if (std::string why = check_vocab(v, v.tokens.size()); !why.empty()) return refuse("tokenizer: " + why);
  return v;
}

template <class T>
void load_gguf_weights(const GgufFile& f, nn::Lm<T>& model) {
  const nn::LmConfig& c = model.config();
  Tape<T>& tp = model.tape();
  const std::optional<std::string> arch = Keys{f, "GGUF"}.text("general.architecture");
  if (!arch || (*arch != "qwen2" && *arch != "llama"))
    fail(f, "metadata 'general.architecture' is not \"qwen2\" or \"llama\"");
  std::vector<Placed<T>> wanted = placements(model, *arch);
  const std::string described = "the " + *arch + " model (" + c.describe() + ")";
  std::set<std::string> placed;
  for (Placed<T>& p : wanted) {
    const std::span<const std::size_t> dims = tp.dims(p.var).span();
    // GGUF lists dims fastest first: grad's [in, out] transposed is {in, out}; a matrix kept {cols, rows}.
    std::vector<std::uint64_t> expect = dims.size() == 1 ? std::vector<std::uint64_t>{dims[0]}
                                        : p.transposed   ? std::vector<std::uint64_t>{dims[0], dims[1]}
                                                         : std::vector<std::uint64_t>{dims[1], dims[0]};
    const std::string who = "tensor '" + p.gguf_name + "' (grad's '" + p.grad_name + "')";
    p.info = f.tensor(p.gguf_name);
    if (!p.info) fail(f, who + " is missing: " + described + " has it, ne " + ne_text(expect));
    if (p.info->ne != expect)
      fail(f, who + " is ne " + ne_text(p.info->ne) + ", but " + described + " makes it ne " + ne_text(expect));
    if (std::string why = decodable(*p.info); !why.empty()) fail(f, who + " is " + why);
    if (quantized(tp.storage(p.var)) && tp.transposed(p.var) != p.transposed)
      fail(f, who + " is held " + std::string(storage_name(tp.storage(p.var))) +
                  (tp.transposed(p.var) ? " as its transpose" : " in its own rows") +
                  ", which is not how the file lays it out (a model of nn::Lm's quantized layout is expected)");
    placed.insert(p.gguf_name);
  }
  for (const GgufTensorInfo& t : f.tensors()) {
    if (placed.contains(t.name)) continue;
    // write_gguf's qwen2 writes zero biases for a model without them.
    const bool bias = t.name.size() > 5 && t.name.compare(t.name.size() - 5, 5, ".bias") == 0;
    if (!c.qkv_bias && bias && all_zero(f.bytes(t))) continue;
    fail(f, "tensor '" + text_excerpt(t.name) + "' has no place in " + described +
                (bias ? ": its biases are not all zero, and the model has none" : ""));
  }
  // The conversions that can refuse a value, tried before anything is written.
  for (const Placed<T>& p : wanted)
    if (holding(*p.info, tp.storage(p.var)) == Holding::round_bits) check_rounding(f, p, tp.storage(p.var));
  for (const Placed<T>& p : wanted) {
    fill(f, p, tp);
    f.release(*p.info);  // the copy is the model's; the file's pages need not stay resident too
  }
}

template <class T>
GgufModel<T> load_gguf(const std::string& path, Tape<T>& tp, typename nn::Lm<T>::Train train,
                       const GgufLoadOptions& options) {
  const GgufFile f(path);
  GgufConfig cfg = read_gguf_config(f, options);
  std::optional<BpeVocab> vocab;
  std::optional<Tokenizer> tokenizer;
  std::string problem;
  if (options.tokenizer != GgufLoadOptions::TokenizerMode::skip) {
    try {
      vocab = read_gguf_vocab(f);
      tokenizer = bpe_tokenizer(*vocab);
    } catch (const TokenizerError& e) {
      if (options.tokenizer == GgufLoadOptions::TokenizerMode::required) throw;
      problem = e.what();
    }
  }
  check_shapes(f, cfg);
  // Each base matrix as the options hold it (as_stored: as its tensor in the
  // file is), recorded as zeros: every one of them is then loaded.
  auto storage_of_matrix = [&](const std::string& name) {
    if (!options.as_stored) return options.base_storage;
    const GgufTensorInfo* t = f.tensor(gguf_matrix_name(name));
    return t ? storage_for(t->ggml_type()) : Storage::native;
  };
  nn::Lm<T> model(tp, cfg.config, options.seed, train, storage_of_matrix, nn::Lm<T>::Values::zeros);
  load_gguf_weights(f, model);
  return GgufModel<T>{cfg.architecture, cfg.config,           std::move(model),
                      std::move(vocab), std::move(tokenizer), std::move(problem)};
}

template void load_gguf_weights<float>(const GgufFile&, nn::Lm<float>&);
template void load_gguf_weights<double>(const GgufFile&, nn::Lm<double>&);
template GgufModel<float> load_gguf<float>(const std::string&, Tape<float>&, nn::Lm<float>::Train,
                                           const GgufLoadOptions&);
template GgufModel<double> load_gguf<double>(const std::string&, Tape<double>&, nn::Lm<double>::Train,
                                             const GgufLoadOptions&);

}  // namespace grad::hf
