// Checkpoints: every optimizer parameter's value plus the optimizer's state
// in one versioned binary file.
//
//   grad::CheckpointResult r = grad::save_checkpoint("run.ckpt", tape, opt);
//   if (!r) std::fprintf(stderr, "%s\n", r.error.c_str());
//   ...  // later, a fresh tape and optimizer built the same way
//   if (auto r = grad::load_checkpoint("run.ckpt", tape, opt); !r) ...
//
// What is saved: the parameters added to `opt`, in add order (values, shapes,
// L2 coefficients), the optimizer's settings (lr, clip, and for Adam beta1,
// beta2, eps), its step count and, for Adam, the running powers b1^t, b2^t
// and both moments. Parameters never added to the optimizer are not saved:
// they are the program's to rebuild. Loading restores the settings too, so
// that a resumed run continues bit for bit; call set_lr() afterwards to
// change the rate. A learning-rate schedule (opt.set_schedule) is not in the
// file: attach the same one to the optimizer the checkpoint is loaded into,
// before or after loading; it continues from the restored step count (the
// saved lr is then the schedule's next rate, and is recomputed from it).
//
// Saving writes a temporary file of its own ("<path>.tmp.XXXXXX", unique, in
// the same directory), fsyncs it, renames it over `path` and fsyncs the
// directory, so a crash leaves either the old checkpoint or the new one,
// never half of one, and two processes saving to one path never write into
// each other's temporary file: the last rename wins, whole.
// Loading accepts regular files only (a directory, FIFO or device is refused
// by name, before any read), reads the header first and then exactly the
// size it promises, and checks the whole file (size, magic, version,
// checksum, dtype, optimizer kind, settings in range, parameter count and
// every shape) before writing anything: on failure the tape and optimizer
// are unchanged and the message says which check failed.
//
// Format, version 1 (native byte order, recorded as a marker and checked):
//   header   "GRADCKPT" u32 version  u32 byte-order marker 0x01020304
//            u32 dtype (1 = float64, 2 = float32)  u32 optimizer kind (1 sgd, 2 adam)
//            u64 payload bytes
//   payload  u64 parameter count  u64 steps
//            T lr  T clip  T beta1  T beta2  T eps  T beta1^t  T beta2^t   (SGD: last five zero)
//            per parameter: u32 rank, u64 dims[rank], T l2
//            per parameter: values; then (Adam) all first moments, all second moments
//   trailer  u64 FNV-1a hash of every byte before it
// Version 2 (written only when the caller passes notes; version 1 files load
// as before) appends to the payload
//            u32 note count, per note: u32 key length, key bytes, u64 value
// Notes are named integers a caller keeps with the state: grad::dist saves
// its shard count (and combine mode) there and refuses to resume with
// another, since another count sums the gradient in another order.
//
// The frame (header, checksum trailer), the atomic write and the bounded
// read are shared with named model files (grad/model_file.hpp: detail::frame,
// write_atomically, read_framed).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "grad/opt.hpp"

