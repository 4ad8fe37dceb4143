// The one order every full reduction in grad follows (sum, mean, row_sum's rows, the optimizers'
// global clip norm), on the tape, the CPU backend and CUDA alike.
//
// The order ("32 lanes, chunks of 4096, a fixed tree") depends only on the
// length n, never on threads, vector width or instruction set:
//
//   lanes32(v, n):  lane j (0 <= j < 32) sums v[j], v[j+32], v[j+64], ...
//                   ascending from zero (acc = acc + v[i]; the clip norm's
//                   squares acc = fma(v[i], v[i], acc)); then the 32 lane
//                   sums are combined by a fixed binary tree: for w = 16, 8,
//                   4, 2, 1: lane[j] = lane[j] + lane[j + w] for j < w; the
//                   result is lane[0].
//   sum(x, n):      n <= 4096: lanes32(x, n). Longer: cut x into chunks of
//                   4096 (the last may be shorter), reduce each with lanes32,
//                   and sum the chunk results the same way (recursively), so
//                   a level holds at most 4096 values; the fourth level
//                   (n > 2^48) takes whatever remains in one lanes32.
//
// Why this shape: a serial chain cannot vectorise (each add waits for the
// previous one); 32 independent lanes are what a host SIMD loop keeps in
// registers and what a CUDA warp holds one per thread, so both compute it at
// full width with the same bits. Chunks bound how far apart two lanes'
// partial sums may wander and give a GPU block independent work.
//
// The pieces below are GRAD_HD and are the only definition of the order:
// the host loops, the CPU backend and the CUDA kernels all call them
// (test_reduction checks the lane-per-thread form against the row form).
#pragma once

#include <cstddef>

#include "grad/config.hpp"

namespace grad {

namespace fixed_order {

inline constexpr std::size_t lanes = 32;
inline constexpr std::size_t chunk = 4096;  // a multiple of lanes
inline constexpr int max_levels = 4;        // levels above the input; the top one takes any count

// How a reduction adds an element to a lane's sum: acc + x, or for the clip
// norm's sum of squares acc + x*x as one fma (a single rounding).
struct Identity {
  template <class T>
  GRAD_HD T operator()(T acc, T x) const {
    return acc + x;
  }
};
struct Square {
  template <class T>
  GRAD_HD T operator()(T acc, T x) const {
    return fma_hd(x, x, acc);
  }
};
// x*x rounded, then added: the bits of row_sum over a recorded x * x, which
// the one-node norms (rms_norm, layer_norm) keep so that they equal the
// composites they replace.
struct SquareThenAdd {
  template <class T>
  GRAD_HD T operator()(T acc, T x) const {
    return acc + x * x;
  }
};

// The fixed tree over 32 lane sums (overwrites acc; returns the total).
template <class T>
GRAD_HD inline T combine_lanes(T* acc) {
  for (std::size_t w = lanes / 2; w > 0; w /= 2)
    for (std::size_t j = 0; j < w; ++j) acc[j] = acc[j] + acc[j + w];
  return acc[0];
}

// One lane of lanes32 over x[0, n): what one CUDA thread of a warp computes.
template <class T, class F = Identity>
GRAD_HD inline T lane_sum(const T* x, std::size_t n, std::size_t lane, F f = {}) {
  T acc = T(0);
  for (std::size_t i = lane; i < n; i += lanes) acc = f(acc, x[i]);
  return acc;
}

// lanes32 over x[0, n), all lanes in one thread: full rows of 32 first (the
// inner loop is 32 independent chains, which the compiler vectorises), then
// the tail row. Each lane still adds its elements in ascending index, so this
// equals lane_sum for every lane. The inner loop is unrolled whole on the
// host (GCC): the 32 sums then stay in registers at -O2 as at -O3; left
// rolled, -O2 keeps acc[] in memory and sums 3x slower.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define GRAD_UNROLL_LANES _Pragma("GCC unroll 32")
#else
#define GRAD_UNROLL_LANES
#endif
template <class T, class F = Identity>
GRAD_HD inline T lanes32(const T* x, std::size_t n, F f = {}) {
  T acc[lanes];
  for (std::size_t j = 0; j < lanes; ++j) acc[j] = T(0);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    GRAD_UNROLL_LANES
    for (std::size_t j = 0; j < lanes; ++j) acc[j] = f(acc[j], x[i + j]);
  for (std::size_t j = 0; i + j < n; ++j) acc[j] = f(acc[j], x[i + j]);
  return combine_lanes(acc);
}

// Values at each level: level 0 is the input; level k + 1 holds one value per
// chunk of level k. The top level is the first with at most one chunk (or
// max_levels). Returns the top level's index; sizes[0..top] are filled.
GRAD_HD inline int level_sizes(std::size_t n, std::size_t* sizes) {
  int top = 0;
  sizes[0] = n;
  while (sizes[top] > chunk && top < max_levels) {
    sizes[top + 1] = (sizes[top] + chunk - 1) / chunk;
    ++top;
  }
  return top;
}

// Streams the values of level `from` (ascending) into the levels above it:
// each level keeps its 32 lanes; a level's chunk, once complete, is combined
// and pushed one level up. Lets the host and a single device thread compute
// the whole hierarchy with 32 * max_levels values of state, no buffers.
template <class T>
struct LevelStream {
  T acc[max_levels + 1][lanes];
  std::size_t count[max_levels + 1];
  std::size_t sizes[max_levels + 1];
  int top;

  GRAD_HD explicit LevelStream(std::size_t n) {
    top = level_sizes(n, sizes);
    for (int k = 0; k <= max_levels; ++k) {
      count[k] = 0;
      for (std::size_t j = 0; j < lanes; ++j) acc[k][j] = T(0);
    }
  }
  // Appends the next value of level k (k >= 1).
  GRAD_HD void push(int k, T v) {
    for (;;) {
      const std::size_t idx = count[k]++;
      acc[k][idx % lanes] = acc[k][idx % lanes] + v;
      const bool chunk_done = (idx + 1) % chunk == 0 || idx + 1 == sizes[k];
      if (k == top || !chunk_done) return;
      v = combine_lanes(acc[k]);
      for (std::size_t j = 0; j < lanes; ++j) acc[k][j] = T(0);
      ++k;
    }
  }
  GRAD_HD T result() { return combine_lanes(acc[top]); }
};

// Chunk c of level 0: its first element and length.
GRAD_HD inline std::size_t chunk_length(std::size_t n, std::size_t c) {
  return n - c * chunk < chunk ? n - c * chunk : chunk;
}

}  // namespace fixed_order

// The documented sum over x[0, n) (see the top of this file), each element
// added by f: Identity, or Square for a sum of squares.
template <class T, class F = fixed_order::Identity>
GRAD_HD inline T sum_fixed(const T* x, std::size_t n, F f = {}) {
  using namespace fixed_order;
  if (n <= chunk) return lanes32(x, n, f);
  LevelStream<T> s(n);
  for (std::size_t c = 0; c * chunk < n; ++c) s.push(1, lanes32(x + c * chunk, chunk_length(n, c), f));
  return s.result();
}

}  // namespace grad
