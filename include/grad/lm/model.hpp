// grad::nn::Lm: the language model's configuration, byte tokenizer, named
// parameters, seeded initialisation, the forward that records it on a tape,
// and merging LoRA adapters into the base (grad/lm.hpp has the overview).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grad/available_memory.hpp"
#include "grad/model_file.hpp"
#include "grad/nn.hpp"
#include "grad/random.hpp"
#include "grad/recompute.hpp"

namespace grad::nn {

// The projections of a block, in the order of LmLayer::w.
enum class Proj : std::uint8_t { q, k, v, o, gate, up, down };
inline constexpr std::size_t proj_count = 7;
inline constexpr std::array<std::string_view, proj_count> proj_names = {"q", "k", "v", "o", "gate", "up", "down"};
inline constexpr std::uint32_t all_projections = (1u << proj_count) - 1;
// The part of a block a projection belongs to: its name scope on the tape.
inline std::string_view proj_part(Proj p) { return p <= Proj::o ? "attention" : "mlp"; }

// "q,v" -> the bits of q and v; "all" -> every projection. Throws on an unknown name.
inline std::uint32_t parse_projections(std::string_view list) {
  if (list == "all") return all_projections;
  std::uint32_t bits = 0;
  while (!list.empty()) {
    const std::size_t comma = list.find(',');
    const std::string_view name = list.substr(0, comma);
    const auto it = std::find(proj_names.begin(), proj_names.end(), name);
    if (it == proj_names.end())
      throw std::invalid_argument("nn::parse_projections: unknown projection '" + std::string(name) +
                                  "' (expected a comma-separated list of q, k, v, o, gate, up, down, or all)");
    bits |= 1u << (it - proj_names.begin());
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
  }
  return bits;
}

struct LmConfig {
  std::size_t vocab = 256, d_model = 64, layers = 2, heads = 4, kv_heads = 2, ffn = 176, max_seq = 128;
  double rope_base = 10000.0, eps = 1e-6;
  std::size_t lora_rank = 0;  // 0: no adapters
  double lora_scale = 1.0;    // alpha / r, as PEFT
  std::uint32_t lora_targets = all_projections;
  // What checkpoints trained elsewhere need (grad/hf/model.hpp reads them
  // from a Hugging Face config.json). Their defaults are grad's own model,
  // whose bits and model files they leave as they were; a model file
  // (save_lm) cannot hold a config that sets them.
  std::size_t head_width = 0;    // 0: d_model / heads; else each head's width (HF's head_dim)
  bool qkv_bias = false;         // q, k and v add a bias after the projection (Qwen2)
  bool tied_embeddings = false;  // logits = h . embed^T: no head of its own (HF's tie_word_embeddings)

  std::size_t head_dim() const {
    if (head_width != 0) return head_width;
    return heads == 0 ? 0 : d_model / heads;
  }
  // Whether a grad model file can hold this config (LmConfig::stored has no room for the fields above).
  bool fits_model_file() const { return head_width == 0 && !qkv_bias && !tied_embeddings; }
  bool has_adapter(Proj p) const { return lora_rank > 0 && (lora_targets >> static_cast<unsigned>(p) & 1u) != 0; }
  // The projection's [in, out].
  std::array<std::size_t, 2> proj_shape(Proj p) const {
    const std::size_t hd = head_dim();
    switch (p) {
      case Proj::q:
        return {d_model, heads * hd};
      case Proj::k:
      case Proj::v:
        return {d_model, kv_heads * hd};
      case Proj::o:
        return {heads * hd, d_model};
      case Proj::gate:
      case Proj::up:
        return {d_model, ffn};
      case Proj::down:
        return {ffn, d_model};
    }
    return {0, 0};
  }
  // The largest sizes check() accepts. A config is data (a model file's
  // "lm.config" can say anything), so every size is bounded before anything
  // is built from it: layers alone would otherwise make Lm record blocks
  // for as long as it is asked to.
  // max_dim: vocab, d_model, heads, ffn, max_seq, lora_rank; max_layers:
  // blocks; max_elements: parameters, and KV-cache entries (2^36 f32 = 256 GiB).
  static constexpr std::size_t max_dim = std::size_t{1} << 24;
  static constexpr std::size_t max_layers = std::size_t{1} << 16;
  static constexpr std::size_t max_elements = std::size_t{1} << 36;

