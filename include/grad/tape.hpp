// Tape<T>: the single-owner arena a define-by-run program records into, and
// Var<T>, the small handle to one recorded node. A node is plain data
// {op, a, b, scalar, axis/extra, dims, value, grad}; values and gradients
// live in two chunked arenas that mark/reset rewind without freeing.
//
// The class is one piece (its members share its private state); around it:
// tape/node.hpp (Node, Var, View), tape/recompute_scopes.hpp (the members
// behind recompute scopes), inspect/tape_hooks.hpp (anomaly detection,
// profiling, NameScope) and backward.hpp (the reverse walk).
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "grad/arena.hpp"
#include "grad/first_fit.hpp"
#include "grad/inspect/hooks.hpp"
#include "grad/tape/node.hpp"
#include "grad/tags/op_list.hpp"
#include "grad/tensor.hpp"
#include "grad/warn.hpp"

namespace grad {

// tp.backward(loss, grad::accumulate): add this loss's gradients to the
// parameters' gradients instead of replacing them (Tape::backward).
struct Accumulate {};
inline constexpr Accumulate accumulate{};
// tp.reset_to(m, grad::keep_gradients): drop the nodes after m but keep the
// gradients the survivors (the parameters) hold, between accumulated micro-batches.
struct KeepGradients {};
inline constexpr KeepGradients keep_gradients{};
// tp.reset_to(m, grad::drop_gradients): a plain reset_to that says so: the
// gradients no step used are dropped on purpose (a skipped batch), and the
// next backward does not warn that a sum was lost (torch's zero_grad()).
struct DropGradients {};
inline constexpr DropGradients drop_gradients{};

// Backward calls in a row, each after the tape grew by about the same number
// of nodes with no reset_to in between, after which the tape warns (once)
// that it is growing without bound. A training loop that forgets reset_to
// reaches it in its first ten steps; a program that records a few episodes
// on purpose (or accumulates micro-batches without resetting) does not.
inline constexpr std::uint32_t growth_warning_runs = 8;

// What a tape in exception mode (Tape::throw_on_error(true)) throws when it is
// poisoned: the same message error() keeps.
struct TapeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class T>
class Tape {
  static_assert(is_tape_scalar_v<T>, "Tape<T> is for T = float or double (or grad::Dual of one: grad/dual.hpp)");

 public:
  // A tape state: its node count and the serial of its last node, which
  // together identify it (serials are never reused), plus the arena positions
  // to rewind to.
  struct Mark {
    const Tape* tape = nullptr;
    std::size_t nodes = 0, extras = 0;
    std::uint64_t last_serial = 0;  // 0 for a mark on an empty tape
    typename Arena<T>::Position values, grads;
  };

  Tape() = default;
  Tape(const Tape&) = delete;  // Vars point at their tape
  Tape& operator=(const Tape&) = delete;

  Var<T> param(const Tensor<T>& t) { return leaf<Param>(t); }
  Var<T> constant(const Tensor<T>& t) { return leaf<Const>(t); }
  // A constant held in 16 bits (Storage::bf16 or Storage::f16): half a
  // float's memory, each value rounded to the nearest bfloat16 or half (ties
  // to even, as PyTorch's .to(torch.bfloat16) / .to(torch.float16)). A
  // frozen base model's weights: the ops that read it widen it exactly
  // (matmul's and matmul_nt's b, embedding's table, linear_cross_entropy's
  // weights), so
  // they give the bits of the same ops over a T constant holding the widened
  // values; any other op refuses it (poisons the tape), as do the device
  // engine and grad::emit. value() and leaf_value() read it as empty:
  // widened_value() copies it out as T, leaf_bits() writes its bits.
  //
  // Quantized (Storage::q8_0 ... q6_k, llama.cpp's blocks: numerics/quant.hpp)
  // a matrix is rounded as ggml's reference quantizers round it, each memory
  // row into whole blocks (the rows' length a multiple of 32 or 256), and
  // read by the same ops (matmul's and matmul_nt's b, embedding's table,
  // linear_cross_entropy's weights), dequantized exactly. `transposed` holds
  // the matrix [in, out] as its transpose, llama.cpp's [out, in]: one row of
  // blocks per output (quantized matrices only). The memory rows lie in
  // groups of sixteen, interleaved (numerics/quant_rows.hpp: a decoding
  // step's vector lanes are sixteen outputs); put_row_blocks into
  // leaf_blocks() writes a file's rows of blocks as they are.
  Var<T> constant(const Tensor<T>& t, Storage storage, bool transposed = false) {
    return storage == Storage::native && !transposed ? leaf<Const>(t) : leaf<Const>(t, storage, transposed);
  }

  // A constant of zeros held as `storage` (native, 16-bit or quantized
  // blocks of zeros), for a loader to fill through leaf_value, leaf_bits or
  // leaf_blocks: no tensor of T on the way (a 7B base's matrices never are).
  // Refused as constant(t, storage, transposed) refuses.
  Var<T> held_constant(const Shape& shape, Storage storage, bool transposed = false) {
    return leaf<Const>(Tensor<T>(), storage, transposed, &shape);
  }

  // Gradients of `loss` (one element) with respect to every node; previous
  // gradients are cleared first (not summed, as PyTorch's would be: with an
  // optimizer on the tape, a second backward whose predecessor's gradients
  // no step used warns once). Defined in backward.hpp.
  bool backward(Var<T> loss);
  // Gradient accumulation over micro-batches: the same walk, then each
  // parameter's gradient (a tp.param leaf) is the sum, acc = acc + g_k per
  // element in call order, of this call's gradient and those before it (each
  // g_k the bits a plain backward gives). A step() or a plain reset_to
  // empties the sum; a plain backward replaces it. Other nodes hold this
  // call's gradient alone. Between micro-batches
  // reset_to(m, grad::keep_gradients) frees their nodes and keeps the sums:
  //
  //   for (std::size_t k = 0; k < micro_batches; ++k) {
  //     tp.reset_to(m, grad::keep_gradients);        // not a plain reset_to, which empties the sum
  //     tp.backward(loss_of(k), grad::accumulate);   // recorded after the mark m
  //   }
  //   opt.step();                                    // the sum's step; the next accumulate starts afresh
  //
  // Scale each loss by 1 / micro_batches for the mean over the whole batch.
  // A backward (either form) after a plain reset_to that dropped gradients
  // no step used, with an optimizer on the tape, warns once that the step
  // will see one micro-batch, naming keep_gradients (and drop_gradients,
  // for a drop on purpose).
  bool backward(Var<T> loss, Accumulate);

