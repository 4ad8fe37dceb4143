// softmax along one axis. Per lane: max, exp(x - max), a sum in ascending
// index, then one division per element. Backward: dx = y * (g - <g, y>).
#pragma once

#include <string_view>

#include "grad/ops/exact_math.hpp"
#include "grad/ops/family.hpp"

namespace grad {

struct Softmax {
  static constexpr std::string_view name = "softmax";
  static constexpr Tier tier = Tier::exact;  // exp is exact_exp: + - * / only
  static constexpr int arity = 1;
  static constexpr bool row_local = false;

  // A lane is n elements `stride` apart.
  template <class T>
  GRAD_HD static void forward_lane(const T* x, T* y, std::size_t n, std::size_t stride) {
    T hi = x[0];
    for (std::size_t i = 1; i < n; ++i) hi = x[i * stride] > hi ? x[i * stride] : hi;
    T total = T(0);
    for (std::size_t i = 0; i < n; ++i) {
      y[i * stride] = exact_exp(x[i * stride] - hi);
      total = total + y[i * stride];
    }
    for (std::size_t i = 0; i < n; ++i) y[i * stride] = y[i * stride] / total;
  }
  template <class T>
  GRAD_HD static void backward_lane(const T* y, const T* g, T* dx, std::size_t n, std::size_t stride) {
    T dot = T(0);
    for (std::size_t i = 0; i < n; ++i) dot = dot + g[i * stride] * y[i * stride];
    for (std::size_t i = 0; i < n; ++i) dx[i * stride] = y[i * stride] * (g[i * stride] - dot);
  }

  struct Lanes {
    std::size_t outer, n, inner;
  };
  static Lanes lanes(const Dims& d, std::size_t axis) {
    Lanes l{1, d.d[axis], 1};
    for (std::size_t i = 0; i < axis; ++i) l.outer *= d.d[i];
    for (std::size_t i = axis + 1; i < d.rank; ++i) l.inner *= d.d[i];
    return l;
  }
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    const Lanes l = lanes(x.out, x.axis);
    for (std::size_t o = 0; o < l.outer; ++o)
      for (std::size_t i = 0; i < l.inner; ++i) {
        const std::size_t base = o * l.n * l.inner + i;
        forward_lane(x.a.data + base, y + base, l.n, l.inner);
      }
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T* y, const T* g, T* dx) {
    const Lanes l = lanes(x.out, x.axis);
    for (std::size_t o = 0; o < l.outer; ++o)
      for (std::size_t i = 0; i < l.inner; ++i) {
        const std::size_t base = o * l.n * l.inner + i;
        backward_lane(y + base, g + base, dx + base, l.n, l.inner);
      }
  }
};

}  // namespace grad