  // Every tensor's element count summed (lm.config not counted), or nothing
  // when the sum overflows. Only meaningful when heads divides d_model.
  std::optional<std::size_t> parameter_count() const {
    bool overflow = false;
    auto mul = [&](std::size_t x, std::size_t y) {
      std::size_t z = 0;
      overflow = __builtin_mul_overflow(x, y, &z) || overflow;
      return z;
    };
    auto add = [&](std::size_t& sum, std::size_t x) { overflow = __builtin_add_overflow(sum, x, &sum) || overflow; };
    std::size_t block = mul(2, d_model);  // the two norms
    for (std::size_t p = 0; p < proj_count; ++p) {
      const auto [in, out] = proj_shape(Proj(p));
      add(block, mul(in, out));
      if (has_adapter(Proj(p))) {
        add(block, mul(in, lora_rank));
        add(block, mul(lora_rank, out));
      }
    }
    if (qkv_bias) {
      add(block, proj_shape(Proj::q)[1]);
      add(block, mul(2, proj_shape(Proj::k)[1]));
    }
    std::size_t total = mul(tied_embeddings ? 1 : 2, mul(vocab, d_model));  // embed, head
    add(total, d_model);                                                    // final_norm
    add(total, mul(layers, block));
    if (overflow) return std::nullopt;
    return total;
  }

  // "" or what is wrong, naming the field, its value and what was expected.
  std::string check() const {
    auto n = [](std::size_t v) { return std::to_string(v); };
    auto real = [](double v) {
      char text[32];
      std::snprintf(text, sizeof text, "%.17g", v);
      return std::string(text);
    };
    if (vocab == 0 || d_model == 0 || layers == 0 || ffn == 0 || max_seq == 0)
      return "vocab, d_model, layers, ffn and max_seq must all be at least 1";
    // Generation restarts on the latest max_seq / 2 tokens: at least one.
    if (max_seq < 2)
      return "max_seq " + n(max_seq) + ": expected at least 2 (generation restarts on max_seq / 2 tokens)";
    const std::pair<const char*, std::size_t> dims[] = {
        {"vocab", vocab}, {"d_model", d_model}, {"heads", heads},         {"kv_heads", kv_heads},
        {"ffn", ffn},     {"max_seq", max_seq}, {"lora_rank", lora_rank}, {"head_width", head_width}};
    for (const auto& [name, value] : dims)
      if (value > max_dim) return std::string(name) + " " + n(value) + ": expected at most " + n(max_dim);
    if (layers > max_layers) return "layers " + n(layers) + ": expected at most " + n(max_layers);
    if (heads == 0 || kv_heads == 0 || heads % kv_heads != 0)
      return "heads " + n(heads) + " and kv_heads " + n(kv_heads) + ": expected kv_heads >= 1 dividing heads";
    if (head_width != 0 && head_width % 2 != 0)
      return "head_width " + n(head_width) + ": expected an even width (RoPE rotates pairs of columns)";
    if (head_width == 0 && (d_model % heads != 0 || head_dim() % 2 != 0))
      return "d_model " + n(d_model) + " over " + n(heads) + " heads: expected an even head width dividing d_model";
    if (!std::isfinite(rope_base) || !(rope_base > 1))
      return "rope_base " + real(rope_base) + ": expected a finite value > 1";
    if (!std::isfinite(eps) || !(eps > 0)) return "eps " + real(eps) + ": expected a finite value > 0";
    if (lora_rank > 0 && (lora_targets & all_projections) == 0)
      return "lora_rank " + n(lora_rank) + " but no projection is targeted";
    if ((lora_targets & ~all_projections) != 0)
      return "lora_targets " + n(lora_targets) + ": expected a set of the 7 projections (at most " +
             n(all_projections) + ")";
    if (lora_rank > 0 && !std::isfinite(lora_scale))
      return "lora_scale " + real(lora_scale) + ": expected a finite value";
    const std::optional<std::size_t> params = parameter_count();
    if (!params || *params > max_elements)
      return (params ? n(*params) : std::string("more than 2^64")) + " parameters (" + describe() +
             "): expected at most " + n(max_elements);
    // The decoder's KV cache: keys and values for every layer, KV head and position.
    std::size_t cache = 0;
    if (__builtin_mul_overflow(layers, kv_heads * max_seq, &cache) ||
        __builtin_mul_overflow(cache, 2 * head_dim(), &cache) || cache > max_elements)
      return "a KV cache of layers * kv_heads * max_seq * 2 * head width > " + n(max_elements) + " entries (" +
             describe() + "): expected at most that";
    return "";
  }
  std::string describe() const {
    auto n = [](std::size_t v) { return std::to_string(v); };
    std::string s = "vocab " + n(vocab) + ", d_model " + n(d_model) + ", layers " + n(layers) + ", heads " + n(heads) +
                    ", kv_heads " + n(kv_heads) + ", ffn " + n(ffn) + ", max_seq " + n(max_seq);
    if (head_width != 0) s += ", head_width " + n(head_width);
    if (qkv_bias) s += ", q/k/v biases";
    if (tied_embeddings) s += ", tied embeddings";
    if (lora_rank > 0) {
      s += ", LoRA rank " + n(lora_rank) + " on";
      for (std::size_t p = 0; p < proj_count; ++p)
        if (lora_targets >> p & 1u) s += " " + std::string(proj_names[p]);
    }
    return s;
  }
  // The values a model file keeps under "lm.config", in this order.
  static constexpr std::size_t stored_fields = 12;
  static constexpr std::size_t base_fields = 9;  // the ones the base weights depend on (or that change them)
  std::array<double, stored_fields> stored() const {
    return {double(vocab), double(d_model),     double(layers), double(heads), double(kv_heads),
            double(ffn),   double(max_seq),     rope_base,      eps,           double(lora_rank),
            lora_scale,    double(lora_targets)};
  }
  static constexpr std::array<std::string_view, stored_fields> stored_names = {
      "vocab",   "d_model",   "layers", "heads",     "kv_heads",   "ffn",
      "max_seq", "rope_base", "eps",    "lora_rank", "lora_scale", "lora_targets"};
  // The stored value that is not a size (a whole number, 0 .. 2^53) where a
  // size belongs: its index, or stored_fields when all are. from_stored maps
  // such a value to 0.
  static std::size_t first_bad_size(std::span<const double> v) {
    for (std::size_t i = 0; i < stored_fields; ++i) {
      if (i == 7 || i == 8 || i == 10) continue;  // rope_base, eps, lora_scale: reals
      if (!(v[i] >= 0 && v[i] <= 9007199254740992.0 && v[i] == std::floor(v[i]))) return i;
    }
    return stored_fields;
  }
  static LmConfig from_stored(std::span<const double> v) {
    LmConfig c;
    auto z = [](double x) { return x >= 0 && x < 1e15 ? static_cast<std::size_t>(x) : std::size_t{0}; };
    c.vocab = z(v[0]);
    c.d_model = z(v[1]);
    c.layers = z(v[2]);
    c.heads = z(v[3]);
    c.kv_heads = z(v[4]);
    c.ffn = z(v[5]);
    c.max_seq = z(v[6]);
    c.rope_base = v[7];
    c.eps = v[8];
    c.lora_rank = z(v[9]);
    c.lora_scale = v[10];
    c.lora_targets = static_cast<std::uint32_t>(z(v[11]));
    return c;
  }
};

// The machine's physical memory in bytes; 0 when it cannot be told.
inline std::size_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  std::size_t bytes = 0;
  if (__builtin_mul_overflow(static_cast<std::size_t>(pages), static_cast<std::size_t>(page), &bytes)) return SIZE_MAX;
  return bytes;
}

