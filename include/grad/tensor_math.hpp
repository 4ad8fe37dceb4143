// Tensor math outside the tape: the few eager operations a data pipeline
// needs before anything is recorded. Nothing here touches a tape.
//
//   auto [x_train, scaler] = grad::standardize(train.inputs);   // per column, over the rows
//   auto x_test = scaler(test.inputs);                          // the training data's statistics
//   grad::Tensor<float> centred = x - grad::mean(x, 0);          // [rows, cols] - [cols]: broadcast
//   auto first = grad::slice_rows(x, 0, 100), both = grad::concat(first, x, 0);
//   std::vector<std::int32_t> best = grad::argmax(scores, -1);   // classify.hpp
//
//   mean(t, axis), stddev(t, axis, unbiased = true)   reduce one axis (removed,
//       as torch's keepdim=False); stddev's default divides by n - 1 as
//       torch.std does; unbiased = false divides by n (numpy's default)
//   standardize(x, unbiased = false)   (x - mean) / std per column (over axis
//       0), returning the result and the Standardizer that applies the same
//       statistics to other data; population std (n) by default, as
//       scikit-learn's StandardScaler; a column whose std is 0 is divided by
//       1 (StandardScaler's choice), so a constant column becomes zeros
//   a + b, a - b, a * b, a / b   same shapes or numpy broadcasting; a tensor
//       with a scalar on either side
//   slice_rows(t, first, last)   rows [first, last) of axis 0
//   concat(a, b, axis)           a then b along axis; the other axes equal
//
// Sums run in ascending index order in double, then round to T: the same
// bits on every machine (no vector reordering, no contraction). Bad input
// throws std::invalid_argument naming the function, the shapes and what was
// expected.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "grad/classify.hpp"
#include "grad/tensor.hpp"

