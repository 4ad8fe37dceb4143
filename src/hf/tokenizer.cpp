// grad::hf::Tokenizer: tokenizer.json byte-level BPE (include/grad/hf/tokenizer.hpp
// says what is supported and in which order encode works).
#define PCRE2_CODE_UNIT_WIDTH 8
#include "grad/hf/tokenizer.hpp"
#include "grad/regular_file.hpp"

#include <pcre2.h>
#ifdef GRAD_HF_UTF8PROC
#include <utf8proc.h>
#endif

#include "bounded_input.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <utility>

namespace grad::hf {

namespace {

using json = nlohmann::json;
using detail::json_excerpt;
using detail::text_excerpt;

// ---- GPT-2's byte <-> character map -------------------------------------

constexpr bool byte_is_printable(unsigned b) {
  return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

std::array<char32_t, 256> make_byte_chars() {
  std::array<char32_t, 256> chars{};
  char32_t next = 256;
  for (unsigned b = 0; b < 256; ++b) chars[b] = byte_is_printable(b) ? char32_t(b) : next++;
  return chars;
}
const std::array<char32_t, 256> byte_chars = make_byte_chars();

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

// The code point at s[i] and its length in bytes, for valid UTF-8 (the JSON
// parser has checked every string we decode); {0, 1} at a stray byte.
std::pair<char32_t, std::size_t> decode_utf8(std::string_view s, std::size_t i) {
  const auto b = static_cast<unsigned char>(s[i]);
  const std::size_t len = b < 0x80 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
  if (len == 0 || i + len > s.size()) return {0, 1};
  char32_t c = len == 1 ? b : len == 2 ? (b & 0x1F) : len == 3 ? (b & 0x0F) : (b & 0x07);
  for (std::size_t k = 1; k < len; ++k) {
    const auto cont = static_cast<unsigned char>(s[i + k]);
    if ((cont & 0xC0) != 0x80) return {0, 1};
    c = (c << 6) | (cont & 0x3F);
  }
  return {c, len};
}

// Unicode White_Space (Rust's char::is_whitespace, Oniguruma's \s).
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// ---- reading tokenizer.json ---------------------------------------------

// Where a value sits in the file, for messages: "tokenizer.json: model.merges[3]".
// A field of the top-level object is its key alone ("model"); the parent "" is the top level.
std::string path_of(const std::string& field, const std::string& key) { return field.empty() ? key : field + "." + key; }

struct Where {
  std::string file;
  [[noreturn]] void fail(const std::string& field, const std::string& expected) const {
    throw TokenizerError(file + ": " + field + ": expected " + expected);
  }
};

std::string kind_of(const json& j) {
  return j.is_null() ? "null" : j.is_boolean() ? "a boolean" : j.is_number() ? "a number"
       : j.is_string() ? "a string" : j.is_array() ? "an array" : "an object";
}

const json& member(const Where& w, const json& obj, const std::string& field, const std::string& key) {
  const auto it = obj.find(key);
  if (it == obj.end()) w.fail(path_of(field, key), "a value, found none");
  return *it;
}

const json& object_at(const Where& w, const json& obj, const std::string& field, const std::string& key) {
  const json& j = member(w, obj, field, key);
  if (!j.is_object()) w.fail(path_of(field, key), "an object, found " + kind_of(j));
  return j;
}

std::string string_of(const Where& w, const json& j, const std::string& field) {
  if (!j.is_string()) w.fail(field, "a string, found " + kind_of(j));
  return j.get<std::string>();
}

// A flag that may be missing (then `fallback`) but is a boolean when present.
bool flag(const Where& w, const json& obj, const std::string& field, const std::string& key, bool fallback) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) w.fail(field + "." + key, "true or false, found " + kind_of(*it));
  return it->get<bool>();
}

// A token id: a non-negative integer that fits an int.
int id_of(const Where& w, const json& j, const std::string& field) {
  if (!j.is_number_unsigned() || j.get<std::uint64_t>() > std::uint64_t(INT32_MAX))
    w.fail(field, "a token id (an integer 0 .. 2147483647), found " + (j.is_number() ? json_excerpt(j) : kind_of(j)));
  return static_cast<int>(j.get<std::uint64_t>());
}

std::string type_of(const Where& w, const json& obj, const std::string& field) {
  if (!obj.is_object()) w.fail(field, "an object, found " + kind_of(obj));
  return string_of(w, member(w, obj, field, "type"), field + ".type");
}

// A field that must be absent, null or `neutral` (features grad does not implement).
void require_neutral(const Where& w, const json& obj, const std::string& field, const std::string& key,
                     const json& neutral, const std::string& why) {
  const auto it = obj.find(key);
  if (it != obj.end() && !it->is_null() && *it != neutral) w.fail(field + "." + key, why + ", found " + json_excerpt(*it));
}

// ---- patterns on PCRE2 --------------------------------------------------

// Oniguruma's \s (and \S) is Unicode White_Space; PCRE2's leaves out U+0085.
// Rewrites the escapes, keeping an escaped backslash ("\\s") as it is.
std::string onig_to_pcre2(std::string_view pattern) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      out += next == 's' ? "\\p{White_Space}" : next == 'S' ? "\\P{White_Space}" : std::string{'\\', next};
    } else {
      out += pattern[i];
    }
  }
  return out;
}

// A literal string as a pattern: every ASCII punctuation character escaped.
std::string escape_literal(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !std::isalnum(u) && c != ' ') out += '\\';
    out += c;
  }
  return out;
}