  // Queries never poison: an invalid, foreign or dropped Var reads as empty
  // (scalar reads NaN). value() reads a 16-bit constant as empty too: its
  // elements are not T (widened_value copies them out).
  // A node recorded inside a recompute scope and not returned from it reads
  // as empty too: its value is not kept.
  View<T> value(Var<T> v) const {
    const Node<T>* n = find(v);
    if (!n || n->transient || n->storage != Storage::native) return {};
    return {n->dims.span(), {n->value, n->dims.size()}};
  }
  View<T> grad(Var<T> v) const {
    const Node<T>* n = find(v);
    if (!n || n->transient) return {};
    if (n->touched) return {n->dims.span(), {n->grad, n->dims.size()}};
    return {n->dims.span(), {zeros(n->dims.size()), n->dims.size()}};
  }
  T scalar(Var<T> v) const {
    const Node<T>* n = find(v);
    if (!n || n->transient) return std::numeric_limits<T>::quiet_NaN();
    return n->value_at(0);
  }
  // How v's value is held (native for an invalid, foreign or dropped Var).
  Storage storage(Var<T> v) const {
    const Node<T>* n = find(v);
    return n ? n->storage : Storage::native;
  }
  // Whether v is a quantized matrix held as its transpose (constant(t, s, true)).
  bool transposed(Var<T> v) const {
    const Node<T>* n = find(v);
    return n && n->transposed;
  }
  // v's value as a tensor of T: a copy of what value() reads, or a 16-bit
  // constant's values widened (exactly). Empty where value() is.
  Tensor<T> widened_value(Var<T> v) const {
    const Node<T>* n = find(v);
    if (!n || n->transient) return {};
    Tensor<T> t(Shape(n->dims.span().begin(), n->dims.span().end()));
    if (n->transposed) {  // memory row j (one per column of [rows, cols]) dequantized, then put in its column
      const std::size_t rows = n->dims.d[0], cols = n->dims.d[1];
      std::vector<T> row(rows);
      for (std::size_t j = 0; j < cols; ++j) {
        read_held(n->storage, n->value, cols, rows, j * rows, rows, row.data());
        for (std::size_t i = 0; i < rows; ++i) t[i * cols + j] = row[i];
      }
    } else if (narrow(n->storage)) {
      read_held(n->storage, n->value, t.size() / n->held_row(), n->held_row(), 0, t.size(), t.data().data());
    } else {
      std::copy_n(n->value, t.size(), t.data().begin());
    }
    return t;
  }
  // Writable bits of a 16-bit constant (loading a checkpoint's BF16 or F16
  // tensors as they are); empty for any other node.
  std::span<std::uint16_t> leaf_bits(Var<T> v) {
    const Node<T>* n = find(v);
    if (!n || !sixteen_bit(n->storage)) return {};
    return {reinterpret_cast<std::uint16_t*>(n->value), n->dims.size()};
  }
  // A quantized constant's blocks rounded again from `values` in memory
  // order (its transpose's, row-major, when transposed(v)): "" or why not,
  // the blocks then unchanged. Loading a checkpoint's values into a
  // quantized base.
  std::string store_held(Var<T> v, std::span<const T> values) {
    const Node<T>* n = find(v);
    if (!n || !quantized(n->storage)) return "store_held: not a quantized constant of this tape";
    if (values.size() != n->dims.size())
      return "store_held: " + std::to_string(values.size()) + " values for " + shape_string(n->dims);
    const std::span<std::uint8_t> blocks = leaf_blocks(v);
    const std::vector<std::uint8_t> before(blocks.begin(), blocks.end());
    const std::size_t row = n->held_row();
    std::string why = quantize_rows(*n, [&](std::size_t r, std::size_t c) { return values[r * row + c]; });
    if (!why.empty()) std::copy(before.begin(), before.end(), blocks.begin());
    return why;
  }
  // Writable blocks of a quantized constant, in memory order (its
  // transpose's rows when transposed(v)), laid out as held_rows(v) says
  // (numerics/quant_rows.hpp: put_row_blocks and get_row_blocks move a row
  // of ggml's blocks in and out): loading a GGUF's tensor as it is. Empty
  // for any other node.
  std::span<std::uint8_t> leaf_blocks(Var<T> v) {
    const Node<T>* n = find(v);
    if (!n || !quantized(n->storage)) return {};
    return {reinterpret_cast<std::uint8_t*>(n->value), held_bytes(n->storage, n->dims.size(), sizeof(T))};
  }
  // How a quantized constant's memory rows lie (format, rows, their
  // length); no rows for any other node.
  QuantRows held_rows(Var<T> v) const {
    const Node<T>* n = find(v);
    if (!n || !quantized(n->storage)) return {QuantFormat::q8_0, 0, 0};
    return {quant_format(n->storage), n->dims.size() / n->held_row(), n->held_row()};
  }

