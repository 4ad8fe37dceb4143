// Classification with integer class ids: cross_entropy_labels(logits,
// labels), argmax(values, axis), accuracy and a confusion matrix.
//
//   std::vector<std::int64_t> labels = {3, 0, 7};   // int64 (torch.long), int32, any integral type
//   auto loss = grad::cross_entropy_labels(logits, labels);
//
// Which cross-entropy, by what the targets are:
//   cross_entropy_labels(logits, labels)   class ids on the host (this header)
//   cross_entropy_ids(logits, ids, ignore) class ids in a constant Var, one node (record.hpp)
//   nn::cross_entropy_onehot(logits, y)    one-hot targets as a Var (nn.hpp)
// grad::cross_entropy(logits, labels) is the same as cross_entropy_labels
// (the older name); given a Var instead of labels it stops at compile time
// naming the other two.
//
// cross_entropy_labels records ordinary ops (no fused node yet):
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
#include <ranges>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
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

namespace classify_detail {
template <class L>
struct is_var : std::false_type {};
template <class U>
struct is_var<Var<U>> : std::true_type {};

// Labels a std::vector, std::span, std::array, ... of an integral type.
template <class Labels>
constexpr bool is_class_ids() {
  if constexpr (std::ranges::contiguous_range<const Labels>)
    return std::is_integral_v<std::ranges::range_value_t<const Labels>>;
  else
    return false;
}

// "label <id> in row <r> is out of range ..." or "" when id is a class id.
template <class Label>
std::string label_out_of_range(Label id, std::size_t row, std::size_t classes, const Dims& logits) {
  bool bad = static_cast<std::uint64_t>(id) >= classes;
  if constexpr (std::is_signed_v<Label>) bad = bad || id < 0;  // unsigned: no comparison that cannot fail
  if (!bad) return {};
  return "label " + std::to_string(+id) + " in row " + std::to_string(row) +
         " is out of range: expected a class id in [0, " + std::to_string(classes) + ") (the logits " +
         shape_string(logits) + " have " + std::to_string(classes) + " classes)";
}

template <class T, class Label>
Var<T> labels_loss(std::string_view who, Var<T> logits, std::span<const Label> labels) {
  const std::string name(who);
  Tape<T>& tp = detail::tape_of(who, logits);
  if (!tp.accept(name, {logits})) return tp.rejected();
  const Dims& d = tp.dims(logits);
  if (d.rank != 2) return tp.invalid(name + ": logits " + shape_string(d) + ": expected [rows, classes]");
  const std::size_t rows = d[0], classes = d[1];
  if (labels.size() != rows)
    return tp.invalid(name + ": logits " + shape_string(d) + " have " + std::to_string(rows) + " rows but " +
                      std::to_string(labels.size()) + " labels were given");
  for (std::size_t r = 0; r < rows; ++r)
    if (std::string why = label_out_of_range(labels[r], r, classes, d); !why.empty())
      return tp.invalid(name + ": " + why);
  Tensor<T>& onehot = scratch<T>(rows, classes, 0);
  Tensor<T>& shift = scratch<T>(rows, 1, 1);
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

template <class T, class Labels>
Var<T> checked_labels_loss(std::string_view who, Var<T> logits, const Labels& labels) {
  static_assert(!is_var<Labels>::value,
                "cross_entropy_labels: the targets are a Var, not host labels: for one-hot targets call "
                "nn::cross_entropy_onehot(logits, onehot); for class ids held in a constant call "
                "cross_entropy_ids(logits, ids, ignore)");
  static_assert(is_var<Labels>::value || is_class_ids<Labels>(),
                "cross_entropy_labels: labels must be integer class ids, a std::vector or std::span of an integral "
                "type (int32, int64, ...)");
  if constexpr (is_class_ids<Labels>()) {
    using Label = std::ranges::range_value_t<const Labels>;
    return labels_loss<T, Label>(who, logits,
                                 std::span<const Label>(std::ranges::data(labels), std::ranges::size(labels)));
  } else {
    return logits;  // unreachable: the static_asserts above stop the build
  }
}
}  // namespace classify_detail

// Mean cross-entropy of logits [rows, classes] against labels: one class id
// per row in [0, classes), held in a std::vector, std::span or std::array of
// any integral type (int64 as torch.long, int32, uint8, ...). A wrong label
// count or an id out of range poisons the tape, naming the row, the id and
// the class count.
template <class T, class Labels>
Var<T> cross_entropy_labels(Var<T> logits, const Labels& labels) {
  return classify_detail::checked_labels_loss("cross_entropy_labels", logits, labels);
}
// The older name of cross_entropy_labels (its messages say "cross_entropy").
template <class T, class Labels>
Var<T> cross_entropy(Var<T> logits, const Labels& labels) {
  return classify_detail::checked_labels_loss("cross_entropy", logits, labels);
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
