// Sum over the last axis, keeping it as an axis of size 1: [..., n] -> [..., 1].
// The per-row reduction that nn's norms and cross-entropy need. One order:
// each row is summed in the documented order of every full reduction
// (sum_fixed, grad/numerics/fixed_order.hpp: 32 lanes and a fixed tree), so a row_sum
// over a single row equals sum bitwise, and a long row vectorises.
#pragma once

#include <string_view>

#include "grad/numerics/fixed_order.hpp"
#include "grad/tags/family.hpp"

namespace grad {

struct RowSum : ItemLoops<RowSum> {
  static constexpr std::string_view name = "row_sum";
  static constexpr std::string_view torch = "a.sum(-1, keepdim=True)";
  static constexpr int arity = 1;
  static std::string output_dims(const Dims& a, const Dims&, OpAttrs&, Dims& out) {
    out = a;
    out.d[out.rank - 1] = 1;
    return {};
  }

  // Item w is row w, both ways: its sum forward; its n gradient elements,
  // each the row's upstream gradient, backward.
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    const std::size_t n = x.a.dims.back();
    y[w] = sum_fixed(x.a.data + w * n, n);
  }
  template <int In, class T>
  GRAD_HD static std::size_t backward_items(const NodeArgs<T>& x) {
    return x.out.size();
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    const std::size_t n = x.a.dims.back();
    for (std::size_t i = 0; i < n; ++i) dx[w * n + i] = g[w];
  }
};

}  // namespace grad
