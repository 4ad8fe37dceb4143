// log_softmax along one axis, stable: per lane the max m, the sum of
// exp(x - m) in ascending index (exact_exp), then y = (x - m) - ln(sum)
// (exact_log), which is torch's order of operations. Never exp of a large
// number and never log of a tiny one: a lane with logits of 1000 gives
// finite values where log(softmax(x)) gives -inf. Backward:
// dx = g - exp(y) * sum(g), torch's formula, the sum ascending.
#pragma once

#include <string_view>

#include "grad/numerics/exact_math.hpp"
#include "grad/tags/softmax.hpp"

namespace grad {

struct LogSoftmax : ItemLoops<LogSoftmax> {
  static constexpr std::string_view name = "log_softmax";
  static constexpr std::string_view torch = "torch.log_softmax(a, axis)";
  static constexpr int arity = 1;
  static std::string output_dims(const Dims& a, const Dims&, OpAttrs& at, Dims& out) {
    out = a;
    return resolve_axis(a, at.axis, [&] { return "shape " + shape_string(a); });
  }

  template <class T>
  GRAD_HD static void forward_lane(const T* x, T* y, std::size_t n, std::size_t stride) {
    T hi = x[0];
    for (std::size_t i = 1; i < n; ++i) hi = x[i * stride] > hi ? x[i * stride] : hi;
    T total = T(0);
    for (std::size_t i = 0; i < n; ++i) total = total + exact_exp(x[i * stride] - hi);
    const T log_total = exact_log(total);
    for (std::size_t i = 0; i < n; ++i) y[i * stride] = (x[i * stride] - hi) - log_total;
  }
  template <class T>
  GRAD_HD static void backward_lane(const T* y, const T* g, T* dx, std::size_t n, std::size_t stride) {
    T total = T(0);
    for (std::size_t i = 0; i < n; ++i) total = total + g[i * stride];
    for (std::size_t i = 0; i < n; ++i) dx[i * stride] = g[i * stride] - exact_exp(y[i * stride]) * total;
  }

  // Item w is one whole lane, numbered as softmax's.
  template <class T>
  GRAD_HD static std::size_t forward_items(const NodeArgs<T>& x) {
    return Softmax::forward_items(x);
  }
  template <int In, class T>
  GRAD_HD static std::size_t backward_items(const NodeArgs<T>& x) {
    return Softmax::forward_items(x);
  }
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    const Softmax::Lane l = Softmax::lane(x, w);
    forward_lane(x.a.data + l.base, y + l.base, l.n, l.stride);
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T* y, const T* g, T* dx, std::size_t w) {
    const Softmax::Lane l = Softmax::lane(x, w);
    backward_lane(y + l.base, g + l.base, dx + l.base, l.n, l.stride);
  }
};

}  // namespace grad
