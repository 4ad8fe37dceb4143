// What every op tag sees of its node, and the loop shapes that families of
// tags share. A tag's element functors are GRAD_HD so that device kernels
// call exactly the code the tape calls; the *_tensor loops are the host
// kernels, written so that every output element is accumulated in the one
// order ARCHITECTURE.md documents.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "grad/config.hpp"
#include "grad/isa.hpp"
#include "grad/parallel.hpp"
#include "grad/tensor.hpp"

namespace grad {

template <class T>
struct Operand {
  const T* data = nullptr;
  Dims dims;
};

// Everything an op's kernels read besides the output and gradient buffers.
template <class T>
struct NodeArgs {
  Operand<T> a, b;
  Dims out;
  T scalar = T(0);
  std::uint32_t axis = 0;              // softmax, concat
  const std::size_t* extra = nullptr;  // slice starts, one per axis
};

// One run of the last axis: c ascending. The steps are template arguments
// for the common cases (a bias row, a per-row scalar) so that the loop
// vectorises across c; the visiting order is the same either way.
template <std::size_t StepA, std::size_t StepB, class F>
inline void broadcast_row(std::size_t inner, std::size_t j, std::size_t ia, std::size_t ib, F& f) {
  for (std::size_t c = 0; c < inner; ++c) f(j + c, ia + c * StepA, ib + c * StepB);
}

// Elementwise loops at least twice this long are split over the pool (when
// set_num_threads > 1); each element is still computed by one thread.
inline constexpr std::size_t elementwise_grain = std::size_t{1} << 15;

// Visits every flat output index j of `out` with the flat indices of the two
// broadcast inputs (strides from broadcast_strides), in ascending j.
template <class F>
inline void broadcast_loop(const Dims& out, const Dims& sa, const Dims& sb, F&& f) {
  if (out.rank == 0) {
    f(std::size_t{0}, std::size_t{0}, std::size_t{0});
    return;
  }
  const std::size_t n = out.size();
  if (n == 0) return;
  const std::size_t inner = out.back(), ia_step = sa.back(), ib_step = sb.back();
  std::array<std::size_t, max_rank> idx{};
  std::size_t ia = 0, ib = 0;
  for (std::size_t j = 0; j < n; j += inner) {
    if (ia_step == 1 && ib_step == 1)
      broadcast_row<1, 1>(inner, j, ia, ib, f);
    else if (ia_step == 1 && ib_step == 0)
      broadcast_row<1, 0>(inner, j, ia, ib, f);
    else if (ia_step == 0 && ib_step == 1)
      broadcast_row<0, 1>(inner, j, ia, ib, f);
    else
      for (std::size_t c = 0; c < inner; ++c) f(j + c, ia + c * ia_step, ib + c * ib_step);
    for (std::size_t ax = out.rank - 1; ax-- > 0;) {
      ++idx[ax];
      ia += sa.d[ax];
      ib += sb.d[ax];
      if (idx[ax] < out.d[ax]) break;
      ia -= sa.d[ax] * out.d[ax];
      ib -= sb.d[ax] * out.d[ax];
      idx[ax] = 0;
    }
  }
}

// y = f(x, scalar) elementwise; the tag supplies forward(x, s) and
// backward(x, y, g, s) = dL/dx for one element.
template <class Derived>
struct Unary {
  static constexpr int arity = 1;
  static constexpr bool row_local = true;

  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    const T* a = x.a.data;
    const Isa isa = best_isa();
    parallel_ranges(x.out.size(), elementwise_grain,
                    [&](std::size_t lo, std::size_t hi) { map_forward(isa, a + lo, y + lo, hi - lo, x.scalar); });
  }

