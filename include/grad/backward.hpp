// The reverse walk: once over the tape from the loss down, each touched node
// handing its gradient to its inputs through its tag's backward kernel.
//
// Accumulation order (part of the determinism contract): a node's
// contribution to one input is computed whole, then added to that input's
// gradient (the first contribution is stored as is). Contributions arrive in
// descending consumer index; for an op whose two operands are the same node,
// operand 1 before operand 2.
#pragma once

#include <algorithm>
#include <type_traits>
#include <utility>

#include "grad/tape.hpp"

namespace grad {

namespace backward_detail {
// sum[k] = sum[k] + part[k]: a second (third, ...) contribution joining a
// gradient. Elements are independent, so the pool may split them.
template <class T>
void add_into(T* sum, const T* part, std::size_t n) {
  parallel_ranges(n, elementwise_grain, [&](std::size_t lo, std::size_t hi) {
    with_best_isa([&] {
      T* __restrict s = sum + lo;
      const T* __restrict p = part + lo;
      for (std::size_t k = 0; k < hi - lo; ++k) s[k] = s[k] + p[k];
    });
  });
}
}  // namespace backward_detail

template <class T>
bool Tape<T>::backward(Var<T> loss) {
  watch_growth();
  watch_dropped();
  if (unused_gradients_ && optimizer_attached_ && !warned_replaced_ && ok()) {
    warned_replaced_ = true;
    warn(
        "backward: the gradients of the previous backward were not used by an optimizer step, and this backward "
        "replaces them (grad does not sum them as PyTorch does). To sum micro-batches call tp.backward(loss, "
        "grad::accumulate); to drop them on purpose call tp.reset_to(mark, grad::drop_gradients) first");
  }
  return walk(loss);
}

template <class T>
bool Tape<T>::backward(Var<T> loss, Accumulate) {
  watch_growth();
  watch_dropped();
  if (!unused_gradients_) return walk(loss);  // the first micro-batch since a step: nothing to add to
  // The sums so far, set aside (the walk starts every gradient afresh), then
  // added back: acc = acc + g per element, the fold dist::LocalShards uses.
  // Both buffers keep their capacity: no allocation after the first step.
  accumulated_nodes_.clear();
  std::size_t size = 0;
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].op == op_code<Param> && nodes_[i].touched) {
      accumulated_nodes_.push_back(static_cast<std::uint32_t>(i));
      size += nodes_[i].dims.size();
    }
  accumulated_.resize(size);
  T* held = accumulated_.data();
  for (std::uint32_t i : accumulated_nodes_) {
    std::copy_n(nodes_[i].grad, nodes_[i].dims.size(), held);
    held += nodes_[i].dims.size();
  }
  if (!walk(loss)) return false;
  held = accumulated_.data();
  for (std::uint32_t i : accumulated_nodes_) {
    Node<T>& n = nodes_[i];
    if (n.touched)
      backward_detail::add_into(n.grad, held, n.dims.size());  // g + acc, the bits of acc + g
    else
      std::copy_n(held, n.dims.size(), n.grad);  // this micro-batch did not reach it
    n.touched = true;
    held += n.dims.size();
  }
  unused_gradients_ = true;
  return true;
}

template <class T>
void Tape<T>::watch_dropped() {
  const bool dropped = std::exchange(dropped_unused_, false);
  if (!dropped || warned_dropped_ || !ok()) return;
  warned_dropped_ = true;
  warn(
      "backward: the reset_to before it dropped gradients that no optimizer step used, so the next step sees this "
      "backward's gradients alone, not a sum over micro-batches (a plain tp.reset_to(m) also empties the "
      "gradients, as torch's zero_grad() would). To accumulate micro-batches call tp.reset_to(m, "
      "grad::keep_gradients) between them and tp.backward(loss, grad::accumulate) for each, then one opt.step(); "
      "to drop unused gradients on purpose call tp.reset_to(m, grad::drop_gradients) (said once per tape; "
      "grad::set_warning_handler redirects or silences warnings)");
}

