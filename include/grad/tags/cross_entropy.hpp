// cross_entropy(logits, ids, ignore): the mean over rows of
// -log softmax(logits row)[id], one node. Operand a: logits [rows, V];
// operand b: class ids, a constant of exact integers held in T, shape [rows]
// or [rows, 1]; the node's scalar is the `ignore` id: a row whose id equals
// it (padding) adds nothing and is not counted. The output is [1].
//
// Per row, with the row's maximum m and s = sum over j ascending of
// exp(x_j - m):  loss = log(s) - (x_id - m)  (stable: nothing overflows).
// Forward is one item: the rows' losses summed from zero in ascending row,
// divided by the number of counted rows (all rows ignored: 0, and zero
// gradients, where PyTorch would give NaN).
// Backward (to the logits) is one item per row:
//   dx_j = (exp(x_j - m) / s - [j == id]) * (g / count),
// computed afresh from the logits (the node keeps no softmax). The ids get
// no gradient. exp and log are exact_math's: no libm.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include "grad/numerics/exact_math.hpp"
#include "grad/numerics/parallel.hpp"
#include "grad/tags/embedding.hpp"
#include "grad/tags/family.hpp"

namespace grad {

struct CrossEntropy {
  static constexpr std::string_view name = "cross_entropy";
  static constexpr std::string_view torch =
      "torch.nn.functional.cross_entropy(a, b.reshape(-1).long(), ignore_index=int(s)).reshape(1)";
  static constexpr int arity = 2;

  // The shape rule (family.hpp): a single element.
  static std::string output_dims(const Dims& logits, const Dims& ids, OpAttrs&, Dims& out) {
    if (logits.rank != 2 || logits[1] == 0) return "logits " + shape_string(logits) + ": expected [rows, classes]";
    const bool fits = (ids.rank == 1 && ids[0] == logits[0]) || (ids.rank == 2 && ids[0] == logits[0] && ids[1] == 1);
    if (!fits)
      return "logits " + shape_string(logits) + " and ids " + shape_string(ids) + ": expected ids [" +
             std::to_string(logits[0]) + "] (one class id per row)";
    out = Dims::of(std::array<std::size_t, 1>{1});
    return "";
  }

  // The value rule, checked when recorded (record.hpp): every id an integer
  // in [0, classes) or the ignore id; "" or the first offender, by row.
  template <class T>
  static std::string check_ids(const T* ids, std::size_t rows, std::size_t classes, T ignore) {
    if (!(ignore == ignore) || static_cast<T>(static_cast<long long>(ignore)) != ignore)
      return "ignore id " + Embedding::number(ignore) + " is not an integer";
    for (std::size_t r = 0; r < rows; ++r) {
      if (ids[r] == ignore) continue;
      if (Embedding::row_of(ids[r], classes) == classes)
        return "id " + Embedding::number(ids[r]) + " at row " + std::to_string(r) +
               " is out of range: expected an integer in [0, " + std::to_string(classes) + ") or the ignore id " +
               Embedding::number(ignore);
    }
    return "";
  }

  // How many rows count (their id is not the ignore id).
  template <class T>
  GRAD_HD static std::size_t counted(const NodeArgs<T>& x) {
    std::size_t n = 0;
    for (std::size_t r = 0, rows = x.a.dims.d[0]; r < rows; ++r) n += x.b.data[r] != x.scalar;
    return n;
  }

  // One row: its maximum and the sum of exp(x_j - max), ascending j.
  template <class T>
  struct RowStats {
    T hi, total;
  };
  template <class T>
  GRAD_HD static RowStats<T> row_stats(const T* xr, std::size_t n) {
    const T hi = running_max(xr, n);
    T total = T(0);
    for (std::size_t j = 0; j < n; ++j) total = total + exact_exp(xr[j] - hi);
    return {hi, total};
  }

  // -log softmax(row)[id]; NaN for an id out of range (set on a device after capture).
  template <class T>
  GRAD_HD static T row_loss(const T* xr, std::size_t n, T id) {
    const std::size_t t = Embedding::row_of(id, n);
    const RowStats<T> s = row_stats(xr, n);
    if (t == n) return Embedding::quiet_nan<T>();
    return exact_log(s.total) - (xr[t] - s.hi);
  }

  // ---- per-item bodies ----
  template <class T>
  GRAD_HD static std::size_t forward_items(const NodeArgs<T>&) {
    return 1;
  }
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t) {
    const std::size_t rows = x.a.dims.d[0], n = x.a.dims.d[1];
    T total = T(0);
    std::size_t count = 0;
    for (std::size_t r = 0; r < rows; ++r) {
      if (x.b.data[r] == x.scalar) continue;
      total = total + row_loss(x.a.data + r * n, n, x.b.data[r]);
      ++count;
    }
    y[0] = count == 0 ? T(0) : total / static_cast<T>(count);
  }

