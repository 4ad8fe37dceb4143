// GGUF files in: llama.cpp's model format (ggml/docs/gguf.md), versions 2
// and 3, parsed with every count, length and extent checked before it is
// used, and the tensors' data memory-mapped, never read into memory.
//
//   hf::GgufFile f("model.gguf");                       // throws hf::Error
//   f.find("general.architecture")->text();             // "qwen2"
//   const hf::GgufTensorInfo* t = f.tensor("blk.0.attn_q.weight");
//   std::span<const unsigned char> bytes = f.bytes(*t);  // the file's bytes of it, as stored (F16, Q4_K, ...)
//
// The file, little-endian throughout:
//   "GGUF", u32 version, u64 tensor count, u64 metadata count
//   metadata:  string key, u32 value type, value          (string: u64 length + bytes, no NUL)
//              array: u32 element type, u64 count, the elements (arrays of arrays too)
//   tensors:   string name, u32 n_dims (1 .. 4), u64 ne[n_dims] (ne[0] varies fastest),
//              u32 ggml type, u64 offset (from the start of the data section)
//   padding to general.alignment (default 32), then the data section.
//
// Refused, with an hf::Error naming the file, the field (the metadata key or
// the tensor) and the values: a magic other than "GGUF"; version 1 (32-bit
// counts) or any version but 2 and 3 (a big-endian file is named as one);
// a count, length or extent that would pass the end of the file, checked
// before anything is allocated for it (a string of 2^60 bytes, an array of
// 2^60 elements); a value type or ggml type that is not one; arrays nested
// deeper than max_array_depth; a key or tensor name given twice; a tensor
// whose dims overflow, whose first dim is not a whole number of its type's
// blocks, whose offset is not a multiple of the alignment, or whose bytes
// pass the end of the file or overlap another's; a general.alignment that is
// not a power of two. Everything before the data section is at most
// max_header_bytes (Qwen2's 151k-token vocabulary and merges are 10 MB).
//
// The mapping: the file is opened as a regular file (a FIFO or a device is
// refused: grad/regular_file.hpp), mapped read-only whole, and stays mapped
// for as long as the GgufFile lives, so that bytes() hands a tensor over as a
// span without a copy (a 7B model's file is 4 GB and more). As with every
// mapping (llama.cpp's too), a file that another program truncates while it
// is mapped makes a later read of the lost pages raise SIGBUS; the sizes are
// checked against the file when it is opened.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "grad/hf/safetensors.hpp"  // hf::Error
#include "grad/numerics/held.hpp"

namespace grad::hf {

// ---- metadata values ----

// GGUF's value types (gguf_type).
enum class GgufValueType : std::uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
// "u32", "string", ...; "type <n>" for a code that is none.
std::string gguf_value_type_name(GgufValueType t);

// One metadata value as the file holds it. Scalars keep their type; an
// array keeps its elements in the file's little-endian bytes (numbers and
// bools), as strings, or as nested values (an array of arrays).
struct GgufValue {
  GgufValueType type = GgufValueType::u8;
  // Scalars: an integer of any width in `integer` (signed types sign-extended
  // into it; read with as_size / as_int), a real exactly (f32 or f64), a bool.
  std::int64_t integer = 0;
  std::uint64_t unsigned_integer = 0;  // u64 beyond int64's range lives here (and every unsigned value)
  double real = 0;
  std::string string;
  // Arrays: the elements' type and count, and one of the three below.
  GgufValueType element_type = GgufValueType::u8;
  std::uint64_t count = 0;
  std::vector<unsigned char> raw;    // numbers and bools: count * their size bytes
  std::vector<std::string> strings;  // strings
  std::vector<GgufValue> items;      // arrays

  bool is_integer() const;  // u8 .. i64, not bool
  // A whole number >= 0 of any integer type (nullopt otherwise, or negative).
  std::optional<std::uint64_t> as_size() const;
  // f32 or f64 (nullopt otherwise).
  std::optional<double> as_real() const;
  // The array's i-th element as an integer (integer element types only; nullopt otherwise).
  std::optional<std::int64_t> integer_at(std::size_t i) const;
  // How the value reads in a message: "u32 7", "string \"qwen2\"", "array of 151936 string".
  std::string describe() const;
};

struct GgufKeyValue {
  std::string key;
  GgufValue value;
};

// ---- tensor types ----

// ggml's tensor types (ggml_type codes; the gaps are types ggml removed).
enum class GgmlType : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  q8_k = 15,
  iq2_xxs = 16,
  iq2_xs = 17,
  iq3_xxs = 18,
  iq1_s = 19,
  iq4_nl = 20,
  iq3_s = 21,
  iq2_s = 22,
  iq4_xs = 23,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  iq1_m = 29,
  bf16 = 30,
  tq1_0 = 34,
  tq2_0 = 35,
  mxfp4 = 39,
};