// ---- byte-level tokenizer: vocab 256, any text ----
struct ByteTokenizer {
  static constexpr std::size_t vocab = 256;
  static std::vector<int> encode(std::string_view text) {
    std::vector<int> ids(text.size());
    for (std::size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  // Throws std::out_of_range naming the first id that is not a byte (a
  // model with a larger vocabulary can emit one) and its position: a wrapped
  // id would print another byte without a word.
  static std::string decode(std::span<const int> ids) {
    std::string s(ids.size(), '\0');
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] < 0 || ids[i] >= static_cast<int>(vocab))
        throw std::out_of_range("nn::ByteTokenizer::decode: id " + std::to_string(ids[i]) + " at position " +
                                std::to_string(i) + " is not a byte (expected 0 .. 255)");
      s[i] = static_cast<char>(static_cast<unsigned char>(ids[i]));
    }
    return s;
  }
};

// One block's tensors; an adapter is invalid (default Var) where there is none.
template <class T>
struct LmLayer {
  Var<T> attn_norm, mlp_norm;
  std::array<Var<T>, proj_count> w, lora_a, lora_b;
  std::array<Var<T>, proj_count> bias;  // q, k, v under LmConfig::qkv_bias; invalid elsewhere
};

template <class T>
struct LmOutput {
  Var<T> logits;  // [batch * seq, vocab]
  Var<T> loss;    // invalid when no targets were given
};

template <class T>
class Lm {
 public:
  // full: every tensor a parameter. lora: the base weights constants (no
  // gradient), the adapters parameters (needs lora_rank > 0). none: every
  // tensor a constant (inference: a decoder, an evaluation; nothing to train).
  enum class Train { full, lora, none };

  // Records every tensor on tp, seeded: the base weights from `seed` alone
  // (so a base model and its LoRA variant start from the same base), the
  // adapters' A from a stream derived from it. Throws std::invalid_argument
  // for a bad config.
  //
  // base_storage: how the frozen base's matrices (the embedding, the
  // projections, the head) are held under Train::lora or Train::none.
  // Storage::bf16 or Storage::f16 halves their memory (Qwen2.5-0.5B: 0.99 GB
  // instead of 1.98), rounding each initial value to the nearest bfloat16 or
  // half; a BF16 or F16 checkpoint (hf::load_weights) loads exactly. Every
  // op that reads them widens them exactly, so the model gives the bits of a
  // native one holding the widened values. The norms, biases and adapters
  // stay T.
  //
  // A quantized base_storage (Storage::q8_0 ... q6_k, llama.cpp's blocks)
  // holds each projection and the head as llama.cpp holds them, [out, in]
  // rows of blocks (Tape::constant's `transposed`), the embedding as its
  // [vocab, d] rows: every such row must be whole blocks (32 or 256
  // weights). The initial values are rounded by ggml's reference quantizer.
  Lm(Tape<T>& tp, const LmConfig& config, std::uint64_t seed, Train train = Train::full,
     Storage base_storage = Storage::native)
      : Lm(tp, config, seed, train, [base_storage](const std::string&) { return base_storage; }) {}

