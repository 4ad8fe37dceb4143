// First-fit placement of buffers in one block, by lifetime: a recompute
// scope's values and gradients (tape.hpp) are laid out with it before the
// walk replays the scope, and the block is then allocated once.
//
//   FirstFit plan;
//   const std::size_t a = plan.take(100), b = plan.take(50);
//   plan.give(a, 100);                 // a's lifetime ended
//   const std::size_t c = plan.take(80);   // c == a: it fits where a was
//   block = allocate(plan.extent());   // 150
//
// take(n) returns the lowest offset of a free span that holds n elements;
// when none does, a free span that ends the block grows the block by what
// it lacks (else n is appended). give(at, n) frees a span and merges it with
// free neighbours. The same calls give the same offsets: deterministic.
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace grad {

class FirstFit {
 public:
  void clear() {
    free_.clear();
    extent_ = 0;
  }
  // The block's size so far: the end of the highest span ever taken.
  std::size_t extent() const { return extent_; }

  std::size_t take(std::size_t length) {
    for (std::size_t k = 0; k < free_.size(); ++k)
      if (free_[k].second >= length) {
        const std::size_t at = free_[k].first;
        free_[k].first += length;
        free_[k].second -= length;
        if (free_[k].second == 0) free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(k));
        return at;
      }
    if (!free_.empty() && free_.back().first + free_.back().second == extent_) {  // the block's free tail, grown
      const std::size_t at = free_.back().first;
      free_.pop_back();
      extent_ = at + length;
      return at;
    }
    extent_ += length;
    return extent_ - length;
  }

  void give(std::size_t at, std::size_t length) {
    if (length == 0) return;
    auto it = std::lower_bound(free_.begin(), free_.end(), std::pair<std::size_t, std::size_t>{at, 0});
    it = free_.insert(it, {at, length});
    if (auto next = it + 1; next != free_.end() && it->first + it->second == next->first) {
      it->second += next->second;
      free_.erase(next);
    }
    if (it != free_.begin())
      if (auto prev = it - 1; prev->first + prev->second == it->first) {
        prev->second += it->second;
        free_.erase(it);
      }
  }

 private:
  std::vector<std::pair<std::size_t, std::size_t>> free_;  // (offset, length), ascending offset, none adjacent
  std::size_t extent_ = 0;
};

}  // namespace grad
