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
// beta2, eps, its form; SGD's momentum, dampening, Nesterov; AdamW's weight
// decays), its step count and, for Adam, the running powers b1^t, b2^t
// and both moments; SGD's momentum buffers; the learning-rate schedule with
// its state (a plateau schedule's rate, best metric and counters).
// Parameters never added to the optimizer are not saved: they are the
// program's to rebuild. Loading restores the settings and the schedule too,
// so that a resumed run continues bit for bit without re-attaching
// anything; call set_lr() or set_schedule() afterwards to change the rate.
// A file without a schedule (one saved without, or by an older build) keeps
// a schedule attached to the optimizer it is loaded into; it continues from
// the restored step count.
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
// Version 3 (written only when the optimizer has state versions 1 and 2
// cannot hold: AdamW, Adam's PyTorch form, SGD momentum or a schedule; the
// note list is then always there, perhaps empty) appends after the notes
//            u32 Adam form (0 efficient, 1 pytorch)  T momentum  T dampening
//            u32 nesterov  T AdamW's default weight decay   (zero where unused)
//            per parameter: T weight decay, u32 momentum buffer started
//            SGD with momentum: all momentum buffers
//            u32 schedule present; if 1: u32 shape  f64 base_lr min_lr
//            u64 warmup total  f64 gamma  u64 step_size  u64 milestone count,
//            milestones  f64 pct_start div_factor final_div_factor  u32 mode
//            f64 factor  u64 patience  f64 threshold  u32 threshold_mode
//            u64 cooldown  f64 eps; the plateau state: f64 lr best
//            u64 bad_reports cooldown_left reports
//
// The frame (header, checksum trailer), the atomic write and the bounded
// read are shared with named model files (grad/model_file.hpp: detail::frame,
// write_atomically, read_framed).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "grad/atomic_file.hpp"
#include "grad/opt.hpp"
#include "grad/regular_file.hpp"

