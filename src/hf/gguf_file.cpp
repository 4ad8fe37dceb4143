// GGUF files in (include/grad/hf/gguf_file.hpp has the format and the rules).
#include "grad/hf/gguf_file.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <unordered_set>

#include "bounded_input.hpp"
#include "grad/regular_file.hpp"

namespace grad::hf {

static_assert(std::endian::native == std::endian::little, "GGUF is read as little-endian bytes");

// ---- value types ----

namespace {

constexpr std::uint32_t value_type_count = 13;

// Bytes of a scalar of the type (0: a string or an array, whose size varies).
std::size_t scalar_bytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8:
    case GgufValueType::i8:
    case GgufValueType::boolean:
      return 1;
    case GgufValueType::u16:
    case GgufValueType::i16:
      return 2;
    case GgufValueType::u32:
    case GgufValueType::i32:
    case GgufValueType::f32:
      return 4;
    case GgufValueType::u64:
    case GgufValueType::i64:
    case GgufValueType::f64:
      return 8;
    default:
      return 0;
  }
}

bool is_signed(GgufValueType t) {
  return t == GgufValueType::i8 || t == GgufValueType::i16 || t == GgufValueType::i32 || t == GgufValueType::i64;
}
bool is_unsigned(GgufValueType t) {
  return t == GgufValueType::u8 || t == GgufValueType::u16 || t == GgufValueType::u32 || t == GgufValueType::u64;
}

// The integer of `n` little-endian bytes of type t, sign-extended when t is signed.
std::int64_t load_signed(const unsigned char* p, std::size_t n) {
  std::uint64_t u = 0;
  std::memcpy(&u, p, n);
  const unsigned shift = static_cast<unsigned>(64 - 8 * n);
  return static_cast<std::int64_t>(u << shift) >> shift;
}
std::uint64_t load_unsigned(const unsigned char* p, std::size_t n) {
  std::uint64_t u = 0;
  std::memcpy(&u, p, n);
  return u;
}

}  // namespace

std::string gguf_value_type_name(GgufValueType t) {
  static constexpr const char* names[value_type_count] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                                          "bool", "string", "array", "u64", "i64", "f64"};
  const auto code = static_cast<std::uint32_t>(t);
  return code < value_type_count ? names[code] : "type " + std::to_string(code);
}

bool GgufValue::is_integer() const { return is_signed(type) || is_unsigned(type); }

std::optional<std::uint64_t> GgufValue::as_size() const {
  if (is_unsigned(type)) return unsigned_integer;
  if (is_signed(type) && integer >= 0) return static_cast<std::uint64_t>(integer);
  return std::nullopt;
}

std::optional<double> GgufValue::as_real() const {
  if (type == GgufValueType::f32 || type == GgufValueType::f64) return real;
  return std::nullopt;
}

std::optional<std::int64_t> GgufValue::integer_at(std::size_t i) const {
  if (type != GgufValueType::array || i >= count) return std::nullopt;
  const std::size_t n = scalar_bytes(element_type);
  if (is_signed(element_type)) return load_signed(raw.data() + i * n, n);
  if (is_unsigned(element_type)) {
    const std::uint64_t u = load_unsigned(raw.data() + i * n, n);
    if (u > static_cast<std::uint64_t>(INT64_MAX)) return std::nullopt;
    return static_cast<std::int64_t>(u);
  }
  return std::nullopt;
}

std::string GgufValue::describe() const {
  if (type == GgufValueType::array)
    return "array of " + std::to_string(count) + " " + gguf_value_type_name(element_type);
  const std::string t = gguf_value_type_name(type) + " ";
  if (type == GgufValueType::string) return t + "\"" + detail::text_excerpt(string) + "\"";
  if (type == GgufValueType::boolean) return t + (integer ? "true" : "false");
  if (type == GgufValueType::f32 || type == GgufValueType::f64) {
    char text[40];
    std::snprintf(text, sizeof text, "%.9g", real);
    return t + text;
  }
  return t + (is_unsigned(type) ? std::to_string(unsigned_integer) : std::to_string(integer));
}