  // Was v recorded by op Op? (False for an invalid, foreign or dropped Var.)
  template <class Op>
  bool recorded_by(Var<T> v) const {
    const Node<T>* n = find(v);
    return n && n->op == op_code<Op>;
  }
  bool requires_grad(Var<T> v) const {
    const Node<T>* n = find(v);
    return n && n->requires_grad;
  }
  // Freezes (false) or unfreezes (true) a parameter, like torch's
  // requires_grad_: a frozen parameter gets no gradient, so ops recorded on
  // it afterwards hold no gradient buffer and do no backward work unless
  // another parameter is upstream, and optimizers skip it (has_grad stays
  // false). Freeze between episodes (after reset_to): nodes recorded before
  // keep the gradient buffers they were given. Poisons the tape for a node
  // that is not a live parameter.
  bool set_requires_grad(Var<T> v, bool on) {
    if (!accept("set_requires_grad", {v})) return false;
    Node<T>& n = nodes_[v.index_];
    if (n.op != op_code<Param>)
      return fail("set_requires_grad: node " + std::to_string(v.index_) + " is a '" + std::string(op_name(n.op)) +
                  "' node; only parameters (tp.param) can be frozen or unfrozen");
    n.requires_grad = on;  // a parameter's gradient buffer exists from its creation either way
    if (!on) n.touched = false;
    return true;
  }
  // Did the latest backward reach this node? Optimizers skip parameters it did not.
  bool has_grad(Var<T> v) const {
    const Node<T>* n = find(v);
    return n && n->touched;
  }
  // Writable value of a parameter or constant (optimizers, checkpoints, new
  // minibatch rows). Empty for a computed node: its value is a function of its inputs.
  std::span<T> leaf_value(Var<T> v) {
    const Node<T>* n = find(v);
    if (!n || (n->op != op_code<Param> && n->op != op_code<Const>) || n->storage != Storage::native) return {};
    return {n->value, n->dims.size()};
  }

  // Exception mode (off by default): when on, the first error also throws
  // grad::TapeError with the message error() keeps, from the op (or
  // backward, or optimizer call) that found it. The tape is poisoned either
  // way; the exception only changes how the caller hears about it.
  void throw_on_error(bool on) { throw_ = on; }
  bool throws_on_error() const { return throw_; }

  // Inference mode (see InferenceGuard below): while on, ops record values
  // but no gradient buffers and no backward work; backward is refused.
  bool inference_mode() const { return inference_depth_ > 0; }

  // Inspection (docs/inspect.md). Anomaly detection: after each op and each
  // backward step, a non-finite value or gradient poisons the tape naming the
  // node that made it (anomaly()). Profiling: each op and backward step is
  // timed into inspection().events. Both off by default.
  void detect_anomalies(bool on) { set_watch(inspect_detail::watch_anomalies, on); }
  bool detects_anomalies() const { return (watch_ & inspect_detail::watch_anomalies) != 0; }
  void profile(bool on) {
    if (on && !profiling()) inspection_.epoch = std::chrono::steady_clock::now();
    set_watch(inspect_detail::watch_profile, on);
  }
  bool profiling() const { return (watch_ & inspect_detail::watch_profile) != 0; }
  const Anomaly* anomaly() const { return inspection_.has_anomaly ? &inspection_.anomaly : nullptr; }
  const TapeInspection& inspection() const { return inspection_; }
  void clear_profile() { inspection_.events.clear(); }
  // The NameScope path (e.g. "encoder.0") open when node i was recorded; "" for none.
  const std::string& scope_name(std::size_t node) const {
    return inspection_.scopes.names[inspection_.scopes.of(node)];
  }
  // Bytes the value and gradient arenas have reserved: their high-water mark
  // (rewinding keeps every chunk).
  std::size_t arena_bytes() const { return (values_.reserved() + grads_.reserved()) * sizeof(T) + recompute_bytes(); }
  // Of those, the bytes recompute scopes share: the largest pass through a
  // scope, its values (and in backward's replay, its gradients by lifetime);
  // every scope reuses the same memory.
  std::size_t recompute_bytes() const { return scope_memory_.reserved() * sizeof(T); }
  // Bytes the value and gradient arenas hold for the nodes recorded so far
  // (leaves included): what reset_to a mark taken before them would free
  // (the chunks stay reserved), without the memory recompute scopes share.
  std::size_t bytes_in_use() const {
    return (values_.position().pass + grads_.position().pass) * sizeof(T);
  }
  // Transient nodes of recompute scopes whose values the latest backward
  // computed again: those some backward step reads, and what they are
  // computed from (the rest, a LoRA layer's down projection for one, it
  // leaves out).
  std::size_t recomputed_nodes() const { return recomputed_nodes_; }

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  std::size_t size() const { return nodes_.size(); }
  std::span<const Node<T>> nodes() const { return nodes_; }
  std::span<const std::size_t> extras() const { return extras_; }
  // Bytes of gradient buffers held by live nodes (frozen branches hold none).
  std::size_t grad_bytes() const {
    std::size_t n = 0;
    for (const Node<T>& node : nodes_)
      if (node.grad && !node.transient) n += node.dims.size() * sizeof(T);
    return n;
  }

  Mark mark() const {
    return {this,
            nodes_.size(),
            extras_.size(),
            nodes_.empty() ? 0 : nodes_.back().serial,
            values_.position(),
            grads_.position()};
  }

  // Drops every node recorded after m; the survivors' gradients read zero again;
  // all capacity is kept for the next episode. A stale mark (the tape was reset
  // below it since, so the state it names is gone) poisons the tape: rewinding
  // to it would hand live nodes' memory out again.
  // With an optimizer on the tape, dropping gradients no step used is noted:
  // the next backward warns (once per tape), since a loop that resets at the
  // top of every micro-batch steps on the last one alone.
  void reset_to(const Mark& m) {
    const bool unused = unused_gradients_ && optimizer_attached_;
    if (rewind(m)) {
      clear_gradients();
      unused_gradients_ = false;
      dropped_unused_ = dropped_unused_ || unused;
    }
  }
  // The same, keeping the survivors' gradients (between the micro-batches
  // of backward(loss, grad::accumulate)).
  void reset_to(const Mark& m, KeepGradients) { rewind(m); }
  // The plain reset_to, dropping unused gradients on purpose: no warning.
  void reset_to(const Mark& m, DropGradients) {
    if (rewind(m)) {
      clear_gradients();
      unused_gradients_ = false;
      dropped_unused_ = false;
    }
  }

