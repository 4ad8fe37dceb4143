// GGUF export: a grad::nn::Lm as a file llama.cpp loads and serves (the way
// back, a GGUF as an nn::Lm and hf::Tokenizer, is grad/hf/gguf_load.hpp).
//
//   nn::Lm<float> merged(tp, base_config, 1);  nn::merge_lora(tuned, merged);
//   const hf::BpeVocab vocab = hf::byte_level_vocab({"<|endoftext|>"});  // 256 bytes + 1 (config.vocab 257)
//   if (auto r = hf::write_gguf("model.gguf", merged, vocab, {.type = hf::GgufType::f16}); !r) ... r.error
//   hf::write_gguf("model-q4_k_m.gguf", merged, vocab, {.type = hf::GgufType::q4_k_m});  // llama.cpp's mix
//   hf::write_lora_gguf("adapter.gguf", tuned);  // or the adapters alone, beside the unmerged base's file
//
// The file is GGUF version 3 (llama.cpp's ggml/docs/gguf.md): a header, the
// metadata as typed key/value pairs, one info record per tensor (name,
// dimensions, type, offset), then the tensors' data, each at a multiple of
// 32 bytes. The model is described as llama.cpp's `qwen2` architecture,
// which is what grad's Lm is (pre-norm RMSNorm, RoPE in the rotate-half
// (NEOX) convention, grouped-query attention, SwiGLU), unless its heads are
// not d_model wide between them (LmConfig::head_width, Hugging Face's
// head_dim): llama.cpp's qwen2 makes q [d, d], so such a model is written as
// its `llama` (q [d, H*hd]), as llama.cpp's converter writes a Llama:
// llama's RoPE rotates adjacent pairs (2j, 2j+1) where grad rotates
// (j, j + hd/2), so the rows of q and k (and their biases) are reordered
// within each head to match, and the biases are left out when the model has
// none (llama's are optional):
//
//   grad                      GGUF name                 GGUF dims (ne[0] first: the fastest-varying)
//   embed      [vocab, d]     token_embd.weight         {d, vocab}       (the same bytes)
//   layers.N.attn_norm [d]    blk.N.attn_norm.weight    {d}
//   layers.N.q [d, H*hd]      blk.N.attn_q.weight       {d, H*hd}        (transposed: llama.cpp's rows are outputs)
//   layers.N.q_bias [H*hd]    blk.N.attn_q.bias         {H*hd}           qwen2: zeros without LmConfig::qkv_bias
//   layers.N.k, .v, .o        attn_k, attn_v (+ bias), attn_output
//   layers.N.mlp_norm [d]     blk.N.ffn_norm.weight     {d}
//   layers.N.gate, .up, .down ffn_gate, ffn_up, ffn_down (transposed)
//   final_norm [d]            output_norm.weight        {d}
//   head [d, vocab]           output.weight             {d, vocab}       (transposed; left out when tied)
//
// grad stores a projection as [in, out] (x . w); llama.cpp, like Hugging
// Face, as [out, in] rows, which GGUF writes with ne = {in, out}: so every
// matrix but the embedding is written transposed. Norm weights and biases
// stay F32 in an F16 or quantized file (as llama.cpp's converter and its
// quantize tool write them). A quantized file (q8_0, q4_0, q4_k_m) holds
// each matrix in the type llama.cpp's quantize tool would choose
// (gguf_tensor_type), each GGUF row quantized on its own by ggml's reference
// quantizer (grad/numerics/quant.hpp): Llama's permuted q and k rows are
// whole rows moved, so they are quantized as they are.
//
// The tokenizer goes in as GGUF's `gpt2` model (byte-level BPE): the token
// texts in GPT-2's byte-to-unicode alphabet, their types, the merges, the
// pre-tokenizer name and the special ids. llama.cpp needs the merges key
// even when it is empty, unique token texts, and a token for "\n".
//
// Everything is checked before a byte is written (names, shapes, finite
// values, F16 range, rope_base and eps as float32, the vocabulary, a
// quantized row's F16 scales), and the
// file is written atomically (temporary file, fsync, rename), so a failed
// export leaves nothing behind. Messages name a tensor by its Hugging Face
// name (grad's beside it) and an element as Hugging Face's [row][column].
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "grad/hf/gguf_file.hpp"
#include "grad/hf/tokenizer.hpp"
#include "grad/lm/model.hpp"
#include "grad/model_file.hpp"
#include "grad/numerics/held.hpp"
#include "grad/numerics/quant.hpp"

