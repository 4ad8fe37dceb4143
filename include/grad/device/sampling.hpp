// Greedy and top-k token choice on the GPU: the k largest logits of a row,
// ordered by value (largest first) and, among equal values, by id (smallest
// first). That is nn::top_k_order's order, the one nn::generate samples from
// on the CPU, so a decode loop picks the same tokens on either side. It is
// made of comparisons alone (no rounding), so the determinism contract has
// nothing to add.
//
// How: CUB's block radix sort (stable, and -0.0 equal to +0.0) sorts tiles
// of 2048 logits in descending order with their ids; each tile's first k go
// on to the next round, until a single tile holds every candidate. NaN
// logits are not ordered (CUB sorts them as the largest values): give none.
//
// Built in kernels/sampling.cu; without nvcc (kernels/cuda_absent.cpp) the
// calls check their arguments as here and then throw
// cuda_unavailable_reason().
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace grad::device {

// Logits per tile, and the largest k a call takes: half a tile, so that
// every round at least halves the candidates. Ids are int32: n < 2^31.
inline constexpr std::size_t top_k_tile = 2048, top_k_most = top_k_tile / 2;

// "" or what is wrong with asking for the top k of n logits.
inline std::string invalid_top_k(std::size_t n, std::size_t k) {
  if (n == 0) return "no logits (n = 0)";
  if (n > std::size_t{0x7fffffff}) return std::to_string(n) + " logits: expected fewer than 2^31 (the ids are int32)";
  if (k == 0 || k > n || k > top_k_most)
    return "k " + std::to_string(k) + ": expected 1 to " + std::to_string(n < top_k_most ? n : top_k_most) +
           " (at most the " + std::to_string(n) + " logits and at most top_k_most, " + std::to_string(top_k_most) + ")";
  return {};
}

// Throws std::invalid_argument with invalid_top_k's reason, if any.
inline void check_top_k(std::size_t n, std::size_t k) {
  if (std::string why = invalid_top_k(n, k); !why.empty())
    throw std::invalid_argument("grad::device::cuda_top_k: " + why);
}

template <class T>
struct TopK {
  std::vector<std::int32_t> ids;  // k ids, in order
  std::vector<T> values;          // logits[ids[i]]
};

// The row on the host, the sort on the GPU (the row is copied in, the k ids
// and values out). Throws std::invalid_argument when invalid_top_k says
// why, std::runtime_error when CUDA cannot run or fails.
template <class T>
TopK<T> cuda_top_k(std::span<const T> logits, std::size_t k);
// The id of the first largest logit: cuda_top_k(logits, 1).ids[0], which is
// nn::argmax_token's choice.
template <class T>
std::int32_t cuda_argmax(std::span<const T> logits);

// Device memory cuda_top_k_async needs beside its inputs and outputs: the
// candidates of two rounds (the one read, the one written; the first round's
// are the most), keys and int32 ids.
template <class T>
std::size_t top_k_scratch_bytes(std::size_t n, std::size_t k) {
  return 2 * ((n + top_k_tile - 1) / top_k_tile) * k * (sizeof(T) + sizeof(std::int32_t));
}
// The same on a row already in device memory, into device memory (ids and
// values: k each), queued on `stream` (a cudaStream_t; nullptr: the default
// stream) and not waited for. scratch: top_k_scratch_bytes<T>(n, k) bytes of
// device memory, aligned as cudaMalloc aligns.
template <class T>
void cuda_top_k_async(const T* logits, std::size_t n, std::size_t k, std::int32_t* ids, T* values, void* scratch,
                      void* stream);

}  // namespace grad::device
