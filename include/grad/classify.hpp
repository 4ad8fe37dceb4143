// Classification with integer class ids: cross_entropy(logits, labels),
// argmax(values, axis), accuracy and a confusion matrix.
//
// cross_entropy records ordinary ops (no fused node yet):
//   s      = logits - m          m: each row's max, a constant (it cancels in the
//                                gradient and keeps exp from overflowing)
//   lse    = log(row_sum(exp(s)))                 [rows, 1]
//   picked = row_sum(s * onehot(labels))          [rows, 1]
//   loss   = mean(lse - picked)                   the mean over the batch's rows
// as torch.nn.functional.cross_entropy(logits, labels) with reduction
// 'mean'. The two constants come from per-thread scratch tensors that are
// reused while the batch shape repeats, so a training loop that records them
// after a mark makes no heap allocation after its first pass.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "grad/record.hpp"

namespace grad {

namespace classify_detail {
// A scratch tensor of `shape`, kept per thread (one per distinct shape: the
// full batch and a short last one), so that building a constant each step
// allocates only the first time a shape appears.
template <class T>
Tensor<T>& scratch(std::size_t rows, std::size_t cols, int slot) {
  thread_local std::vector<Tensor<T>> kept[2];
  for (Tensor<T>& t : kept[slot])
    if (t.shape()[0] == rows && t.shape()[1] == cols) return t;
  if (kept[slot].size() >= 4) kept[slot].erase(kept[slot].begin());  // shapes keep changing: stay bounded
  return kept[slot].emplace_back(Shape{rows, cols});
}
}  // namespace classify_detail

// Mean cross-entropy of logits [rows, classes] against labels (rows class
// ids in [0, classes)). A wrong label count or an id out of range poisons the
// tape, naming the row and the id.
template <class T, class Label>
Var<T> cross_entropy(Var<T> logits, std::span<const Label> labels) {
  static_assert(std::is_integral_v<Label>, "cross_entropy: labels are integer class ids");
  Tape<T>& tp = detail::tape_of("cross_entropy", logits);
  if (!tp.accept("cross_entropy", {logits})) return tp.rejected();
  const Dims& d = tp.dims(logits);
  if (d.rank != 2) return tp.invalid("cross_entropy: logits " + shape_string(d) + ": expected [rows, classes]");
  const std::size_t rows = d[0], classes = d[1];
  if (labels.size() != rows)
    return tp.invalid("cross_entropy: logits " + shape_string(d) + " have " + std::to_string(rows) + " rows but " +
                      std::to_string(labels.size()) + " labels were given");
  for (std::size_t r = 0; r < rows; ++r)
    if (labels[r] < 0 || static_cast<std::uint64_t>(labels[r]) >= classes)
      return tp.invalid("cross_entropy: label " + std::to_string(labels[r]) + " in row " + std::to_string(r) +
                        " is out of range: expected a class id in [0, " + std::to_string(classes) + ")");
  Tensor<T>& onehot = classify_detail::scratch<T>(rows, classes, 0);
  Tensor<T>& shift = classify_detail::scratch<T>(rows, 1, 1);
  const View<T> x = tp.value(logits);
  for (std::size_t r = 0; r < rows; ++r) {
    T m = x[r * classes];
    for (std::size_t c = 1; c < classes; ++c) m = x[r * classes + c] > m ? x[r * classes + c] : m;
    shift.data()[r] = m;
    for (std::size_t c = 0; c < classes; ++c)
      onehot.data()[r * classes + c] = static_cast<std::uint64_t>(labels[r]) == c ? T(1) : T(0);
  }
  const Var<T> s = logits - tp.constant(shift);
  const Var<T> lse = grad::log(row_sum(grad::exp(s)));
  const Var<T> picked = row_sum(s * tp.constant(onehot));
  return mean(lse - picked);
}
template <class T, class Label>
Var<T> cross_entropy(Var<T> logits, const std::vector<Label>& labels) {
  return cross_entropy(logits, std::span<const Label>(labels));
}

// Index of the largest value along `axis` of a [rows, cols] tensor (axis 1 or
// -1: per row; axis 0: per column); the first one wins a tie, NaN is never
// the largest (as numpy's argmax ignoring NaN). Throws std::invalid_argument
// for another rank or axis.
template <class T>
std::vector<std::int32_t> argmax(std::span<const std::size_t> shape, std::span<const T> values, int axis = -1) {
  if (shape.size() != 2 || (axis != 0 && axis != 1 && axis != -1))
    throw std::invalid_argument("argmax: shape " + shape_string(shape) + ", axis " + std::to_string(axis) +
                                ": expected a [rows, cols] tensor and axis 0, 1 or -1");
  const std::size_t rows = shape[0], cols = shape[1];
  const bool per_row = axis != 0;
  const std::size_t outer = per_row ? rows : cols, inner = per_row ? cols : rows;
  std::vector<std::int32_t> out(outer, 0);
  for (std::size_t o = 0; o < outer; ++o) {
    std::size_t best = 0;
    for (std::size_t i = 0; i < inner; ++i) {
      const T v = per_row ? values[o * cols + i] : values[i * cols + o];
      const T b = per_row ? values[o * cols + best] : values[best * cols + o];
      if (v > b || (b != b && v == v)) best = i;
    }
    out[o] = static_cast<std::int32_t>(best);
  }
  return out;
}
template <class T>
std::vector<std::int32_t> argmax(const View<T>& v, int axis = -1) {
  return argmax(v.shape, v.data, axis);
}
template <class T>
std::vector<std::int32_t> argmax(const Tensor<T>& t, int axis = -1) {
  return argmax(std::span<const std::size_t>(t.shape()), t.data(), axis);
}

// Fraction of predictions equal to their label. Throws on a length mismatch
// or empty input.
template <class A, class B>
double accuracy(std::span<const A> predicted, std::span<const B> labels) {
  if (predicted.size() != labels.size() || predicted.empty())
    throw std::invalid_argument("accuracy: " + std::to_string(predicted.size()) + " predictions and " +
                                std::to_string(labels.size()) + " labels: expected the same, non-zero count");
  std::size_t hits = 0;
  for (std::size_t i = 0; i < labels.size(); ++i) hits += predicted[i] == static_cast<A>(labels[i]);
  return static_cast<double>(hits) / static_cast<double>(labels.size());
}
template <class A, class B>
double accuracy(const std::vector<A>& predicted, const std::vector<B>& labels) {
  return accuracy(std::span<const A>(predicted), std::span<const B>(labels));
}

// counts[true][predicted], classes x classes, row-major. Throws for an id
// out of range (naming the row) or a length mismatch.
template <class A, class B>
std::vector<std::size_t> confusion_matrix(const std::vector<A>& predicted, const std::vector<B>& labels,
                                          std::size_t classes) {
  if (predicted.size() != labels.size())
    throw std::invalid_argument("confusion_matrix: " + std::to_string(predicted.size()) + " predictions and " +
                                std::to_string(labels.size()) + " labels");
  std::vector<std::size_t> m(classes * classes, 0);
  for (std::size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] < 0 || predicted[i] < 0 || static_cast<std::size_t>(labels[i]) >= classes ||
        static_cast<std::size_t>(predicted[i]) >= classes)
      throw std::invalid_argument("confusion_matrix: row " + std::to_string(i) + ": label " +
                                  std::to_string(labels[i]) + " or prediction " + std::to_string(predicted[i]) +
                                  " is not a class id in [0, " + std::to_string(classes) + ")");
    ++m[static_cast<std::size_t>(labels[i]) * classes + static_cast<std::size_t>(predicted[i])];
  }
  return m;
}

// The matrix as text: a header of predicted classes, one row per true class.
inline std::string confusion_string(const std::vector<std::size_t>& m, std::size_t classes) {
  std::string s;
  char cell[32];
  s += "true\\predicted";
  for (std::size_t c = 0; c < classes; ++c) {
    std::snprintf(cell, sizeof cell, "%5zu", c);
    s += cell;
  }
  for (std::size_t t = 0; t < classes && t * classes + classes <= m.size(); ++t) {
    std::snprintf(cell, sizeof cell, "\n%15zu", t);
    s += cell;
    for (std::size_t c = 0; c < classes; ++c) {
      std::snprintf(cell, sizeof cell, "%5zu", m[t * classes + c]);
      s += cell;
    }
  }
  return s + "\n";
}

}  // namespace grad
