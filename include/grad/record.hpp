// The recording API: the functions users call. Each is one call of
// record_op, which checks the operands and the shapes (the tag's own rule;
// a bad one poisons the tape with a message that names the op, the shapes
// and what was expected), then records one node, computed at once.
#pragma once

#include <array>
#include <cstddef>
#include <cstdio>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

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

// |x| (the gradient at 0 is 0, as torch).
template <class T>
Var<T> abs(Var<T> a) {
  return record_op<Abs>(a);
}

// x^s elementwise for a scalar exponent (power.hpp: power_of; torch's
// gradient rules, 0 everywhere for s = 0).
template <class T>
Var<T> pow(Var<T> a, std::type_identity_t<T> s) {
  return record_op<PowScalar>(a, {}, {}, s);
}
// a^b elementwise with numpy broadcasting (NaN where a < 0 and b is not an integer).
template <class T>
Var<T> pow(Var<T> a, Var<T> b) {
  return record_op<Pow>(a, b);
}

namespace detail {
// A clamp bound: NaN is refused (torch would turn every element into NaN,
// which is never what a bound is for).
template <class T>
bool clamp_bound_ok(Tape<T>& tp, std::string_view op, std::string_view which, T bound) {
  if (bound == bound) return true;
  tp.invalid(std::string(op) + ": the " + std::string(which) + " bound is NaN; expected a number (or +-inf for none)");
  return false;
}
}  // namespace detail

// max(x, lo) and min(x, hi) elementwise; the gradient passes where
// lo <= x (x <= hi), inclusive, as torch.
template <class T>
Var<T> clamp_min(Var<T> a, std::type_identity_t<T> lo) {
  Tape<T>& tp = detail::tape_of(ClampMin::name, a);
  if (!detail::clamp_bound_ok(tp, ClampMin::name, "lower", lo)) return tp.rejected();
  return record_op<ClampMin>(a, {}, {}, lo);
}
template <class T>
Var<T> clamp_max(Var<T> a, std::type_identity_t<T> hi) {
  Tape<T>& tp = detail::tape_of(ClampMax::name, a);
  if (!detail::clamp_bound_ok(tp, ClampMax::name, "upper", hi)) return tp.rejected();
  return record_op<ClampMax>(a, {}, {}, hi);
}
// x limited to [lo, hi], recorded as clamp_max(clamp_min(x, lo), hi): torch.clamp's
// value and gradient (it passes where lo <= x <= hi). lo > hi or a NaN bound is refused.
template <class T>
Var<T> clamp(Var<T> a, std::type_identity_t<T> lo, std::type_identity_t<T> hi) {
  Tape<T>& tp = detail::tape_of("clamp", a);
  if (!detail::clamp_bound_ok(tp, "clamp", "lower", lo) || !detail::clamp_bound_ok(tp, "clamp", "upper", hi))
    return tp.rejected();
  if (lo > hi) {
    char text[96];
    std::snprintf(text, sizeof text, "clamp: expected lo <= hi, got lo = %.17g and hi = %.17g", static_cast<double>(lo),
                  static_cast<double>(hi));
    return tp.invalid(text);
  }
  return clamp_max(clamp_min(a, lo), hi);
}

// The larger (smaller) of a and b elementwise, with numpy broadcasting; on a
// tie each operand gets half the gradient (torch.maximum's rule).
template <class T>
Var<T> maximum(Var<T> a, Var<T> b) {
  return record_op<Maximum>(a, b);
}
template <class T>
Var<T> minimum(Var<T> a, Var<T> b) {
  return record_op<Minimum>(a, b);
}

// a where cond != 0, else b (torch.where(cond.bool(), a, b)); the three
// broadcast together. cond is a mask held as T (0 or not), a constant: one
// that needs a gradient (a parameter, or computed from one) is refused.
// Recorded as where_true(cond, a) + where_false(cond, b) (piecewise.hpp: the
// sum is torch.where's value bit for bit); the gradient is g where chosen, else 0.
template <class T>
Var<T> where(Var<T> cond, Var<T> a, Var<T> b) {
  Tape<T>& tp = detail::tape_of("where", cond);
  if (!tp.accept("where", {cond, a, b})) return tp.rejected();
  Dims ca, all;
  if (!broadcast_dims(tp.dims(cond), tp.dims(a), ca) || !broadcast_dims(ca, tp.dims(b), all))
    return tp.invalid("where: cond " + shape_string(tp.dims(cond)) + ", a " + shape_string(tp.dims(a)) + " and b " +
                      shape_string(tp.dims(b)) +
                      " do not broadcast (aligned from the last axis, each set of sizes must be equal or 1)");
  if (tp.requires_grad(cond))
    return tp.invalid("where: the mask requires a gradient (a parameter, or computed from one); expected a constant "
                      "(tape.constant) of 0 / non-0 values");
  return record_op<WhereTrue>(cond, a) + record_op<WhereFalse>(cond, b);
}

