// sum and mean over all axes, to shape {1}, in the fixed order of
// grad/numerics/fixed_order.hpp (sum_fixed).
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>

#include "grad/numerics/fixed_order.hpp"
#include "grad/tags/family.hpp"

namespace grad {

// What sum and mean share: shape {1} from any operand, and a forward that is
// one item (the whole reduction). Backward hands every element the same share.
struct ReduceAll {
  static std::string output_dims(const Dims&, const Dims&, OpAttrs&, Dims& out) {
    out = Dims::of(std::array<std::size_t, 1>{1});
    return {};
  }
  template <class T>
  GRAD_HD static std::size_t forward_items(const NodeArgs<T>&) {
    return 1;
  }
};

struct Sum : ItemLoops<Sum>, ReduceAll {
  static constexpr std::string_view name = "sum";
  static constexpr std::string_view torch = "a.sum().reshape(1)";
  static constexpr int arity = 1;
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t) {
    y[0] = sum_fixed(x.a.data, x.a.dims.size());
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>&, const T*, const T* g, T* dx, std::size_t w) {
    dx[w] = g[0];
  }
};

struct Mean : ItemLoops<Mean>, ReduceAll {
  static constexpr std::string_view name = "mean";
  static constexpr std::string_view torch = "a.mean().reshape(1)";
  static constexpr int arity = 1;
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t) {
    const std::size_t n = x.a.dims.size();
    y[0] = sum_fixed(x.a.data, n) / static_cast<T>(n);
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    dx[w] = g[0] / static_cast<T>(x.a.dims.size());
  }
};

}  // namespace grad