namespace grad {

namespace tensor_math_detail {

// Where an axis sits in a row-major shape: outer blocks, its length, inner run.
struct AxisSplit {
  std::size_t outer = 1, length = 1, inner = 1, axis = 0;
};
inline AxisSplit split(const Shape& s, std::ptrdiff_t axis, const char* who) {
  const auto rank = static_cast<std::ptrdiff_t>(s.size());
  const std::ptrdiff_t a = axis < 0 ? axis + rank : axis;
  if (rank == 0 || a < 0 || a >= rank)
    throw std::invalid_argument(std::string(who) + ": axis " + std::to_string(axis) + " is out of range for shape " +
                                shape_string(s) + " (rank " + std::to_string(rank) + ")");
  AxisSplit k;
  k.axis = static_cast<std::size_t>(a);
  for (std::size_t i = 0; i < k.axis; ++i) k.outer *= s[i];
  k.length = s[k.axis];
  for (std::size_t i = k.axis + 1; i < s.size(); ++i) k.inner *= s[i];
  return k;
}
inline Shape without(const Shape& s, std::size_t axis) {
  Shape out = s;
  out.erase(out.begin() + static_cast<std::ptrdiff_t>(axis));
  return out;
}

// f(a, b) elementwise with numpy broadcasting.
template <class T, class F>
Tensor<T> broadcast(const Tensor<T>& a, const Tensor<T>& b, const char* who, F f) {
  auto refuse = [&](const std::string& why) {
    return std::invalid_argument(std::string("grad: Tensor ") + who + ": shapes " + shape_string(a.shape()) + " and " +
                                 shape_string(b.shape()) + " " + why);
  };
  if (a.size() == 0 || b.size() == 0) throw refuse("must both hold elements");
  if (a.shape() == b.shape()) {
    Tensor<T> out(a.shape());
    for (std::size_t i = 0; i < a.size(); ++i) out[i] = f(a[i], b[i]);
    return out;
  }
  if (a.rank() > max_rank || b.rank() > max_rank)
    throw refuse("exceed rank " + std::to_string(max_rank) + ", the most broadcasting supports");
  const Dims da = Dims::of(a.shape()), db = Dims::of(b.shape());
  Dims d;
  if (!broadcast_dims(da, db, d))
    throw refuse("do not broadcast (aligned from the last axis, each pair of sizes must be equal or 1)");
  Tensor<T> out(d.shape());
  const Dims sa = broadcast_strides(da, d), sb = broadcast_strides(db, d);
  for (std::size_t j = 0; j < out.size(); ++j) out[j] = f(a[broadcast_index(j, d, sa)], b[broadcast_index(j, d, sb)]);
  return out;
}
template <class T, class F>
Tensor<T> map(Tensor<T> t, F f) {
  for (T& v : t.data()) v = f(v);
  return t;
}

}  // namespace tensor_math_detail

// The mean over `axis` (negative: from the end), which is removed.
template <class T>
Tensor<T> mean(const Tensor<T>& t, std::ptrdiff_t axis) {
  const auto k = tensor_math_detail::split(t.shape(), axis, "grad::mean");
  if (k.length == 0)
    throw std::invalid_argument("grad::mean: axis " + std::to_string(axis) + " of " + shape_string(t.shape()) +
                                " is empty: there is no mean");
  Tensor<T> out(tensor_math_detail::without(t.shape(), k.axis));
  for (std::size_t o = 0; o < k.outer; ++o)
    for (std::size_t i = 0; i < k.inner; ++i) {
      double sum = 0;
      for (std::size_t r = 0; r < k.length; ++r) sum += static_cast<double>(t[(o * k.length + r) * k.inner + i]);
      out[o * k.inner + i] = static_cast<T>(sum / static_cast<double>(k.length));
    }
  return out;
}

// The standard deviation over `axis`, which is removed: divided by n - 1
// (unbiased, torch.std's default) or by n. Two passes (the mean first).
template <class T>
Tensor<T> stddev(const Tensor<T>& t, std::ptrdiff_t axis, bool unbiased = true) {
  const auto k = tensor_math_detail::split(t.shape(), axis, "grad::stddev");
  if (k.length < (unbiased ? 2u : 1u))
    throw std::invalid_argument("grad::stddev: axis " + std::to_string(axis) + " of " + shape_string(t.shape()) +
                                " has " + std::to_string(k.length) + " entries; the " +
                                (unbiased ? "unbiased std needs at least 2" : "std needs at least 1"));
  Tensor<T> out(tensor_math_detail::without(t.shape(), k.axis));
  const double n = static_cast<double>(k.length), divisor = unbiased ? n - 1 : n;
  for (std::size_t o = 0; o < k.outer; ++o)
    for (std::size_t i = 0; i < k.inner; ++i) {
      auto at = [&](std::size_t r) { return static_cast<double>(t[(o * k.length + r) * k.inner + i]); };
      double sum = 0;
      for (std::size_t r = 0; r < k.length; ++r) sum += at(r);
      const double m = sum / n;
      double squares = 0;
      for (std::size_t r = 0; r < k.length; ++r) squares += (at(r) - m) * (at(r) - m);
      out[o * k.inner + i] = static_cast<T>(std::sqrt(squares / divisor));
    }
  return out;
}

// ---- elementwise arithmetic (numpy broadcasting) ----
template <class T>
Tensor<T> operator+(const Tensor<T>& a, const Tensor<T>& b) {
  return tensor_math_detail::broadcast(a, b, "+", [](T x, T y) { return x + y; });
}
template <class T>
Tensor<T> operator-(const Tensor<T>& a, const Tensor<T>& b) {
  return tensor_math_detail::broadcast(a, b, "-", [](T x, T y) { return x - y; });
}
template <class T>
Tensor<T> operator*(const Tensor<T>& a, const Tensor<T>& b) {
  return tensor_math_detail::broadcast(a, b, "*", [](T x, T y) { return x * y; });
}
template <class T>
Tensor<T> operator/(const Tensor<T>& a, const Tensor<T>& b) {
  return tensor_math_detail::broadcast(a, b, "/", [](T x, T y) { return x / y; });
}
template <class T>
Tensor<T> operator+(Tensor<T> a, std::type_identity_t<T> s) {
  return tensor_math_detail::map(std::move(a), [s](T x) { return x + s; });
}
template <class T>
Tensor<T> operator+(std::type_identity_t<T> s, Tensor<T> a) {
  return tensor_math_detail::map(std::move(a), [s](T x) { return s + x; });
}
template <class T>
Tensor<T> operator-(Tensor<T> a, std::type_identity_t<T> s) {
  return tensor_math_detail::map(std::move(a), [s](T x) { return x - s; });
}
template <class T>
Tensor<T> operator-(std::type_identity_t<T> s, Tensor<T> a) {
  return tensor_math_detail::map(std::move(a), [s](T x) { return s - x; });
}
template <class T>
Tensor<T> operator*(Tensor<T> a, std::type_identity_t<T> s) {
  return tensor_math_detail::map(std::move(a), [s](T x) { return x * s; });
}
template <class T>
Tensor<T> operator*(std::type_identity_t<T> s, Tensor<T> a) {
  return tensor_math_detail::map(std::move(a), [s](T x) { return s * x; });
}
template <class T>
Tensor<T> operator/(Tensor<T> a, std::type_identity_t<T> s) {
  return tensor_math_detail::map(std::move(a), [s](T x) { return x / s; });
}
template <class T>
Tensor<T> operator/(std::type_identity_t<T> s, Tensor<T> a) {
  return tensor_math_detail::map(std::move(a), [s](T x) { return s / x; });
}
template <class T>
Tensor<T> operator-(Tensor<T> a) {
  return tensor_math_detail::map(std::move(a), [](T x) { return -x; });
}

// Per-column statistics of a training set, applied to any data with its
// columns: (x - mean) / std, a std of 0 replaced by 1.
template <class T>
struct Standardizer {
  Tensor<T> mean, std;  // [cols...]: the shape of one row
  Tensor<T> operator()(const Tensor<T>& x) const {
    if (x.rank() < 1 || !std::equal(x.shape().begin() + 1, x.shape().end(), mean.shape().begin(), mean.shape().end()))
      throw std::invalid_argument("grad::Standardizer: data " + shape_string(x.shape()) +
                                  " does not have the rows of the fitted data: expected [rows, " +
                                  shape_string(mean.shape()).substr(1));
    return (x - mean) / std;
  }
};

// Standardizes x ([rows, ...]) over its rows; returns the result and the
// Standardizer to apply to validation and test data.
template <class T>
std::pair<Tensor<T>, Standardizer<T>> standardize(const Tensor<T>& x, bool unbiased = false) {
  if (x.rank() < 2 || x.size() == 0)
    throw std::invalid_argument("grad::standardize: data " + shape_string(x.shape()) +
                                " is not [rows, columns...] with at least one row and one column");
  Standardizer<T> s{mean(x, 0), stddev(x, 0, unbiased)};
  for (T& v : s.std.data())
    if (v == T(0)) v = T(1);
  Tensor<T> y = s(x);
  return {std::move(y), std::move(s)};
}

// Rows [first, last) of axis 0.
template <class T>
Tensor<T> slice_rows(const Tensor<T>& t, std::size_t first, std::size_t last) {
  const std::size_t rows = t.rank() == 0 ? 0 : t.shape()[0];
  if (!(first < last && last <= rows))
    throw std::invalid_argument("grad::slice_rows: rows [" + std::to_string(first) + ", " + std::to_string(last) +
                                ") of shape " + shape_string(t.shape()) +
                                ": expected first < last <= " + std::to_string(rows));
  const std::size_t row = t.size() / rows;
  Shape s = t.shape();
  s[0] = last - first;
  return Tensor<T>(std::move(s), std::vector<T>(t.data().begin() + static_cast<std::ptrdiff_t>(first * row),
                                                t.data().begin() + static_cast<std::ptrdiff_t>(last * row)));
}

// a then b along `axis` (negative: from the end); every other axis must match.
template <class T>
Tensor<T> concat(const Tensor<T>& a, const Tensor<T>& b, std::ptrdiff_t axis) {
  const auto k = tensor_math_detail::split(a.shape(), axis, "grad::concat");
  bool fits = a.rank() == b.rank();
  for (std::size_t i = 0; fits && i < a.rank(); ++i) fits = i == k.axis || a.shape()[i] == b.shape()[i];
  if (!fits)
    throw std::invalid_argument("grad::concat: shapes " + shape_string(a.shape()) + " and " + shape_string(b.shape()) +
                                " must match on every axis but axis " + std::to_string(k.axis));
  Shape s = a.shape();
  s[k.axis] += b.shape()[k.axis];
  Tensor<T> out(std::move(s));
  const std::size_t wa = k.length * k.inner, wb = b.shape()[k.axis] * k.inner;
  auto to = out.data().begin();
  for (std::size_t o = 0; o < k.outer; ++o) {
    to = std::copy_n(a.data().begin() + static_cast<std::ptrdiff_t>(o * wa), wa, to);
    to = std::copy_n(b.data().begin() + static_cast<std::ptrdiff_t>(o * wb), wb, to);
  }
  return out;
}

}  // namespace grad
