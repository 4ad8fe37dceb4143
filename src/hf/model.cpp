// Hugging Face model directories and PEFT adapters (include/grad/hf/model.hpp).
#include "grad/hf/model.hpp"
#include "grad/regular_file.hpp"

#include "bounded_input.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>

namespace grad::hf {

namespace {

using nlohmann::json;
using detail::json_excerpt;
using detail::text_excerpt;

// config.json, adapter_config.json or an index: a regular file of at most
// detail::max_config_bytes, nested at most detail::max_json_depth deep.
json read_json(const std::string& path) {
  auto fail = [&](const std::string& why) { throw Error("grad::hf: '" + path + "': " + why); };
  std::string text;
  if (std::string why = grad::detail::read_regular_file(path, detail::max_config_bytes, text); !why.empty()) fail(why);
  json j;
  if (std::string why = detail::parse_bounded(text, j); !why.empty()) fail(why);
  if (!j.is_object()) fail("not a JSON object");
  return j;
}

bool exists(const std::string& path) {
  struct stat st{};
  return ::stat(path.c_str(), &st) == 0;
}

// Field readers for config.json: a missing field takes its default (none: required).
struct Fields {
  const json& j;
  std::string file;
  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    throw Error("grad::hf: '" + file + "': " + field + " " + why);
  }
  std::size_t size(const char* name, std::optional<std::size_t> fallback = std::nullopt) const {
    if (!j.contains(name) || j[name].is_null()) {
      if (!fallback) fail(name, "is missing");
      return *fallback;
    }
    if (!j[name].is_number_unsigned()) fail(name, json_excerpt(j[name]) + ": expected a whole number >= 0");
    return static_cast<std::size_t>(j[name].get<std::uint64_t>());
  }
  double real(const char* name, double fallback) const {
    if (!j.contains(name) || j[name].is_null()) return fallback;
    if (!j[name].is_number()) fail(name, json_excerpt(j[name]) + ": expected a number");
    return j[name].get<double>();
  }
  bool flag(const char* name, bool fallback) const {
    if (!j.contains(name) || j[name].is_null()) return fallback;
    if (!j[name].is_boolean()) fail(name, json_excerpt(j[name]) + ": expected true or false");
    return j[name].get<bool>();
  }
  std::string text(const char* name, const std::string& fallback) const {
    if (!j.contains(name) || j[name].is_null()) return fallback;
    if (!j[name].is_string()) fail(name, json_excerpt(j[name]) + ": expected a string");
    return j[name].get<std::string>();
  }
};

// One base tensor of an Lm and where it lives in a Hugging Face checkpoint.
template <class T>
struct Mapped {
  std::string hf_name;
  Var<T> var;
  bool transposed;  // HF [out, in], grad [in, out]
};

const char* hf_proj(nn::Proj p) {
  static const char* names[] = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};
  return names[static_cast<std::size_t>(p)];
}
std::string hf_module(std::size_t layer, nn::Proj p) {
  const bool attention = p == nn::Proj::q || p == nn::Proj::k || p == nn::Proj::v || p == nn::Proj::o;
  return "model.layers." + std::to_string(layer) + (attention ? ".self_attn." : ".mlp.") + hf_proj(p);
}

template <class T>
std::vector<Mapped<T>> base_tensors(const nn::Lm<T>& m) {
  const nn::LmConfig& c = m.config();
  std::vector<Mapped<T>> out;
  out.push_back({"model.embed_tokens.weight", m.embed(), false});
  for (std::size_t l = 0; l < c.layers; ++l) {
    const nn::LmLayer<T>& L = m.layer(l);
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    out.push_back({pre + "input_layernorm.weight", L.attn_norm, false});
    out.push_back({pre + "post_attention_layernorm.weight", L.mlp_norm, false});
    for (std::size_t p = 0; p < nn::proj_count; ++p) {
      out.push_back({hf_module(l, nn::Proj(p)) + ".weight", L.w[p], true});
      if (L.bias[p].valid()) out.push_back({hf_module(l, nn::Proj(p)) + ".bias", L.bias[p], false});
    }
  }
  out.push_back({"model.norm.weight", m.final_norm(), false});
  if (!c.tied_embeddings) out.push_back({"lm_head.weight", m.head(), true});
  return out;
}