namespace grad {

struct [[nodiscard]] CheckpointResult {
  std::string error;  // empty on success; otherwise "grad: checkpoint '<path>': <what failed>"
  bool ok() const { return error.empty(); }
  explicit operator bool() const { return ok(); }
};

inline constexpr std::uint32_t checkpoint_version = 2;  // the newest version written and read (1 still reads)

// A named integer saved with a checkpoint (see "Version 2" above).
struct CheckpointNote {
  std::string key;
  std::uint64_t value = 0;
};

namespace detail {

inline constexpr char checkpoint_magic[8] = {'G', 'R', 'A', 'D', 'C', 'K', 'P', 'T'};
inline constexpr std::uint32_t byte_order_marker = 0x01020304;
inline constexpr std::size_t checkpoint_header_bytes = 8 + 4 * 4 + 8;

inline std::uint64_t fnv1a(std::span<const unsigned char> bytes) {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

template <class T>
constexpr std::uint32_t dtype_code = std::is_same_v<T, double> ? 1 : 2;
inline const char* dtype_name(std::uint32_t code) { return code == 1 ? "float64" : code == 2 ? "float32" : "unknown"; }
inline const char* kind_name(std::uint32_t k) { return k == 1 ? "sgd" : k == 2 ? "adam" : "unknown"; }

struct ByteWriter {
  std::vector<unsigned char> bytes;
  template <class V>
  void put(const V& v) {
    const auto* p = reinterpret_cast<const unsigned char*>(&v);
    bytes.insert(bytes.end(), p, p + sizeof(V));
  }
  template <class V>
  void put_all(std::span<const V> vs) {
    const auto* p = reinterpret_cast<const unsigned char*>(vs.data());
    bytes.insert(bytes.end(), p, p + vs.size_bytes());
  }
};

// Bounds-checked reads; `short_read` is set instead of reading past the end.
struct ByteReader {
  std::span<const unsigned char> bytes;
  std::size_t at = 0;
  bool short_read = false;
  template <class V>
  V get() {
    V v{};
    if (at + sizeof(V) > bytes.size()) {
      short_read = true;
      return v;
    }
    std::memcpy(&v, bytes.data() + at, sizeof(V));
    at += sizeof(V);
    return v;
  }
  template <class V>
  std::span<const unsigned char> take(std::size_t count) {
    if (count > (bytes.size() - at) / sizeof(V)) {
      short_read = true;
      return {};
    }
    auto s = bytes.subspan(at, count * sizeof(V));
    at += count * sizeof(V);
    return s;
  }
};

// Reads a checkpoint file of file_size bytes: the header, then as many bytes
// as it promises (capped by the file's size, so a lying header cannot make
// this allocate more than the file holds). "" or what went wrong.
inline std::string read_checkpoint_bytes(int fd, std::uint64_t file_size, std::vector<unsigned char>& bytes) {
  auto read_to = [&](std::uint64_t want) -> std::string {
    const std::size_t start = bytes.size();
    bytes.resize(static_cast<std::size_t>(want));
    std::size_t at = start;
    while (at < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + at, bytes.size() - at);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return std::string("read error: ") + std::strerror(errno);
      if (n == 0) break;
      at += static_cast<std::size_t>(n);
    }
    bytes.resize(at);
    return {};
  };
  const std::uint64_t header = std::min<std::uint64_t>(file_size, checkpoint_header_bytes);
  if (std::string e = read_to(header); !e.empty()) return e;
  if (bytes.size() < checkpoint_header_bytes) return {};  // reported as truncated by the caller
  std::uint64_t payload = 0;
  std::memcpy(&payload, bytes.data() + checkpoint_header_bytes - sizeof payload, sizeof payload);
  const std::uint64_t frame = checkpoint_header_bytes + sizeof(std::uint64_t);
  if (file_size < frame || payload > file_size - frame) return {};  // the caller says what the header promised
  return read_to(frame + payload);
}

// ---- the file frame shared by checkpoints and model files (model_file.hpp) ----
//   header   magic[8] u32 version  u32 byte-order marker  u32 dtype  u32 kind  u64 payload bytes
//   payload  (the caller's)
//   trailer  u64 FNV-1a hash of every byte before it

inline std::vector<unsigned char> frame(const char (&magic)[8], std::uint32_t version, std::uint32_t dtype,
                                        std::uint32_t kind, const std::vector<unsigned char>& payload) {
  ByteWriter file;
  for (char c : magic) file.put(c);
  file.put(version);
  file.put(byte_order_marker);
  file.put(dtype);
  file.put(kind);
  file.put(static_cast<std::uint64_t>(payload.size()));
  file.bytes.insert(file.bytes.end(), payload.begin(), payload.end());
  file.put(fnv1a(file.bytes));
  return std::move(file.bytes);
}

// Writes `bytes` to `path` atomically: a temporary file of its own
// ("<path>.tmp.XXXXXX", unique, same directory), fsync, rename over path,
// fsync of the directory. "" or what failed.
inline std::string write_atomically(const std::string& path, const std::vector<unsigned char>& bytes,
                                    const char* noun) {
  std::string tmp = path + ".tmp.XXXXXX";
  const int fd = ::mkostemp(tmp.data(), O_CLOEXEC);  // a name no other writer has
  if (fd < 0) return "cannot create a temporary file '" + tmp + "': " + std::strerror(errno);
  ::fchmod(fd, 0644);  // mkostemp creates 0600; a checkpoint is as readable as any output file
  std::size_t written = 0;
  while (written < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return "writing '" + tmp + "' failed: " + why;
    }
    written += static_cast<std::size_t>(n);
  }
  // The data must be on disk before the rename makes it the file.
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    return "flushing '" + tmp + "' failed: " + why;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    return "renaming '" + tmp + "' into place failed: " + why;
  }
  // The rename itself is durable only once the directory entry is on disk.
  // (The directory is the path up to its last '/': no <filesystem>, which
  // costs every unit that includes grad.hpp a third of a second to parse.)
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd < 0 || ::fsync(dfd) != 0) {
    const std::string why = std::strerror(errno);
    if (dfd >= 0) ::close(dfd);
    return "the " + std::string(noun) + " was written, but flushing its directory failed: " + why;
  }
  ::close(dfd);
  return {};
}

