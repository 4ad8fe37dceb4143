// grad::dist on GPUs: the shard scheme of grad/dist.hpp over NCCL, on device
// buffers. One rank per GPU; the NCCL communicator is set up through a
// grad::dist::Group (rank 0's ncclUniqueId, broadcast over it): the MPI
// Communicator for several processes (mpirun -np N, N GPUs), or SoloGroup for
// one process and one GPU (no MPI: this library does not link it).
//
// The order is dist.hpp's, and the fold is the same operations: per element,
// acc = G_0; acc = acc + G_s for s = 1 .. S-1; then acc / T(S) under
// Combine::mean; a CUDA kernel compiled with --fmad=false (+ and / only, each
// correctly rounded), so a GPU rank lands on the bits a CPU rank would.
//
// As a GradientReduction (grad/dist/program.hpp) it moves a captured device
// program's gradients without a host copy: load() copies shard k's gradient
// from the engine's gradient buffer (Engine::grads_in_place) into this
// reducer's shard buffer, reduce() exchanges and folds, store() copies the
// reduced gradient back into the engine's buffer before its optimizer step.
//
//   grad::dist::SoloGroup group;                          // or a Communicator
//   grad::dist::nccl::ShardReducer<float> red(group, /*device=*/0,
//       grad::dist::ProgramParallel<float>::elements(opt), {.shards = 8});
//   grad::dist::ProgramParallel<float> ddp(group, opt, {.shards = 8}, red);
//   float loss = ddp.step([&](std::size_t s) { ... });    // load, reduce, store inside
//
// or directly, on device buffers:
//   for (k over this rank's shards) { /* write shard owned().begin + k's gradient into red.shard(k) */ }
//   red.reduce();           // exchange (grouped ncclSend/ncclRecv), fold in shard order, ncclAllGather
//   red.reduced();          // P values on the device, the same on every rank
//
// No hang: the NCCL communicator is non-blocking (ncclConfig_t::blocking =
// 0). Its creation and every reduce() are polled (cudaStreamQuery and
// ncclCommGetAsyncError) instead of waited for; when one runs past its
// timeout (NcclOptions: first_timeout_s for the creation and the first
// reduce, where every rank must arrive and NCCL connects its peers;
// timeout_s for every later reduce), or NCCL reports an asynchronous error,
// the communicator is aborted (ncclCommAbort) and Error is thrown, naming
// the rank and what did not finish. The reducer is unusable after that
// (every later call throws); the other ranks time out or fail likewise.
//
// Built into the grad_dist_nccl library when nvcc, nccl.h and libnccl are
// found (src/dist_nccl.cu; NCCL linked dynamically, libnccl.so.2); this header
// includes neither CUDA nor NCCL.
//
// State: compiled, and run on the CPU only as far as "no CUDA device" (the
// checks exit 77 there). Nothing of it has run on a GPU yet: not the fold
// against the host fold (test/dist/nccl_check.cpp), not ProgramParallel
// through it against LocalShards and HostReduction
// (test/dist/nccl_program_check.cpp), not more than one rank, and not the
// timeout path. scripts/device-check.sh runs the first two, one rank, on a
// lent GPU machine.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "grad/dist/shards.hpp"

namespace grad::dist::nccl {

struct NcclOptions {
  double first_timeout_s = 60;  // the communicator's creation and the first reduce()
  double timeout_s = 300;       // every later reduce()
};

namespace detail {

// One copy between the engine's gradient buffer and the flattened gradient
// (GradRun's fields: `engine` offset, `flat` offset, `size` values).
struct Run {
  std::size_t engine = 0, flat = 0, size = 0;
};

// ShardReducer's device part, defined in src/dist_nccl.cu (compiled by nvcc,
// which includes only this part of the header: see the end). Use ShardReducer.
template <class T>
class Core {
 public:
  Core(Group& group, int device, std::size_t elements, ShardOptions options, NcclOptions nccl);
  ~Core();
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  Range owned() const;
  T* shard(std::size_t k);
  void reduce();
  const T* reduced() const;
  // cudaDeviceSynchronize, then grads + r.engine -> shard k at r.flat, for each run.
  void load(std::size_t k, const T* grads, std::span<const Run> runs);
  // reduced() + r.flat -> grads + r.engine, for each run; returns when the copies are done.
  void store(T* grads, std::span<const Run> runs);
  void reduce_host(std::span<const T> own_shards, std::span<T> out);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace detail
}  // namespace grad::dist::nccl

// src/dist_nccl.cu defines GRAD_DIST_NCCL_CORE_ONLY: nvcc's front end cannot
// compile grad/dist.hpp (grad/checkpoint.hpp's range-for over a braced list
// in a template), which grad/dist/program.hpp includes.
#ifndef GRAD_DIST_NCCL_CORE_ONLY

#include "grad/dist/program.hpp"

namespace grad::dist::nccl {

template <class T>
class ShardReducer final : public GradientReduction<T> {
 public:
  // `elements`: P, the flattened gradient's length; `device`: this rank's CUDA
  // device. Collective over every rank of group. Throws Error on a CUDA or
  // NCCL failure, or when the communicator's creation times out.
  ShardReducer(Group& group, int device, std::size_t elements, ShardOptions options, NcclOptions nccl = {})
      : core_(group, device, elements, options, nccl) {}

  Range owned() const override { return core_.owned(); }
  // Device buffer (P values) for the k-th shard this rank owns.
  T* shard(std::size_t k) { return core_.shard(k); }
  // Exchange, fold, gather; returns when the reduced gradient is complete.
  // Throws Error (after ncclCommAbort) on a timeout or an NCCL error.
  void reduce() override { core_.reduce(); }
  // The reduced gradient, P values on the device.
  const T* reduced() const { return core_.reduced(); }

  // GradientReduction: waits for the device (the engine runs on its own
  // stream), then copies each run from engine.grads_in_place() + r.engine to
  // shard k's buffer at r.flat (device to device on the CUDA backend).
  void load(std::size_t k, device::Engine<T>& engine, std::span<const GradRun> runs) override {
    core_.load(k, engine.grads_in_place(), copies(runs));
  }
  // Copies each run from the reduced gradient at r.flat to
  // engine.grads_in_place() + r.engine; returns when the copies are done (the
  // engine's optimizer runs next, on its own stream).
  void store(device::Engine<T>& engine, std::span<const GradRun> runs) override {
    core_.store(engine.grads_in_place(), copies(runs));
  }

  // Host convenience (tests, engines that copy): uploads this rank's shards
  // (owned().size() * P values, shard after shard), reduces, downloads P values.
  void reduce_host(std::span<const T> own_shards, std::span<T> out) { core_.reduce_host(own_shards, out); }

 private:
  std::span<const detail::Run> copies(std::span<const GradRun> runs) {
    runs_.clear();
    for (const GradRun& r : runs) runs_.push_back({r.engine, r.flat, r.size});
    return runs_;
  }

  detail::Core<T> core_;
  std::vector<detail::Run> runs_;
};

}  // namespace grad::dist::nccl

#endif  // GRAD_DIST_NCCL_CORE_ONLY
