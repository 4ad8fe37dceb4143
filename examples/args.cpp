// args.hpp's Command on CLI11 and cli.hpp: the one unit of the examples'
// library example_args that compiles CLI11.
#include "args.hpp"

#include "cli.hpp"

namespace args {

namespace {
Check make(CLI::Validator v) { return Check(std::make_shared<const CLI::Validator>(std::move(v))); }
}  // namespace

template <class T>
Check range(T lo, T hi) {
  return make(cli::range(lo, hi));
}
template Check range<int>(int, int);
template Check range<long>(long, long);
template Check range<unsigned>(unsigned, unsigned);
template Check range<unsigned long>(unsigned long, unsigned long);
template Check range<unsigned long long>(unsigned long long, unsigned long long);
template Check range<float>(float, float);
template Check range<double>(double, double);

Check seed() { return make(cli::seed()); }
Check output_file() { return make(cli::output_file); }
Check input_file(std::uintmax_t max_bytes) { return make(cli::input_file(max_bytes)); }

std::string output_file_problem(const std::string& path) { return cli::output_file_problem(path); }

Option& Option::check(const Check& c) {
  o_->check(c.validator());
  return *this;
}

Command::Command(const std::string& description, const std::string& name)
    : app_(std::make_unique<CLI::App>(description, name)) {
  cli::setup(*app_);
}

Command::~Command() = default;

template <class T>
Option Command::option(const std::string& name, T& value, const std::string& description) {
  return Option(app_->add_option(name, value, description));
}
template Option Command::option<int>(const std::string&, int&, const std::string&);
template Option Command::option<long>(const std::string&, long&, const std::string&);
template Option Command::option<unsigned>(const std::string&, unsigned&, const std::string&);
template Option Command::option<unsigned long>(const std::string&, unsigned long&, const std::string&);
template Option Command::option<unsigned long long>(const std::string&, unsigned long long&, const std::string&);
template Option Command::option<float>(const std::string&, float&, const std::string&);
template Option Command::option<double>(const std::string&, double&, const std::string&);
template Option Command::option<std::string>(const std::string&, std::string&, const std::string&);

Option Command::flag(const std::string& name, bool& flag, const std::string& description) {
  return Option(app_->add_flag(name, flag, description));
}

std::optional<int> Command::parse(int argc, char** argv) { return cli::parse(*app_, argc, argv); }

}  // namespace args
