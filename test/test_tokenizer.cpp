// grad::hf::Tokenizer on small tokenizer.json files built here: the byte map,
// merge order, both merge spellings, the pre-tokenizers (GPT-2's pattern,
// Qwen2's and Llama 3's Split, every Split behavior), added tokens, the
// template, decode(encode(s)) == s on random bytes and random UTF-8, and a
// clear error for every kind of bad file. test/hf/tokenizer_oracle.sh
// compares real vocabularies with reference implementations.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <malloc.h>
#include <sys/stat.h>
#include <unistd.h>

#include <grad/hf/gguf.hpp>
#include <grad/hf/tokenizer.hpp>

#include <chrono>
#include <filesystem>
#include <future>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

using grad::hf::Tokenizer;
using grad::hf::TokenizerError;
using json = nlohmann::json;

namespace {

const std::string qwen_pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The byte-level spelling of some bytes: "a b" -> "aĠb".
std::string spell(std::string_view bytes) {
  std::string s;
  for (char c : bytes) s += grad::hf::byte_to_symbol(static_cast<unsigned char>(c));
  return s;
}

// A tokenizer.json: the 256 byte symbols as ids 0 .. 255 (in byte order),
// then one token per merge (given as byte strings), then `whole` tokens
// (pieces ignore_merges can take whole).
json make(const std::vector<std::pair<std::string, std::string>>& merges, json pre_tokenizer,
          const std::vector<std::string>& whole = {}) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[grad::hf::byte_to_symbol(static_cast<unsigned char>(b))] = b;
  json merge_list = json::array();
  for (const auto& [l, r] : merges) {
    if (!vocab.contains(spell(l + r))) vocab[spell(l + r)] = int(vocab.size());
    merge_list.push_back(spell(l) + " " + spell(r));
  }
  for (const std::string& w : whole)
    if (!vocab.contains(spell(w))) vocab[spell(w)] = int(vocab.size());
  return {{"version", "1.0"},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"vocab", vocab}, {"merges", merge_list}}}};
}

json byte_level(bool use_regex = true) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", use_regex}};
}

