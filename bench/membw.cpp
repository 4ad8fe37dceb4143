// This machine's memory bandwidth, for bench/real_scale.sh: decoding reads
// every weight once per token, so bytes of weights x tokens/s over this
// figure is the fraction of the machine's bandwidth a decoder reaches.
//
//   membw [threads] [MiB per array]     (default: 1 thread, 1024 MiB)
//
// read:  sum += r[i]                (bytes: one array; 32-bit integers, whose
//                                    sum the compiler vectorizes, so the adds never limit it)
// triad: a[i] = b[i] + s * c[i]     (bytes: three arrays, the store's
//                                    read-for-ownership not counted, as STREAM)
// Each is split over the threads in contiguous ranges, run 7 times; the best
// time is reported (STREAM's convention), and the median beside it.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace {

template <class Body>
double seconds(std::size_t threads, std::size_t n, Body body) {
  std::vector<std::thread> pool;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::size_t t = 0; t < threads; ++t) pool.emplace_back([=] { body(n * t / threads, n * (t + 1) / threads, t); });
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void report(const char* name, std::vector<double> times, double bytes) {
  std::sort(times.begin(), times.end());
  std::printf("%s %.2f GB/s best, %.2f GB/s median\n", name, bytes / times.front() / 1e9,
              bytes / times[times.size() / 2] / 1e9);
}

}  // namespace

int main(int argc, char** argv) {
  const std::size_t threads = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : 1;
  const std::size_t mib = argc > 2 ? std::strtoul(argv[2], nullptr, 10) : 1024;
  if (threads < 1 || threads > 256 || mib < 1) {
    std::fprintf(stderr, "membw: expected [threads 1..256] [MiB per array >= 1]\n");
    return 2;
  }
  const std::size_t n = mib * 1024 * 1024 / sizeof(float);
  std::vector<float> a(n, 1.0f), b(n, 2.0f), c(n, 3.0f);
  std::vector<std::uint32_t> r(n, 1);
  std::vector<std::uint64_t> sums(threads, 0);
  std::vector<double> read, triad;
  for (int rep = 0; rep < 7; ++rep) {
    read.push_back(seconds(threads, n, [&](std::size_t lo, std::size_t hi, std::size_t t) {
      std::uint32_t s = 0;
      for (std::size_t i = lo; i < hi; ++i) s += r[i];
      sums[t] += s;
    }));
    triad.push_back(seconds(threads, n, [&](std::size_t lo, std::size_t hi, std::size_t) {
      for (std::size_t i = lo; i < hi; ++i) a[i] = b[i] + 0.5f * c[i];
    }));
  }
  std::uint64_t check = 0;
  for (std::uint64_t s : sums) check += s;
  std::printf("membw: %zu thread(s), %zu MiB arrays (checksum %llu)\n", threads, mib, static_cast<unsigned long long>(check));
  report("read", read, static_cast<double>(n * sizeof(float)));
  report("triad", triad, 3.0 * static_cast<double>(n * sizeof(float)));
  return 0;
}
