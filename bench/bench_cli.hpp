// The command line of a Google Benchmark program with options of its own:
// CLI11 takes those (--help, --version, ranges: examples/cli.hpp) and hands
// the rest, benchmark's --benchmark_* flags, on to benchmark::Initialize.
#pragma once

#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "../examples/cli.hpp"

namespace cli {

inline void allow_benchmark_flags(CLI::App& app) {
  app.allow_extras();
  app.footer(
      "Google Benchmark's flags pass on to it, e.g. --benchmark_filter=REGEX, --benchmark_list_tests,\n"
      "--benchmark_min_time=SECONDS, --benchmark_repetitions=N, --benchmark_format=console|json|csv,\n"
      "--benchmark_out=FILE; a flag neither knows is an error.");
}

// benchmark::Initialize on what CLI11 left; false (benchmark has said why)
// when a flag is neither CLI11's nor benchmark's.
inline bool initialize_benchmark(const CLI::App& app, char* argv0) {
  static std::vector<std::string> rest;  // benchmark keeps pointers into argv
  static std::vector<char*> argv;
  rest = app.remaining();
  argv = {argv0};
  for (std::string& a : rest) argv.push_back(a.data());
  int argc = static_cast<int>(argv.size());
  benchmark::Initialize(&argc, argv.data());
  return !benchmark::ReportUnrecognizedArguments(argc, argv.data());
}

}  // namespace cli
