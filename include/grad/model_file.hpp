// Named model files: a model's parameters by name, without an optimizer
// (a training checkpoint, grad/checkpoint.hpp, is the separate file that adds
// the optimizer's state).
//
//   if (auto r = grad::save_model("digits.model", model); !r) std::fprintf(stderr, "%s\n", r.error.c_str());
//   if (auto r = grad::load_model("digits.model", model); !r) ...      // a model built the same way
//   grad::load_model("f64.model", model32, {.convert_dtype = true});   // f64 values rounded into an f32 model
//
// Loading matches parameters by name (order does not matter) and checks,
// before writing anything, that the file and the model have the same names
// (a name in one and not the other is named), the same shape for each name
// (both shapes are given) and the same dtype (float64 vs float32: converting
// happens only with convert_dtype, which rounds to nearest). On any failure
// the model is unchanged and the message says which check failed.
//
// The file shares the checkpoint's frame and guarantees (versioned,
// checksummed, written atomically through a unique temporary file with
// fsync, regular files only, reads bounded by the header):
//   header   "GRADMODL" u32 version (1)  u32 byte-order marker  u32 dtype (1 float64, 2 float32)
//            u32 kind (0)  u64 payload bytes
//   payload  u64 parameter count
//            per parameter: u32 name length, name bytes, u32 rank, u64 dims[rank]
//            per parameter: values, in the file's dtype
//   trailer  u64 FNV-1a hash of every byte before it
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "grad/checkpoint.hpp"
#include "grad/modules.hpp"

namespace grad {

inline constexpr std::uint32_t model_file_version = 1;

using ModelFileResult = CheckpointResult;  // error: "grad: model file '<path>': <what failed>"

struct ModelLoadOptions {
  bool convert_dtype = false;  // accept a float64 file into a float32 model (or the reverse)
};

namespace detail {
inline constexpr char model_magic[8] = {'G', 'R', 'A', 'D', 'M', 'O', 'D', 'L'};
inline constexpr std::size_t max_name_bytes = 4096;
inline constexpr std::uint32_t model_kind = 0;  // the header's kind field (a checkpoint's names its optimizer)

// What load_model requires of a parameter's name: "" or what is wrong with it.
inline std::string invalid_parameter_name(std::size_t length) {
  if (length == 0 || length > max_name_bytes)
    return "a name of " + std::to_string(length) + " bytes (expected 1 .. " + std::to_string(max_name_bytes) + ")";
  return {};
}
// A name for messages: itself when it is short and printable, else its length.
inline std::string printable_name(std::string_view name) {
  const bool plain = name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
                       return static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f;
                     });
  return plain ? "'" + std::string(name) + "'" : "(a name of " + std::to_string(name.size()) + " bytes)";
}

// The first finite value of a U span beyond T's range (1e300 as float):
// its index, or the count when there is none.
template <class T, class U>
std::size_t first_overflow(std::span<const unsigned char> from, std::size_t count, U& value) {
  for (std::size_t i = 0; i < count; ++i) {
    std::memcpy(&value, from.data() + i * sizeof(U), sizeof(U));
    // Tested before converting: an out-of-range conversion is undefined.
    if (std::isfinite(value) && std::abs(value) > static_cast<U>(std::numeric_limits<T>::max())) return i;
  }
  return count;
}

template <class T, class U>
void convert_into(std::span<const unsigned char> from, std::span<T> to) {
  for (std::size_t i = 0; i < to.size(); ++i) {
    U u;
    std::memcpy(&u, from.data() + i * sizeof(U), sizeof(U));
    to[i] = static_cast<T>(u);
  }
}
}  // namespace detail