  // ---- recompute scopes (grad/recompute.hpp, which documents them; defined in tape/recompute_scopes.hpp) ----
  // Opens one: until close_recompute, computed nodes get their value and
  // gradient from memory every scope reuses. False (poisoned) if one is open.
  bool open_recompute();
  // Closes the open scope: the outputs (nodes recorded inside it; others are
  // left as they are) get memory of their own and keep their values; every
  // other computed node recorded inside becomes transient. False (poisoned)
  // when an output is not a live node of this tape.
  bool close_recompute(std::span<const Var<T>> outputs);
  bool recompute_open() const { return open_scope_ != no_node; }

  // ---- what optimizers tell the tape (opt.hpp) ----
  // An optimizer holds parameters of this tape: from now on a backward that
  // replaces gradients no step used warns (the PyTorch habit of summing).
  void note_optimizer() { optimizer_attached_ = true; }
  // A step used the gradients: the next backward(loss, grad::accumulate) starts a new sum.
  // A step that skipped non-finite gradients (NonFinite::skip) consumed them too.
  void note_step() {
    unused_gradients_ = false;
    dropped_unused_ = false;
  }

  // "(node 3, a param [4, 8])" for a Var whose node was dropped by the latest
  // reset_to; "(node 3)" when an earlier reset dropped it.
  std::string dropped_description(Var<T> v) const {
    const auto at = std::lower_bound(dropped_.begin(), dropped_.end(), v.serial_,
                                     [](const Dropped& d, std::uint64_t serial) { return d.serial < serial; });
    std::string s = "(node " + std::to_string(v.index_);
    if (at != dropped_.end() && at->serial == v.serial_)
      s += ", " +
           std::string(at->op == op_code<Param>   ? "a param"
                       : at->op == op_code<Const> ? "a constant"
                                                  : "the output of " + std::string(op_name(at->op))) +
           " " + shape_string(at->dims);
    return s + ")";
  }

  // ---- recording interface, used by the op functions in ops.hpp ----

  // The first error wins; later ones would only describe its consequences.
  void poison(std::string message) {
    if (!error_.empty()) return;
    error_ = "grad: " + std::move(message);
    if (throw_) throw TapeError(error_);
  }

  // backward's refusal of inference-mode work ("" when allowed): a guard still
  // open, or a loss without a gradient path that was recorded under one or
  // computed from values that were (backward would silently leave every
  // gradient zero). A loss that also reaches a parameter outside the guard
  // (a frozen teacher's outputs as targets) is fine.
  std::string inference_refusal(Var<T> loss) const {
    if (inference_depth_ > 0)
      return "backward: the tape is in inference mode (an InferenceGuard is open); close the guard and record the "
             "loss again to train";
    const Node<T>* n = find(loss);
    if (n && n->inference && !n->requires_grad)
      return "backward: the loss (node " + std::to_string(loss.index_) +
             ") was computed in inference mode (under an InferenceGuard), so no gradient reaches a parameter; record "
             "it again outside the guard";
    return {};
  }

  // Checks that every operand is a live node of this tape; poisons otherwise.
  bool accept(std::string_view op, std::initializer_list<Var<T>> operands) {
    if (!ok()) return false;
    std::size_t k = 0;
    for (const Var<T>& v : operands) {
      ++k;
      auto which = [&] { return std::string(op) + ": operand " + std::to_string(k); };  // built only on failure
      if (!v.tape_) return fail(which() + " is a default-constructed Var (it belongs to no tape)");
      if (v.tape_ != this) return fail(which() + " belongs to a different tape");
      if (v.index_ >= nodes_.size() || nodes_[v.index_].serial != v.serial_)
        return fail(which() + " " + dropped_description(v) +
                    " was dropped by reset_to: a Var lives until the tape is reset below it. A parameter must be "
                    "created before the mark (take the mark after registering parameters); anything else, record again "
                    "after the reset");
      if (nodes_[v.index_].transient)
        return fail(which() + " (node " + std::to_string(v.index_) + ", the output of " +
                    std::string(op_name(nodes_[v.index_].op)) + " " + shape_string(nodes_[v.index_].dims) +
                    ") was recorded inside a recompute scope and is not one of its outputs, so its value was not "
                    "kept: return it from the scope's block");
    }
    return true;
  }

  const Dims& dims(Var<T> v) const { return nodes_[v.index_].dims; }

  // Appends one node of op Op and computes its value eagerly. Operands must
  // have passed accept() and the shapes the op's checks.
  // On a tape of dual numbers an op that does not carry a tangent
  // (carries_tangent) is refused here, by name, and none of its code is
  // instantiated for the dual type.
  template <class Op>
  Var<T> record(Var<T> a, Var<T> b, const Dims& out, T scalar = T(0), std::uint32_t axis = 0,
                std::span<const std::size_t> extra = {}) {
    if constexpr (!Scalar<T> && !carries_tangent<Op>) {
      return invalid(tangent_refusal(Op::name));
    } else {
      // A scalar operand is a constant there: a body may test its value
      // (pow's integral exponents) and would drop a tangent of its own.
      if constexpr (!Scalar<T>)
        if (tangent_of(scalar) != 0)
          return invalid(std::string(Op::name) +
                         ": the scalar operand carries a tangent; on a tape of dual numbers a scalar operand is a "
                         "constant (record a varying one as a tensor)");
      return record_node<Op>(a, b, out, scalar, axis, extra);
    }
  }
  template <class Op>
  Var<T> record_node(Var<T> a, Var<T> b, const Dims& out, T scalar, std::uint32_t axis,
                     std::span<const std::size_t> extra) {
    if (nodes_.size() >= no_node) return invalid(std::string(Op::name) + ": tape is full (2^32 - 1 nodes)");
    if (!checked_element_count(out.span()))
      return invalid(std::string(Op::name) + ": output shape " + shape_string(out) +
                     " has more elements than can be stored (at most " + std::to_string(max_elements) + ")");
    if (const std::string why = storage_refusal<Op>(a, b); !why.empty()) return invalid(why);
    Node<T> n;
    n.op = op_code<Op>;
    n.a = a.index_;
    n.b = b.index_;
    n.axis = axis;
    n.scalar = scalar;
    n.dims = out;
    n.requires_grad = (a.valid() && nodes_[n.a].requires_grad) || (b.valid() && nodes_[n.b].requires_grad);
    n.inference = (a.valid() && nodes_[n.a].inference) || (b.valid() && nodes_[n.b].inference);
    if (inference_depth_ > 0) {
      n.inference = true;
      n.requires_grad = false;  // no gradient buffer, so backward does no work below it
    }
    if (!allocate(n, Op::name, open_scope_ != no_node)) return rejected();
    replay_steps_[op_code<Op>] = &Tape::replay_node<Op>;
    replay_reads_[op_code<Op>] = {backward_reads<Op>(0), backward_reads<Op>(1)};
    if (!extra.empty()) {  // after the allocation, so that a failed one has nothing to undo
      n.extra = static_cast<std::uint32_t>(extras_.size());
      extras_.insert(extras_.end(), extra.begin(), extra.end());
    }
    if (watch_ != 0) [[unlikely]] {
      if constexpr (Scalar<T>)
        return record_watched<Op>(n);  // the same, timed and/or checked (inspect/tape_hooks.hpp)
      else
        return invalid(std::string(Op::name) + ": " + std::string(unwatched));
    }
    forward<Op>(forward_args(n), n.value);
    learn_backward<Op>();
    return push(n);
  }

