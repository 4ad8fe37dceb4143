// The NCCL path of grad::dist on one GPU (one rank, SoloGroup: no MPI): S
// shards of deterministic values go through grad::dist::nccl::ShardReducer
// and must come back as the host fold of grad/dist.hpp (fold_pieces), bit for
// bit, float and double. Exit status 1 on a difference, 2 on an error, 77 when
// no CUDA device answers (nothing was checked).
//   nccl_check [--shards S] [--elements P]
#include <cstdio>
#include <cstring>
#include <grad/device/engine.hpp>
#include <grad/dist.hpp>
#include <grad/dist_nccl.hpp>
#include <grad/random.hpp>
#include <string>
#include <vector>

namespace {

template <class T>
bool check(grad::dist::Group& comm, std::size_t shards, std::size_t p) {
  namespace dist = grad::dist;
  // Every shard's values, on every rank (each rank uploads only its own).
  std::vector<std::vector<T>> all(shards, std::vector<T>(p));
  grad::SplitMix64 rng(2026);
  for (auto& shard : all)
    for (T& x : shard) x = static_cast<T>(rng.uniform(-1, 1) * (rng.next() % 7 == 0 ? 1e6 : 1.0));
  std::vector<const T*> pieces;
  for (const auto& shard : all) pieces.push_back(shard.data());
  std::vector<T> expected(p);
  dist::fold_pieces<T>(pieces, expected.data(), p, dist::Combine::mean);

  dist::nccl::ShardReducer<T> reducer(comm, 0, p, {.shards = shards});
  std::vector<T> own;
  for (std::size_t s = reducer.owned().begin; s < reducer.owned().end; ++s)
    own.insert(own.end(), all[s].begin(), all[s].end());
  std::vector<T> got(p);
  reducer.reduce_host(own, got);
  const bool same = std::memcmp(got.data(), expected.data(), p * sizeof(T)) == 0;
  std::printf("nccl_check: rank %d of %d, %s, %zu shards, %zu values: %s\n", comm.rank(), comm.size(),
              sizeof(T) == 4 ? "float" : "double", shards, p,
              same ? "bitwise equal to the host fold" : "DIFFERS from the host fold");
  return same;
}

}  // namespace

int main(int argc, char** argv) {
  std::size_t shards = 4, p = 1000003;
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--shards")
      shards = std::stoul(argv[++i]);
    else if (k == "--elements")
      p = std::stoul(argv[++i]);
  }
  if (!grad::device::cuda_available()) {
    std::printf("nccl_check: skipped, no CUDA device: %s\n", grad::device::cuda_unavailable_reason().c_str());
    return 77;
  }
  grad::dist::SoloGroup comm;
  try {
    const bool ok = check<float>(comm, shards, p) & check<double>(comm, shards, p);
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