// What one thread needs to run patterns: match data and a JIT stack.
struct MatchScratch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  MatchScratch() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~MatchScratch() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;
};

// The pattern work one encode may do, in PCRE2 match-limit units: PCRE2's
// match limit bounds one call, and a pattern that backtracks on every piece
// (`(?:(a|a)*b|a)` on runs of a) stays under it call after call, seconds per
// kilobyte. So the whole encode has a budget: PCRE2's default per-call limit
// once, and 1024 units per byte of input (ordinary patterns spend a few).
constexpr std::uint64_t match_units_base = 10'000'000, match_units_per_byte = 1024;
// A call's first limit; doubled and tried again while it is what stops the
// match. A call is charged every limit it was given (PCRE2 does not say how
// much of one it used), at most about twice what it needed.
constexpr std::uint64_t first_match_limit = 64;

struct MatchBudget {
  std::string_view text;  // the encode's input, for offsets in messages
  std::uint64_t total = 0, left = 0;
  explicit MatchBudget(std::string_view input)
      : text(input), total(match_units_base + match_units_per_byte * input.size()), left(total) {}
  // Where s[at] is in the input: a piece is a view into it, except one a
  // prefix space was added to (then the offset is near it).
  std::size_t offset_of(std::string_view s, std::size_t at) const {
    const auto base = reinterpret_cast<std::uintptr_t>(text.data()), p = reinterpret_cast<std::uintptr_t>(s.data());
    return p >= base && p <= base + text.size() ? static_cast<std::size_t>(p - base) + at : at;
  }
};

class Pattern {
 public:
  Pattern(const Where& w, const std::string& field, const std::string& source)
      : field_(field), source_(text_excerpt(source)) {
    int code = 0;
    PCRE2_SIZE offset = 0;
    // MATCH_INVALID_UTF: bytes that are not UTF-8 match nothing instead of failing the match.
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(source.data()), source.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &offset, nullptr);
    if (!code_) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(code, msg.data(), msg.size());
      w.fail(field, "a regular expression; PCRE2 says at offset " + std::to_string(offset) + ": " +
                        reinterpret_cast<const char*>(msg.data()));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // the interpreter runs it where JIT is unavailable
  }
  Pattern(const Pattern&) = delete;
  Pattern& operator=(const Pattern&) = delete;
  ~Pattern() { pcre2_code_free(code_); }

  // The non-empty matches in s, in order: [begin, end) byte offsets; the
  // work charged to `budget`.
  std::vector<std::pair<std::size_t, std::size_t>> matches(std::string_view s, MatchBudget& budget) const {
    thread_local MatchScratch scratch;
    std::vector<std::pair<std::size_t, std::size_t>> out;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    std::size_t start = 0;
    while (start <= s.size()) {
      int rc = PCRE2_ERROR_MATCHLIMIT;
      for (std::uint64_t limit = first_match_limit; rc == PCRE2_ERROR_MATCHLIMIT; limit *= 2) {
        if (budget.left == 0)
          throw TokenizerError("grad::hf::Tokenizer::encode: " + field_ + " (" + source_ + ") used up the pattern work " +
                               "one encode may do, " + std::to_string(budget.total) + " match-limit units (" +
                               std::to_string(match_units_base) + " + " + std::to_string(match_units_per_byte) +
                               " per byte of the " + std::to_string(budget.text.size()) +
                               "-byte text), at byte " + std::to_string(budget.offset_of(s, start)) +
                               ": it backtracks too much on this text");
        limit = std::min({limit, budget.left, std::uint64_t{UINT32_MAX}});
        pcre2_set_match_limit(scratch.context, static_cast<std::uint32_t>(limit));
        rc = pcre2_match(code_, subject, s.size(), start, 0, scratch.data, scratch.context);
        budget.left -= limit;
      }
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        std::array<PCRE2_UCHAR, 256> msg{};
        pcre2_get_error_message(rc, msg.data(), msg.size());
        throw TokenizerError("grad::hf::Tokenizer::encode: " + field_ + " (" + source_ + ") failed at byte " +
                             std::to_string(budget.offset_of(s, start)) + ": " +
                             reinterpret_cast<const char*>(msg.data()));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(scratch.data);
      if (ov[1] > ov[0]) {
        out.emplace_back(ov[0], ov[1]);
        start = ov[1];
      } else {  // an empty match: look again one character on
        start = ov[0] + 1;
        while (start < s.size() && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) ++start;
      }
    }
    return out;
  }

 private:
  std::string field_, source_;  // for messages: where the pattern is in the file, and (the start of) it
  pcre2_code* code_ = nullptr;
};

// ---- pre-tokenizers -----------------------------------------------------

// GPT-2's pattern, ByteLevel's when use_regex is on.
constexpr std::string_view gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

struct SplitStep {
  std::unique_ptr<Pattern> pattern;
  Behavior behavior = Behavior::isolated;
  bool invert = false;
};

struct ByteLevelStep {
  bool add_prefix_space = false;
  SplitStep gpt2;  // Isolated on GPT-2's pattern; no pattern when use_regex is off
};

struct Step {
  SplitStep split;        // used when !is_byte_level
  ByteLevelStep byte_level;
  bool is_byte_level = false;
  PreTokenizerStep spelled;  // as the file writes it (Tokenizer::pre_tokenizer)
};

