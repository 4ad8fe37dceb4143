// Writing the emitted sources to disk: write_source (atomic) and emit_files, which checks every
// output path before the first byte. Apart: the only part of the emitter with file-system effects.
#pragma once

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <unistd.h>

#include "grad/checkpoint.hpp"
#include "grad/emit/source.hpp"
#include "grad/tape.hpp"

namespace grad {


// Writes `text` to `path` atomically (a unique temporary file, fsync,
// rename): EmitError naming the path and why, and no file, on failure.
inline void write_source(const std::string& path, std::string_view text) {
  const std::vector<unsigned char> bytes(text.begin(), text.end());
  if (const std::string why = detail::write_atomically(path, bytes, "emitted source"); !why.empty())
    throw EmitError("grad::emit: cannot write '" + path + "': " + why);
}

// emit() then write_source() for each path given ("" skips that file). Both
// texts are complete, and every output path checked, before the first byte
// is written: a path that is a directory, a directory that does not take new
// files, or the same file given for both outputs (also through another
// spelling, a symbolic or a hard link) is refused, and nothing is written.
template <class T>
EmittedSource emit_files(const Tape<T>& tape, Var<T> loss, const EmitOptions<T>& options, const std::string& cpp_path,
                         const std::string& cuda_path = "") {
  namespace fs = std::filesystem;
  EmittedSource s = emit(tape, loss, options);
  for (const std::string* path : {&cpp_path, &cuda_path}) {
    if (path->empty()) continue;
    std::error_code ec;
    if (fs::is_directory(*path, ec))
      throw EmitError("grad::emit: cannot write '" + *path + "': it is a directory; nothing was written");
    const std::size_t slash = path->rfind('/');
    const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path->substr(0, slash);
    if (::access(dir.c_str(), W_OK) != 0)
      throw EmitError("grad::emit: cannot write '" + *path + "': its directory '" + dir +
                      "' does not take new files (" + std::strerror(errno) + "); nothing was written");
  }
  if (!cpp_path.empty() && !cuda_path.empty()) {
    std::error_code e1, e2, e3;
    const fs::path a = fs::weakly_canonical(cpp_path, e1), b = fs::weakly_canonical(cuda_path, e2);
    const bool same = (!e1 && !e2 && a == b) || fs::equivalent(cpp_path, cuda_path, e3) || cpp_path == cuda_path;
    if (same)
      throw EmitError("grad::emit: the C++ header and the CUDA source would both be written to '" + cpp_path +
                      "' ('" + cuda_path + "' is the same file); nothing was written");
  }
  if (!cpp_path.empty()) write_source(cpp_path, s.cpp);
  if (!cuda_path.empty()) write_source(cuda_path, s.cuda);
  return s;
}

}  // namespace grad
