// Each core's compute speed right now, for bench/real_scale.sh: on a virtual
// machine a vCPU shares its physical core with whatever the host runs on the
// sibling hardware thread, and on this kind of machine one vCPU was measured
// to run vector arithmetic at 56-77 % of the other's speed for minutes at a
// time, then at full speed again. A thread-scaling figure taken meanwhile
// measures the host, not the program; this snapshot says when that happened.
//
//   corespeed [milliseconds]      (default 400)
//
// One thread per CPU this process may run on, each pinned to its CPU, all
// started together, each running independent multiply-add chains on vector
// registers (no memory traffic) for about the given time. Prints a header
// line (with a checksum of the chains, which keeps them computed), one line per
// CPU: "cpu N G Gop/s", then "slowest/fastest R".
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

typedef float Lanes __attribute__((vector_size(16)));  // SSE: on every x86-64, and elsewhere by parts
constexpr int chains = 12;  // enough independent chains to keep every vector pipe busy
constexpr long block = 1 << 16;

// Rounds of `block` iterations until `seconds` have passed; returns the
// operations per second (a multiply and an add per lane, chain and iteration).
double spin(double seconds, float seed, float* sink) {
  Lanes x[chains];
  for (int c = 0; c < chains; ++c) x[c] = Lanes{} + (seed + static_cast<float>(c) * 1e-3f);
  const Lanes m = Lanes{} + 0.9999999f, a = Lanes{} + 1e-7f;
  long iterations = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    for (long i = 0; i < block; ++i) {
#pragma GCC unroll 16
      for (int c = 0; c < chains; ++c) x[c] = x[c] * m + a;  // unrolled, so the chains live in registers
    }
    iterations += block;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < seconds);
  float s = 0;
  for (int c = 0; c < chains; ++c)
    for (int l = 0; l < 4; ++l) s += x[c][l];
  *sink = s;
  return 2.0 * 4 * chains * static_cast<double>(iterations) / elapsed;
}

}  // namespace

int main(int argc, char** argv) {
  const long ms = argc > 1 ? std::strtol(argv[1], nullptr, 10) : 400;
  if (ms < 10 || ms > 60000) {
    std::fprintf(stderr, "corespeed: expected [milliseconds 10..60000]\n");
    return 2;
  }
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) {
    std::perror("corespeed: sched_getaffinity");
    return 1;
  }
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &allowed)) cpus.push_back(c);
  std::vector<double> rate(cpus.size());
  std::vector<float> sink(cpus.size());
  std::atomic<std::size_t> ready{0};
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < cpus.size(); ++i)
    threads.emplace_back([&, i] {
      cpu_set_t one;
      CPU_ZERO(&one);
      CPU_SET(cpus[i], &one);
      sched_setaffinity(0, sizeof one, &one);  // this thread only; unpinned if refused
      ready.fetch_add(1);
      while (ready.load() < cpus.size()) std::this_thread::yield();
      rate[i] = spin(static_cast<double>(ms) / 1e3, static_cast<float>(i), &sink[i]);
    });
  for (std::thread& t : threads) t.join();
  float checksum = 0;
  for (float x : sink) checksum += x;
  std::printf("corespeed: %zu CPUs, %ld ms each (checksum %g)\n", cpus.size(), ms, static_cast<double>(checksum));
  for (std::size_t i = 0; i < cpus.size(); ++i) std::printf("cpu %d %.1f Gop/s\n", cpus[i], rate[i] / 1e9);
  const auto [lo, hi] = std::minmax_element(rate.begin(), rate.end());
  std::printf("slowest/fastest %.2f\n", *lo / *hi);
  return 0;
}
