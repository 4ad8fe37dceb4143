// A bump allocator over chunks that never move, so a pointer handed out stays
// valid until the allocation is rewound past. Rewinding keeps every chunk,
// which is what makes a mark/reset minibatch loop allocation-free.
//
// restart() is for memory whose allocations all die at once (the tape's
// recompute scopes). Passes of different patterns over exact-size chunks
// skip chunks too small for their next request and so touch more memory than
// any one pass needs (a LoRA layer's scope: 464 MiB for a 320 MiB pass); a
// restart after passes that spread over several chunks replaces them by one
// chunk as large as the largest pass.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <new>
#include <span>
#include <vector>

namespace grad {

template <class T>
class Arena {
 public:
  struct Position {
    std::size_t chunk = 0, used = 0;
    std::size_t pass = 0;  // elements asked for since the last restart
  };

  // What an allocation of n elements takes: n rounded up to whole 64-byte lines.
  static constexpr std::size_t rounded(std::size_t n) { return (n + per_line - 1) / per_line * per_line; }
  // n elements, 64-byte aligned, uninitialised.
  T* allocate(std::size_t n) {
    n = rounded(n);
    T* p = place(n);
    pass_ += n;
    peak_ = std::max(peak_, pass_);
    return p;
  }

  Position position() const { return {current_, used_, pass_}; }
  // Elements held in chunks: the high-water mark (only restart frees).
  std::size_t reserved() const {
    std::size_t n = 0;
    for (const Chunk& c : chunks_) n += c.capacity;
    return n;
  }
  // The first chunk, whatever it holds: its owner lends it as scratch while
  // nothing in it is live (empty before the first allocation).
  std::span<T> held() {
    return chunks_.empty() ? std::span<T>{} : std::span<T>(chunks_.front().data.get(), chunks_.front().capacity);
  }
  void rewind(Position p) {
    current_ = p.chunk;
    used_ = p.used;
    pass_ = p.pass;
  }
  // Rewinds to the start for a new pass, every earlier allocation dead. When
  // the passes so far needed more than one chunk, frees them: the next
  // allocation makes one chunk of the largest pass's size (so a failure to
  // get it surfaces there, as any allocation's does).
  void restart() {
    if (chunks_.size() > 1) chunks_.clear();
    current_ = 0;
    used_ = 0;
    pass_ = 0;
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

  // n (aligned) elements from the current chunk or a later one that has
  // room, else from a new chunk (the first after a restart sized for the
  // largest pass).
  T* place(std::size_t n) {
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
    const std::size_t capacity = std::max({n, min_chunk, chunks_.empty() ? peak_ : std::size_t{0}});
    chunks_.push_back(
        Chunk{Storage(static_cast<T*>(::operator new (capacity * sizeof(T), std::align_val_t{64}))), capacity});
    current_ = chunks_.size() - 1;
    used_ = n;
    return chunks_.back().data.get();
  }

  std::vector<Chunk> chunks_;
  std::size_t current_ = 0, used_ = 0;
  std::size_t pass_ = 0, peak_ = 0;  // elements asked for since the last restart; the most of any pass
};

}  // namespace grad
