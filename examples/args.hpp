// The command line of the examples that need no more than options with
// checks (digits): the same parsing, --help, --version and messages as
// cli.hpp's, from CLI11 as well, but CLI11 is compiled once, into the small
// library example_args (args.cpp), instead of into each program's unit: a
// unit that includes CLI/CLI.hpp spends about 5 s of its compile on it (half
// of digits.cpp's), this header about nothing.
//
//   args::Command cmd{"digits: what it does", "digits"};
//   cmd.option("--epochs", epochs, "passes over the rows").check(args::range(1, 100'000));
//   if (auto status = cmd.parse(argc, argv)) return *status;   // 0 after --help, 2 for a bad command line
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace CLI {
class App;
class Option;
class Validator;
}  // namespace CLI

namespace args {

// A check on an option's value (a range, a file that must exist, ...), made
// by the functions below; it names what it accepts in --help.
class Check {
 public:
  explicit Check(std::shared_ptr<const CLI::Validator> v) : v_(std::move(v)) {}
  const CLI::Validator& validator() const { return *v_; }

 private:
  std::shared_ptr<const CLI::Validator> v_;
};

// A number in [lo, hi], its bounds written as they would be typed (cli::range).
// Defined for int, long, unsigned, unsigned long, unsigned long long, float and double.
template <class T>
Check range(T lo, T hi);
// Any 64-bit unsigned value (a random seed).
Check seed();
// A file that can be written ('' allowed: no output), or a regular file of at most max_bytes that can be read.
Check output_file();
Check input_file(std::uintmax_t max_bytes);

// "" when `path` can be written ('' itself, or a file in an existing, writable
// directory), else why not (cli::output_file_problem): for a default value,
// which CLI11 does not check.
std::string output_file_problem(const std::string& path);

// One option of a Command; check() adds a check (several: all must pass).
class Option {
 public:
  explicit Option(CLI::Option* o) : o_(o) {}
  Option& check(const Check& c);

 private:
  CLI::Option* o_;
};

// A program's command line: --help lists every option with its default and
// check, --version prints grad's version, and a bad command line names the
// option and what it accepts.
class Command {
 public:
  Command(const std::string& description, const std::string& name);
  ~Command();
  Command(const Command&) = delete;
  Command& operator=(const Command&) = delete;

  // `--name VALUE` into value, whose initial value is the default.
  // Defined for int, long, unsigned, unsigned long, unsigned long long, float, double and std::string.
  template <class T>
  Option option(const std::string& name, T& value, const std::string& description);
  // `--name` sets flag to true.
  Option flag(const std::string& name, bool& flag, const std::string& description);

  // Parses the command line: nothing to go on with, else the status to exit
  // with (0 after --help or --version, 2 for a bad command line; the message
  // is printed).
  std::optional<int> parse(int argc, char** argv);

 private:
  std::unique_ptr<CLI::App> app_;
};

}  // namespace args
