// The functions users call. Each checks its operands and shapes (poisoning
// the tape with a message that names the op, the shapes and what was
// expected), then records one node whose value is computed at once.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "grad/tape.hpp"

namespace grad {

namespace detail {

template <class T>
Tape<T>& tape_of(std::string_view op, Var<T> a) {
  if (!a.tape())
    throw std::invalid_argument(std::string(op) + ": operand 1 is a default-constructed Var that belongs to no tape");
  return *a.tape();
}

inline std::string str(std::string_view s) { return std::string(s); }

template <class Op, class T>
Var<T> unary(Var<T> a, T scalar = T(0)) {
  Tape<T>& tp = tape_of(Op::name, a);
  if (!tp.accept(Op::name, {a})) return tp.rejected();
  return tp.template record<Op>(a, Var<T>{}, tp.dims(a), scalar);
}

template <class Op, class T>
Var<T> broadcast_binary(Var<T> a, Var<T> b) {
  Tape<T>& tp = tape_of(Op::name, a);
  if (!tp.accept(Op::name, {a, b})) return tp.rejected();
  Dims out;
  if (!broadcast_dims(tp.dims(a), tp.dims(b), out))
    return tp.invalid(str(Op::name) + ": shapes " + shape_string(tp.dims(a)) + " and " + shape_string(tp.dims(b)) +
                      " do not broadcast (aligned from the last axis, each pair of sizes must be equal or 1)");
  return tp.template record<Op>(a, b, out);
}

template <class Op, class T>
Var<T> reduce_all(Var<T> a) {
  Tape<T>& tp = tape_of(Op::name, a);
  if (!tp.accept(Op::name, {a})) return tp.rejected();
  return tp.template record<Op>(a, Var<T>{}, Dims::of(std::array<std::size_t, 1>{1}));
}

// Negative axes count from the end, as in numpy. Returns false if out of
// range; shapes() names the operands in the message ("shape [2, 3]"), built
// only on failure.
template <class T, class Shapes>
bool resolve_axis(Tape<T>& tp, std::string_view op, const Dims& d, std::ptrdiff_t axis, std::uint32_t& out,
                  Shapes shapes) {
  const auto rank = static_cast<std::ptrdiff_t>(d.rank);
  const std::ptrdiff_t a = axis < 0 ? axis + rank : axis;
  if (a < 0 || a >= rank) {
    tp.poison(str(op) + ": axis " + std::to_string(axis) + " is out of range for " + shapes() + " (rank " +
              std::to_string(rank) + ")");
    return false;
  }
  out = static_cast<std::uint32_t>(a);
  return true;
}

}  // namespace detail

// ---- arithmetic with numpy broadcasting ----
template <class T>
Var<T> operator+(Var<T> a, Var<T> b) {
  return detail::broadcast_binary<Add>(a, b);
}
template <class T>
Var<T> operator-(Var<T> a, Var<T> b) {
  return detail::broadcast_binary<Sub>(a, b);
}
template <class T>
Var<T> operator*(Var<T> a, Var<T> b) {
  return detail::broadcast_binary<Mul>(a, b);
}
template <class T>
Var<T> operator/(Var<T> a, Var<T> b) {
  return detail::broadcast_binary<Div>(a, b);
}
template <class T>
Var<T> operator-(Var<T> a) {
  return detail::unary<Neg>(a);
}

// ---- scalar forms ----
template <class T>
Var<T> operator+(Var<T> a, std::type_identity_t<T> s) {
  return detail::unary<AddScalar>(a, s);
}
template <class T>
Var<T> operator+(std::type_identity_t<T> s, Var<T> a) {
  return detail::unary<AddScalar>(a, s);
}
template <class T>
Var<T> operator-(Var<T> a, std::type_identity_t<T> s) {
  return detail::unary<AddScalar>(a, -s);
}
template <class T>
Var<T> operator-(std::type_identity_t<T> s, Var<T> a) {
  return detail::unary<ScalarSub>(a, s);
}
template <class T>
Var<T> operator*(Var<T> a, std::type_identity_t<T> s) {
  return detail::unary<MulScalar>(a, s);
}
template <class T>
Var<T> operator*(std::type_identity_t<T> s, Var<T> a) {
  return detail::unary<MulScalar>(a, s);
}
template <class T>
Var<T> operator/(Var<T> a, std::type_identity_t<T> s) {
  return detail::unary<DivScalar>(a, s);
}
template <class T>
Var<T> operator/(std::type_identity_t<T> s, Var<T> a) {
  return detail::unary<ScalarDiv>(a, s);
}

// ---- pointwise ----
template <class T>
Var<T> relu(Var<T> a) {
  return detail::unary<Relu>(a);
}
template <class T>
Var<T> sigmoid(Var<T> a) {
  return detail::unary<Sigmoid>(a);
}
template <class T>
Var<T> tanh(Var<T> a) {
  return detail::unary<Tanh>(a);
}
template <class T>
Var<T> exp(Var<T> a) {
  return detail::unary<Exp>(a);
}
template <class T>
Var<T> log(Var<T> a) {
  return detail::unary<Log>(a);
}
template <class T>
Var<T> sqrt(Var<T> a) {
  return detail::unary<Sqrt>(a);
}

// ---- reductions (over all axes, result shape {1}) ----
template <class T>
Var<T> sum(Var<T> a) {
  return detail::reduce_all<Sum>(a);
}
template <class T>
Var<T> mean(Var<T> a) {
  return detail::reduce_all<Mean>(a);
}

// Sum over the last axis, kept as size 1: [..., n] -> [..., 1].
template <class T>
Var<T> row_sum(Var<T> a) {
  Tape<T>& tp = detail::tape_of("row_sum", a);
  if (!tp.accept("row_sum", {a})) return tp.rejected();
  Dims out = tp.dims(a);
  out.d[out.rank - 1] = 1;
  return tp.template record<RowSum>(a, Var<T>{}, out);
}

// mean((y - target)^2); y and target must have the same shape.
template <class T>
Var<T> mse(Var<T> y, Var<T> target) {
  Tape<T>& tp = detail::tape_of("mse", y);
  if (!tp.accept("mse", {y, target})) return tp.rejected();
  if (!(tp.dims(y) == tp.dims(target)))
    return tp.invalid("mse: prediction " + shape_string(tp.dims(y)) + " and target " + shape_string(tp.dims(target)) +
                      " must have the same shape");
  Var<T> d = y - target;
  return mean(d * d);
}

// ---- linear algebra ----
template <class T>
Var<T> matmul(Var<T> a, Var<T> b) {
  Tape<T>& tp = detail::tape_of("matmul", a);
  if (!tp.accept("matmul", {a, b})) return tp.rejected();
  const Dims &x = tp.dims(a), &y = tp.dims(b);
  if (x.rank != 2 || y.rank != 2 || x[1] != y[0])
    return tp.invalid("matmul: expected [m, k] x [k, n], got " + shape_string(x) + " x " + shape_string(y));
  return tp.template record<Matmul>(a, b, Dims::of(std::array<std::size_t, 2>{x[0], y[1]}));
}

template <class T>
Var<T> bmm(Var<T> a, Var<T> b) {
  Tape<T>& tp = detail::tape_of("bmm", a);
  if (!tp.accept("bmm", {a, b})) return tp.rejected();
  const Dims &x = tp.dims(a), &y = tp.dims(b);
  if (x.rank != 3 || y.rank != 3 || x[0] != y[0] || x[2] != y[1])
    return tp.invalid("bmm: expected [B, m, k] x [B, k, n], got " + shape_string(x) + " x " + shape_string(y));
  return tp.template record<Bmm>(a, b, Dims::of(std::array<std::size_t, 3>{x[0], x[1], y[2]}));
}

// Swaps the last two axes.
template <class T>
Var<T> transpose(Var<T> a) {
  Tape<T>& tp = detail::tape_of("transpose", a);
  if (!tp.accept("transpose", {a})) return tp.rejected();
  Dims out = tp.dims(a);
  if (out.rank < 2) return tp.invalid("transpose: expected rank >= 2, got shape " + shape_string(out));
  std::swap(out.d[out.rank - 1], out.d[out.rank - 2]);
  return tp.template record<Transpose>(a, Var<T>{}, out);
}

// ---- layout ----
template <class T>
Var<T> reshape(Var<T> a, std::span<const std::size_t> shape) {
  Tape<T>& tp = detail::tape_of("reshape", a);
  if (!tp.accept("reshape", {a})) return tp.rejected();
  const Dims& in = tp.dims(a);
  if (shape.size() > max_rank || shape.empty())
    return tp.invalid("reshape: cannot reshape " + shape_string(in) + " to " + shape_string(shape) +
                      ": the target shape must have rank 1 to " + std::to_string(max_rank));
  const std::optional<std::size_t> count = checked_element_count(shape);
  if (!count)
    return tp.invalid("reshape: cannot reshape " + shape_string(in) + " (" + std::to_string(in.size()) +
                      " elements) to " + shape_string(shape) + ": its element count overflows");
  if (*count != in.size())
    return tp.invalid("reshape: cannot reshape " + shape_string(in) + " (" + std::to_string(in.size()) +
                      " elements) to " + shape_string(shape) + " (" + std::to_string(*count) + " elements)");
  return tp.template record<Reshape>(a, Var<T>{}, Dims::of(shape));
}
template <class T>
Var<T> reshape(Var<T> a, std::initializer_list<std::size_t> shape) {
  return reshape(a, std::span<const std::size_t>(shape.begin(), shape.size()));
}

// Per-axis half-open ranges [starts[i], stops[i]); every range non-empty.
template <class T>
Var<T> slice(Var<T> a, std::span<const std::size_t> starts, std::span<const std::size_t> stops) {
  Tape<T>& tp = detail::tape_of("slice", a);
  if (!tp.accept("slice", {a})) return tp.rejected();
  const Dims& in = tp.dims(a);
  if (starts.size() != in.rank || stops.size() != in.rank)
    return tp.invalid("slice: shape " + shape_string(in) + " needs " + std::to_string(in.rank) +
                      " starts and stops, got " + std::to_string(starts.size()) + " and " +
                      std::to_string(stops.size()));
  Dims out = in;
  for (std::size_t ax = 0; ax < in.rank; ++ax) {
    if (!(starts[ax] < stops[ax] && stops[ax] <= in[ax]))
      return tp.invalid("slice: range [" + std::to_string(starts[ax]) + ", " + std::to_string(stops[ax]) +
                        ") on axis " + std::to_string(ax) + " of shape " + shape_string(in) +
                        " is empty or out of bounds (expected start < stop <= " + std::to_string(in[ax]) + ")");
    out.d[ax] = stops[ax] - starts[ax];
  }
  return tp.template record<Slice>(a, Var<T>{}, out, T(0), 0, starts);
}
template <class T>
Var<T> slice(Var<T> a, std::initializer_list<std::size_t> starts, std::initializer_list<std::size_t> stops) {
  return slice(a, std::span<const std::size_t>(starts.begin(), starts.size()),
               std::span<const std::size_t>(stops.begin(), stops.size()));
}

template <class T>
Var<T> concat(Var<T> a, Var<T> b, std::ptrdiff_t axis) {
  Tape<T>& tp = detail::tape_of("concat", a);
  if (!tp.accept("concat", {a, b})) return tp.rejected();
  const Dims &x = tp.dims(a), &y = tp.dims(b);
  std::uint32_t ax = 0;
  auto shapes = [&] { return "shapes " + shape_string(x) + " and " + shape_string(y); };
  if (!detail::resolve_axis(tp, "concat", x, axis, ax, shapes)) return tp.rejected();
  bool fits = x.rank == y.rank;
  for (std::size_t i = 0; fits && i < x.rank; ++i) fits = i == ax || x[i] == y[i];
  if (!fits)
    return tp.invalid("concat: shapes " + shape_string(x) + " and " + shape_string(y) +
                      " must match on every axis but axis " + std::to_string(ax));
  Dims out = x;
  out.d[ax] += y[ax];
  return tp.template record<Concat>(a, b, out, T(0), ax);
}

template <class T>
Var<T> softmax(Var<T> a, std::ptrdiff_t axis) {
  Tape<T>& tp = detail::tape_of("softmax", a);
  if (!tp.accept("softmax", {a})) return tp.rejected();
  std::uint32_t ax = 0;
  auto shapes = [&] { return "shape " + shape_string(tp.dims(a)); };
  if (!detail::resolve_axis(tp, "softmax", tp.dims(a), axis, ax, shapes)) return tp.rejected();
  return tp.template record<Softmax>(a, Var<T>{}, tp.dims(a), T(0), ax);
}

}  // namespace grad
