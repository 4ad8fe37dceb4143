// Reductions over all axes to shape {1}. One order: ascending flat index,
// starting from zero.
#pragma once

#include <string_view>

#include "grad/ops/family.hpp"

namespace grad {

template <class T>
GRAD_HD inline T sum_ascending(const T* x, std::size_t n) {
  T acc = T(0);
  for (std::size_t i = 0; i < n; ++i) acc = acc + x[i];
  return acc;
}

struct Sum {
  static constexpr std::string_view name = "sum";
  static constexpr Tier tier = Tier::exact;
  static constexpr int arity = 1;
  static constexpr bool row_local = false;
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    y[0] = sum_ascending(x.a.data, x.a.dims.size());
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T*, const T* g, T* dx) {
    const std::size_t n = x.a.dims.size();
    for (std::size_t i = 0; i < n; ++i) dx[i] = g[0];
  }
};

struct Mean {
  static constexpr std::string_view name = "mean";
  static constexpr Tier tier = Tier::exact;
  static constexpr int arity = 1;
  static constexpr bool row_local = false;
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    const std::size_t n = x.a.dims.size();
    y[0] = sum_ascending(x.a.data, n) / static_cast<T>(n);
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T*, const T* g, T* dx) {
    const std::size_t n = x.a.dims.size();
    const T share = g[0] / static_cast<T>(n);
    for (std::size_t i = 0; i < n; ++i) dx[i] = share;
  }
};

}  // namespace grad
