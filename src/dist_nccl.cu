// grad::dist::nccl::ShardReducer's device part (grad/dist_nccl.hpp,
// detail::Core): the shard fold of grad/dist.hpp on device buffers over
// NCCL. Built with --fmad=false like every device unit of grad (the
// project's cuda_args), so the fold kernel is a rounded add per shard and a
// rounded divide: the host fold's bits.
//
// The communicator is non-blocking (config.blocking = 0): no NCCL call or
// wait here blocks without a deadline. Every wait is a poll of
// ncclCommGetAsyncError (and cudaStreamQuery for the reduce's stream); past
// the deadline, or on an asynchronous NCCL error, the communicator is
// aborted and Error thrown.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#define GRAD_DIST_NCCL_CORE_ONLY  // the device part only (grad/dist_nccl.hpp says why)
#include "grad/dist_nccl.hpp"

namespace grad::dist::nccl::detail {

namespace {

using steady = std::chrono::steady_clock;

template <class T>
ncclDataType_t nccl_type();
template <>
ncclDataType_t nccl_type<float>() {
  return ncclFloat32;
}
template <>
ncclDataType_t nccl_type<double>() {
  return ncclFloat64;
}

// out[i] = fold over s of pieces[s][i], ascending (dist.hpp: fold_add, fold_finish).
template <class T>
__global__ void fold_kernel(const T* const* pieces, std::size_t shards, std::size_t n, bool mean, T* out) {
  const std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  T acc = pieces[0][i];
  for (std::size_t s = 1; s < shards; ++s) acc = acc + pieces[s][i];
  if (mean) acc = acc / static_cast<T>(shards);
  out[i] = acc;
}

// A short spin, then short sleeps: a reduce of a small model finishes in
// microseconds, a stuck one must not burn a core for minutes.
void backoff(steady::time_point since) {
  if (steady::now() - since < std::chrono::milliseconds(2))
    std::this_thread::yield();
  else
    std::this_thread::sleep_for(std::chrono::microseconds(50));
}

std::string seconds(double s) {
  std::string t = std::to_string(s);
  t.erase(t.find_last_not_of('0') + 1);
  if (!t.empty() && t.back() == '.') t.pop_back();
  return t + " s";
}

}  // namespace

template <class T>
struct Core<T>::Impl {
  int rank = 0, world = 1, device = 0;
  std::size_t p = 0, slice = 0;  // slice: ceil(P / W), the last one padded (ncclAllGather takes equal counts)
  ShardOptions options;
  NcclOptions limits;
  Range own;
  ncclComm_t comm = nullptr;
  bool aborted = false;
  std::uint64_t reduces = 0;  // completed reduce() calls: the first one gets first_timeout_s
  cudaStream_t stream = nullptr;
  T* shards = nullptr;         // own.size() x P
  T* received = nullptr;       // (S - own.size()) x slice
  T* reduced = nullptr;        // W x slice
  const T** pieces = nullptr;  // S device pointers
  std::vector<const T*> host_pieces;

  Impl() = default;
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;
  // Also after a constructor that threw half way.
  ~Impl() {
    if (comm) {
      // Finalize (flushes what is queued) within the timeout, else abort.
      const auto t0 = steady::now();
      const ncclResult_t finalized = ncclCommFinalize(comm);
      bool clean = finalized == ncclSuccess || finalized == ncclInProgress;
      while (clean) {
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(comm, &state) != ncclSuccess || (state != ncclSuccess && state != ncclInProgress))
          clean = false;
        else if (state == ncclSuccess)
          break;
        else if (std::chrono::duration<double>(steady::now() - t0).count() > limits.timeout_s)
          clean = false;
        else
          backoff(t0);
      }
      if (clean)
        ncclCommDestroy(comm);
      else
        ncclCommAbort(comm);
    }
    cudaFree(shards);
    cudaFree(received);
    cudaFree(reduced);
    cudaFree(pieces);
    if (stream) cudaStreamDestroy(stream);
  }

  Range slice_range(int q) const {
    const std::size_t begin = std::min(p, static_cast<std::size_t>(q) * slice);
    return {begin, std::min(p, begin + slice)};
  }
  std::string who() const {
    return "grad::dist::nccl: rank " + std::to_string(rank) + " of " + std::to_string(world) + ": ";
  }