  // Why Op is refused on a tape of dual numbers, naming the ops that are not.
  static std::string tangent_refusal(std::string_view op) {
    std::string carried;
    boost::mp11::mp_for_each<OpList>([&](auto tag) {
      using Tag = decltype(tag);
      if constexpr (Tag::arity > 0 && carries_tangent<Tag>)
        carried += (carried.empty() ? "" : ", ") + std::string(Tag::name);
    });
    return std::string(op) +
           ": cannot be recorded on a tape of dual numbers (Tape<grad::Dual<T>>, grad/dual.hpp): its bodies do not "
           "carry a tangent yet; the ops that do: " +
           carried;
  }
  static constexpr std::string_view unwatched =
      "anomaly detection and profiling are not available on a tape of dual numbers";

  // What an op returns when it records nothing: the tape is (now) poisoned.
  Var<T> invalid(std::string message) {
    poison(std::move(message));
    return rejected();
  }
  Var<T> rejected() { return Var<T>(this, no_node, 0); }

  // args(n) for a node's forward pass as it is recorded. Outside recompute
  // scopes their memory is idle (the values of a closed scope are dead, and
  // the next scope or replay starts it afresh), so it is lent as the host
  // loops' scratch: the fused loss's logits chunk (64 MiB at Qwen2.5-0.5B)
  // then takes no memory on top of the tape's at the step's peak.
  NodeArgs<T> forward_args(const Node<T>& n) {
    NodeArgs<T> x = args(n);
    if (open_scope_ == no_node) {
      const std::span<T> idle = scope_memory_.held();
      x.scratch = idle.data();
      x.scratch_size = idle.size();
    }
    return x;
  }
  NodeArgs<T> args(const Node<T>& n) const {
    NodeArgs<T> x;
    if (n.a != no_node) x.a = {nodes_[n.a].value, nodes_[n.a].dims, nodes_[n.a].storage, nodes_[n.a].transposed};
    if (n.b != no_node) x.b = {nodes_[n.b].value, nodes_[n.b].dims, nodes_[n.b].storage, nodes_[n.b].transposed};
    x.out = n.dims;
    x.scalar = n.scalar;
    x.axis = n.axis;
    if (n.extra != no_node) x.extra = extras_.data() + n.extra;
    return x;
  }

 private:
  template <class Op>
  // (zeros_of: a shape whose values are all zero, t unused: held_constant)
  Var<T> leaf(const Tensor<T>& t, Storage storage = Storage::native, bool transposed = false,
              const Shape* zeros_of = nullptr) {
    if (!ok()) return rejected();
    std::string op(Op::name);
    const Shape& shape = zeros_of ? *zeros_of : t.shape();
    std::size_t size = 1;
    for (std::size_t d : shape) size = d != 0 && size > std::numeric_limits<std::size_t>::max() / d ? 0 : size * d;
    if (shape.size() > max_rank)
      return invalid(op + ": tensor of shape " + shape_string(shape) + " has rank " + std::to_string(shape.size()) +
                     "; at most " + std::to_string(max_rank) + " is supported");
    if (size == 0) return invalid(op + ": tensor of shape " + shape_string(shape) + " has no elements");
    if (!Scalar<T> && storage != Storage::native)
      return invalid(op + ": a tape of dual numbers holds its leaves native, not as " +
                     std::string(storage_name(storage)));
    Node<T> n;
    n.op = op_code<Op>;
    n.dims = shape.empty() ? Dims::of(std::array<std::size_t, 1>{1}) : Dims::of(shape);
    n.requires_grad = std::is_same_v<Op, Param>;
    n.storage = storage;
    n.transposed = transposed;
    if (transposed && (!quantized(storage) || shape.size() != 2))
      return invalid(op + ": only a quantized matrix may be held transposed, not a " +
                     std::string(storage_name(storage)) + " tensor of shape " + shape_string(shape));
    if (quantized(storage)) {
      const std::size_t row = shape.empty() ? 1 : transposed ? shape[0] : shape.back();
      if (std::string why = held_row_refusal(storage, row); !why.empty())
        return invalid(op + ": a " + std::string(storage_name(storage)) + " constant of shape " +
                       shape_string(shape) + (transposed ? " held transposed" : "") + ": " + why);
    }
    const auto values_at = values_.position();
    if (!allocate(n, Op::name, false)) return rejected();  // a leaf's value is kept, inside a recompute scope too
    if (zeros_of) {  // all zero bytes: zeros in every storage (a block of scale 0 holds zeros, or -0)
      std::memset(static_cast<void*>(n.value), 0, held_bytes(storage, size, sizeof(T)));
    } else if constexpr (!Scalar<T>) {  // a dual tape's leaves are native (refused above otherwise)
      std::copy(t.data().begin(), t.data().end(), n.value);
    } else if (quantized(storage)) {
      if (std::string why = quantize_leaf(t, n); !why.empty()) {
        values_.rewind(values_at);
        return invalid(op + ": " + why);
      }
    } else if (narrow(storage)) {
      auto* bits = reinterpret_cast<std::uint16_t*>(n.value);
      for (std::size_t i = 0; i < t.size(); ++i) {
        bits[i] = round_to(storage, t.data()[i]);
        if (std::isfinite(t.data()[i]) && !std::isfinite(widen<T>(storage, bits[i]))) [[unlikely]] {
          values_.rewind(values_at);  // a constant (no gradient): its value is all it took
          char number[32];
          std::snprintf(number, sizeof number, "%.17g", static_cast<double>(t.data()[i]));
          return invalid(op + ": element " + std::to_string(i) + " of " + shape_string(t.shape()) + " (" + number +
                         ") is beyond " + std::string(storage_name(storage)) +
                         "'s range (it would become infinite); hold this tensor native" +
                         (storage == Storage::f16 ? " (or as bf16)" : ""));
        }
      }
    } else {
      std::copy(t.data().begin(), t.data().end(), n.value);
    }
    if (watch_ & inspect_detail::watch_anomalies) [[unlikely]] {
      if constexpr (Scalar<T>)
        return check_leaf(push(n));
      else
        return invalid(op + ": " + std::string(unwatched));
    }
    return push(n);
  }