  // How each frozen base matrix is held, by its name in named() ("embed",
  // "layers.3.q", "head"): a GGUF's own mix (Q4_K_M holds most matrices as
  // q4_K and some as q6_K).
  using StorageOf = std::function<Storage(const std::string& name)>;
  // The base's values at construction: drawn from the seed (and rounded to
  // their storage), or zeros for a loader to overwrite (hf::load_gguf): no
  // draw, no rounding, no matrix in T on the way (a 7B base never is one).
  enum class Values { random, zeros };
  Lm(Tape<T>& tp, const LmConfig& config, std::uint64_t seed, Train train, StorageOf storage_of,
     Values values = Values::random)
      : tp_(&tp), c_(config), train_(train) {
    if (std::string why = c_.check(); !why.empty()) throw std::invalid_argument("nn::Lm: bad config: " + why);
    if (train == Train::lora && c_.lora_rank == 0)
      throw std::invalid_argument("nn::Lm: Train::lora needs a config with lora_rank > 0");
    // The base's matrices, their storage checked before anything is recorded;
    // the bytes everything will take (a held matrix at its storage's size).
    std::map<std::string, Storage> held;
    std::size_t bytes = (*c_.parameter_count()) * sizeof(T);
    auto matrix = [&](const std::string& name, std::size_t rows, std::size_t cols, std::size_t memory_row) {
      const Storage s = storage_of ? storage_of(name) : Storage::native;
      held[name] = s;
      if (s == Storage::native) return;
      if (train == Train::full)
        throw std::invalid_argument("nn::Lm: a " + std::string(storage_name(s)) + " base ('" + name +
                                    "') is a frozen one: it needs Train::lora or Train::none (Train::full trains "
                                    "every tensor in T)");
      if (std::string why = held_row_refusal(s, memory_row); !why.empty())
        throw std::invalid_argument("nn::Lm: a " + std::string(storage_name(s)) + " base for " + c_.describe() +
                                    ": '" + name + "' [" + std::to_string(rows) + ", " + std::to_string(cols) +
                                    "] (" + (name == "embed" ? "the embedding's width (d_model) " : "its input width ") +
                                    std::to_string(memory_row) + "): " + why);
      bytes -= rows * cols * sizeof(T) - held_bytes(s, rows * cols, sizeof(T));
    };
    matrix("embed", c_.vocab, c_.d_model, c_.d_model);
    for (std::size_t l = 0; l < c_.layers; ++l)
      for (std::size_t p = 0; p < proj_count; ++p) {
        const auto [in, out] = c_.proj_shape(Proj(p));
        matrix("layers." + std::to_string(l) + "." + std::string(proj_names[p]), in, out, in);
      }
    if (!c_.tied_embeddings) matrix("head", c_.d_model, c_.vocab, c_.d_model);
    base_storage_ = held.count("layers.0.q") ? held["layers.0.q"] : Storage::native;
    // check() bounds the count; this machine's memory may hold less.
    if (const std::size_t memory = physical_memory_bytes(); memory != 0 && bytes > memory)
      throw std::invalid_argument("nn::Lm: " + c_.describe() + " has " + std::to_string(*c_.parameter_count()) +
                                  " parameters, " + std::to_string(bytes) +
                                  " bytes as held: more than this machine's memory (" + std::to_string(memory) +
                                  " bytes)");
    if constexpr (std::is_same_v<T, float>)
      if (c_.vocab > (std::size_t{1} << 24))
        throw std::invalid_argument("nn::Lm: a vocabulary of " + std::to_string(c_.vocab) +
                                    " ids is not exact in float (at most 2^24)");
    SplitMix64 base(seed), adapters(seed ^ 0x6c6f7261u);
    // A base matrix's initial values, drawn only when they are wanted.
    auto uniform = [&](Shape s, double bound, SplitMix64& g) {
      return [&, s = std::move(s), bound] {
        Tensor<T> t(s);
        for (T& x : t.data()) x = static_cast<T>(g.uniform(-bound, bound));
        return t;
      };
    };
    auto given = [](Tensor<T> t) { return [t = std::move(t)] { return t; }; };
    auto leaf = [&](std::string name, Shape shape, auto init, ParamKind kind, bool adapter) {
      // Only the base's matrices may be held 16-bit or quantized: their
      // readers widen them. (A frozen adapter, under Train::none, follows a
      // 16-bit base, as it always has.)
      const auto it = held.find(name);
      const Storage storage = it != held.end()                              ? it->second
                              : adapter && sixteen_bit(base_storage_)      ? base_storage_
                                                                            : Storage::native;
      // Quantized, the projections and the head are held as llama.cpp holds them ([out, in]).
      const bool transposed = quantized(storage) && name != "embed";
      const bool trained = train == Train::full || (adapter && train == Train::lora);
      Var<T> v;
      if (trained)
        v = tp.param(init());
      else if (values == Values::zeros && it != held.end())
        v = tp.held_constant(shape, storage, transposed);
      else
        v = tp.constant(init(), storage, transposed);
      named_.push_back({std::move(name), v, kind});
      (adapter ? adapter_names_ : base_names_).push_back(named_.back());
      return v;
    };
    // Every tensor is recorded under the name scope of the part that uses it
    // (forward opens the same ones), so grad::summarize counts it there.
    const double s3 = std::sqrt(3.0);
    {
      NameScope<T> scope(tp, "embed");
      embed_ = leaf("embed", {c_.vocab, c_.d_model}, uniform({c_.vocab, c_.d_model}, s3 * 0.5, base), ParamKind::weight,
                    false);
    }
    for (std::size_t l = 0; l < c_.layers; ++l) {
      LmLayer<T> L;
      const std::string pre = "layers." + std::to_string(l) + ".";
      NameScope<T> layers(tp, "layers"), block(tp, std::to_string(l));
      {
        NameScope<T> scope(tp, "attn_norm");
        L.attn_norm =
            leaf(pre + "attn_norm", {c_.d_model}, given(Tensor<T>::full({c_.d_model}, T(1))), ParamKind::norm, false);
      }
      {
        NameScope<T> scope(tp, "mlp_norm");
        L.mlp_norm =
            leaf(pre + "mlp_norm", {c_.d_model}, given(Tensor<T>::full({c_.d_model}, T(1))), ParamKind::norm, false);
      }
      for (std::size_t p = 0; p < proj_count; ++p) {
        const auto [in, out] = c_.proj_shape(Proj(p));
        // std 1/sqrt(in); the projections back into the residual stream
        // smaller by sqrt(2 * layers).
        double bound = s3 / std::sqrt(double(in));
        if (Proj(p) == Proj::o || Proj(p) == Proj::down) bound /= std::sqrt(2.0 * double(c_.layers));
        NameScope<T> part(tp, proj_part(Proj(p))), scope(tp, proj_names[p]);
        L.w[p] = leaf(pre + std::string(proj_names[p]), {in, out}, uniform({in, out}, bound, base), ParamKind::weight,
                      false);
      }
      // After every weight, so that a model without biases draws what it always drew.
      for (const Proj p : {Proj::q, Proj::k, Proj::v}) {
        if (!c_.qkv_bias) break;
        const std::size_t i = static_cast<std::size_t>(p);
        const std::size_t out = c_.proj_shape(p)[1];
        L.bias[i] = leaf(pre + std::string(proj_names[i]) + "_bias", {out}, given(Tensor<T>({out})), ParamKind::bias,
                         false);
      }
      for (std::size_t p = 0; p < proj_count; ++p) {
        if (!c_.has_adapter(Proj(p))) continue;
        const auto [in, out] = c_.proj_shape(Proj(p));
        const std::string name = pre + std::string(proj_names[p]);
        NameScope<T> part(tp, proj_part(Proj(p))), scope(tp, proj_names[p]), lora(tp, "lora");
        L.lora_a[p] = leaf(name + ".lora_a", {in, c_.lora_rank},
                           uniform({in, c_.lora_rank}, 1.0 / std::sqrt(double(in)), adapters), ParamKind::weight, true);
        L.lora_b[p] =
            leaf(name + ".lora_b", {c_.lora_rank, out}, given(Tensor<T>({c_.lora_rank, out})), ParamKind::weight, true);
      }
      layers_.push_back(L);
    }
    {
      NameScope<T> scope(tp, "final_norm");
      final_norm_ =
          leaf("final_norm", {c_.d_model}, given(Tensor<T>::full({c_.d_model}, T(1))), ParamKind::norm, false);
    }
    if (!c_.tied_embeddings) {
      NameScope<T> scope(tp, "head");
      head_ = leaf("head", {c_.d_model, c_.vocab}, uniform({c_.d_model, c_.vocab}, s3 / std::sqrt(double(c_.d_model)), base),
                   ParamKind::weight, false);
    }
    const auto stored = c_.stored();
    Tensor<T> cfg({LmConfig::stored_fields});
    for (std::size_t i = 0; i < stored.size(); ++i) cfg[i] = static_cast<T>(stored[i]);
    config_var_ = tp.constant(cfg);
  }

