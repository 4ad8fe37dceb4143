// grad::dist::Communicator on MPI (the grad_dist library; grad/dist.hpp
// declares it). MPI_COMM_WORLD with errors returned (MPI_ERRORS_RETURN) and
// turned into dist::Error; a watchdog thread that stops the process with a
// message (exit code watchdog_exit_code) when a collective or MPI_Finalize
// runs past its timeout; a SIGTERM handler that
// says why the launcher stopped this rank (mpirun sends SIGTERM to every
// rank when one of them dies or aborts).
// The C API only (Open MPI and MPICH would otherwise pull in their deprecated C++ bindings).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "grad/dist.hpp"

namespace grad::dist {

namespace {

// What the signal handler prints: prepared outside it (async-signal-safe: write only).
char g_term_prefix[160];
std::atomic<const char*> g_phase{"no collective yet"};
std::atomic<std::uint64_t> g_step{0};

void write_all(const char* s, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(2, s, n);
    if (w <= 0) return;
    s += w;
    n -= static_cast<std::size_t>(w);
  }
}
std::size_t length(const char* s) {
  std::size_t n = 0;
  while (s[n]) ++n;
  return n;
}

extern "C" void on_sigterm(int) {
  write_all(g_term_prefix, length(g_term_prefix));
  const char* phase = g_phase.load();
  write_all(phase, length(phase));
  char digits[32];
  std::size_t n = 0;
  std::uint64_t step = g_step.load();
  do digits[sizeof digits - 1 - n++] = static_cast<char>('0' + step % 10);
  while ((step /= 10) != 0 && n < sizeof digits);
  write_all(", step ", 7);
  write_all(digits + sizeof digits - n, n);
  write_all(")\n", 2);
  ::_exit(143);
}

std::string mpi_message(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(len));
}

int to_int(std::size_t n, const char* what) {
  if (n > static_cast<std::size_t>(INT_MAX))
    throw Error(std::string("grad::dist: ") + what + ": a message of " + std::to_string(n) +
                " elements is more than MPI's int counts hold (2^31 - 1)");
  return static_cast<int>(n);
}

template <class T>
MPI_Datatype mpi_type();
template <>
MPI_Datatype mpi_type<float>() {
  return MPI_FLOAT;
}
template <>
MPI_Datatype mpi_type<double>() {
  return MPI_DOUBLE;
}

}  // namespace

struct Communicator::Impl {
  int rank = 0, size = 1;
  bool initialised_here = false;
  CommOptions options;
  CommStats stats;
  bool first_done = false;

  // The watchdog: armed around every collective.
  std::mutex mutex;
  std::condition_variable cv;
  bool stop = false;
  bool armed = false;
  std::chrono::steady_clock::time_point deadline;
  double armed_timeout = 0;
  const char* armed_what = "";
  std::thread watchdog;

  std::string where() const {
    return "grad::dist: rank " + std::to_string(rank) + " of " + std::to_string(size) + ": ";
  }

  void watch() {
    std::unique_lock lock(mutex);
    while (!stop) {
      if (armed && std::chrono::steady_clock::now() >= deadline) {
        char text[512];
        std::snprintf(text, sizeof text,
                      "grad::dist: rank %d of %d: %s did not complete within %.0f s (step %llu): another rank is "
                      "gone, stuck, or never called it; stopping this rank\n",
                      rank, size, armed_what, armed_timeout, static_cast<unsigned long long>(g_step.load()));
        write_all(text, length(text));
        ::_exit(watchdog_exit_code);
      }
      cv.wait_for(lock, std::chrono::milliseconds(50));
    }
  }

  void arm(const char* what, double timeout, std::chrono::steady_clock::time_point t0) {
    std::lock_guard lock(mutex);
    armed = true;
    armed_what = what;
    armed_timeout = timeout;
    deadline =
        t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(timeout));
  }
  void disarm() {
    std::lock_guard lock(mutex);
    armed = false;
  }

  // Runs one collective under the watchdog; throws Error when MPI reports a failure.
  template <class F>
  void collective(const char* what, const char* call, std::uint64_t bytes, F&& f) {
    const double timeout = first_done ? options.timeout_s : options.first_timeout_s;
    g_phase.store(what);
    const auto t0 = std::chrono::steady_clock::now();
    arm(what, timeout, t0);
    const int rc = f();
    disarm();
    first_done = true;
    stats.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats.bytes += bytes;
    ++stats.calls;
    if (rc != MPI_SUCCESS) throw Error(where() + call + " (" + what + ") failed: " + mpi_message(rc));
  }

  template <class T>
  void alltoallv(const T* send, const std::size_t* sc, const std::size_t* sd, T* recv, const std::size_t* rc,
                 const std::size_t* rd, const char* what) {
    std::vector<int> scounts(size), sdispls(size), rcounts(size), rdispls(size);
    std::uint64_t bytes = 0;
    for (int q = 0; q < size; ++q) {
      scounts[q] = to_int(sc[q], what);
      sdispls[q] = to_int(sd[q], what);
      rcounts[q] = to_int(rc[q], what);
      rdispls[q] = to_int(rd[q], what);
      if (q != rank) bytes += sc[q] * sizeof(T);
    }
    collective(what, "MPI_Alltoallv", bytes, [&] {
      return MPI_Alltoallv(send, scounts.data(), sdispls.data(), mpi_type<T>(), recv, rcounts.data(), rdispls.data(),
                           mpi_type<T>(), MPI_COMM_WORLD);
    });
  }

  template <class T>
  void allgatherv(const T* send, std::size_t count, T* recv, const std::size_t* counts, const std::size_t* displs,
                  const char* what) {
    std::vector<int> c(size), d(size);
    for (int q = 0; q < size; ++q) {
      c[q] = to_int(counts[q], what);
      d[q] = to_int(displs[q], what);
    }
    const int n = to_int(count, what);
    // The send buffer is this rank's part of recv already: MPI_IN_PLACE.
    const bool in_place = send == recv + displs[rank];
    collective(what, "MPI_Allgatherv", count * sizeof(T) * static_cast<std::uint64_t>(size - 1), [&] {
      return MPI_Allgatherv(in_place ? MPI_IN_PLACE : send, n, mpi_type<T>(), recv, c.data(), d.data(), mpi_type<T>(),
                            MPI_COMM_WORLD);
    });
  }
};