json split(const std::string& regex, const std::string& behavior = "Isolated") {
  return {{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", behavior}, {"invert", false}};
}

Tokenizer load(const json& j) { return Tokenizer::from_json(j.dump(), "test.json"); }

// The tokens encode gives, spelled out as bytes: the pieces are visible.
std::vector<std::string> pieces(const Tokenizer& t, std::string_view text) {
  std::vector<std::string> out;
  for (int id : t.encode(text)) out.push_back(t.decode(std::vector<int>{id}));
  return out;
}

using Pieces = std::vector<std::string>;

// Loading j fails with a message that has each of `parts`.
void refused(const json& j, std::initializer_list<std::string> parts) {
  std::string message;
  try {
    load(j);
  } catch (const TokenizerError& e) {
    message = e.what();
  }
  INFO("message: " << message);
  REQUIRE(!message.empty());
  CHECK(message.rfind("test.json: ", 0) == 0);
  for (const std::string& p : parts) CHECK(message.find(p) != std::string::npos);
}

}  // namespace

TEST_CASE("the byte map is GPT-2's: printable bytes stand for themselves, 68 others for U+0100 ..") {
  std::set<std::string> symbols;
  for (int b = 0; b < 256; ++b) {
    const std::string s = grad::hf::byte_to_symbol(static_cast<unsigned char>(b));
    symbols.insert(s);
    // Decode the symbol's one code point and map it back.
    char32_t c = static_cast<unsigned char>(s[0]);
    if (s.size() == 2) c = ((c & 0x1F) << 6) | (static_cast<unsigned char>(s[1]) & 0x3F);
    CHECK(grad::hf::symbol_to_byte(c) == static_cast<unsigned char>(b));
  }
  CHECK(symbols.size() == 256);
  CHECK(grad::hf::byte_to_symbol(' ') == "\u0120");   // Ġ
  CHECK(grad::hf::byte_to_symbol('\n') == "\u010A");  // Ċ
  CHECK(grad::hf::byte_to_symbol('a') == "a");
  CHECK(grad::hf::byte_to_symbol(0xAD) == "\u0143");  // the last of the 68
  CHECK(!grad::hf::symbol_to_byte(0x144).has_value());
  CHECK(!grad::hf::symbol_to_byte(0xAD).has_value());
}

TEST_CASE("merges apply lowest rank first, leftmost on ties, in either spelling") {
  const auto abc_first = load(make({{"a", "b"}, {"b", "c"}}, nullptr));
  CHECK(pieces(abc_first, "abc") == Pieces{"ab", "c"});
  const auto bc_first = load(make({{"b", "c"}, {"a", "b"}}, nullptr));
  CHECK(pieces(bc_first, "abc") == Pieces{"a", "bc"});
  const auto aa = load(make({{"a", "a"}, {"aa", "aa"}}, nullptr));
  CHECK(pieces(aa, "aaa") == Pieces{"aa", "a"});
  CHECK(pieces(aa, "aaaaa") == Pieces{"aaaa", "a"});

  // The pair form ["a", "b"] of newer files gives the same ids.
  json pairs = make({{"a", "b"}, {"ab", "c"}, {"x", "y"}}, byte_level());
  json strings = pairs;
  for (auto& m : pairs["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    m = json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  CHECK(load(pairs).encode("abc xy ab") == load(strings).encode("abc xy ab"));
  CHECK(pieces(load(pairs), "abc xy") == Pieces{"abc", " ", "xy"});  // no " x" token
}

TEST_CASE("GPT-2's pattern keeps merges inside its pieces") {
  // "o " would merge without a pre-tokenizer; GPT-2's pattern puts the space with the next word.
  const std::vector<std::pair<std::string, std::string>> merges = {{"o", " "}, {" ", "w"}, {"'", "s"}};
  CHECK(pieces(load(make(merges, nullptr)), "o wo") == Pieces{"o ", "w", "o"});
  const auto gpt2 = load(make(merges, byte_level()));
  CHECK(pieces(gpt2, "o wo") == Pieces{"o", " w", "o"});
  CHECK(pieces(gpt2, "it's") == Pieces{"i", "t", "'s"});
  // \s+(?!\S): the last space of a run goes with the next word.
  CHECK(pieces(gpt2, "o   w") == Pieces{"o", " ", " ", " w"});
  // add_prefix_space
  json spaced = make(merges, byte_level());
  spaced["pre_tokenizer"]["add_prefix_space"] = true;
  CHECK(pieces(load(spaced), "wo") == Pieces{" w", "o"});
  CHECK(load(spaced).encode("").empty());
}

TEST_CASE("\\s is Unicode White_Space, as in Oniguruma: U+0085 is a space, not punctuation") {
  // PCRE2's own \s leaves U+0085 out; then "!" and U+0085 (bytes C2 85) would be one piece.
  const auto t = load(make({{"!", "\xC2"}}, byte_level()));
  CHECK(pieces(t, "!\xC2\x85") == Pieces{"!", "\xC2", "\x85"});
  CHECK(pieces(t, "!\xC2\xA9") == Pieces{"!\xC2", "\xA9"});  // U+00A9 is punctuation: merged
}

TEST_CASE("Qwen2's and Llama 3's Split patterns, with ignore_merges") {
  json qwen = make({}, json{{"type", "Sequence"}, {"pretokenizers", {split(qwen_pattern), byte_level(false)}}},
                   {"HE", "'S", "123", "12", " .!!\n", " \n\n"});
  qwen["model"]["ignore_merges"] = true;
  const auto q = load(qwen);
  CHECK(pieces(q, "HE'S 123") == Pieces{"HE", "'S", " ", "1", "2", "3"});
  CHECK(pieces(q, "HE .!!\n") == Pieces{"HE", " .!!\n"});  // punctuation takes the newlines after it
  CHECK(pieces(q, "HE \n\nHE") == Pieces{"HE", " \n\n", "HE"});
  json llama = qwen;
  llama["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  CHECK(pieces(load(llama), "12345") == Pieces{"123", "4", "5"});
  llama["model"]["ignore_merges"] = false;  // then "123" comes from merges, and there are none
  CHECK(pieces(load(llama), "12345") == Pieces{"1", "2", "3", "4", "5"});
}

TEST_CASE("every Split behavior, on Hugging Face's documented example") {
  const std::vector<std::string> whole = {"the", "final", "countdown", "-", "--", "the-", "final-", "-final",
                                          "-countdown"};
  const auto with = [&](const std::string& behavior) {
    json j = make({}, json{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}}, whole);
    j["model"]["ignore_merges"] = true;
    return pieces(load(j), "the-final--countdown");
  };
  CHECK(with("Removed") == Pieces{"the", "final", "countdown"});
  CHECK(with("Isolated") == Pieces{"the", "-", "final", "-", "-", "countdown"});
  CHECK(with("MergedWithPrevious") == Pieces{"the-", "final-", "-", "countdown"});
  CHECK(with("MergedWithNext") == Pieces{"the", "-final", "-", "-countdown"});
  CHECK(with("Contiguous") == Pieces{"the", "-", "final", "--", "countdown"});
  json inverted = make({}, json{{"type", "Split"}, {"pattern", {{"Regex", "[a-z]+"}}}, {"behavior", "Removed"},
                                {"invert", true}}, whole);
  inverted["model"]["ignore_merges"] = true;
  CHECK(pieces(load(inverted), "the-final--countdown") == Pieces{"the", "final", "countdown"});
}

TEST_CASE("added tokens are matched first, leftmost-longest, never split; the template adds its tokens") {
  json j = make({{"h", "i"}}, byte_level());
  const int eot = 300, start = 301, start_short = 302, strip = 303;
  j["added_tokens"] = {
      {{"id", eot}, {"content", "<|endoftext|>"}, {"special", true}, {"normalized", true}},
      {{"id", start}, {"content", "<|im_start|>"}, {"special", true}},
      {{"id", start_short}, {"content", "<|im"}, {"special", false}},
      {{"id", strip}, {"content", "[S]"}, {"lstrip", true}, {"rstrip", true}},
  };
  auto t = load(j);
  const int hi = *t.token_to_id("hi");
  CHECK(t.encode("hi<|endoftext|>hi") == std::vector<int>{hi, eot, hi});
  CHECK(t.encode("<|im_start|>hi<|im") == std::vector<int>{start, hi, start_short});
  CHECK(t.encode("hi \t[S]  hi") == std::vector<int>{hi, strip, hi});
  CHECK(t.decode(t.encode("hi<|endoftext|>")) == "hi<|endoftext|>");
  CHECK(t.decode(t.encode("hi<|endoftext|>"), /*skip_special_tokens*/ true) == "hi");
  CHECK(t.token_to_id("<|im_start|>") == start);
  CHECK(t.id_to_token(start) == "<|im_start|>");
  CHECK(t.vocab_size() == 304);
  // An id with no token (a gap, a padding row) is skipped, as Hugging Face's decode skips it; a negative one is
  // refused.
  CHECK(t.decode(std::vector<int>{hi, 9999, 280, hi}) == "hihi");
  CHECK_THROWS_WITH_AS(t.decode(std::vector<int>{hi, -1}),
                       "grad::hf::Tokenizer::decode: id -1 at position 1 is negative (test.json)", std::out_of_range);

  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {byte_level(),
        {{"type", "TemplateProcessing"},
         {"single", {{{"SpecialToken", {{"id", "<|im_start|>"}}}}, {{"Sequence", {{"id", "A"}}}},
                     {{"SpecialToken", {{"id", "<|endoftext|>"}}}}}},
         {"special_tokens", {{"<|im_start|>", {{"ids", {start}}}}, {"<|endoftext|>", {{"ids", {eot}}}}}}}}}};
  t = load(j);
  CHECK(t.encode("hi") == std::vector<int>{start, hi, eot});
  CHECK(t.encode("hi", false) == std::vector<int>{hi});
  CHECK(t.encode("") == std::vector<int>{start, eot});
}

TEST_CASE("decode(encode(s)) == s for random bytes and random UTF-8 (fuzz)") {
  // Merges over common bytes, spaces and a two-byte letter, so pieces merge.
  std::vector<std::pair<std::string, std::string>> merges;
  for (std::string a : {"e", "t", " ", "\xC3", "a", "\n"})
    for (std::string b : {"h", "e", " ", "t", "\xA9", "\n", "a"}) merges.push_back({a, b});
  merges.push_back({"h", "e"});
  merges.push_back({"th", "e"});
  merges.push_back({" t", "he"});
  json gpt2 = make(merges, byte_level());
  gpt2["added_tokens"] = {{{"id", 400}, {"content", "<|endoftext|>"}, {"special", true}}};
  json qwen = gpt2;
  qwen["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {split(qwen_pattern), byte_level(false)}}};
  const std::vector<Tokenizer> tokenizers = [&] {
    std::vector<Tokenizer> v;
    v.push_back(load(gpt2));
    v.push_back(load(qwen));
    return v;
  }();

  std::mt19937 rng(7);
  const auto random_utf8 = [&](std::size_t n) {
    std::string s;
    for (std::size_t i = 0; i < n; ++i) {
      const unsigned pick = rng() % 8;
      char32_t c = pick < 3 ? U"  \n\tthe a'sT1é"[rng() % 14] : pick < 6 ? char32_t(rng() % 0x80)
                 : pick < 7 ? char32_t(0x80 + rng() % 0x780) : char32_t(0x800 + rng() % 0x10F800);
      if (c >= 0xD800 && c < 0xE000) c = 0xFFFD;
      if (c < 0x80) s += char(c);
      else if (c < 0x800) s += {char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))};
      else if (c < 0x10000) s += {char(0xE0 | (c >> 12)), char(0x80 | ((c >> 6) & 0x3F)), char(0x80 | (c & 0x3F))};
      else s += {char(0xF0 | (c >> 18)), char(0x80 | ((c >> 12) & 0x3F)), char(0x80 | ((c >> 6) & 0x3F)), char(0x80 | (c & 0x3F))};
      if (rng() % 50 == 0) s += "<|endoftext|>";
    }
    return s;
  };
  int checked = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string s;
    if (round % 2 == 0) {
      s = random_utf8(rng() % 64);
    } else {  // arbitrary bytes: stray continuations, truncated sequences, 0xFF, NUL
      s.resize(rng() % 64);
      for (char& c : s) c = char(rng() % 4 == 0 ? "\x80\xC3\xE2\xF0\xFF\x00 e"[rng() % 8] : rng() % 256);
    }
    for (const Tokenizer& t : tokenizers) {
      const auto ids = t.encode(s);
      REQUIRE(t.decode(ids) == s);
      ++checked;
    }
  }
  CHECK(checked == 6000);
  // A long run of one byte: the heap-based merge is not quadratic, and still exact.
  const std::string spaces(200000, ' ');
  CHECK(tokenizers[0].decode(tokenizers[0].encode(spaces)) == spaces);
}