// Inverted dropout (tags/dropout.hpp): each element kept with probability
// 1 - p and scaled by 1 / (1 - p), by the mask of `key` (dropout_key(seed,
// step, node)). p must be in [0, 1) (after rounding to T); nn::Dropout is the
// layer that picks the key and follows train()/eval().
template <class T>
Var<T> dropout(Var<T> a, double p, std::uint64_t key) {
  Tape<T>& tp = detail::tape_of("dropout", a);
  if (!tp.accept("dropout", {a})) return tp.rejected();
  const T rate = static_cast<T>(p);
  if (!(rate >= T(0) && rate < T(1)))
    return tp.invalid("dropout: p = " + std::to_string(p) + " is out of range: expected 0 <= p < 1");
  std::array<std::size_t, max_rank> padded{};
  padded[0] = static_cast<std::size_t>(key);
  return record_op<Dropout>(a, {}, OpAttrs{0, std::span<const std::size_t>(padded).first(tp.dims(a).rank), {}}, rate);
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

// RMS norm over the last axis as one node: x / sqrt(row_sum(x * x) / cols +
// eps) * w, with w [cols] (tags/rms_norm.hpp: the bits of that composite).
template <class T>
Var<T> rms_norm(Var<T> x, Var<T> w, std::type_identity_t<T> eps) {
  return record_op<RmsNorm>(x, w, {}, eps);
}

// a + b * s with numpy broadcasting, as one node: the bits of a + (b * s)
// (tags/gated.hpp; nn::lora_linear adds its scaled low-rank term so).
template <class T>
Var<T> add_scaled(Var<T> a, Var<T> b, std::type_identity_t<T> s) {
  return record_op<AddScaled>(a, b, {}, s);
}

// silu(gate) * up = gate * sigmoid(gate) * up with numpy broadcasting, as one
// node (tags/gated.hpp: the composite's bits); nn::swiglu records it.
template <class T>
Var<T> silu_mul(Var<T> gate, Var<T> up) {
  return record_op<SiluMul>(gate, up);
}

// Layer norm's normalisation over the last axis as one node: (x - mean) /
// sqrt(var + eps), biased variance (tags/layer_norm.hpp: the bits of that
// composite); nn::layernorm applies the weight and bias.
template <class T>
Var<T> layer_norm(Var<T> x, std::type_identity_t<T> eps) {
  return record_op<LayerNorm>(x, {}, {}, eps);
}

// The largest (smallest) element along `axis` (negative: from the end), as
// torch.amax / torch.amin: keep_axis (the default, as row_sum) leaves the
// axis as size 1, else it is dropped (a vector's becomes shape [1]). Tied
// extremes share the gradient evenly (torch.amax's rule, not max(dim)'s).
template <class T>
Var<T> max(Var<T> a, std::ptrdiff_t axis, bool keep_axis = true) {
  return record_op<AxisMax>(a, {}, OpAttrs{axis, {}, {}, keep_axis});
}
template <class T>
Var<T> min(Var<T> a, std::ptrdiff_t axis, bool keep_axis = true) {
  return record_op<AxisMin>(a, {}, OpAttrs{axis, {}, {}, keep_axis});
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

// a . b^T for b stored [n, k] (a linear layer's weight [out, in], a tied
// embedding [vocab, d]): a [..., m, k] -> [..., m, n], the bits of
// matmul(a, transpose(b)) without recording b's transposed copy.
template <class T>
Var<T> matmul_nt(Var<T> a, Var<T> b) {
  return record_op<MatmulNt>(a, b);
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

// log(softmax(a)) along `axis` (default the last), computed stably in one
// node: (x - max) - log(sum(exp(x - max))).
template <class T>
Var<T> log_softmax(Var<T> a, std::ptrdiff_t axis = -1) {
  return record_op<LogSoftmax>(a, {}, OpAttrs{axis, {}, {}});
}

// ---- causal attention (attention.hpp) ----
// N = batch * key/value heads; the G query heads of one key/value head are
// stacked along the rows (query row r is at position r % t).

// q [N, G*t, hd], k [N, t, hd] -> [N, G*t, t]: per query row the softmax of
// scale * q.k over the keys at or before its position (later keys get
// exactly 0), with the bits of softmax(bmm(q, transpose(k)) * scale + mask)
// for k repeated G times and nn::causal_mask.
template <class T>
Var<T> causal_attention_probs(Var<T> q, Var<T> k, std::type_identity_t<T> scale) {
  return record_op<CausalAttentionProbs>(q, k, {}, scale);
}

// p [N, G*t, t], v [N, t, hd] -> [N, G*t, hd]: every query head of a group
// times the group's one v, with the bits of bmm with v repeated G times.
// When p is causal_attention_probs' output, the products skip its masked
// zeros (the same bits for finite v).
template <class T>
Var<T> attention_context(Var<T> p, Var<T> v) {
  const bool causal = p.tape() && p.tape()->template recorded_by<CausalAttentionProbs>(p);
  return record_op<AttentionContext>(p, v, OpAttrs{causal ? 1 : 0, {}, {}});
}

// ---- attention's layouts (heads.hpp) ----
// rows [batch*t, heads*hd] (a projection's output: a row per position, the
// heads side by side) -> heads-major [batch*heads, t, hd]: head h of
// sequence b at position p is row b*t + p's columns [h*hd, (h+1)*hd).
template <class T>
Var<T> heads_major(Var<T> rows, std::size_t batch, std::size_t heads) {
  const std::array<std::size_t, 2> sizes{batch, heads};
  return record_op<HeadsMajor>(rows, {}, OpAttrs{0, sizes, {}});
}

// heads-major [batch*heads, t, hd] -> rows [batch*t, heads*hd]: heads_major's inverse.
template <class T>
Var<T> rows_major(Var<T> heads, std::size_t batch) {
  const std::array<std::size_t, 1> sizes{batch};
  return record_op<RowsMajor>(heads, {}, OpAttrs{0, sizes, {}});
}

// heads_major(rows, batch, heads) rotated by RoPE with the table [2, t, hd]
// (cos, then sin; t and hd give batch and heads): h * cos +
// rotate_half(h) * sin, rotate_half(h) = [-h2, h1] for h = [h1, h2] split
// at hd / 2, with the bits of that composite (nn::rope's).
template <class T>
Var<T> rope_heads_major(Var<T> rows, Var<T> table) {
  return record_op<RopeHeadsMajor>(rows, table);
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

// ---- a linear layer's cross-entropy without its logits (linear_cross_entropy.hpp) ----
// Where the weight's classes run: W [classes, d] (a linear layer's [out, in],
// a tied embedding: the logits are matmul_nt(h, W)) or W [d, classes] (an
// untied head: matmul(h, W)).
enum class ClassAxis { rows, columns };

// cross_entropy(matmul_nt(h, w), ids, ignore) (ClassAxis::rows) or
// cross_entropy(matmul(h, w), ids, ignore) (ClassAxis::columns) as one node,
// the same bits in the loss and in the gradients of h and w, without the
// [rows, classes] logits or their gradient on the tape. ids: a constant of
// [rows] (or [rows, 1]) integer ids held in T, as cross_entropy_ids takes
// them; their values are read now (the node keeps them), not when a device
// program replays the node: Program::set_input on the ids does not reach it.
// When h needs a gradient the node also computes dh during the forward pass
// (its form that keeps dh, [1 + rows * d]) and the loss is slice(node, 0, 1):
// a backward from this loss reads dh instead of computing the logits again.
template <class T>
Var<T> linear_cross_entropy(Var<T> h, Var<T> w, Var<T> ids, std::type_identity_t<T> ignore = T(-100),
                            ClassAxis classes_along = ClassAxis::rows) {
  using Op = LinearCrossEntropy;
  Tape<T>& tp = detail::tape_of(Op::name, h);
  if (!tp.accept(Op::name, {h, w, ids})) return tp.rejected();
  const std::string who = std::string(Op::name) + ": ";
  const Dims hd = tp.dims(h), idd = tp.dims(ids);
  const std::size_t rows = hd.rank == 2 ? hd[0] : 0;
  std::vector<std::size_t> classes_of_rows(rows);
  OpAttrs at;
  at.axis = classes_along == ClassAxis::rows ? 0 : 1;
  at.sizes = classes_of_rows;
  Dims out;
  if (std::string why = Op::output_dims(hd, tp.dims(w), at, out); !why.empty()) return tp.invalid(who + why);
  if (!((idd.rank == 1 && idd[0] == rows) || (idd.rank == 2 && idd[0] == rows && idd[1] == 1)))
    return tp.invalid(who + "h " + shape_string(hd) + " and ids " + shape_string(idd) + ": expected ids [" +
                      std::to_string(rows) + "] (one class id per row)");
  if (tp.requires_grad(ids))
    return tp.invalid(who +
                      "the ids require a gradient (a parameter, or computed from one); expected a constant of integer "
                      "ids (tape.constant)");
  const std::size_t classes = tp.dims(w)[at.axis == 0 ? 0 : 1];
  const View<T> v = tp.value(ids);
  if (std::string why = CrossEntropy::check_ids(v.data.data(), rows, classes, static_cast<T>(ignore)); !why.empty())
    return tp.invalid(who + why);
  for (std::size_t r = 0; r < rows; ++r)
    classes_of_rows[r] = v.data[r] == ignore ? classes : Embedding::row_of(v.data[r], classes);
  if (!tp.requires_grad(h) || tp.inference_mode()) return record_op<Op>(h, w, at);
  at.axis |= Op::keeps_dh_bit;
  return slice(record_op<Op>(h, w, at), {0}, {1});
}

}  // namespace grad
