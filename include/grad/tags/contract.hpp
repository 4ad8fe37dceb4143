// What an op tag is: the contract every tag in OpList meets, what its
// bodies see of a node (NodeArgs), and the generic pieces built on the
// contract (the item counts, ItemLoops). The families that give many tags
// their bodies at once are in family.hpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <type_traits>

#include "grad/config.hpp"
#include "grad/numerics/isa.hpp"
#include "grad/numerics/storage.hpp"
#include "grad/tensor.hpp"

namespace grad {

template <class T>
struct Operand {
  const T* data = nullptr;
  Dims dims;
  // bf16, f16: data points at 16-bit floats (a frozen constant), which only
  // the tags that say so read (reads_narrow below), widening them exactly;
  // q8_0 ... q6_k: data points at quantized blocks (numerics/held.hpp).
  Storage storage = Storage::native;
  // A quantized matrix whose memory holds its transpose (a projection
  // [in, out] as llama.cpp holds it, [out, in]); false for everything else.
  bool transposed = false;
};

// Everything an op's kernels read besides the output and gradient buffers.
template <class T>
struct NodeArgs {
  Operand<T> a, b;
  Dims out;
  T scalar = T(0);
  std::uint32_t axis = 0;              // softmax, concat
  const std::size_t* extra = nullptr;  // one per axis: slice's starts, dropout's key (then zeros)
  // Memory the host loops may use as scratch for this call, lent by the tape
  // (null when none is idle; the device engine lends none).
  T* scratch = nullptr;
  std::size_t scratch_size = 0;
};

// Which operands an op's host loops read as 16-bit constants (Storage::bf16
// or f16, widened exactly where they are read): a tag's `reads_narrow`
// array, none by default. The tape refuses any other op such an operand,
// and the device engine and grad::emit refuse such tapes.
template <class Op>
constexpr bool takes_narrow(int operand) {
  if constexpr (requires { Op::reads_narrow; })
    return Op::reads_narrow[operand];
  else
    return false;
}

// ---- what an op tag is ----
//
//   name          the op's name in every message
//   torch         the op as a float64 PyTorch expression of a, b (the
//                 operands), s (the scalar), axis, dims (the output shape)
//                 and extra (slice starts): the oracle test replays the case
//                 table's tapes through it (test/oracle/cases.py)
//   arity         1 or 2 (0: the leaves, Param and Const)
//   output_dims   the shape rule (below)
//   forward_item, backward_item   the math (below); host loops forward_tensor
//                 and backward_tensor (ItemLoops, or a faster variant)
//
// ---- the shape rule every op tag owns ----
//
//   static std::string output_dims(const Dims& a, const Dims& b, OpAttrs& at, Dims& out)
//
// sets `out` to the output shape for operands of shapes a (and b: empty for
// one-operand ops) and returns "", or returns why there is none; the one
// recorder (record.hpp) prefixes the op's name and poisons the tape with it.
// It may resolve the attributes (a negative axis). A tag that keeps
// at.sizes on the tape (slice's starts, dropout's key) says `keeps_sizes =
// true`; engines copy one entry per axis of operand a.

// What a recording function passes its tag besides the operands.
struct OpAttrs {
  std::ptrdiff_t axis = 0;             // softmax, concat (negative: from the end)
  std::span<const std::size_t> sizes;  // reshape: the new shape; slice: the starts
  std::span<const std::size_t> stops;  // slice
  bool keep_axis = true;               // max, min: the reduced axis stays, as size 1 (else it is dropped)
};

// Resolves a numpy-style axis of `d` in place; the reason when it is out of
// range (`operands()` names them: "shape [2, 3]", built only on failure).
template <class Operands>
std::string resolve_axis(const Dims& d, std::ptrdiff_t& axis, Operands operands) {
  const auto rank = static_cast<std::ptrdiff_t>(d.rank);
  const std::ptrdiff_t resolved = axis < 0 ? axis + rank : axis;
  if (resolved < 0 || resolved >= rank)
    return "axis " + std::to_string(axis) + " is out of range for " + operands() + " (rank " + std::to_string(rank) +
           ")";
  axis = resolved;
  return {};
}

// ---- the per-item contract every op tag meets ----
//
// An op's math is its per-item bodies, GRAD_HD, called by every engine: the
// tape's host loops (directly, or through a faster variant that the suites
// check bit for bit against them), the device engine's CPU backend and CUDA.
//
//   forward_item(x, y, w)              computes item w of the output
//   backward_item<In>(x, y, g, dx, w)  computes item w of operand In's gradient
//                                      contribution dx, whole (gather form:
//                                      it sums its own terms from zero, in
//                                      ascending output index)
//   forward_items(x), backward_items<In>(x)
//                                      optional: how many items (default:
//                                      one per output element, one per
//                                      element of the operand)
//
// An item is one element unless the tag says otherwise (softmax: a lane,
// row_sum: a row, sum/mean forward: the whole reduction).
//
//   backward_reads                     optional: which values the backward
//                                      of operand In (backward_reads[In])
//                                      reads, as ValueRead bits (default:
//                                      all three). The reverse walk
//                                      computes a recompute scope's values
//                                      again only where a backward step
//                                      reads them (tape.hpp, replay).
enum ValueRead : std::uint8_t { reads_a = 1, reads_b = 2, reads_out = 4, reads_all = 7 };
template <class Op>
constexpr std::uint8_t backward_reads(int in) {
  if constexpr (requires { Op::backward_reads; })
    return Op::backward_reads[static_cast<std::size_t>(in)];
  else
    return reads_all;
}

template <class Op>
concept has_item_bodies = requires(const NodeArgs<double>& x, double* y, std::size_t w) {
  Op::forward_item(x, y, w);
};

template <class Op, class T>
GRAD_HD std::size_t forward_items(const NodeArgs<T>& x) {
  if constexpr (requires { Op::forward_items(x); })
    return Op::forward_items(x);
  else
    return x.out.size();
}
template <class Op, int In, class T>
GRAD_HD std::size_t backward_items(const NodeArgs<T>& x) {
  if constexpr (requires { Op::template backward_items<In>(x); })
    return Op::template backward_items<In>(x);
  else
    return (In == 0 ? x.a.dims : x.b.dims).size();
}

// Whether op Op may be recorded on a tape whose scalar is not float or
// double (a dual number: grad/dual.hpp lists the ops whose per-item bodies
// carry a tangent, specialising this). Any other op is refused by name when
// recorded on such a tape, before any of its code is instantiated for it.
template <class Op>
inline constexpr bool carries_tangent = false;

// The host loops of such a tape: the per-item bodies, one item after
// another on the calling thread (in the best instruction set's copy, so
// that fma_hd is one instruction). They are the reference every fast loop
// equals bit for bit, so a value computed here has the plain tape's bits.
// The scalar type may bring a faster loop of its own for an op, found by
// argument-dependent lookup: dual_forward(op, x, y) and
// dual_backward(op, std::integral_constant<int, In>, x, y, g, dx) (a dual
// number's matrix products: grad/dual.hpp).
template <class Op, class T>
void item_forward(const NodeArgs<T>& x, T* y) {
  if constexpr (requires { dual_forward(Op{}, x, y); }) {
    dual_forward(Op{}, x, y);
    return;
  }
  with_best_isa([&] {
    const std::size_t n = forward_items<Op>(x);
    for (std::size_t w = 0; w < n; ++w) Op::forward_item(x, y, w);
  });
}
template <class Op, int In, class T>
void item_backward(const NodeArgs<T>& x, const T* y, const T* g, T* dx) {
  if constexpr (requires { dual_backward(Op{}, std::integral_constant<int, In>{}, x, y, g, dx); }) {
    dual_backward(Op{}, std::integral_constant<int, In>{}, x, y, g, dx);
    return;
  }
  with_best_isa([&] {
    const std::size_t n = backward_items<Op, In>(x);
    for (std::size_t w = 0; w < n; ++w) Op::template backward_item<In>(x, y, g, dx, w);
  });
}

// Host loops made of the per-item bodies, for tags that need no faster
// variant. They run in the best instruction set's copy (with_best_isa), so
// that a body's fma_hd is one vfmadd there rather than a libm call.
template <class Derived>
struct ItemLoops {
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    with_best_isa([&] {
      const std::size_t n = forward_items<Derived>(x);
      for (std::size_t w = 0; w < n; ++w) Derived::forward_item(x, y, w);
    });
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T* y, const T* g, T* dx) {
    with_best_isa([&] {
      const std::size_t n = backward_items<Derived, In>(x);
      for (std::size_t w = 0; w < n; ++w) Derived::template backward_item<In>(x, y, g, dx, w);
    });
  }
};

}  // namespace grad
