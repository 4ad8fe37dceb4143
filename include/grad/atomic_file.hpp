// A file written in pieces that appears whole or not at all: a temporary
// file of its own beside the path ("<path>.tmp.XXXXXX"), appended to, then
// flushed and renamed over the path (commit); dropped without commit (an
// error half way), the temporary file is removed and the path is as it was.
// For outputs too large to assemble in memory first (a 7B model's GGUF is
// written tensor by tensor). The path must be absent or a regular file
// (regular_file.hpp: the rename would replace a FIFO or device node).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>

#include "grad/regular_file.hpp"

namespace grad::detail {

class AtomicFile {
 public:
  AtomicFile() = default;
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  ~AtomicFile() { discard(); }

  // "" or why the temporary file cannot be made.
  std::string open(const std::string& path) {
    discard();
    if (std::string why = output_path_problem(path); !why.empty()) return why;
    path_ = path;
    tmp_ = path + ".tmp.XXXXXX";
    fd_ = ::mkostemp(tmp_.data(), O_CLOEXEC);  // a name no other writer has
    if (fd_ < 0) return "cannot create a temporary file '" + tmp_ + "': " + std::strerror(errno);
    ::fchmod(fd_, 0644);  // mkostemp creates 0600; an output is as readable as any file
    return {};
  }
  // Appends bytes; "" or why not (the file is then discarded).
  std::string write(std::span<const unsigned char> bytes) {
    if (fd_ < 0) return "no file is open";
    std::size_t written = 0;
    while (written < bytes.size()) {
      const ssize_t n = ::write(fd_, bytes.data() + written, bytes.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const std::string why = "writing '" + tmp_ + "' failed: " + std::strerror(errno);
        discard();
        return why;
      }
      written += static_cast<std::size_t>(n);
    }
    return {};
  }
  // Flushes and renames into place, then flushes the directory; "" or what failed.
  std::string commit(const char* noun) {
    if (fd_ < 0) return "no file is open";
    // The data must be on disk before the rename makes it the file.
    const int fd = fd_;
    fd_ = -1;
    if (::fsync(fd) != 0 || ::close(fd) != 0) {
      const std::string why = std::strerror(errno);
      ::unlink(tmp_.c_str());
      return "flushing '" + tmp_ + "' failed: " + why;
    }
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      ::unlink(tmp_.c_str());
      return "renaming '" + tmp_ + "' into place failed: " + why;
    }
    const std::size_t slash = path_.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path_.substr(0, slash);
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || ::fsync(dfd) != 0) {
      const std::string why = std::strerror(errno);
      if (dfd >= 0) ::close(dfd);
      return "the " + std::string(noun) + " was written, but flushing its directory failed: " + why;
    }
    ::close(dfd);
    return {};
  }

 private:
  void discard() {
    if (fd_ < 0) return;
    ::close(fd_);
    ::unlink(tmp_.c_str());
    fd_ = -1;
  }
  std::string path_, tmp_;
  int fd_ = -1;
};

}  // namespace grad::detail
