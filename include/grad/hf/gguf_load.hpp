// A llama.cpp GGUF as grad's nn::Lm and hf::Tokenizer: the inverse of
// write_gguf (grad/hf/gguf.hpp has the tensor table), and llama.cpp's own
// qwen2 and llama files.
//
//   Tape<float> tp;
//   auto m = hf::load_gguf("qwen2.5-0.5b-f16.gguf", tp, nn::Lm<float>::Train::none,
//                          {.base_storage = Storage::f16});        // the F16 matrices stay 16-bit, exactly
//   m.config;                                                      // the nn::LmConfig the metadata describes
//   if (m.tokenizer) ids = m.tokenizer->encode("Hello");           // encodes as llama.cpp does
//   nn::Decoder<float> dec(m.model);  ...
//
// Metadata (general.architecture "qwen2" or "llama"; <arch> below):
//   <arch>.context_length       LmConfig::max_seq (unless GgufLoadOptions::max_seq)
//   <arch>.embedding_length     d_model
//   <arch>.block_count          layers
//   <arch>.feed_forward_length  ffn
//   <arch>.attention.head_count, .head_count_kv (default head_count)   heads, kv_heads
//   <arch>.attention.key_length (default embedding_length / head_count)  head_dim (head_width when it differs);
//                               value_length and rope.dimension_count, when given, must be the same
//   <arch>.rope.freq_base (default 10000), .attention.layer_norm_rms_epsilon   rope_base, eps
//   vocab: tokenizer.ggml.tokens' count, else token_embd's rows (<arch>.vocab_size, when given, must agree)
// Both are float32 in the file: rope_base and eps are read as the shortest
// decimal that is that float32 (1e-06, as a config.json states it), so a
// model written with eps 1e-6 reads back as 1e-6, not 9.99999997e-07.
// tied_embeddings when output.weight is absent; qkv_bias when blk.N.attn_q,
// attn_k and attn_v biases are there (every layer or none), unless they are
// all zeros (write_gguf's qwen2 of a model without biases) and
// GgufLoadOptions::zero_biases_as_none. Refused, naming the key: RoPE
// scaling (<arch>.rope.scaling.type other than "none", a rope_freqs tensor),
// partial RoPE, per-layer head counts, value heads of another width.
//
// Tensors: the names and layouts of write_gguf's table; a projection (ne =
// {in, out}, rows of outputs) is transposed into grad's [in, out]; a llama
// file's q and k rows (and biases) are put back from llama.cpp's
// interleaved RoPE order into rotate-half order within each head, the inverse
// of the permutation llama.cpp's converter (and write_gguf) applies. Values:
// F32, F16 and BF16 exactly (into float or double), q8_0, q4_0, q4_K, q5_K
// and q6_K as ggml's reference dequantization computes them (grad/numerics/
// quant.hpp: the same floats on every ISA); into a quantized node of the
// file's format its blocks are copied (a llama file's q and k rows moved
// whole), into one of another format the values rounded by ggml's
// reference quantizer; into a 16-bit base
// (LmConfig's base_storage bf16/f16) a tensor of that format is copied bit
// for bit, others rounded to nearest even, as hf::load_weights does (a
// value beyond F16's range refused). Every tensor is checked (present, ne as
// the metadata makes it, a type it can read, no tensor the model has no place
// for) before any is written: a refused load leaves the model as it was.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "grad/hf/gguf.hpp"
#include "grad/hf/gguf_file.hpp"
#include "grad/lm/model.hpp"

namespace grad::hf {

struct GgufLoadOptions {
  std::size_t max_seq = 0;  // the model's window (and decode cache); 0: <arch>.context_length
  // Adapters to add (lora_rank 0: none; Train::lora needs them).
  std::size_t lora_rank = 0;
  double lora_scale = 1.0;
  std::uint32_t lora_targets = nn::all_projections;
  // How the base matrices are held under Train::lora or Train::none (nn::Lm's base_storage).
  Storage base_storage = Storage::native;
  // Hold every base matrix as the file stores it instead (Train::lora or
  // Train::none): q8_0 ... q6_K keep their blocks, byte for byte (nn::Lm's
  // quantized storage: the projections and the head as llama.cpp holds
  // them), F16 and BF16 stay 16-bit, F32 native; base_storage is unused.
  // A Q4_K_M file's 7B base then takes its file's 4.4 GB, not 30 GB of float.
  bool as_stored = false;
  // optional: a tokenizer that cannot be read leaves GgufModel::tokenizer
  // empty and says why in tokenizer_problem; required: load_gguf throws
  // (TokenizerError); skip: not read.
  enum class TokenizerMode : std::uint8_t { optional, required, skip };
  TokenizerMode tokenizer = TokenizerMode::optional;
  bool zero_biases_as_none = true;
  // The adapters' initial A (nn::Lm's seed; the base is the file's).
  std::uint64_t seed = 0;
};

struct GgufConfig {
  std::string architecture;  // "qwen2" or "llama"
  nn::LmConfig config;       // with the options' adapters and max_seq
  std::size_t context_length = 0;
};

// The model the metadata (and the tensors' presence) describe. Throws hf::Error naming the key.
GgufConfig read_gguf_config(const GgufFile& file, const GgufLoadOptions& options = {});

// The file's "gpt2" vocabulary (tokenizer.ggml.*), checked (check_vocab);
// tokenizer.ggml.pre missing reads as "default" (llama.cpp's name for it).
// Throws TokenizerError: another model ("llama" is SentencePiece, which
// hf::Tokenizer cannot express), a missing or malformed key.
BpeVocab read_gguf_vocab(const GgufFile& file);

// Every base tensor of `model` from the file (a model of read_gguf_config's
// config, any adapters and base_storage). Throws hf::Error; nothing is written
// unless every tensor passes.
template <class T>
void load_gguf_weights(const GgufFile& file, nn::Lm<T>& model);

template <class T>
struct GgufModel {
  std::string architecture;
  nn::LmConfig config;
  nn::Lm<T> model;
  std::optional<BpeVocab> vocab;  // the file's, when it is a "gpt2" one
  std::optional<Tokenizer> tokenizer;
  std::string tokenizer_problem;  // why there is none (optional mode)
};

// All of it: config, a model on tp (train: nn::Lm's Train), its weights, the tokenizer.
template <class T>
GgufModel<T> load_gguf(const std::string& path, Tape<T>& tp, typename nn::Lm<T>::Train train = nn::Lm<T>::Train::none,
                       const GgufLoadOptions& options = {});

extern template void load_gguf_weights<float>(const GgufFile&, nn::Lm<float>&);
extern template void load_gguf_weights<double>(const GgufFile&, nn::Lm<double>&);
extern template GgufModel<float> load_gguf<float>(const std::string&, Tape<float>&, nn::Lm<float>::Train,
                                                  const GgufLoadOptions&);
extern template GgufModel<double> load_gguf<double>(const std::string&, Tape<double>&, nn::Lm<double>::Train,
                                                    const GgufLoadOptions&);

}  // namespace grad::hf
