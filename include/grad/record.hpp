// The recording API: the functions users call. Each is one call of
// record_op, which checks the operands and the shapes (the tag's own rule;
// a bad one poisons the tape with a message that names the op, the shapes
// and what was expected), then records one node, computed at once.
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

}  // namespace detail

// The one recorder: checks the operands, asks the tag for the output shape
// (its output_dims rule: the message names the op, the shapes and what was
// expected), then records one node. Every function below is this call.
template <class Op, class T>
Var<T> record_op(Var<T> a, Var<T> b = {}, OpAttrs at = {}, T scalar = T(0)) {
  Tape<T>& tp = detail::tape_of(Op::name, a);
  if (!(Op::arity == 1 ? tp.accept(Op::name, {a}) : tp.accept(Op::name, {a, b}))) return tp.rejected();
  Dims out;
  const std::string why = Op::output_dims(tp.dims(a), Op::arity == 1 ? Dims{} : tp.dims(b), at, out);
  if (!why.empty()) return tp.invalid(std::string(Op::name) + ": " + why);
  std::span<const std::size_t> kept;
  if constexpr (requires { Op::keeps_sizes; }) kept = at.sizes;
  return tp.template record<Op>(a, b, out, scalar, static_cast<std::uint32_t>(at.axis), kept);
}

// ---- arithmetic with numpy broadcasting ----
template <class T>
Var<T> operator+(Var<T> a, Var<T> b) {
  return record_op<Add>(a, b);
}
template <class T>
Var<T> operator-(Var<T> a, Var<T> b) {
  return record_op<Sub>(a, b);
}
template <class T>
Var<T> operator*(Var<T> a, Var<T> b) {
  return record_op<Mul>(a, b);
}
template <class T>
Var<T> operator/(Var<T> a, Var<T> b) {
  return record_op<Div>(a, b);
}
template <class T>
Var<T> operator-(Var<T> a) {
  return record_op<Neg>(a);
}

// ---- scalar forms ----
template <class T>
Var<T> operator+(Var<T> a, std::type_identity_t<T> s) {
  return record_op<AddScalar>(a, {}, {}, s);
}
template <class T>
Var<T> operator+(std::type_identity_t<T> s, Var<T> a) {
  return record_op<AddScalar>(a, {}, {}, s);
}
template <class T>
Var<T> operator-(Var<T> a, std::type_identity_t<T> s) {
  return record_op<AddScalar>(a, {}, {}, -s);
}
template <class T>
Var<T> operator-(std::type_identity_t<T> s, Var<T> a) {
  return record_op<ScalarSub>(a, {}, {}, s);
}
template <class T>
Var<T> operator*(Var<T> a, std::type_identity_t<T> s) {
  return record_op<MulScalar>(a, {}, {}, s);
}
template <class T>
Var<T> operator*(std::type_identity_t<T> s, Var<T> a) {
  return record_op<MulScalar>(a, {}, {}, s);
}
template <class T>
Var<T> operator/(Var<T> a, std::type_identity_t<T> s) {
  return record_op<DivScalar>(a, {}, {}, s);
}
template <class T>
Var<T> operator/(std::type_identity_t<T> s, Var<T> a) {
  return record_op<ScalarDiv>(a, {}, {}, s);
}

// ---- pointwise ----
template <class T>
Var<T> relu(Var<T> a) {
  return record_op<Relu>(a);
}
template <class T>
Var<T> sigmoid(Var<T> a) {
  return record_op<Sigmoid>(a);
}
template <class T>
Var<T> tanh(Var<T> a) {
  return record_op<Tanh>(a);
}
template <class T>
Var<T> gelu(Var<T> a) {
  return record_op<Gelu>(a);
}
template <class T>
Var<T> exp(Var<T> a) {
  return record_op<Exp>(a);
}
template <class T>
Var<T> log(Var<T> a) {
  return record_op<Log>(a);
}
template <class T>
Var<T> sqrt(Var<T> a) {
  return record_op<Sqrt>(a);
}

// ---- reductions (over all axes, result shape {1}) ----
template <class T>
Var<T> sum(Var<T> a) {
  return record_op<Sum>(a);
}
template <class T>
Var<T> mean(Var<T> a) {
  return record_op<Mean>(a);
}

// Sum over the last axis, kept as size 1: [..., n] -> [..., 1].
template <class T>
Var<T> row_sum(Var<T> a) {
  return record_op<RowSum>(a);
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
  return record_op<Matmul>(a, b);
}

template <class T>
Var<T> bmm(Var<T> a, Var<T> b) {
  return record_op<Bmm>(a, b);
}

