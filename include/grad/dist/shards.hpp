// grad::dist's pieces that need no tape: the shard and slice arithmetic,
// the documented fold (the one definition of the order, grad/dist.hpp
// describes it), the options, and the MPI Communicator's declaration (its
// definition is src/dist_mpi.cpp, the grad_dist library). Included by
// grad/dist.hpp, and alone by device code (src/dist_nccl.cu).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

namespace grad::dist {

// What every grad::dist failure throws (the same message on every rank that
// can know it; the message names the rank where it matters).
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// A half-open range [begin, end).
struct Range {
  std::size_t begin = 0, end = 0;
  std::size_t size() const { return end - begin; }
  bool empty() const { return begin == end; }
};

// Part k of n of a sequence of `count`, contiguous, ascending: the first
// count % n parts hold one element more than the others.
inline Range split(std::size_t count, std::size_t n, std::size_t k) {
  const std::size_t base = count / n, extra = count % n;
  const std::size_t begin = k * base + (k < extra ? k : extra);
  return {begin, begin + base + (k < extra ? 1 : 0)};
}

// Rows of shard s of a batch of `rows` cut into `shards` shards.
inline Range shard_rows(std::size_t rows, std::size_t shards, std::size_t s) { return split(rows, shards, s); }
// The shards rank `rank` of `world` computes: a contiguous block, ascending
// (so that the ranks' blocks, in rank order, are the shards in order).
inline Range owned_shards(std::size_t shards, int world, int rank) {
  return split(shards, static_cast<std::size_t>(world), static_cast<std::size_t>(rank));
}
// The slice of the P flattened parameters whose reduction rank `rank` does.
inline Range slice_of(std::size_t elements, int world, int rank) {
  return split(elements, static_cast<std::size_t>(world), static_cast<std::size_t>(rank));
}

enum class Combine : std::uint32_t { sum = 1, mean = 2 };

// ---- the documented order: the only definition, used by every path ----

// acc[i] = acc[i] + next[i]: shard s joining the fold of shards 0 .. s-1.
template <class T>
void fold_add(T* __restrict acc, const T* __restrict next, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] + next[i];
}
// The fold's last step: acc[i] / T(shards) under Combine::mean, nothing under sum.
template <class T>
void fold_finish(T* acc, std::size_t n, std::size_t shards, Combine combine) {
  if (combine != Combine::mean) return;
  const T d = static_cast<T>(shards);
  for (std::size_t i = 0; i < n; ++i) acc[i] = acc[i] / d;
}
// The step loss from the S shard losses, in the same order.
template <class T>
T fold_losses(std::span<const T> losses, Combine combine) {
  if (losses.empty()) return T(0);
  T acc = losses[0];
  for (std::size_t s = 1; s < losses.size(); ++s) acc = acc + losses[s];
  if (combine == Combine::mean) acc = acc / static_cast<T>(losses.size());
  return acc;
}

// The whole fold of S shards' pieces (pieces[s]: n values each) into out,
// in blocks that stay in cache: per element exactly fold_add's and
// fold_finish's operations, in their order.
template <class T>
void fold_pieces(std::span<const T* const> pieces, T* out, std::size_t n, Combine combine) {
  constexpr std::size_t block = 2048;
  for (std::size_t at = 0; at < n; at += block) {
    const std::size_t m = std::min(block, n - at);
    std::memcpy(out + at, pieces[0] + at, m * sizeof(T));
    for (std::size_t s = 1; s < pieces.size(); ++s) fold_add(out + at, pieces[s] + at, m);
    fold_finish(out + at, m, pieces.size(), combine);
  }
}

struct ShardOptions {
  std::size_t shards = 1;           // S: fixed by the user, independent of the rank count
  Combine combine = Combine::mean;  // how the fold ends (above)
  std::uint64_t check_every = 0;    // DataParallel: compare parameter checksums every N steps (0: never)
  bool broadcast_initial = true;    // DataParallel: start every rank from rank 0's parameters
};

// ---------------------------------------------------------------------------
// The MPI part. Declared here, defined in src/dist_mpi.cpp (the grad_dist
// library, which links Open MPI); this header never includes mpi.h.

// The watchdog's limits. A collective (and MPI_Finalize, in ~Communicator)
// that runs past its timeout ends the process with a message on stderr and
// exit code watchdog_exit_code. The timeout covers the wait for the slowest
// rank too: raise timeout_s when the ranks' work between two collectives can
// differ by more than that (a step's compute is not timed, only the wait).
struct CommOptions {
  double first_timeout_s = 60;  // the first collective (DataParallel's model check): every rank must arrive
  double timeout_s = 30;        // every later collective, and MPI_Finalize
};
// Not 124 (coreutils timeout), 126/127 (the shell) or 128 + a signal: a
// wrapper can tell "a peer hung" from its own timeout. (75 is sysexits'
// EX_TEMPFAIL: the run may succeed when retried.)
inline constexpr int watchdog_exit_code = 75;

