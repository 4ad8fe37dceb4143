// The bodies of the fused kernels, shared by the CUDA backend and the CPU
// backend: a work item of any launch through the op-code table (run_item),
// and the three segment shapes the planner makes (device/plan.hpp): row-local
// runs, the serial tail, and batches of independent launches.
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>

#include "block_reduce.hpp"
#include "grad/device/launch.hpp"

namespace grad::device {

// What a fan-out input does with a later contribution (backward.hpp):
// the contribution was computed whole into scratch, then grad = grad + it.
template <class T>
GRAD_HD inline void accumulate_element(T* grad, const T* contribution, std::size_t w) {
  grad[w] = grad[w] + contribution[w];
}

// Work item w of a launch, through the op-code table: the tag's own
// per-item body (so the same functor, the same inner-loop order) the per-node kernel
// runs for w. A fused kernel only changes which thread runs which item.
//
// Each op's item is its own function, not inlined on the device: ptxas then
// optimises many small functions instead of one that holds the whole table
// (which took it several times longer to build).
#ifdef __CUDACC__
#define GRAD_DEVICE_NOINLINE __noinline__
#else
#define GRAD_DEVICE_NOINLINE
#endif
template <class Op, class S>
GRAD_HD GRAD_DEVICE_NOINLINE void run_op_item(const Launch<S>& l, std::size_t w) {
  if (l.kind == LaunchKind::forward) {
#ifdef __CUDA_ARCH__
    // A sum or mean forward never reaches the item table: serial_segment gives
    // it to the whole block (block_reduce_forward). Not compiling its one-thread
    // form here keeps its 32 accumulators out of the fused kernel's registers.
    if constexpr (std::same_as<Op, Sum> || std::same_as<Op, Mean>)
      __trap();
    else
#endif
      Op::forward_item(l.x, l.y, w);
  } else if (l.kind == LaunchKind::backward_a)
    Op::template backward_item<0>(l.x, l.y, l.g, l.dx, w);
  else if constexpr (Op::arity > 1)
    Op::template backward_item<1>(l.x, l.y, l.g, l.dx, w);
}

template <class S>
GRAD_HD inline void run_item(const Launch<S>& l, std::size_t w) {
  if (l.kind == LaunchKind::accumulate) {
    accumulate_element(l.grad, l.dx, w);
    return;
  }
  with_op(l.op, [&](auto op) {
    using Op = decltype(op);
    if constexpr (fusable<Op>) run_op_item<Op>(l, w);
  });
}

// Row-local segment, block `row`, one launch: this thread's items of the
// row (the launch's items split evenly over `rows`). The caller puts a
// barrier after it (__syncthreads on CUDA; the end of the thread loop on the CPU).
template <class S>
GRAD_HD inline void row_segment_step(const Launch<S>& l, std::size_t rows, std::size_t row, std::size_t thread,
                                     std::size_t threads) {
  const std::size_t per_row = l.items / rows;
  for (std::size_t t = thread; t < per_row; t += threads) run_item(l, row * per_row + t);
}

// The scalar tail: thread 0 runs every launch's items in order, except a
// sum or mean, which the whole block reduces (a barrier after each launch).
template <class S, class Block>
GRAD_HD inline void serial_segment(const Launch<S>* launches, std::size_t count, S* shared, Block& block) {
  for (std::size_t k = 0; k < count; ++k) {
    const Launch<S>& l = launches[k];
    if (block_reduction(l))
      block_reduce_forward(l.x, l.y, l.op, shared, block);
    else
      block.step_one([&] {
        for (std::size_t w = 0; w < l.items; ++w) run_item(l, w);
      });
  }
}

// Independent launches sharing one grid (the reductions across rows): block
// b belongs to the launch whose block range holds it, `block_items` items a block.
template <class S>
GRAD_HD inline void batch_block(const Launch<S>* launches, std::size_t count, std::size_t block, std::size_t thread,
                                std::size_t block_items) {
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t blocks = blocks_for(launches[k].items, block_items);
    if (block < blocks) {
      const std::size_t w = block * block_items + thread;
      if (w < launches[k].items) run_item(launches[k], w);
      return;
    }
    block -= blocks;
  }
}

}  // namespace grad::device