// ---- ggml types ----

const GgmlTypeInfo* ggml_type_info(std::uint32_t code) {
  // (block elements, block bytes) as ggml's type_traits: K-quants are 256
  // values a block (QK_K), the older quants 32.
  static constexpr GgmlTypeInfo none{};
  static constexpr GgmlTypeInfo table[] = {
      {"f32", 1, 4},
      {"f16", 1, 2},
      {"q4_0", 32, 18},
      {"q4_1", 32, 20},
      none,
      none,
      {"q5_0", 32, 22},
      {"q5_1", 32, 24},
      {"q8_0", 32, 34},
      {"q8_1", 32, 36},
      {"q2_K", 256, 84},
      {"q3_K", 256, 110},
      {"q4_K", 256, 144},
      {"q5_K", 256, 176},
      {"q6_K", 256, 210},
      {"q8_K", 256, 292},
      {"iq2_xxs", 256, 66},
      {"iq2_xs", 256, 74},
      {"iq3_xxs", 256, 98},
      {"iq1_s", 256, 50},
      {"iq4_nl", 32, 18},
      {"iq3_s", 256, 110},
      {"iq2_s", 256, 82},
      {"iq4_xs", 256, 136},
      {"i8", 1, 1},
      {"i16", 1, 2},
      {"i32", 1, 4},
      {"i64", 1, 8},
      {"f64", 1, 8},
      {"iq1_m", 256, 56},
      {"bf16", 1, 2},
      none,
      none,
      none,
      {"tq1_0", 256, 54},
      {"tq2_0", 256, 66},
      none,
      none,
      none,
      {"mxfp4", 32, 17},
  };
  if (code >= std::size(table) || table[code].block_bytes == 0) return nullptr;
  return &table[code];
}

std::string ggml_type_name(std::uint32_t code) {
  const GgmlTypeInfo* info = ggml_type_info(code);
  return info ? std::string(info->name) : "type " + std::to_string(code);
}

// ---- parsing ----

namespace {

// Sequential reads of the file's header through a buffer of preads, every
// read checked against the file's size and max_header_bytes first.
class Cursor {
 public:
  Cursor(const std::string& path, int fd, std::uint64_t size) : path_(path), fd_(fd), size_(size) {}

  [[noreturn]] void fail(const std::string& why) const { throw Error("grad::hf: GGUF '" + path_ + "': " + why); }

  std::uint64_t at() const { return at_; }
  // The bytes a field may still take: to the end of the file or of the header bound.
  std::uint64_t left() const { return std::min(size_, GgufFile::max_header_bytes) - at_; }

  // Makes sure n bytes of `what` are there before anything is allocated for them.
  void need(std::uint64_t n, const std::string& what) const {
    if (n <= left()) return;
    if (n <= size_ - at_)  // in the file, past the bound
      fail(what + ": " + std::to_string(n) + " bytes at byte " + std::to_string(at_) +
           " would take the header (metadata and tensor infos) past " + std::to_string(GgufFile::max_header_bytes) +
           " bytes, more than this reader takes");
    fail(what + ": " + std::to_string(n) + " bytes at byte " + std::to_string(at_) + ", but the file ends at byte " +
         std::to_string(size_) + " (truncated, or a count or length that is wrong)");
  }

