// grad's side of test/hf/tokenizer_oracle.sh: encodes every file named in a
// list (one a line) with a tokenizer.json, prints one line of ids per file,
// checks that decoding gives the file back, and reports the speed on stderr.
//   hf_tokenize TOKENIZER_JSON CORPUS_LIST > ids
#include <grad/hf/tokenizer.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error(path + ": cannot be opened for reading");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 3) {
    std::cerr << "usage: hf_tokenize TOKENIZER_JSON CORPUS_LIST\n";
    return 2;
  }
  const auto tok = grad::hf::Tokenizer::from_file(argv[1]);
  std::vector<std::string> names, texts;
  std::istringstream list(read_file(argv[2]));
  for (std::string line; std::getline(list, line);)
    if (!line.empty()) {
      names.push_back(line);
      texts.push_back(read_file(line));
    }

  std::vector<std::vector<int>> ids(texts.size());
  std::size_t bytes = 0, tokens = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < texts.size(); ++i) {
    ids[i] = tok.encode(texts[i]);
    bytes += texts[i].size();
    tokens += ids[i].size();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  int failed = 0;
  std::string out;
  for (std::size_t i = 0; i < texts.size(); ++i) {
    // With add_special_tokens the template's tokens decode too: strip them by encoding without.
    if (tok.decode(tok.encode(texts[i], false)) != texts[i]) {
      std::cerr << "hf_tokenize: decode(encode(text)) differs from the text of " << names[i] << "\n";
      failed = 1;
    }
    for (std::size_t k = 0; k < ids[i].size(); ++k) {
      if (k > 0) out += ' ';
      out += std::to_string(ids[i][k]);
    }
    out += '\n';
  }
  std::cout << out;
  std::fprintf(stderr, "hf_tokenize: %s: %zu files, %zu bytes, %zu tokens in %.3f s: %.0f tokens/s, %.2f MB/s\n",
               argv[1], texts.size(), bytes, tokens, seconds, tokens / seconds, bytes / seconds / 1e6);
  return failed;
} catch (const std::exception& e) {
  std::cerr << "hf_tokenize: " << e.what() << "\n";
  return 1;
}
