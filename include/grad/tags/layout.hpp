// Data movement: reshape, slice, concat. Gradients are copies.
#pragma once

#include <algorithm>
#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "grad/tags/family.hpp"

namespace grad {

struct Reshape {
  static constexpr std::string_view name = "reshape";
  static constexpr std::string_view torch = "a.reshape(dims)";
  static constexpr int arity = 1;
  static std::string output_dims(const Dims& a, const Dims&, OpAttrs& at, Dims& out) {
    // Messages are built only on failure: recording allocates nothing.
    auto from = [&] {
      return "cannot reshape " + shape_string(a) + " (" + std::to_string(a.size()) + " elements) to " +
             shape_string(at.sizes);
    };
    if (at.sizes.size() > max_rank || at.sizes.empty())
      return "cannot reshape " + shape_string(a) + " to " + shape_string(at.sizes) +
             ": the target shape must have rank 1 to " + std::to_string(max_rank);
    const std::optional<std::size_t> count = checked_element_count(at.sizes);
    if (!count) return from() + ": its element count overflows";
    if (*count != a.size()) return from() + " (" + std::to_string(*count) + " elements)";
    out = Dims::of(at.sizes);
    return {};
  }
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    y[w] = x.a.data[w];
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>&, const T*, const T* g, T* dx, std::size_t w) {
    dx[w] = g[w];
  }

  // The host loops: the same copies as block copies (an element loop
  // becomes one only where the compiler vectorises it, -O3 but not -O2),
  // spread over the pool like every elementwise loop, so that each thread
  // copies the range its core wrote before (parallel.hpp) instead of one
  // thread fetching the other core's half (the 209M-parameter LoRA step's
  // reshapes at 2 threads: 17 ms serial, 7 ms split; 9 ms on one thread).
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    copy(x.a.data, x.out.size(), y);
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T*, const T* g, T* dx) {
    copy(g, x.out.size(), dx);
  }

 private:
  template <class T>
  static void copy(const T* from, std::size_t n, T* to) {
    parallel_ranges(n, elementwise_grain,
                    [&](std::size_t lo, std::size_t hi) { std::copy_n(from + lo, hi - lo, to + lo); });
  }
};

// Visits each output element of a slice with its flat input index, ascending.
template <class F>
inline void slice_loop(const Dims& in, const Dims& out, const std::size_t* starts, F&& f) {
  const std::size_t n = out.size();
  if (n == 0) return;
  std::array<std::size_t, max_rank> stride{}, idx{};
  std::size_t s = 1, base = 0;
  for (std::size_t ax = in.rank; ax-- > 0;) {
    stride[ax] = s;
    base += starts[ax] * s;
    s *= in.d[ax];
  }
  std::size_t src = base;
  for (std::size_t j = 0; j < n; ++j) {
    f(j, src);
    for (std::size_t ax = out.rank; ax-- > 0;) {
      src += stride[ax];
      if (++idx[ax] < out.d[ax]) break;
      src -= stride[ax] * out.d[ax];
      idx[ax] = 0;
    }
  }
}

