// What every op tag sees of its node, and the loop shapes that families of
// tags share. A tag's element functors are GRAD_HD so that device kernels
// call exactly the code the tape calls; the *_tensor loops are the host
// kernels, written so that every output element is accumulated in the one
// order ARCHITECTURE.md documents.
#pragma once

#include <algorithm>
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

// One run of the last axis, columns [c0, c1) ascending. The steps are
// template arguments for the common cases (a bias row, a per-row scalar) so
// that the loop vectorises across c; the visiting order is the same either way.
template <std::size_t StepA, std::size_t StepB, class F>
inline void broadcast_row(std::size_t c0, std::size_t c1, std::size_t j, std::size_t ia, std::size_t ib, F& f) {
  for (std::size_t c = c0; c < c1; ++c) f(j + c, ia + c * StepA, ib + c * StepB);
}

// Elementwise loops at least twice this long are split over the pool (when
// set_num_threads > 1); each element is still computed by one thread.
inline constexpr std::size_t elementwise_grain = std::size_t{1} << 15;

// How many runs of `length` elements make up one elementwise grain.
inline std::size_t row_grain(std::size_t length) {
  return std::max<std::size_t>(1, elementwise_grain / std::max<std::size_t>(1, length));
}

// Rows (runs of the last axis) of an output shape; a scalar is one row of one.
inline std::size_t row_count(const Dims& out) { return out.rank == 0 ? 1 : out.size() / out.back(); }
inline std::size_t row_length(const Dims& out) { return out.rank == 0 ? 1 : out.back(); }

