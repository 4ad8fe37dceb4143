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
// change the rate.
//
// Saving writes "<path>.tmp" and renames it over `path` after fsync, so a
// crash leaves either the old checkpoint or the new one, never half of one.
// Loading reads and checks the whole file first (size, magic, version,
// checksum, dtype, optimizer kind, parameter count and every shape) and only
// then writes anything: on failure the tape and optimizer are unchanged and
// the message says which check failed.
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
#pragma once

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include "grad/opt.hpp"

namespace grad {

struct [[nodiscard]] CheckpointResult {
  std::string error;  // empty on success; otherwise "grad: checkpoint '<path>': <what failed>"
  bool ok() const { return error.empty(); }
  explicit operator bool() const { return ok(); }
};

inline constexpr std::uint32_t checkpoint_version = 1;

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
CheckpointResult save_checkpoint(const std::string& path, const Tape<T>& tp, const OptT<T>& opt) {
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

  detail::ByteWriter file;
  for (char c : detail::checkpoint_magic) file.put(c);
  file.put(checkpoint_version);
  file.put(detail::byte_order_marker);
  file.put(detail::dtype_code<T>);
  file.put(static_cast<std::uint32_t>(OptT<T>::kind));
  file.put(static_cast<std::uint64_t>(payload.bytes.size()));
  file.bytes.insert(file.bytes.end(), payload.bytes.begin(), payload.bytes.end());
  file.put(detail::fnv1a(file.bytes));

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return failed("cannot create '" + tmp + "': " + std::strerror(errno));
  std::size_t written = 0;
  while (written < file.bytes.size()) {
    const ssize_t n = ::write(fd, file.bytes.data() + written, file.bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      ::unlink(tmp.c_str());
      return failed("writing '" + tmp + "' failed: " + why);
    }
    written += static_cast<std::size_t>(n);
  }
  // The data must be on disk before the rename makes it the checkpoint.
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    return failed("flushing '" + tmp + "' failed: " + why);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    ::unlink(tmp.c_str());
    return failed("renaming '" + tmp + "' into place failed: " + why);
  }
  return {};
}

template <class T, template <class> class OptT>
CheckpointResult load_checkpoint(const std::string& path, Tape<T>& tp, OptT<T>& opt) {
  using Access = CheckpointAccess<T, OptT<T>>;
  auto failed = [&](const std::string& what) { return CheckpointResult{"grad: checkpoint '" + path + "': " + what}; };
  if (!tp.ok()) return failed("the tape is poisoned (" + tp.error() + "); refusing to load");

  std::vector<unsigned char> bytes;
  {
    std::FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return failed(std::string("cannot open: ") + std::strerror(errno));
    unsigned char buf[1 << 16];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) bytes.insert(bytes.end(), buf, buf + n);
    const bool read_error = std::ferror(f);
    std::fclose(f);
    if (read_error) return failed("read error");
  }

  // ---- the frame: magic, version, size, checksum ----
  if (bytes.size() < detail::checkpoint_header_bytes)
    return failed("truncated: " + std::to_string(bytes.size()) + " bytes, shorter than the " +
                  std::to_string(detail::checkpoint_header_bytes) + "-byte header");
  if (std::memcmp(bytes.data(), detail::checkpoint_magic, 8) != 0)
    return failed("not a grad checkpoint (bad magic bytes)");
  detail::ByteReader header{bytes};
  header.at = 8;
  const auto version = header.get<std::uint32_t>();
  const auto order = header.get<std::uint32_t>();
  const auto dtype = header.get<std::uint32_t>();
  const auto kind = header.get<std::uint32_t>();
  const auto payload_bytes = header.get<std::uint64_t>();
  if (version != checkpoint_version)
    return failed("unsupported format version " + std::to_string(version) + "; this build reads version " +
                  std::to_string(checkpoint_version));
  if (order != detail::byte_order_marker) return failed("written on a machine with a different byte order");
  const std::uint64_t expected = detail::checkpoint_header_bytes + payload_bytes + sizeof(std::uint64_t);
  if (payload_bytes > bytes.size() || bytes.size() < expected)
    return failed("truncated: " + std::to_string(bytes.size()) + " bytes, the header promises " +
                  std::to_string(expected));
  if (bytes.size() > expected)
    return failed("corrupted: " + std::to_string(bytes.size() - expected) + " unexpected bytes after the checksum");
  std::uint64_t stored_hash;
  std::memcpy(&stored_hash, bytes.data() + expected - sizeof(std::uint64_t), sizeof stored_hash);
  if (detail::fnv1a(std::span(bytes).first(expected - sizeof(std::uint64_t))) != stored_hash)
    return failed("checksum mismatch: the file is corrupted");

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
  return {};
}

}  // namespace grad
