// RMS norm as one node: y = x / sqrt(row_sum(x * x) / cols + eps) * w over
// the last axis, x [..., cols], w [cols], eps the node's scalar. It replaces
// the seven nodes nn::rmsnorm used to record (x*x, row_sum, / cols, + eps,
// sqrt, x / r, * w), each a full pass with its own stored value, and keeps
// their bits: every body below performs the composite's roundings in the
// composite's order, recomputing r = sqrt(...) of a row where it needs it
// instead of storing it.
//
// Forward, row i: s = sum_fixed(x * x) (row_sum's order), r = sqrt(s / cols
// + eps), y[j] = (x[j] / r) * w[j].
//
// Backward, as the composite's reverse walk computes it:
//   dq[j] = g[j] * w[j]                                       (mul's dA)
//   dr    = sum_j -(dq[j] * (q[j] / r)) from zero, ascending  (div's dB, q = x / r)
//   ds    = dr / (r + r) / cols                               (sqrt, + eps, / cols)
//   dx[j] = (dq[j] / r + ds * x[j]) + ds * x[j]
// the last as the tape sums x's three contributions: div's stored first (the
// later consumer), then x * x's operand 1 and operand 2. dw[j] = sum_i
// g[i,j] * q[i,j] from zero in ascending row (a broadcast operand's order).
// So the node gives the composite's gradient bits whenever x has no other
// consumer; where it has (a residual stream), the composite added its three
// contributions one by one to what the later consumers had left, the node
// adds their sum once: another association of the same terms.
#pragma once

#include <string>
#include <string_view>

#include "grad/numerics/fixed_order.hpp"
#include "grad/numerics/parallel.hpp"
#include "grad/tags/family.hpp"
#include "grad/tags/unary.hpp"  // sqrt_of

namespace grad {

struct RmsNorm {
  static constexpr std::string_view name = "rms_norm";
  static constexpr std::string_view torch = "a / torch.sqrt((a * a).sum(-1, keepdim=True) / a.shape[-1] + s) * b";
  static constexpr int arity = 2;
  static std::string output_dims(const Dims& a, const Dims& b, OpAttrs&, Dims& out) {
    if (a.rank < 1 || a.back() == 0 || b.rank != 1 || b[0] != a.back())
      return "expected x [..., cols] with cols >= 1 and weight [cols], got x " + shape_string(a) + " and weight " +
             shape_string(b);
    out = a;
    return {};
  }

  // r of row i: sqrt(row_sum(x * x) / cols + eps), the composite's four roundings.
  template <class T>
  GRAD_HD static T row_rms(const NodeArgs<T>& x, std::size_t i) {
    const std::size_t cols = x.a.dims.back();
    const T mean_square = sum_fixed(x.a.data + i * cols, cols, fixed_order::SquareThenAdd{}) / static_cast<T>(cols);
    return sqrt_of(mean_square + x.scalar);
  }

  // Items: a row forward and for x's gradient; a column of w's gradient.
  template <class T>
  GRAD_HD static std::size_t forward_items(const NodeArgs<T>& x) {
    return x.a.dims.size() / x.a.dims.back();
  }
  template <int In, class T>
  GRAD_HD static std::size_t backward_items(const NodeArgs<T>& x) {
    return In == 0 ? x.a.dims.size() / x.a.dims.back() : x.a.dims.back();
  }
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t i) {
    const std::size_t cols = x.a.dims.back();
    const T r = row_rms(x, i);
    const T* in = x.a.data + i * cols;
    for (std::size_t j = 0; j < cols; ++j) y[i * cols + j] = (in[j] / r) * x.b.data[j];
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    if constexpr (In == 0)
      backward_row(x, g, dx, w);
    else
      backward_column(x, g, dx, w);
  }
  // dx of row i.
  template <class T>
  GRAD_HD static void backward_row(const NodeArgs<T>& x, const T* g, T* dx, std::size_t i) {
    const std::size_t cols = x.a.dims.back();
    const T r = row_rms(x, i);
    const T* in = x.a.data + i * cols;
    const T* gi = g + i * cols;
    T dr = T(0);
    for (std::size_t j = 0; j < cols; ++j) {
      const T dq = gi[j] * x.b.data[j];
      dr = dr + -(dq * ((in[j] / r) / r));
    }
    const T ds = dr / (r + r) / static_cast<T>(cols);
    for (std::size_t j = 0; j < cols; ++j) {
      const T dq = gi[j] * x.b.data[j];
      dx[i * cols + j] = (dq / r + ds * in[j]) + ds * in[j];
    }
  }
  // dw[j] over every row (an item recomputes each row's r: the host loop
  // below computes it once per row instead).
  template <class T>
  GRAD_HD static void backward_column(const NodeArgs<T>& x, const T* g, T* dx, std::size_t j) {
    const std::size_t cols = x.a.dims.back(), rows = x.a.dims.size() / cols;
    T acc = T(0);
    for (std::size_t i = 0; i < rows; ++i) acc = acc + g[i * cols + j] * (x.a.data[i * cols + j] / row_rms(x, i));
    dx[j] = acc;
  }

  // The host loops: rows over the pool forward and for dx; dw row by row,
  // each column's sum still from zero in ascending row, r once per row.
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    parallel_ranges(forward_items(x), row_grain(x.a.dims.back()), [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) forward_item(x, y, i);
    });
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T*, const T* g, T* dx) {
    const std::size_t cols = x.a.dims.back(), rows = x.a.dims.size() / cols;
    if constexpr (In == 0) {
      parallel_ranges(rows, row_grain(cols), [&](std::size_t lo, std::size_t hi) {
        for (std::size_t i = lo; i < hi; ++i) backward_row(x, g, dx, i);
      });
    } else {
      for (std::size_t j = 0; j < cols; ++j) dx[j] = T(0);
      for (std::size_t i = 0; i < rows; ++i) {
        const T r = row_rms(x, i);
        for (std::size_t j = 0; j < cols; ++j) dx[j] = dx[j] + g[i * cols + j] * (x.a.data[i * cols + j] / r);
      }
    }
  }
};

}  // namespace grad
