// Byte-level BPE tokenizers from Hugging Face `tokenizer.json` files, as
// GPT-2, Qwen2 and Llama 3 ship them: grad::hf::Tokenizer (library grad_hf,
// pkg-config grad-hf; the header-only core never needs it).
//
//   auto tok = grad::hf::Tokenizer::from_file("tokenizer.json");  // throws TokenizerError
//   std::vector<int> ids = tok.encode("Hello<|endoftext|> world"); // [15496, 50256, 995]
//   std::string text = tok.decode(ids);                            // the bytes again
//   tok.token_to_id("<|endoftext|>");                              // 50256 (nullopt if absent)
//
// What encode does, in Hugging Face's order:
//   1. added tokens (`added_tokens`: <|endoftext|>, <|im_start|>, ...) are
//      found first, leftmost-longest, on the raw text; they become their ids
//      and are never split (lstrip / rstrip take the whitespace beside them);
//   2. each stretch between them is pre-tokenized: `pre_tokenizer` is a Split
//      (a regex, behavior Isolated, Removed, MergedWithPrevious,
//      MergedWithNext or Contiguous, invert), a ByteLevel (add_prefix_space;
//      use_regex: GPT-2's pattern), or a Sequence of them. Patterns run on
//      PCRE2 with UTF and Unicode properties (`\p{L}`, `\p{N}`, `(?i:...)`);
//      `\s` and `\S` mean Unicode White_Space as in Oniguruma, which Hugging
//      Face uses;
//   3. each piece's bytes become byte symbols (GPT-2's byte <-> character
//      map) and merge by rank, lowest rank first and leftmost on ties
//      (`model.merges`, "a b" strings or ["a", "b"] pairs; `ignore_merges`:
//      a piece that is itself in the vocabulary is taken whole);
//   4. with add_special_tokens, the TemplateProcessing post-processor's
//      single-sequence template adds its tokens (Llama 3's <|begin_of_text|>).
// Every byte has a symbol (loading checks all 256 are in the vocabulary), so
// any input encodes, valid UTF-8 or not: bytes that are not valid UTF-8 match
// no pattern item and stay pieces of their own, and decode(encode(s)) == s
// for every byte string s.
//
// decode maps each token's characters back to bytes (a token with a
// character outside the byte map, such as most added tokens, is its own
// UTF-8), as Hugging Face's ByteLevel decoder does, but returns the bytes
// as they are: where Hugging Face would put U+FFFD for bytes that are not
// UTF-8, grad returns the bytes.
//
// Supported: model BPE (no dropout, no continuing_subword_prefix,
// end_of_word_suffix or byte_fallback), normalizer null or NFC, pre-tokenizers
// above, decoder ByteLevel, post-processor null, ByteLevel or
// TemplateProcessing. Anything else, and every malformed field, is refused
// at load with a TokenizerError naming the file, the field and what was
// expected. An NFC normalizer (Qwen2's) composes the text between added
// tokens with utf8proc (Unicode's canonical composition, as Hugging Face's
// NFC), after the added tokens that are not `normalized` are found and
// before the `normalized` ones: "cafe\u0301" encodes as "caf\u00e9" does.
// Bytes that are not UTF-8 are left as they are (Hugging Face takes no
// such text). A grad_hf built without utf8proc (libutf8proc-dev) cannot
// compose: it refuses an NFC tokenizer at load unless the caller vouches
// that its text is NFC already (LoadOptions::assume_nfc), and then refuses
// (encode throws TokenizerError) any text between added tokens that is not
// ASCII, rather than tokenize text that might not be NFC differently from
// Hugging Face. normalizes_nfc() says which build this is.
//
// A Tokenizer is immutable after loading and safe to use from several
// threads; encode keeps a cache of pieces it has merged, bounded in entries
// and in bytes (pieces over 256 bytes are not kept).
//
// Hostile files are refused, not obeyed: from_file reads regular files only
// (a FIFO, device or directory is refused at once), of at most 1 GiB; JSON
// nested deeper than 64 levels is refused before it is parsed; a token id
// beyond twice the number of tokens the file lists (plus 1024) is refused,
// since ids index dense tables; messages quote at most a few hundred bytes
// of a value. Pattern work is bounded per encode, not only per PCRE2 call:
// 10^7 match-limit units plus 1024 per byte of text.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace grad::hf {

