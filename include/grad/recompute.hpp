// Activation recompute (gradient checkpointing): trade a second forward pass
// of a block for the memory of everything it records.
//
//   for (auto& layer : layers)
//     x = grad::recompute(tp, [&] { return layer(x); });
//
// The block runs once, recording as usual, but every computed node inside it
// takes its value from memory that all scopes share, sized by the largest
// pass; only what the block returns is kept. (Backward's replay places the
// values it computes again and the gradients there by lifetime; between
// scopes the tape lends that memory to the host loops as scratch.) When backward's walk
// reaches the scope it computes those values again, in recording order, with
// the same op bodies on the same inputs, then goes on as if they had been
// kept: values, gradients and the order gradients are summed in are those of
// the same recording without the scope, bit for bit (test_recompute). The
// price is one more forward of each block per backward.
//
// What a block may do: record any ops on Vars from outside it (the block's
// inputs, parameters: they are kept as always) and create parameters and
// constants (leaves are kept too). What it may not: nest another scope, call
// backward or reset_to. After it returns, a node recorded inside and not
// returned is transient: using it as an operand poisons the tape with a
// message saying so, and value(), grad() read it as empty. A mark taken
// inside a scope cannot be reset to. The device engine (capture) and
// emitted code take tapes without scopes only: they say so by name.
#pragma once

#include <span>
#include <type_traits>

#include "grad/tape.hpp"

namespace grad {

// Records block() (which returns the scope's output, a Var<T>) inside a
// recompute scope and returns its output. On a poisoned tape, or when the
// scope cannot open (one is already open: the tape is poisoned), the block
// is not run and the result is invalid.
template <class T, class Block>
requires std::is_same_v<std::invoke_result_t<Block&>, Var<T>> Var<T> recompute(Tape<T>& tp, Block&& block) {
  if (!tp.open_recompute()) return tp.rejected();
  Var<T> out;
  try {
    out = block();
  } catch (...) {
    tp.close_recompute({});  // every node inside transient; nothing to fail on
    throw;
  }
  if (!tp.close_recompute(std::span<const Var<T>>(&out, 1))) return tp.rejected();
  return out;
}

}  // namespace grad