template <class T>
ModelFileResult save_model(const std::string& path, const Tape<T>& tp, std::span<const nn::NamedParameter<T>> params) {
  auto failed = [&](const std::string& what) { return ModelFileResult{"grad: model file '" + path + "': " + what}; };
  if (!tp.ok()) return failed("the tape is poisoned (" + tp.error() + "); refusing to save");
  // load_model's rules, before anything is written: a file it would refuse
  // could never be read back.
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::string who = "parameter " + std::to_string(i + 1) + " " + detail::printable_name(params[i].name);
    if (std::string why = detail::invalid_parameter_name(params[i].name.size()); !why.empty())
      return failed(who + " has " + why + "; nothing written");
    for (std::size_t j = 0; j < i; ++j)
      if (params[j].name == params[i].name)
        return failed(who + " has the name of parameter " + std::to_string(j + 1) +
                      " (names must be unique); nothing written");
  }
  detail::ByteWriter payload;
  payload.put(static_cast<std::uint64_t>(params.size()));
  for (const auto& p : params) {
    // A 16-bit constant (a frozen base) is written widened: exact.
    const bool live = !tp.value(p.var).empty() || tp.storage(p.var) != Storage::native;
    if (!live) return failed("parameter '" + p.name + "' is not a live node of this tape");
    const Dims& d = tp.dims(p.var);
    if (d.rank == 0 || d.rank > max_rank)
      return failed("parameter '" + p.name + "' has rank " + std::to_string(d.rank) + " (expected 1 .. " +
                    std::to_string(max_rank) + "); nothing written");
    payload.put(static_cast<std::uint32_t>(p.name.size()));
    payload.put_all(std::span<const char>(p.name));
    payload.put(static_cast<std::uint32_t>(d.rank));
    for (std::size_t x : d.span()) payload.put(static_cast<std::uint64_t>(x));
  }
  for (const auto& p : params) {
    if (tp.storage(p.var) == Storage::native)
      payload.put_all(tp.value(p.var).data);
    else
      payload.put_all(std::span<const T>(tp.widened_value(p.var).data()));
  }
  const auto file =
      detail::frame(detail::model_magic, model_file_version, detail::dtype_code<T>, detail::model_kind, payload.bytes);
  if (std::string why = detail::write_atomically(path, file, "model"); !why.empty()) return failed(why);
  return {};
}
template <class T>
ModelFileResult save_model(const std::string& path, const nn::Module<T>& model) {
  return save_model(path, model.tape(), std::span<const nn::NamedParameter<T>>(model.parameters()));
}