// The storage that holds a tensor of this type as the file does: f16, bf16,
// or its quantized format (q8_0, q4_0, q4_K, q5_K, q6_K); native for f32 and
// for every type grad holds no other way.
inline Storage storage_for(GgmlType t) {
  if (t == GgmlType::f16) return Storage::f16;
  if (t == GgmlType::bf16) return Storage::bf16;
  if (const std::optional<QuantFormat> q = quant_format_from_ggml(static_cast<std::uint32_t>(t))) return storage_of(*q);
  return Storage::native;
}

// A type's block: `block_elements` values held in `block_bytes` bytes
// (1 and the element's size for the plain types).
struct GgmlTypeInfo {
  std::string_view name;  // ggml's: "f32", "q4_K", ...
  std::uint32_t block_elements = 1, block_bytes = 0;
};
// nullptr for a code that is no type ggml defines.
const GgmlTypeInfo* ggml_type_info(std::uint32_t code);
// ggml's name of the code, or "type <n>" for an unknown one.
std::string ggml_type_name(std::uint32_t code);

struct GgufTensorInfo {
  std::string name;
  std::vector<std::uint64_t> ne;  // ne[0] fastest: a matrix of ne[1] rows of ne[0] values
  std::uint32_t type = 0;         // the ggml type code (GgmlType)
  std::uint64_t offset = 0;       // from the start of the data section
  std::uint64_t elements = 0;     // the product of ne
  std::uint64_t byte_count = 0;   // elements / block_elements * block_bytes
  GgmlType ggml_type() const { return static_cast<GgmlType>(type); }
};

// ---- the file ----

class GgufFile {
 public:
  // Everything before the data section (header, metadata, tensor infos).
  static constexpr std::uint64_t max_header_bytes = std::uint64_t{1} << 30;
  // Arrays of arrays: at most this deep (an array of scalars is depth 1), and
  // at most max_nested_arrays arrays inside arrays in the whole file (real
  // files have none: each costs a GgufValue here for 12 bytes of the file).
  static constexpr std::size_t max_array_depth = 8;
  static constexpr std::uint64_t max_nested_arrays = std::uint64_t{1} << 20;
  // Strings inside arrays, all arrays together (Gemma's 256k tokens and merges fit).
  static constexpr std::uint64_t max_array_strings = std::uint64_t{1} << 24;
  // A tensor name's bytes (ggml's own limit is 63).
  static constexpr std::size_t max_name_bytes = 256;

  explicit GgufFile(const std::string& path);  // throws hf::Error
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  GgufFile(GgufFile&& other) noexcept;
  GgufFile& operator=(GgufFile&&) = delete;

  const std::string& path() const { return path_; }
  std::uint32_t version() const { return version_; }
  std::uint64_t alignment() const { return alignment_; }
  std::uint64_t data_offset() const { return data_offset_; }  // the data section's first byte in the file
  std::uint64_t file_size() const { return file_size_; }

  const std::vector<GgufKeyValue>& metadata() const { return metadata_; }  // in file order
  const GgufValue* find(std::string_view key) const;                       // nullptr when absent
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }  // in file order
  const GgufTensorInfo* tensor(std::string_view name) const;               // nullptr when absent

  // The tensor's bytes in the mapped file, as stored (its ggml type's blocks).
  std::span<const unsigned char> bytes(const GgufTensorInfo& t) const;
  // Lets the tensor's pages go from this process's memory (madvise
  // MADV_DONTNEED: a later bytes(t) reads them from the file again): a
  // loader that has copied a tensor calls it, so a model's peak memory is
  // its own copy, not that plus the mapped file's pages.
  void release(const GgufTensorInfo& t) const;

 private:
  std::string path_;
  std::uint32_t version_ = 0;
  std::uint64_t alignment_ = 32, data_offset_ = 0, file_size_ = 0;
  std::vector<GgufKeyValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> by_name_;  // tensor name -> index
  const unsigned char* map_ = nullptr;
  std::size_t map_size_ = 0;
};

}  // namespace grad::hf
