// A product as the kernels see it (operands by strides, Problem) and the cache blocks it is cut
// into: the description every other part of the gemm reads, apart from any kernel.
#pragma once

#include <algorithm>
#include <cstddef>
#if defined(__unix__)
#include <unistd.h>  // sysconf: the cache sizes
#endif

#include "grad/numerics/storage.hpp"

namespace grad {
namespace gemm_detail {

// Element (r, c) of a matrix operand lives at p[r * rs + c * cs]; the three
// layouts differ only in these strides. b may be held in 16 bits (storage):
// p then points at its 16-bit elements, which only Terms reads (widened);
// or quantized: p points at its blocks, element p * rs + c * cs counted as
// numerics/held.hpp counts them, `lines` memory rows of max(rs, cs)
// elements (laid out as numerics/quant_rows.hpp says), which only
// pack_b_quantized and the quantized one-row kernels read.
template <class T>
struct Strided {
  const T* p;
  std::size_t rs, cs;
  Storage storage = Storage::native;
  std::size_t lines = 0;
};

// C (row-major, m x n) = sum over p < k of a(i, p) b(p, j); with
// `continued`, each element's sum goes on from what C holds (its chain of
// fmas continued, as a later cache block continues it) instead of from zero.
template <class T>
struct Problem {
  Strided<T> a, b;
  T* c;
  std::size_t m, n, k;
  bool continued = false;
  // Read a's row panels where they lie instead of packing a's blocks: set
  // by multiply when threads split the columns and would each pack the
  // same large a (multiply_block; the same fmas in the same order).
  bool a_in_place = false;
};

// Cache blocking: a KC x NC block of b stays in L2 while MC x KC blocks of
// a stream past it; one KC x NR micro-panel of b sits in L1. The sizes come
// from the machine's caches, read once at run time (sysconf; 48 KiB L1d and
// 1 MiB L2 where it does not say): kc in proportion to L1d (256 at 48 KiB,
// the best measured on Zen 4/5), nc so that the KC x NC block fills L2 (1,024
// floats or 512 doubles at 1 MiB). Blocking never changes a bit: a sum split
// into runs is stored and reloaded unchanged between them.
inline std::size_t cache_bytes(int level) {
#if defined(__unix__) && defined(_SC_LEVEL1_DCACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE)
  const long v = sysconf(level == 1 ? _SC_LEVEL1_DCACHE_SIZE : _SC_LEVEL2_CACHE_SIZE);
  if (v > 0) return static_cast<std::size_t>(v);
#endif
  return level == 1 ? 48 * 1024 : 1024 * 1024;
}
struct CacheBlocking {
  std::size_t kc, nc_bytes, l2_bytes;
};
inline const CacheBlocking& cache_blocking() {
  static const CacheBlocking b = [] {
    const std::size_t l1 = std::clamp<std::size_t>(cache_bytes(1), 16 * 1024, 128 * 1024);
    const std::size_t l2 = std::clamp<std::size_t>(cache_bytes(2), 256 * 1024, 4 * 1024 * 1024);
    const std::size_t kc = std::clamp<std::size_t>(256 * l1 / (48 * 1024) / 16 * 16, 128, 512);
    return CacheBlocking{kc, l2 / kc, l2};
  }();
  return b;
}
template <class T>
struct Blocking {
  static constexpr std::size_t mc = 96;  // a multiple of every kernel's MR
  static std::size_t kc() { return cache_blocking().kc; }
  static std::size_t nc() { return std::max<std::size_t>(cache_blocking().nc_bytes / sizeof(T), 256); }
};

}  // namespace gemm_detail
}  // namespace grad
