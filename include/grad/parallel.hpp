// A small persistent thread pool for the host kernels, and the user's knob:
// grad::set_num_threads(n). The default is one thread (no pool, no threads
// started). Work is split only over output rows or columns, so every output
// element is computed by one thread in the documented order: results are
// bit-identical for any thread count.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace grad {
namespace parallel_detail {

// A job is a plain function pointer and a context: publishing one allocates
// nothing, so a steady-state training loop stays allocation-free.
using PartFn = void (*)(void* context, std::size_t part);

inline void spin_pause() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#endif
}

class Pool {
 public:
  Pool() = default;
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;
  ~Pool() { resize(1); }

  std::size_t size() const { return workers_.size() + 1; }

  // Joins the old workers and starts threads - 1 new ones (the caller of
  // run() is the remaining thread).
  void resize(std::size_t threads) {
    std::lock_guard<std::mutex> lock(run_mutex_);  // never while a job runs
    if (threads == size()) return;
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (std::thread& t : workers_) t.join();
    workers_.clear();
    stop_.store(false, std::memory_order_relaxed);
    // A worker starts from the generation current now, not from whatever it
    // reads once scheduled: a job published before then is still its to see.
    const std::uint32_t start = generation_.load(std::memory_order_relaxed);
    for (std::size_t i = 1; i < threads; ++i) workers_.emplace_back([this, start] { worker_loop(start); });
  }

  // Calls fn(context, part) once for every part in [0, parts), spread over
  // the pool; returns when all are done. A run issued while another is in
  // flight (a second user thread, or a part that itself calls run) is done
  // serially by its caller instead of waiting.
  void run(std::size_t parts, PartFn fn, void* context) {
    std::unique_lock<std::mutex> lock(run_mutex_, std::try_to_lock);
    if (!lock.owns_lock() || workers_.empty() || parts <= 1) {
      for (std::size_t p = 0; p < parts; ++p) fn(context, p);
      return;
    }
    fn_ = fn;
    context_ = context;
    parts_ = parts;
    next_part_.store(0, std::memory_order_relaxed);
    pending_.store(static_cast<std::uint32_t>(workers_.size()), std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    take_parts();
    // Every worker checks out of this job before the next can be published,
    // so none can pick up a part of a later job with this job's function.
    for (int spin = 0; spin < spin_limit && pending_.load(std::memory_order_acquire) != 0; ++spin) spin_pause();
    for (std::uint32_t left; (left = pending_.load(std::memory_order_acquire)) != 0;)
      pending_.wait(left, std::memory_order_acquire);
  }

 private:
  // Spinning a little before sleeping keeps back-to-back kernels from paying
  // a futex wake-up each; about 100 microseconds on current x86 cores.
  static constexpr int spin_limit = 2000;

  void take_parts() {
    for (std::size_t p; (p = next_part_.fetch_add(1, std::memory_order_relaxed)) < parts_;) fn_(context_, p);
  }

  void worker_loop(std::uint32_t seen) {
    for (;;) {
      for (int spin = 0; spin < spin_limit && generation_.load(std::memory_order_acquire) == seen; ++spin) spin_pause();
      generation_.wait(seen, std::memory_order_acquire);
      seen = generation_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_relaxed)) return;
      take_parts();
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  std::atomic<std::uint32_t> generation_{0};
  std::atomic<std::uint32_t> pending_{0};
  std::atomic<std::size_t> next_part_{0};
  std::atomic<bool> stop_{false};
  // The published job: written before generation_ is bumped (release), read
  // after it is seen (acquire).
  PartFn fn_ = nullptr;
  void* context_ = nullptr;
  std::size_t parts_ = 0;
};

inline Pool& pool() {
  static Pool instance;
  return instance;
}

}  // namespace parallel_detail

// Threads the host kernels (matrix products) may use, this one included.
// 1 (the default) runs everything on the calling thread; 0 means one per
// hardware thread. Call it between training steps, from the thread that
// runs them: it starts or joins pool threads (and allocates) right away, so
// the steps themselves stay allocation-free. The results do not depend on it.
inline void set_num_threads(std::size_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  parallel_detail::pool().resize(threads);
}

inline std::size_t num_threads() { return parallel_detail::pool().size(); }

// Runs fn(context, part) for part in [0, parts) on the pool (in any order,
// possibly concurrently); returns when all are done.
inline void parallel_for(std::size_t parts, parallel_detail::PartFn fn, void* context) {
  parallel_detail::pool().run(parts, fn, context);
}

}  // namespace grad