struct Frame {
  std::uint32_t version = 0, dtype = 0, kind = 0;
  std::uint64_t payload_bytes = 0;
};

// Reads and checks a framed file: regular files only (a directory, FIFO or
// device is refused by name, before any read), no more bytes than the header
// promises and the file holds, then magic, version, byte order, size and
// checksum. On success `bytes` holds the whole file and `f` its header
// (the payload starts at checkpoint_header_bytes). "" or what failed;
// `noun` names the kind of file in messages ("checkpoint", "model file").
// Versions oldest .. newest are read.
inline std::string read_framed(const std::string& path, const char (&magic)[8], std::uint32_t oldest,
                               std::uint32_t newest, const char* noun, std::vector<unsigned char>& bytes, Frame& f) {
  const std::string a_noun = std::string(noun);
  std::uint64_t file_size = 0;
  {
    // O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return std::string("cannot open: ") + std::strerror(errno);
    struct stat st {};
    const bool stat_ok = ::fstat(fd, &st) == 0;
    if (!stat_ok || !S_ISREG(st.st_mode)) {
      const std::string why = !stat_ok              ? std::string("cannot stat: ") + std::strerror(errno)
                              : S_ISDIR(st.st_mode) ? "is a directory, not a " + a_noun + " file"
                              : S_ISFIFO(st.st_mode)
                                  ? "is a FIFO, not a " + a_noun + " file (regular files only)"
                                  : "is a device or socket, not a " + a_noun + " file (regular files only)";
      ::close(fd);
      return why;
    }
    file_size = static_cast<std::uint64_t>(st.st_size);
    // The header first; then exactly what it promises, never more than the file holds.
    const std::string error = read_checkpoint_bytes(fd, file_size, bytes);
    ::close(fd);
    if (!error.empty()) return error;
  }
  if (bytes.size() < checkpoint_header_bytes)
    return "truncated: " + std::to_string(bytes.size()) + " bytes, shorter than the " +
           std::to_string(checkpoint_header_bytes) + "-byte header";
  if (std::memcmp(bytes.data(), magic, 8) != 0) return "not a grad " + a_noun + " (bad magic bytes)";
  ByteReader header{bytes};
  header.at = 8;
  f.version = header.get<std::uint32_t>();
  const auto order = header.get<std::uint32_t>();
  f.dtype = header.get<std::uint32_t>();
  f.kind = header.get<std::uint32_t>();
  f.payload_bytes = header.get<std::uint64_t>();
  if (f.version < oldest || f.version > newest)
    return "unsupported format version " + std::to_string(f.version) + "; this build reads version " +
           (oldest == newest ? std::to_string(newest) : std::to_string(oldest) + " to " + std::to_string(newest));
  if (order != byte_order_marker) return "written on a machine with a different byte order";
  // Compared without adding to payload_bytes, which may be anything up to 2^64 - 1.
  constexpr std::uint64_t frame_bytes = checkpoint_header_bytes + sizeof(std::uint64_t);
  if (file_size < frame_bytes || f.payload_bytes > file_size - frame_bytes)
    return "truncated: " + std::to_string(file_size) + " bytes, the header promises " +
           (f.payload_bytes <= UINT64_MAX - frame_bytes
                ? std::to_string(frame_bytes + f.payload_bytes)
                : "more than 2^64 (a payload of " + std::to_string(f.payload_bytes) + " bytes)");
  const std::uint64_t expected = frame_bytes + f.payload_bytes;
  if (file_size > expected)
    return "corrupted: " + std::to_string(file_size - expected) + " unexpected bytes after the checksum";
  if (bytes.size() != expected)
    return "read " + std::to_string(bytes.size()) + " of " + std::to_string(expected) +
           " bytes: the file changed while it was read";
  std::uint64_t stored_hash;
  std::memcpy(&stored_hash, bytes.data() + expected - sizeof(std::uint64_t), sizeof stored_hash);
  if (fnv1a(std::span(bytes).first(expected - sizeof(std::uint64_t))) != stored_hash)
    return "checksum mismatch: the file is corrupted";
  return {};
}