// A tokenizer.json that cannot be used: what(), "tokenizer.json: model.merges[12]:
// expected ...", names the file, the field and what was expected.
struct TokenizerError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct LoadOptions {
  // Only for a grad_hf built without utf8proc (normalizes_nfc() false):
  // accept an NFC normalizer, the caller vouching that its text is NFC
  // already (encode still refuses text between added tokens that is not
  // ASCII). With utf8proc the NFC normalizer is applied and this changes nothing.
  bool assume_nfc = false;
};

// One step of a tokenizer.json's pre-tokenizer (a Sequence flattened), as
// the file spells it: what a converter needs to name it (hf::llama_cpp_pre).
struct PreTokenizerStep {
  enum class Kind : std::uint8_t { split, byte_level };
  Kind kind = Kind::split;
  // split: the pattern as tokenizer.json writes it; `regex` false for a
  // {"String": ...} (a literal); behavior as written ("Isolated", ...).
  std::string pattern;
  bool regex = true;
  std::string behavior;
  bool invert = false;
  // byte_level: its settings (use_regex: GPT-2's pattern, Isolated).
  bool add_prefix_space = false, use_regex = true;
};

// Whether this grad_hf composes NFC itself (built with utf8proc).
bool normalizes_nfc();

class Tokenizer {
 public:
  // Reads and checks a tokenizer.json; throws TokenizerError.
  static Tokenizer from_file(const std::filesystem::path& path, LoadOptions options = {});
  // The same from the file's text; `name` stands for the file in messages.
  static Tokenizer from_json(std::string_view json, std::string_view name = "tokenizer.json",
                             LoadOptions options = {});

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

  // Any bytes (see above). add_special_tokens: apply the post-processor's
  // template, as Hugging Face's encode does by default. Throws
  // TokenizerError only if a pattern backtracks past the encode's budget
  // (above) or PCRE2 fails otherwise, naming the pattern and the byte.
  std::vector<int> encode(std::string_view text, bool add_special_tokens = true) const;
  // An id >= 0 with no token (a gap in the ids, or a padding row of the
  // model's embedding beyond vocab_size()) is skipped, as Hugging Face's
  // decode skips it. Throws std::out_of_range naming a negative id and its position.
  std::string decode(std::span<const int> ids, bool skip_special_tokens = false) const;

  // The token's id in the vocabulary or the added tokens; nullopt if neither.
  std::optional<int> token_to_id(std::string_view token) const;
  // The token as tokenizer.json spells it (byte-level characters: "Ġworld");
  // nullopt for an id with no token.
  std::optional<std::string> id_to_token(int id) const;
  // One past the largest id, counting the added tokens: the embedding rows a model needs.
  std::size_t vocab_size() const;

  // What a converter needs (hf::bpe_vocab, GGUF export). The merges in
  // rank order, highest priority first, as the two tokens' spellings ("Ġ",
  // "w"); a pair the file repeats appears once, at the rank encode uses.
  std::vector<std::pair<std::string, std::string>> merges() const;
  // Whether the id is one of `added_tokens`, and whether it is marked special.
  bool is_added(int id) const;
  bool is_special(int id) const;
  // The pre-tokenizer's steps in the order they run (empty: none).
  std::vector<PreTokenizerStep> pre_tokenizer() const;
  // Whether tokenizer.json declares an NFC normalizer.
  bool has_nfc_normalizer() const;

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The tokenizer.json of grad's byte-level models (nn::ByteTokenizer): the
// 256 byte symbols as ids 0 .. 255 in byte order, no merges, GPT-2's
// ByteLevel pre-tokenizer and decoder. Loaded, it encodes any bytes as
// nn::ByteTokenizer does; a Hugging Face directory written from a grad
// model file carries it (tinylm export --hf).
std::string byte_level_tokenizer_json();

// GPT-2's byte <-> character map (ByteLevel): printable bytes stand for
// themselves, the other 68 for U+0100 .. U+0143 in byte order. The UTF-8 of
// byte b's character, and the inverse (nullopt for a character not in the map).
std::string byte_to_symbol(unsigned char b);
std::optional<unsigned char> symbol_to_byte(char32_t c);

}  // namespace grad::hf