  // The forward loop compiled once per instruction set: the exact_math
  // functors (tanh, exp, ...) are branchless, so they vectorise 8 or 16 wide
  // under AVX-512 instead of 2 wide at the x86-64 baseline. Same bits.
  template <class T>
  static void map_forward(Isa isa, const T* a, T* y, std::size_t n, T s) {
#if GRAD_HAS_ISA_TARGETS
    if (isa == Isa::avx512) return map_forward_avx512(a, y, n, s);
    if (isa == Isa::avx2) return map_forward_avx2(a, y, n, s);
#endif
    (void)isa;
    map_forward_loop(a, y, n, s);
  }
  template <class T>
  static void map_forward_loop(const T* __restrict a, T* __restrict y, std::size_t n, T s) {
    for (std::size_t i = 0; i < n; ++i) y[i] = Derived::forward(a[i], s);
  }
#if GRAD_HAS_ISA_TARGETS
  template <class T>
  GRAD_TARGET_AVX2 static void map_forward_avx2(const T* __restrict a, T* __restrict y, std::size_t n, T s) {
    for (std::size_t i = 0; i < n; ++i) y[i] = Derived::forward(a[i], s);
  }
  template <class T>
  GRAD_TARGET_AVX512 static void map_forward_avx512(const T* __restrict a, T* __restrict y, std::size_t n, T s) {
    for (std::size_t i = 0; i < n; ++i) y[i] = Derived::forward(a[i], s);
  }
#endif
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T* y, const T* g, T* dx) {
    const T* a = x.a.data;
    parallel_ranges(x.out.size(), elementwise_grain, [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) dx[i] = Derived::backward(a[i], y[i], g[i], x.scalar);
    });
  }
};

// y = f(a, b) with numpy broadcasting. Gradient of a broadcast input: each
// of its elements sums its contributions starting from zero in ascending
// flat output index (the documented broadcast-reduce order).
template <class Derived>
struct Binary {
  static constexpr int arity = 2;
  static constexpr bool row_local = true;

  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    const T* a = x.a.data;
    const T* b = x.b.data;
    if (x.a.dims == x.out && x.b.dims == x.out) {
      parallel_ranges(x.out.size(), elementwise_grain, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t i = lo; i < hi; ++i) y[i] = Derived::forward(a[i], b[i]);
      });
      return;
    }
    broadcast_loop(x.out, broadcast_strides(x.a.dims, x.out), broadcast_strides(x.b.dims, x.out),
                   [&](std::size_t j, std::size_t ia, std::size_t ib) { y[j] = Derived::forward(a[ia], b[ib]); });
  }

  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T* y, const T* g, T* dx) {
    const T* a = x.a.data;
    const T* b = x.b.data;
    const Dims& mine = In == 0 ? x.a.dims : x.b.dims;
    auto contribution = [&](std::size_t j, std::size_t ia, std::size_t ib) {
      if constexpr (In == 0)
        return Derived::backward_a(a[ia], b[ib], y[j], g[j]);
      else
        return Derived::backward_b(a[ia], b[ib], y[j], g[j]);
    };
    if (x.a.dims == x.out && x.b.dims == x.out) {
      parallel_ranges(x.out.size(), elementwise_grain, [&](std::size_t lo, std::size_t hi) {
        for (std::size_t i = lo; i < hi; ++i) dx[i] = contribution(i, i, i);
      });
      return;
    }
    const Dims sa = broadcast_strides(x.a.dims, x.out), sb = broadcast_strides(x.b.dims, x.out);
    if (mine == x.out) {
      broadcast_loop(x.out, sa, sb,
                     [&](std::size_t j, std::size_t ia, std::size_t ib) { dx[j] = contribution(j, ia, ib); });
      return;
    }
    const std::size_t m = mine.size();
    for (std::size_t i = 0; i < m; ++i) dx[i] = T(0);
    broadcast_loop(x.out, sa, sb, [&](std::size_t j, std::size_t ia, std::size_t ib) {
      T& d = dx[In == 0 ? ia : ib];
      d = d + contribution(j, ia, ib);
    });
  }
};

}  // namespace grad