namespace grad {

struct [[nodiscard]] CheckpointResult {
  std::string error;  // empty on success; otherwise "grad: checkpoint '<path>': <what failed>"
  bool ok() const { return error.empty(); }
  explicit operator bool() const { return ok(); }
};

inline constexpr std::uint32_t checkpoint_version = 3;  // the newest version written and read (1 and 2 still read)

// A named integer saved with a checkpoint (see "Version 2" above).
struct CheckpointNote {
  std::string key;
  std::uint64_t value = 0;
};

namespace detail {

inline constexpr char checkpoint_magic[8] = {'G', 'R', 'A', 'D', 'C', 'K', 'P', 'T'};
inline constexpr std::uint32_t byte_order_marker = 0x01020304;
inline constexpr std::size_t checkpoint_header_bytes = 8 + 4 * 4 + 8;

// FNV-1a over `bytes`; a hash over several buffers passes the previous
// buffer's result as `h`.
inline constexpr std::uint64_t fnv1a_offset = 0xcbf29ce484222325ULL;
inline std::uint64_t fnv1a(std::span<const unsigned char> bytes, std::uint64_t h = fnv1a_offset) {
  for (unsigned char c : bytes) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}
template <class T>
std::span<const unsigned char> bytes_of(std::span<const T> xs) {
  return {reinterpret_cast<const unsigned char*>(xs.data()), xs.size_bytes()};
}

template <class T>
constexpr std::uint32_t dtype_code = std::is_same_v<T, double> ? 1 : 2;
inline const char* dtype_name(std::uint32_t code) { return code == 1 ? "float64" : code == 2 ? "float32" : "unknown"; }
inline const char* kind_name(std::uint32_t k) { return k == 1 ? "sgd" : k == 2 ? "adam" : k == 3 ? "adamw" : "unknown"; }

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
// fsync of the directory. "" or what failed. A path that names anything but
// a regular file (a FIFO, a device) is refused: the rename would replace it.
inline std::string write_atomically(const std::string& path, const std::vector<unsigned char>& bytes,
                                    const char* noun) {
  AtomicFile file;
  if (std::string why = file.open(path); !why.empty()) return why;
  if (std::string why = file.write(bytes); !why.empty()) return why;
  return file.commit(noun);
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

// A schedule and its state, as format version 3 lays them out.
inline void put_schedule(ByteWriter& w, const LrSchedule& s, const PlateauState& p) {
  w.put(static_cast<std::uint32_t>(s.shape));
  w.put(s.base_lr);
  w.put(s.min_lr);
  w.put(s.warmup);
  w.put(s.total);
  w.put(s.gamma);
  w.put(s.step_size);
  w.put(static_cast<std::uint64_t>(s.milestones.size()));
  for (std::uint64_t m : s.milestones) w.put(m);
  for (double x : {s.pct_start, s.div_factor, s.final_div_factor}) w.put(x);
  w.put(static_cast<std::uint32_t>(s.mode));
  w.put(s.factor);
  w.put(s.patience);
  w.put(s.threshold);
  w.put(static_cast<std::uint32_t>(s.threshold_mode));
  w.put(s.cooldown);
  w.put(s.eps);
  w.put(p.lr);
  w.put(p.best);
  w.put(p.bad_reports);
  w.put(p.cooldown_left);
  w.put(p.reports);
}
// The reverse; r.short_read says whether it was all there (a milestone
// count larger than the bytes left is a short read, not an allocation).
inline void get_schedule(ByteReader& r, LrSchedule& s, PlateauState& p) {
  s.shape = static_cast<LrShape>(r.get<std::uint32_t>());
  s.base_lr = r.get<double>();
  s.min_lr = r.get<double>();
  s.warmup = r.get<std::uint64_t>();
  s.total = r.get<std::uint64_t>();
  s.gamma = r.get<double>();
  s.step_size = r.get<std::uint64_t>();
  const auto milestones = r.get<std::uint64_t>();
  const auto bytes = r.take<std::uint64_t>(static_cast<std::size_t>(milestones));
  s.milestones.resize(bytes.size() / sizeof(std::uint64_t));
  if (!bytes.empty()) std::memcpy(s.milestones.data(), bytes.data(), bytes.size());
  for (double* x : {&s.pct_start, &s.div_factor, &s.final_div_factor}) *x = r.get<double>();
  s.mode = static_cast<PlateauMode>(r.get<std::uint32_t>());
  s.factor = r.get<double>();
  s.patience = r.get<std::uint64_t>();
  s.threshold = r.get<double>();
  s.threshold_mode = static_cast<ThresholdMode>(r.get<std::uint32_t>());
  s.cooldown = r.get<std::uint64_t>();
  s.eps = r.get<double>();
  p.lr = r.get<double>();
  p.best = r.get<double>();
  p.bad_reports = r.get<std::uint64_t>();
  p.cooldown_left = r.get<std::uint64_t>();
  p.reports = r.get<std::uint64_t>();
}

// What is wrong with a checkpoint's optimizer settings ("" if nothing), by
// the same ranges the optimizers' constructors enforce (invalid_setting).
template <class Access, class Settings>
std::string settings_error(const Settings& s) {
  using T = decltype(s.lr);
  std::string why = invalid_steps(s.steps);
  if (why.empty()) why = invalid_setting("lr", s.lr);
  if (why.empty()) why = invalid_setting("clip", s.clip);
  if constexpr (Access::is_adam) {
    const std::pair<const char*, double> adam[] = {{"beta1", s.beta1},     {"beta2", s.beta2},
                                                   {"eps", s.eps},         {"beta1^t", s.beta1_power},
                                                   {"beta2^t", s.beta2_power}, {"weight_decay", s.weight_decay}};
    for (const auto& [name, value] : adam)
      if (why.empty()) why = invalid_setting(name, value);
    if (why.empty() && s.form != AdamForm::efficient && s.form != AdamForm::pytorch)
      why = "Adam form " + std::to_string(static_cast<int>(s.form)) + " is not an AdamForm";
  } else {
    for (const auto& [name, value] : {std::pair{"momentum", s.momentum}, std::pair{"dampening", s.dampening}})
      if (why.empty()) why = invalid_setting(name, value);
    if (why.empty() && s.nesterov && (s.momentum == T(0) || s.dampening != T(0)))
      why = "Nesterov momentum without momentum or with dampening";
  }
  if (why.empty() && s.schedule) {
    // In the optimizer's type, as set_schedule checks it: a float file's
    // base_lr 1e300 is a finite double but an infinite float rate.
    why = schedule_invalid_as<T>(*s.schedule);
    if (why.empty() && s.schedule->shape == LrShape::plateau &&
        !(s.plateau.lr >= 0 && s.plateau.lr <= s.schedule->base_lr && !std::isnan(s.plateau.best)))
      why = "the plateau schedule's state is out of range (rate " + std::to_string(s.plateau.lr) +
            "; expected 0 <= rate <= base_lr)";
    if (!why.empty()) why = "schedule: " + why;
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
    AdamForm form = AdamForm::efficient;
    T momentum{}, dampening{};
    bool nesterov = false;
    T weight_decay{};  // AdamW's default for add()
    std::optional<LrSchedule> schedule;  // restore() keeps an attached one when empty
    PlateauState plateau;
  };
  static constexpr bool is_adam = std::is_base_of_v<Adam<T>, Opt>;
  static constexpr bool is_adamw = std::is_same_v<Opt, AdamW<T>>;
  static constexpr bool is_sgd = std::is_same_v<Opt, SGD<T>>;
  // State that only format version 3 holds.
  static bool needs_version_3(const Opt& o) {
    if (o.schedule_) return true;
    if constexpr (is_adam)
      return is_adamw || o.form_ != AdamForm::efficient;
    else
      return o.momentum_ != T(0) || o.nesterov_;
  }
  // Whether parameter k's momentum buffer holds a first gradient (SGD).
  static std::vector<std::uint8_t>* started(Opt& o) {
    if constexpr (is_sgd)
      return &o.started_;
    else
      return nullptr;
  }
  static bool started(const Opt& o, std::size_t k) {
    if constexpr (is_sgd)
      return k < o.started_.size() && o.started_[k];
    else
      return false;
  }
  static std::vector<T>* momentum_buffers(Opt& o) {
    if constexpr (is_sgd)
      return &o.buffers_;
    else
      return nullptr;
  }
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
      f(s.form, o.form_);
    }
    if constexpr (is_adamw) f(s.weight_decay, o.weight_decay_);
    if constexpr (is_sgd) {
      f(s.momentum, o.momentum_);
      f(s.dampening, o.dampening_);
      f(s.nesterov, o.nesterov_);
    }
  }
  static Settings settings(const Opt& o) {
    Settings s;
    each_setting(o, s, [](auto& to, const auto& from) { to = from; });
    s.schedule = o.schedule_;
    s.plateau = o.plateau_;
    return s;
  }
  static void restore(Opt& o, const Settings& s) {
    each_setting(o, s, [](const auto& from, auto& to) { to = from; });
    if (s.schedule) {
      o.schedule_ = s.schedule;
      o.plateau_ = s.plateau;
    }
    // The schedule continues from the restored step count.
    if (o.schedule_) o.lr_ = static_cast<T>(o.schedule_->rate(o.steps_ + 1, o.plateau_));
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
  const bool version_3 = Access::needs_version_3(opt);
  if (!notes.empty() || version_3) {
    payload.put(static_cast<std::uint32_t>(notes.size()));
    for (const CheckpointNote& n : notes) {
      payload.put(static_cast<std::uint32_t>(n.key.size()));
      payload.bytes.insert(payload.bytes.end(), n.key.begin(), n.key.end());
      payload.put(n.value);
    }
  }
  if (version_3) {
    payload.put(static_cast<std::uint32_t>(s.form));
    for (T x : {s.momentum, s.dampening}) payload.put(x);
    payload.put(static_cast<std::uint32_t>(s.nesterov));
    payload.put(s.weight_decay);
    for (std::size_t k = 0; k < entries.size(); ++k) {
      payload.put(entries[k].weight_decay);
      payload.put(static_cast<std::uint32_t>(Access::started(opt, k)));
    }
    if constexpr (Access::is_sgd)
      if (s.momentum != T(0)) payload.put_all(opt.momentum_buffers());
    payload.put(static_cast<std::uint32_t>(s.schedule.has_value()));
    if (s.schedule) detail::put_schedule(payload, *s.schedule, s.plateau);
  }

  const std::vector<unsigned char> file =
      detail::frame(detail::checkpoint_magic, version_3 ? 3 : notes.empty() ? 1 : 2, detail::dtype_code<T>,
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
  std::vector<T> decays(entries.size(), T(0));
  std::vector<std::uint8_t> started(entries.size(), 0);
  std::span<const unsigned char> buffers;
  if (f.version >= 3) {
    const auto form = r.get<std::uint32_t>();
    s.form = form <= 1 ? static_cast<AdamForm>(form) : static_cast<AdamForm>(255);
    s.momentum = r.get<T>();
    s.dampening = r.get<T>();
    s.nesterov = r.get<std::uint32_t>() != 0;
    s.weight_decay = r.get<T>();
    for (std::size_t k = 0; k < entries.size(); ++k) {
      decays[k] = r.get<T>();
      started[k] = r.get<std::uint32_t>() != 0;
      if (const std::string why = invalid_setting("weight_decay", decays[k]); !r.short_read && !why.empty())
        return failed("invalid setting in the file: parameter " + std::to_string(k + 1) + ": " + why);
    }
    if constexpr (Access::is_sgd)
      if (s.momentum != T(0)) buffers = r.template take<T>(n);
    if (r.get<std::uint32_t>() != 0) {
      s.schedule.emplace();
      detail::get_schedule(r, *s.schedule, s.plateau);
    }
    if (const std::string why = detail::settings_error<Access>(s); !r.short_read && !why.empty())
      return failed("invalid setting in the file: " + why);
  }
  if (r.short_read || r.at != r.bytes.size())
    return failed("corrupted: the payload does not match its own parameter list");

  // ---- every check passed: write ----
  Access::restore(opt, s);
  auto& list = Access::entries(opt);
  for (std::size_t i = 0; i < list.size(); ++i) {
    list[i].l2 = l2[i];
    list[i].weight_decay = decays[i];
    std::memcpy(tp.leaf_value(list[i].var).data(), values.data() + list[i].offset * sizeof(T),
                list[i].size * sizeof(T));
  }
  if constexpr (Access::is_adam) {
    std::memcpy(Access::moments(opt, 0)->data(), m.data(), m.size());
    std::memcpy(Access::moments(opt, 1)->data(), v.data(), v.size());
  }
  if constexpr (Access::is_sgd) {  // the file's momentum: buffers as saved, or none
    Access::momentum_buffers(opt)->assign(s.momentum != T(0) ? n : 0, T(0));
    if (!buffers.empty()) std::memcpy(Access::momentum_buffers(opt)->data(), buffers.data(), buffers.size());
    *Access::started(opt) = s.momentum != T(0) ? started : std::vector<std::uint8_t>{};
  }
  if (notes) *notes = std::move(held);
  return {};
}

}  // namespace grad