template <class T>
std::vector<Mapped<T>> adapter_tensors(const nn::Lm<T>& m) {
  std::vector<Mapped<T>> out;
  for (std::size_t l = 0; l < m.config().layers; ++l)
    for (std::size_t p = 0; p < nn::proj_count; ++p) {
      const nn::LmLayer<T>& L = m.layer(l);
      if (!L.lora_a[p].valid()) continue;
      const std::string pre = "base_model.model." + hf_module(l, nn::Proj(p));
      out.push_back({pre + ".lora_A.weight", L.lora_a[p], true});
      out.push_back({pre + ".lora_B.weight", L.lora_b[p], true});
    }
  return out;
}

std::string shape_text(const std::vector<std::size_t>& s) {
  std::string t = "[";
  for (std::size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

// Where a tensor's bytes are: the file that holds it (open) and its entry.
struct Located {
  const SafetensorsFile* file;
  const TensorInfo* info;
};

// Every listed tensor checked against the files (present, the expected
// shape), then converted into the tape: nothing is written unless all pass.
// Tensors in the files that are not listed are refused unless `ignorable`.
template <class T, class Ignorable>
void load_mapped(const std::string& where, const std::vector<std::unique_ptr<SafetensorsFile>>& files,
                 const std::map<std::string, const SafetensorsFile*>& owner, const std::vector<Mapped<T>>& wanted,
                 Tape<T>& tp, const std::string& described, Ignorable ignorable) {
  std::vector<Located> found;
  for (const Mapped<T>& w : wanted) {
    const std::span<const std::size_t> shape = tp.dims(w.var).span();
    std::vector<std::size_t> expect(shape.begin(), shape.end());
    if (w.transposed) std::swap(expect[0], expect[1]);
    const auto o = owner.find(w.hf_name);
    const TensorInfo* info = o == owner.end() ? nullptr : o->second->find(w.hf_name);
    if (!info)
      throw Error("grad::hf: '" + where + "': tensor '" + w.hf_name + "' is missing" +
                  (o == owner.end() ? "" : " from '" + o->second->path() + "', which the index names for it") + ": " +
                  described + " has it, as a " + shape_text(expect) + " tensor");
    if (info->shape != expect)
      throw Error("grad::hf: '" + o->second->path() + "': tensor '" + w.hf_name + "' is " + shape_text(info->shape) +
                  ", but " + described + " makes it " + shape_text(expect));
    found.push_back({o->second, info});
  }
  // The conversions that can refuse a value (one beyond the range it is read
  // into: F64 into float, a wider dtype into a 16-bit base): tried before
  // anything is written.
  for (std::size_t i = 0; i < wanted.size(); ++i) {
    const Located& l = found[i];
    const Storage storage = tp.storage(wanted[i].var);
    const bool can_refuse = sixteen_bit(storage) ? storage_for(l.info->dtype) != storage
                                            : std::is_same_v<T, float> && l.info->dtype == Dtype::f64;
    if (can_refuse) l.file->check_read(*l.info, quantized(storage) ? Storage::native : storage);
  }
  for (const auto& f : files)
    for (const TensorInfo& t : f->tensors()) {
      const bool listed = std::any_of(wanted.begin(), wanted.end(), [&](const Mapped<T>& w) { return w.hf_name == t.name; });
      if (!listed && !ignorable(t.name))
        throw Error("grad::hf: '" + f->path() + "': tensor '" + t.name + "' has no place in " + described);
    }
  std::vector<T> staging;
  std::vector<std::uint16_t> staging_bits;
  for (std::size_t i = 0; i < wanted.size(); ++i) {
    const TensorInfo& info = *found[i].info;
    if (const std::span<std::uint16_t> bits = tp.leaf_bits(wanted[i].var); !bits.empty()) {  // a 16-bit base
      const Storage storage = tp.storage(wanted[i].var);
      if (!wanted[i].transposed) {
        found[i].file->read_bits(info, storage, bits);
        continue;
      }
      staging_bits.resize(info.elements);
      found[i].file->read_bits(info, storage, std::span<std::uint16_t>(staging_bits));
      const std::size_t rows = info.shape[0], cols = info.shape[1];
      for (std::size_t r = 0; r < rows; ++r)
        for (std::size_t c = 0; c < cols; ++c) bits[c * rows + r] = staging_bits[r * cols + c];
      continue;
    }
    if (quantized(tp.storage(wanted[i].var))) {  // a quantized base: rounded from the file's values
      staging.resize(info.elements);
      found[i].file->read(info, std::span<T>(staging));
      // Held in the file's order when both are transposed (a projection held
      // as llama.cpp holds it is Hugging Face's [out, in]) or neither is.
      if (wanted[i].transposed != tp.transposed(wanted[i].var)) {
        std::vector<T> memory(staging.size());
        const std::size_t rows = info.shape[0], cols = info.shape[1];
        for (std::size_t r = 0; r < rows; ++r)
          for (std::size_t c = 0; c < cols; ++c) memory[c * rows + r] = staging[r * cols + c];
        staging.swap(memory);
      }
      if (std::string why = tp.store_held(wanted[i].var, staging); !why.empty())
        throw Error("grad::hf: '" + found[i].file->path() + "': tensor '" + wanted[i].hf_name + "': " + why);
      continue;
    }
    const std::span<T> to = tp.leaf_value(wanted[i].var);
    if (!wanted[i].transposed) {
      found[i].file->read(info, to);
      continue;
    }
    // One tensor at a time: [rows, cols] as stored, [cols, rows] in grad.
    staging.resize(info.elements);
    found[i].file->read(info, std::span<T>(staging));
    const std::size_t rows = info.shape[0], cols = info.shape[1];
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) to[c * rows + r] = staging[r * cols + c];
  }
  std::vector<T>().swap(staging);
  std::vector<std::uint16_t>().swap(staging_bits);
}

// A file name from an index: a plain name inside the directory.
bool plain_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
}