// What is wrong with a checkpoint's optimizer settings ("" if nothing), by
// the same ranges the optimizers' constructors enforce (invalid_setting).
template <class Access, class Settings>
std::string settings_error(const Settings& s) {
  std::string why = invalid_setting("lr", s.lr);
  if (why.empty()) why = invalid_setting("clip", s.clip);
  if constexpr (Access::is_adam) {
    const std::pair<const char*, double> adam[] = {
        {"beta1", s.beta1}, {"beta2", s.beta2}, {"eps", s.eps}, {"beta1^t", s.beta1_power}, {"beta2^t", s.beta2_power}};
    for (const auto& [name, value] : adam)
      if (why.empty()) why = invalid_setting(name, value);
  }
  return why;
}

}  // namespace detail

// The optimizer state a checkpoint reads and writes (a friend of both).
template <class T, class Opt>
struct CheckpointAccess {
  struct Settings {
    std::uint64_t steps = 0;
    T lr{}, clip{}, beta1{}, beta2{}, eps{}, beta1_power{}, beta2_power{};
  };
  static constexpr bool is_adam = std::is_same_v<Opt, Adam<T>>;
  // f(settings field, optimizer field) for every setting: the one list that
  // both directions below walk (o and s const or not, as each needs).
  template <class O, class S, class F>
  static void each_setting(O& o, S& s, F f) {
    f(s.steps, o.steps_);
    f(s.lr, o.lr_);
    f(s.clip, o.clip_);
    if constexpr (is_adam) {
      f(s.beta1, o.beta1_);
      f(s.beta2, o.beta2_);
      f(s.eps, o.eps_);
      f(s.beta1_power, o.beta1_power_);
      f(s.beta2_power, o.beta2_power_);
    }
  }
  static Settings settings(const Opt& o) {
    Settings s;
    each_setting(o, s, [](auto& to, const auto& from) { to = from; });
    return s;
  }
  static void restore(Opt& o, const Settings& s) {
    each_setting(o, s, [](const auto& from, auto& to) { to = from; });
    // An attached schedule continues from the restored step count.
    if (o.schedule_) o.lr_ = static_cast<T>(o.schedule_->at(o.steps_ + 1));
  }
  static std::vector<typename Optimizer<T>::Entry>& entries(Opt& o) { return o.entries_; }
  static std::vector<T>* moments(Opt& o, int which) {
    if constexpr (is_adam)
      return which == 0 ? &o.m_ : &o.v_;
    else
      return nullptr;
  }
};