template <class T>
void Tape<T>::watch_growth() {
  const std::size_t now = nodes_.size();
  const std::size_t grew = now > growth_.nodes ? now - growth_.nodes : 0;
  const bool alike = grew > 0 && growth_.last > 0 && grew * 4 >= growth_.last * 3 && grew * 4 <= growth_.last * 5;
  growth_.runs = alike ? growth_.runs + 1 : 0;
  if (grew > 0) growth_.last = grew;
  growth_.nodes = now;
  if (growth_.runs < growth_warning_runs || warned_growth_) return;
  warned_growth_ = true;
  warn("the tape grew by about " + std::to_string(grew) + " nodes before each of the last " +
       std::to_string(growth_.runs + 1) + " backward calls, with no reset_to (it now holds " + std::to_string(now) +
       " nodes, " + std::to_string(arena_bytes() >> 20) +
       " MiB): every step's nodes are kept, so memory grows without bound. Take `auto m = tp.mark()` after "
       "registering the parameters and call `tp.reset_to(m)` at the start of each step (said once per tape; "
       "grad::set_warning_handler redirects or silences warnings)");
}

template <class T>
bool Tape<T>::walk(Var<T> loss) {
  if (!accept("backward", {loss})) return false;
  if (open_scope_ != no_node) return fail("backward: a recompute scope is open; call backward after its block returns");
  if (std::string why = inference_refusal(loss); !why.empty()) return fail(std::move(why));
  const Node<T>& root = nodes_[loss.index_];
  if (root.dims.size() != 1)
    return fail("backward: the loss has shape " + shape_string(root.dims) +
                "; expected a single element (reduce it with sum or mean first)");
  clear_gradients();
  recomputed_nodes_ = 0;
  if (!root.grad) return true;  // no parameter upstream: every gradient reads zero
  unused_gradients_ = true;
  nodes_[loss.index_].grad[0] = T(1);
  nodes_[loss.index_].touched = true;
#if defined(GRAD_COMPILED_KERNELS)
  if constexpr (Scalar<T>)  // a dual tape knows the steps of the ops it recorded (learn_backward)
    boost::mp11::mp_for_each<OpList>([&](auto op) {
      using Op = decltype(op);
      if constexpr (Op::arity > 0) backward_steps_[op_code<Op>] = &Tape::backward_node<Op>;
    });
#endif
  // Recompute scopes (recompute.hpp) at or below the loss, not yet replayed:
  // the first node of one that the walk must step through brings back the
  // values of the scope's transient nodes up to there, in recording order.
  std::size_t scopes =
      static_cast<std::size_t>(std::upper_bound(scopes_.begin(), scopes_.end(), loss.index_,
                                                [](std::uint32_t i, const Scope& s) { return i < s.begin; }) -
                               scopes_.begin());
  for (std::size_t i = loss.index_ + 1; i-- > 0;) {
    Node<T>& n = nodes_[i];
    if (!n.touched || !backward_steps_[n.op]) continue;
    while (scopes > 0 && scopes_[scopes - 1].begin > i) --scopes;  // passed without a step inside
    if (scopes > 0 && i < scopes_[scopes - 1].end) {               // the walk's first step inside this scope
      const Scope s = scopes_[--scopes];
      if (!replay(s.begin, s.end, i)) return false;
    }
    if (watch_ != 0) [[unlikely]] {
      if constexpr (Scalar<T>) {
        if (!backward_watched(i)) return false;  // timed and/or checked (inspect/tape_hooks.hpp)
      } else {
        return fail("backward: " + std::string(unwatched));
      }
    } else {
      (this->*backward_steps_[n.op])(n);
    }
  }
  return true;
}

template <class T>
template <class Op>
void Tape<T>::backward_node(Node<T>& n) {
  if constexpr (Op::arity > 0) {
    const NodeArgs<T> x = args(n);
    auto hand_down = [&](auto input) {
      constexpr int In = decltype(input)::value;
      Node<T>& in = nodes_[In == 0 ? n.a : n.b];
      // No parameter upstream of this input (or a parameter frozen since
      // this node was recorded, Tape::set_requires_grad): no work.
      if (!in.grad || !in.requires_grad) return;
      const std::size_t size = in.dims.size();
      T* target = in.grad;
      if (in.touched) {
        if (scratch_.size() < size) scratch_.resize(size);
        target = scratch_.data();
      }
      if constexpr (Scalar<T>)
        Op::template backward_tensor<In>(x, n.value, n.grad, target);
      else
        item_backward<Op, In>(x, n.value, n.grad, target);  // a dual tape: the per-item bodies
      if (in.touched) backward_detail::add_into(in.grad, target, size);
      in.touched = true;
    };
    hand_down(std::integral_constant<int, 0>{});
    if constexpr (Op::arity > 1) hand_down(std::integral_constant<int, 1>{});
  }
}

}  // namespace grad
