// Layer norm's normalisation as one node: y = (x - mean) / sqrt(var + eps)
// over the last axis (biased variance, as torch.nn.LayerNorm), eps the
// node's scalar; nn::layernorm multiplies by the weight and adds the bias as
// ordinary ops. It replaces nine nodes (row_sum, / cols, x - mean, c * c,
// row_sum, / cols, + eps, sqrt, c / r) and keeps their bits: every body
// below performs the composite's roundings in the composite's order,
// recomputing a row's mean and r where it needs them.
//
// Forward, row i: mean = sum_fixed(x) / cols, c[j] = x[j] - mean,
// r = sqrt(sum_fixed(c * c) / cols + eps), y[j] = c[j] / r.
//
// Backward, as the composite's reverse walk computes it (y = c / r the
// node's value):
//   dr    = sum_j -(g[j] * (y[j] / r)) from zero, ascending   (div's dB)
//   ds    = dr / (r + r) / cols                              (sqrt, + eps, / cols)
//   dc[j] = (g[j] / r + ds * c[j]) + ds * c[j]               (div's dA, then c * c's two operands)
//   dm    = sum_j -dc[j] from zero, ascending, / cols        (sub's dB, / cols)
//   dx[j] = dc[j] + dm                                       (sub's dA stored, then row_sum's added)
// So the node gives the composite's gradient bits whenever x has no other
// consumer; where it has, x's two contributions are added once as their sum
// (another association of the same terms, as rms_norm.hpp explains).
#pragma once

#include <string>
#include <string_view>

#include "grad/numerics/fixed_order.hpp"
#include "grad/numerics/parallel.hpp"
#include "grad/tags/family.hpp"
#include "grad/tags/unary.hpp"  // sqrt_of

namespace grad {

struct LayerNorm {
  static constexpr std::string_view name = "layer_norm";
  static constexpr std::string_view torch = "torch.nn.functional.layer_norm(a, a.shape[-1:], eps=s)";
  static constexpr int arity = 1;
  static std::string output_dims(const Dims& a, const Dims&, OpAttrs&, Dims& out) {
    if (a.rank < 1 || a.back() == 0)
      return "expected x [..., cols] with cols >= 1, got " + shape_string(a);
    out = a;
    return {};
  }

  // Row i's mean and r = sqrt(var + eps); c = x - mean into `centered`.
  template <class T>
  GRAD_HD static T row_center(const NodeArgs<T>& x, std::size_t i, T* centered) {
    const std::size_t cols = x.a.dims.back();
    const T* in = x.a.data + i * cols;
    const T mean = sum_fixed(in, cols) / static_cast<T>(cols);
    for (std::size_t j = 0; j < cols; ++j) centered[j] = in[j] - mean;
    const T variance = sum_fixed(centered, cols, fixed_order::SquareThenAdd{}) / static_cast<T>(cols);
    return sqrt_of(variance + x.scalar);
  }

  // Item w is row w, both ways. The centred row is kept in the output (forward)
  // or the gradient (backward) row until it is overwritten.
  template <class T>
  GRAD_HD static std::size_t forward_items(const NodeArgs<T>& x) {
    return x.a.dims.size() / x.a.dims.back();
  }
  template <int In, class T>
  GRAD_HD static std::size_t backward_items(const NodeArgs<T>& x) {
    return x.a.dims.size() / x.a.dims.back();
  }
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t i) {
    const std::size_t cols = x.a.dims.back();
    T* out = y + i * cols;
    const T r = row_center(x, i, out);
    for (std::size_t j = 0; j < cols; ++j) out[j] = out[j] / r;
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T* y, const T* g, T* dx, std::size_t i) {
    const std::size_t cols = x.a.dims.back();
    T* c = dx + i * cols;
    const T r = row_center(x, i, c);
    const T* yi = y + i * cols;
    const T* gi = g + i * cols;
    T dr = T(0);
    for (std::size_t j = 0; j < cols; ++j) dr = dr + -(gi[j] * (yi[j] / r));
    const T ds = dr / (r + r) / static_cast<T>(cols);
    T dm = T(0);
    for (std::size_t j = 0; j < cols; ++j) {
      c[j] = (gi[j] / r + ds * c[j]) + ds * c[j];  // dc[j]
      dm = dm + -c[j];
    }
    dm = dm / static_cast<T>(cols);
    for (std::size_t j = 0; j < cols; ++j) c[j] = c[j] + dm;
  }

  // The host loops: the rows over the pool.
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    parallel_ranges(forward_items(x), row_grain(x.a.dims.back()), [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) forward_item(x, y, i);
    });
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T* y, const T* g, T* dx) {
    parallel_ranges(forward_items(x), row_grain(x.a.dims.back()), [&](std::size_t lo, std::size_t hi) {
      for (std::size_t i = lo; i < hi; ++i) backward_item<In>(x, y, g, dx, i);
    });
  }
};

}  // namespace grad
