// LoopState: what a training loop keeps besides the weights and the
// optimizer (epoch, best validation loss, patience, a run name, where the
// batches stand, generators' and dropout layers' counters), saved as notes
// of a checkpoint and read back from one, so that a stopped run resumes
// onto the bytes of an uninterrupted one.
//
//   grad::LoopState st;
//   st.set("epoch", epoch);                       // integers (exact, 64-bit)
//   st.set("best_val", best);                     // numbers (double, exact)
//   st.set("run", "digits-a");                    // short strings (<= 256 bytes)
//   st.set("batches", batches.position());        // where the Batches stand
//   st.set("gen", gen.state);                     // a SplitMix64's whole state
//   st.set("dropout", model.random_steps());      // lists of integers
//   grad::save_checkpoint(path, tp, opt, st.notes());
//   ...                                            // a fresh run, built the same way
//   std::vector<grad::CheckpointNote> notes;
//   if (auto r = grad::load_checkpoint(path, tp, opt, {}, &notes); !r) ...
//   grad::LoopState back(notes);
//   batches.resume(back.position("batches"));
//   gen.state = back.integer("gen");
//   model.set_random_steps(back.integers("dropout"));
//
// Reading a key that is absent, or that holds another kind of value, throws
// std::invalid_argument naming the key and what it holds.
//
// Encoding: checkpoint notes are (key, u64) pairs (checkpoint.hpp, format
// version 2), so a state is written into them without a new file format:
// "loop.i:<key>" an integer, "loop.f:<key>" a double's bits, "loop.s:<key>"
// a string's length followed by "loop.s<k>:<key>" 8-byte pieces,
// "loop.l:<key>" a list's length followed by "loop.l<k>:<key>" items.
// Notes that are not a loop's (grad::dist's shard count) pass through.
#pragma once

#include <bit>
#include <concepts>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "grad/checkpoint.hpp"
#include "grad/data.hpp"

namespace grad {

class LoopState {
 public:
  static constexpr std::size_t max_text = 256;

  LoopState() = default;
  // The loop's values among a checkpoint's notes (load_checkpoint's `notes`).
  explicit LoopState(std::span<const CheckpointNote> notes) {
    std::map<std::string, std::uint64_t, std::less<>> by_key;
    for (const CheckpointNote& n : notes) by_key[n.key] = n.value;
    auto piece = [&](std::string_view kind, std::size_t k, const std::string& key) {
      const auto it = by_key.find("loop." + std::string(kind) + std::to_string(k) + ":" + key);
      if (it == by_key.end())
        throw std::invalid_argument("LoopState: the notes lack piece " + std::to_string(k) + " of '" + key + "'");
      return it->second;
    };
    for (const auto& [note, value] : by_key) {
      if (note.rfind("loop.", 0) != 0 || note.size() < 7 || note[6] != ':') continue;  // a piece, or not the loop's
      const std::string key = note.substr(7);
      switch (note[5]) {
        case 'i':
          values_[key] = value;
          break;
        case 'f':
          values_[key] = std::bit_cast<double>(value);
          break;
        case 's': {
          if (value > max_text) throw std::invalid_argument("LoopState: the string '" + key + "' is too long");
          std::string text(static_cast<std::size_t>(value), '\0');
          for (std::size_t k = 0; k * 8 < text.size(); ++k) {
            const std::uint64_t bits = piece("s", k, key);
            std::memcpy(text.data() + k * 8, &bits, std::min<std::size_t>(8, text.size() - k * 8));
          }
          values_[key] = std::move(text);
          break;
        }
        case 'l': {
          if (value > by_key.size()) throw std::invalid_argument("LoopState: the list '" + key + "' is corrupted");
          std::vector<std::uint64_t> list(static_cast<std::size_t>(value));
          for (std::size_t k = 0; k < list.size(); ++k) list[k] = piece("l", k, key);
          values_[key] = std::move(list);
          break;
        }
        default:
          break;
      }
    }
  }