  const LmConfig& config() const { return c_; }
  Tape<T>& tape() const { return *tp_; }
  Train train_mode() const { return train_; }
  // Every tensor by name, in recording order (base and adapters); the base
  // tensors only; the adapters only.
  const std::vector<NamedParameter<T>>& named() const { return named_; }
  const std::vector<NamedParameter<T>>& base() const { return base_names_; }
  const std::vector<NamedParameter<T>>& adapters() const { return adapter_names_; }
  // What an optimizer steps: every tensor (full) or the adapters (lora).
  const std::vector<NamedParameter<T>>& trainable() const {
    static const std::vector<NamedParameter<T>> nothing;
    return train_ == Train::lora ? adapter_names_ : train_ == Train::none ? nothing : named_;
  }
  Var<T> tensor(std::string_view name) const {
    for (const auto& p : named_)
      if (p.name == name) return p.var;
    return {};
  }
  const LmLayer<T>& layer(std::size_t l) const { return layers_[l]; }
  Var<T> embed() const { return embed_; }
  Var<T> final_norm() const { return final_norm_; }
  Var<T> head() const { return head_; }  // invalid under tied_embeddings: the logits read embed()
  Var<T> config_var() const { return config_var_; }
  // Activation recompute (grad/recompute.hpp): a layer forward records in a
  // recompute scope keeps only its output on the tape, for one more forward
  // of the layer in backward. Values and gradients are the same bits either
  // way (test_recompute); only time and memory differ. Which layers:
  //  - by default, as few as keep the tape's memory within what the machine
  //    has (set_memory_budget(0)): none where the step fits;
  //  - set_memory_budget(bytes): as few as keep it within `bytes`;
  //  - set_recompute(true): every layer; set_recompute(false): none.
  // The budget counts the tape's value and gradient arenas (the model's
  // weights, the step's activations and their gradients, and the memory the
  // scopes share), not the optimizer's state or scratch. Forward records
  // layer 0 without a scope, measures what it took and, from that, the
  // layers after it (the last ones) it must put in scopes; the head's share
  // is the previous forward's (a layer's for the first). The device engine
  // and emitted code take episodes recorded without scopes.
  void set_recompute(bool on) { recompute_ = on ? Recompute::every_layer : Recompute::none; }
  void set_memory_budget(std::size_t bytes) {
    recompute_ = Recompute::to_fit;
    memory_budget_ = bytes;
  }
  bool recomputes() const { return recompute_ == Recompute::every_layer; }
  // Layers the latest forward recorded in recompute scopes.
  std::size_t recomputed_layers() const { return recomputed_layers_; }
  // How the frozen base's matrices are held (the constructor's
  // base_storage; held per matrix, the first projection's: each matrix's
  // own is tape().storage(tensor(name))).
  Storage base_storage() const { return base_storage_; }
  std::size_t parameter_count() const {
    std::size_t n = 0;
    for (const auto& p : named_) n += tp_->dims(p.var).size();
    return n;
  }

