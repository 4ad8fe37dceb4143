// softmax along one axis. Per lane: max, exp(x - max), a sum in ascending
// index, then one division per element. Backward: dx = y * (g - <g, y>),
// the dot product in ascending index, one fma per term.
#pragma once

#include <cstddef>
#include <string_view>
#include <type_traits>

#include "grad/numerics/exact_math.hpp"
#include "grad/tags/family.hpp"

namespace grad {

struct Softmax : ItemLoops<Softmax> {
  static constexpr std::string_view name = "softmax";
  static constexpr std::string_view torch = "torch.softmax(a, axis)";
  static constexpr int arity = 1;
  static std::string output_dims(const Dims& a, const Dims&, OpAttrs& at, Dims& out) {
    out = a;
    return resolve_axis(a, at.axis, [&] { return "shape " + shape_string(a); });
  }

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
    for (std::size_t i = 0; i < n; ++i) dot = fma_hd(g[i * stride], y[i * stride], dot);
    for (std::size_t i = 0; i < n; ++i) dx[i * stride] = y[i * stride] * (g[i * stride] - dot);
  }

  // Item w is one whole lane (w counts the lanes row-major).
  struct Lane {
    std::size_t base, n, stride;
  };
  template <class T>
  GRAD_HD static Lane lane(const NodeArgs<T>& x, std::size_t w) {
    std::size_t inner = 1;
    for (std::size_t i = x.axis + 1; i < x.out.rank; ++i) inner *= x.out.d[i];
    const std::size_t n = x.out.d[x.axis];
    return {w / inner * n * inner + w % inner, n, inner};
  }
  template <class T>
  GRAD_HD static std::size_t forward_items(const NodeArgs<T>& x) {
    return x.out.size() / x.out.d[x.axis];
  }
  template <int In, class T>
  GRAD_HD static std::size_t backward_items(const NodeArgs<T>& x) {
    return x.out.size() / x.out.d[x.axis];
  }
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    const Lane l = lane(x, w);
    forward_lane(x.a.data + l.base, y + l.base, l.n, l.stride);
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T* y, const T* g, T* dx, std::size_t w) {
    const Lane l = lane(x, w);
    backward_lane(y + l.base, g + l.base, dx + l.base, l.n, l.stride);
  }

  // ---- host loops: lanes split over the pool; a contiguous lane's
  // element-wise passes (exp, the division, backward's product) run on the
  // best instruction set's packs, its sums stay serial and ascending: each
  // element sees forward_lane's / backward_lane's operations in their order,
  // so the bits are theirs. ----
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    each_lane(x, [&](auto pack, const Lane& l) {
      if (l.stride == 1)
        forward_row<decltype(pack)>(x.a.data + l.base, y + l.base, l.n);
      else
        forward_lane(x.a.data + l.base, y + l.base, l.n, l.stride);
    });
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T* y, const T* g, T* dx) {
    each_lane(x, [&](auto pack, const Lane& l) {
      if (l.stride == 1)
        backward_row<decltype(pack)>(y + l.base, g + l.base, dx + l.base, l.n);
      else
        backward_lane(y + l.base, g + l.base, dx + l.base, l.n, l.stride);
    });
  }

 private:
  // f(P{}, lane) for every lane, lanes split over the pool, in the best
  // instruction set's copy (P its pack).
  template <class T, class F>
  static void each_lane(const NodeArgs<T>& x, F&& f) {
    parallel_ranges(forward_items(x), row_grain(x.out.d[x.axis]), [&](std::size_t lo, std::size_t hi) {
      with_best_isa([&](auto width) {
        for (std::size_t w = lo; w < hi; ++w) f(pack_for<T, decltype(width)>{}, lane(x, w));
      });
    });
  }
  template <class P, class T>
  GRAD_INLINE static void forward_row(const T* x, T* y, std::size_t n) {
    const T hi = running_max(x, n);
    using namespace kernels_detail;
    for_packs<P, T>(n, [&](std::size_t i, auto v) {
      using V = decltype(v);
      store_as(exact_exp(load_as<V>(x + i) - V(hi)), y + i);
    });
    T total = T(0);
    for (std::size_t i = 0; i < n; ++i) total = total + y[i];
    for_packs<P, T>(n, [&](std::size_t i, auto v) {
      using V = decltype(v);
      store_as(load_as<V>(y + i) / V(total), y + i);
    });
  }
  template <class P, class T>
  GRAD_INLINE static void backward_row(const T* y, const T* g, T* dx, std::size_t n) {
    T dot = T(0);
    for (std::size_t i = 0; i < n; ++i) dot = fma_hd(g[i], y[i], dot);
    using namespace kernels_detail;
    for_packs<P, T>(n, [&](std::size_t i, auto v) {
      using V = decltype(v);
      store_as(load_as<V>(y + i) * (load_as<V>(g + i) - V(dot)), dx + i);
    });
  }
};

}  // namespace grad
