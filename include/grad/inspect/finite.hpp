// first_non_finite: the scan behind anomaly detection, shared by the tape's
// hooks and the device engine's replay (which must not include the tape).
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace grad::inspect_detail {

// Index of the first non-finite element of p[0..n), or n. The common case
// (all finite) is one branch-free pass over the exponent bits, which the
// compiler can vectorise (std::isfinite per element in a loop with an early
// exit cannot be); only a buffer that has one is searched for it.
template <class T>
std::size_t first_non_finite(const T* p, std::size_t n) {
  using Bits = std::conditional_t<sizeof(T) == 8, std::uint64_t, std::uint32_t>;
  constexpr Bits exponent = static_cast<Bits>(sizeof(T) == 8 ? 0x7ff0000000000000ULL : 0x7f800000ULL);
  Bits any = 0;
  for (std::size_t k = 0; k < n; ++k) any |= static_cast<Bits>((std::bit_cast<Bits>(p[k]) & exponent) == exponent);
  if (any == 0) return n;
  for (std::size_t k = 0; k < n; ++k)
    if (!std::isfinite(p[k])) return k;
  return n;
}

}  // namespace grad::inspect_detail