  // Token ids as a constant of shape [rows, cols] ([rows] when cols is 0).
  // A wrong count poisons the tape (ids are checked against the vocabulary
  // by the ops that read them).
  Var<T> ids(std::span<const int> tokens, std::size_t rows, std::size_t cols) const {
    const std::size_t n = cols == 0 ? rows : rows * cols;
    if (tokens.size() != n)
      return tp_->invalid("nn::Lm::ids: " + std::to_string(tokens.size()) + " tokens for a [" + std::to_string(rows) +
                          (cols == 0 ? "" : ", " + std::to_string(cols)) + "] window");
    Tensor<T> t(cols == 0 ? Shape{rows} : Shape{rows, cols});
    for (std::size_t i = 0; i < n; ++i) t[i] = static_cast<T>(tokens[i]);
    return tp_->constant(t);
  }

  // Records the model over ids [batch, seq] (seq <= max_seq): logits
  // [batch * seq, vocab] and, when targets are given ([batch * seq] class
  // ids, `ignore` for padding), the mean cross-entropy. The nodes are named
  // by part for the inspection tools: "embed", "layers.<l>.attn_norm",
  // "layers.<l>.attention" (".q" ... ".o" inside, ".lora" for an adapter),
  // "layers.<l>.mlp_norm", "layers.<l>.mlp", "final_norm", "head", "loss";
  // the residual additions are "layers.<l>" itself.
  LmOutput<T> forward(Var<T> ids, Var<T> targets = {}, T ignore = T(-100)) {
    return record_forward(ids, targets, ignore, Head::logits);
  }
  // forward(ids, targets, ignore).loss without the logits: the head and the
  // cross-entropy as one linear_cross_entropy node ("loss"), which computes
  // the [batch * seq, vocab] logits a chunk of rows at a time and keeps none
  // of them (nor their gradient) on the tape. The same bits as forward's loss
  // and every parameter's gradient. The targets' values are read now, when
  // the node is recorded.
  Var<T> forward_loss(Var<T> ids, Var<T> targets, T ignore = T(-100)) {
    return record_forward(ids, targets, ignore, Head::fused_loss).loss;
  }

