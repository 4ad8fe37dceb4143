// max and min over one axis (torch.amax / torch.amin): [.., n, ..] ->
// [.., 1, ..] (keep_axis, the default) or [.., ..]. The output elements are
// in the same order either way, so the bodies never look at which: only the
// shape rule and the recorded shape differ.
//
// Gradient convention, torch.amax's (not max(dim)'s, which gives all of it
// to the first index): g split evenly among the tied maxima,
// dx_i = (g / count) * (x_i == max), count the lane's ties; written exactly
// as torch writes it, so a NaN in a lane (the max is NaN, count 0) gives the
// whole lane NaN gradients, as in torch.
#pragma once

#include <string>
#include <string_view>

#include "grad/numerics/choice.hpp"
#include "grad/tags/family.hpp"

namespace grad {

template <class Derived>
struct AxisExtreme : ItemLoops<Derived> {
  static constexpr int arity = 1;

  static std::string output_dims(const Dims& a, const Dims&, OpAttrs& at, Dims& out) {
    std::string why = resolve_axis(a, at.axis, [&] { return "shape " + shape_string(a); });
    if (!why.empty()) return why;
    const auto axis = static_cast<std::size_t>(at.axis);
    out = a;
    if (at.keep_axis || a.rank == 1) {  // a vector's max without its axis is a scalar, which a tape holds as [1]
      out.d[axis] = 1;
      return {};
    }
    for (std::size_t i = axis; i + 1 < a.rank; ++i) out.d[i] = a.d[i + 1];
    out.d[a.rank - 1] = 0;
    out.rank = a.rank - 1;
    return {};
  }

  // Item w is lane w (the lanes counted row-major over the other axes, which
  // is output element w): n elements `stride` apart from `base`.
  struct Lane {
    std::size_t base, n, stride;
  };
  template <class T>
  GRAD_HD static Lane lane(const NodeArgs<T>& x, std::size_t w) {
    std::size_t inner = 1;
    for (std::size_t i = x.axis + 1; i < x.a.dims.rank; ++i) inner *= x.a.dims.d[i];
    const std::size_t n = x.a.dims.d[x.axis];
    return {w / inner * n * inner + w % inner, n, inner};
  }
  template <int In, class T>
  GRAD_HD static std::size_t backward_items(const NodeArgs<T>& x) {
    return x.out.size();
  }

  // Ascending; a NaN, once met, is kept (Derived::beats is false against it).
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    const Lane l = lane(x, w);
    const T* a = x.a.data + l.base;
    T best = a[0];
    for (std::size_t i = 1; i < l.n; ++i) {
      const T v = a[i * l.stride];
      best = v != v || Derived::beats(v, best) ? v : best;
    }
    y[w] = choice::of_lane<T>(best, a, l.n, l.stride);  // best itself; a dual number's tangent the ties' mean
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T* y, const T* g, T* dx, std::size_t w) {
    const Lane l = lane(x, w);
    const T* a = x.a.data + l.base;
    T count = T(0);
    for (std::size_t i = 0; i < l.n; ++i) count = count + (a[i * l.stride] == y[w] ? T(1) : T(0));
    const T share = g[w] / count;
    for (std::size_t i = 0; i < l.n; ++i) dx[l.base + i * l.stride] = share * (a[i * l.stride] == y[w] ? T(1) : T(0));
  }
};

struct AxisMax : AxisExtreme<AxisMax> {
  static constexpr std::string_view name = "max";
  static constexpr std::string_view torch = "torch.amax(a, axis, keepdim=True).reshape(dims)";
  template <class T>
  GRAD_HD static bool beats(T v, T best) {
    return v > best;
  }
};

struct AxisMin : AxisExtreme<AxisMin> {
  static constexpr std::string_view name = "min";
  static constexpr std::string_view torch = "torch.amin(a, axis, keepdim=True).reshape(dims)";
  template <class T>
  GRAD_HD static bool beats(T v, T best) {
    return v < best;
  }
};

}  // namespace grad