  void read(void* out, std::size_t n, const std::string& what) {
    need(n, what);
    if (at_ < window_start_ || at_ + n > window_start_ + window_.size()) {
      const std::uint64_t len = std::min<std::uint64_t>(std::max<std::uint64_t>(n, window_bytes), size_ - at_);
      window_.resize(static_cast<std::size_t>(len));
      if (std::string why = grad::detail::read_at(fd_, at_, window_.data(), window_.size()); !why.empty())
        fail(what + ": " + why);
      window_start_ = at_;
    }
    std::memcpy(out, window_.data() + (at_ - window_start_), n);
    at_ += n;
  }
  template <class U>
  U get(const std::string& what) {
    U v;
    read(&v, sizeof v, what);
    return v;
  }
  std::string string(const std::string& what, std::uint64_t max_bytes = UINT64_MAX) {
    const auto n = get<std::uint64_t>(what + "'s length");
    if (n > max_bytes)
      fail(what + ": a string of " + std::to_string(n) + " bytes (expected at most " + std::to_string(max_bytes) + ")");
    need(n, what);
    std::string s(static_cast<std::size_t>(n), '\0');
    if (n > 0) read(s.data(), s.size(), what);
    return s;
  }
  void skip_to(std::uint64_t offset) { at_ = offset; }

 private:
  static constexpr std::uint64_t window_bytes = std::uint64_t{1} << 20;
  std::string path_;
  int fd_;
  std::uint64_t size_, at_ = 0, window_start_ = 0;
  std::vector<unsigned char> window_;
};

// What the arrays of the whole file have used of the bounds.
struct Budget {
  std::uint64_t strings = 0, nested = 0;
};

GgufValueType value_type(Cursor& c, const std::string& what) {
  const auto code = c.get<std::uint32_t>(what);
  if (code >= value_type_count)
    c.fail(what + " " + std::to_string(code) + " is no GGUF value type (expected 0 .. 12: u8 .. f64)");
  return static_cast<GgufValueType>(code);
}

GgufValue read_value(Cursor& c, GgufValueType type, const std::string& what, std::size_t depth, Budget& budget);

void read_array(Cursor& c, GgufValue& v, const std::string& what, std::size_t depth, Budget& budget) {
  if (depth >= GgufFile::max_array_depth)
    c.fail(what + ": arrays nested deeper than " + std::to_string(GgufFile::max_array_depth) + " levels");
  v.element_type = value_type(c, what + "'s element type");
  v.count = c.get<std::uint64_t>(what + "'s count");
  const std::string of =
      what + " (array of " + std::to_string(v.count) + " " + gguf_value_type_name(v.element_type) + ")";
  // The least each element takes in the file, checked against what is left
  // before anything is reserved for the count.
  const std::uint64_t least = v.element_type == GgufValueType::string  ? 8
                              : v.element_type == GgufValueType::array ? 12
                                                                       : scalar_bytes(v.element_type);
  if (v.count > c.left() / least)
    c.fail(of + ": at least " + std::to_string(least) + " bytes each, more than the " + std::to_string(c.left()) +
           " bytes left in the file");
  const std::size_t n = static_cast<std::size_t>(v.count);
  if (v.element_type == GgufValueType::string) {
    budget.strings += v.count;
    if (budget.strings > GgufFile::max_array_strings)
      c.fail(of + ": more than " + std::to_string(GgufFile::max_array_strings) + " strings in arrays in the file");
    v.strings.reserve(n);
    for (std::size_t i = 0; i < n; ++i) v.strings.push_back(c.string(what + "[" + std::to_string(i) + "]"));
  } else if (v.element_type == GgufValueType::array) {
    budget.nested += v.count;
    if (budget.nested > GgufFile::max_nested_arrays)
      c.fail(of + ": more than " + std::to_string(GgufFile::max_nested_arrays) + " arrays inside arrays in the file");
    v.items.reserve(n);
    for (std::size_t i = 0; i < n; ++i)
      v.items.push_back(read_value(c, GgufValueType::array, what + "[" + std::to_string(i) + "]", depth + 1, budget));
  } else {
    v.raw.resize(n * least);
    if (n > 0) c.read(v.raw.data(), v.raw.size(), of);
    if (v.element_type == GgufValueType::boolean)
      for (std::size_t i = 0; i < n; ++i)
        if (v.raw[i] > 1)
          c.fail(what + "[" + std::to_string(i) + "]: a bool of " + std::to_string(v.raw[i]) + " (expected 0 or 1)");
  }
}

GgufValue read_value(Cursor& c, GgufValueType type, const std::string& what, std::size_t depth, Budget& budget) {
  GgufValue v;
  v.type = type;
  if (type == GgufValueType::string) {
    v.string = c.string(what);
  } else if (type == GgufValueType::array) {
    read_array(c, v, what, depth, budget);
  } else {
    unsigned char b[8];
    const std::size_t n = scalar_bytes(type);
    c.read(b, n, what);
    if (type == GgufValueType::f32) {
      float f;
      std::memcpy(&f, b, 4);
      v.real = f;
    } else if (type == GgufValueType::f64) {
      std::memcpy(&v.real, b, 8);
    } else if (type == GgufValueType::boolean) {
      if (b[0] > 1) c.fail(what + ": a bool of " + std::to_string(b[0]) + " (expected 0 or 1)");
      v.integer = b[0];
      v.unsigned_integer = b[0];
    } else if (is_signed(type)) {
      v.integer = load_signed(b, n);
      v.unsigned_integer = v.integer >= 0 ? static_cast<std::uint64_t>(v.integer) : 0;
    } else {
      v.unsigned_integer = load_unsigned(b, n);
      v.integer = v.unsigned_integer <= static_cast<std::uint64_t>(INT64_MAX)
                      ? static_cast<std::int64_t>(v.unsigned_integer)
                      : 0;
    }
  }
  return v;
}

std::string hex_bytes(const unsigned char* p, std::size_t n) {
  std::string s;
  char b[4];
  for (std::size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, "%02x", p[i]);
    if (i) s += ' ';
    s += b;
  }
  return s;
}

}  // namespace

