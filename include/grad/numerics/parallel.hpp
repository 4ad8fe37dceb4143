// A small persistent thread pool for the host kernels, and the user's knob:
// grad::set_num_threads(n). The default is one thread (no pool, no threads
// started). Work is split only over output rows or columns, so every output
// element is computed by one thread in the documented order: results are
// bit-identical for any thread count.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
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

  // Whether this thread is running a part of a job: a run() from inside a
  // part (a head's products while the heads are spread over the pool) is
  // done serially, without touching run_mutex_, which the thread that
  // published the job holds and may not lock again.
  static bool& in_part() {
    thread_local bool flag = false;
    return flag;
  }

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
    shares_ = std::make_unique<Share[]>(threads);
    for (std::size_t i = 1; i < threads; ++i) workers_.emplace_back([this, start, i] { worker_loop(start, i); });
  }

  // Calls fn(context, part) once for every part in [0, parts), spread over
  // the pool; returns when all are done. A run issued while another is in
  // flight (a second user thread, or a part that itself calls run) is done
  // serially by its caller instead of waiting.
  void run(std::size_t parts, PartFn fn, void* context) {
    std::unique_lock<std::mutex> lock;
    if (!in_part() && !workers_.empty() && parts > 1 && parts <= max_parts)
      lock = std::unique_lock<std::mutex>(run_mutex_, std::try_to_lock);
    if (!lock.owns_lock()) {
      for (std::size_t p = 0; p < parts; ++p) fn(context, p);
      return;
    }
    fn_ = fn;
    context_ = context;
    parts_ = static_cast<std::uint32_t>(parts);
    done_.store(0, std::memory_order_relaxed);
    job_ = (job_ + 1) & 0xffffffffu;
    // Thread i's share: the contiguous parts [i * parts / n, (i + 1) * parts / n).
    const std::size_t n = size();
    for (std::size_t i = 0; i < n; ++i)
      shares_[i].value.store(job_ << 32 | std::uint64_t{i * parts / n} << 16 | (i + 1) * parts / n,
                             std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    take_parts(0);
    // Only parts are waited for, not workers: one that wakes late finds the
    // shares used up (or a later job's) and goes back to sleep.
    const auto all = static_cast<std::uint32_t>(parts);
    spin_until([&] { return done_.load(std::memory_order_acquire) == all; });
    for (std::uint32_t d; (d = done_.load(std::memory_order_acquire)) != all;) done_.wait(d, std::memory_order_acquire);
  }

 private:
  static constexpr std::size_t max_parts = 0xffff;

  // Spins until ready() or for about spin_time, whichever comes first:
  // waiting this long before sleeping keeps the kernels of a training step,
  // and the short serial stretches between them, from paying a futex wake-up
  // each. On a 2-core virtual machine (Zen 5) the workers slept 800 times a
  // step of the 209M-parameter LoRA finetune with 40 us of spinning, 100
  // times with 400 us, and the step took ~4 % less (median of 5 interleaved
  // rounds). A time, not a count: a pause lasts 20 ns on Zen 5, 40 on Intel.
  static constexpr std::chrono::microseconds spin_time{500};
  template <class Ready>
  static void spin_until(Ready ready) {
    const auto deadline = std::chrono::steady_clock::now() + spin_time;
    for (unsigned i = 1; !ready(); ++i) {
      spin_pause();
      if (i % 64 == 0 && std::chrono::steady_clock::now() > deadline) return;
    }
  }

  // A share packs job id (32 bits), next part and end (16 each): claiming a
  // part is one compare-exchange that also proves the job is still live, so
  // fn_ and context_ (written before the shares) are its own. A thread runs
  // its own share first, in order, then helps with the others' from their
  // next part: the same thread takes the same share of every job of the same
  // split, so data an elementwise op or a norm wrote stays in the cache of
  // the core that reads it next (on two cores of a virtual machine, a 2 MB
  // update split over whichever thread came first ran 8x slower than on one).
  void take_parts(std::size_t self) {
    const std::size_t n = size();
    for (std::size_t k = 0; k < n; ++k) {
      std::atomic<std::uint64_t>& share = shares_[(self + k) % n].value;
      std::uint64_t s = share.load(std::memory_order_acquire);
      for (;;) {
        const std::uint64_t next = s >> 16 & 0xffff, end = s & 0xffff;
        if (next >= end) break;
        if (!share.compare_exchange_weak(s, s + (1u << 16), std::memory_order_acq_rel, std::memory_order_acquire))
          continue;
        const std::uint32_t parts = parts_;  // read while the job is surely live
        in_part() = true;
        fn_(context_, static_cast<std::size_t>(next));
        in_part() = false;
        if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == parts) done_.notify_one();
        s = share.load(std::memory_order_acquire);
      }
    }
  }
  void worker_loop(std::uint32_t seen, std::size_t self) {
    for (;;) {
      spin_until([&] { return generation_.load(std::memory_order_acquire) != seen; });
      generation_.wait(seen, std::memory_order_acquire);
      seen = generation_.load(std::memory_order_acquire);
      if (stop_.load(std::memory_order_relaxed)) return;
      take_parts(self);
    }
  }

  std::vector<std::thread> workers_;
  std::mutex run_mutex_;
  std::atomic<std::uint32_t> generation_{0};  // bumped to wake the workers
  // One thread's share of the current job; a cache line each, so that claims
  // on one do not slow the others'.
  struct alignas(64) Share {
    std::atomic<std::uint64_t> value{0};
  };
  std::unique_ptr<Share[]> shares_ = std::make_unique<Share[]>(1);
  std::atomic<std::uint32_t> done_{0};  // parts of the current job finished
  std::atomic<bool> stop_{false};
  std::uint64_t job_ = 0;  // only the caller of run() touches it
  // The published job: written before the shares (release), read after a
  // part of it was claimed (acquire).
  PartFn fn_ = nullptr;
  std::uint32_t parts_ = 0;
  void* context_ = nullptr;
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