// Swaps the last two axes.
template <class T>
Var<T> transpose(Var<T> a) {
  return record_op<Transpose>(a);
}

// ---- layout ----
template <class T>
Var<T> reshape(Var<T> a, std::span<const std::size_t> shape) {
  return record_op<Reshape>(a, {}, OpAttrs{0, shape, {}});
}
template <class T>
Var<T> reshape(Var<T> a, std::initializer_list<std::size_t> shape) {
  return reshape(a, std::span<const std::size_t>(shape.begin(), shape.size()));
}

// Per-axis half-open ranges [starts[i], stops[i]); every range non-empty.
template <class T>
Var<T> slice(Var<T> a, std::span<const std::size_t> starts, std::span<const std::size_t> stops) {
  return record_op<Slice>(a, {}, OpAttrs{0, starts, stops});
}
template <class T>
Var<T> slice(Var<T> a, std::initializer_list<std::size_t> starts, std::initializer_list<std::size_t> stops) {
  return slice(a, std::span<const std::size_t>(starts.begin(), starts.size()),
               std::span<const std::size_t>(stops.begin(), stops.size()));
}

template <class T>
Var<T> concat(Var<T> a, Var<T> b, std::ptrdiff_t axis) {
  return record_op<Concat>(a, b, OpAttrs{axis, {}, {}});
}

template <class T>
Var<T> softmax(Var<T> a, std::ptrdiff_t axis) {
  return record_op<Softmax>(a, {}, OpAttrs{axis, {}, {}});
}

// ---- token ids (embedding.hpp, cross_entropy.hpp) ----
// Ids are a constant (tape.constant) of exact integers held in T, refreshed
// per batch like any input (Program::set_input on a device). These two ops
// have a value rule besides the shape rule: each checks the ids' values when
// it records (the tag's check_ids); an id out of range, or not an integer,
// poisons the tape naming the op, the id, its position and the valid range.
// Ids that require a gradient (a parameter, or computed from one) are refused.

namespace detail {
// The value rule of an op whose operand b holds ids: "" (then record_op
// records it, or words the shape refusal) or why not.
template <class Op, class T>
std::string refuse_ids(Tape<T>& tp, Var<T> a, Var<T> ids, std::size_t range_axis, T ignore) {
  OpAttrs at;
  Dims out;
  if (!tp.accept(Op::name, {a, ids}) || !Op::output_dims(tp.dims(a), tp.dims(ids), at, out).empty()) return "";
  if (tp.requires_grad(ids))
    return "the ids require a gradient (a parameter, or computed from one); expected a constant of integer ids "
           "(tape.constant)";
  const View<T> v = tp.value(ids);
  if constexpr (std::is_same_v<Op, Embedding>)
    return Op::check_ids(v.data.data(), v.size(), tp.dims(a)[range_axis]);
  else
    return Op::check_ids(v.data.data(), v.size(), tp.dims(a)[range_axis], ignore);
}
}  // namespace detail

// Rows of table [vocab, d] gathered by ids (any shape): ids' shape + [d].
template <class T>
Var<T> embedding(Var<T> table, Var<T> ids) {
  Tape<T>& tp = detail::tape_of(Embedding::name, table);
  if (std::string why = detail::refuse_ids<Embedding>(tp, table, ids, 0, T(0)); !why.empty())
    return tp.invalid(std::string(Embedding::name) + ": " + why);
  return record_op<Embedding>(table, ids);
}

// Mean over rows of -log softmax(logits)[id], one node: logits [rows, classes],
// ids [rows] (or [rows, 1]) integer class ids held in a constant; rows whose
// id equals `ignore` (padding; torch's ignore_index, -100 by default there
// too) are left out of the mean. The other two cross-entropies:
// nn::cross_entropy_onehot(logits, onehot), one-hot targets as a Var, and
// classify.hpp's cross_entropy_labels(logits, labels), class ids on the host
// (a std::vector of any integral type; it allocates no ids constant).
template <class T>
Var<T> cross_entropy_ids(Var<T> logits, Var<T> ids, std::type_identity_t<T> ignore = T(-100)) {
  Tape<T>& tp = detail::tape_of(CrossEntropy::name, logits);
  if (std::string why = detail::refuse_ids<CrossEntropy>(tp, logits, ids, 1, ignore); !why.empty())
    return tp.invalid(std::string(CrossEntropy::name) + ": " + why);
  return record_op<CrossEntropy>(logits, ids, {}, ignore);
}
// The older name of cross_entropy_ids (ignore given).
template <class T>
Var<T> cross_entropy(Var<T> logits, Var<T> ids, std::type_identity_t<T> ignore) {
  return cross_entropy_ids(logits, ids, ignore);
}

}  // namespace grad