// Where the time goes, for the scaling figures.
struct CommStats {
  double seconds = 0;       // inside collectives (waiting for other ranks included)
  std::uint64_t bytes = 0;  // sent by this rank (its own slice to itself not counted)
  std::uint64_t calls = 0;
};

// The processes that train together, as the shard scheme needs them: a
// rank, a size and a few collectives over every rank (each throws Error when
// it fails). Communicator is the MPI one (src/dist_mpi.cpp); SoloGroup is
// one process without MPI, where every collective is a copy, so code written
// against a Group runs unchanged (and on the same bits) in one process.
class Group {
 public:
  virtual ~Group() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // What the next collectives belong to (shown by timeout and SIGTERM messages).
  virtual void set_step(std::uint64_t) {}

  virtual void barrier(const char* what) = 0;
  virtual void broadcast(void* data, std::size_t bytes, int root, const char* what) = 0;
  // Every rank sends `bytes`; recv gets size() * bytes, by rank.
  virtual void allgather(const void* send, std::size_t bytes, void* recv, const char* what) = 0;
  // Typed exchanges (counts and displacements in elements, by rank).
  virtual void alltoallv(const float* send, const std::size_t* send_counts, const std::size_t* send_displs, float* recv,
                         const std::size_t* recv_counts, const std::size_t* recv_displs, const char* what) = 0;
  virtual void alltoallv(const double* send, const std::size_t* send_counts, const std::size_t* send_displs,
                         double* recv, const std::size_t* recv_counts, const std::size_t* recv_displs,
                         const char* what) = 0;
  virtual void allgatherv(const float* send, std::size_t count, float* recv, const std::size_t* counts,
                          const std::size_t* displs, const char* what) = 0;
  virtual void allgatherv(const double* send, std::size_t count, double* recv, const std::size_t* counts,
                          const std::size_t* displs, const char* what) = 0;
};

// One process, no MPI: rank 0 of 1.
class SoloGroup final : public Group {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void barrier(const char*) override {}
  void broadcast(void*, std::size_t, int, const char*) override {}
  void allgather(const void* send, std::size_t bytes, void* recv, const char*) override { copy(recv, send, bytes); }
  void alltoallv(const float* send, const std::size_t* sc, const std::size_t* sd, float* recv, const std::size_t*,
                 const std::size_t* rd, const char*) override {
    copy(recv + rd[0], send + sd[0], sc[0] * sizeof(float));
  }
  void alltoallv(const double* send, const std::size_t* sc, const std::size_t* sd, double* recv, const std::size_t*,
                 const std::size_t* rd, const char*) override {
    copy(recv + rd[0], send + sd[0], sc[0] * sizeof(double));
  }
  void allgatherv(const float* send, std::size_t count, float* recv, const std::size_t*, const std::size_t* displs,
                  const char*) override {
    copy(recv + displs[0], send, count * sizeof(float));
  }
  void allgatherv(const double* send, std::size_t count, double* recv, const std::size_t*, const std::size_t* displs,
                  const char*) override {
    copy(recv + displs[0], send, count * sizeof(double));
  }

 private:
  static void copy(void* to, const void* from, std::size_t bytes) {
    if (bytes > 0 && to != from) std::memmove(to, from, bytes);
  }
};

// MPI_COMM_WORLD with grad's failure rules. The constructor initialises MPI
// (unless the program already has) and makes MPI errors return instead of
// aborting, so they become dist::Error with the call and MPI's message; it
// starts a watchdog thread that ends the process with a message when a
// collective runs past its timeout, and installs a SIGTERM handler that says
// why the launcher stopped this rank. The destructor finalises MPI if the
// constructor initialised it, still under the watchdog: a rank that never
// reaches MPI_Finalize (hung after the last collective) would otherwise leave
// every other rank waiting in it forever.
class Communicator final : public Group {
 public:
  Communicator(int* argc, char*** argv, CommOptions options = {});
  ~Communicator() override;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const override;
  int size() const override;
  const CommStats& stats() const;
  void reset_stats();
  void set_step(std::uint64_t step) override;

  void barrier(const char* what) override;
  void broadcast(void* data, std::size_t bytes, int root, const char* what) override;
  void allgather(const void* send, std::size_t bytes, void* recv, const char* what) override;
  void alltoallv(const float* send, const std::size_t* send_counts, const std::size_t* send_displs, float* recv,
                 const std::size_t* recv_counts, const std::size_t* recv_displs, const char* what) override;
  void alltoallv(const double* send, const std::size_t* send_counts, const std::size_t* send_displs, double* recv,
                 const std::size_t* recv_counts, const std::size_t* recv_displs, const char* what) override;
  void allgatherv(const float* send, std::size_t count, float* recv, const std::size_t* counts,
                  const std::size_t* displs, const char* what) override;
  void allgatherv(const double* send, std::size_t count, double* recv, const std::size_t* counts,
                  const std::size_t* displs, const char* what) override;

  // Prints "grad::dist: rank r of n: <why>" on stderr and ends every rank (MPI_Abort).
  [[noreturn]] void abort(const std::string& why, int code = 1);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace grad::dist