TEST_CASE("a bad tokenizer.json is refused naming the file, the field and what was expected") {
  const json good = make({{"a", "b"}}, byte_level());
  CHECK_NOTHROW(load(good));

  CHECK_THROWS_WITH_AS(Tokenizer::from_json("{\"model\": ", "bad.json"), doctest::Contains("bad.json: not JSON"),
                       TokenizerError);
  CHECK_THROWS_WITH_AS(Tokenizer::from_json("{\"model\": \"\xFF\"}", "bad.json"),
                       doctest::Contains("bad.json: not JSON"), TokenizerError);
  CHECK_THROWS_WITH_AS(Tokenizer::from_file("/nonexistent/tokenizer.json"),
                       "/nonexistent/tokenizer.json: cannot open: No such file or directory", TokenizerError);
  refused(json::array(), {"(top level)", "an object"});
  json j = good;
  j.erase("model");
  refused(j, {"test.json: model: expected a value, found none"});
  j = good;
  j.erase("decoder");
  refused(j, {"test.json: decoder: expected a value, found none"});
  j = good;
  j["model"]["type"] = "WordPiece";
  refused(j, {"model.type", "\"BPE\"", "WordPiece"});
  j = good;
  j["model"]["dropout"] = 0.1;
  refused(j, {"model.dropout", "null"});
  j = good;
  j["model"]["byte_fallback"] = true;
  refused(j, {"model.byte_fallback", "false"});
  j = good;
  j["model"]["vocab"]["zz"] = -1;
  refused(j, {"model.vocab[\"zz\"]", "a token id", "-1"});
  j["model"]["vocab"]["zz"] = 1.5;
  refused(j, {"model.vocab[\"zz\"]", "a token id", "1.5"});
  j["model"]["vocab"]["zz"] = 3;
  refused(j, {"model.vocab", "an id of its own", "3"});
  j = good;
  j["model"]["vocab"].erase(grad::hf::byte_to_symbol(0x00));
  refused(j, {"model.vocab", "every byte's symbol", "0x0"});
  j = good;
  j["model"]["merges"].push_back("ab");
  refused(j, {"model.merges[1]", "\"left right\""});
  j["model"]["merges"][1] = json::array({"a", 5});
  refused(j, {"model.merges[1]", "[\"left\", \"right\"]"});
  j["model"]["merges"][1] = "a q\xC3\xA9";
  refused(j, {"model.merges[1]", "tokens of model.vocab", "q\xC3\xA9"});
  j["model"]["merges"][1] = "b a";
  refused(j, {"model.merges[1]", "whose result is in model.vocab", "ba"});
  j = good;
  j["normalizer"] = {{"type", "NFC"}};
  if (grad::hf::normalizes_nfc()) {  // composed (the NFC test case): loads as it is
    CHECK(load(j).encode("ab") == std::vector<int>{256});
  } else {
    refused(j, {"normalizer.type", "NFC", "utf8proc", "assume_nfc"});
    CHECK(Tokenizer::from_json(j.dump(), "test.json", {.assume_nfc = true}).encode("ab") == std::vector<int>{256});
  }
  j["normalizer"] = {{"type", "Lowercase"}};
  refused(j, {"normalizer.type", "null or NFC", "Lowercase"});
  j = good;
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  refused(j, {"pre_tokenizer.type", "ByteLevel, Split or Sequence", "Whitespace"});
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {byte_level(false), split("(")}}};
  refused(j, {"pre_tokenizer.pretokenizers[1].pattern", "a regular expression", "PCRE2"});
  j["pre_tokenizer"] = split("a", "Sideways");
  refused(j, {"pre_tokenizer.behavior", "Isolated", "Sideways"});
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Glob", "*"}}}, {"behavior", "Isolated"}};
  refused(j, {"pre_tokenizer.pattern", "{\"Regex\": ...}"});
  j = good;
  j["decoder"] = {{"type", "WordPiece"}};
  refused(j, {"decoder", "ByteLevel"});
  j = good;
  j["added_tokens"] = {{{"id", 5}, {"content", "<x>"}}};
  refused(j, {"added_tokens[0].id", "an id that is free", "5"});
  j["added_tokens"] = {{{"id", 500}, {"content", "<x>"}, {"single_word", true}}};
  refused(j, {"added_tokens[0].single_word", "false"});
  j["added_tokens"] = {{{"id", 500}, {"content", ""}}};
  refused(j, {"added_tokens[0].content", "non-empty"});
  j["added_tokens"] = {{{"id", 500}}};
  refused(j, {"added_tokens[0].content", "found none"});
  j = good;
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
                         {"special_tokens", json::object()}};
  refused(j, {"post_processor.special_tokens", "\"<s>\"", "post_processor.single[0]"});
  j["post_processor"] = {{"type", "RobertaProcessing"}};
  refused(j, {"post_processor.type", "TemplateProcessing", "RobertaProcessing"});
}