void make_directory(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0777) != 0 && errno != EEXIST)
    throw Error("grad::hf: cannot create the directory '" + dir + "': " + std::strerror(errno));
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw Error("grad::hf: '" + dir + "' is not a directory");
}

std::string torch_dtype(Dtype d) {
  switch (d) {
    case Dtype::f64:
      return "float64";
    case Dtype::f32:
      return "float32";
    case Dtype::f16:
      return "float16";
    case Dtype::bf16:
      return "bfloat16";
  }
  return "float32";
}

// The tensors to write; a 16-bit one (a frozen base) widened into
// `widened`, which must outlive the result.
template <class T>
std::vector<TensorOut<T>> outputs(const Tape<T>& tp, const std::vector<Mapped<T>>& list,
                                  std::vector<Tensor<T>>& widened) {
  std::vector<TensorOut<T>> out;
  widened.reserve(list.size());  // the spans below must not move
  for (const Mapped<T>& m : list) {
    const std::span<const std::size_t> dims = tp.dims(m.var).span();
    std::vector<std::size_t> shape(dims.begin(), dims.end());
    if (m.transposed) std::swap(shape[0], shape[1]);
    std::span<const T> values = tp.value(m.var).data;
    if (tp.storage(m.var) != Storage::native) values = widened.emplace_back(tp.widened_value(m.var)).data();
    out.push_back({m.hf_name, shape, values, m.transposed});
  }
  return out;
}

}  // namespace

std::string_view architecture_name(Architecture a) {
  return a == Architecture::qwen2 ? "Qwen2ForCausalLM" : "LlamaForCausalLM";
}