  void set(const std::string& key, std::integral auto value) {
    put(key, static_cast<std::uint64_t>(static_cast<std::int64_t>(value)));
  }
  void set(const std::string& key, std::uint64_t value) { put(key, value); }
  void set(const std::string& key, double value) { put(key, value); }
  void set(const std::string& key, std::string text) {
    if (text.size() > max_text)
      throw std::invalid_argument("LoopState::set: the string for '" + key + "' has " + std::to_string(text.size()) +
                                  " bytes; at most " + std::to_string(max_text) + " are kept");
    put(key, std::move(text));
  }
  void set(const std::string& key, const char* text) { set(key, std::string(text)); }
  void set(const std::string& key, std::vector<std::uint64_t> list) { put(key, std::move(list)); }
  void set(const std::string& key, BatchPosition p) { put(key, std::vector<std::uint64_t>{p.epoch, p.batch}); }

  bool has(std::string_view key) const { return values_.find(key) != values_.end(); }
  std::int64_t integer(std::string_view key) const {
    return static_cast<std::int64_t>(get<std::uint64_t>(key, "an integer"));
  }
  std::uint64_t unsigned_integer(std::string_view key) const { return get<std::uint64_t>(key, "an integer"); }
  double number(std::string_view key) const { return get<double>(key, "a number"); }
  const std::string& text(std::string_view key) const { return get<std::string>(key, "a string"); }
  const std::vector<std::uint64_t>& integers(std::string_view key) const {
    return get<std::vector<std::uint64_t>>(key, "a list of integers");
  }
  BatchPosition position(std::string_view key) const {
    const auto& l = get<std::vector<std::uint64_t>>(key, "a batch position");
    if (l.size() != 2)
      throw std::invalid_argument("LoopState: '" + std::string(key) + "' holds " + std::to_string(l.size()) +
                                  " integers, not a batch position (epoch, batch)");
    return {l[0], l[1]};
  }

  // The state as checkpoint notes (save_checkpoint's `notes`).
  std::vector<CheckpointNote> notes() const {
    std::vector<CheckpointNote> out;
    for (const auto& [key, v] : values_) {
      if (const auto* i = std::get_if<std::uint64_t>(&v)) out.push_back({"loop.i:" + key, *i});
      if (const auto* f = std::get_if<double>(&v)) out.push_back({"loop.f:" + key, std::bit_cast<std::uint64_t>(*f)});
      if (const auto* s = std::get_if<std::string>(&v)) {
        out.push_back({"loop.s:" + key, s->size()});
        for (std::size_t k = 0; k * 8 < s->size(); ++k) {
          std::uint64_t bits = 0;
          std::memcpy(&bits, s->data() + k * 8, std::min<std::size_t>(8, s->size() - k * 8));
          out.push_back({"loop.s" + std::to_string(k) + ":" + key, bits});
        }
      }
      if (const auto* l = std::get_if<std::vector<std::uint64_t>>(&v)) {
        out.push_back({"loop.l:" + key, l->size()});
        for (std::size_t k = 0; k < l->size(); ++k) out.push_back({"loop.l" + std::to_string(k) + ":" + key, (*l)[k]});
      }
    }
    return out;
  }

 private:
  using Value = std::variant<std::uint64_t, double, std::string, std::vector<std::uint64_t>>;
  void put(const std::string& key, Value v) {
    if (key.empty()) throw std::invalid_argument("LoopState::set: the key is empty");
    values_[key] = std::move(v);
  }
  template <class V>
  const V& get(std::string_view key, const char* what) const {
    const auto it = values_.find(key);
    if (it == values_.end()) throw std::invalid_argument("LoopState: no value named '" + std::string(key) + "'");
    if (const V* v = std::get_if<V>(&it->second)) return *v;
    static constexpr const char* kinds[] = {"an integer", "a number", "a string", "a list of integers"};
    throw std::invalid_argument("LoopState: '" + std::string(key) + "' holds " + kinds[it->second.index()] + ", not " +
                                what);
  }

  std::map<std::string, Value, std::less<>> values_;
};

}  // namespace grad
