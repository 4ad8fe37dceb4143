// Sum over the last axis, keeping it as an axis of size 1: [..., n] -> [..., 1].
// The per-row reduction that nn's norms and cross-entropy need. One order:
// each row is summed in the documented order of every full reduction
// (sum_fixed, grad/ops/reduce.hpp: 32 lanes and a fixed tree), so a row_sum
// over a single row equals sum bitwise, and a long row vectorises.
#pragma once

#include <string_view>

#include "grad/ops/family.hpp"
#include "grad/ops/reduce.hpp"

namespace grad {

struct RowSum {
  static constexpr std::string_view name = "row_sum";
  static constexpr Tier tier = Tier::exact;
  static constexpr int arity = 1;
  // Conservative: its output has a different shape from its input, so it is
  // not an elementwise member of a fused segment.
  static constexpr bool row_local = false;

  // One row of n contiguous elements.
  template <class T>
  GRAD_HD static T forward_row(const T* x, std::size_t n) {
    return sum_fixed(x, n);
  }
  // Every element of the row receives the row's upstream gradient.
  template <class T>
  GRAD_HD static void backward_row(T g, T* dx, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) dx[i] = g;
  }

  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    const std::size_t n = x.a.dims.back(), rows = x.out.size();
    for (std::size_t r = 0; r < rows; ++r) y[r] = forward_row(x.a.data + r * n, n);
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T*, const T* g, T* dx) {
    const std::size_t n = x.a.dims.back(), rows = x.out.size();
    for (std::size_t r = 0; r < rows; ++r) backward_row(g[r], dx + r * n, n);
  }
};

}  // namespace grad