  // What record_forward records after the final norm: the logits (and the
  // loss from them when targets are given), or the loss alone.
  enum class Head { logits, fused_loss };
  LmOutput<T> record_forward(Var<T> ids, Var<T> targets, T ignore, Head head) {
    Tape<T>& tp = *tp_;
    if (!tp.accept("nn::Lm::forward", {ids})) return {tp.rejected(), tp.rejected()};
    const Dims d = tp.dims(ids);
    if (d.rank != 2)
      return {tp.invalid("nn::Lm::forward: ids " + shape_string(d) + ": expected [batch, seq]"), tp.rejected()};
    const std::size_t B = d[0], t = d[1];
    if (t > c_.max_seq)
      return {tp.invalid("nn::Lm::forward: a window of " + std::to_string(t) + " positions is longer than max_seq " +
                         std::to_string(c_.max_seq) + " (the model's rotary tables and KV cache stop there)"),
              tp.rejected()};
    const Tables& tb = tables(t);
    const Var<T> cos = tp.constant(tb.rope.cos), sin = tp.constant(tb.rope.sin);
    Var<T> x;
    {
      NameScope<T> scope(tp, "embed");
      x = reshape(embedding(embed_, ids), {B * t, c_.d_model});
    }
    const T eps = static_cast<T>(c_.eps);
    // The expressions are the ones before the scopes were added, in the same
    // order (their operands' evaluation order decides the nodes' order, and
    // so the order gradients are summed in): the same bits.
    // With recompute on, each layer is one recompute scope: only its output
    // (and the parameters) stay on the tape; backward records nothing new and
    // computes the layer's inside again, the same bits.
    // Layers [kept, layers) go in recompute scopes (decided after layer 0 when fitting a budget).
    std::size_t kept = recompute_ == Recompute::every_layer ? 0 : c_.layers;
    const std::size_t before_layers = tp.bytes_in_use();
    for (std::size_t l = 0; l < c_.layers && tp.ok(); ++l) {
      const LmLayer<T>& L = layers_[l];
      NameScope<T> layers(tp, "layers"), block(tp, std::to_string(l));
      auto layer = [&, y = x]() mutable {
        Var<T> h, attended, mlp;
        {
          NameScope<T> scope(tp, "attn_norm");
          h = rmsnorm(y, L.attn_norm, eps);
        }
        {
          NameScope<T> scope(tp, "attention");
          Var<T> ctx = nn::detail::causal_attention(proj(L, Proj::q, h), proj(L, Proj::k, h), proj(L, Proj::v, h), B, t,
                                                    c_.heads, c_.kv_heads, c_.head_dim(), cos, sin);
          attended = proj(L, Proj::o, ctx);
        }
        y = y + attended;
        {
          NameScope<T> scope(tp, "mlp_norm");
          h = rmsnorm(y, L.mlp_norm, eps);
        }
        {
          NameScope<T> scope(tp, "mlp");
          mlp = proj(L, Proj::down, swiglu(proj(L, Proj::gate, h), proj(L, Proj::up, h)));
        }
        y = y + mlp;
        return y;
      };
      x = l >= kept ? grad::recompute(tp, layer) : layer();
      if (l == 0 && recompute_ == Recompute::to_fit)
        kept = layers_to_keep(tp.bytes_in_use() - before_layers, B * t * c_.d_model * 2 * sizeof(T));
    }
    recomputed_layers_ = c_.layers - std::min(kept, c_.layers);
    const std::size_t before_head = tp.bytes_in_use();
    LmOutput<T> out;
    Var<T> normed;
    {
      NameScope<T> scope(tp, "final_norm");
      normed = rmsnorm(x, final_norm_, eps);
    }
    if (head == Head::fused_loss) {
      NameScope<T> scope(tp, "loss");
      out.loss = c_.tied_embeddings ? linear_cross_entropy(normed, embed_, targets, ignore)
                                    : linear_cross_entropy(normed, head_, targets, ignore, ClassAxis::columns);
      head_bytes_ = tp.bytes_in_use() - before_head;
      return out;
    }
    {
      NameScope<T> scope(tp, "head");
      // Tied: normed . embed^T read in place (matmul_nt), no [d, vocab] copy per forward.
      out.logits = c_.tied_embeddings ? matmul_nt(normed, embed_) : matmul(normed, head_);
    }
    if (targets.valid() || targets.tape()) {
      NameScope<T> scope(tp, "loss");
      out.loss = grad::cross_entropy(out.logits, targets, ignore);
    }
    head_bytes_ = tp.bytes_in_use() - before_head;
    return out;
  }

  // The projection p of h, with its adapter when it has one, then its bias
  // (name scope proj_names[p], inside the caller's).
  Var<T> proj(const LmLayer<T>& L, Proj p, Var<T> h) const {
    const std::size_t i = static_cast<std::size_t>(p);
    NameScope<T> scope(*tp_, proj_names[i]);
    const Var<T> y = L.lora_a[i].valid()
                         ? lora_linear(h, L.w[i], L.lora_a[i], L.lora_b[i], static_cast<T>(c_.lora_scale))
                         : matmul(h, L.w[i]);
    return L.bias[i].valid() ? y + L.bias[i] : y;
  }

