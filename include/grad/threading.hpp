// Why set_num_threads(n) helps or not: the sizes below which grad runs an
// op on the calling thread, and a report over a recorded tape.
//
// grad splits work only when a piece is big enough to pay for waking the
// pool (numerics/parallel.hpp, tags/family.hpp, numerics/gemm/split.hpp):
//   matmul / bmm      when m * n * k >= 2^20 multiply-adds (gemm's parallel_threshold),
//                     split over output rows/columns
//   elementwise ops,  when the output has >= 2 * 2^15 = 65,536 elements
//   the optimizers'   (elementwise_grain), split over contiguous ranges;
//   updates           row ops (softmax, row_sum, bias gradients) by rows or
//                     columns in runs of the same size
// So a 64-128-64-10 classifier at batch 64 (the largest product is
// 64 x 128 x 64 = 2^19) runs entirely on one thread whatever
// set_num_threads says; batch 128 reaches the threshold in its first two
// layers' products only.
//
//   std::cout << grad::threading_report(tp);   // after recording one step
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

#include "grad/numerics/gemm/split.hpp"  // parallel_threshold
#include "grad/numerics/parallel.hpp"
#include "grad/tags/family.hpp"
#include "grad/tape.hpp"

namespace grad {

struct ThreadingThresholds {
  std::size_t matmul_multiply_adds;  // m * n * k at or above which a product is split
  std::size_t elementwise_elements;  // output elements at or above which an elementwise loop is split
};

inline ThreadingThresholds threading_thresholds() { return {gemm_detail::parallel_threshold, 2 * elementwise_grain}; }

// One paragraph: the thread count, the thresholds, and when a tape is
// given, how many of its matmuls and elementwise nodes are large enough to
// be split (the rest run on the calling thread).
inline std::string threading_report() {
  const ThreadingThresholds t = threading_thresholds();
  return "grad threads: " + std::to_string(num_threads()) +
         " (set_num_threads). A matmul is split over threads when m*n*k >= " + std::to_string(t.matmul_multiply_adds) +
         " multiply-adds; an elementwise op or optimizer update when it has >= " +
         std::to_string(t.elementwise_elements) + " elements. Smaller work runs on the calling thread.\n";
}

template <class T>
std::string threading_report(const Tape<T>& tp) {
  const ThreadingThresholds t = threading_thresholds();
  std::size_t products = 0, split_products = 0, others = 0, split_others = 0, largest_product = 0, largest = 0;
  for (const Node<T>& n : tp.nodes()) {
    if (n.op == op_code<Param> || n.op == op_code<Const>) continue;
    if (n.op == op_code<Matmul> || n.op == op_code<Bmm>) {
      const Dims& a = tp.nodes()[n.a].dims;
      const std::size_t work = n.dims.size() * a[a.rank - 1];  // outputs x inner length
      ++products;
      split_products += work >= t.matmul_multiply_adds;
      largest_product = std::max(largest_product, work);
    } else {
      ++others;
      split_others += n.dims.size() >= t.elementwise_elements;
      largest = std::max(largest, n.dims.size());
    }
  }
  std::string s = threading_report();
  s += "This tape: " + std::to_string(split_products) + " of " + std::to_string(products) +
       " matrix products large enough to split (largest " + std::to_string(largest_product) + " multiply-adds), " +
       std::to_string(split_others) + " of " + std::to_string(others) + " other ops (largest " +
       std::to_string(largest) + " elements).";
  if (split_products + split_others == 0)
    s += " Nothing here is split: more threads cannot help at this size (a larger batch can).";
  return s + "\n";
}

}  // namespace grad