ModelInfo read_config(const std::string& dir, ReadOptions options) {
  const std::string path = dir + "/config.json";
  const json j = read_json(path);
  const Fields f{j, path};
  ModelInfo info;
  if (!j.contains("architectures") || !j["architectures"].is_array() || j["architectures"].size() != 1 ||
      !j["architectures"][0].is_string())
    f.fail("architectures", "is not a list of one name (grad reads Qwen2ForCausalLM and LlamaForCausalLM)");
  const std::string arch = j["architectures"][0].get<std::string>();
  if (arch == "Qwen2ForCausalLM")
    info.architecture = Architecture::qwen2;
  else if (arch == "LlamaForCausalLM")
    info.architecture = Architecture::llama;
  else
    f.fail("architectures", "['" + text_excerpt(arch) + "']: an unknown architecture (grad reads Qwen2ForCausalLM and LlamaForCausalLM)");
  const bool qwen2 = info.architecture == Architecture::qwen2;
  // What these architectures can be configured to do that grad's model does not.
  if (f.text("hidden_act", "silu") != "silu")
    f.fail("hidden_act", "'" + text_excerpt(f.text("hidden_act", "")) + "': expected silu");
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    f.fail("rope_scaling", json_excerpt(j["rope_scaling"]) + ": grad's RoPE has no scaling (expected null)");
  if (!qwen2 && f.flag("attention_bias", false)) f.fail("attention_bias", "true: grad's Llama has no attention biases");
  if (!qwen2 && f.flag("mlp_bias", false)) f.fail("mlp_bias", "true: grad's Llama has no MLP biases");
  if (qwen2 && f.flag("use_sliding_window", false))
    f.fail("use_sliding_window", "true: grad attends to every earlier position");
  nn::LmConfig& c = info.config;
  c.vocab = f.size("vocab_size");
  c.d_model = f.size("hidden_size");
  c.layers = f.size("num_hidden_layers");
  c.heads = f.size("num_attention_heads");
  c.kv_heads = f.size("num_key_value_heads", c.heads);
  c.ffn = f.size("intermediate_size");
  info.max_position_embeddings = f.size("max_position_embeddings", qwen2 ? 32768 : 2048);
  c.max_seq = options.max_seq != 0 ? options.max_seq : info.max_position_embeddings;
  c.rope_base = f.real("rope_theta", 10000.0);
  c.eps = f.real("rms_norm_eps", 1e-6);
  const std::size_t head_dim = f.size("head_dim", 0);
  // Only a width other than d_model / heads is recorded as one (so that such a config still fits a model file).
  if (head_dim != 0 && !(c.heads != 0 && c.d_model % c.heads == 0 && c.d_model / c.heads == head_dim))
    c.head_width = head_dim;
  c.qkv_bias = qwen2;
  c.tied_embeddings = f.flag("tie_word_embeddings", false);
  c.lora_rank = 0;
  const std::string dtype = f.text("torch_dtype", "float32");
  bool known = false;
  for (const Dtype d : {Dtype::f64, Dtype::f32, Dtype::f16, Dtype::bf16})
    if (torch_dtype(d) == dtype) {
      info.dtype = d;
      known = true;
    }
  if (!known) f.fail("torch_dtype", "'" + text_excerpt(dtype) + "': expected float32, bfloat16, float16 or float64");
  if (std::string why = c.check(); !why.empty()) throw Error("grad::hf: '" + path + "': " + why);
  return info;
}

template <class T>
void load_weights(const std::string& dir, nn::Lm<T>& model) {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, const SafetensorsFile*> owner;
  const std::string index = dir + "/model.safetensors.index.json";
  if (exists(index)) {
    const json j = read_json(index);
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw Error("grad::hf: '" + index + "': no weight_map object (tensor name -> file)");
    std::map<std::string, const SafetensorsFile*> opened;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string() || !plain_file_name(it.value().get<std::string>()))
        throw Error("grad::hf: '" + index + "': tensor '" + text_excerpt(it.key()) + "' maps to " +
                    json_excerpt(it.value()) + " (expected a file name in the directory)");
      const std::string name = it.value().get<std::string>();
      auto o = opened.find(name);
      if (o == opened.end()) {
        files.push_back(std::make_unique<SafetensorsFile>(dir + "/" + name));
        o = opened.emplace(name, files.back().get()).first;
      }
      owner[it.key()] = o->second;
    }
  } else {
    files.push_back(std::make_unique<SafetensorsFile>(dir + "/model.safetensors"));
    for (const TensorInfo& t : files.back()->tensors()) owner[t.name] = files.back().get();
  }
  const nn::LmConfig& c = model.config();
  // HF ties lm_head to the embedding when config.json says so: a stored
  // lm_head.weight is then replaced, never read; old Llama checkpoints keep
  // RoPE's inv_freq, which grad computes.
  auto ignorable = [&](const std::string& name) {
    if (c.tied_embeddings && name == "lm_head.weight") return true;
    const std::string suffix = ".self_attn.rotary_emb.inv_freq";
    return name.size() > suffix.size() && name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  };
  load_mapped(dir, files, owner, base_tensors(model), model.tape(),
              "the model that config.json describes (" + c.describe() + ")", ignorable);
}

