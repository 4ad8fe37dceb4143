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

#include <algorithm>
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
  // each column's sum still from zero in ascending row, r once per row. The
  // elementwise work runs on the best instruction set's packs (at -O2 too,
  // where the compiler vectorises no loop of unknown length); dr's terms
  // are computed on packs a chunk at a time and summed serially: every
  // element sees the bodies' operations in their order.
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    const std::size_t cols = x.a.dims.back();
    parallel_ranges(forward_items(x), row_grain(cols), [&](std::size_t lo, std::size_t hi) {
      with_best_isa([&](auto width) {
        using P = pack_for<T, decltype(width)>;
        using namespace kernels_detail;
        for (std::size_t i = lo; i < hi; ++i) {
          const T r = row_rms(x, i);
          const T* in = x.a.data + i * cols;
          T* out = y + i * cols;
          for_packs<P, T>(cols, [&](std::size_t j, auto v) {
            using V = decltype(v);
            store_as((load_as<V>(in + j) / V(r)) * load_as<V>(x.b.data + j), out + j);
          });
        }
      });
    });
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T*, const T* g, T* dx) {
    const std::size_t cols = x.a.dims.back(), rows = x.a.dims.size() / cols;
    const T* w = x.b.data;
    if constexpr (In == 0) {
      parallel_ranges(rows, row_grain(cols), [&](std::size_t lo, std::size_t hi) {
        with_best_isa([&](auto width) {
          using P = pack_for<T, decltype(width)>;
          using namespace kernels_detail;
          constexpr std::size_t chunk = 64;
          T terms[chunk];
          for (std::size_t i = lo; i < hi; ++i) {
            const T r = row_rms(x, i);
            const T* in = x.a.data + i * cols;
            const T* gi = g + i * cols;
            T dr = T(0);
            for (std::size_t c0 = 0; c0 < cols; c0 += chunk) {
              const std::size_t n = std::min(chunk, cols - c0);
              for_packs<P, T>(n, [&](std::size_t j, auto v) {
                using V = decltype(v);
                const V dq = load_as<V>(gi + c0 + j) * load_as<V>(w + c0 + j);
                store_as(-(dq * ((load_as<V>(in + c0 + j) / V(r)) / V(r))), terms + j);
              });
              for (std::size_t j = 0; j < n; ++j) dr = dr + terms[j];
            }
            const T ds = dr / (r + r) / static_cast<T>(cols);
            T* out = dx + i * cols;
            for_packs<P, T>(cols, [&](std::size_t j, auto v) {
              using V = decltype(v);
              const V dq = load_as<V>(gi + j) * load_as<V>(w + j), xj = load_as<V>(in + j);
              store_as((dq / V(r) + V(ds) * xj) + V(ds) * xj, out + j);
            });
          }
        });
      });
    } else {
      for (std::size_t j = 0; j < cols; ++j) dx[j] = T(0);
      with_best_isa([&](auto width) {
        using P = pack_for<T, decltype(width)>;
        using namespace kernels_detail;
        for (std::size_t i = 0; i < rows; ++i) {
          const T r = row_rms(x, i);
          const T* in = x.a.data + i * cols;
          const T* gi = g + i * cols;
          for_packs<P, T>(cols, [&](std::size_t j, auto v) {
            using V = decltype(v);
            store_as(load_as<V>(dx + j) + load_as<V>(gi + j) * (load_as<V>(in + j) / V(r)), dx + j);
          });
        }
      });
    }
  }
};

}  // namespace grad
