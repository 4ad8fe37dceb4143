// Saving and loading a grad::nn::Lm by name, its configuration first, through
// the model-file machinery (versioned, checksummed, atomic): a file for another
// configuration is refused by name and nothing is loaded.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "grad/lm/model.hpp"
#include "grad/model_file.hpp"

namespace grad::nn {

// ---- model files ----
// The model's tensors by name plus "lm.config" (LmConfig::stored()), through
// grad/model_file.hpp (versioned, checksummed, written atomically).

template <class T>
ModelFileResult save_lm(const std::string& path, const Lm<T>& model) {
  if (!model.config().fits_model_file())
    return {"grad: model file '" + path + "': a model with " + model.config().describe() +
            " has fields lm.config cannot hold (save it with grad::hf::save_pretrained); nothing written"};
  std::vector<NamedParameter<T>> all = model.named();
  all.push_back({"lm.config", model.config_var(), ParamKind::weight});
  return save_model(path, model.tape(), std::span<const NamedParameter<T>>(all));
}

// The config a model file was saved with; "" or why it cannot be read. Every
// size in the file is checked against the bytes it holds before anything is
// read through it, the config is checked (LmConfig::check), and the file must
// hold the config's tensors: a config edited to a billion layers is refused
// here, not found out by building the model.
inline std::string read_lm_config(const std::string& path, LmConfig& out) {
  std::vector<unsigned char> bytes;
  grad::detail::Frame f;
  auto failed = [&](const std::string& why) { return "grad: model file '" + path + "': " + why; };
  if (std::string why = grad::detail::read_framed(path, grad::detail::model_magic, model_file_version,
                                                  model_file_version, "model", bytes, f);
      !why.empty())
    return failed(why);
  if (f.dtype != 1 && f.dtype != 2) return failed("corrupted: unknown dtype code " + std::to_string(f.dtype));
  if (f.kind != grad::detail::model_kind)
    return failed("corrupted: kind " + std::to_string(f.kind) + " in the header (a model file's kind is " +
                  std::to_string(grad::detail::model_kind) + ")");
  grad::detail::ByteReader r{
      std::span<const unsigned char>(bytes).subspan(grad::detail::checkpoint_header_bytes, f.payload_bytes)};
  const auto count = r.get<std::uint64_t>();
  const std::size_t elem = f.dtype == 1 ? 8 : 4;
  // No tensor can hold more values than the payload has bytes for.
  const std::size_t room = static_cast<std::size_t>(f.payload_bytes) / elem;
  std::size_t before = 0, found = 0;
  bool have = false;
  for (std::uint64_t i = 0; i < count && !r.short_read && i < f.payload_bytes; ++i) {
    const auto length = r.get<std::uint32_t>();
    const auto name = r.template take<char>(length);
    const auto rank = r.get<std::uint32_t>();
    if (r.short_read) break;
    if (rank > max_rank)
      return failed("corrupted: parameter " + std::to_string(i + 1) + " has rank " + std::to_string(rank) +
                    " (at most " + std::to_string(max_rank) + ")");
    std::size_t n = 1;
    for (std::uint32_t k = 0; k < rank; ++k) {
      const auto d = r.get<std::uint64_t>();
      if (r.short_read) break;
      if (d > room || __builtin_mul_overflow(n, static_cast<std::size_t>(d), &n) || n > room)
        return failed("corrupted: parameter " + std::to_string(i + 1) + " has more values than the " +
                      std::to_string(f.payload_bytes) + "-byte payload holds");
    }
    if (std::string_view(reinterpret_cast<const char*>(name.data()), name.size()) == "lm.config" &&
        n == LmConfig::stored_fields) {
      have = true;
      found = before;
    }
    if (n > room - before)
      return failed("corrupted: the tensors up to parameter " + std::to_string(i + 1) + " have more values than the " +
                    std::to_string(f.payload_bytes) + "-byte payload holds");
    before += n;
  }
  if (r.short_read || !have)
    return failed("no language-model config ('lm.config') in it: not a model saved by save_lm");
  // found + stored_fields <= before <= room: within the payload.
  const auto values = r.template take<unsigned char>(found * elem + LmConfig::stored_fields * elem);
  if (r.short_read) return failed("corrupted: the payload ends inside 'lm.config'");
  std::array<double, LmConfig::stored_fields> v{};
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (elem == 8) {
      std::memcpy(&v[i], values.data() + (found + i) * 8, 8);
    } else {
      float x;
      std::memcpy(&x, values.data() + (found + i) * 4, 4);
      v[i] = x;
    }
  }
  if (const std::size_t bad = LmConfig::first_bad_size(v); bad < LmConfig::stored_fields) {
    char number[32];
    std::snprintf(number, sizeof number, "%.17g", v[bad]);
    return failed("lm.config: " + std::string(LmConfig::stored_names[bad]) + " " + number +
                  " is not a size (expected a whole number >= 0)");
  }
  const LmConfig c = LmConfig::from_stored(v);
  if (std::string why = c.check(); !why.empty()) return failed("lm.config: " + why);
  // The tensors the config describes must all be in the file (check() has
  // bounded the count).
  const std::size_t needed = *c.parameter_count() + LmConfig::stored_fields;
  if (before != needed)
    return failed("lm.config says " + c.describe() + ": " + std::to_string(needed) +
                  " values with the config, but the file's tensors hold " + std::to_string(before));
  out = c;
  return "";
}

// Loads a file saved by save_lm into `model`: its base tensors, and its
// adapters too when the file has them and the model does (a base file into
// a LoRA model loads the base and leaves the adapters as they are: the
// start of a finetune). The file's config must equal the model's (base
// fields; all fields when adapters are loaded): otherwise a message naming
// both configs, and nothing is loaded.
template <class T>
ModelFileResult load_lm(const std::string& path, Lm<T>& model) {
  LmConfig file;
  if (std::string why = read_lm_config(path, file); !why.empty()) return {why};
  const LmConfig& mine = model.config();
  if (!mine.fits_model_file())
    return {"grad: model file '" + path + "': this model (" + mine.describe() +
            ") has fields no model file holds (load it with grad::hf::load_weights); nothing loaded"};
  auto same = [](double x, double y) { return static_cast<T>(x) == static_cast<T>(y); };
  const auto fs = file.stored(), ms = mine.stored();
  bool base_ok = true, all_ok = true;
  for (std::size_t i = 0; i < LmConfig::stored_fields; ++i) {
    const bool eq = same(fs[i], ms[i]);
    all_ok = all_ok && eq;
    if (i < LmConfig::base_fields) base_ok = base_ok && eq;
  }
  const bool with_adapters = file.lora_rank > 0;
  if (!base_ok || (with_adapters && !all_ok))
    return {"grad: model file '" + path + "' was saved for another model config (" + file.describe() +
            "); this model is " + mine.describe() + "; nothing loaded"};
  std::vector<NamedParameter<T>> list = with_adapters ? model.named() : model.base();
  list.push_back({"lm.config", model.config_var(), ParamKind::weight});
  if (const ModelFileResult r = load_model(path, model.tape(), std::span<const NamedParameter<T>>(list)); !r)
    return r;  // config matched but the tensors did not: load_model names them (nothing written)
  // The model keeps its own config (a base file's has no adapters).
  const std::span<T> cfg = model.tape().leaf_value(model.config_var());
  for (std::size_t i = 0; i < LmConfig::stored_fields; ++i) cfg[i] = static_cast<T>(ms[i]);
  return {};
}

}  // namespace grad::nn
