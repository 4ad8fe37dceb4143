// Bounds on what grad::hf reads (src/hf/bounded_input.hpp).
#include "bounded_input.hpp"

namespace grad::hf::detail {

namespace {

using nlohmann::json;

// "" or where the text's arrays and objects first nest past max_json_depth.
// Brackets inside strings do not count; in text that is not JSON the
// count may be off, but only past the point where the parser refuses it.
std::string depth_problem(std::string_view text) {
  std::size_t depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') ++i;  // the escaped character, a quote perhaps
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_json_depth)
        return "arrays and objects nest deeper than " + std::to_string(max_json_depth) + " levels (at byte " +
               std::to_string(i) + " of " + std::to_string(text.size()) + ")";
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return {};
}

// The first `n` bytes of s or fewer, not ending inside a UTF-8 character.
std::string_view prefix_at_character(std::string_view s, std::size_t n) {
  if (s.size() <= n) return s;
  while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  return s.substr(0, n);
}

std::string quoted_json_string(std::string_view s) {
  return json(std::string(prefix_at_character(s, max_quoted_bytes))).dump(-1, ' ', false, json::error_handler_t::replace);
}

// j as compact JSON (nlohmann's dump), stopping once `out` holds max_quoted_bytes.
void excerpt_into(const json& j, std::string& out, std::size_t depth) {
  if (!j.is_array() && !j.is_object()) {
    out += j.is_string() ? quoted_json_string(j.get_ref<const std::string&>())
                         : j.dump(-1, ' ', false, json::error_handler_t::replace);
    return;
  }
  if (depth >= max_json_depth) {
    out += j.is_array() ? "[...]" : "{...}";
    return;
  }
  out += j.is_array() ? '[' : '{';
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (out.size() > max_quoted_bytes) return;
    if (it != j.begin()) out += ',';
    if (j.is_object()) {
      out += quoted_json_string(it.key());
      out += ':';
    }
    excerpt_into(it.value(), out, depth + 1);
  }
  out += j.is_array() ? ']' : '}';
}

}  // namespace

std::string parse_bounded(std::string_view text, json& out, const json::parser_callback_t& callback) {
  if (std::string why = depth_problem(text); !why.empty()) return why;
  try {
    out = json::parse(text.begin(), text.end(), callback);
  } catch (const json::exception& e) {
    // nlohmann's message quotes the token it last read, which may be most of the file.
    return "not JSON: " + text_excerpt(e.what());
  }
  return {};
}

std::string json_excerpt(const json& j) {
  std::string out;
  excerpt_into(j, out, 0);
  if (out.size() <= max_quoted_bytes) return out;
  return std::string(prefix_at_character(out, max_quoted_bytes)) + "... (cut)";
}

std::string text_excerpt(std::string_view s) {
  if (s.size() <= max_quoted_bytes) return std::string(s);
  return std::string(prefix_at_character(s, max_quoted_bytes)) + "... (" + std::to_string(s.size()) + " bytes)";
}

}  // namespace grad::hf::detail