TEST_CASE("from_file reads the file and names it in errors") {
  const auto dir = std::filesystem::temp_directory_path() / "grad_test_tokenizer";
  std::filesystem::create_directories(dir);
  json j = make({{"a", "b"}}, byte_level());
  std::ofstream(dir / "tokenizer.json") << j.dump();
  CHECK(Tokenizer::from_file(dir / "tokenizer.json").encode("ab") == std::vector<int>{256});
  j["model"]["merges"][0] = 7;
  std::ofstream(dir / "bad.json") << j.dump();
  const std::string expected = (dir / "bad.json").string() + ": model.merges[0]: expected";
  CHECK_THROWS_WITH_AS(Tokenizer::from_file(dir / "bad.json"), doctest::Contains(expected.c_str()), TokenizerError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("an NFC normalizer composes the text between added tokens: decomposed (NFD) text encodes as composed") {
  // Qwen2's pipeline: NFC, its Split, ByteLevel; "caf\u00e9" merged into one token.
  const std::string nfc = "caf\xc3\xa9", nfd = "cafe\xcc\x81";
  json j = make({{"c", "a"}, {"ca", "f"}, {"\xc3", "\xa9"}, {"caf", "\xc3\xa9"}},
                json{{"type", "Sequence"}, {"pretokenizers", {split(qwen_pattern), byte_level(false)}}});
  j["normalizer"] = {{"type", "NFC"}};
  j["added_tokens"] = {{{"id", 300}, {"content", "e\xcc\x81!"}, {"special", true}, {"normalized", false}}};
  if (!grad::hf::normalizes_nfc()) {
    // Without utf8proc: refused at load, or with assume_nfc, refused for text that is not ASCII.
    refused(j, {"normalizer.type", "utf8proc"});
    const Tokenizer t = Tokenizer::from_json(j.dump(), "test.json", {.assume_nfc = true});
    CHECK(t.encode("cafe").size() == 2);
    CHECK_THROWS_AS(t.encode(nfd), TokenizerError);
    return;
  }
  const Tokenizer t = load(j);
  CHECK(t.has_nfc_normalizer());
  const std::vector<int> composed = t.encode(nfc);
  CHECK(composed.size() == 1);
  CHECK(t.encode(nfd) == composed);  // was 5 ids: c a f e U+0301's two bytes, never merged
  CHECK(t.encode(" " + nfd + " " + nfd) == t.encode(" " + nfc + " " + nfc));
  // An added token that is not `normalized` is found in the raw text first, decomposed as it is.
  CHECK(t.encode("e\xcc\x81!" + nfd) == std::vector<int>{300, composed[0]});
  // Bytes that are not UTF-8 stay as they are; the UTF-8 around them is composed.
  CHECK(t.decode(t.encode("\xff" + nfd + "\xc3")) == "\xff" + nfc + "\xc3");
  // Without a normalizer the decomposed text is its own bytes.
  j["normalizer"] = nullptr;
  CHECK_FALSE(load(j).has_nfc_normalizer());
  CHECK(load(j).encode(nfd) != composed);
}

TEST_CASE("llama_cpp_pre names GPT-2's, Qwen2's and Llama 3's pre-tokenizers as llama.cpp does, and refuses others") {
  using grad::hf::llama_cpp_pre;
  const std::string gpt2_split = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
  const std::string llama3_split =
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
  auto sequence = [](const json& split_step) {
    return json{{"type", "Sequence"}, {"pretokenizers", {split_step, byte_level(false)}}};
  };
  CHECK(llama_cpp_pre(load(make({}, byte_level()))) == "gpt-2");
  CHECK(llama_cpp_pre(load(make({}, sequence(split(gpt2_split))))) == "gpt-2");
  CHECK(llama_cpp_pre(load(make({}, sequence(split(qwen_pattern))))) == "qwen2");
  CHECK(llama_cpp_pre(load(make({}, sequence(split(llama3_split))))) == "llama-bpe");
  // bpe_vocab takes the name from the tokenizer (it was "qwen2" whatever the tokenizer), or the caller's.
  CHECK(grad::hf::bpe_vocab(load(make({}, byte_level()))).pre == "gpt-2");
  CHECK(grad::hf::bpe_vocab(load(make({}, sequence(split(llama3_split))))).pre == "llama-bpe");
  CHECK(grad::hf::bpe_vocab(load(make({}, split("[a-z]+"))), 0, "qwen2").pre == "qwen2");
  auto refused_pre = [](const json& pre, std::initializer_list<std::string> parts) {
    std::string message;
    try {
      llama_cpp_pre(load(make({}, pre)));
    } catch (const TokenizerError& e) {
      message = e.what();
    }
    INFO("message: " << message);
    REQUIRE_FALSE(message.empty());
    for (const std::string& p : parts) CHECK(message.find(p) != std::string::npos);
    CHECK_THROWS_AS(grad::hf::bpe_vocab(load(make({}, pre))), TokenizerError);
  };
  refused_pre(split("[a-z]+"), {"Split(Regex \"[a-z]+\", Isolated)", "gpt-2", "qwen2", "llama-bpe"});
  refused_pre(sequence(split(qwen_pattern, "Removed")),
              {"Removed", "ByteLevel(add_prefix_space false, use_regex false)"});
  refused_pre(json{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"use_regex", true}},
              {"ByteLevel(add_prefix_space true, use_regex true)"});
  refused_pre(nullptr, {"[none]"});
}

TEST_CASE("bpe_vocab: a tokenizer.json as GGUF's vocabulary: spellings by id, merges by rank, added tokens typed") {
  using grad::hf::TokenType;
  // Merged tokens are ids 256 .. 259; 260 and 262 are gaps.
  json j = make({{"h", "e"}, {"l", "l"}, {"he", "ll"}, {" ", "w"}}, byte_level());
  const int eot = 261, user = 263;
  j["added_tokens"] = {{{"id", eot}, {"content", "<|endoftext|>"}, {"special", true}},
                       {{"id", user}, {"content", "<|user|>"}, {"special", false}}};
  const Tokenizer t = load(j);
  const std::size_t model_vocab = 266;  // two rows more than the tokenizer, as checkpoints pad their embedding
  const grad::hf::BpeVocab v = grad::hf::bpe_vocab(t, model_vocab);
  REQUIRE(v.tokens.size() == model_vocab);
  REQUIRE(v.token_types.size() == model_vocab);
  for (int b = 0; b < 256; ++b) {
    CAPTURE(b);
    CHECK(v.tokens[b] == grad::hf::byte_token(static_cast<unsigned char>(b)));
    CHECK(v.token_types[b] == TokenType::normal);
  }
  const std::string G = grad::hf::byte_token(' ');
  CHECK(v.tokens[256] == "he");
  CHECK(v.tokens[258] == "hell");
  CHECK(v.tokens[259] == G + "w");
  CHECK(v.merges == std::vector<std::string>{"h e", "l l", "he ll", G + " w"});
  CHECK(v.tokens[eot] == "<|endoftext|>");
  CHECK(v.token_types[eot] == TokenType::control);
  CHECK(v.tokens[user] == "<|user|>");
  CHECK(v.token_types[user] == TokenType::user_defined);
  for (int gap : {260, 262, 264, 265}) {
    CAPTURE(gap);
    CHECK(v.tokens[gap] == "[PAD" + std::to_string(gap) + "]");
    CHECK(v.token_types[gap] == TokenType::unused);
  }
  CHECK(v.eos == std::optional<std::uint32_t>(eot));
  CHECK_FALSE(v.bos.has_value());
  CHECK(v.pre == "gpt-2");  // GPT-2's ByteLevel pre-tokenizer
  CHECK_FALSE(v.add_bos);
  CHECK(grad::hf::check_vocab(v, model_vocab).empty());
  // Without a model size: the tokenizer's ids; a model with fewer is refused naming both counts.
  CHECK(grad::hf::bpe_vocab(t).tokens.size() == 264);
  CHECK(grad::hf::check_vocab(grad::hf::bpe_vocab(t), 200).find("264 tokens, the model's vocabulary 200") !=
        std::string::npos);
  // A repeated merge counts once, at its last rank (as encode applies it); bos from <s>.
  j["model"]["merges"].push_back("h e");
  j["added_tokens"].push_back({{"id", 264}, {"content", "<s>"}, {"special", true}});
  const grad::hf::BpeVocab again = grad::hf::bpe_vocab(load(j));
  CHECK(again.merges == std::vector<std::string>{"l l", "he ll", G + " w", "h e"});
  CHECK(again.bos == std::optional<std::uint32_t>(264));
  CHECK_FALSE(again.add_bos);
  // A template that puts bos before the text (Llama 3's): llama.cpp is told to add it too.
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {{{"SpecialToken", {{"id", "<s>"}}}}, {{"Sequence", {{"id", "A"}}}}}},
                         {"special_tokens", {{"<s>", {{"ids", {264}}}}}}};
  CHECK(grad::hf::bpe_vocab(load(j)).add_bos);
}

