// Neural-network layers as pure tape builders: each checks its operands'
// shapes, then records ordinary ops (matmul, row_sum, softmax, slice, ...).
// They own nothing, so every gradient is derived by the tape and the device
// engine replays them like any other recording. Row reductions (norms,
// cross-entropy) use the row_sum op rather than a matmul with a ones column:
// one node instead of two and faster at every size bench/bench_nn.cpp measures.
//
// Conventions: activations are [rows, cols]; a weight is [in, out]; a bias
// or norm weight is [out], broadcast over rows. A layer of several ops
// records them under a name scope of its own ("rmsnorm", "lora", ...,
// inside whatever scope the caller opened), so the inspection tools
// (grad/inspect.hpp) can say which layer a node belongs to; a scope costs a
// short lookup per call and nothing per op. Bad input poisons the tape
// with "grad: nn::<layer>: <shapes>, expected ...". The table builders
// (rope_tables, causal_mask) record nothing and throw std::invalid_argument.
#pragma once

#include <cmath>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

#include "grad/record.hpp"

namespace grad::nn {

namespace detail {

inline bool is_matrix(const Dims& d) { return d.rank == 2; }
inline bool is_vector(const Dims& d, std::size_t n) { return d.rank == 1 && d[0] == n; }
inline bool is_matrix(const Dims& d, std::size_t rows, std::size_t cols) {
  return d.rank == 2 && d[0] == rows && d[1] == cols;
}
inline std::string num(std::size_t n) { return std::to_string(n); }

}  // namespace detail

// x [rows, in] . w [in, out]
template <class T>
Var<T> linear(Var<T> x, Var<T> w) {
  Tape<T>& tp = grad::detail::tape_of("nn::linear", x);
  if (!tp.accept("nn::linear", {x, w})) return tp.rejected();
  const Dims &xd = tp.dims(x), &wd = tp.dims(w);
  if (!detail::is_matrix(xd) || !detail::is_matrix(wd) || xd[1] != wd[0])
    return tp.invalid("nn::linear: x " + shape_string(xd) + " and weight " + shape_string(wd) +
                      ": expected x [rows, in] and weight [in, out]");
  return matmul(x, w);
}

// x [rows, in] . w [in, out] + b [out]
template <class T>
Var<T> linear_bias(Var<T> x, Var<T> w, Var<T> b) {
  Tape<T>& tp = grad::detail::tape_of("nn::linear_bias", x);
  if (!tp.accept("nn::linear_bias", {x, w, b})) return tp.rejected();
  const Dims &xd = tp.dims(x), &wd = tp.dims(w), &bd = tp.dims(b);
  if (!detail::is_matrix(xd) || !detail::is_matrix(wd) || xd[1] != wd[0] || !detail::is_vector(bd, wd[1]))
    return tp.invalid("nn::linear_bias: x " + shape_string(xd) + ", weight " + shape_string(wd) + " and bias " +
                      shape_string(bd) + ": expected x [rows, in], weight [in, out] and bias [out]");
  return matmul(x, w) + b;
}

// LoRA (PEFT's form): x.w0 + scale * (x.a).b with a [in, r], b [r, out];
// the sum and the scaling one add_scaled node.
// w0 is typically a frozen constant and a, b the only parameters; with PEFT's
// initialisation (b = 0) the layer starts as exactly x.w0.
template <class T>
Var<T> lora_linear(Var<T> x, Var<T> w0, Var<T> a, Var<T> b, std::type_identity_t<T> scale) {
  Tape<T>& tp = grad::detail::tape_of("nn::lora_linear", x);
  if (!tp.accept("nn::lora_linear", {x, w0, a, b})) return tp.rejected();
  const Dims &xd = tp.dims(x), &wd = tp.dims(w0), &ad = tp.dims(a), &bd = tp.dims(b);
  // Messages are built only on failure: this runs on every training step.
  auto shapes = [&] {
    return "nn::lora_linear: x " + shape_string(xd) + ", w0 " + shape_string(wd) + ", A " + shape_string(ad) + ", B " +
           shape_string(bd);
  };
  if (!detail::is_matrix(xd) || !detail::is_matrix(wd) || xd[1] != wd[0])
    return tp.invalid(shapes() + ": expected x [rows, in] and w0 [in, out]");
  if (!detail::is_matrix(ad) || !detail::is_matrix(bd) || ad[1] != bd[0])
    return tp.invalid(shapes() + ": mismatched adapter ranks, expected A [in, r] and B [r, out] with the same r");
  if (ad[0] != wd[0] || bd[1] != wd[1])
    return tp.invalid(shapes() + ": expected A [" + detail::num(wd[0]) + ", r] and B [r, " + detail::num(wd[1]) +
                      "] to match w0");
  NameScope<T> scope(tp, "lora");
  return add_scaled(matmul(x, w0), matmul(matmul(x, a), b), scale);
}

// x / sqrt(mean(x^2 over the row) + eps) * w, with w [cols]: one rms_norm
// node (tags/rms_norm.hpp), the bits of row_sum(x * x) / cols + eps, sqrt,
// x / r, * w as separate ops (its gradients too, unless x has a later
// consumer: then the association of x's gradient sum differs, see there).
template <class T>
Var<T> rmsnorm(Var<T> x, Var<T> w, std::type_identity_t<T> eps) {
  Tape<T>& tp = grad::detail::tape_of("nn::rmsnorm", x);
  if (!tp.accept("nn::rmsnorm", {x, w})) return tp.rejected();
  const Dims &xd = tp.dims(x), &wd = tp.dims(w);
  if (!detail::is_matrix(xd) || !detail::is_vector(wd, xd[1]))
    return tp.invalid("nn::rmsnorm: x " + shape_string(xd) + " and weight " + shape_string(wd) +
                      ": expected x [rows, cols] and weight [cols]");
  NameScope<T> scope(tp, "rmsnorm");
  return rms_norm(x, w, eps);
}

// (x - mean) / sqrt(var + eps) * w + b over each row (biased variance, as
// torch.nn.LayerNorm), with w and b [cols]: one layer_norm node for the
// normalisation (the bits of its nine-op composite; tags/layer_norm.hpp),
// then * w + b.
template <class T>
Var<T> layernorm(Var<T> x, Var<T> w, Var<T> b, std::type_identity_t<T> eps) {
  Tape<T>& tp = grad::detail::tape_of("nn::layernorm", x);
  if (!tp.accept("nn::layernorm", {x, w, b})) return tp.rejected();
  const Dims &xd = tp.dims(x), &wd = tp.dims(w), &bd = tp.dims(b);
  if (!detail::is_matrix(xd) || !detail::is_vector(wd, xd[1]) || !detail::is_vector(bd, xd[1]))
    return tp.invalid("nn::layernorm: x " + shape_string(xd) + ", weight " + shape_string(wd) + " and bias " +
                      shape_string(bd) + ": expected x [rows, cols], weight [cols] and bias [cols]");
  NameScope<T> scope(tp, "layernorm");
  return layer_norm(x, eps) * w + b;
}

// x * sigmoid(x)
template <class T>
Var<T> silu(Var<T> x) {
  Tape<T>& tp = grad::detail::tape_of("nn::silu", x);
  if (!tp.accept("nn::silu", {x})) return tp.rejected();
  return x * sigmoid(x);
}

// silu(gate) * up: the gated unit of a SwiGLU MLP, one silu_mul node (the
// bits of silu(gate) * up).
template <class T>
Var<T> swiglu(Var<T> gate, Var<T> up) {
  Tape<T>& tp = grad::detail::tape_of("nn::swiglu", gate);
  if (!tp.accept("nn::swiglu", {gate, up})) return tp.rejected();
  if (!(tp.dims(gate) == tp.dims(up)))
    return tp.invalid("nn::swiglu: gate " + shape_string(tp.dims(gate)) + " and up " + shape_string(tp.dims(up)) +
                      ": expected the same shape");
  NameScope<T> scope(tp, "swiglu");
  return silu_mul(gate, up);
}

// The tape's softmax along one axis (ops.hpp), under the nn name.
using grad::softmax;

template <class T>
struct RopeTables {
  Tensor<T> cos, sin;  // [t, head_dim] each
};

// Rotary tables in the NEOX half-split layout: column j and j + head_dim/2
// both hold position p's angle p * theta_j, theta_j = 1 / base^(2j/head_dim)
// (the form Hugging Face computes inv_freq in). Put them on the tape as
// constants and pass them to rope / gqa_attention.
// T is deduced from base: pass 10000.0 (double) or 10000.0f (float).
template <Scalar T>
RopeTables<T> rope_tables(std::size_t t, std::size_t head_dim, T base) {
  if (t == 0 || head_dim == 0 || head_dim % 2 != 0)
    throw std::invalid_argument("nn::rope_tables: t " + detail::num(t) + ", head_dim " + detail::num(head_dim) +
                                ": expected t >= 1 and an even head_dim >= 2 (RoPE rotates pairs of columns)");
  const std::size_t half = head_dim / 2;
  RopeTables<T> r{Tensor<T>({t, head_dim}), Tensor<T>({t, head_dim})};
  for (std::size_t j = 0; j < half; ++j) {
    const T inv_freq = T(1) / std::pow(base, static_cast<T>(2 * j) / static_cast<T>(head_dim));
    for (std::size_t p = 0; p < t; ++p) {
      const T angle = static_cast<T>(p) * inv_freq;
      r.cos[p * head_dim + j] = r.cos[p * head_dim + j + half] = std::cos(angle);
      r.sin[p * head_dim + j] = r.sin[p * head_dim + j + half] = std::sin(angle);
    }
  }
  return r;
}

// Rotary embedding of one head h [t, head_dim]: h * cos + rotate_half(h) * sin,
// rotate_half(h) = [-h2, h1] for h = [h1, h2] split at head_dim / 2.
template <class T>
Var<T> rope(Var<T> h, Var<T> cos, Var<T> sin) {
  Tape<T>& tp = grad::detail::tape_of("nn::rope", h);
  if (!tp.accept("nn::rope", {h, cos, sin})) return tp.rejected();
  const Dims &hd = tp.dims(h), &cd = tp.dims(cos), &sd = tp.dims(sin);
  if (!detail::is_matrix(hd) || hd[1] % 2 != 0 || !(cd == hd) || !(sd == hd))
    return tp.invalid("nn::rope: head " + shape_string(hd) + ", cos " + shape_string(cd) + ", sin " + shape_string(sd) +
                      ": expected a head [t, head_dim] with an even head_dim and cos, sin of the same shape");
  const std::size_t t = hd[0], width = hd[1], half = width / 2;
  NameScope<T> scope(tp, "rope");
  Var<T> rotated = concat(-slice(h, {0, half}, {t, width}), slice(h, {0, 0}, {t, half}), 1);
  return h * cos + rotated * sin;
}

// Columns [index * head_dim, (index + 1) * head_dim) of a [t, n * head_dim] projection.
template <class T>
Var<T> head(Var<T> q, std::size_t index, std::size_t head_dim) {
  Tape<T>& tp = grad::detail::tape_of("nn::head", q);
  if (!tp.accept("nn::head", {q})) return tp.rejected();
  const Dims& qd = tp.dims(q);
  if (!detail::is_matrix(qd) || head_dim == 0 || qd[1] % head_dim != 0 || index >= qd[1] / head_dim)
    return tp.invalid("nn::head: head " + detail::num(index) + " of width " + detail::num(head_dim) + " from " +
                      shape_string(qd) + ": expected [t, n * head_dim] with index < n");
  return slice(q, {0, index * head_dim}, {qd[0], (index + 1) * head_dim});
}

// [t, t]: 0 on and below the diagonal, -1e9 above. Added to attention scores
// it sends a masked position's softmax weight to exactly zero (exp underflows
// in f32 and f64) while score + mask stays finite.
template <Scalar T = double>
Tensor<T> causal_mask(std::size_t t) {
  if (t == 0) throw std::invalid_argument("nn::causal_mask: t 0: expected at least one position");
  Tensor<T> m({t, t});
  for (std::size_t i = 0; i < t; ++i)
    for (std::size_t j = i + 1; j < t; ++j) m[i * t + j] = T(-1e9);
  return m;
}

// Grouped-query attention over one sequence: q [t, n_heads * head_dim],
// k and v [t, n_kv_heads * head_dim]; query head i reads key/value head
// i / (n_heads / n_kv_heads). Per head: RoPE on q and k, scores
// q.k^T / sqrt(head_dim) + mask, softmax over keys, times v. Returns the
// heads' contexts side by side, [t, n_heads * head_dim].
template <class T>
Var<T> gqa_attention(Var<T> q, Var<T> k, Var<T> v, Var<T> cos, Var<T> sin, Var<T> mask, std::size_t n_heads,
                     std::size_t n_kv_heads, std::size_t head_dim) {
  Tape<T>& tp = grad::detail::tape_of("nn::gqa_attention", q);
  if (!tp.accept("nn::gqa_attention", {q, k, v, cos, sin, mask})) return tp.rejected();
  const std::string_view layer = "nn::gqa_attention: ";
  if (n_heads == 0 || n_kv_heads == 0 || n_heads % n_kv_heads != 0)
    return tp.invalid(
        std::string(layer) + "n_heads " + detail::num(n_heads) + " and n_kv_heads " + detail::num(n_kv_heads) +
        ": expected n_kv_heads >= 1 dividing n_heads (each key/value head serves a whole group of query heads)");
  if (head_dim == 0 || head_dim % 2 != 0)
    return tp.invalid(std::string(layer) + "head_dim " + detail::num(head_dim) +
                      ": expected an even head_dim (RoPE rotates pairs)");
  // The widths q and k must have; a product that wraps around would let a
  // huge head count pass the shape check below.
  std::size_t q_width = 0, kv_width = 0;
  if (__builtin_mul_overflow(n_heads, head_dim, &q_width) || __builtin_mul_overflow(n_kv_heads, head_dim, &kv_width))
    return tp.invalid(std::string(layer) + detail::num(n_heads) + " heads (" + detail::num(n_kv_heads) +
                      " kv heads) of width " + detail::num(head_dim) + ": the total width overflows");
  const Dims &qd = tp.dims(q), &kd = tp.dims(k), &vd = tp.dims(v);
  const std::size_t t = qd.rank == 2 ? qd[0] : 0;
  if (!detail::is_matrix(qd, t, q_width) || !detail::is_matrix(kd, t, kv_width) || !(vd == kd) || t == 0)
    return tp.invalid(std::string(layer) + "q " + shape_string(qd) + ", k " + shape_string(kd) + ", v " +
                      shape_string(vd) + " with " + detail::num(n_heads) + " heads, " + detail::num(n_kv_heads) +
                      " kv heads of width " + detail::num(head_dim) + ": expected q [t, " + detail::num(q_width) +
                      "], k and v [t, " + detail::num(kv_width) + "]");
  const Dims &cd = tp.dims(cos), &sd = tp.dims(sin), &md = tp.dims(mask);
  if (!detail::is_matrix(cd, t, head_dim) || !(sd == cd) || !detail::is_matrix(md, t, t))
    return tp.invalid(std::string(layer) + "cos " + shape_string(cd) + ", sin " + shape_string(sd) + ", mask " +
                      shape_string(md) + ": expected cos and sin [" + detail::num(t) + ", " + detail::num(head_dim) +
                      "] and mask [" + detail::num(t) + ", " + detail::num(t) + "]");

  const std::size_t group = n_heads / n_kv_heads;
  const T scale = T(1) / std::sqrt(static_cast<T>(head_dim));
  NameScope<T> scope(tp, "attention");
  // Query heads of one group are consecutive, so each key/value head is
  // rotated and transposed once, when its group starts.
  // The loop stops as soon as the tape is poisoned: what it would record
  // after that is nothing, n_heads times over.
  Var<T> keys_t, values, context;
  for (std::size_t i = 0; i < n_heads && tp.ok(); ++i) {
    if (i % group == 0) {
      keys_t = transpose(rope(head(k, i / group, head_dim), cos, sin));
      values = head(v, i / group, head_dim);
    }
    Var<T> scores = matmul(rope(head(q, i, head_dim), cos, sin), keys_t) * scale + mask;
    Var<T> out = matmul(softmax(scores, -1), values);
    context = i == 0 ? out : concat(context, out, 1);
  }
  return tp.ok() ? context : tp.rejected();
}

namespace detail {

// nn::attention's recording, for operands it has checked (nn::Lm's, whose
// config is checked once; it records under its own "attention" scope).
// The layouts are one node each (heads.hpp): q and k to heads-major with
// RoPE on the way (cos and sin joined into one [2, t, hd] table, a few
// thousand elements, once per call), v to heads-major, the context back to
// rows. Values and every gradient of q, k and v are the bits of the
// composite they replace (reshapes and transposes; RoPE as h * cos +
// rotate_half(h) * sin by slice, neg, concat, mul and add). A trainable
// cos or sin gets the right gradient, summed in another order.
template <class T>
Var<T> causal_attention(Var<T> q, Var<T> k, Var<T> v, std::size_t batch, std::size_t t, std::size_t heads,
                        std::size_t kv_heads, std::size_t head_dim, Var<T> cos, Var<T> sin) {
  const bool rotary = cos.valid();
  const std::size_t group = heads / kv_heads, N = batch * kv_heads;
  Var<T> q3, k3;
  if (rotary) {
    const Var<T> table = concat(reshape(cos, {1, t, head_dim}), reshape(sin, {1, t, head_dim}), 0);
    q3 = rope_heads_major(q, table);
    k3 = rope_heads_major(k, table);
  } else {
    q3 = heads_major(q, batch, heads);
    k3 = heads_major(k, batch, kv_heads);
  }
  Var<T> v3 = heads_major(v, batch, kv_heads);
  const T scale = T(1) / std::sqrt(static_cast<T>(head_dim));
  // [batch*heads, t, hd] is [N, group*t, hd]: a group's query heads are consecutive.
  Var<T> probs = causal_attention_probs(reshape(q3, {N, group * t, head_dim}), k3, scale);
  return rows_major(reshape(attention_context(probs, v3), {batch * heads, t, head_dim}), batch);
}

}  // namespace detail

// Causal attention over a batch of sequences, multi-head (kv_heads ==
// heads) or grouped-query (each key/value head serves heads / kv_heads
// consecutive query heads): q [batch*t, heads*head_dim], k and v
// [batch*t, kv_heads*head_dim], rows batch-major; returns the heads'
// contexts side by side, [batch*t, heads*head_dim]. With cos and sin
// ([t, head_dim], rope_tables) q and k are rotated first; pass
// default-constructed Vars for no RoPE. Scale 1 / sqrt(head_dim).
//
// Recorded fused: one causal_attention_probs node (the probabilities are
// the only [heads, t, t] tensor kept; no mask, no repeated keys or values)
// and one attention_context node. The bits are those of the unfused
// recording it replaced (softmax(bmm(q, k^T) * scale + causal_mask) . v
// with k and v repeated per query head by concat), gradients included.
template <class T>
Var<T> attention(Var<T> q, Var<T> k, Var<T> v, std::size_t batch, std::size_t heads, std::size_t kv_heads,
                 Var<T> cos = {}, Var<T> sin = {}) {
  Tape<T>& tp = grad::detail::tape_of("nn::attention", q);
  const bool rotary = cos.valid() || sin.valid();
  if (!(rotary ? tp.accept("nn::attention", {q, k, v, cos, sin}) : tp.accept("nn::attention", {q, k, v})))
    return tp.rejected();
  const std::string_view layer = "nn::attention: ";
  if (batch == 0 || heads == 0 || kv_heads == 0 || heads % kv_heads != 0)
    return tp.invalid(std::string(layer) + "batch " + detail::num(batch) + ", heads " + detail::num(heads) +
                      ", kv_heads " + detail::num(kv_heads) +
                      ": expected batch >= 1 and kv_heads >= 1 dividing heads (each key/value head serves a whole "
                      "group of query heads)");
  const Dims &qd = tp.dims(q), &kd = tp.dims(k), &vd = tp.dims(v);
  const std::size_t rows = qd.rank == 2 ? qd[0] : 0, head_dim = qd.rank == 2 ? qd[1] / heads : 0;
  const std::size_t t = rows / batch;
  if (!detail::is_matrix(qd) || rows == 0 || rows % batch != 0 || head_dim == 0 || qd[1] % heads != 0 ||
      !detail::is_matrix(kd, rows, kv_heads * head_dim) || !(vd == kd))
    return tp.invalid(std::string(layer) + "q " + shape_string(qd) + ", k " + shape_string(kd) + ", v " +
                      shape_string(vd) + " with batch " + detail::num(batch) + ", " + detail::num(heads) + " heads, " +
                      detail::num(kv_heads) + " kv heads: expected q [batch*t, heads*head_dim] with head_dim >= 1, " +
                      "k and v [batch*t, kv_heads*head_dim]");
  if (rotary) {
    const Dims &cd = tp.dims(cos), &sd = tp.dims(sin);
    if (head_dim % 2 != 0 || !detail::is_matrix(cd, t, head_dim) || !(sd == cd))
      return tp.invalid(std::string(layer) + "cos " + shape_string(cd) + ", sin " + shape_string(sd) +
                        " with head_dim " + detail::num(head_dim) + ": expected an even head_dim and cos and sin [" +
                        detail::num(t) + ", " + detail::num(head_dim) + "]");
  }
  NameScope<T> scope(tp, "attention");
  return detail::causal_attention(q, k, v, batch, t, heads, kv_heads, head_dim, cos, sin);
}

// Mean over rows of -log(softmax(logits)[target]) with one-hot targets, both
// [rows, V]. Computed as -log(row_sum(softmax(logits) * onehot)): the
// softmax op subtracts the row maximum, so large logits cannot overflow. The
// targets are checked to be one-hot when recorded (soft labels would need
// sum(y * log p), which this is not). Class ids instead of one-hot rows:
// grad::cross_entropy_labels (host labels) or grad::cross_entropy_ids (a Var).
template <class T>
Var<T> cross_entropy_onehot(Var<T> logits, Var<T> onehot) {
  Tape<T>& tp = grad::detail::tape_of("nn::cross_entropy_onehot", logits);
  if (!tp.accept("nn::cross_entropy_onehot", {logits, onehot})) return tp.rejected();
  const Dims &ld = tp.dims(logits), &od = tp.dims(onehot);
  if (!detail::is_matrix(ld) || !(od == ld))
    return tp.invalid("nn::cross_entropy_onehot: logits " + shape_string(ld) + " and one-hot targets " +
                      shape_string(od) + ": expected logits [rows, V] and targets of the same shape");
  const View<T> y = tp.value(onehot);
  for (std::size_t r = 0; r < ld[0]; ++r) {
    std::size_t ones = 0;
    bool binary = true;
    for (std::size_t j = 0; j < ld[1]; ++j) {
      const T e = y[r * ld[1] + j];
      ones += e == T(1);
      binary = binary && (e == T(0) || e == T(1));
    }
    if (!binary || ones != 1)
      return tp.invalid("nn::cross_entropy_onehot: row " + detail::num(r) + " of the targets " + shape_string(od) +
                        " is not one-hot: expected exactly one 1 and zeros elsewhere");
  }
  NameScope<T> scope(tp, "cross_entropy");
  return -mean(grad::log(row_sum(softmax(logits, -1) * onehot)));
}
// The older name of cross_entropy_onehot.
template <class T>
Var<T> cross_entropy(Var<T> logits, Var<T> onehot) {
  return cross_entropy_onehot(logits, onehot);
}

// cross_entropy over the first `keep` rows of logits and targets (next-token
// training: position p predicts token p + 1, so the last position has no
// target). Both may have more rows than keep; the rest are ignored.
template <class T>
Var<T> cross_entropy_rows(Var<T> logits, Var<T> onehot, std::size_t keep) {
  Tape<T>& tp = grad::detail::tape_of("nn::cross_entropy_rows", logits);
  if (!tp.accept("nn::cross_entropy_rows", {logits, onehot})) return tp.rejected();
  const Dims &ld = tp.dims(logits), &od = tp.dims(onehot);
  if (!detail::is_matrix(ld) || !detail::is_matrix(od) || od[1] != ld[1])
    return tp.invalid("nn::cross_entropy_rows: logits " + shape_string(ld) + " and one-hot targets " +
                      shape_string(od) + ": expected logits [rows, V] and targets [rows', V] of the same width V");
  if (keep == 0 || keep > ld[0] || keep > od[0])
    return tp.invalid("nn::cross_entropy_rows: keep " + detail::num(keep) + " rows of logits " + shape_string(ld) +
                      " and targets " + shape_string(od) + ": expected 1 <= keep <= the rows of both");
  // By value: recording the first slice may move the tape's node storage under ld.
  const std::size_t vocab = ld[1];
  auto first_rows = [&](Var<T> m) { return tp.dims(m)[0] == keep ? m : slice(m, {0, 0}, {keep, vocab}); };
  return cross_entropy_onehot(first_rows(logits), first_rows(onehot));
}

}  // namespace grad::nn