GgufFile::GgufFile(const std::string& path) : path_(path) {
  int fd = -1;
  if (std::string why = grad::detail::open_regular_file(path, fd, file_size_); !why.empty())
    throw Error("grad::hf: GGUF '" + path + "': " + why);
  // The descriptor is closed on every way out; the mapping outlives it.
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  Cursor c(path, fd, file_size_);

  // ---- header ----
  unsigned char magic[4];
  if (file_size_ < 4) c.fail("the file is " + std::to_string(file_size_) + " bytes, shorter than GGUF's magic");
  c.read(magic, 4, "the magic");
  if (std::memcmp(magic, "GGUF", 4) != 0)
    c.fail("the magic is " + hex_bytes(magic, 4) + " (expected \"GGUF\", 47 47 55 46): not a GGUF file");
  version_ = c.get<std::uint32_t>("the version");
  if (version_ == 1)
    c.fail(
        "GGUF version 1 (32-bit counts, llama.cpp before August 2023) is not read (expected version 2 or 3): "
        "convert the model again with a current llama.cpp");
  if (version_ == 0x02000000u || version_ == 0x03000000u)
    c.fail("a big-endian GGUF (version " + std::to_string(version_ >> 24) +
           " in big-endian bytes) is not read (expected a little-endian file)");
  if (version_ != 2 && version_ != 3) c.fail("GGUF version " + std::to_string(version_) + " (expected 2 or 3)");
  const auto tensor_count = c.get<std::uint64_t>("the tensor count");
  const auto kv_count = c.get<std::uint64_t>("the metadata count");

  // ---- metadata ----
  // Each pair takes at least a key's length (8), one byte of key, a type (4) and a byte of value.
  if (kv_count > c.left() / 14)
    c.fail("the metadata count " + std::to_string(kv_count) + ": at least 14 bytes each, more than the " +
           std::to_string(c.left()) + " bytes left in the file");
  metadata_.reserve(static_cast<std::size_t>(kv_count));
  std::unordered_set<std::string> keys;
  Budget budget;
  for (std::uint64_t i = 0; i < kv_count; ++i) {
    const std::string where = "metadata pair " + std::to_string(i);
    std::string key = c.string(where + "'s key", 65535);
    if (key.empty()) c.fail(where + ": an empty key");
    const std::string named = "metadata '" + detail::text_excerpt(key) + "'";
    if (keys.contains(key)) c.fail(named + " (pair " + std::to_string(i) + ") is given twice");
    const GgufValueType type = value_type(c, named + "'s value type");
    GgufValue value = read_value(c, type, named, 0, budget);
    keys.insert(key);
    metadata_.push_back({std::move(key), std::move(value)});
  }
  if (const GgufValue* a = find("general.alignment")) {
    const std::optional<std::uint64_t> n = a->as_size();
    if (a->type != GgufValueType::u32 || !n || *n == 0 || (*n & (*n - 1)) != 0)
      c.fail("metadata 'general.alignment' is " + a->describe() + " (expected a u32 power of two)");
    alignment_ = *n;
  }

  // ---- tensor infos ----
  // Each takes at least a name's length (8) and a byte of it, n_dims (4), one dim (8), type (4), offset (8).
  if (tensor_count > c.left() / 33)
    c.fail("the tensor count " + std::to_string(tensor_count) + ": at least 33 bytes each, more than the " +
           std::to_string(c.left()) + " bytes left in the file");
  tensors_.reserve(static_cast<std::size_t>(tensor_count));
  for (std::uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo t;
    t.name = c.string("tensor " + std::to_string(i) + "'s name", max_name_bytes);
    const std::string who = "tensor '" + detail::text_excerpt(t.name) + "'";
    if (t.name.empty()) c.fail("tensor " + std::to_string(i) + ": an empty name");
    if (by_name_.contains(t.name)) c.fail(who + " (tensor " + std::to_string(i) + ") is given twice");
    by_name_.emplace(t.name, tensors_.size());
    const auto n_dims = c.get<std::uint32_t>(who + "'s n_dims");
    if (n_dims < 1 || n_dims > 4) c.fail(who + ": n_dims " + std::to_string(n_dims) + " (expected 1 .. 4)");
    t.elements = 1;
    bool overflow = false;
    for (std::uint32_t d = 0; d < n_dims; ++d) {
      const auto x = c.get<std::uint64_t>(who + "'s ne[" + std::to_string(d) + "]");
      if (x == 0) c.fail(who + ": ne[" + std::to_string(d) + "] is 0 (expected at least 1)");
      t.ne.push_back(x);
      overflow = __builtin_mul_overflow(t.elements, x, &t.elements) || overflow;
    }
    auto dims = [&] {
      std::string s = "{";
      for (std::size_t d = 0; d < t.ne.size(); ++d) s += (d ? ", " : "") + std::to_string(t.ne[d]);
      return s + "}";
    };
    // ggml counts elements and bytes in int64.
    if (overflow || t.elements > static_cast<std::uint64_t>(INT64_MAX))
      c.fail(who + ": ne " + dims() + " holds more than 2^63 elements");
    t.type = c.get<std::uint32_t>(who + "'s type");
    const GgmlTypeInfo* info = ggml_type_info(t.type);
    if (!info) c.fail(who + ": type " + std::to_string(t.type) + " is no ggml type this reader knows");
    if (t.ne[0] % info->block_elements != 0)
      c.fail(who + ": ne " + dims() + " of type " + std::string(info->name) + ": ne[0] is not a multiple of its " +
             std::to_string(info->block_elements) + "-value blocks");
    if (__builtin_mul_overflow(t.elements / info->block_elements, std::uint64_t{info->block_bytes}, &t.byte_count))
      c.fail(who + ": ne " + dims() + " of type " + std::string(info->name) + " is more than 2^64 bytes");
    t.offset = c.get<std::uint64_t>(who + "'s offset");
    if (t.offset % alignment_ != 0)
      c.fail(who + ": offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
             std::to_string(alignment_));
    tensors_.push_back(std::move(t));
  }

  // ---- the data section ----
  const std::uint64_t end_of_infos = c.at();
  data_offset_ = end_of_infos + (alignment_ - end_of_infos % alignment_) % alignment_;
  if (!tensors_.empty() && data_offset_ > file_size_)
    c.fail("the data section would start at byte " + std::to_string(data_offset_) + " (after the tensor infos, at " +
           "the alignment " + std::to_string(alignment_) + "), past the end of the file at byte " +
           std::to_string(file_size_) + " (truncated?)");
  const std::uint64_t data_bytes = tensors_.empty() ? 0 : file_size_ - data_offset_;
  std::vector<const GgufTensorInfo*> by_offset;
  for (const GgufTensorInfo& t : tensors_) {
    if (t.offset > data_bytes || t.byte_count > data_bytes - t.offset)
      c.fail("tensor '" + detail::text_excerpt(t.name) + "': bytes [" + std::to_string(t.offset) + ", " +
             (t.byte_count > UINT64_MAX - t.offset ? std::string("2^64+") : std::to_string(t.offset + t.byte_count)) +
             ") of the data section, which holds " + std::to_string(data_bytes) + " (the file " +
             std::to_string(file_size_) + " bytes, the data from byte " + std::to_string(data_offset_) +
             "): truncated, or a wrong offset or shape");
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* x, const GgufTensorInfo* y) { return x->offset < y->offset; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo &a = *by_offset[i - 1], &b = *by_offset[i];
    if (a.offset + a.byte_count > b.offset)
      c.fail("tensors '" + detail::text_excerpt(a.name) + "' (bytes [" + std::to_string(a.offset) + ", " +
             std::to_string(a.offset + a.byte_count) + ")) and '" + detail::text_excerpt(b.name) + "' (from byte " +
             std::to_string(b.offset) + ") overlap in the data section");
  }

  if (!tensors_.empty()) {
    void* m = ::mmap(nullptr, static_cast<std::size_t>(file_size_), PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) c.fail(std::string("cannot map the file: ") + std::strerror(errno));
    map_ = static_cast<const unsigned char*>(m);
    map_size_ = static_cast<std::size_t>(file_size_);
  }
}