TEST_CASE("byte_level_tokenizer_json: grad's byte models' tokenizer.json encodes every byte as its id") {
  const Tokenizer t = Tokenizer::from_json(grad::hf::byte_level_tokenizer_json(), "bytes.json");
  CHECK(t.vocab_size() == 256);
  CHECK(t.merges().empty());
  std::mt19937 rng(7);
  for (int round = 0; round < 50; ++round) {
    std::string s(rng() % 40, '\0');
    for (char& c : s) c = static_cast<char>(rng() % 256);
    std::vector<int> bytes;
    for (char c : s) bytes.push_back(static_cast<unsigned char>(c));
    CAPTURE(round);
    CHECK(t.encode(s) == bytes);
    CHECK(t.decode(bytes) == s);
  }
}

// ------------------------------------------------------ hostile input files --

namespace {

// The message of the TokenizerError f throws ("" when it throws none).
template <class F>
std::string tokenizer_error(F&& f) {
  try {
    f();
  } catch (const TokenizerError& e) {
    return e.what();
  }
  return "";
}

// j's JSON with the string "HERE" replaced by `text`.
std::string with_text(const json& j, const std::string& text) {
  std::string out = j.dump();
  out.replace(out.find("\"HERE\""), 6, text);
  return out;
}

// `depth` Sequences (of pre-tokenizers or post-processors: `list` names
// the field), one inside the next, around `inner`.
std::string nested_sequences(std::size_t depth, const std::string& list, const std::string& inner) {
  std::string s;
  for (std::size_t i = 0; i < depth; ++i) s += "{\"type\": \"Sequence\", \"" + list + "\": [";
  s += inner;
  for (std::size_t i = 0; i < depth; ++i) s += "]}";
  return s;
}

// Bytes malloc has handed out and not had back (glibc: the main arena and mmapped chunks).
std::size_t heap_in_use() {
  const struct mallinfo2 m = ::mallinfo2();
  return m.uordblks + m.hblkhd;
}

}  // namespace

