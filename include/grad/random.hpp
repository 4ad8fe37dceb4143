// A small deterministic generator (splitmix64): the same stream on every
// platform and compiler, so data, initial weights and test inputs are a
// function of the seed alone (std::*_distribution are not portable).
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

namespace grad {

struct SplitMix64 {
  std::uint64_t state;
  explicit SplitMix64(std::uint64_t seed) : state(seed) {}

  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  // Uniform in [lo, hi), from the top 53 bits.
  double uniform(double lo, double hi) { return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53; }
  // Box-Muller; the second variate is dropped to keep the stream simple.
  double normal() {
    const double u1 = 1.0 - uniform(0, 1);  // in (0, 1]: log is finite
    const double u2 = uniform(0, 1);
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }
};

}  // namespace grad