// Visits the flat output indices j of `out` in rows [r0, r1), columns
// [c0, c1) of each, with the flat indices of the two broadcast inputs
// (strides from broadcast_strides): rows ascending, columns ascending within
// a row. Disjoint row or column ranges can run on different threads.
template <class F>
inline void broadcast_loop(const Dims& out, const Dims& sa, const Dims& sb, F&& f, std::size_t r0, std::size_t r1,
                           std::size_t c0, std::size_t c1) {
  if (out.rank == 0) {
    if (r0 < r1 && c0 < c1) f(std::size_t{0}, std::size_t{0}, std::size_t{0});
    return;
  }
  const std::size_t inner = out.back(), ia_step = sa.back(), ib_step = sb.back();
  if (inner == 0 || r0 >= r1) return;
  // The multi-index of row r0 over the leading axes, and where it starts in a and b.
  std::array<std::size_t, max_rank> idx{};
  std::size_t ia = 0, ib = 0;
  for (std::size_t ax = out.rank - 1, rest = r0; ax-- > 0;) {
    idx[ax] = rest % out.d[ax];
    rest /= out.d[ax];
    ia += idx[ax] * sa.d[ax];
    ib += idx[ax] * sb.d[ax];
  }
  for (std::size_t r = r0; r < r1; ++r) {
    const std::size_t j = r * inner;
    if (ia_step == 1 && ib_step == 1)
      broadcast_row<1, 1>(c0, c1, j, ia, ib, f);
    else if (ia_step == 1 && ib_step == 0)
      broadcast_row<1, 0>(c0, c1, j, ia, ib, f);
    else if (ia_step == 0 && ib_step == 1)
      broadcast_row<0, 1>(c0, c1, j, ia, ib, f);
    else
      for (std::size_t c = c0; c < c1; ++c) f(j + c, ia + c * ia_step, ib + c * ib_step);
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

// Every element of `out`, each written by one call f(j, ia, ib): rows are
// split over the pool, each range compiled for the best instruction set.
template <class F>
inline void broadcast_loop_by_rows(const Dims& out, const Dims& sa, const Dims& sb, F&& f) {
  const std::size_t inner = row_length(out);
  parallel_ranges(row_count(out), row_grain(inner), [&](std::size_t r0, std::size_t r1) {
    with_best_isa([&] { broadcast_loop(out, sa, sb, f, r0, r1, 0, inner); });
  });
}

// y = f(x, scalar) elementwise; the tag supplies forward(x, s) and
// backward(x, y, g, s) = dL/dx for one element.
template <class Derived>
struct Unary {
  static constexpr int arity = 1;
  static constexpr bool row_local = true;

  // Every loop below runs compiled for the best instruction set
  // (with_best_isa): the exact_math functors (tanh, exp, ...) are branchless,
  // so they vectorise 8 or 16 wide under AVX-512 instead of 2 wide at the
  // x86-64 baseline. Same operations in the same order: same bits.
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    const T* a = x.a.data;
    parallel_ranges(x.out.size(), elementwise_grain, [&](std::size_t lo, std::size_t hi) {
      with_best_isa([&] { map_forward(a + lo, y + lo, hi - lo, x.scalar); });
    });
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T* y, const T* g, T* dx) {
    const T* a = x.a.data;
    parallel_ranges(x.out.size(), elementwise_grain, [&](std::size_t lo, std::size_t hi) {
      with_best_isa([&] { map_backward(a + lo, y + lo, g + lo, dx + lo, hi - lo, x.scalar); });
    });
  }

 private:
  // A node's output and gradient buffers never overlap its inputs. A tag may
  // bring a host loop of its own for a whole run (forward_array), which must
  // give every element the bits forward() gives it.
  template <class T>
  static void map_forward(const T* __restrict a, T* __restrict y, std::size_t n, T s) {
    if constexpr (requires { Derived::forward_array(a, y, n, s); })
      Derived::forward_array(a, y, n, s);
    else
      for (std::size_t i = 0; i < n; ++i) y[i] = Derived::forward(a[i], s);
  }
  template <class T>
  static void map_backward(const T* __restrict a, const T* __restrict y, const T* __restrict g, T* __restrict dx,
                           std::size_t n, T s) {
    for (std::size_t i = 0; i < n; ++i) dx[i] = Derived::backward(a[i], y[i], g[i], s);
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
        with_best_isa([&] { map_forward(a + lo, b + lo, y + lo, hi - lo); });
      });
      return;
    }
    broadcast_loop_by_rows(
        x.out, broadcast_strides(x.a.dims, x.out), broadcast_strides(x.b.dims, x.out),
        [&](std::size_t j, std::size_t ia, std::size_t ib) { y[j] = Derived::forward(a[ia], b[ib]); });
  }

  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T* y, const T* g, T* dx) {
    const T* a = x.a.data;
    const T* b = x.b.data;
    const Dims& mine = In == 0 ? x.a.dims : x.b.dims;
    auto contribution = [&](std::size_t j, std::size_t ia, std::size_t ib) {
      return gradient<In>(a[ia], b[ib], y[j], g[j]);
    };
    if (x.a.dims == x.out && x.b.dims == x.out) {
      parallel_ranges(x.out.size(), elementwise_grain, [&](std::size_t lo, std::size_t hi) {
        with_best_isa([&] { map_backward<In>(a + lo, b + lo, y + lo, g + lo, dx + lo, hi - lo); });
      });
      return;
    }
    const Dims sa = broadcast_strides(x.a.dims, x.out), sb = broadcast_strides(x.b.dims, x.out);
    if (mine == x.out) {
      broadcast_loop_by_rows(x.out, sa, sb,
                             [&](std::size_t j, std::size_t ia, std::size_t ib) { dx[j] = contribution(j, ia, ib); });
      return;
    }
    // A broadcast input: each of its elements sums its contributions over the
    // rows, ascending. When it is not broadcast along the last axis, distinct
    // columns feed distinct elements, so column ranges may run on different
    // threads; otherwise one thread walks everything.
    const bool split_columns = (In == 0 ? sa : sb).back() == 1;
    const std::size_t rows = row_count(x.out), inner = row_length(x.out);
    const std::size_t m = mine.size();
    for (std::size_t i = 0; i < m; ++i) dx[i] = T(0);
    auto reduce = [&](std::size_t c0, std::size_t c1) {
      with_best_isa([&] {
        broadcast_loop(
            x.out, sa, sb,
            [&](std::size_t j, std::size_t ia, std::size_t ib) {
              T& d = dx[In == 0 ? ia : ib];
              d = d + contribution(j, ia, ib);
            },
            0, rows, c0, c1);
      });
    };
    if (split_columns)
      parallel_ranges(inner, row_grain(rows), reduce);
    else
      reduce(0, inner);
  }

 private:
  // Same-shape operands; outputs and gradients never overlap the inputs.
  template <class T>
  static void map_forward(const T* __restrict a, const T* __restrict b, T* __restrict y, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) y[i] = Derived::forward(a[i], b[i]);
  }
  template <int In, class T>
  static void map_backward(const T* __restrict a, const T* __restrict b, const T* __restrict y, const T* __restrict g,
                           T* __restrict dx, std::size_t n) {
    for (std::size_t i = 0; i < n; ++i) dx[i] = gradient<In>(a[i], b[i], y[i], g[i]);
  }
  // The tag's gradient for operand In from one output element.
  template <int In, class T>
  static T gradient(T a, T b, T y, T g) {
    if constexpr (In == 0)
      return Derived::backward_a(a, b, y, g);
    else
      return Derived::backward_b(a, b, y, g);
  }
};

}  // namespace grad
