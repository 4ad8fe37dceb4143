// The last stage of the device pipeline (capture -> plan -> replay ->
// launch): what replay hands a backend, as plain data. A Launch is one
// node's forward, one operand's backward contribution, or a fan-out
// accumulation, resolved to buffer pointers; fused kernels read arrays of
// them from device memory. The bodies the backends run over these records
// are next to the backends, in kernels/.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "grad/tags/op_list.hpp"
#include "grad/update_rules.hpp"

namespace grad::device {

enum class LaunchKind : std::uint8_t { forward, backward_a, backward_b, accumulate };

// One launch resolved to backend pointers (plain data: fused kernels read an
// array of these from device memory). forward: y is the node's output.
// backward_a/b: y and g are the node's value and gradient, dx receives the
// input's contribution (its gradient, or scratch). accumulate: grad += dx.
template <class S>
struct Launch {
  LaunchKind kind = LaunchKind::forward;
  std::uint8_t op = 0;
  NodeArgs<S> x;
  S* y = nullptr;
  const S* g = nullptr;
  S* dx = nullptr;
  S* grad = nullptr;
  std::size_t items = 0;
};

// Ops a fused kernel can dispatch: the row-local families, activation·W, and
// sum/mean (the scalar tail and its backward). Only these are instantiated
// in the fused kernels' op table, which keeps nvcc's work small; every other
// op keeps its per-node kernel.
template <class Op>
inline constexpr bool fusable = std::is_base_of_v<Unary<Op>, Op> || std::is_base_of_v<Binary<Op>, Op> ||
                                std::same_as<Op, Matmul> || std::same_as<Op, Sum> || std::same_as<Op, Mean>;

// The launch geometry both backends use: work item w = block *
// threads_per_block + thread (the CPU backend runs blocks and threads as loops).
inline constexpr std::size_t threads_per_block = 256;

// Blocks that cover `items` work items, `block_items` a block.
GRAD_HD constexpr std::size_t blocks_for(std::size_t items, std::size_t block_items = threads_per_block) {
  return (items + block_items - 1) / block_items;
}

// The grid batch_block needs: every launch's blocks, side by side.
template <class S>
std::size_t batch_blocks(const Launch<S>* launches, std::size_t count) {
  std::size_t blocks = 0;
  for (std::size_t k = 0; k < count; ++k) blocks += blocks_for(launches[k].items);
  return blocks;
}

// ---- the optimizer step's records ----

template <class S>
struct ParamView {
  S* w = nullptr;
  const S* g = nullptr;
  S* m = nullptr;  // Adam moments (null for SGD)
  S* v = nullptr;
  std::size_t size = 0;
  S l2 = S(0);
  S weight_decay = S(0);  // AdamW's decoupled decay (0: none)
};

// The hyperparameters of a step. They live in device memory (one record per
// program, ReplayEngine::optimizer_step uploads a change), and the kernels
// read them through a pointer: a captured graph keeps reading the record, so
// a new rate needs no new graph.
template <class S>
struct OptimizerHyper {
  S lr, beta1, beta2, eps, clip;
  bool adam;
  AdamForm form;
};

// Per-step values computed on the device, so that a step needs no host round trip.
template <class S>
struct OptimizerState {
  S scale = S(1);  // clip factor of this step
  S beta1_power = S(1), beta2_power = S(1);
  AdamStepConstants<S> constants{};
};

// The grid optimizer_update_block needs: every parameter's blocks, side by side.
template <class S>
std::size_t update_blocks(const ParamView<S>* params, std::size_t count) {
  std::size_t blocks = 0;
  for (std::size_t k = 0; k < count; ++k) blocks += blocks_for(params[k].size);
  return blocks;
}

}  // namespace grad::device