// Cuts s by the pattern's matches as Hugging Face's Split does: matches and
// the stretches between them, combined by the behavior; empty pieces dropped.
void split_piece(const SplitStep& step, std::string_view s, std::vector<std::string_view>& out, MatchBudget& budget) {
  struct Part { std::size_t begin, end; bool match; };
  std::vector<Part> parts;
  std::size_t prev = 0;
  for (auto [b, e] : step.pattern->matches(s, budget)) {
    if (b > prev) parts.push_back({prev, b, step.invert});
    parts.push_back({b, e, !step.invert});
    prev = e;
  }
  if (prev < s.size()) parts.push_back({prev, s.size(), step.invert});

  std::vector<Part> kept;
  bool previous_match = false;
  switch (step.behavior) {
    case Behavior::removed:
      for (const Part& p : parts)
        if (!p.match) kept.push_back(p);
      break;
    case Behavior::isolated:
      kept = std::move(parts);  // parts is not read after the switch
      break;
    case Behavior::merged_with_previous:  // a match joins the piece before it
      for (const Part& p : parts) {
        if (p.match && !previous_match && !kept.empty()) kept.back().end = p.end;
        else kept.push_back(p);
        previous_match = p.match;
      }
      break;
    case Behavior::merged_with_next:  // a match joins the piece after it
      for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
        if (it->match && !previous_match && !kept.empty()) kept.back().begin = it->begin;
        else kept.push_back(*it);
        previous_match = it->match;
      }
      std::reverse(kept.begin(), kept.end());
      break;
    case Behavior::contiguous:  // runs of matches, and of non-matches, become one piece each
      for (std::size_t i = 0; i < parts.size(); ++i) {
        if (i > 0 && parts[i].match == previous_match) kept.back().end = parts[i].end;
        else kept.push_back(parts[i]);
        previous_match = parts[i].match;
      }
      break;
  }
  for (const Part& p : kept)
    if (p.end > p.begin) out.push_back(s.substr(p.begin, p.end - p.begin));
}

Behavior behavior_of(const Where& w, const json& j, const std::string& field) {
  const std::string b = string_of(w, j, field);
  if (b == "Removed") return Behavior::removed;
  if (b == "Isolated") return Behavior::isolated;
  if (b == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (b == "MergedWithNext") return Behavior::merged_with_next;
  if (b == "Contiguous") return Behavior::contiguous;
  w.fail(field, "Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous, found \"" + text_excerpt(b) + "\"");
}

void read_pre_tokenizer(const Where& w, const json& j, const std::string& field, std::vector<Step>& steps) {
  const std::string type = type_of(w, j, field);
  if (type == "Sequence") {
    const json& list = member(w, j, field, "pretokenizers");
    if (!list.is_array()) w.fail(field + ".pretokenizers", "an array, found " + kind_of(list));
    for (std::size_t i = 0; i < list.size(); ++i)
      read_pre_tokenizer(w, list[i], field + ".pretokenizers[" + std::to_string(i) + "]", steps);
  } else if (type == "ByteLevel") {
    Step s;
    s.is_byte_level = true;
    s.byte_level.add_prefix_space = flag(w, j, field, "add_prefix_space", false);
    s.spelled.kind = PreTokenizerStep::Kind::byte_level;
    s.spelled.add_prefix_space = s.byte_level.add_prefix_space;
    s.spelled.use_regex = flag(w, j, field, "use_regex", true);
    if (s.spelled.use_regex)
      s.byte_level.gpt2.pattern = std::make_unique<Pattern>(w, field, onig_to_pcre2(gpt2_pattern));
    steps.push_back(std::move(s));
  } else if (type == "Split") {
    const json& pattern = object_at(w, j, field, "pattern");
    std::string source;
    Step s;
    if (pattern.contains("Regex")) {
      s.spelled.pattern = string_of(w, pattern["Regex"], field + ".pattern.Regex");
      source = onig_to_pcre2(s.spelled.pattern);
    } else if (pattern.contains("String")) {
      s.spelled.pattern = string_of(w, pattern["String"], field + ".pattern.String");
      s.spelled.regex = false;
      source = escape_literal(s.spelled.pattern);
    } else {
      w.fail(field + ".pattern", "{\"Regex\": ...} or {\"String\": ...}, found " + json_excerpt(pattern));
    }
    s.split.pattern = std::make_unique<Pattern>(w, field + ".pattern", source);
    const json& behavior = member(w, j, field, "behavior");
    s.split.behavior = behavior_of(w, behavior, field + ".behavior");
    s.spelled.behavior = behavior.get<std::string>();  // a string: behavior_of checked it
    s.split.invert = flag(w, j, field, "invert", false);
    s.spelled.invert = s.split.invert;
    steps.push_back(std::move(s));
  } else {
    w.fail(field + ".type", "ByteLevel, Split or Sequence, found \"" + text_excerpt(type) + "\"");
  }
}

// ---- added tokens -------------------------------------------------------

struct AddedToken {
  std::string content;
  int id = 0;
  bool special = false, lstrip = false, rstrip = false, normalized = false;
};

// A stretch of the input: an added token's id, or text to pre-tokenize (id -1).
struct Segment {
  std::string_view text;
  int id = -1;
};

// Canonical composition (NFC) of s, as Hugging Face's NFC normalizer: each
// stretch of valid UTF-8 composed by utf8proc, any byte that is not UTF-8
// kept as it is. ASCII is NFC: s itself, nothing allocated.
std::string_view nfc(std::string_view s, std::deque<std::string>& owned, const std::string& file) {
  if (std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; })) return s;
