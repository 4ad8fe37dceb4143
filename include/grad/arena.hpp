// A bump allocator over chunks that never move, so a pointer handed out stays
// valid until the allocation is rewound past. Rewinding keeps every chunk,
// which is what makes a mark/reset minibatch loop allocation-free.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <vector>

namespace grad {

template <class T>
class Arena {
 public:
  struct Position {
    std::size_t chunk = 0, used = 0;
  };

  // n elements, 64-byte aligned, uninitialised.
  T* allocate(std::size_t n) {
    n = (n + per_line - 1) / per_line * per_line;
    while (current_ < chunks_.size()) {
      Chunk& c = chunks_[current_];
      if (used_ + n <= c.capacity) {
        T* p = c.data.get() + used_;
        used_ += n;
        return p;
      }
      ++current_;
      used_ = 0;
    }
    const std::size_t capacity = std::max(n, min_chunk);
    chunks_.push_back(
        Chunk{Storage(static_cast<T*>(::operator new (capacity * sizeof(T), std::align_val_t{64}))), capacity});
    current_ = chunks_.size() - 1;
    used_ = n;
    return chunks_.back().data.get();
  }

  Position position() const { return {current_, used_}; }
  // Elements held in chunks (never freed, so this is the high-water mark).
  std::size_t reserved() const {
    std::size_t n = 0;
    for (const Chunk& c : chunks_) n += c.capacity;
    return n;
  }
  void rewind(Position p) {
    current_ = p.chunk;
    used_ = p.used;
  }

 private:
  static constexpr std::size_t per_line = 64 / sizeof(T);
  static constexpr std::size_t min_chunk = std::size_t{1} << 16;
  struct Free {
    void operator()(T* p) const { ::operator delete (p, std::align_val_t{64}); }
  };
  using Storage = std::unique_ptr<T, Free>;
  struct Chunk {
    Storage data;
    std::size_t capacity;
  };
  std::vector<Chunk> chunks_;
  std::size_t current_ = 0, used_ = 0;
};

}  // namespace grad
