// The reverse walk: once over the tape from the loss down, each touched node
// handing its gradient to its inputs through its tag's backward kernel.
//
// Accumulation order (part of the determinism contract): a node's
// contribution to one input is computed whole, then added to that input's
// gradient (the first contribution is stored as is). Contributions arrive in
// descending consumer index; for an op whose two operands are the same node,
// operand 1 before operand 2.
#pragma once

#include <type_traits>

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
  if (!accept("backward", {loss})) return false;
  if (std::string why = inference_refusal(loss); !why.empty()) return fail(std::move(why));
  const Node<T>& root = nodes_[loss.index_];
  if (root.dims.size() != 1)
    return fail("backward: the loss has shape " + shape_string(root.dims) +
                "; expected a single element (reduce it with sum or mean first)");
  clear_gradients();
  if (!root.grad) return true;  // no parameter upstream: every gradient reads zero
  nodes_[loss.index_].grad[0] = T(1);
  nodes_[loss.index_].touched = true;
#if defined(GRAD_COMPILED_KERNELS)
  boost::mp11::mp_for_each<OpList>([&](auto op) {
    using Op = decltype(op);
    if constexpr (Op::arity > 0) backward_steps_[op_code<Op>] = &Tape::backward_node<Op>;
  });
#endif
  for (std::size_t i = loss.index_ + 1; i-- > 0;) {
    Node<T>& n = nodes_[i];
    if (!n.touched || !backward_steps_[n.op]) continue;
    if (watch_ != 0) [[unlikely]] {
      if (!backward_watched(i)) return false;  // timed and/or checked (inspect/tape_hooks.hpp)
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
      Op::template backward_tensor<In>(x, n.value, n.grad, target);
      if (in.touched) backward_detail::add_into(in.grad, target, size);
      in.touched = true;
    };
    hand_down(std::integral_constant<int, 0>{});
    if constexpr (Op::arity > 1) hand_down(std::integral_constant<int, 1>{});
  }
}

}  // namespace grad