#ifdef GRAD_HF_UTF8PROC
  std::string& out = owned.emplace_back();
  out.reserve(s.size());
  auto compose = [&](std::string_view run) {
    if (run.empty()) return;
    utf8proc_uint8_t* composed = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()), static_cast<utf8proc_ssize_t>(run.size()),
                     &composed, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (n < 0) {
      std::free(composed);
      throw TokenizerError("grad::hf::Tokenizer::encode: " + file + ": NFC: " + utf8proc_errmsg(n));
    }
    out.append(reinterpret_cast<const char*>(composed), static_cast<std::size_t>(n));
    std::free(composed);
  };
  std::size_t run = 0;  // the start of the valid UTF-8 not yet composed
  for (std::size_t i = 0; i < s.size();) {
    utf8proc_int32_t cp = 0;
    const utf8proc_ssize_t len = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                                  static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (len > 0) {
      i += static_cast<std::size_t>(len);
      continue;
    }
    compose(s.substr(run, i - run));
    out += s[i];
    run = ++i;
  }
  compose(s.substr(run));
  return out;
#else
  (void)owned;
  throw TokenizerError("grad::hf::Tokenizer::encode: " + file +
                       " declares an NFC normalizer and the text is not ASCII, but this grad_hf was built without "
                       "utf8proc and cannot compose it (install libutf8proc-dev and rebuild grad)");
#endif
}

}  // namespace

// ---- the tokenizer ------------------------------------------------------

struct Tokenizer::Impl {
  std::string file;
  LoadOptions options;
  std::unordered_map<std::string, int> vocab;    // byte-level spelling -> id
  std::vector<std::optional<std::string>> tokens;  // id -> spelling (vocabulary and added tokens)
  std::vector<std::string> bytes_of;             // id -> the bytes decode writes
  std::vector<bool> special;                     // id -> an added token marked special
  std::array<int, 256> byte_id{};                // byte -> its symbol's id
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<std::uint64_t, std::pair<int, int>> merges;
  bool ignore_merges = false;
  std::vector<Step> steps;
  std::vector<AddedToken> added;
  // Added tokens by first byte, longest first, in the two passes Hugging
  // Face makes: those matched on the raw text, then the `normalized` ones.
  std::array<std::array<std::vector<const AddedToken*>, 256>, 2> added_by_byte;
  std::vector<int> prefix, suffix;  // the post-processor's template around the sequence

  // Looked up by the piece itself (string_view), without copying it.
  struct PieceHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // The cache is bounded in entries and in bytes (each entry counted as its
  // piece, its ids and a node's overhead), and a piece longer than
  // max_cached_piece is merged every time: text is mostly short words, and
  // a hundred distinct 1 MB "words" once kept 244 MB.
  static constexpr std::size_t cache_capacity = 1 << 16;
  static constexpr std::size_t cache_byte_capacity = std::size_t{16} << 20;
  static constexpr std::size_t max_cached_piece = 256;
  static constexpr std::size_t cache_entry_overhead = 96;
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<int>, PieceHash, std::equal_to<>> cache;
  mutable std::size_t cache_bytes = 0;

  // Ids index dense tables (tokens, bytes_of, special), so an id may be at
  // most twice the number of tokens the file lists plus 1024 (room for
  // holes): one id of 2147483647 in a 4 KB file would otherwise allocate
  // tens of gigabytes.
  std::size_t listed_tokens = 0, id_limit = 0;
  void check_id_bound(const Where& w, int id, const std::string& field) const {
    if (std::size_t(id) >= id_limit)
      w.fail(field, "an id below " + std::to_string(id_limit) + " (ids index a dense table: at most twice the " +
                        std::to_string(listed_tokens) + " tokens the file lists, plus 1024), found " +
                        std::to_string(id));
  }

  void read(const json& root);
  void read_model(const Where& w, const json& model);
  void read_added(const Where& w, const json& list);
  void read_post_processor(const Where& w, const json& j, const std::string& field);

  bool nfc_normalizer = false;  // normalizer: NFC
  std::vector<Segment> split_added(std::string_view text, std::deque<std::string>& owned) const;
  void pre_tokenize(std::string_view text, std::deque<std::string>& owned, std::vector<std::string_view>& out,
                    MatchBudget& budget) const;
  void bpe(std::string_view piece, std::vector<int>& out) const;
  void merge(std::string_view piece, std::vector<int>& out) const;
};

