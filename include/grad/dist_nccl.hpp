// grad::dist on GPUs: the shard scheme of grad/dist.hpp over NCCL, on device
// buffers. One rank per GPU (mpirun -np N, N GPUs); the NCCL communicator is
// set up through the MPI Communicator (rank 0's ncclUniqueId, broadcast).
//
// The order is dist.hpp's, and the fold is the same operations: per element,
// acc = G_0; acc = acc + G_s for s = 1 .. S-1; then acc / T(S) under
// Combine::mean; a CUDA kernel compiled with --fmad=false (+ and / only, each
// correctly rounded), so a GPU rank lands on the bits a CPU rank would.
//
//   grad::dist::nccl::ShardReducer<float> red(comm, device, P, {.shards = 8});
//   for (k over this rank's shards) { /* write shard owned().begin + k's gradient into red.shard(k) */ }
//   red.reduce();           // exchange (grouped ncclSend/ncclRecv), fold in shard order, ncclAllGather
//   red.reduced();          // P values on the device, the same on every rank
//
// Built into the grad_dist_nccl library when nvcc, nccl.h and MPI are found
// (src/dist_nccl.cu); this header includes neither CUDA nor NCCL.
//
// State: compiled here; not run yet (no GPU was lent to the session that
// wrote it). The device engine exposes gradients by copy only
// (Engine::read_grads) and has no way to write a reduced gradient back before
// its optimizer step, so feeding a device Program's gradients through this
// reducer needs an Engine::write_grads (or a device pointer) first: see
// bench/RESULTS.md, "grad::dist".
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "grad/dist/shards.hpp"

namespace grad::dist::nccl {

template <class T>
class ShardReducer {
 public:
  // `elements`: P, the flattened gradient's length; `device`: this rank's CUDA
  // device. Collective over every rank of comm. Throws Error on a CUDA or
  // NCCL failure.
  ShardReducer(Communicator& comm, int device, std::size_t elements, ShardOptions options);
  ~ShardReducer();
  ShardReducer(const ShardReducer&) = delete;
  ShardReducer& operator=(const ShardReducer&) = delete;

  Range owned() const;
  // Device buffer (P values) for the k-th shard this rank owns.
  T* shard(std::size_t k);
  // Exchange, fold, gather; returns when the reduced gradient is complete.
  void reduce();
  // The reduced gradient, P values on the device.
  const T* reduced() const;
  // Host convenience (tests, engines that copy): uploads this rank's shards
  // (owned().size() * P values, shard after shard), reduces, downloads P values.
  void reduce_host(std::span<const T> own_shards, std::span<T> out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace grad::dist::nccl