template <class T>
void save_pretrained(const std::string& dir, const nn::Lm<T>& model, const SaveOptions& options) {
  const nn::LmConfig& c = model.config();
  const Architecture arch = options.architecture.value_or(c.qkv_bias ? Architecture::qwen2 : Architecture::llama);
  auto fail = [&](const std::string& why) { throw Error("grad::hf: cannot write '" + dir + "': " + why + "; nothing written"); };
  if (c.lora_rank != 0) fail("the model has LoRA adapters: merge them first (nn::merge_lora) or save them (save_adapters)");
  if (arch == Architecture::qwen2 && !c.qkv_bias) fail("a Qwen2ForCausalLM has q/k/v biases; this model has none");
  if (arch == Architecture::llama && c.qkv_bias) fail("a LlamaForCausalLM has no q/k/v biases; this model has them");
  if (!model.tape().ok()) fail("the tape is poisoned (" + model.tape().error() + ")");
  // The files to copy are read before anything is written: one that cannot
  // be (a FIFO, a device, too large) must not leave a directory with a model
  // and no config.json.
  std::vector<std::pair<std::string, std::string>> copies;  // (name, bytes)
  if (!options.copy_from.empty())
    for (const char* name : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json",
                             "merges.txt", "tokenizer.model", "generation_config.json"}) {
      const std::string from = options.copy_from + "/" + name;
      if (!exists(from)) continue;
      std::string bytes;
      const std::uint64_t bound =
          std::string_view(name) == "tokenizer.json" ? detail::max_tokenizer_bytes : detail::max_config_bytes;
      if (std::string why = grad::detail::read_regular_file(from, bound, bytes); !why.empty())
        fail("cannot copy '" + from + "': " + why);
      copies.emplace_back(name, std::move(bytes));
    }
  std::vector<std::string> written = {dir + "/model.safetensors", dir + "/config.json"};
  for (const auto& copy : copies) written.push_back(dir + "/" + copy.first);
  for (const std::string& path : written)
    if (std::string why = grad::detail::output_path_problem(path); !why.empty()) fail("'" + path + "': " + why);
  make_directory(dir);
  json j;
  j["architectures"] = {std::string(architecture_name(arch))};
  j["model_type"] = arch == Architecture::qwen2 ? "qwen2" : "llama";
  j["vocab_size"] = c.vocab;
  j["hidden_size"] = c.d_model;
  j["num_hidden_layers"] = c.layers;
  j["num_attention_heads"] = c.heads;
  j["num_key_value_heads"] = c.kv_heads;
  j["head_dim"] = c.head_dim();
  j["intermediate_size"] = c.ffn;
  j["max_position_embeddings"] = c.max_seq;
  j["rope_theta"] = c.rope_base;
  j["rms_norm_eps"] = c.eps;
  j["rope_scaling"] = nullptr;
  j["hidden_act"] = "silu";
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["torch_dtype"] = torch_dtype(options.dtype);
  if (arch == Architecture::llama) {
    j["attention_bias"] = false;
    j["mlp_bias"] = false;
  } else {
    j["use_sliding_window"] = false;
  }
  std::vector<Tensor<T>> widened;
  const std::vector<TensorOut<T>> tensors = outputs(model.tape(), base_tensors(model), widened);
  write_safetensors<T>(dir + "/model.safetensors", tensors, options.dtype, {{"format", "pt"}});
  for (const auto& [name, bytes] : copies) write_file_atomically(dir + "/" + name, bytes);
  write_file_atomically(dir + "/config.json", j.dump(2) + "\n");
}

// ---- adapters ----

AdapterConfig read_adapter_config(const std::string& dir) {
  const std::string path = dir + "/adapter_config.json";
  const json j = read_json(path);
  const Fields f{j, path};
  if (f.text("peft_type", "LORA") != "LORA")
    f.fail("peft_type", "'" + text_excerpt(f.text("peft_type", "")) + "': expected LORA");
  if (f.flag("use_rslora", false)) f.fail("use_rslora", "true: grad scales by lora_alpha / r");
  if (f.flag("use_dora", false)) f.fail("use_dora", "true: grad's adapters are plain LoRA");
  if (f.flag("fan_in_fan_out", false)) f.fail("fan_in_fan_out", "true: expected torch.nn.Linear layouts");
  if (f.text("bias", "none") != "none")
    f.fail("bias", "'" + text_excerpt(f.text("bias", "")) + "': grad's adapters train no biases");
  for (const char* empty_or_null : {"modules_to_save", "layers_to_transform", "rank_pattern", "alpha_pattern"})
    if (j.contains(empty_or_null) && !j[empty_or_null].is_null() && !j[empty_or_null].empty())
      f.fail(empty_or_null, json_excerpt(j[empty_or_null]) + ": grad's adapters are one rank on whole projections");
  AdapterConfig a;
  a.r = f.size("r");
  if (a.r == 0) f.fail("r", "0: expected a rank >= 1");
  if (!j.contains("lora_alpha")) f.fail("lora_alpha", "is missing");
  a.lora_alpha = f.real("lora_alpha", 0);
  if (!std::isfinite(a.lora_alpha)) f.fail("lora_alpha", "is not finite");
  const json& t = j.contains("target_modules") ? j["target_modules"] : json();
  if (t.is_string() && t.get<std::string>() == "all-linear") {
    a.targets = nn::all_projections;
  } else if (t.is_array() && !t.empty()) {
    for (const json& name : t) {
      bool known = false;
      for (std::size_t p = 0; p < nn::proj_count; ++p)
        if (name.is_string() && name.get<std::string>() == hf_proj(nn::Proj(p))) {
          a.targets |= 1u << p;
          known = true;
        }
      if (!known)
        f.fail("target_modules", "holds " + json_excerpt(name) +
                                     ": expected q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj or down_proj");
    }
  } else {
    f.fail("target_modules", json_excerpt(t) + ": expected a list of projection names or \"all-linear\"");
  }
  return a;
}

