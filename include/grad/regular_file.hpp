// Regular files only, in and out: every reader of a named file (grad::hf's
// JSON, tokenizer and safetensors readers, copies) and every writer that
// renames a temporary file into place (checkpoints, model files, emitted
// sources, GGUF and Hugging Face exports) goes through these.
//
// Reading: a FIFO would block a reader forever and /dev/zero would feed it
// until memory runs out, so a file is opened with O_NONBLOCK (a FIFO opens
// at once), checked to be a regular file on the descriptor (after
// symbolic links, with no window between check and read), and read to a
// stated bound that the message names.
// Writing: rename() replaces whatever the path names, so writing to a FIFO
// or a device node (as root, /dev/null) would replace it with a regular
// file; an output path must be absent or a regular file.
//
// Each returns "" or what is wrong, for the caller to put into its own
// error type with the path and what was being read or written.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

namespace grad::detail {

// What a file of this mode is, for messages ("a FIFO").
inline const char* file_kind(mode_t mode) {
  return S_ISREG(mode)    ? "a regular file"
         : S_ISDIR(mode)  ? "a directory"
         : S_ISFIFO(mode) ? "a FIFO"
         : S_ISCHR(mode)  ? "a character device"
         : S_ISBLK(mode)  ? "a block device"
         : S_ISSOCK(mode) ? "a socket"
                          : "not a regular file";
}

// Opens `path` for reading when it is a regular file: "" with `fd` (the
// caller closes it) and its size, or why not (fd -1).
inline std::string open_regular_file(const std::string& path, int& fd, std::uint64_t& size) {
  fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return std::string("cannot open: ") + std::strerror(errno);
  struct stat st {};
  const bool stat_ok = ::fstat(fd, &st) == 0;
  if (!stat_ok || !S_ISREG(st.st_mode)) {
    const std::string why = !stat_ok ? std::string("cannot stat: ") + std::strerror(errno)
                                     : std::string("is ") + file_kind(st.st_mode) + ", not a regular file";
    ::close(fd);
    fd = -1;
    return why;
  }
  size = static_cast<std::uint64_t>(st.st_size);
  return {};
}

// Reads `n` bytes at `offset` into `out`: "" or why (a file that ends
// before them, as one truncated after it was opened does, is named so).
inline std::string read_at(int fd, std::uint64_t offset, void* out, std::size_t n) {
  auto* to = static_cast<unsigned char*>(out);
  std::size_t at = 0;
  while (at < n) {
    const ssize_t got = ::pread(fd, to + at, n - at, static_cast<off_t>(offset + at));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return std::string("read failed: ") + std::strerror(errno);
    if (got == 0) {
      struct stat st {};
      const std::string now = ::fstat(fd, &st) == 0 ? std::to_string(st.st_size) : std::string("?");
      return "truncated: bytes [" + std::to_string(offset) + ", " + std::to_string(offset + n) +
             ") were expected, the file now ends at byte " + now + " (was it changed after it was opened?)";
    }
    at += static_cast<std::size_t>(got);
  }
  return {};
}

// The whole of a regular file of at most `max_bytes` into `out`: "" or why,
// naming the bound. Read to the bound, not to the size fstat gave: a file
// that grows while it is read still stops there.
inline std::string read_regular_file(const std::string& path, std::uint64_t max_bytes, std::string& out) {
  int fd = -1;
  std::uint64_t size = 0;
  if (std::string why = open_regular_file(path, fd, size); !why.empty()) return why;
  auto too_large = [&](const std::string& size_text) {
    return size_text + " bytes: more than the " + std::to_string(max_bytes) + " this reader takes";
  };
  if (size > max_bytes) {
    ::close(fd);
    return too_large(std::to_string(size));
  }
  out.assign(static_cast<std::size_t>(size), '\0');
  std::size_t at = 0;
  for (;;) {
    if (at == out.size()) {  // grown since fstat, perhaps: read on, up to the bound
      if (out.size() > max_bytes) {
        ::close(fd);
        return too_large("more than " + std::to_string(max_bytes));
      }
      out.resize(static_cast<std::size_t>(std::min<std::uint64_t>(max_bytes + 1, out.size() + 65536)));
    }
    const ssize_t got = ::read(fd, out.data() + at, out.size() - at);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      const std::string why = std::string("read failed: ") + std::strerror(errno);
      ::close(fd);
      return why;
    }
    if (got == 0) break;
    at += static_cast<std::size_t>(got);
  }
  ::close(fd);
  out.resize(at);
  return {};
}

// "" when `path` is absent or a regular file (after symbolic links), else
// what it is: a writer renames its temporary file over a regular file only.
inline std::string output_path_problem(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return {};  // absent (or unreachable: creating the file then says why)
  if (S_ISREG(st.st_mode)) return {};
  return std::string("it is ") + file_kind(st.st_mode) + ", and only a regular file is replaced by a write";
}

}  // namespace grad::detail
