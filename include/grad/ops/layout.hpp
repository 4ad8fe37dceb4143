// Data movement: reshape, slice, concat. Exact tier; gradients are copies.
#pragma once

#include <array>
#include <string_view>

#include "grad/ops/family.hpp"

namespace grad {

struct Reshape {
  static constexpr std::string_view name = "reshape";
  static constexpr Tier tier = Tier::exact;
  static constexpr int arity = 1;
  static constexpr bool row_local = false;
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    const std::size_t n = x.out.size();
    for (std::size_t i = 0; i < n; ++i) y[i] = x.a.data[i];
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T*, const T* g, T* dx) {
    const std::size_t n = x.out.size();
    for (std::size_t i = 0; i < n; ++i) dx[i] = g[i];
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
  static constexpr Tier tier = Tier::exact;
  static constexpr int arity = 1;
  static constexpr bool row_local = false;
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
  static constexpr Tier tier = Tier::exact;
  static constexpr int arity = 2;
  static constexpr bool row_local = false;

  struct Blocks {
    std::size_t outer, a, b;
  };
  static Blocks blocks(const Dims& a, const Dims& b, std::size_t axis) {
    Blocks k{1, 1, 1};
    for (std::size_t i = 0; i < axis; ++i) k.outer *= a.d[i];
    for (std::size_t i = axis; i < a.rank; ++i) {
      k.a *= a.d[i];
      k.b *= b.d[i];
    }
    return k;
  }
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