void Tokenizer::Impl::read(const json& root) {
  const Where w{file};
  if (!root.is_object()) w.fail("(top level)", "an object, found " + kind_of(root));
  const json& model = object_at(w, root, "", "model");
  const auto vocab_json = model.find("vocab");
  const auto added_json = root.find("added_tokens");
  listed_tokens = (vocab_json != model.end() && vocab_json->is_object() ? vocab_json->size() : 0) +
                  (added_json != root.end() && added_json->is_array() ? added_json->size() : 0);
  id_limit = 2 * listed_tokens + 1024;
  read_model(w, model);

  const auto normalizer = root.find("normalizer");
  if (normalizer != root.end() && !normalizer->is_null()) {
    const std::string type = type_of(w, *normalizer, "normalizer");
    const bool empty_sequence = type == "Sequence" && normalizer->contains("normalizers") &&
                                (*normalizer)["normalizers"].is_array() && (*normalizer)["normalizers"].empty();
    if (type == "NFC" && !normalizes_nfc() && !options.assume_nfc)
      w.fail("normalizer.type",
             "null (this grad_hf was built without utf8proc: it cannot compose NFC), found "
             "\"NFC\"; install libutf8proc-dev and rebuild grad, or, if the text is NFC "
             "already, load with LoadOptions{.assume_nfc = true}");
    if (!empty_sequence && type != "NFC")
      w.fail("normalizer.type",
             "null or NFC (grad implements no other normalizer), found \"" + text_excerpt(type) + "\"");
    nfc_normalizer = type == "NFC";
  }

  const auto pre = root.find("pre_tokenizer");
  if (pre != root.end() && !pre->is_null()) read_pre_tokenizer(w, *pre, "pre_tokenizer", steps);

  const json& decoder = member(w, root, "", "decoder");
  if (decoder.is_null() || type_of(w, decoder, "decoder") != "ByteLevel")
    w.fail("decoder", "{\"type\": \"ByteLevel\"} (byte-level BPE), found " + json_excerpt(decoder));

  const auto added_list = root.find("added_tokens");
  if (added_list != root.end() && !added_list->is_null()) read_added(w, *added_list);

  // After the added tokens: the template names their ids.
  const auto post = root.find("post_processor");
  if (post != root.end() && !post->is_null()) read_post_processor(w, *post, "post_processor");

  // What decode writes per id: Hugging Face's ByteLevel decoder maps a token
  // whose characters are all in the byte map to those bytes, and takes any
  // other token as its UTF-8.
  bytes_of.resize(tokens.size());
  for (std::size_t id = 0; id < tokens.size(); ++id) {
    if (!tokens[id]) continue;
    const std::string& t = *tokens[id];
    std::string bytes;
    bool mapped = true;
    for (std::size_t i = 0; i < t.size() && mapped;) {
      const auto [c, len] = decode_utf8(t, i);
      const auto b = symbol_to_byte(c);
      if (b) bytes += char(*b);
      mapped = b.has_value();
      i += len;
    }
    bytes_of[id] = mapped ? bytes : t;
  }
}

void Tokenizer::Impl::read_model(const Where& w, const json& model) {
  // Older files leave the model's type out; it is BPE when there are merges.
  if (model.contains("type") && type_of(w, model, "model") != "BPE")
    w.fail("model.type", "\"BPE\" (byte-level BPE), found \"" + text_excerpt(model["type"].get<std::string>()) + "\"");
  require_neutral(w, model, "model", "dropout", json(0.0), "null (BPE dropout is a training device grad does not apply)");
  require_neutral(w, model, "model", "continuing_subword_prefix", json(""), "null (byte-level BPE has none)");
  require_neutral(w, model, "model", "end_of_word_suffix", json(""), "null (byte-level BPE has none)");
  require_neutral(w, model, "model", "byte_fallback", json(false), "false (byte-level BPE has every byte)");
  ignore_merges = flag(w, model, "model", "ignore_merges", false);

  const json& vocab_json = object_at(w, model, "model", "vocab");
  vocab.reserve(vocab_json.size());
  for (const auto& [token, value] : vocab_json.items()) {
    const std::string field = "model.vocab[\"" + text_excerpt(token) + "\"]";
    const int id = id_of(w, value, field);
    check_id_bound(w, id, field);
    if (std::size_t(id) >= tokens.size()) tokens.resize(std::size_t(id) + 1);
    if (tokens[id])
      w.fail(field, "an id of its own, found " + std::to_string(id) + ", the id of \"" + text_excerpt(*tokens[id]) +
                        "\" too");
    tokens[id] = token;
    vocab.emplace(token, id);
  }
  for (unsigned b = 0; b < 256; ++b) {
    std::string symbol = byte_to_symbol(static_cast<unsigned char>(b));
    const auto it = vocab.find(symbol);
    if (it == vocab.end()) {
      std::ostringstream hex;
      hex << std::hex << b;
      w.fail("model.vocab", "every byte's symbol (byte-level BPE), found none for byte 0x" + hex.str() + " (\"" +
                                symbol + "\")");
    }
    byte_id[b] = it->second;
  }

  const json& list = member(w, model, "model", "merges");
  if (!list.is_array()) w.fail("model.merges", "an array, found " + kind_of(list));
  merges.reserve(list.size());
  for (std::size_t rank = 0; rank < list.size(); ++rank) {
    const std::string field = "model.merges[" + std::to_string(rank) + "]";
    const json& m = list[rank];
    std::string left, right;
    if (m.is_string()) {
      const std::string s = m.get<std::string>();
      const auto space = s.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == s.size() || s.find(' ', space + 1) != std::string::npos)
        w.fail(field, "\"left right\" (two tokens and one space), found \"" + text_excerpt(s) + "\"");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      w.fail(field, "\"left right\" or [\"left\", \"right\"], found " + json_excerpt(m));
    }
    const auto l = vocab.find(left), r = vocab.find(right), merged = vocab.find(left + right);
    if (l == vocab.end()) w.fail(field, "tokens of model.vocab, found \"" + text_excerpt(left) + "\", which is not");
    if (r == vocab.end()) w.fail(field, "tokens of model.vocab, found \"" + text_excerpt(right) + "\", which is not");
    if (merged == vocab.end())
      w.fail(field, "a merge whose result is in model.vocab, found none for \"" + text_excerpt(left + right) + "\"");
    const std::uint64_t key = (std::uint64_t(std::uint32_t(l->second)) << 32) | std::uint32_t(r->second);
    merges.insert_or_assign(key, std::pair{int(rank), merged->second});  // a repeated pair: the last rank, as Hugging Face's map
  }
}

