// safetensors files (the format Hugging Face checkpoints are stored in), read
// with bounded preads and written atomically.
//
//   file    u64 little-endian N, then N bytes of JSON, then the data
//   JSON    {"<name>": {"dtype": "BF16", "shape": [out, in], "data_offsets": [begin, end]}, ...,
//            "__metadata__": {"<key>": "<string>", ...}}   (offsets relative to the data's start)
//
// Reading checks the header before anything is read through it: N within the
// file, the JSON an object of such entries, each dtype known, each shape's
// element count times the dtype's size equal to end - begin (overflow
// checked), every range inside the data (a file shorter than its header says
// is reported as truncated) and no two ranges of one byte or more
// overlapping. The header's JSON may nest at most 64 levels. A refusal is an
// hf::Error naming the file and the tensor, quoting at most a few hundred
// bytes of what it read. Values come out
// converted exactly: F16 and BF16 (and F32) into float or double, F64 into
// double (into float only when it is a float value: never rounded silently).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "grad/numerics/storage.hpp"

namespace grad::hf {

// What grad::hf throws: the message names the file and, where there is one, the tensor.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class Dtype : std::uint8_t { f64, f32, f16, bf16 };
std::string_view dtype_name(Dtype d);   // "F64", "F32", "F16", "BF16"
std::size_t dtype_size(Dtype d);        // bytes per element
bool parse_dtype(std::string_view name, Dtype& out);
// How a frozen base read from a checkpoint of this dtype can be held without
// rounding: BF16 as Storage::bf16, F16 as Storage::f16, F32 and F64 native.
inline Storage storage_for(Dtype d) {
  return d == Dtype::bf16 ? Storage::bf16 : d == Dtype::f16 ? Storage::f16 : Storage::native;
}

// Exact decoding of one element's bits (little-endian bytes) to double: every
// F16, BF16 and F32 value is a double (and a float) exactly.
double decode_element(Dtype d, const unsigned char* bytes);
// The element nearest to `value` (ties to even) as bits; false when it is
// beyond the dtype's finite range (an infinity or NaN is kept as one).
bool encode_element(Dtype d, double value, unsigned char* bytes);

struct TensorInfo {
  std::string name;
  Dtype dtype = Dtype::f32;
  std::vector<std::size_t> shape;
  std::size_t elements = 0;
  std::uint64_t offset = 0;    // of its first byte in the file
  std::size_t byte_count = 0;  // elements * dtype_size(dtype)
};

// One safetensors file, open for as long as it lives. Tensors are read with
// pread into memory of the reader's own, never through a mapping: a file
// that another program truncates while it is open would make a read through
// a mapping kill the process (SIGBUS); a pread past its new end is an
// hf::Error saying it was truncated.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);  // throws hf::Error
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const TensorInfo* find(std::string_view name) const;  // nullptr when absent

  // The tensor's values converted exactly; `out` must hold exactly its elements.
  void read(const TensorInfo& t, std::span<double> out) const;
  void read(const TensorInfo& t, std::span<float> out) const;  // F64 values that are not floats are refused
  // The tensor as the bits of a 16-bit storage (Storage::bf16 or f16: a
  // frozen base held in 16 bits): a tensor of that dtype copied exactly,
  // others rounded to the nearest (ties to even; as round_to).
  void read_bits(const TensorInfo& t, Storage storage, std::span<std::uint16_t> out) const;
  // Throws the hf::Error that read_bits (a 16-bit storage) or read into
  // float (Storage::native) would throw for this tensor, writing nothing and
  // holding no copy of it: a load proves its conversions before it changes
  // a model.
  void check_read(const TensorInfo& t, Storage storage) const;

 private:
  std::string path_;
  int fd_ = -1;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A tensor to write: `shape` as it is stored and its values in row-major
// order, or (transposed, rank 2) values of the [shape[1], shape[0]] matrix
// they are the transpose of, written transposed without a copy of the whole.
template <class T>
struct TensorOut {
  std::string name;
  std::vector<std::size_t> shape;
  std::span<const T> values;
  bool transposed = false;
};

// Writes the tensors (in the given order, data aligned to 8 bytes) in
// `dtype`, atomically: to a temporary file in the same directory, fsync'd,
// renamed over `path` (which must be absent or a regular file: a FIFO or a
// device is refused, not replaced). Every value is checked to fit the dtype
// before anything is written. Throws hf::Error naming the file and the tensor.
template <class T>
void write_safetensors(const std::string& path, std::span<const TensorOut<T>> tensors, Dtype dtype,
                       const std::map<std::string, std::string>& metadata = {});

// A whole file's bytes written atomically (config.json, the index, copies).
void write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace grad::hf