namespace grad::hf {

// ---- F16 ----

// The IEEE binary16 bits nearest to x, ties to even: values beyond the
// largest half (65504) round to infinity as IEEE says (write_gguf refuses
// them before that can happen), subnormals are rounded like any other
// value, NaN stays a (quiet) NaN.
std::uint16_t f16_bits(float x);
// The value of binary16 bits (exact: every half is a float).
float f16_value(std::uint16_t bits);
inline float round_to_f16(float x) { return f16_value(f16_bits(x)); }

// ---- the tokenizer ----

// GGUF's tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum class TokenType : std::int32_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

// A byte-level BPE tokenizer as GGUF's "gpt2" model stores it.
struct BpeVocab {
  std::vector<std::string> tokens;     // id -> token text, in GPT-2's byte-to-unicode alphabet (byte_token)
  std::vector<TokenType> token_types;  // one per token; empty: every token normal
  std::vector<std::string> merges;     // "left right", highest priority first; left, right and left+right are tokens
  std::string pre = "qwen2";           // tokenizer.ggml.pre: llama.cpp's pre-tokenizer (its split regex; llama_cpp_pre)
  // Unset ids are not written; llama.cpp then assumes its gpt2 default, 11,
  // for bos and eos (an end of generation): give a byte-level vocabulary an
  // end-of-text token of its own (byte_level_vocab's specials).
  std::optional<std::uint32_t> bos, eos, pad;
  bool add_bos = false;  // whether llama.cpp prepends bos when it tokenizes a prompt (Qwen2: no)
};

// GPT-2's byte-to-unicode map: the UTF-8 text of byte b as a token. The
// printable bytes stand for themselves; the others (control bytes, space,
// 0x7f-0xa0, 0xad) are U+0100 onward in byte order, so "\n" is "Ċ" and " " is "Ġ".
std::string byte_token(unsigned char b);

// The 256 bytes (id = the byte, as nn::ByteTokenizer) followed by
// `specials` as control tokens, no merges; eos is the first special, when
// there is one. A model over it has vocab 256 + specials.size().
BpeVocab byte_level_vocab(std::span<const std::string> specials = {});
inline BpeVocab byte_level_vocab(std::initializer_list<std::string> specials) {
  return byte_level_vocab(std::span<const std::string>(specials.begin(), specials.size()));
}

// llama.cpp's name for the tokenizer's pre-tokenizer (tokenizer.ggml.pre),
// read from tokenizer.json: GPT-2's ByteLevel (use_regex), or a Split on
// GPT-2's pattern then ByteLevel, is "gpt-2"; a Split on Qwen2's pattern
// "qwen2"; on Llama 3's (digits in threes) "llama-bpe". Anything else throws
// TokenizerError describing the steps: llama.cpp would split text
// differently from grad and Hugging Face (GPT-2's "GPL 2007" in 7 ids
// instead of 3 under qwen2's), so it is never guessed.
std::string llama_cpp_pre(const Tokenizer& tokenizer);

// A tokenizer.json's vocabulary as GGUF holds it, for a model of `vocab`
// ids (0: the tokenizer's vocab_size()):
//
//   const auto tok = hf::Tokenizer::from_file(dir + "/tokenizer.json");
//   hf::write_gguf("model.gguf", merged, hf::bpe_vocab(tok, merged.config().vocab));
//
// Tokens by id in their byte-level spelling, the merges in rank order;
// added tokens are control tokens when special, user-defined when not; ids
// with no token (a gap, or the rows a checkpoint pads its embedding with,
// as Qwen2's 151936 for 151646 tokens) become unused tokens "[PAD<id>]",
// as llama.cpp's converter writes them. eos is the first added token of
// `<|endoftext|>`, `<|end_of_text|>`, `</s>`; bos the first of
// `<|begin_of_text|>`, `<s>`; add_bos when the post-processor's template
// puts bos (alone) before the text, as Llama 3's does. pre: llama.cpp's
// pre-tokenizer name, "" to read it from the tokenizer (llama_cpp_pre,
// which throws TokenizerError for one it cannot name). A model with fewer
// ids than the tokenizer is refused by write_gguf (check_vocab), naming both counts.
BpeVocab bpe_vocab(const Tokenizer& tokenizer, std::size_t vocab = 0, std::string_view pre = {});

// The inverse of bpe_vocab: a GGUF "gpt2" vocabulary as an hf::Tokenizer
// that encodes as llama.cpp does with it. Normal (and unknown, byte)
// tokens are the BPE vocabulary, control tokens special added tokens,
// user-defined ones added tokens, unused ones ("[PAD<id>]") left out (an id
// with no token, as in the tokenizer.json they came from); the merges in
// their order; the pre-tokenizer from its llama.cpp name: "gpt-2" (GPT-2's
// ByteLevel), "qwen2", "llama-bpe" (also "llama3", "llama-v3"; merges
// ignored for a piece that is a token, as llama.cpp and Llama 3's
// tokenizer.json do) as a Split on that pattern then ByteLevel; add_bos puts
// bos before the text (a TemplateProcessing post-processor). No normalizer:
// llama.cpp composes no NFC (Qwen2's tokenizer.json does; text that is NFC
// already encodes the same). Throws TokenizerError naming the problem
// (check_vocab's, a pre-tokenizer name grad does not know, a token that is
// not UTF-8).
Tokenizer bpe_tokenizer(const BpeVocab& vocab);

// "" or what is wrong with v as a vocabulary of `vocab` ids.
std::string check_vocab(const BpeVocab& v, std::size_t vocab);

// ---- the model ----

// What a file holds: llama.cpp's llama_ftype codes (general.file_type;
// f32 and f16 are also the ggml_type of their matrices). q8_0, q4_0 and
// q4_k_m quantize the matrices with ggml's reference quantizers
// (grad/numerics/quant.hpp) in the mix llama.cpp's quantize tool chooses
// for that file type (gguf_tensor_type); vectors stay F32.
enum class GgufType : std::uint32_t { f32 = 0, f16 = 1, q4_0 = 2, q8_0 = 7, q4_k_m = 15 };

// "f32", "f16", "q8_0", "q4_0", "q4_k_m" (llama.cpp's quantize tool's names, lower case); "unknown".
std::string_view gguf_type_name(GgufType type);

// A tensor's type in the file: ggml's ggml_type codes (GgmlType and
// ggml_type_name, grad/hf/gguf_file.hpp); write_gguf writes f32, f16, q8_0,
// q4_0, q4_k and q6_k. Its block format, or nothing for a type that is none
// of quant.hpp's (f32, f16, ...).
std::optional<QuantFormat> quant_format(GgmlType type);

// The llama.cpp architecture write_gguf describes a model of `config` as:
// "qwen2", or "llama" when its heads are not d_model wide between them.
inline std::string_view gguf_architecture(const nn::LmConfig& config) {
  return config.head_dim() * config.heads != config.d_model ? "llama" : "qwen2";
}

struct GgufOptions {
  GgufType type = GgufType::f32;  // of the matrices (gguf_tensor_type); vectors are always F32
  std::string name = "grad";      // general.name
};

// The type the tensor `grad_name` (nn::Lm::named()'s names: "embed",
// "layers.N.q", ...) of a model of `config` has in a file of `type`, its
// output tied to the embedding (no head) or not. f32 for the vectors (norms,
// biases) in every file; in an f32 or f16 file every matrix is f32 or f16. A
// quantized file follows llama.cpp's llama_tensor_get_type (src/llama-quant.cpp)
// for LLAMA_FTYPE_MOSTLY_Q8_0, _Q4_0 and _Q4_K_M, a row being GGUF's (ne[0]
// values: a projection's `in`, d_model for the embedding and the head):
//
//   the file's type      q8_0, q4_0, q4_K (q4_k_m)
//   output.weight        q6_K, or q8_0 when its rows are not whole blocks of
//   (the embedding         the file's type, and in a q8_0 file
//    when tied)
//   q4_k_m: attn_v and   q6_K in llama.cpp's "use_more_bits" layers: layer i
//   ffn_down               of n with i < n/8, i >= 7n/8 or (i - n/8) % 3 == 2
//
// then, where a row is not whole blocks of that type, llama.cpp's
// per-tensor fallback: q6_K -> q8_0; q4_K -> q5_0 in llama.cpp, q8_0 here
// (grad does not write q5_0: 8.5 bits a weight instead of 5.5, and no
// rounding beyond q8_0's); and f16 when a row is not whole blocks of 32
// (as llama.cpp release v0.4.0, node-llama-cpp 3.21.1's, writes it for
// every file type; llama.cpp's current source refuses q8_0 and q4_0 files
// then). test/gguf's fixture holds llama.cpp's own quantize of three models:
// grad's files have its types and bytes, but for q5_0. Throws
// std::invalid_argument for a name that is no tensor of such a model.
GgmlType gguf_tensor_type(const nn::LmConfig& config, GgufType type, std::string_view grad_name, bool tied);
inline GgmlType gguf_tensor_type(const nn::LmConfig& config, GgufType type, std::string_view grad_name) {
  return gguf_tensor_type(config, type, grad_name, config.tied_embeddings);
}

// One of a model's tensors as grad holds it: its grad name (nn::Lm::named()),
// its grad shape, its values in row-major order.
struct LmTensor {
  std::string name;
  std::vector<std::size_t> shape;
  std::span<const float> values;
  // A matrix also held in llama.cpp's blocks (a quantized base: nn::Lm's
  // base_storage Storage::q8_0 ... q6_k) gives them here, in GGUF's rows
  // (the [out, in] rows of a projection or the head, the embedding's rows;
  // Llama's q and k rows in grad's order): where the file holds the matrix
  // in that format, write_gguf copies them as they are (a K-quant quantized
  // again from its own values need not give its bytes back) after checking
  // that they dequantize to `values`; elsewhere it quantizes `values`.
  // `values` may be empty then (write_gguf(model) leaves it so): each row is
  // dequantized from the blocks where it is needed, one row at a time.
  std::optional<QuantFormat> format = std::nullopt;
  std::span<const std::uint8_t> blocks = {};
  // The blocks lie as a tape holds them (its rows in groups of sixteen,
  // interleaved: numerics/quant_rows.hpp), not one GGUF row after another.
  bool grouped = false;
};

// Writes `tensors` (a model of `config`, without adapters: merge them first,
// nn::merge_lora) with `vocab` to `path` as a qwen2 GGUF (llama when the
// heads' width is not d_model / heads; see above). Optional tensors: "head"
// (left out: the output is tied to the embedding) and "layers.N.q_bias",
// "layers.N.k_bias", "layers.N.v_bias" (left out: zeros in qwen2, none in
// llama). rope_base and eps must be float32 values (finite, and a normal
// float32, not 0 or subnormal, when nonzero), as GGUF holds them.
// Every other tensor of the table above must be there with its shape;
// nothing else may be. On any failure nothing is written and the message
// ("grad: GGUF '<path>': ...") names the tensor or key and what was expected.
ModelFileResult write_gguf(const std::string& path, const nn::LmConfig& config, std::span<const LmTensor> tensors,
                           const BpeVocab& vocab, const GgufOptions& options = {});

// The same from a model: its base tensors (float64 values are rounded to
// float32 first, as GGUF holds no float64 weights).
template <class T>
ModelFileResult write_gguf(const std::string& path, const nn::Lm<T>& model, const BpeVocab& vocab,
                           const GgufOptions& options = {}) {
  if (model.config().lora_rank > 0)
    return {"grad: GGUF '" + path + "': the model has LoRA adapters (" + model.config().describe() +
            "): fold them in first (nn::merge_lora into a model without adapters); nothing written"};
  Tape<T>& tp = model.tape();  // (not changed: leaf_blocks is a writable view of the blocks)
  if (!tp.ok()) return {"grad: GGUF '" + path + "': the tape is poisoned (" + tp.error() + "); nothing written"};
  // float64 models, 16-bit-held and quantized matrices only; reserved: the spans must not move
  std::vector<std::vector<float>> converted;
  converted.reserve(model.base().size());
  std::vector<LmTensor> tensors;
  for (const auto& p : model.base()) {
    const std::span<const std::size_t> dims = tp.dims(p.var).span();
    LmTensor t{p.name, std::vector<std::size_t>(dims.begin(), dims.end()), {}};
    if (quantized(tp.storage(p.var))) {  // held as llama.cpp holds it (Lm: the embedding's rows, else [out, in])
      // Its blocks alone: each row dequantized where the file needs values
      // (a 7B base never widened whole).
      t.format = grad::quant_format(tp.storage(p.var));
      t.blocks = tp.leaf_blocks(p.var);
      t.grouped = true;
      tensors.push_back(std::move(t));
      continue;
    }
    bool in_place = false;
    if constexpr (std::is_same_v<T, float>) {
      in_place = tp.storage(p.var) == Storage::native;
      if (in_place) t.values = tp.value(p.var).data;
    }
    if (!in_place) {
      const Tensor<T> v = tp.widened_value(p.var);
      converted.emplace_back(v.data().begin(), v.data().end());
      t.values = converted.back();
    }
    tensors.push_back(std::move(t));
  }
  return write_gguf(path, model.config(), tensors, vocab, options);
}

// ---- LoRA adapters ----
//
// A model's adapters alone, as the GGUF adapter llama.cpp loads beside the
// base written by write_gguf (llama-cli --lora, node-llama-cpp's
// createContext({lora: ...}), scale 1):
//
//   hf::write_gguf("base.gguf", base_model, vocab);        // the base without adapters (same base weights)
//   hf::write_lora_gguf("adapter.gguf", tuned);            // tuned: an nn::Lm with lora_rank > 0
//
// The file is llama.cpp's (its convert_lora_to_gguf.py's): general.type
// "adapter", adapter.type "lora", general.architecture the base's
// (gguf_architecture: llama.cpp refuses another), adapter.lora.alpha, and per
// adapted projection two matrices named after the base's weight:
//
//   grad                        GGUF name                        GGUF dims     (PEFT's)
//   layers.N.q.lora_a [in, r]   blk.N.attn_q.weight.lora_a       {in, r}       lora_A [r, in]
//   layers.N.q.lora_b [r, out]  blk.N.attn_q.weight.lora_b       {r, out}      lora_B [out, r]
//   (k, v, o, gate, up, down alike: attn_k ... ffn_down)
//
// llama.cpp adds (alpha / r) * B (A x) to the projection: alpha is written as
// lora_scale * r, so its scale is grad's lora_scale (a user scale s given to
// llama.cpp multiplies it). A llama-architecture base has its q and k rows
// permuted within each head (see above); lora_b's rows are those outputs and
// are permuted alike. Refused before a byte is written: a config without
// adapters, lora_scale 0 (llama.cpp reads alpha 0 as "no alpha", scale 1),
// an alpha float32 cannot hold, a missing, misshapen, unknown or non-finite
// tensor; written atomically. Messages name a tensor by PEFT's name.
struct LoraGgufOptions {
  GgufType type = GgufType::f32;  // of lora_a and lora_b: f32 or f16
  std::string name = "grad";      // general.name
};

// `adapters`: every "layers.N.<proj>.lora_a" / ".lora_b" of `config`'s
// targeted projections (nn::Lm::adapters()), nothing else.
ModelFileResult write_lora_gguf(const std::string& path, const nn::LmConfig& config, std::span<const LmTensor> adapters,
                                const LoraGgufOptions& options = {});

// The same from a model with adapters (float64 values rounded to float32).
template <class T>
ModelFileResult write_lora_gguf(const std::string& path, const nn::Lm<T>& model, const LoraGgufOptions& options = {}) {
  const Tape<T>& tp = model.tape();
  if (!tp.ok()) return {"grad: LoRA GGUF '" + path + "': the tape is poisoned (" + tp.error() + "); nothing written"};
  std::vector<std::vector<float>> converted;  // reserved: the spans must not move
  converted.reserve(model.adapters().size());
  std::vector<LmTensor> tensors;
  for (const auto& p : model.adapters()) {
    const std::span<const std::size_t> dims = tp.dims(p.var).span();
    LmTensor t{p.name, std::vector<std::size_t>(dims.begin(), dims.end()), {}};
    bool in_place = false;
    if constexpr (std::is_same_v<T, float>) {
      in_place = tp.storage(p.var) == Storage::native;
      if (in_place) t.values = tp.value(p.var).data;
    }
    if (!in_place) {  // float64, or frozen 16-bit adapters (Train::none over a 16-bit base)
      const Tensor<T> v = tp.widened_value(p.var);
      converted.emplace_back(v.data().begin(), v.data().end());
      t.values = converted.back();
    }
    tensors.push_back(std::move(t));
  }
  return write_lora_gguf(path, model.config(), tensors, options);
}

// Rounds the values of tensor `grad_name` (grad's layout and shape, as
// gguf_tensor_type names it) in place to what a file of `type` holds: F16's
// nearest, or each GGUF row quantized with ggml's reference quantizer and
// dequantized exactly (grad/numerics/quant.hpp); f32 leaves them. Throws
// std::invalid_argument for a name that is no tensor of the model or values
// that are not its shape's count, or for a non-finite value in a quantized matrix.
void round_like_gguf(const nn::LmConfig& config, GgufType type, std::string_view grad_name, std::span<float> values,
                     bool tied);

// Rounds a model's matrices in place as write_gguf with `type` stores them
// (vectors stay as they are): afterwards the model computes with the weights
// llama.cpp is given. A float64 model's values are rounded to float32 first.
// A matrix held 16-bit or quantized (Lm's base_storage) is left as it is:
// a quantized one is what the file holds where the file's type for it is
// its format (write_gguf copies its blocks), not where it is quantized again.
template <class T>
void round_like_gguf(nn::Lm<T>& model, GgufType type) {
  Tape<T>& tp = model.tape();
  std::vector<float> f;
  for (const auto& p : model.base()) {
    const std::span<T> w = tp.leaf_value(p.var);
    if (w.empty()) continue;       // a 16-bit-held matrix: left as it is
    f.assign(w.begin(), w.end());  // float64: rounded to float32
    round_like_gguf(model.config(), type, p.name, f, model.config().tied_embeddings);
    std::copy(f.begin(), f.end(), w.begin());
  }
}

}  // namespace grad::hf