Communicator::Communicator(int* argc, char*** argv, CommOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->options = options;
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    int provided = 0;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      throw Error("grad::dist: MPI_Init_thread failed");
    impl_->initialised_here = true;
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &impl_->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &impl_->size);
  std::snprintf(g_term_prefix, sizeof g_term_prefix,
                "grad::dist: rank %d of %d: stopped by the launcher (SIGTERM): another rank died or aborted, or the "
                "job was cancelled (its last collective: ",
                impl_->rank, impl_->size);
  struct sigaction sa {};
  sa.sa_handler = on_sigterm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  impl_->watchdog = std::thread([this] { impl_->watch(); });
}

Communicator::~Communicator() {
  // MPI_Finalize waits for every rank (Open MPI's ends in a fence): one that
  // hangs after the last collective and never gets here would keep the
  // others in it forever, so the watchdog stays armed until it returns.
  if (impl_->initialised_here) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      g_phase.store("MPI_Finalize");
      impl_->arm("MPI_Finalize", impl_->first_done ? impl_->options.timeout_s : impl_->options.first_timeout_s,
                 std::chrono::steady_clock::now());
      MPI_Finalize();
      impl_->disarm();
    }
  }
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->watchdog.join();
}

int Communicator::rank() const { return impl_->rank; }
int Communicator::size() const { return impl_->size; }
const CommStats& Communicator::stats() const { return impl_->stats; }
void Communicator::reset_stats() { impl_->stats = {}; }
void Communicator::set_step(std::uint64_t step) { g_step.store(step); }

void Communicator::barrier(const char* what) {
  impl_->collective(what, "MPI_Barrier", 0, [] { return MPI_Barrier(MPI_COMM_WORLD); });
}

void Communicator::broadcast(void* data, std::size_t bytes, int root, const char* what) {
  // In pieces below 2^31 bytes (MPI's int counts).
  auto* p = static_cast<char*>(data);
  constexpr std::size_t piece = std::size_t(1) << 30;
  for (std::size_t at = 0; at < bytes; at += piece) {
    const std::size_t n = std::min(bytes - at, piece);
    impl_->collective(what, "MPI_Bcast", impl_->rank == root ? n * static_cast<std::uint64_t>(impl_->size - 1) : 0,
                      [&] { return MPI_Bcast(p + at, static_cast<int>(n), MPI_BYTE, root, MPI_COMM_WORLD); });
  }
}

void Communicator::allgather(const void* send, std::size_t bytes, void* recv, const char* what) {
  const int n = to_int(bytes, what);
  impl_->collective(what, "MPI_Allgather", bytes * static_cast<std::uint64_t>(impl_->size - 1),
                    [&] { return MPI_Allgather(send, n, MPI_BYTE, recv, n, MPI_BYTE, MPI_COMM_WORLD); });
}

void Communicator::alltoallv(const float* send, const std::size_t* sc, const std::size_t* sd, float* recv,
                             const std::size_t* rc, const std::size_t* rd, const char* what) {
  impl_->alltoallv(send, sc, sd, recv, rc, rd, what);
}
void Communicator::alltoallv(const double* send, const std::size_t* sc, const std::size_t* sd, double* recv,
                             const std::size_t* rc, const std::size_t* rd, const char* what) {
  impl_->alltoallv(send, sc, sd, recv, rc, rd, what);
}
void Communicator::allgatherv(const float* send, std::size_t count, float* recv, const std::size_t* counts,
                              const std::size_t* displs, const char* what) {
  impl_->allgatherv(send, count, recv, counts, displs, what);
}
void Communicator::allgatherv(const double* send, std::size_t count, double* recv, const std::size_t* counts,
                              const std::size_t* displs, const char* what) {
  impl_->allgatherv(send, count, recv, counts, displs, what);
}

void Communicator::abort(const std::string& why, int code) {
  const std::string text = impl_->where() + why + "\n";
  write_all(text.data(), text.size());
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);
}

}  // namespace grad::dist
