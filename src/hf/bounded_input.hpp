// Bounds on what grad::hf reads from files it did not write (config.json,
// adapter_config.json, an index, a safetensors header, tokenizer.json and
// the files save_pretrained copies), shared by every reader so that each
// refuses the same way: a size, a nesting depth, and values quoted into
// messages cut short.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace grad::hf::detail {

// A config file (config.json, adapter_config.json, an index, a copied
// tokenizer_config.json ...): real ones are kilobytes, an index of a
// thousand-shard model a few megabytes.
constexpr std::uint64_t max_config_bytes = std::uint64_t{64} << 20;
// tokenizer.json: Qwen2's is 7 MB, the largest vocabularies tens of MB.
constexpr std::uint64_t max_tokenizer_bytes = std::uint64_t{1} << 30;

// Arrays and objects nested deeper than this are refused before parsing:
// real files nest six levels, and nlohmann's dump, comparison and copy (and
// the tokenizer's Sequence readers) recurse once per level, so a 400 KB
// header of brackets would overflow the stack.
constexpr std::size_t max_json_depth = 64;

// The most bytes of a value from a file that a message quotes.
constexpr std::size_t max_quoted_bytes = 200;

// Parses `text` into `out` (through `callback` when given, as
// nlohmann::json::parse takes it): "" or why not, a nesting deeper than
// max_json_depth found by a scan of the bytes before any parsing.
std::string parse_bounded(std::string_view text, nlohmann::json& out,
                          const nlohmann::json::parser_callback_t& callback = nullptr);

// A value as JSON for a message, at most about max_quoted_bytes of it
// ("[1, 2, 3, ... (cut)"): never the whole of an unbounded value.
std::string json_excerpt(const nlohmann::json& j);
// A string from a file for a message, cut the same way at a character boundary.
std::string text_excerpt(std::string_view s);

}  // namespace grad::hf::detail
