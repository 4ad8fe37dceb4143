// The split of a product across the thread pool (multiply): by output rows or columns, each
// element computed whole by one thread. Apart: the only part of the gemm that knows of threads.
#pragma once

#include <algorithm>
#include <cstddef>

#include "grad/numerics/gemm/blocked.hpp"
#include "grad/numerics/gemm/problem.hpp"
#include "grad/numerics/parallel.hpp"

namespace grad {
namespace gemm_detail {

// Below this many multiply-adds a product runs on the calling thread: waking
// the pool would cost more than it saves.
inline constexpr std::size_t parallel_threshold = std::size_t{1} << 20;

template <class T>
struct Split {
  Isa isa;
  const Problem<T>* problem;
  std::size_t parts, units, unit;
  bool by_columns;
};

template <class T>
void run_part(void* context, std::size_t part) {
  const Split<T>& s = *static_cast<const Split<T>*>(context);
  const Problem<T>& pr = *s.problem;
  const std::size_t extent = s.by_columns ? pr.n : pr.m;
  const std::size_t lo = std::min(extent, part * s.units / s.parts * s.unit);
  const std::size_t hi = std::min(extent, (part + 1) * s.units / s.parts * s.unit);
  if (lo == hi) return;
  if (s.by_columns)
    multiply_range(s.isa, pr, 0, pr.m, lo, hi);
  else
    multiply_range(s.isa, pr, lo, hi, 0, pr.n);
}

// Whether threads that split the product's columns read a in place
// (Problem::a_in_place): when its rows are contiguous and it is larger than
// L2. Packed, such an a is one more pass over memory per thread, every
// thread copying the same rows (Qwen2.5-0.5B's down projection: a is 10 MB;
// the fused loss's dh product: 104 MB per chunk). Measured there (Zen 5, 2
// threads, L1 step, two runs of 6 interleaved rounds): 5.68 -> 5.39 s and
// 5.76 -> 5.52 s. One thread keeps packing: its copy is made once, and
// reading in place measured no faster there.
template <class T>
bool a_in_place_when_split(const Problem<T>& pr) {
  return pr.a.cs == 1 && pr.m * pr.k * sizeof(T) > cache_blocking().l2_bytes;
}

template <class T>
void multiply(Isa isa, const Problem<T>& pr) {
  if (pr.m == 0 || pr.n == 0) return;
  if (pr.k == 0) {  // empty sums: zero, or what C holds when continued
    if (pr.continued) return;
    std::fill(pr.c, pr.c + pr.m * pr.n, T(0));
    return;
  }
  const std::size_t threads = parallel_detail::free_threads();
  if (threads <= 1 || pr.m * pr.n * pr.k < parallel_threshold) return multiply_range(isa, pr, 0, pr.m, 0, pr.n);
  // Each thread packs the whole of the operand it does not split: split
  // the output so that the smaller operand is the one packed twice (columns
  // of C: a, m x k, is copied by every thread; rows: b, k x n), as long as
  // that side has a tile for every thread. Units are the widest register tile.
  constexpr std::size_t col_unit = 4 * 64 / sizeof(T), row_unit = 6;
  const std::size_t col_units = (pr.n + col_unit - 1) / col_unit, row_units = (pr.m + row_unit - 1) / row_unit;
  const bool by_columns = col_units >= threads && (pr.m <= pr.n || row_units < threads);
  const std::size_t units = by_columns ? col_units : row_units;
  // One part per thread where every part packs its own copy of the unsplit
  // operand: finer parts would pay that copy again (measured: 8 parts cost
  // ~30% more CPU time than 2 on workload B). Where a is read in place
  // nothing is copied twice, and four parts per thread let one that finishes
  // early take a slower one's last part (the pool hands each thread its own
  // parts first: parallel.hpp). Measured on 2 cores (Zen 5 VM), 2 threads:
  // 512x1024x2816 8.6 -> 8.0 ms, 512x2816x1024 8.4 -> 8.2, with one core
  // shared with a busy loop 17.6 -> 12.8 ms.
  Problem<T> split_problem = pr;
  split_problem.a_in_place = by_columns && a_in_place_when_split(pr);
  const std::size_t parts = split_problem.a_in_place ? 4 * threads : threads;
  Split<T> split{isa, &split_problem, std::min(parts, units), units, by_columns ? col_unit : row_unit, by_columns};
  parallel_for(split.parts, &run_part<T>, &split);
}

}  // namespace gemm_detail
}  // namespace grad