  template <int In, class T>
  GRAD_HD static std::size_t backward_items(const NodeArgs<T>& x) {
    return In == 0 ? x.a.dims.d[0] : x.b.dims.size();
  }
  // Row w of the logits' gradient when w's id is the ignored one: zeros
  // (the row adds nothing); false for a counted row, left to the caller.
  template <class T>
  GRAD_HD static bool zero_if_ignored(const NodeArgs<T>& x, T* dx, std::size_t w) {
    if (x.b.data[w] != x.scalar) return false;
    const std::size_t n = x.a.dims.d[1];
    for (std::size_t j = 0; j < n; ++j) dx[w * n + j] = T(0);
    return true;
  }
  // Row w of the logits' gradient, given the number of counted rows.
  template <class T>
  GRAD_HD static void backward_row(const NodeArgs<T>& x, const T* g, T* dx, std::size_t w, std::size_t count) {
    if (zero_if_ignored(x, dx, w)) return;
    const std::size_t n = x.a.dims.d[1];
    const T* xr = x.a.data + w * n;
    T* d = dx + w * n;
    const T scale = g[0] / static_cast<T>(count);
    const std::size_t t = Embedding::row_of(x.b.data[w], n);
    const RowStats<T> s = row_stats(xr, n);
    for (std::size_t j = 0; j < n; ++j) {
      const T p = exact_exp(xr[j] - s.hi) / s.total;
      d[j] = (j == t ? p - T(1) : p) * scale;
    }
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    if constexpr (In == 0)
      backward_row(x, g, dx, w, counted(x));
    else
      dx[w] = T(0);
  }

  // ---- host loops: the bodies' operations per element, in the best
  // instruction set's copy: a row's exps on packs (into a block on the stack
  // forward, into the gradient row backward), its max and sums serial and
  // ascending as row_stats has them, so the bits are the bodies'. Backward
  // counts once and splits rows over the pool. ----
  // -log softmax(row)[t] (t == n: NaN, an id out of range) with the exps on
  // packs of P (into a block on the stack), the max and the sum serial and
  // ascending: row_loss's bits. LinearCrossEntropy calls it on its chunks.
  template <class P, class T>
  GRAD_INLINE static T row_loss_packs(const T* xr, std::size_t n, std::size_t t) {
    const T hi = running_max(xr, n);
    T sum = T(0);
    constexpr std::size_t block = 256;
    alignas(64) T e[block];
    for (std::size_t j0 = 0; j0 < n; j0 += block) {
      const std::size_t len = n - j0 < block ? n - j0 : block;
      kernels_detail::for_packs<P, T>(len, [&](std::size_t i, auto v) {
        using V = decltype(v);
        kernels_detail::store_as(exact_exp(kernels_detail::load_as<V>(xr + j0 + i) - V(hi)), e + i);
      });
      for (std::size_t i = 0; i < len; ++i) sum = sum + e[i];
    }
    return t == n ? Embedding::quiet_nan<T>() : exact_log(sum) - (xr[t] - hi);
  }
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    with_best_isa([&](auto width) {
      using P = pack_for<T, decltype(width)>;
      const std::size_t rows = x.a.dims.d[0], n = x.a.dims.d[1];
      T total = T(0);
      std::size_t count = 0;
      for (std::size_t r = 0; r < rows; ++r) {
        if (x.b.data[r] == x.scalar) continue;
        total = total + row_loss_packs<P>(x.a.data + r * n, n, Embedding::row_of(x.b.data[r], n));
        ++count;
      }
      y[0] = count == 0 ? T(0) : total / static_cast<T>(count);
    });
  }
  // A counted row's gradient d = (softmax(row) - onehot(t)) * scale,
  // backward_row's operations with the exps on packs of P. d may be xr
  // itself (each element is read before it is overwritten): LinearCrossEntropy
  // turns its chunk of logits into their gradient in place. Returns the
  // row's loss, row_loss_packs' bits (the same max, exps and ascending sum),
  // so that a caller needing both passes over the row once.
  template <class P, class T>
  GRAD_INLINE static T counted_row_packs(const T* xr, T* d, std::size_t n, std::size_t t, T scale) {
    using namespace kernels_detail;
    const T hi = running_max(xr, n);
    const T logit = t < n ? xr[t] : T(0);
    for_packs<P, T>(n, [&](std::size_t i, auto v) {
      using V = decltype(v);
      store_as(exact_exp(load_as<V>(xr + i) - V(hi)), d + i);
    });
    T total = T(0);
    for (std::size_t j = 0; j < n; ++j) total = total + d[j];
    const T target = t < n ? d[t] : T(0);
    for_packs<P, T>(n, [&](std::size_t i, auto v) {
      using V = decltype(v);
      store_as((load_as<V>(d + i) / V(total)) * V(scale), d + i);
    });
    if (t < n) d[t] = (target / total - T(1)) * scale;
    return t < n ? exact_log(total) - (logit - hi) : Embedding::quiet_nan<T>();
  }
  // backward_row's operations, the exps on packs of P.
  template <class P, class T>
  GRAD_INLINE static void backward_row_packs(const NodeArgs<T>& x, const T* g, T* dx, std::size_t w,
                                             std::size_t count) {
    if (zero_if_ignored(x, dx, w)) return;
    const std::size_t n = x.a.dims.d[1];
    counted_row_packs<P>(x.a.data + w * n, dx + w * n, n, Embedding::row_of(x.b.data[w], n),
                         g[0] / static_cast<T>(count));
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T*, const T* g, T* dx) {
    if constexpr (In == 0) {
      const std::size_t count = counted(x), n = x.a.dims[1];
      parallel_ranges(x.a.dims[0], row_grain(n), [&](std::size_t lo, std::size_t hi) {
        with_best_isa([&](auto width) {
          for (std::size_t r = lo; r < hi; ++r) backward_row_packs<pack_for<T, decltype(width)>>(x, g, dx, r, count);
        });
      });
    } else {
      for (std::size_t i = 0, n = x.b.dims.size(); i < n; ++i) dx[i] = T(0);
    }
  }
};

}  // namespace grad