GgufFile::~GgufFile() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), map_size_);
}

GgufFile::GgufFile(GgufFile&& other) noexcept
    : path_(std::move(other.path_)),
      version_(other.version_),
      alignment_(other.alignment_),
      data_offset_(other.data_offset_),
      file_size_(other.file_size_),
      metadata_(std::move(other.metadata_)),
      tensors_(std::move(other.tensors_)),
      by_name_(std::move(other.by_name_)),
      map_(other.map_),
      map_size_(other.map_size_) {
  other.map_ = nullptr;
  other.map_size_ = 0;
}

const GgufValue* GgufFile::find(std::string_view key) const {
  for (const GgufKeyValue& kv : metadata_)
    if (kv.key == key) return &kv.value;
  return nullptr;
}

const GgufTensorInfo* GgufFile::tensor(std::string_view name) const {
  const auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &tensors_[it->second];
}

std::span<const unsigned char> GgufFile::bytes(const GgufTensorInfo& t) const {
  // Checked against the file when it was opened (offset + byte_count within the data section).
  if (!map_) return {};
  return {map_ + data_offset_ + t.offset, static_cast<std::size_t>(t.byte_count)};
}

void GgufFile::release(const GgufTensorInfo& t) const {
  if (!map_) return;
  // The whole pages inside the tensor (a neighbour's bytes on a shared page stay).
  const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(map_ + data_offset_ + t.offset);
  const std::uintptr_t first = (begin + page - 1) / page * page, last = (begin + t.byte_count) / page * page;
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

}  // namespace grad::hf