void Tokenizer::Impl::read_added(const Where& w, const json& list) {
  if (!list.is_array()) w.fail("added_tokens", "an array, found " + kind_of(list));
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string field = "added_tokens[" + std::to_string(i) + "]";
    const json& t = list[i];
    if (!t.is_object()) w.fail(field, "an object, found " + kind_of(t));
    AddedToken a;
    a.id = id_of(w, member(w, t, field, "id"), field + ".id");
    check_id_bound(w, a.id, field + ".id");
    a.content = string_of(w, member(w, t, field, "content"), field + ".content");
    if (a.content.empty()) w.fail(field + ".content", "a non-empty string, found \"\"");
    a.special = flag(w, t, field, "special", false);
    a.lstrip = flag(w, t, field, "lstrip", false);
    a.rstrip = flag(w, t, field, "rstrip", false);
    a.normalized = flag(w, t, field, "normalized", !a.special);
    if (flag(w, t, field, "single_word", false))
      w.fail(field + ".single_word", "false (grad does not implement single-word added tokens), found true");
    if (std::size_t(a.id) >= tokens.size()) tokens.resize(std::size_t(a.id) + 1);
    if (tokens[a.id] && *tokens[a.id] != a.content)
      w.fail(field + ".id", "an id that is free or names the same token, found " + std::to_string(a.id) +
                                ", the id of \"" + text_excerpt(*tokens[a.id]) + "\"");
    tokens[a.id] = a.content;
    added.push_back(std::move(a));
  }
  special.assign(tokens.size(), false);
  for (const AddedToken& a : added) special[a.id] = a.special;
  for (const AddedToken& a : added)
    added_by_byte[a.normalized ? 1 : 0][static_cast<unsigned char>(a.content[0])].push_back(&a);
  for (auto& pass : added_by_byte)
    for (auto& bucket : pass)
      std::stable_sort(bucket.begin(), bucket.end(),
                       [](const AddedToken* x, const AddedToken* y) { return x->content.size() > y->content.size(); });
}

void Tokenizer::Impl::read_post_processor(const Where& w, const json& j, const std::string& field) {
  const std::string type = type_of(w, j, field);
  if (type == "ByteLevel") return;  // it trims offsets; ids are unchanged
  if (type == "Sequence") {
    const json& list = member(w, j, field, "processors");
    if (!list.is_array()) w.fail(field + ".processors", "an array, found " + kind_of(list));
    for (std::size_t i = 0; i < list.size(); ++i)
      read_post_processor(w, list[i], field + ".processors[" + std::to_string(i) + "]");
    return;
  }
  if (type != "TemplateProcessing")
    w.fail(field + ".type", "ByteLevel, TemplateProcessing or Sequence, found \"" + text_excerpt(type) + "\"");
  if (!prefix.empty() || !suffix.empty()) w.fail(field, "one TemplateProcessing, found a second");
  const json& special_tokens = object_at(w, j, field, "special_tokens");
  const json& single = member(w, j, field, "single");
  if (!single.is_array()) w.fail(field + ".single", "an array, found " + kind_of(single));
  bool seen_sequence = false;
  for (std::size_t i = 0; i < single.size(); ++i) {
    const std::string item = field + ".single[" + std::to_string(i) + "]";
    const json& piece = single[i];
    if (piece.is_object() && piece.contains("Sequence")) {
      if (seen_sequence) w.fail(item, "one Sequence in a single-sequence template, found a second");
      seen_sequence = true;
    } else if (piece.is_object() && piece.contains("SpecialToken")) {
      const json& st = piece["SpecialToken"];
      if (!st.is_object()) w.fail(item + ".SpecialToken", "an object, found " + kind_of(st));
      const std::string name = string_of(w, member(w, st, item + ".SpecialToken", "id"), item + ".SpecialToken.id");
      const auto entry = special_tokens.find(name);
      const std::string entry_field = field + ".special_tokens[\"" + text_excerpt(name) + "\"]";
      if (entry == special_tokens.end())
        w.fail(field + ".special_tokens",
               "an entry for \"" + text_excerpt(name) + "\" (" + item + " names it), found none");
      const std::string ids_field = entry_field + ".ids";
      if (!entry->is_object()) w.fail(entry_field, "an object, found " + kind_of(*entry));
      const json& ids = member(w, *entry, entry_field, "ids");
      if (!ids.is_array()) w.fail(ids_field, "an array, found " + kind_of(ids));
      for (std::size_t k = 0; k < ids.size(); ++k) {
        const int id = id_of(w, ids[k], ids_field + "[" + std::to_string(k) + "]");
        if (std::size_t(id) >= tokens.size() || !tokens[id])
          w.fail(ids_field + "[" + std::to_string(k) + "]", "an id of the vocabulary or added tokens, found " +
                                                                std::to_string(id));
        (seen_sequence ? suffix : prefix).push_back(id);
      }
    } else {
      w.fail(item, "{\"SpecialToken\": ...} or {\"Sequence\": ...}, found " + json_excerpt(piece));
    }
  }
  if (!seen_sequence) w.fail(field + ".single", "a {\"Sequence\": {\"id\": \"A\"}} item, found none");
}