template <class T, template <class> class OptT>
CheckpointResult save_checkpoint(const std::string& path, const Tape<T>& tp, const OptT<T>& opt,
                                 std::span<const CheckpointNote> notes = {}) {
  using Access = CheckpointAccess<T, OptT<T>>;
  auto failed = [&](const std::string& what) { return CheckpointResult{"grad: checkpoint '" + path + "': " + what}; };
  if (!tp.ok()) return failed("the tape is poisoned (" + tp.error() + "); refusing to save");
  const auto& entries = opt.params();
  for (std::size_t i = 0; i < entries.size(); ++i)
    if (tp.value(entries[i].var).empty())
      return failed("optimizer parameter " + std::to_string(i + 1) + " is not a live node of this tape");

  detail::ByteWriter payload;
  const auto s = Access::settings(opt);
  payload.put(static_cast<std::uint64_t>(entries.size()));
  payload.put(s.steps);
  for (T x : {s.lr, s.clip, s.beta1, s.beta2, s.eps, s.beta1_power, s.beta2_power}) payload.put(x);
  for (const auto& e : entries) {
    const View<T> v = tp.value(e.var);
    payload.put(static_cast<std::uint32_t>(v.rank()));
    for (std::size_t d : v.shape) payload.put(static_cast<std::uint64_t>(d));
    payload.put(e.l2);
  }
  for (const auto& e : entries) payload.put_all(tp.value(e.var).data);
  if constexpr (Access::is_adam) {
    payload.put_all(opt.first_moments());
    payload.put_all(opt.second_moments());
  }
  if (!notes.empty()) {
    payload.put(static_cast<std::uint32_t>(notes.size()));
    for (const CheckpointNote& n : notes) {
      payload.put(static_cast<std::uint32_t>(n.key.size()));
      payload.bytes.insert(payload.bytes.end(), n.key.begin(), n.key.end());
      payload.put(n.value);
    }
  }

  const std::vector<unsigned char> file =
      detail::frame(detail::checkpoint_magic, notes.empty() ? 1 : 2, detail::dtype_code<T>,
                    static_cast<std::uint32_t>(OptT<T>::kind), payload.bytes);
  if (std::string why = detail::write_atomically(path, file, "checkpoint"); !why.empty()) return failed(why);
  return {};
}

