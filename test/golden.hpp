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

// The Python that runs the live oracles: GRAD_PYTHON (a command, e.g.
// "/usr/bin/python3 -S", which hides site-packages and so torch: the
// configuration matrix's no-torch row), else Debian's /usr/bin/python3, the
// only one that sees python3-torch.
inline std::string python() {
  const char* p = std::getenv("GRAD_PYTHON");
  return p && *p ? p : "/usr/bin/python3";
}

// Whether python() can import torch: the live oracle cases skip without it
// (the checked-in golden data is compared either way).
inline bool torch_available() {
  static const bool available = std::system((python() + " -c 'import torch' >/dev/null 2>&1").c_str()) == 0;
  return available;
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
