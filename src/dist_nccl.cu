// grad::dist::nccl::ShardReducer (grad/dist_nccl.hpp): the shard fold of
// grad/dist.hpp on device buffers over NCCL. Built with --fmad=false like
// every device unit of grad (the project's cuda_args), so the fold kernel is
// a rounded add per shard and a rounded divide: the host fold's bits.
#include <cuda_runtime.h>
#include <nccl.h>

#include <string>
#include <vector>

#include "grad/dist_nccl.hpp"

namespace grad::dist::nccl {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("grad::dist::nccl: ") + what + ": " + cudaGetErrorString(e));
}
void check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) throw Error(std::string("grad::dist::nccl: ") + what + ": " + ncclGetErrorString(r));
}

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

}  // namespace

template <class T>
struct ShardReducer<T>::Impl {
  int rank = 0, world = 1;
  std::size_t p = 0, slice = 0;  // slice: ceil(P / W), the last one padded (ncclAllGather takes equal counts)
  ShardOptions options;
  Range own;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  T* shards = nullptr;         // own.size() x P
  T* received = nullptr;       // (S - own.size()) x slice
  T* reduced = nullptr;        // W x slice
  const T** pieces = nullptr;  // S device pointers
  std::vector<const T*> host_pieces;

  Range slice_range(int q) const {
    const std::size_t begin = std::min(p, static_cast<std::size_t>(q) * slice);
    return {begin, std::min(p, begin + slice)};
  }
};

template <class T>
ShardReducer<T>::ShardReducer(Communicator& comm, int device, std::size_t elements, ShardOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.rank = comm.rank();
  m.world = comm.size();
  m.p = elements;
  m.options = options;
  if (options.shards < static_cast<std::size_t>(m.world))
    throw Error("grad::dist::nccl: every rank needs at least one shard (shards < ranks)");
  m.own = owned_shards(options.shards, m.world, m.rank);
  m.slice = (elements + m.world - 1) / m.world;
  check(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId id{};
  if (m.rank == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  comm.broadcast(&id, sizeof id, 0, "the NCCL unique id");
  check(ncclCommInitRank(&m.comm, m.world, id, m.rank), "ncclCommInitRank");
  check(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check(cudaMalloc(&m.shards, m.own.size() * m.p * sizeof(T) + sizeof(T)), "cudaMalloc (shards)");
  check(cudaMalloc(&m.received, (options.shards - m.own.size()) * m.slice * sizeof(T) + sizeof(T)),
        "cudaMalloc (received)");
  check(cudaMalloc(&m.reduced, m.world * m.slice * sizeof(T) + sizeof(T)), "cudaMalloc (reduced)");
  check(cudaMalloc(reinterpret_cast<void**>(&m.pieces), options.shards * sizeof(T*)), "cudaMalloc (pieces)");
  // Where shard s's piece of this rank's slice lives: received, or in place in this rank's own shard buffer.
  const Range mine = m.slice_range(m.rank);
  m.host_pieces.resize(options.shards);
  for (std::size_t s = 0, r = 0; s < options.shards; ++s)
    m.host_pieces[s] = s >= m.own.begin && s < m.own.end ? m.shards + (s - m.own.begin) * m.p + mine.begin
                                                         : m.received + (r++) * m.slice;
  check(cudaMemcpy(m.pieces, m.host_pieces.data(), options.shards * sizeof(T*), cudaMemcpyHostToDevice),
        "cudaMemcpy (pieces)");
}

template <class T>
ShardReducer<T>::~ShardReducer() {
  Impl& m = *impl_;
  if (m.comm) ncclCommDestroy(m.comm);
  cudaFree(m.shards);
  cudaFree(m.received);
  cudaFree(m.reduced);
  cudaFree(m.pieces);
  if (m.stream) cudaStreamDestroy(m.stream);
}

template <class T>
Range ShardReducer<T>::owned() const {
  return impl_->own;
}
template <class T>
T* ShardReducer<T>::shard(std::size_t k) {
  return impl_->shards + k * impl_->p;
}
template <class T>
const T* ShardReducer<T>::reduced() const {
  return impl_->reduced;
}

template <class T>
void ShardReducer<T>::reduce() {
  Impl& m = *impl_;
  const Range mine = m.slice_range(m.rank);
  // The exchange: to each other rank, this rank's shards' pieces of its slice
  // (ascending shard); from each, its shards' pieces of this rank's slice.
  // NCCL matches the sends and receives between two ranks in call order.
  check(ncclGroupStart(), "ncclGroupStart");
  std::size_t r = 0;
  for (int q = 0; q < m.world; ++q) {
    if (q == m.rank) continue;
    const Range theirs = m.slice_range(q);
    for (std::size_t k = 0; k < m.own.size(); ++k)
      if (!theirs.empty())
        check(ncclSend(m.shards + k * m.p + theirs.begin, theirs.size(), nccl_type<T>(), q, m.comm, m.stream),
              "ncclSend");
    const Range from = owned_shards(m.options.shards, m.world, q);
    for (std::size_t k = 0; k < from.size(); ++k, ++r)
      if (!mine.empty())
        check(ncclRecv(m.received + r * m.slice, mine.size(), nccl_type<T>(), q, m.comm, m.stream), "ncclRecv");
  }
  check(ncclGroupEnd(), "ncclGroupEnd");
  if (!mine.empty()) {
    const unsigned threads = 256;
    const unsigned blocks = static_cast<unsigned>((mine.size() + threads - 1) / threads);
    fold_kernel<T><<<blocks, threads, 0, m.stream>>>(m.pieces, m.options.shards, mine.size(),
                                                     m.options.combine == Combine::mean, m.reduced + mine.begin);
    check(cudaGetLastError(), "the fold kernel");
  }
  check(ncclAllGather(m.reduced + m.rank * m.slice, m.reduced, m.slice, nccl_type<T>(), m.comm, m.stream),
        "ncclAllGather");
  check(cudaStreamSynchronize(m.stream), "cudaStreamSynchronize");
}

template <class T>
void ShardReducer<T>::reduce_host(std::span<const T> own_shards, std::span<T> out) {
  Impl& m = *impl_;
  if (own_shards.size() != m.own.size() * m.p || out.size() != m.p)
    throw Error("grad::dist::nccl: reduce_host: expected owned() x P values in and P out");
  check(cudaMemcpy(m.shards, own_shards.data(), own_shards.size_bytes(), cudaMemcpyHostToDevice), "upload");
  reduce();
  check(cudaMemcpy(out.data(), m.reduced, out.size_bytes(), cudaMemcpyDeviceToHost), "download");
}

template class ShardReducer<float>;
template class ShardReducer<double>;

}  // namespace grad::dist::nccl
