// Replaces the global operator new/delete with versions that count every
// allocation in `grad::testing::allocations` (and the largest in
// `largest_allocation`). Include it in exactly one
// translation unit of a test executable of its own (test_allocations,
// test_everyday): the count must see nothing but the loop under test.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <new>

namespace grad::testing {
inline std::atomic<long> allocations{0};
inline std::atomic<std::size_t> largest_allocation{0};  // bytes; a test resets it to 0 before the loop it watches
inline void count_allocation(std::size_t n) {
  allocations.fetch_add(1, std::memory_order_relaxed);
  std::size_t seen = largest_allocation.load(std::memory_order_relaxed);
  while (n > seen && !largest_allocation.compare_exchange_weak(seen, n, std::memory_order_relaxed)) {
  }
}
}  // namespace grad::testing

// These replacements pair malloc/aligned_alloc with free on purpose; GCC's
// mismatch warning cannot see that every new here is ours.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

void* operator new(std::size_t n) {
  grad::testing::count_allocation(n);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new(std::size_t n, std::align_val_t al) {
  grad::testing::count_allocation(n);
  const std::size_t a = static_cast<std::size_t>(al);
  if (void* p = std::aligned_alloc(a, (n + a - 1) / a * a)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
