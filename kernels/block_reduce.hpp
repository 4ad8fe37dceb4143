// One block of threads cooperating on a full reduction in the fixed order
// (grad/numerics/fixed_order.hpp): the sum and mean forwards and the
// optimizers' clip norm, on CUDA and on the CPU backend alike.
#pragma once

#include <cstddef>
#include <cstdint>

#include "grad/device/launch.hpp"
#include "grad/numerics/fixed_order.hpp"

namespace grad::device {

// A Block runs a kernel body's steps: step(f) calls f(thread, threads) on
// every thread of the block and then waits at a barrier; step_one(f) calls
// f() on thread 0 only, then the barrier. The CUDA backend's Block is the
// real block (__syncthreads); the CPU backend's runs the threads as a loop
// (in reverse when checking for races). Thread 0's locals carry state from
// one step to the next; what other threads share goes through `shared`.

// Chunks whose 32 lane sums sit in shared memory at once.
inline constexpr std::size_t block_sum_batch = 32;
// Values of `shared` that block_sum_fixed needs (8 KiB in double).
inline constexpr std::size_t block_sum_shared = block_sum_batch * fixed_order::lanes;

// sum_fixed(x, n, f) computed by a whole block: thread i of a step computes
// lane i % 32 of chunk i / 32 (lane_sum: 32 neighbouring threads read 32
// neighbouring elements), then one thread per chunk combines its lanes
// (combine_lanes), then thread 0 streams the chunk sums up the levels
// (LevelStream). The very functions sum_fixed is made of, so the same bits;
// only thread 0's return value is the sum.
template <class S, class F, class Block>
GRAD_HD S block_sum_fixed(const S* x, std::size_t n, F f, S* shared, Block& block) {
  using namespace fixed_order;
  const std::size_t chunks = (n + chunk - 1) / chunk;
  S total = S(0);
  if (chunks <= 1) {  // the common case (a loss over a minibatch): one warp's lanes, one tree, no levels
    block.step([&](std::size_t thread, std::size_t threads) {
      for (std::size_t i = thread; i < chunks * lanes; i += threads) shared[i] = lane_sum(x, n, i, f);
    });
    block.step_one([&] {
      if (chunks) total = combine_lanes(shared);
    });
    return total;
  }
  LevelStream<S> stream(n);
  for (std::size_t first = 0; first < chunks; first += block_sum_batch) {
    const std::size_t count = chunks - first < block_sum_batch ? chunks - first : block_sum_batch;
    block.step([&](std::size_t thread, std::size_t threads) {
      for (std::size_t i = thread; i < count * lanes; i += threads) {
        const std::size_t c = first + i / lanes;
        shared[i] = lane_sum(x + c * chunk, chunk_length(n, c), i % lanes, f);
      }
    });
    block.step([&](std::size_t thread, std::size_t threads) {
      for (std::size_t k = thread; k < count; k += threads) combine_lanes(shared + k * lanes);
    });
    block.step_one([&] {
      for (std::size_t k = 0; k < count; ++k) stream.push(1, shared[k * lanes]);
    });
  }
  block.step_one([&] { total = stream.result(); });
  return total;
}

// Is this launch a full reduction's forward (sum, mean), which a block runs together?
template <class S>
GRAD_HD inline bool block_reduction(const Launch<S>& l) {
  return l.kind == LaunchKind::forward && (l.op == op_code<Sum> || l.op == op_code<Mean>);
}

// sum / mean forward by a block: y[0] on thread 0.
template <class S, class Block>
GRAD_HD inline void block_reduce_forward(const NodeArgs<S>& x, S* y, std::uint8_t op, S* shared, Block& block) {
  const std::size_t n = x.a.dims.size();
  const S total = block_sum_fixed(x.a.data, n, fixed_order::Identity{}, shared, block);
  block.step_one([&] { y[0] = op == op_code<Mean> ? total / static_cast<S>(n) : total; });
}

}  // namespace grad::device