template <class T>
ModelFileResult load_model(const std::string& path, Tape<T>& tp, std::span<const nn::NamedParameter<T>> params,
                           ModelLoadOptions options = {}) {
  auto failed = [&](const std::string& what) { return ModelFileResult{"grad: model file '" + path + "': " + what}; };
  if (!tp.ok()) return failed("the tape is poisoned (" + tp.error() + "); refusing to load");
  std::vector<unsigned char> bytes;
  detail::Frame f;
  if (std::string why =
          detail::read_framed(path, detail::model_magic, model_file_version, model_file_version, "model", bytes, f);
      !why.empty())
    return failed(why);
  if (f.dtype != 1 && f.dtype != 2) return failed("corrupted: unknown dtype code " + std::to_string(f.dtype));
  if (f.kind != detail::model_kind)
    return failed("corrupted: kind " + std::to_string(f.kind) + " in the header (a model file's kind is " +
                  std::to_string(detail::model_kind) + ")");
  if (f.dtype != detail::dtype_code<T> && !options.convert_dtype)
    return failed(std::string("dtype mismatch: the file holds ") + detail::dtype_name(f.dtype) +
                  " values, the model is " + detail::dtype_name(detail::dtype_code<T>) +
                  "; pass {.convert_dtype = true} to convert them");
  const std::size_t file_elem = f.dtype == 1 ? sizeof(double) : sizeof(float);

  // ---- the file's parameter list ----
  struct Entry {
    std::string name;
    Shape shape;
    std::size_t size = 0;
    std::span<const unsigned char> values;
    bool used = false;
  };
  detail::ByteReader r{std::span(bytes).subspan(detail::checkpoint_header_bytes, f.payload_bytes)};
  const auto count = r.get<std::uint64_t>();
  if (r.short_read || count > f.payload_bytes / 12)  // each entry takes at least 12 bytes
    return failed("corrupted: parameter count " + std::to_string(count) + " does not fit the payload");
  std::vector<Entry> entries(static_cast<std::size_t>(count));
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto length = r.get<std::uint32_t>();
    const auto name = r.template take<char>(length);
    const auto rank = r.get<std::uint32_t>();
    const std::string who = "corrupted: parameter " + std::to_string(i + 1) + " of " + std::to_string(count);
    if (r.short_read) return failed(who + ": the payload ends inside its name or rank");
    if (std::string why = detail::invalid_parameter_name(length); !why.empty()) return failed(who + " has " + why);
    entries[i].name.assign(reinterpret_cast<const char*>(name.data()), name.size());
    if (rank == 0 || rank > max_rank)
      return failed(who + " " + detail::printable_name(entries[i].name) + " has rank " + std::to_string(rank) +
                    " (expected 1 .. " + std::to_string(max_rank) + ")");
    entries[i].shape.resize(rank);
    for (std::size_t& d : entries[i].shape) d = static_cast<std::size_t>(r.get<std::uint64_t>());
    const auto n = checked_element_count(entries[i].shape);
    if (r.short_read || !n)
      return failed("corrupted: parameter '" + entries[i].name + "' has shape " + shape_string(entries[i].shape));
    entries[i].size = *n;
    for (std::size_t j = 0; j < i; ++j)
      if (entries[j].name == entries[i].name) return failed("corrupted: parameter '" + entries[i].name + "' twice");
  }
  for (Entry& e : entries) {
    e.values = file_elem == sizeof(double) ? r.template take<double>(e.size) : r.template take<float>(e.size);
    if (r.short_read) return failed("corrupted: the payload ends inside parameter '" + e.name + "'");
  }
  if (r.at != r.bytes.size()) return failed("corrupted: the payload does not match its own parameter list");

  // ---- names and shapes against the model, before writing anything ----
  std::vector<const Entry*> match(params.size(), nullptr);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const bool writable = !tp.leaf_value(params[i].var).empty() || !tp.leaf_bits(params[i].var).empty();
    if (quantized(tp.storage(params[i].var)))
      return failed("model parameter '" + params[i].name + "' is held " +
                    std::string(storage_name(tp.storage(params[i].var))) +
                    " (quantized blocks: rounding the file's values again would not give them back); load the "
                    "model native, bf16 or f16, or load its base from the GGUF it came from; nothing loaded");
    if (!writable) return failed("model parameter '" + params[i].name + "' is not a live parameter of this tape");
    const std::span<const std::size_t> have_shape = tp.dims(params[i].var).span();
    for (Entry& e : entries)
      if (e.name == params[i].name) {
        match[i] = &e;
        e.used = true;
      }
    if (!match[i]) {
      std::string unmatched;
      for (const Entry& e : entries)
        if (!e.used && std::none_of(params.begin(), params.end(), [&](const auto& p) { return p.name == e.name; }))
          unmatched += (unmatched.empty() ? "'" : ", '") + e.name + "'";
      return failed("name mismatch: the model's parameter '" + params[i].name + "' is not in the file" +
                    (unmatched.empty() ? std::string() : " (the file has " + unmatched + " instead)"));
    }
    if (!std::equal(have_shape.begin(), have_shape.end(), match[i]->shape.begin(), match[i]->shape.end()))
      return failed("shape mismatch: parameter '" + params[i].name + "' is " + shape_string(match[i]->shape) +
                    " in the file but " + shape_string(have_shape) + " in the model");
  }
  for (const Entry& e : entries)
    if (!e.used) return failed("name mismatch: the file's parameter '" + e.name + "' is not in the model");
  // A float64 value beyond float32's range would become inf without a word.
  if constexpr (std::is_same_v<T, float>)
    if (f.dtype == 1)
      for (std::size_t i = 0; i < params.size(); ++i) {
        double value = 0;
        const std::size_t at = detail::first_overflow<float, double>(match[i]->values, match[i]->size, value);
        if (at < match[i]->size) {
          char number[32];
          std::snprintf(number, sizeof number, "%.17g", value);
          return failed("convert_dtype: parameter '" + params[i].name + "' element " + std::to_string(at) + " is " +
                        number + ", beyond float32's range (it would become infinite); nothing loaded");
        }
      }

  // ---- every check passed: write ----
  std::vector<T> widened;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const std::span<std::uint16_t> bits = tp.leaf_bits(params[i].var);  // a 16-bit constant: rounded to it
    if (!bits.empty()) widened.resize(bits.size());
    const std::span<T> to = bits.empty() ? tp.leaf_value(params[i].var) : std::span<T>(widened);
    if (f.dtype == 1)
      detail::convert_into<T, double>(match[i]->values, to);
    else
      detail::convert_into<T, float>(match[i]->values, to);
    const Storage storage = tp.storage(params[i].var);
    for (std::size_t k = 0; k < bits.size(); ++k) bits[k] = round_to(storage, widened[k]);
  }
  return {};
}
template <class T>
ModelFileResult load_model(const std::string& path, nn::Module<T>& model, ModelLoadOptions options = {}) {
  return load_model(path, model.tape(), std::span<const nn::NamedParameter<T>>(model.parameters()), options);
}

}  // namespace grad

// With GRAD_COMPILED_KERNELS, saving and loading float and double models is the
// compiled library's (src/extras_*.cpp; core.hpp's GRAD_WALK_INSTANCES says why).
#define GRAD_MODEL_FILE_INSTANCES(E, T)                                                                          \
  E template grad::ModelFileResult grad::save_model<T>(const std::string&, const grad::Tape<T>&,                 \
                                                       std::span<const grad::nn::NamedParameter<T>>);            \
  E template grad::ModelFileResult grad::save_model<T>(const std::string&, const grad::nn::Module<T>&);          \
  E template grad::ModelFileResult grad::load_model<T>(const std::string&, grad::Tape<T>&,                       \
                                                       std::span<const grad::nn::NamedParameter<T>>,             \
                                                       grad::ModelLoadOptions);                                  \
  E template grad::ModelFileResult grad::load_model<T>(const std::string&, grad::nn::Module<T>&, grad::ModelLoadOptions);
#if defined(GRAD_COMPILED_KERNELS) && GRAD_SIMD
GRAD_MODEL_FILE_INSTANCES(extern, float)
GRAD_MODEL_FILE_INSTANCES(extern, double)
#endif