nn::LmConfig with_adapters(nn::LmConfig config, const AdapterConfig& adapters) {
  config.lora_rank = adapters.r;
  config.lora_scale = adapters.lora_alpha / static_cast<double>(adapters.r);
  config.lora_targets = adapters.targets;
  return config;
}

template <class T>
void save_adapters(const std::string& dir, const nn::Lm<T>& model, Dtype dtype) {
  const nn::LmConfig& c = model.config();
  if (c.lora_rank == 0) throw Error("grad::hf: cannot write '" + dir + "': the model has no adapters; nothing written");
  if (!model.tape().ok())
    throw Error("grad::hf: cannot write '" + dir + "': the tape is poisoned (" + model.tape().error() + ")");
  make_directory(dir);
  json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["r"] = c.lora_rank;
  const double alpha = c.lora_scale * static_cast<double>(c.lora_rank);
  if (alpha == std::floor(alpha) && std::abs(alpha) < 9007199254740992.0)
    j["lora_alpha"] = static_cast<std::int64_t>(alpha);
  else
    j["lora_alpha"] = alpha;
  j["target_modules"] = json::array();
  for (std::size_t p = 0; p < nn::proj_count; ++p)
    if (c.has_adapter(nn::Proj(p))) j["target_modules"].push_back(hf_proj(nn::Proj(p)));
  j["lora_dropout"] = 0.0;
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["use_rslora"] = false;
  j["use_dora"] = false;
  j["inference_mode"] = true;
  j["modules_to_save"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["base_model_name_or_path"] = nullptr;
  std::vector<Tensor<T>> widened;
  const std::vector<TensorOut<T>> tensors = outputs(model.tape(), adapter_tensors(model), widened);
  write_safetensors<T>(dir + "/adapter_model.safetensors", tensors, dtype, {{"format", "pt"}});
  write_file_atomically(dir + "/adapter_config.json", j.dump(2) + "\n");
}

template <class T>
void load_adapters(const std::string& dir, nn::Lm<T>& model) {
  const AdapterConfig a = read_adapter_config(dir);
  const nn::LmConfig& c = model.config();
  const nn::LmConfig want = with_adapters(c, a);
  if (c.lora_rank != want.lora_rank || c.lora_scale != want.lora_scale || c.lora_targets != want.lora_targets)
    throw Error("grad::hf: '" + dir + "/adapter_config.json' describes " + want.describe() + ", scale " +
                std::to_string(want.lora_scale) + "; this model is " + c.describe() + ", scale " +
                std::to_string(c.lora_scale) + "; nothing loaded");
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  files.push_back(std::make_unique<SafetensorsFile>(dir + "/adapter_model.safetensors"));
  std::map<std::string, const SafetensorsFile*> owner;
  for (const TensorInfo& t : files.back()->tensors()) owner[t.name] = files.back().get();
  load_mapped(dir, files, owner, adapter_tensors(model), model.tape(),
              "the adapters of adapter_config.json (" + want.describe() + ")", [](const std::string&) { return false; });
}

template void load_weights<float>(const std::string&, nn::Lm<float>&);
template void load_weights<double>(const std::string&, nn::Lm<double>&);
template void save_pretrained<float>(const std::string&, const nn::Lm<float>&, const SaveOptions&);
template void save_pretrained<double>(const std::string&, const nn::Lm<double>&, const SaveOptions&);
template void save_adapters<float>(const std::string&, const nn::Lm<float>&, Dtype);
template void save_adapters<double>(const std::string&, const nn::Lm<double>&, Dtype);
template void load_adapters<float>(const std::string&, nn::Lm<float>&);
template void load_adapters<double>(const std::string&, nn::Lm<double>&);

}  // namespace grad::hf