  // A quantized node's blocks from values in memory order (at(r, c): memory
  // row r's element c), rounded to float first, row by row with ggml's
  // reference quantizer; "" or why not (a value not finite, a block whose
  // scale is beyond a half's range), the node's blocks then half written.
  template <class At>
  static std::string quantize_rows(const Node<T>& n, At at) {
    const QuantFormat f = quant_format(n.storage);
    const std::size_t size = n.dims.size(), row = n.held_row(), rows = size / row;
    const QuantRows memory{f, rows, row};
    std::vector<float> values(row);
    std::vector<std::uint8_t> out(memory.row_bytes());
    // The element's row-major index in the tensor's own shape, for messages.
    auto element = [&](std::size_t r, std::size_t c) { return n.transposed ? c * rows + r : r * row + c; };
    for (std::size_t r = 0; r < rows; ++r) {
      for (std::size_t c = 0; c < row; ++c) {
        const T x = at(r, c);
        if (!std::isfinite(x) || !std::isfinite(static_cast<float>(x))) {
          char number[32];
          std::snprintf(number, sizeof number, "%.17g", static_cast<double>(x));
          return "element " + std::to_string(element(r, c)) + " of " + shape_string(n.dims) + " (" + number +
                 ") has no " + std::string(storage_name(n.storage)) + " value (quantized weights are finite floats)";
        }
        values[c] = static_cast<float>(x);
      }
      quantize(f, values.data(), out.data(), row);
      put_row_blocks(memory, reinterpret_cast<std::uint8_t*>(n.value), r, out.data());
      dequantize(f, out.data(), values.data(), row);
      for (std::size_t c = 0; c < row; ++c)
        if (!std::isfinite(values[c]))
          return "element " + std::to_string(element(r, c)) + " of " + shape_string(n.dims) + " is beyond " +
                 std::string(storage_name(n.storage)) +
                 "'s range (its block's scale would be infinite as a half); hold this tensor native";
    }
    return {};
  }
  static std::string quantize_leaf(const Tensor<T>& t, const Node<T>& n) {
    const std::size_t cols = n.dims.back();
    if (n.transposed) return quantize_rows(n, [&](std::size_t r, std::size_t c) { return t[c * cols + r]; });
    return quantize_rows(n, [&](std::size_t r, std::size_t c) { return t[r * cols + c]; });
  }

  // Why Op may not read a 16-bit operand ("" when it may): only the tags
  // whose host loops widen one (takes_narrow) read one.
  template <class Op>
  std::string storage_refusal(Var<T> a, Var<T> b) const {
    const Var<T> operands[2] = {a, b};
    for (int i = 0; i < 2; ++i) {
      if (!operands[i].valid()) continue;
      const Node<T>& n = nodes_[operands[i].index_];
      if (n.storage == Storage::native || takes_narrow<Op>(i)) continue;
      return narrow_operand_refusal(Op::name, i, n);
    }
    return {};
  }
  // The message, once for all ops (it lists every tag that reads a 16-bit operand).
  static std::string narrow_operand_refusal(std::string_view op, int i, const Node<T>& n) {
    std::string readers;
    boost::mp11::mp_for_each<OpList>([&](auto reader) {
      using Reader = decltype(reader);
      for (int k = 0; k < 2; ++k)
        if (takes_narrow<Reader>(k))
          readers += (readers.empty() ? "" : ", ") + std::string(Reader::name) + "'s operand " + std::to_string(k + 1);
    });
    return std::string(op) + ": operand " + std::to_string(i + 1) + " " + shape_string(n.dims) + " is a " +
           std::string(storage_name(n.storage)) + " constant, which only " + readers +
           " read; record it as a native constant to use it here";
  }

