// How a tape node's value is held in memory. A frozen base stored as
// bfloat16 takes half a float's memory (a 494M-parameter model: 0.99 GB
// instead of 1.98) and widens to float and double exactly (a bfloat16 is
// the upper half of a float), so a product that widens b while packing it
// gives the bits of the same product over the widened values.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

#include "grad/config.hpp"

namespace grad {

enum class Storage : std::uint8_t {
  native,  // T itself
  bf16,    // bfloat16: 1 sign, 8 exponent, 7 fraction bits (a frozen constant only)
};

inline constexpr std::string_view storage_name(Storage s) { return s == Storage::bf16 ? "bf16" : "native"; }
inline constexpr std::size_t storage_bytes(Storage s, std::size_t native_bytes) {
  return s == Storage::bf16 ? 2 : native_bytes;
}

// The bfloat16 with these bits as T, exactly.
template <class T>
GRAD_HD inline T widen_bf16(std::uint16_t bits) {
  return static_cast<T>(std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16));
}

// x rounded to the nearest bfloat16, ties to even (PyTorch's
// tensor.to(torch.bfloat16)); a NaN stays a (quiet) NaN, infinities stay. A
// double is rounded to float first (beyond float's range: an infinity).
template <class T>
inline std::uint16_t round_to_bf16(T x) {
  float f = std::numeric_limits<float>::infinity();
  if constexpr (sizeof(T) > sizeof(float)) {
    const T most = static_cast<T>(std::numeric_limits<float>::max());
    if (x != x)
      f = std::numeric_limits<float>::quiet_NaN();
    else if (x <= most && x >= -most)
      f = static_cast<float>(x);
    else if (x < T(0))
      f = -f;
  } else {
    f = x;
  }
  const auto u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>(u >> 16 | 0x0040u);
  return static_cast<std::uint16_t>((u + 0x7fffu + (u >> 16 & 1u)) >> 16);
}

// n values widened from bfloat16 (a loop the compiler vectorises).
template <class T>
inline void widen_bf16_run(const std::uint16_t* src, T* dst, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) dst[i] = widen_bf16<T>(src[i]);
}

}  // namespace grad
