// grad/device/sampling.hpp on CUDA: rounds of tiles sorted by CUB's block
// radix sort, each tile's first k carried to the next round.
#include <cuda_runtime.h>

#include <cub/block/block_radix_sort.cuh>
#include <cuda/std/limits>
#include <memory>
#include <stdexcept>
#include <string>

#include "cuda_check.hpp"
#include "grad/device/engine.hpp"
#include "grad/device/sampling.hpp"
#include "sampling_instances.hpp"

namespace grad::device {
namespace {

constexpr int tile_threads = 256, tile_items = static_cast<int>(top_k_tile / tile_threads);
constexpr std::size_t tile = top_k_tile;
static_assert(std::size_t{tile_threads} * tile_items == tile && top_k_most * 2 <= tile);

std::size_t tiles(std::size_t m) { return (m + tile - 1) / tile; }

// One tile of m candidates (keys, and their ids; no ids: a candidate's id is
// its position) sorted in descending order, largest first, equal keys in the
// order they came (the sort is stable and reads the tile in blocked order:
// thread t holds positions t * tile_items and on). Past m, padding of -inf
// with the largest id, which sorts after every real -inf. The first k of
// tile b go to keys_out/ids_out [b * k, b * k + k); with `row` (the last
// round) the values written are the row's own logits of those ids, so a
// -0.0 stays -0.0 whatever the sort does with it.
template <class T>
__global__ void __launch_bounds__(tile_threads)
    sort_tiles(const T* keys_in, const std::int32_t* ids_in, std::size_t m, std::size_t k, T* keys_out,
               std::int32_t* ids_out, const T* row) {
  using Sort = cub::BlockRadixSort<T, tile_threads, tile_items, std::int32_t>;
  __shared__ typename Sort::TempStorage temp;
  T keys[tile_items];
  std::int32_t ids[tile_items];
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * tile;
  for (int i = 0; i < tile_items; ++i) {
    const std::size_t at = first + static_cast<std::size_t>(threadIdx.x) * tile_items + i;
    const bool real = at < m;
    keys[i] = real ? keys_in[at] : -cuda::std::numeric_limits<T>::infinity();
    ids[i] = !real ? cuda::std::numeric_limits<std::int32_t>::max()
                   : (ids_in ? ids_in[at] : static_cast<std::int32_t>(at));
  }
  Sort(temp).SortDescending(keys, ids);
  for (int i = 0; i < tile_items; ++i) {
    const std::size_t rank = static_cast<std::size_t>(threadIdx.x) * tile_items + i;
    if (rank < k) {
      ids_out[blockIdx.x * k + rank] = ids[i];
      keys_out[blockIdx.x * k + rank] = row ? row[ids[i]] : keys[i];
    }
  }
}

// Frees device memory when it goes out of scope.
struct DeviceFree {
  void operator()(void* p) const { cudaFree(p); }
};
using DeviceBuffer = std::unique_ptr<void, DeviceFree>;
DeviceBuffer device_alloc(std::size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes == 0 ? 1 : bytes), "cuda_top_k: cudaMalloc");
  return DeviceBuffer(p);
}

}  // namespace

template <class T>
void cuda_top_k_async(const T* logits, std::size_t n, std::size_t k, std::int32_t* ids, T* values, void* scratch,
                      void* stream) {
  check_top_k(n, k);
  const auto s = static_cast<cudaStream_t>(stream);
  const std::size_t most = tiles(n) * k;
  // top_k_scratch_bytes: keys first (T's alignment), then ids.
  T* keys[2] = {static_cast<T*>(scratch), static_cast<T*>(scratch) + most};
  std::int32_t* cand[2] = {reinterpret_cast<std::int32_t*>(keys[1] + most),
                           reinterpret_cast<std::int32_t*>(keys[1] + most) + most};
  const T* in_keys = logits;
  const std::int32_t* in_ids = nullptr;
  for (std::size_t m = n, round = 0;; ++round) {
    const std::size_t b = tiles(m);
    const bool last = b == 1;
    T* out_keys = last ? values : keys[round % 2];
    std::int32_t* out_ids = last ? ids : cand[round % 2];
    sort_tiles<T><<<static_cast<unsigned>(b), tile_threads, 0, s>>>(in_keys, in_ids, m, k, out_keys, out_ids,
                                                                    last ? logits : nullptr);
    check(cudaGetLastError(), "cuda_top_k: a round of tile sorts");
    if (last) return;
    in_keys = out_keys;
    in_ids = out_ids;
    m = b * k;
  }
}

template <class T>
TopK<T> cuda_top_k(std::span<const T> logits, std::size_t k) {
  check_top_k(logits.size(), k);
  if (!cuda_available()) throw std::runtime_error("grad::device::cuda_top_k: " + cuda_unavailable_reason());
  const std::size_t n = logits.size();
  DeviceBuffer row = device_alloc(n * sizeof(T)), out_ids = device_alloc(k * sizeof(std::int32_t)),
               out_values = device_alloc(k * sizeof(T)), scratch = device_alloc(top_k_scratch_bytes<T>(n, k));
  check(cudaMemcpy(row.get(), logits.data(), n * sizeof(T), cudaMemcpyHostToDevice), "cuda_top_k: copying the logits in");
  cuda_top_k_async<T>(static_cast<const T*>(row.get()), n, k, static_cast<std::int32_t*>(out_ids.get()),
                      static_cast<T*>(out_values.get()), scratch.get(), nullptr);
  TopK<T> r{std::vector<std::int32_t>(k), std::vector<T>(k)};
  check(cudaMemcpy(r.ids.data(), out_ids.get(), k * sizeof(std::int32_t), cudaMemcpyDeviceToHost),
        "cuda_top_k: copying the ids out");
  check(cudaMemcpy(r.values.data(), out_values.get(), k * sizeof(T), cudaMemcpyDeviceToHost), "cuda_top_k: copying the values out");
  return r;
}

template <class T>
std::int32_t cuda_argmax(std::span<const T> logits) {
  return cuda_top_k(logits, 1).ids[0];
}

GRAD_SAMPLING_INSTANCES(float)
GRAD_SAMPLING_INSTANCES(double)

}  // namespace grad::device