  // Value (and gradient) buffers for a new node, from the recompute scopes'
  // shared arenas when `scoped`. An allocation failure poisons the tape with
  // the size that was asked for and leaves both arenas as they were:
  // std::bad_alloc never escapes an op.
  // Inside a recompute scope (scoped) the value alone: nothing reads a
  // transient node's gradient before backward replays the scope, and replay
  // gives each gradient memory for its lifetime only (replay).
  bool allocate(Node<T>& n, std::string_view op, bool scoped) {
    const std::size_t elements = n.dims.size();
    // A 16-bit or quantized constant's value takes whole elements of T, rounded up.
    const std::size_t size = (held_bytes(n.storage, elements, sizeof(T)) + sizeof(T) - 1) / sizeof(T);
    Arena<T>& values = scoped ? scope_memory_ : values_;
    const bool with_grad = n.requires_grad && !scoped;
    const auto values_at = values.position(), grads_at = grads_.position();
    try {
      n.value = values.allocate(size);
      if (with_grad) n.grad = grads_.allocate(size);  // written whole by its first contribution: never zero-filled
      return true;
    } catch (const std::bad_alloc&) {
      values.rewind(values_at);
      grads_.rewind(grads_at);
      const std::size_t buffers = with_grad ? 2 : 1;
      poison(std::string(op) + ": out of memory allocating " + std::to_string(buffers) + " x " +
             std::to_string(size * sizeof(T)) + " bytes for output shape " + shape_string(n.dims));
      return false;
    }
  }

  Var<T> push(Node<T>& n) {
    n.serial = ++serial_;
    nodes_.push_back(n);
    return Var<T>(this, static_cast<std::uint32_t>(nodes_.size() - 1), n.serial);
  }

  bool fail(std::string message) {
    poison(std::move(message));
    return false;
  }

  const Node<T>* find(Var<T> v) const {
    if (v.tape_ != this || v.index_ >= nodes_.size() || nodes_[v.index_].serial != v.serial_) return nullptr;
    return &nodes_[v.index_];
  }

  const T* zeros(std::size_t n) const {
    if (zero_size_ < n) {
      zero_blocks_.push_back(std::make_unique<T[]>(n));  // value-initialised: zeros
      zero_size_ = n;
    }
    return zero_blocks_.back().get();
  }

  // A gradient buffer counts only once the latest backward touched it; an
  // untouched one reads as zeros (grad()), so clearing is forgetting, not
  // writing: no memset per episode.
  void clear_gradients() {
    for (Node<T>& n : nodes_) n.touched = false;
  }

  // Drops the nodes after m; false (poisoned) for a mark of another tape or a stale one.
  bool rewind(const Mark& m) {
    if (m.tape != this) return fail("reset_to: the mark was taken on a different tape");
    if (open_scope_ != no_node) return fail("reset_to: a recompute scope is open; reset after its block returns");
    for (const Scope& s : scopes_)
      if (m.nodes > s.begin && m.nodes < s.end)
        return fail("reset_to: the mark was taken inside a recompute scope (nodes " + std::to_string(s.begin) + " to " +
                    std::to_string(s.end - 1) + "); take it before or after the scope");
    if (m.nodes > nodes_.size() || (m.nodes > 0 && nodes_[m.nodes - 1].serial != m.last_serial))
      return fail("reset_to: stale mark: it was taken at " + std::to_string(m.nodes) +
                  " nodes, but the tape has since been reset below that point (it now has " +
                  std::to_string(nodes_.size()) + " nodes, recorded after the reset); take a new mark");
    // What a Var of a dropped node was, for the message if it is used again
    // (ascending serials); kept for the latest reset only, in reused capacity.
    dropped_.resize(nodes_.size() - m.nodes);
    for (std::size_t i = m.nodes; i < nodes_.size(); ++i) {
      Dropped& d = dropped_[i - m.nodes];
      d.serial = nodes_[i].serial;
      d.op = nodes_[i].op;
      d.dims = nodes_[i].dims;
    }
    nodes_.resize(m.nodes);
    extras_.resize(m.extras);
    inspection_.scopes.note(m.nodes);  // forget scope changes among the dropped nodes
    values_.rewind(m.values);
    grads_.rewind(m.grads);
    growth_.reset_to(m.nodes);
    while (!scopes_.empty() && scopes_.back().begin >= m.nodes) scopes_.pop_back();
    if (in_scope_memory_.end > m.nodes) in_scope_memory_ = {};  // a mark is never inside a scope: all of it went
    return true;
  }

  // The reverse walk from the loss (backward.hpp): every gradient cleared,
  // then computed afresh.
  bool walk(Var<T> loss);
  // Before a backward: the missing-reset_to warning (growth_warning_runs).
  void watch_growth();
  // Before a backward: the dropped-sum warning (reset_to's comment).
  void watch_dropped();

  template <class Op>
  void backward_node(Node<T>& n);
  // Computes a transient node's value again (the reverse walk, entering a recompute scope).
  template <class Op>
  void replay_node(Node<T>& n) {
    forward<Op>(args(n), n.value);
  }

  // The recompute scopes' memory, defined in tape/recompute_scopes.hpp: a
  // scope's outputs kept, and backward's replay of a scope (the values it
  // needs, computed again; buffers placed by lifetime).
  bool keep(Node<T>& n);
  bool replay(std::size_t first, std::size_t end, std::size_t last);
  std::uint8_t backward_value_reads(const Node<T>& n) const;
  void replay_needed(std::size_t first, std::size_t end);
  bool place_scope_buffers(std::size_t first, std::size_t last);
  void restart_scope_memory();

  // Inspection hooks, defined in inspect/tape_hooks.hpp; entered only when a
  // watch is on.
  void set_watch(std::uint8_t bit, bool on) { watch_ = on ? (watch_ | bit) : (watch_ & ~bit); }
  template <class Op>
  Var<T> record_watched(Node<T>& n);
  Var<T> finish_watched(Node<T>& n, std::chrono::steady_clock::time_point start,
                        std::chrono::steady_clock::time_point stop);
  Var<T> check_leaf(Var<T> v);
  bool backward_watched(std::size_t i);
  void replay_profiled(std::size_t i);
  bool report_anomaly(Anomaly a);
  Anomaly describe(Anomaly::Phase phase, std::size_t i) const;
  void push_scope(std::string_view name) { inspection_.scopes.enter(name, nodes_.size()); }
  void pop_scope() { inspection_.scopes.leave(nodes_.size()); }