  void check(cudaError_t e, const char* what) const {
    if (e != cudaSuccess) throw Error(who() + what + ": " + cudaGetErrorString(e));
  }
  // NCCL calls on a non-blocking communicator may answer ncclInProgress.
  void check(ncclResult_t r, const char* what) {
    if (r == ncclSuccess || r == ncclInProgress) return;
    fail(std::string(what) + ": " + ncclGetErrorString(r));
  }
  [[noreturn]] void fail(const std::string& why) {
    std::string detail;
    if (comm) {
      const char* last = ncclGetLastError(comm);
      if (last && *last) detail = " (NCCL: " + std::string(last) + ")";
      abort();
      detail += "; the NCCL communicator was aborted";
    }
    throw Error(who() + why + detail);
  }
  void abort() {
    if (!comm) return;
    ncclCommAbort(comm);
    comm = nullptr;
    aborted = true;
  }
  void usable(const char* what) const {
    if (aborted) throw Error(who() + what + ": the NCCL communicator was aborted by an earlier failure");
  }
  // Until the communicator has no operation in progress (its creation, a
  // group's or a collective's enqueueing).
  void settle(const char* what, double limit_s, steady::time_point t0) {
    for (;;) {
      ncclResult_t state = ncclSuccess;
      check(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError");
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) fail(std::string(what) + ": " + ncclGetErrorString(state));
      if (std::chrono::duration<double>(steady::now() - t0).count() > limit_s)
        fail(std::string(what) + " did not finish within " + seconds(limit_s) +
             " (a rank that never arrived, or a stuck peer)");
      backoff(t0);
    }
  }
  // Until the stream's work (NCCL kernels and the fold) is done.
  void wait_stream(const char* what, double limit_s, steady::time_point t0) {
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream);
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) fail(std::string(what) + ": " + cudaGetErrorString(e));
      ncclResult_t state = ncclSuccess;
      check(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError");
      if (state != ncclSuccess && state != ncclInProgress) fail(std::string(what) + ": " + ncclGetErrorString(state));
      if (std::chrono::duration<double>(steady::now() - t0).count() > limit_s)
        fail(std::string(what) + " did not finish within " + seconds(limit_s) +
             " (a rank that never arrived, or a stuck peer)");
      backoff(t0);
    }
  }
};