 private:
  enum class Recompute { none, every_layer, to_fit };
  // How many layers (layer 0 first) forward records without a scope to fit
  // the budget, once layer 0 took `layer` bytes and a layer in a scope keeps
  // `output` (its output and that one's gradient): every layer where all
  // fit; else as many as fit beside the other layers' outputs, the head and
  // the memory the scopes share (at most a layer's); at least layer 0.
  std::size_t layers_to_keep(std::size_t layer, std::size_t output) const {
    std::size_t budget = memory_budget_;
    if (budget == 0) {
      const std::size_t free = available_memory();
      if (free == 0) return c_.layers;  // nothing known: no scopes
      budget = tp_->arena_bytes() + (free - free / 8);  // what the tape holds is reused; an eighth left for the rest
    }
    const std::size_t rest = c_.layers - 1, head = head_bytes_ != 0 ? head_bytes_ : layer;
    const std::size_t used = tp_->bytes_in_use();
    if (used + rest * layer + head <= budget) return c_.layers;
    const std::size_t fixed = used + rest * output + head + layer;
    if (layer <= output || fixed >= budget) return 1;
    return 1 + std::min(rest, (budget - fixed) / (layer - output));
  }

  struct Tables {
    RopeTables<T> rope;
  };
  const Tables& tables(std::size_t t) {
    auto it = tables_.find(t);
    if (it == tables_.end())
      it = tables_.emplace(t, Tables{rope_tables<T>(t, c_.head_dim(), static_cast<T>(c_.rope_base))}).first;
    return it->second;
  }

  Tape<T>* tp_;
  LmConfig c_;
  Train train_;
  Storage base_storage_ = Storage::native;
  Recompute recompute_ = Recompute::to_fit;
  std::size_t memory_budget_ = 0;      // 0: what the machine has (available_memory)
  std::size_t recomputed_layers_ = 0;  // by the latest forward
  std::size_t head_bytes_ = 0;         // what the latest forward recorded after the layers
  Var<T> embed_, final_norm_, head_, config_var_;
  std::vector<LmLayer<T>> layers_;
  std::vector<NamedParameter<T>> named_, base_names_, adapter_names_;
  std::map<std::size_t, Tables> tables_;
};

// ---- merge ----

// Writes src's weights into dst with every adapter folded in:
//   w = w0 + lora_scale * (A . B)
// computed as the tape would record it: A . B (matmul, ascending inner
// index), times the scale (mul_scalar), added to w0 (add). dst must have
// src's base config and no adapters; every other tensor is copied. Throws
// std::invalid_argument on a mismatch (dst untouched).
template <class T>
void merge_lora(const Lm<T>& src, Lm<T>& dst) {
  const LmConfig &a = src.config(), &b = dst.config();
  const auto sa = a.stored(), sb = b.stored();
  const bool same_extras =
      a.head_width == b.head_width && a.qkv_bias == b.qkv_bias && a.tied_embeddings == b.tied_embeddings;
  if (!std::equal(sa.begin(), sa.begin() + LmConfig::base_fields, sb.begin()) || !same_extras || b.lora_rank != 0)
    throw std::invalid_argument("nn::merge_lora: the target model (" + b.describe() +
                                ") must have the source's base config (" + a.describe() + ") and no adapters");
  Tape<T>& from = src.tape();
  Tape<T>& to = dst.tape();
  for (const auto& p : dst.base()) {
    const Tensor<T> v = from.widened_value(src.tensor(p.name));  // a 16-bit base widened: exact
    const std::span<T> w = to.leaf_value(p.var);
    std::copy(v.data().begin(), v.data().end(), w.begin());
  }
  for (std::size_t l = 0; l < a.layers; ++l)
    for (std::size_t p = 0; p < proj_count; ++p) {
      const LmLayer<T>& L = src.layer(l);
      if (!L.lora_a[p].valid()) continue;
      const View<T> A = from.value(L.lora_a[p]), Bm = from.value(L.lora_b[p]);
      const Tensor<T> w0 = from.widened_value(L.w[p]);
      const std::size_t in = A.shape[0], r = A.shape[1], out = Bm.shape[1];
      std::vector<T> ab(in * out), scaled(in * out);
      NodeArgs<T> x;
      x.a = {A.data.data(), Dims::of(std::array<std::size_t, 2>{in, r})};
      x.b = {Bm.data.data(), Dims::of(std::array<std::size_t, 2>{r, out})};
      x.out = Dims::of(std::array<std::size_t, 2>{in, out});
      Matmul::forward_tensor(x, ab.data());
      NodeArgs<T> s;
      s.a = {ab.data(), x.out};
      s.out = x.out;
      s.scalar = static_cast<T>(a.lora_scale);
      MulScalar::forward_tensor(s, scaled.data());
      NodeArgs<T> sum;
      sum.a = {w0.data().data(), x.out};
      sum.b = {scaled.data(), x.out};
      sum.out = x.out;
      Add::forward_tensor(sum, to.leaf_value(dst.layer(l).w[p]).data());
    }
}

}  // namespace grad::nn