  // Op's forward host loop. With the compiled kernel library it is the
  // library's copy, reached through the op's code (forward_by_code, compiled
  // there beside the walk), so a consumer's unit compiles none of the ops'
  // loops (else each unit that records attention compiles its loops and the
  // gemm's, three instruction-set copies of each). Same source, same bits.
  // A tape over another scalar (a dual number) runs the per-item bodies.
  template <class Op>
  static void forward(const NodeArgs<T>& x, T* y) {
    if constexpr (!Scalar<T>) {
      item_forward<Op>(x, y);
    } else {
#if defined(GRAD_COMPILED_KERNELS)
      forward_by_code(op_code<Op>, x, y);
#else
      Op::forward_tensor(x, y);
#endif
    }
  }
  static void forward_by_code(std::uint8_t code, const NodeArgs<T>& x, T* y);

  // The reverse walk calls each node's backward step through this table, so
  // a program compiles (and optimises) the backward of the ops it records
  // only: record<Op> enters Op's step; leaves have none. With the compiled
  // kernel library every step is already compiled there, and the walk (also
  // compiled there) enters them all at once instead (backward.hpp).
  using BackwardStep = void (Tape::*)(Node<T>&);
  template <class Op>
  void learn_backward() {
#if defined(GRAD_COMPILED_KERNELS)
    constexpr bool walk_knows = Scalar<T>;  // the library's walk enters every step; a dual tape's is not compiled there
#else
    constexpr bool walk_knows = false;
#endif
    if constexpr (Op::arity > 0 && !walk_knows) backward_steps_[op_code<Op>] = &Tape::backward_node<Op>;
  }
  std::array<BackwardStep, op_count> backward_steps_{};
  // Each recorded op's forward, for replay (record<Op> enters it).
  using ReplayStep = void (Tape::*)(Node<T>&);
  std::array<ReplayStep, op_count> replay_steps_{};
  // Each recorded op's backward_reads (contract.hpp), for replay_needed.
  std::array<std::array<std::uint8_t, 2>, op_count> replay_reads_{};
  std::vector<std::uint8_t> replay_needed_;  // per node of the scope being replayed
  std::size_t recomputed_nodes_ = 0;         // by the latest backward
  // Closed recompute scopes, nodes [begin, end), ascending; the open one's
  // first node (no_node when none is open); the memory all scopes share.
  struct Scope {
    std::uint32_t begin = 0, end = 0;
  };
  std::vector<Scope> scopes_;
  std::uint32_t open_scope_ = no_node;
  Arena<T> scope_memory_;  // recompute scopes' values, and in replay their gradients
  // place_scope_buffers' working space, kept between walks
  std::vector<std::pair<std::size_t, std::size_t>> scope_life_, scope_events_;
  std::vector<std::size_t> scope_offset_;
  FirstFit scope_plan_;
  Scope in_scope_memory_;  // the nodes whose transient buffers the scope memory holds now

  std::vector<Node<T>> nodes_;
  std::vector<std::size_t> extras_;
  struct Dropped {
    std::uint64_t serial;
    std::uint8_t op;
    Dims dims;
  };
  std::vector<Dropped> dropped_;  // the nodes the latest reset_to dropped
  // Growth between backward calls: node count at the previous one, the
  // growth before it, and how many calls in a row grew by about as much.
  struct Growth {
    std::size_t nodes = 0, last = 0;
    std::uint32_t runs = 0;
    void reset_to(std::size_t n) {
      nodes = n;
      last = 0;
      runs = 0;
    }
  } growth_;
  bool warned_growth_ = false;  // each warning is said once per tape
  bool warned_replaced_ = false;
  bool optimizer_attached_ = false;               // note_optimizer
  bool unused_gradients_ = false;                 // a backward's gradients that no step has used yet
  bool dropped_unused_ = false;                   // a plain reset_to dropped such gradients since the last backward
  bool warned_dropped_ = false;                   // its warning is said once
  std::vector<T> accumulated_;                    // backward(loss, accumulate): the sums before this call's walk,
  std::vector<std::uint32_t> accumulated_nodes_;  // of these parameter nodes
  Arena<T> values_, grads_;
  std::vector<T> scratch_;  // one input's contribution when it already holds a gradient
  // What grad() shows for a node without a gradient buffer. Blocks are only
  // added, never freed, so earlier views stay valid.
  mutable std::vector<std::unique_ptr<T[]>> zero_blocks_;
  mutable std::size_t zero_size_ = 0;
  std::string error_;
  std::uint64_t serial_ = 0;
  bool throw_ = false;
  std::uint32_t inference_depth_ = 0;
  std::uint8_t watch_ = 0;  // inspect_detail::watch_* bits
  TapeInspection inspection_;
  template <class U>
  friend class InferenceGuard;
  template <class U>
  friend class NameScope;
};

// Inference mode for one scope, like torch::NoGradGuard: ops recorded while a
// guard is alive compute their values as usual but get no gradient buffer,
// so they cost no gradient memory and the reverse walk does nothing below
// them; backward() while a guard is open, or on a loss recorded under one,
// poisons the tape with a message saying so. Parameters made under a guard
// are still parameters. Guards nest.
//
//   {
//     grad::InferenceGuard guard(tp);
//     auto logits = model(x);        // values only
//   }
template <class T>
class InferenceGuard {
 public:
  explicit InferenceGuard(Tape<T>& tp) : tp_(&tp) { ++tp_->inference_depth_; }
  ~InferenceGuard() { --tp_->inference_depth_; }
  InferenceGuard(const InferenceGuard&) = delete;
  InferenceGuard& operator=(const InferenceGuard&) = delete;

 private:
  Tape<T>* tp_;
};

// Out of the class, so not inline: the compiled kernel library instantiates it
// (core.hpp's GRAD_WALK_INSTANCES) and its users declare it extern.
template <class T>
void Tape<T>::forward_by_code(std::uint8_t code, const NodeArgs<T>& x, T* y) {
  with_op(code, [&](auto op) {
    using Op = decltype(op);
    if constexpr (Op::arity > 0) Op::forward_tensor(x, y);
  });
}

}  // namespace grad

#include "grad/tape/recompute_scopes.hpp"
#include "grad/inspect/tape_hooks.hpp"