template <class T>
Core<T>::Core(Group& group, int device, std::size_t elements, ShardOptions options, NcclOptions nccl)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.rank = group.rank();
  m.world = group.size();
  m.device = device;
  m.p = elements;
  m.options = options;
  m.limits = nccl;
  if (options.shards < static_cast<std::size_t>(m.world))
    throw Error(m.who() + "every rank needs at least one shard (shards < ranks)");
  m.own = owned_shards(options.shards, m.world, m.rank);
  m.slice = (elements + m.world - 1) / m.world;
  m.check(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId id{};
  if (m.rank == 0) m.check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  group.broadcast(&id, sizeof id, 0, "the NCCL unique id");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const auto t0 = steady::now();
  m.check(ncclCommInitRankConfig(&m.comm, m.world, id, m.rank, &config), "ncclCommInitRankConfig");
  m.settle("the NCCL communicator's creation (ncclCommInitRankConfig)", nccl.first_timeout_s, t0);
  m.check(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  m.check(cudaMalloc(&m.shards, m.own.size() * m.p * sizeof(T) + sizeof(T)), "cudaMalloc (shards)");
  m.check(cudaMalloc(&m.received, (options.shards - m.own.size()) * m.slice * sizeof(T) + sizeof(T)),
          "cudaMalloc (received)");
  m.check(cudaMalloc(&m.reduced, m.world * m.slice * sizeof(T) + sizeof(T)), "cudaMalloc (reduced)");
  m.check(cudaMalloc(reinterpret_cast<void**>(&m.pieces), options.shards * sizeof(T*)), "cudaMalloc (pieces)");
  // Where shard s's piece of this rank's slice lives: received, or in place in this rank's own shard buffer.
  const Range mine = m.slice_range(m.rank);
  m.host_pieces.resize(options.shards);
  for (std::size_t s = 0, r = 0; s < options.shards; ++s)
    m.host_pieces[s] = s >= m.own.begin && s < m.own.end ? m.shards + (s - m.own.begin) * m.p + mine.begin
                                                         : m.received + (r++) * m.slice;
  m.check(cudaMemcpy(m.pieces, m.host_pieces.data(), options.shards * sizeof(T*), cudaMemcpyHostToDevice),
          "cudaMemcpy (pieces)");
}

template <class T>
Core<T>::~Core() = default;

template <class T>
Range Core<T>::owned() const {
  return impl_->own;
}
template <class T>
T* Core<T>::shard(std::size_t k) {
  return impl_->shards + k * impl_->p;
}
template <class T>
const T* Core<T>::reduced() const {
  return impl_->reduced;
}

template <class T>
void Core<T>::reduce() {
  Impl& m = *impl_;
  m.usable("reduce");
  const double limit = m.reduces == 0 ? m.limits.first_timeout_s : m.limits.timeout_s;
  const std::string call = "reduce() number " + std::to_string(m.reduces + 1);
  const auto t0 = steady::now();
  const Range mine = m.slice_range(m.rank);
  // The exchange: to each other rank, this rank's shards' pieces of its slice
  // (ascending shard); from each, its shards' pieces of this rank's slice.
  // NCCL matches the sends and receives between two ranks in call order.
  m.check(ncclGroupStart(), "ncclGroupStart");
  std::size_t r = 0;
  for (int q = 0; q < m.world; ++q) {
    if (q == m.rank) continue;
    const Range theirs = m.slice_range(q);
    for (std::size_t k = 0; k < m.own.size(); ++k)
      if (!theirs.empty())
        m.check(ncclSend(m.shards + k * m.p + theirs.begin, theirs.size(), nccl_type<T>(), q, m.comm, m.stream),
                "ncclSend");
    const Range from = owned_shards(m.options.shards, m.world, q);
    for (std::size_t k = 0; k < from.size(); ++k, ++r)
      if (!mine.empty())
        m.check(ncclRecv(m.received + r * m.slice, mine.size(), nccl_type<T>(), q, m.comm, m.stream), "ncclRecv");
  }
  m.check(ncclGroupEnd(), "ncclGroupEnd");
  // A non-blocking group may still be enqueueing its kernels: the fold goes on the stream after them.
  m.settle((call + ": the exchange's enqueueing (ncclGroupEnd)").c_str(), limit, t0);
  if (!mine.empty()) {
    const unsigned threads = 256;
    const unsigned blocks = static_cast<unsigned>((mine.size() + threads - 1) / threads);
    fold_kernel<T><<<blocks, threads, 0, m.stream>>>(m.pieces, m.options.shards, mine.size(),
                                                     m.options.combine == Combine::mean, m.reduced + mine.begin);
    m.check(cudaGetLastError(), "the fold kernel");
  }
  m.check(ncclAllGather(m.reduced + m.rank * m.slice, m.reduced, m.slice, nccl_type<T>(), m.comm, m.stream),
          "ncclAllGather");
  m.settle((call + ": the allgather's enqueueing").c_str(), limit, t0);
  m.wait_stream((call + " (exchange, fold, allgather on the device)").c_str(), limit, t0);
  ++m.reduces;
}

template <class T>
void Core<T>::load(std::size_t k, const T* grads, std::span<const Run> runs) {
  Impl& m = *impl_;
  m.usable("load");
  if (k >= m.own.size()) throw Error(m.who() + "load: shard index " + std::to_string(k) + " is not one of this rank's");
  // The engine runs its backward on its own stream: wait for it.
  m.check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (the engine's backward, before load)");
  T* to = m.shards + k * m.p;
  for (const Run& r : runs) {
    if (r.flat + r.size > m.p) throw Error(m.who() + "load: a gradient run ends past the reducer's P values");
    // cudaMemcpyDefault: device to device on the CUDA backend (host memory would work too, through UVA).
    m.check(cudaMemcpyAsync(to + r.flat, grads + r.engine, r.size * sizeof(T), cudaMemcpyDefault, m.stream),
            "cudaMemcpyAsync (engine gradient to shard buffer)");
  }
  m.check(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize (load)");
}

template <class T>
void Core<T>::store(T* grads, std::span<const Run> runs) {
  Impl& m = *impl_;
  m.usable("store");
  for (const Run& r : runs) {
    if (r.flat + r.size > m.p) throw Error(m.who() + "store: a gradient run ends past the reducer's P values");
    m.check(cudaMemcpyAsync(grads + r.engine, m.reduced + r.flat, r.size * sizeof(T), cudaMemcpyDefault, m.stream),
            "cudaMemcpyAsync (reduced gradient to engine)");
  }
  // The engine's optimizer kernels run next, on another stream.
  m.check(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize (store)");
}

template <class T>
void Core<T>::reduce_host(std::span<const T> own_shards, std::span<T> out) {
  Impl& m = *impl_;
  if (own_shards.size() != m.own.size() * m.p || out.size() != m.p)
    throw Error(m.who() + "reduce_host: expected owned() x P values in and P out");
  m.check(cudaMemcpy(m.shards, own_shards.data(), own_shards.size_bytes(), cudaMemcpyHostToDevice), "upload");
  reduce();
  m.check(cudaMemcpy(out.data(), m.reduced, out.size_bytes(), cudaMemcpyDeviceToHost), "download");
}

template class Core<float>;
template class Core<double>;

}  // namespace grad::dist::nccl::detail