TEST_CASE("tokenizer.json nested past 64 levels is refused before it is parsed, naming the bound") {
  // A value 200,000 arrays deep where nothing reads it, and 20,000 nested
  // Sequences: the reader recursed per level (a stack overflow) and built a
  // field name that grew per level (443 MB at 5,000).
  const json j = make({}, "HERE");
  json truncation = make({}, byte_level()), post = make({}, byte_level());
  truncation["truncation"] = "HERE";
  post["post_processor"] = "HERE";
  for (const std::string& text :
       {with_text(truncation, std::string(200000, '[') + std::string(200000, ']')),
        with_text(j, nested_sequences(20000, "pretokenizers", byte_level().dump())),
        with_text(post, nested_sequences(20000, "processors", "{\"type\": \"ByteLevel\"}"))}) {
    const std::string message = tokenizer_error([&] { Tokenizer::from_json(text, "deep.json"); });
    CAPTURE(message);
    CHECK(message.rfind("deep.json: arrays and objects nest deeper than 64 levels (at byte ", 0) == 0);
  }
  // 30 Sequences (62 levels with the file's own) are read, as one ByteLevel.
  const Tokenizer t = Tokenizer::from_json(with_text(j, nested_sequences(30, "pretokenizers", byte_level().dump())));
  CHECK(t.encode("Hello world") == load(make({}, byte_level())).encode("Hello world"));
}