namespace parallel_detail {
// The threads a kernel called here can spread over: num_threads(), or 1
// inside a part of a pool job (whose runs are serial, Pool::in_part).
inline std::size_t free_threads() { return Pool::in_part() ? 1 : num_threads(); }
}  // namespace parallel_detail

// Runs fn(context, part) for part in [0, parts) on the pool (in any order,
// possibly concurrently); returns when all are done.
inline void parallel_for(std::size_t parts, parallel_detail::PartFn fn, void* context) {
  parallel_detail::pool().run(parts, fn, context);
}

// Splits [0, n) into contiguous ranges of at least `grain` elements and calls
// body(begin, end) for each, spread over the pool; on one thread, or below
// two grains, it is one call body(0, n). For loops whose elements are
// independent (each output written by exactly one range).
template <class Body>
inline void parallel_ranges(std::size_t n, std::size_t grain, Body&& body) {
  const std::size_t threads = parallel_detail::free_threads();
  if (threads <= 1 || n < 2 * grain) {
    body(std::size_t{0}, n);
    return;
  }
  struct Context {
    std::remove_reference_t<Body>* body;
    std::size_t n, parts;
  } context{&body, n, std::min(threads * 4, n / grain)};
  auto part = [](void* c, std::size_t p) {
    const Context& x = *static_cast<const Context*>(c);
    (*x.body)(p * x.n / x.parts, (p + 1) * x.n / x.parts);
  };
  parallel_for(context.parts, part, &context);
}

// Calls body(i) for every i in [0, n), each its own part of the pool (in
// any order, possibly concurrently): for a few large, independent items of
// like work (attention heads), which contiguous ranges would split unevenly.
// A part's own kernels then run on its thread alone (free_threads); on one
// thread, or inside a part, the items run one after another (Pool::run).
template <class Body>
inline void parallel_each(std::size_t n, Body&& body) {
  auto part = [](void* c, std::size_t i) { (*static_cast<std::remove_reference_t<Body>*>(c))(i); };
  parallel_for(n, part, &body);
}

}  // namespace grad
