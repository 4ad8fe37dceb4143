// Hugging Face model directories as grad::nn::Lm: Qwen2ForCausalLM and
// LlamaForCausalLM in (config.json + model.safetensors, or the shards named
// by model.safetensors.index.json), PEFT LoRA adapters in and out
// (adapter_config.json + adapter_model.safetensors), and the model back out.
//
//   hf::ModelInfo info = hf::read_config("Qwen2-0.5B");         // architecture and nn::LmConfig
//   info.config.lora_rank = 8; info.config.lora_scale = 16.0 / 8;  // or hf::apply(hf::read_adapter_config(dir), ...)
//   Tape<float> tp;
//   nn::Lm<float> model(tp, info.config, 0, nn::Lm<float>::Train::lora);  // base weights constants
//   hf::load_weights("Qwen2-0.5B", model);                      // every base tensor, checked first
//   ... finetune the adapters ...
//   hf::save_adapters("my-adapter", model);                     // PEFT's names and config
//   nn::Lm<float> merged(tp2, info.config without LoRA, 0); nn::merge_lora(model, merged);
//   hf::save_pretrained("merged", merged, {.dtype = hf::Dtype::bf16, .copy_from = "Qwen2-0.5B"});
//
// Names: grad's embed, layers.N.{attn_norm, mlp_norm, q, k, v, o, gate, up,
// down, q_bias, k_bias, v_bias}, final_norm, head are HF's
// model.embed_tokens.weight, model.layers.N.{input_layernorm,
// post_attention_layernorm}.weight, model.layers.N.self_attn.{q,k,v,o}_proj
// .weight/.bias, model.layers.N.mlp.{gate,up,down}_proj.weight,
// model.norm.weight and lm_head.weight. HF stores a projection as
// torch.nn.Linear's [out, in]; grad multiplies x . w with w [in, out], so
// every projection (and lm_head) is transposed once, tensor by tensor, while
// it is converted from the file into the tape (no second copy of the
// model is held). Values convert exactly (F16, BF16, F32 into float or
// double; F64 into double).
//
// Every refusal is an hf::Error naming the directory or file, the tensor and
// what was expected (a missing tensor, a shape that disagrees with
// config.json, an unknown architecture, dtype or config field value, a
// tensor the architecture has no place for); loading checks every tensor
// before writing any, so a refused load leaves the model as it was. The
// files read must be regular files (a FIFO or a device is refused, not
// waited on); config.json, adapter_config.json and the index at most 64 MiB,
// their JSON nested at most 64 levels; a message quotes at most a few
// hundred bytes of a value.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "grad/hf/safetensors.hpp"
#include "grad/lm/model.hpp"

namespace grad::hf {

enum class Architecture : std::uint8_t { qwen2, llama };
std::string_view architecture_name(Architecture a);  // "Qwen2ForCausalLM", "LlamaForCausalLM"

struct ModelInfo {
  Architecture architecture = Architecture::llama;
  nn::LmConfig config;  // no adapters (lora_rank 0)
  Dtype dtype = Dtype::f32;  // config.json's torch_dtype (F32 when it names none)
  std::size_t max_position_embeddings = 0;
};

struct ReadOptions {
  // The model's max_seq (its longest window and the decoder's cache); 0:
  // config.json's max_position_embeddings.
  std::size_t max_seq = 0;
};

// dir/config.json as an nn::LmConfig (checked: LmConfig::check). Throws hf::Error.
ModelInfo read_config(const std::string& dir, ReadOptions options = {});

// Every base tensor of `model` (built from read_config's config, any LoRA
// settings) from dir's safetensors. Throws hf::Error; nothing is written
// unless every tensor is present with the shape the model expects.
template <class T>
void load_weights(const std::string& dir, nn::Lm<T>& model);

struct SaveOptions {
  Dtype dtype = Dtype::f32;
  // Qwen2 when the model has q/k/v biases, Llama when not, unless named.
  std::optional<Architecture> architecture;
  // A directory whose tokenizer files (tokenizer.json, tokenizer_config.json,
  // special_tokens_map.json, generation_config.json, ...) are copied when present.
  std::string copy_from;
};

// Writes `model` (no adapters: merge them first, nn::merge_lora) as a
// Hugging Face directory: model.safetensors, the copies, then config.json,
// each atomically (dir is created when missing). The files to copy are read
// (regular files only, bounded) and every output path checked (absent or a
// regular file) before anything is written. Throws hf::Error.
template <class T>
void save_pretrained(const std::string& dir, const nn::Lm<T>& model, const SaveOptions& options = {});

// ---- PEFT LoRA adapters ----

struct AdapterConfig {
  std::size_t r = 0;
  double lora_alpha = 0;
  std::uint32_t targets = 0;  // nn::Proj bits, from target_modules (q_proj, ..., down_proj)
};
// dir/adapter_config.json. Refuses what grad's adapters cannot be (rsLoRA,
// DoRA, biases, per-module ranks, modules_to_save, other targets).
AdapterConfig read_adapter_config(const std::string& dir);
// The config with these adapters: lora_rank r, lora_scale lora_alpha / r, the targets.
nn::LmConfig with_adapters(nn::LmConfig config, const AdapterConfig& adapters);

// adapter_model.safetensors (F32, or dtype) + adapter_config.json, PEFT's
// names: base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight
// [r, in] and ...lora_B.weight [out, r] (grad's A [in, r] and B [r, out]
// transposed).
template <class T>
void save_adapters(const std::string& dir, const nn::Lm<T>& model, Dtype dtype = Dtype::f32);
// The adapters of dir into `model`, whose rank, scale and targets must be
// the adapter config's. Throws hf::Error; nothing written on a refusal.
template <class T>
void load_adapters(const std::string& dir, nn::Lm<T>& model);

extern template void load_weights<float>(const std::string&, nn::Lm<float>&);
extern template void load_weights<double>(const std::string&, nn::Lm<double>&);
extern template void save_pretrained<float>(const std::string&, const nn::Lm<float>&, const SaveOptions&);
extern template void save_pretrained<double>(const std::string&, const nn::Lm<double>&, const SaveOptions&);
extern template void save_adapters<float>(const std::string&, const nn::Lm<float>&, Dtype);
extern template void save_adapters<double>(const std::string&, const nn::Lm<double>&, Dtype);
extern template void load_adapters<float>(const std::string&, nn::Lm<float>&);
extern template void load_adapters<double>(const std::string&, nn::Lm<double>&);

}  // namespace grad::hf