// Added tokens, leftmost-longest, on the raw text (pass 0), then the text
// between them normalized (NFC; kept in `owned`), then the `normalized`
// added tokens in it (pass 1), as Hugging Face's AddedVocabulary does.
std::vector<Segment> Tokenizer::Impl::split_added(std::string_view text, std::deque<std::string>& owned) const {
  std::vector<Segment> segments{{text, -1}};
  for (std::size_t pass = 0; pass < added_by_byte.size(); ++pass) {
    const auto& by_byte = added_by_byte[pass];
    if (pass == 1 && nfc_normalizer)
      for (Segment& seg : segments)
        if (seg.id < 0) seg.text = nfc(seg.text, owned, file);
    std::vector<Segment> next;
    for (const Segment& seg : segments) {
      if (seg.id >= 0) {
        next.push_back(seg);
        continue;
      }
      const std::string_view s = seg.text;
      std::size_t begin = 0;
      for (std::size_t i = 0; i < s.size(); ++i) {
        const AddedToken* hit = nullptr;
        for (const AddedToken* a : by_byte[static_cast<unsigned char>(s[i])])
          if (s.substr(i, a->content.size()) == a->content) {
            hit = a;
            break;
          }
        if (!hit) continue;
        std::size_t left = i, right = i + hit->content.size();
        // lstrip / rstrip: the token takes the whitespace beside it.
        while (hit->lstrip && left > begin) {
          std::size_t start = left - 1;
          while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
          if (!is_white_space(decode_utf8(s, start).first)) break;
          left = start;
        }
        while (hit->rstrip && right < s.size()) {
          const auto [c, len] = decode_utf8(s, right);
          if (!is_white_space(c)) break;
          right += len;
        }
        if (left > begin) next.push_back({s.substr(begin, left - begin), -1});
        next.push_back({s.substr(left, right - left), hit->id});
        begin = right;
        i = right - 1;
      }
      if (begin < s.size()) next.push_back({s.substr(begin), -1});
    }
    segments = std::move(next);
  }
  return segments;
}

void Tokenizer::Impl::pre_tokenize(std::string_view text, std::deque<std::string>& owned,
                                   std::vector<std::string_view>& out, MatchBudget& budget) const {
  std::vector<std::string_view> pieces{text}, next;
  for (const Step& step : steps) {
    next.clear();
    for (std::string_view p : pieces) {
      if (!step.is_byte_level) {
        split_piece(step.split, p, next, budget);
        continue;
      }
      if (step.byte_level.add_prefix_space && p.front() != ' ') {
        std::string& spaced = owned.emplace_back(1, ' ');
        spaced += p;
        p = spaced;
      }
      if (step.byte_level.gpt2.pattern) split_piece(step.byte_level.gpt2, p, next, budget);
      else next.push_back(p);
    }
    std::swap(pieces, next);
  }
  out.insert(out.end(), pieces.begin(), pieces.end());
}