template <class T, template <class> class OptT>
// `expect`: notes the file must agree with: a key the file holds with another
// value refuses the load (before anything is written); a key it lacks is
// accepted (a version 1 file, or a run that did not record it).
// `notes`: when given, receives every note the file holds (none for a
// version 1 file), on success only (grad::LoopState reads a loop's state
// from them).
CheckpointResult load_checkpoint(const std::string& path, Tape<T>& tp, OptT<T>& opt,
                                 std::span<const CheckpointNote> expect = {},
                                 std::vector<CheckpointNote>* notes = nullptr) {
  using Access = CheckpointAccess<T, OptT<T>>;
  auto failed = [&](const std::string& what) { return CheckpointResult{"grad: checkpoint '" + path + "': " + what}; };
  if (!tp.ok()) return failed("the tape is poisoned (" + tp.error() + "); refusing to load");

  std::vector<unsigned char> bytes;
  detail::Frame f;
  if (std::string why =
          detail::read_framed(path, detail::checkpoint_magic, 1, checkpoint_version, "checkpoint", bytes, f);
      !why.empty())
    return failed(why);
  const std::uint32_t dtype = f.dtype, kind = f.kind;
  const std::uint64_t payload_bytes = f.payload_bytes;

  // ---- what it holds versus what we have ----
  if (dtype != detail::dtype_code<T>)
    return failed(std::string("dtype mismatch: the file holds ") + detail::dtype_name(dtype) + " values, the tape is " +
                  detail::dtype_name(detail::dtype_code<T>));
  if (kind != static_cast<std::uint32_t>(OptT<T>::kind))
    return failed(std::string("optimizer mismatch: the file holds ") + detail::kind_name(kind) +
                  " state, loading into " + detail::kind_name(static_cast<std::uint32_t>(OptT<T>::kind)));
  detail::ByteReader r{std::span(bytes).subspan(detail::checkpoint_header_bytes, payload_bytes)};
  const auto count = r.get<std::uint64_t>();
  typename Access::Settings s;
  s.steps = r.get<std::uint64_t>();
  for (T* x : {&s.lr, &s.clip, &s.beta1, &s.beta2, &s.eps, &s.beta1_power, &s.beta2_power}) *x = r.get<T>();
  if (const std::string why = detail::settings_error<Access>(s); !why.empty())
    return failed("invalid setting in the file: " + why);
  const auto& entries = opt.params();
  if (count != entries.size())
    return failed("parameter count mismatch: the file holds " + std::to_string(count) +
                  " parameters, the optimizer has " + std::to_string(entries.size()));
  std::vector<T> l2(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const auto rank = r.get<std::uint32_t>();
    if (r.short_read || rank > max_rank)
      return failed("corrupted: parameter " + std::to_string(i + 1) + " has rank " + std::to_string(rank));
    Shape shape(rank);
    for (std::size_t& d : shape) d = static_cast<std::size_t>(r.get<std::uint64_t>());
    l2[i] = r.get<T>();
    if (const std::string why = invalid_setting("l2", l2[i]); !r.short_read && !why.empty())
      return failed("invalid setting in the file: parameter " + std::to_string(i + 1) + ": " + why);
    const View<T> have = tp.value(entries[i].var);
    if (have.empty())
      return failed("optimizer parameter " + std::to_string(i + 1) + " is not a live node of this tape");
    if (r.short_read) break;
    if (!std::equal(shape.begin(), shape.end(), have.shape.begin(), have.shape.end()))
      return failed("shape mismatch: parameter " + std::to_string(i + 1) + " is " + shape_string(shape) +
                    " in the file but " + shape_string(have.shape) + " in the optimizer");
  }
  const std::size_t n = opt.elements();
  const auto values = r.template take<T>(n);
  std::span<const unsigned char> m, v;
  if constexpr (Access::is_adam) {
    m = r.template take<T>(n);
    v = r.template take<T>(n);
  }
  std::vector<CheckpointNote> held;
  if (f.version >= 2) {
    const auto note_count = r.get<std::uint32_t>();
    for (std::uint32_t k = 0; k < note_count && !r.short_read; ++k) {
      const auto length = r.get<std::uint32_t>();
      const auto key = r.template take<char>(length);
      const auto value = r.get<std::uint64_t>();
      if (r.short_read) break;
      const std::string_view name(reinterpret_cast<const char*>(key.data()), key.size());
      for (const CheckpointNote& e : expect)
        if (e.key == name && e.value != value)
          return failed("the file was written with " + e.key + " = " + std::to_string(value) + "; this run has " +
                        std::to_string(e.value));
      if (notes) held.push_back({std::string(name), value});
    }
  }
  if (r.short_read || r.at != r.bytes.size())
    return failed("corrupted: the payload does not match its own parameter list");

  // ---- every check passed: write ----
  Access::restore(opt, s);
  auto& list = Access::entries(opt);
  for (std::size_t i = 0; i < list.size(); ++i) {
    list[i].l2 = l2[i];
    std::memcpy(tp.leaf_value(list[i].var).data(), values.data() + list[i].offset * sizeof(T),
                list[i].size * sizeof(T));
  }
  if constexpr (Access::is_adam) {
    std::memcpy(Access::moments(opt, 0)->data(), m.data(), m.size());
    std::memcpy(Access::moments(opt, 1)->data(), v.data(), v.size());
  }
  if (notes) *notes = std::move(held);
  return {};
}

}  // namespace grad
