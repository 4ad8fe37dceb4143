// Golden data written by the oracle scripts in test/oracle/ (see golden.py):
// one tensor per line, "name d0 d1 ... : v0 v1 ...", values as C99 hex floats
// so that no bit is lost between Python and C++.
#pragma once

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>

#include <grad/tensor.hpp>

namespace grad::testing {

inline std::string oracle_dir() {
  const char* d = std::getenv("GRAD_ORACLE_DIR");
  return d ? d : "test/oracle";
}

inline std::map<std::string, Tensor<double>> load_golden(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open golden file " + path);
  std::map<std::string, Tensor<double>> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    std::string name, tok;
    s >> name;
    Shape shape;
    while (s >> tok && tok != ":") shape.push_back(std::stoul(tok));
    std::vector<double> values;
    while (s >> tok) values.push_back(std::strtod(tok.c_str(), nullptr));
    out.emplace(name, Tensor<double>(shape, std::move(values)));
  }
  return out;
}

}  // namespace grad::testing