// One piece's ids: from the cache, or merged and remembered.
void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int>& out) const {
  if (piece.size() > max_cached_piece) {
    merge(piece, out);
    return;
  }
  {
    const std::lock_guard lock(cache_mutex);
    const auto it = cache.find(piece);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<int> ids;
  merge(piece, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  const std::size_t cost = piece.size() + ids.size() * sizeof(int) + cache_entry_overhead;
  const std::lock_guard lock(cache_mutex);
  if (cache.size() < cache_capacity && cache_bytes + cost <= cache_byte_capacity &&
      cache.emplace(std::string(piece), std::move(ids)).second)
    cache_bytes += cost;
}

// Byte symbols merged by rank, lowest first, leftmost on ties: Hugging
// Face's Word::merge_all, a heap of candidate pairs over a linked list.
void Tokenizer::Impl::merge(std::string_view piece, std::vector<int>& out) const {
  if (ignore_merges) {
    std::string spelled;
    for (char c : piece) append_utf8(spelled, byte_chars[static_cast<unsigned char>(c)]);
    const auto it = vocab.find(spelled);
    if (it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  struct Symbol { int id, prev, next; bool alive; };
  std::vector<Symbol> sym(piece.size());
  for (std::size_t i = 0; i < piece.size(); ++i)
    sym[i] = {byte_id[static_cast<unsigned char>(piece[i])], int(i) - 1, i + 1 < piece.size() ? int(i) + 1 : -1, true};

  struct Candidate { int rank, pos, merged; };
  const auto later = [](const Candidate& a, const Candidate& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> heap(later);
  const auto lookup = [&](int left, int right) -> const std::pair<int, int>* {
    const auto it = merges.find((std::uint64_t(std::uint32_t(left)) << 32) | std::uint32_t(right));
    return it == merges.end() ? nullptr : &it->second;
  };
  const auto offer = [&](int pos) {
    if (pos < 0 || sym[pos].next < 0) return;
    if (const auto* m = lookup(sym[pos].id, sym[sym[pos].next].id)) heap.push({m->first, pos, m->second});
  };
  for (int i = 0; i + 1 < int(sym.size()); ++i) offer(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& left = sym[c.pos];
    if (!left.alive || left.next < 0) continue;
    const auto* m = lookup(left.id, sym[left.next].id);
    if (!m || m->second != c.merged || m->first != c.rank) continue;  // stale: a neighbour has merged since
    Symbol& right = sym[left.next];
    right.alive = false;
    left.id = c.merged;
    left.next = right.next;
    if (left.next >= 0) sym[left.next].prev = c.pos;
    offer(left.prev);
    offer(c.pos);
  }
  for (const Symbol& s : sym)
    if (s.alive) out.push_back(s.id);
}

// ---- the public face ----------------------------------------------------

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::from_file(const std::filesystem::path& path, LoadOptions options) {
  std::string text;
  if (std::string why = grad::detail::read_regular_file(path.string(), detail::max_tokenizer_bytes, text);
      !why.empty())
    throw TokenizerError(path.string() + ": " + why);
  return from_json(text, path.string(), options);
}

Tokenizer Tokenizer::from_json(std::string_view text, std::string_view name, LoadOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->file = std::string(name);
  impl->options = options;
  json root;
  if (std::string why = detail::parse_bounded(text, root); !why.empty()) throw TokenizerError(impl->file + ": " + why);
  impl->read(root);
  return Tokenizer(std::move(impl));
}

std::vector<int> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<int> ids;
  if (add_special_tokens) ids = m.prefix;
  std::deque<std::string> owned;
  std::vector<std::string_view> pieces;
  MatchBudget budget(text);
  for (const Segment& seg : m.split_added(text, owned)) {
    if (seg.id >= 0) {
      ids.push_back(seg.id);
      continue;
    }
    if (seg.text.empty()) continue;  // encode(""): no piece, not even a prefix space
    pieces.clear();
    m.pre_tokenize(seg.text, owned, pieces, budget);
    for (std::string_view p : pieces) m.bpe(p, ids);
  }
  if (add_special_tokens) ids.insert(ids.end(), m.suffix.begin(), m.suffix.end());
  return ids;
}

std::string Tokenizer::decode(std::span<const int> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::string out;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const int id = ids[i];
    if (id < 0)
      throw std::out_of_range("grad::hf::Tokenizer::decode: id " + std::to_string(id) + " at position " +
                              std::to_string(i) + " is negative (" + m.file + ")");
    if (std::size_t(id) >= m.tokens.size() || !m.tokens[id]) continue;  // no token: skipped, as Hugging Face does
    if (skip_special_tokens && std::size_t(id) < m.special.size() && m.special[id]) continue;
    out += m.bytes_of[id];
  }
  return out;
}

std::optional<int> Tokenizer::token_to_id(std::string_view token) const {
  for (const AddedToken& a : impl_->added)
    if (a.content == token) return a.id;
  const auto it = impl_->vocab.find(std::string(token));
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> Tokenizer::id_to_token(int id) const {
  if (id < 0 || std::size_t(id) >= impl_->tokens.size()) return std::nullopt;
  return impl_->tokens[id];
}

std::size_t Tokenizer::vocab_size() const { return impl_->tokens.size(); }

std::vector<PreTokenizerStep> Tokenizer::pre_tokenizer() const {
  std::vector<PreTokenizerStep> out;
  for (const Step& s : impl_->steps) out.push_back(s.spelled);
  return out;
}

bool Tokenizer::has_nfc_normalizer() const { return impl_->nfc_normalizer; }

bool normalizes_nfc() {
#ifdef GRAD_HF_UTF8PROC
  return true;
#else
  return false;
#endif
}

std::vector<std::pair<std::string, std::string>> Tokenizer::merges() const {
  std::vector<std::pair<int, std::uint64_t>> by_rank;  // (rank, left id << 32 | right id)
  by_rank.reserve(impl_->merges.size());
  for (const auto& [pair, merge] : impl_->merges) by_rank.emplace_back(merge.first, pair);
  std::sort(by_rank.begin(), by_rank.end());
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(by_rank.size());
  for (const auto& [rank, pair] : by_rank)
    out.emplace_back(*impl_->tokens[pair >> 32], *impl_->tokens[pair & 0xffffffffu]);
  return out;
}

bool Tokenizer::is_added(int id) const {
  for (const AddedToken& a : impl_->added)
    if (a.id == id) return true;
  return false;
}

bool Tokenizer::is_special(int id) const {
  return id >= 0 && std::size_t(id) < impl_->special.size() && impl_->special[id];
}

std::string byte_level_tokenizer_json() {
  json vocab = json::object();
  for (unsigned b = 0; b < 256; ++b) vocab[byte_to_symbol(static_cast<unsigned char>(b))] = b;
  const json byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  return json{{"version", "1.0"},
              {"truncation", nullptr},
              {"padding", nullptr},
              {"added_tokens", json::array()},
              {"normalizer", nullptr},
              {"pre_tokenizer", byte_level},
              {"post_processor", nullptr},
              {"decoder", byte_level},
              {"model", {{"type", "BPE"}, {"dropout", nullptr}, {"vocab", vocab}, {"merges", json::array()}}}}
      .dump(2);
}

std::string byte_to_symbol(unsigned char b) {
  std::string s;
  append_utf8(s, byte_chars[b]);
  return s;
}

std::optional<unsigned char> symbol_to_byte(char32_t c) {
  if (c < 256 && byte_is_printable(unsigned(c))) return static_cast<unsigned char>(c);
  if (c >= 256 && c < 256 + 68) {
    // The (c - 256)-th byte that is not printable.
    unsigned n = unsigned(c - 256);
    for (unsigned b = 0; b < 256; ++b)
      if (!byte_is_printable(b) && n-- == 0) return static_cast<unsigned char>(b);
  }
  return std::nullopt;
}

}  // namespace grad::hf
