// safetensors in and out (include/grad/hf/safetensors.hpp).
#include "grad/hf/safetensors.hpp"
#include "grad/numerics/storage.hpp"
#include "grad/regular_file.hpp"

#include "bounded_input.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <type_traits>
#include <utility>

namespace grad::hf {

namespace {

// The binary formats as (exponent bits, fraction bits); F64 and F32 are also
// handled by memcpy, this is for the generic rounding.
struct Format {
  int exponent_bits, fraction_bits;
};
Format format_of(Dtype d) {
  switch (d) {
    case Dtype::f32:
      return {8, 23};
    case Dtype::f16:
      return {5, 10};
    case Dtype::bf16:
      return {8, 7};
    case Dtype::f64:
      break;
  }
  return {11, 52};
}

// Beyond this the header is not a header: safetensors' own limit (100 MB).
constexpr std::uint64_t max_header_bytes = 100'000'000;

// Built by append: GCC 12 warns (-Wrestrict, falsely) about "'" + std::string(name) + "'".
// A name from a file is cut to a few hundred bytes (detail::text_excerpt).
std::string in_quotes(std::string_view name) {
  std::string s(1, '\'');
  s.append(detail::text_excerpt(name));
  s.push_back('\'');
  return s;
}

}  // namespace

std::string_view dtype_name(Dtype d) {
  switch (d) {
    case Dtype::f64:
      return "F64";
    case Dtype::f32:
      return "F32";
    case Dtype::f16:
      return "F16";
    case Dtype::bf16:
      return "BF16";
  }
  return "?";
}
std::size_t dtype_size(Dtype d) {
  switch (d) {
    case Dtype::f64:
      return 8;
    case Dtype::f32:
      return 4;
    case Dtype::f16:
    case Dtype::bf16:
      return 2;
  }
  return 0;
}
bool parse_dtype(std::string_view name, Dtype& out) {
  for (const Dtype d : {Dtype::f64, Dtype::f32, Dtype::f16, Dtype::bf16})
    if (dtype_name(d) == name) {
      out = d;
      return true;
    }
  return false;
}

double decode_element(Dtype d, const unsigned char* bytes) {
  if (d == Dtype::f64) {
    double v;
    std::memcpy(&v, bytes, 8);
    return v;
  }
  if (d == Dtype::f32) {
    float v;
    std::memcpy(&v, bytes, 4);
    return v;
  }
  std::uint16_t bits;
  std::memcpy(&bits, bytes, 2);
  const Format f = format_of(d);
  const int bias = (1 << (f.exponent_bits - 1)) - 1;
  const unsigned exponent = (bits >> f.fraction_bits) & ((1u << f.exponent_bits) - 1);
  const unsigned fraction = bits & ((1u << f.fraction_bits) - 1);
  const bool negative = (bits >> 15) != 0;
  double magnitude;
  if (exponent == (1u << f.exponent_bits) - 1)
    magnitude = fraction == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  else if (exponent == 0)  // subnormal: fraction * 2^(1 - bias - fraction_bits), exact
    magnitude = std::ldexp(static_cast<double>(fraction), 1 - bias - f.fraction_bits);
  else
    magnitude = std::ldexp(static_cast<double>(fraction | (1u << f.fraction_bits)),
                           static_cast<int>(exponent) - bias - f.fraction_bits);
  return negative ? -magnitude : magnitude;
}

bool encode_element(Dtype d, double value, unsigned char* bytes) {
  if (d == Dtype::f64) {
    std::memcpy(bytes, &value, 8);
    return true;
  }
  const Format f = format_of(d);
  const int width = 1 + f.exponent_bits + f.fraction_bits;
  const std::uint64_t exp_all = (std::uint64_t{1} << f.exponent_bits) - 1;
  std::uint64_t raw;
  std::memcpy(&raw, &value, 8);
  const std::uint64_t sign = (raw >> 63) << (width - 1);
  const std::uint64_t exp_field = (raw >> 52) & 0x7ff, frac = raw & ((std::uint64_t{1} << 52) - 1);
  std::uint64_t bits;
  if (exp_field == 0x7ff) {  // infinity, or a quiet NaN
    bits = (exp_all << f.fraction_bits) | (frac == 0 ? 0 : std::uint64_t{1} << (f.fraction_bits - 1));
  } else if (exp_field == 0 && frac == 0) {
    bits = 0;
  } else {
    // value = sig * 2^k; its leading bit's exponent is lead. The target's
    // quantum at that magnitude is 2^q, q = max(lead, emin) - fraction_bits,
    // and the rounded count of quanta n gives the bits directly:
    // ((max(lead, emin) - emin) << fraction_bits) + n (a carry into the next
    // binade, or from subnormal into normal, lands in the exponent field).
    const std::uint64_t sig = exp_field == 0 ? frac : frac | (std::uint64_t{1} << 52);
    const int k = exp_field == 0 ? -1074 : static_cast<int>(exp_field) - 1075;
    const int lead = k + (63 - __builtin_clzll(sig));
    const int emin = 1 - ((1 << (f.exponent_bits - 1)) - 1);
    const int top = std::max(lead, emin);
    const int shift = top - f.fraction_bits - k;  // > 0 for every target narrower than double
    std::uint64_t n = 0;
    if (shift < 64) {
      n = sig >> shift;
      const std::uint64_t rest = sig & ((std::uint64_t{1} << shift) - 1), half = std::uint64_t{1} << (shift - 1);
      if (rest > half || (rest == half && (n & 1) != 0)) ++n;
    }
    bits = (static_cast<std::uint64_t>(top - emin) << f.fraction_bits) + n;
    if (bits >= exp_all << f.fraction_bits) return false;  // rounds to infinity: beyond the finite range
  }
  bits |= sign;
  if (width == 32) {
    const auto b = static_cast<std::uint32_t>(bits);
    std::memcpy(bytes, &b, 4);
  } else {
    const auto b = static_cast<std::uint16_t>(bits);
    std::memcpy(bytes, &b, 2);
  }
  return true;
}

// ---- reading ----

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  auto fail = [&](const std::string& why) { throw Error("grad::hf: safetensors file '" + path + "': " + why); };
  std::uint64_t size = 0;
  if (std::string why = grad::detail::open_regular_file(path, fd_, size); !why.empty()) fail(why);
  try {
    auto read_at = [&](std::uint64_t offset, void* out, std::size_t n) {
      if (std::string why = grad::detail::read_at(fd_, offset, out, n); !why.empty()) fail(why);
    };
    if (size < 8) fail(std::to_string(size) + " bytes: shorter than the 8-byte header length");
    unsigned char length[8];
    read_at(0, length, 8);
    std::uint64_t header = 0;
    for (int i = 7; i >= 0; --i) header = header << 8 | length[i];  // little-endian on any host
    if (header > size - 8)
      fail("a header of " + std::to_string(header) + " bytes runs past the file's end (" + std::to_string(size) +
           " bytes)");
    if (header > max_header_bytes)
      fail("a header of " + std::to_string(header) + " bytes (at most " + std::to_string(max_header_bytes) + ")");
    std::string text(static_cast<std::size_t>(header), '\0');
    read_at(8, text.data(), text.size());
    const std::uint64_t data_start = 8 + header, data_size = size - data_start;
    nlohmann::json j;
    // A JSON object keeps the last of two equal keys; a tensor named twice is refused instead.
    std::set<std::string> names;
    std::string twice;
    auto note_keys = [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
      if (depth == 1 && event == nlohmann::json::parse_event_t::key && !names.insert(parsed.get<std::string>()).second &&
          twice.empty())
        twice = parsed.get<std::string>();
      return true;
    };
    if (std::string why = detail::parse_bounded(text, j, note_keys); !why.empty()) fail("the header: " + why);
    std::string().swap(text);
    if (!twice.empty()) fail("tensor " + in_quotes(twice) + " twice in the header");
    if (!j.is_object()) fail("the header is not a JSON object");
    // The tensor whose data ends last: past the file's end, the file was cut short.
    std::string last_name;
    std::uint64_t last_begin = 0, last_end = 0;
    for (auto it = j.begin(); it != j.end(); ++it) {
      const std::string& name = it.key();
      const nlohmann::json& e = it.value();
      if (name == "__metadata__") {
        if (!e.is_object()) fail("__metadata__ is not an object");
        for (auto m2 = e.begin(); m2 != e.end(); ++m2) {
          if (!m2.value().is_string()) fail("__metadata__ " + in_quotes(m2.key()) + " is not a string");
          metadata_[m2.key()] = m2.value().get<std::string>();
        }
        continue;
      }
      const std::string who = "tensor " + in_quotes(name);
      if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets"))
        fail(who + ": expected an object with dtype, shape and data_offsets");
      TensorInfo t;
      t.name = name;
      if (!e["dtype"].is_string()) fail(who + ": dtype is not a string");
      const std::string dtype = e["dtype"].get<std::string>();
      if (!parse_dtype(dtype, t.dtype)) fail(who + ": dtype " + in_quotes(dtype) + " (grad reads F64, F32, F16 and BF16)");
      const nlohmann::json& shape = e["shape"];
      const std::string shape_text = detail::json_excerpt(shape);
      if (!shape.is_array() || shape.size() > 8) fail(who + ": shape " + shape_text + " is not an array of at most 8 sizes");
      std::size_t n = 1;
      for (const auto& d : shape) {
        if (!d.is_number_unsigned()) fail(who + ": shape " + shape_text + " holds something other than a size");
        const auto v = d.get<std::uint64_t>();
        if (__builtin_mul_overflow(n, v, &n)) fail(who + ": shape " + shape_text + " overflows");
        t.shape.push_back(static_cast<std::size_t>(v));
      }
      t.elements = n;
      const nlohmann::json& off = e["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        fail(who + ": data_offsets " + detail::json_excerpt(off) + " is not [begin, end]");
      const auto begin = off[0].get<std::uint64_t>(), end = off[1].get<std::uint64_t>();
      const std::string range = "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
      if (begin > end) fail(who + ": " + range + " end before they begin");
      std::size_t bytes = 0;
      if (__builtin_mul_overflow(n, dtype_size(t.dtype), &bytes) || bytes != end - begin)
        fail(who + ": " + dtype + " " + shape_text + " needs " +
             (bytes == 0 && n != 0 ? std::string("more than 2^64") : std::to_string(bytes)) + " bytes, " + range +
             " hold " + std::to_string(end - begin));
      if (end > last_end || last_name.empty()) {
        last_name = name;
        last_begin = begin;
        last_end = end;
      }
      t.offset = data_start + begin;  // used only once every end is checked to be within the file, below
      t.byte_count = bytes;
      tensors_.push_back(std::move(t));
    }
    if (last_end > data_size)
      fail("truncated: the header says " + std::to_string(last_end) + " data bytes (tensor " + in_quotes(last_name) +
           " ends there, data_offsets [" + std::to_string(last_begin) + ", " + std::to_string(last_end) +
           "]), the file has " + std::to_string(data_size));
    // A tensor of no bytes overlaps nothing, wherever its offsets point.
    std::vector<const TensorInfo*> by_start;
    for (const TensorInfo& t : tensors_)
      if (t.byte_count != 0) by_start.push_back(&t);
    std::sort(by_start.begin(), by_start.end(),
              [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
    for (std::size_t i = 1; i < by_start.size(); ++i) {
      const TensorInfo &a = *by_start[i - 1], &b = *by_start[i];
      if (b.offset < a.offset + a.byte_count)
        fail("tensors " + in_quotes(a.name) + " and " + in_quotes(b.name) + " overlap in the data");
    }
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (fd_ >= 0) ::close(fd_);
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& o) noexcept
    : path_(std::move(o.path_)),
      fd_(std::exchange(o.fd_, -1)),
      tensors_(std::move(o.tensors_)),
      metadata_(std::move(o.metadata_)) {}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  for (const TensorInfo& t : tensors_)
    if (t.name == name) return &t;
  return nullptr;
}

namespace {

// Elements [first, first + out.size()) of tensor t, whose bytes `p` holds, converted into out.
template <class T>
void convert_range(const std::string& path, const TensorInfo& t, std::size_t first, const unsigned char* p,
                   std::span<T> out) {
  switch (t.dtype) {
    case Dtype::bf16:  // the upper half of a float
      for (std::size_t i = 0; i < out.size(); ++i) {
        const std::uint32_t bits = static_cast<std::uint32_t>(p[2 * i] | p[2 * i + 1] << 8) << 16;
        float v;
        std::memcpy(&v, &bits, 4);
        out[i] = static_cast<T>(v);
      }
      return;
    case Dtype::f32:
      for (std::size_t i = 0; i < out.size(); ++i) {
        float v;
        std::memcpy(&v, p + 4 * i, 4);
        out[i] = static_cast<T>(v);
      }
      return;
    case Dtype::f16:
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<T>(decode_element(Dtype::f16, p + 2 * i));
      return;
    case Dtype::f64:
      for (std::size_t i = 0; i < out.size(); ++i) {
        double v;
        std::memcpy(&v, p + 8 * i, 8);
        if constexpr (std::is_same_v<T, float>) {
          // Tested before converting: a double beyond float's range converts with undefined behaviour.
          const bool fits = !std::isfinite(v) || (std::abs(v) <= std::numeric_limits<float>::max() &&
                                                  static_cast<double>(static_cast<float>(v)) == v);
          if (!fits) {
            char number[32];
            std::snprintf(number, sizeof number, "%.17g", v);
            throw Error("grad::hf: safetensors file '" + path + "': tensor '" + t.name + "' element " +
                        std::to_string(first + i) + " is " + number + ", not a float value (read F64 into a double model)");
          }
        }
        out[i] = static_cast<T>(v);
      }
      return;
  }
}

// Calls f(first, n, bytes) for tensor t's elements a slice of at most
// slice_elements at a time, each slice's bytes read from the file into one
// buffer: a model is copied out tensor by tensor, and a Qwen2.5-0.5B's tied
// embedding is 545 MB in F32, so a slice, not the tensor, is what a load
// holds beside the model. A file cut short since it was opened is an
// hf::Error here (through a mapping it would be SIGBUS).
template <class F>
void each_slice(const std::string& path, int fd, const TensorInfo& t, std::size_t slice_elements, F&& f) {
  const std::size_t element_bytes = dtype_size(t.dtype);
  std::vector<unsigned char> bytes;
  for (std::size_t first = 0; first < t.elements; first += slice_elements) {
    const std::size_t n = std::min(slice_elements, t.elements - first);
    bytes.resize(n * element_bytes);
    if (std::string why = grad::detail::read_at(fd, t.offset + first * element_bytes, bytes.data(), bytes.size());
        !why.empty())
      throw Error("grad::hf: safetensors file '" + path + "': tensor " + in_quotes(t.name) + ": " + why);
    f(first, n, bytes.data());
  }
}

void check_count(const std::string& path, const TensorInfo& t, std::size_t count) {
  if (count != t.elements)
    throw Error("grad::hf: safetensors file '" + path + "': tensor '" + t.name + "' has " +
                std::to_string(t.elements) + " elements, read into " + std::to_string(count));
}

// A tensor 16 MiB of its bytes at a time (each_slice).
template <class T>
void read_into(const std::string& path, int fd, const TensorInfo& t, std::span<T> out) {
  check_count(path, t, out.size());
  each_slice(path, fd, t, (std::size_t{16} << 20) / dtype_size(t.dtype),
             [&](std::size_t first, std::size_t n, const unsigned char* bytes) {
               convert_range(path, t, first, bytes, out.subspan(first, n));
             });
}

// Elements [first, first + out.size()) of tensor t, whose bytes `p` holds,
// as the bits of a 16-bit storage: a tensor of that dtype copied, the others
// converted exactly to double and rounded; a finite value that would become
// infinite is refused.
void bits_range(const std::string& path, const TensorInfo& t, Storage storage, std::size_t first,
                const unsigned char* p, std::span<std::uint16_t> out, std::vector<double>& scratch) {
  if (t.dtype == (storage == Storage::f16 ? Dtype::f16 : Dtype::bf16)) {
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<std::uint16_t>(p[2 * i] | p[2 * i + 1] << 8);
    return;
  }
  scratch.resize(out.size());
  convert_range(path, t, first, p, std::span<double>(scratch));
  for (std::size_t i = 0; i < out.size(); ++i) {
    out[i] = round_to(storage, scratch[i]);
    if (std::isfinite(scratch[i]) && !std::isfinite(widen<double>(storage, out[i]))) {
      char number[32];
      std::snprintf(number, sizeof number, "%.17g", scratch[i]);
      throw Error("grad::hf: safetensors file '" + path + "': tensor '" + t.name + "' element " +
                  std::to_string(first + i) + " is " + number + ", beyond " + std::string(storage_name(storage)) +
                  "'s range (it would become infinite)");
    }
  }
}

// A tensor as the bits of a 16-bit storage, 4 Mi elements at a time (bits_range, each_slice).
void read_bits_into(const std::string& path, int fd, const TensorInfo& t, Storage storage,
                    std::span<std::uint16_t> out) {
  check_count(path, t, out.size());
  std::vector<double> scratch;
  each_slice(path, fd, t, std::size_t{4} << 20, [&](std::size_t first, std::size_t n, const unsigned char* bytes) {
    bits_range(path, t, storage, first, bytes, out.subspan(first, n), scratch);
  });
}

}  // namespace

void SafetensorsFile::read_bits(const TensorInfo& t, Storage storage, std::span<std::uint16_t> out) const {
  read_bits_into(path_, fd_, t, storage, out);
}
void SafetensorsFile::check_read(const TensorInfo& t, Storage storage) const {
  // One slice at a time into a slice's scratch (converting the tensor whole,
  // as a load would, would hold a second copy of it: 545 MB for an F32
  // Qwen2.5-0.5B's embedding).
  std::vector<std::uint16_t> bits;
  std::vector<float> floats;
  std::vector<double> scratch;
  each_slice(path_, fd_, t, std::size_t{1} << 20, [&](std::size_t first, std::size_t n, const unsigned char* bytes) {
    if (narrow(storage)) {
      bits.resize(n);
      bits_range(path_, t, storage, first, bytes, std::span<std::uint16_t>(bits), scratch);
    } else {
      floats.resize(n);
      convert_range(path_, t, first, bytes, std::span<float>(floats));
    }
  });
}
void SafetensorsFile::read(const TensorInfo& t, std::span<double> out) const { read_into(path_, fd_, t, out); }
void SafetensorsFile::read(const TensorInfo& t, std::span<float> out) const { read_into(path_, fd_, t, out); }

// ---- writing ----

namespace {

// A temporary file beside `path`, renamed over it once complete and fsync'd;
// removed on any failure.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path) : path_(path), temp_(path + ".tmp.XXXXXX") {
    if (std::string why = grad::detail::output_path_problem(path); !why.empty()) fail(why);
    const int fd = ::mkstemp(temp_.data());
    if (fd < 0) fail(std::string("cannot create a temporary file beside it: ") + std::strerror(errno));
    ::fchmod(fd, 0644);  // mkstemp creates 0600; a model is as readable as any output file (as checkpoint.hpp)
    file_ = ::fdopen(fd, "wb");
    if (!file_) {
      ::close(fd);
      ::unlink(temp_.c_str());
      fail("cannot open the temporary file");
    }
  }
  ~AtomicFile() {
    if (file_) {
      std::fclose(file_);
      ::unlink(temp_.c_str());
    }
  }
  void write(const void* data, std::size_t n) {
    if (n != 0 && std::fwrite(data, 1, n, file_) != n) fail(std::string("write failed: ") + std::strerror(errno));
  }
  void commit() {
    const bool flushed = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
    const bool closed = std::fclose(file_) == 0;
    file_ = nullptr;
    if (!flushed || !closed || ::rename(temp_.c_str(), path_.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      ::unlink(temp_.c_str());
      fail("cannot complete the write: " + why);
    }
  }
  [[noreturn]] void fail(const std::string& why) const {
    throw Error("grad::hf: cannot write '" + path_ + "': " + why + "; nothing written");
  }

 private:
  std::string path_, temp_;
  std::FILE* file_ = nullptr;
};

}  // namespace

void write_file_atomically(const std::string& path, std::string_view bytes) {
  AtomicFile f(path);
  f.write(bytes.data(), bytes.size());
  f.commit();
}

template <class T>
void write_safetensors(const std::string& path, std::span<const TensorOut<T>> tensors, Dtype dtype,
                       const std::map<std::string, std::string>& metadata) {
  auto fail = [&](const std::string& why) {
    throw Error("grad::hf: cannot write '" + path + "': " + why + "; nothing written");
  };
  const std::size_t elem = dtype_size(dtype);
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::uint64_t offset = 0;
  unsigned char scratch[8];
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const TensorOut<T>& t = tensors[i];
    const std::string who = "tensor '" + t.name + "'";
    if (t.name.empty() || t.name == "__metadata__") fail(who + ": not a tensor name");
    for (std::size_t j = 0; j < i; ++j)
      if (tensors[j].name == t.name) fail(who + " twice");
    std::size_t n = 1;
    for (std::size_t d : t.shape)
      if (__builtin_mul_overflow(n, d, &n)) fail(who + ": its shape overflows");
    if (n != t.values.size())
      fail(who + ": " + std::to_string(t.values.size()) + " values for a shape of " + std::to_string(n) + " elements");
    if (t.transposed && t.shape.size() != 2) fail(who + ": only a matrix is written transposed");
    for (std::size_t k = 0; k < n; ++k)
      if (!encode_element(dtype, static_cast<double>(t.values[k]), scratch)) {
        char number[32];
        std::snprintf(number, sizeof number, "%.17g", static_cast<double>(t.values[k]));
        fail(who + " element " + std::to_string(k) + " is " + number + ", beyond " + std::string(dtype_name(dtype)) +
             "'s range");
      }
    header[t.name] = {{"dtype", dtype_name(dtype)}, {"shape", t.shape}, {"data_offsets", {offset, offset + n * elem}}};
    offset += n * elem;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned
  AtomicFile f(path);
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(static_cast<std::uint64_t>(text.size()) >> (8 * i));
  f.write(length, 8);
  f.write(text.data(), text.size());
  std::vector<unsigned char> buffer;
  constexpr std::size_t chunk = 1 << 16;
  for (const TensorOut<T>& t : tensors) {
    const std::size_t n = t.values.size();
    const std::size_t rows = t.transposed ? t.shape[0] : 0, cols = t.transposed ? t.shape[1] : 0;
    for (std::size_t start = 0; start < n; start += chunk) {
      const std::size_t count = std::min(chunk, n - start);
      buffer.resize(count * elem);
      for (std::size_t k = 0; k < count; ++k) {
        const std::size_t at = start + k;
        // Transposed: stored element (r, c) is values[c][r] of the [cols, rows] matrix.
        const T v = t.transposed ? t.values[(at % cols) * rows + at / cols] : t.values[at];
        encode_element(dtype, static_cast<double>(v), buffer.data() + k * elem);
      }
      f.write(buffer.data(), buffer.size());
    }
  }
  f.commit();
}

template void write_safetensors<float>(const std::string&, std::span<const TensorOut<float>>, Dtype,
                                       const std::map<std::string, std::string>&);
template void write_safetensors<double>(const std::string&, std::span<const TensorOut<double>>, Dtype,
                                        const std::map<std::string, std::string>&);

}  // namespace grad::hf