// Per-axis half-open ranges [starts, starts + out) of the input.
struct Slice {
  static constexpr std::string_view name = "slice";
  static constexpr std::string_view torch = "a[tuple(slice(s0, s0 + d) for s0, d in zip(extra, dims))]";
  static constexpr int arity = 1;
  static constexpr bool keeps_sizes = true;  // the starts, read by the items as x.extra
  static std::string output_dims(const Dims& a, const Dims&, OpAttrs& at, Dims& out) {
    if (at.sizes.size() != a.rank || at.stops.size() != a.rank)
      return "shape " + shape_string(a) + " needs " + std::to_string(a.rank) + " starts and stops, got " +
             std::to_string(at.sizes.size()) + " and " + std::to_string(at.stops.size());
    out = a;
    for (std::size_t ax = 0; ax < a.rank; ++ax) {
      if (!(at.sizes[ax] < at.stops[ax] && at.stops[ax] <= a[ax]))
        return "range [" + std::to_string(at.sizes[ax]) + ", " + std::to_string(at.stops[ax]) + ") on axis " +
               std::to_string(ax) + " of shape " + shape_string(a) + " is empty or out of bounds (expected start < " +
               "stop <= " + std::to_string(a[ax]) + ")";
      out.d[ax] = at.stops[ax] - at.sizes[ax];
    }
    return {};
  }
  // The per-item bodies: forward gathers from the input box; backward gives
  // each input element its output's gradient inside the box and zero outside.
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    std::size_t src = 0, in_stride = 1, rest = w;
    for (std::size_t ax = x.out.rank; ax-- > 0;) {
      src += (rest % x.out.d[ax] + x.extra[ax]) * in_stride;
      rest /= x.out.d[ax];
      in_stride *= x.a.dims.d[ax];
    }
    y[w] = x.a.data[src];
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    std::size_t j = 0, out_stride = 1, rest = w;
    for (std::size_t ax = x.a.dims.rank; ax-- > 0;) {
      const std::size_t at = rest % x.a.dims.d[ax];
      rest /= x.a.dims.d[ax];
      if (at < x.extra[ax] || at >= x.extra[ax] + x.out.d[ax]) {
        dx[w] = T(0);
        return;
      }
      j += (at - x.extra[ax]) * out_stride;
      out_stride *= x.out.d[ax];
    }
    dx[w] = g[j];
  }

  // The host loops: the same copies by an odometer, without divisions.
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    slice_loop(x.a.dims, x.out, x.extra, [&](std::size_t j, std::size_t i) { y[j] = x.a.data[i]; });
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T*, const T* g, T* dx) {
    const std::size_t n = x.a.dims.size();
    for (std::size_t i = 0; i < n; ++i) dx[i] = T(0);
    slice_loop(x.a.dims, x.out, x.extra, [&](std::size_t j, std::size_t i) { dx[i] = g[j]; });
  }
};

// Joins a and b along `axis`: per outer index, a's block then b's block.
struct Concat {
  static constexpr std::string_view name = "concat";
  static constexpr std::string_view torch = "torch.cat([a, b], axis)";
  static constexpr int arity = 2;
  static std::string output_dims(const Dims& a, const Dims& b, OpAttrs& at, Dims& out) {
    const std::string why =
        resolve_axis(a, at.axis, [&] { return "shapes " + shape_string(a) + " and " + shape_string(b); });
    if (!why.empty()) return why;
    const auto ax = static_cast<std::size_t>(at.axis);
    bool fits = a.rank == b.rank;
    for (std::size_t i = 0; fits && i < a.rank; ++i) fits = i == ax || a[i] == b[i];
    if (!fits)
      return "shapes " + shape_string(a) + " and " + shape_string(b) + " must match on every axis but axis " +
             std::to_string(ax);
    out = a;
    out.d[ax] += b[ax];
    return {};
  }

  struct Blocks {
    std::size_t outer, a, b;
  };
  GRAD_HD static Blocks blocks(const Dims& a, const Dims& b, std::size_t axis) {
    Blocks k{1, 1, 1};
    for (std::size_t i = 0; i < axis; ++i) k.outer *= a.d[i];
    for (std::size_t i = axis; i < a.rank; ++i) {
      k.a *= a.d[i];
      k.b *= b.d[i];
    }
    return k;
  }

  // The per-item bodies.
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    const Blocks k = blocks(x.a.dims, x.b.dims, x.axis);
    const std::size_t o = w / (k.a + k.b), r = w % (k.a + k.b);
    y[w] = r < k.a ? x.a.data[o * k.a + r] : x.b.data[o * k.b + (r - k.a)];
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    const Blocks k = blocks(x.a.dims, x.b.dims, x.axis);
    const std::size_t width = In == 0 ? k.a : k.b, offset = In == 0 ? 0 : k.a;
    dx[w] = g[w / width * (k.a + k.b) + offset + w % width];
  }

  // The host loops: the same copies, block by block.
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    const Blocks k = blocks(x.a.dims, x.b.dims, x.axis);
    for (std::size_t o = 0; o < k.outer; ++o) {
      T* row = y + o * (k.a + k.b);
      for (std::size_t i = 0; i < k.a; ++i) row[i] = x.a.data[o * k.a + i];
      for (std::size_t i = 0; i < k.b; ++i) row[k.a + i] = x.b.data[o * k.b + i];
    }
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T*, const T* g, T* dx) {
    const Blocks k = blocks(x.a.dims, x.b.dims, x.axis);
    const std::size_t width = In == 0 ? k.a : k.b, offset = In == 0 ? 0 : k.a;
    for (std::size_t o = 0; o < k.outer; ++o)
      for (std::size_t i = 0; i < width; ++i) dx[o * width + i] = g[o * (k.a + k.b) + offset + i];
  }
};

}  // namespace grad