TEST_CASE("a token id far beyond the tokens the file lists is refused, not allocated") {
  // Ids index dense tables: one id of 2147483647 in a 4 KB file ended in std::bad_alloc.
  json j = make({}, byte_level());
  j["added_tokens"] = json::array({{{"id", 2147483647}, {"content", "<big>"}, {"special", true}}});
  refused(j, {"added_tokens[0].id", "an id below 1538", "257 tokens the file lists", "found 2147483647"});
  j = make({}, byte_level());
  j["model"]["vocab"]["zz"] = 2147483647;
  refused(j, {"model.vocab[\"zz\"]", "an id below 1538", "found 2147483647"});
  // Holes below the bound are kept as before.
  j = make({}, byte_level());
  j["added_tokens"] = json::array({{{"id", 1000}, {"content", "<end>"}, {"special", true}}});
  const Tokenizer t = load(j);
  CHECK(t.vocab_size() == 1001);
  CHECK(t.encode("a<end>") == std::vector<int>{'a', 1000});
}

TEST_CASE("from_file reads regular files only, to a stated bound: a FIFO, /dev/zero or a directory is refused at once") {
  const auto dir = std::filesystem::temp_directory_path() / ("grad_test_tokenizer_files_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  // A FIFO blocked the reader forever. A writer is held open here, so that
  // a reader that does wait returns (at the end of the file) once it is
  // closed, 10 s on, instead of hanging the suite.
  const std::string fifo = (dir / "fifo.json").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const int writer = ::open(fifo.c_str(), O_RDWR | O_NONBLOCK);
  REQUIRE(writer >= 0);
  auto reading = std::async(std::launch::async, [&] { return tokenizer_error([&] { Tokenizer::from_file(fifo); }); });
  const bool returned = reading.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
  ::close(writer);
  const std::string message = reading.get();
  REQUIRE(returned);
  CHECK(message == fifo + ": is a FIFO, not a regular file");
  // A symbolic link to /dev/zero was read until memory ran out.
  std::filesystem::create_symlink("/dev/zero", dir / "zero.json");
  CHECK_THROWS_WITH_AS(Tokenizer::from_file(dir / "zero.json"),
                       ((dir / "zero.json").string() + ": is a character device, not a regular file").c_str(),
                       TokenizerError);
  CHECK_THROWS_WITH_AS(Tokenizer::from_file(dir), (dir.string() + ": is a directory, not a regular file").c_str(),
                       TokenizerError);
  // Past 1 GiB (a sparse file: no disk, and nothing is read).
  const auto huge = dir / "huge.json";
  std::ofstream(huge).put('{');
  std::filesystem::resize_file(huge, (std::uintmax_t{1} << 30) + 1);
  CHECK_THROWS_WITH_AS(Tokenizer::from_file(huge),
                       (huge.string() + ": 1073741825 bytes: more than the 1073741824 this reader takes").c_str(),
                       TokenizerError);
  std::filesystem::remove_all(dir);
}

TEST_CASE("encode's cache is bounded in bytes, and long pieces are merged each time rather than kept") {
  const Tokenizer t = load(make({}, nullptr));  // no pre-tokenizer: each text is one piece
  // 100 distinct 64 KB words: each cached piece kept its bytes and 4 bytes of id per byte (100 distinct 1 MB words kept 244 MB).
  std::size_t before = heap_in_use();
  std::string word(64 << 10, 'a');
  for (int i = 0; i < 100; ++i) {
    const std::string n = std::to_string(i);
    word.replace(0, n.size(), n);
    REQUIRE(t.encode(word).size() == word.size());
  }
  CHECK(heap_in_use() < before + (1 << 20));
  // 40,000 distinct 250-byte words fit the cache's entries (65,536), not its 16 MiB: about 53 MB kept before.
  before = heap_in_use();
  std::string shorter(250, 'b');
  for (int i = 0; i < 40000; ++i) {
    const std::string n = std::to_string(i);
    shorter.replace(0, n.size(), n);
    REQUIRE(t.encode(shorter).size() == shorter.size());
  }
  CHECK(heap_in_use() < before + (24 << 20));
}

TEST_CASE("a Split pattern that backtracks on every piece is stopped by the encode's budget, naming it and the byte") {
  // PCRE2's match limit bounds one call; (?:(a|a)*b|a) on runs of a stays
  // under it call after call, and took 4 s per 1.15 KB.
  json j = make({}, json{{"type", "Sequence"}, {"pretokenizers", {split("(?:(a|a)*b|a)"), byte_level(false)}}});
  const Tokenizer t = load(j);
  std::string text;
  for (int i = 0; i < 60; ++i) text += std::string(20, 'a') + " ";
  const auto start = std::chrono::steady_clock::now();
  const std::string message = tokenizer_error([&] { t.encode(text); });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CAPTURE(message);
  CHECK(message.rfind("grad::hf::Tokenizer::encode: pre_tokenizer.pretokenizers[0].pattern ((?:(a|a)*b|a)) used up "
                      "the pattern work one encode may do, 11290240 match-limit units (10000000 + 1024 per byte of "
                      "the 1260-byte text), at byte ",
                      0) == 0);
  CHECK(seconds < 1.0);
  // Ordinary text stays far inside the budget: 256 KB of it through Qwen2's pattern.
  const Tokenizer qwen = load(make({}, json{{"type", "Sequence"}, {"pretokenizers", {split(qwen_pattern), byte_level(false)}}}));
  std::string prose;
  while (prose.size() < (256 << 10)) prose += "It's 2024, and the quick brown fox jumps over 13 lazy dogs!\n  ";
  CHECK(qwen.encode(prose).size() > prose.size() / 8);
}
