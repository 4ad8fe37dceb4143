// The command line of grad's examples and benchmark programs, on CLI11:
// --help lists every option with its default and valid range, --version
// prints grad's version, and a bad command line names the option, what it
// accepts (an unknown option: the valid ones) and exits 2 before any work.
// Output paths are checked before the work too, so a long run is never lost
// to a missing directory at its end.
#pragma once

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <grad/config.hpp>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace cli {

template <class T>
std::string show(T v) {
  if constexpr (std::is_integral_v<T>) {
    return std::to_string(v);
  } else {
    char s[32];
    std::snprintf(s, sizeof s, "%g", static_cast<double>(v));
    return s;
  }
}

// A number in [lo, hi]. CLI::Range prints its bounds with std::to_string
// ("0.000000" for 1e-12), so this one says them as they would be typed.
template <class T>
CLI::Validator range(T lo, T hi) {
  const std::string span = "[" + show(lo) + ", " + show(hi) + "]";
  const std::string what = std::is_integral_v<T> ? "a whole number" : "a number";
  return CLI::Validator(
      [=](std::string& in) -> std::string {
        T v{};
        if (!CLI::detail::lexical_cast(in, v) || !(v >= lo && v <= hi))
          return "'" + in + "' is not " + what + " in " + span;
        return {};
      },
      "in " + span);
}

// A random seed: any 64-bit unsigned value.
inline CLI::Validator seed() { return range<std::uint64_t>(0, std::numeric_limits<std::uint64_t>::max()); }

// "" when `path` can be written: "" itself (no output), or a file (not a
// directory) in an existing, writable directory.
inline std::string output_file_problem(const std::string& path) {
  if (path.empty()) return {};
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path p(path);
  if (fs::is_directory(p, ec)) return "'" + path + "' is a directory, not a file";
  const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  if (!fs::is_directory(dir, ec)) return "cannot write '" + path + "': no directory '" + dir.string() + "'";
  if (access(dir.c_str(), W_OK) != 0) return "cannot write '" + path + "': the directory is not writable";
  if (fs::exists(p, ec) && access(p.c_str(), W_OK) != 0) return "cannot write '" + path + "': permission denied";
  return {};
}

// As output_file_problem, but a path is needed (a model, not an optional plot).
inline std::string required_output_file_problem(const std::string& path) {
  return path.empty() ? "a path is needed" : output_file_problem(path);
}

// "" when `path` is an existing, writable directory.
inline std::string output_dir_problem(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_directory(path, ec)) return "'" + path + "' is not a directory";
  if (access(path.c_str(), W_OK) != 0) return "the directory '" + path + "' is not writable";
  return {};
}

// "" when `path` is a regular file of at most max_bytes: a directory, a FIFO
// or a device (/dev/zero never ends) is refused before reading.
inline std::string input_file_problem(const std::string& path, std::uintmax_t max_bytes) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status s = fs::status(path, ec);
  if (!fs::exists(s)) return "no file '" + path + "'";
  if (fs::is_directory(s)) return "'" + path + "' is a directory, not a file";
  if (!fs::is_regular_file(s)) return "'" + path + "' is not a regular file";
  if (const std::uintmax_t n = fs::file_size(path, ec); !ec && n > max_bytes)
    return "'" + path + "' has " + std::to_string(n) + " bytes; the limit is " + std::to_string(max_bytes);
  if (access(path.c_str(), R_OK) != 0) return "cannot read '" + path + "': permission denied";
  return {};
}

// A bad command line found after parsing (an output path given by default
// that cannot be written): the program exits 2, as for a parse error.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Throws UsageError naming the flag when `path` cannot be written (or is
// empty and `required`).
inline void check_output_file(const std::string& flag, const std::string& path, bool required = false) {
  if (std::string why = required ? required_output_file_problem(path) : output_file_problem(path); !why.empty())
    throw UsageError(flag + ": " + why);
}

inline const CLI::Validator output_file(output_file_problem, "FILE", "OUTPUT_FILE");
inline const CLI::Validator required_output_file(required_output_file_problem, "FILE", "REQUIRED_OUTPUT_FILE");
inline const CLI::Validator output_dir(output_dir_problem, "DIR", "OUTPUT_DIR");
inline CLI::Validator input_file(std::uintmax_t max_bytes) {
  return CLI::Validator([=](const std::string& p) { return input_file_problem(p, max_bytes); },
                        "FILE of at most " + std::to_string(max_bytes) + " bytes");
}

// The whole file, after input_file_problem's checks; throws std::runtime_error.
inline std::string read_file(const std::string& path, std::uintmax_t max_bytes) {
  if (std::string why = input_file_problem(path, max_bytes); !why.empty()) throw std::runtime_error(why);
  std::ifstream in(path, std::ios::binary);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw std::runtime_error("cannot read '" + path + "'");
  return s;
}

// An error's message; for an unknown option the valid ones as well, and for
// a missing command the commands.
inline std::string failure_message(const CLI::App* app, const CLI::Error& e) {
  std::string command = app->get_name();
  const CLI::App* at = app;  // the innermost command given
  while (!at->get_subcommands().empty()) {
    at = at->get_subcommands().front();
    command += " " + at->get_name();
  }
  std::string msg = command + ": " + e.what() + "\n";
  auto list = [](const auto& items) {
    std::string names;
    for (const auto* i : items) names += (names.empty() ? "" : ", ") + i->get_name();
    return names;
  };
  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) msg += "valid options: " + list(at->get_options()) + "\n";
  if (const auto commands = at->get_subcommands([](const CLI::App*) { return true; }); !commands.empty())
    msg += "commands: " + list(commands) + "\n";
  return msg + "Run with --help for every option with its default and range.\n";
}

// --version (grad's), every option's default shown in --help, and the failure message above.
inline void setup(CLI::App& app) {
  app.set_version_flag("--version", std::string("grad ") + GRAD_VERSION);
  app.option_defaults()->always_capture_default();
  app.failure_message(failure_message);
}

// Parses the command line: nothing to go on with, else the status to exit
// with (0 after --help or --version, 2 for a bad command line).
inline std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
}

}  // namespace cli
