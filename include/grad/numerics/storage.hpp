// How a tape node's value is held in memory. A frozen base stored in 16
// bits (bfloat16 or IEEE half, as checkpoints are) takes half a float's
// memory (a 494M-parameter model: 0.99 GB instead of 1.98) and widens to
// float and double exactly (every bfloat16 and every half is a float), so a
// product that widens b while packing it gives the bits of the same product
// over the widened values.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>

#include "grad/config.hpp"

namespace grad {

enum class Storage : std::uint8_t {
  native,  // T itself
  bf16,    // bfloat16: 1 sign, 8 exponent, 7 fraction bits (a frozen constant only)
  f16,     // IEEE half: 1 sign, 5 exponent, 10 fraction bits (a frozen constant only)
  // llama.cpp's quantized blocks (numerics/quant.hpp: the layouts and the
  // exact value of every weight), a frozen matrix only: 32 or 256 weights of
  // a row per block, so a matrix's rows are whole blocks.
  q8_0,
  q4_0,
  q4_k,
  q5_k,
  q6_k,
};

// Held in anything but T (16 bits or quantized blocks): a frozen constant
// that only the ops whose host loops widen it read.
inline constexpr bool narrow(Storage s) { return s != Storage::native; }
// Held in 16 bits, one value per element (bf16 or f16)?
inline constexpr bool sixteen_bit(Storage s) { return s == Storage::bf16 || s == Storage::f16; }
// Held in quantized blocks?
inline constexpr bool quantized(Storage s) { return narrow(s) && !sixteen_bit(s); }
inline constexpr std::string_view storage_name(Storage s) {
  switch (s) {
    case Storage::native: return "native";
    case Storage::bf16: return "bf16";
    case Storage::f16: return "f16";
    case Storage::q8_0: return "q8_0";
    case Storage::q4_0: return "q4_0";
    case Storage::q4_k: return "q4_K";
    case Storage::q5_k: return "q5_K";
    case Storage::q6_k: return "q6_K";
  }
  return "?";
}

// The two 16-bit formats: a value's bits widened to float (exact), one at a
// time or as a vector of 32-bit lanes (Wide: the bits zero-extended; Floats:
// float lanes of the same count; a GCC vector extension type each), and a
// value rounded to the format (nearest, ties to even, as PyTorch's
// tensor.to(...)). widen_lanes is always inlined: called out of line from a
// kernel's AVX-512 or AVX2 copy, its vector arguments would pass between
// functions of different targets, whose ABIs for them differ (-Wpsabi); for
// the same reason it calls no function (__builtin_bit_cast, not std::bit_cast).
struct Bf16 {
  GRAD_HD static float widen(std::uint16_t bits) {  // a bfloat16 is a float's upper half
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
  }
  template <class Floats, class Wide>
  [[gnu::always_inline]] static Floats widen_lanes(Wide bits) {
    return __builtin_bit_cast(Floats, bits << 16);
  }
  // A NaN stays a (quiet) NaN, infinities stay. A double is rounded to float
  // first, as PyTorch's conversion does (beyond float's range: an infinity);
  // where that float lands on a bfloat16 tie, this can differ from rounding
  // the double once.
  template <class T>
  static std::uint16_t round(T x) {
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
};

struct F16 {
  // A finite half's exponent and fraction bits, moved into a float's places,
  // are its value times 2^-112 (the exponent biases are 15 and 127): normal
  // halves become normal floats, subnormal halves subnormal floats, and one
  // multiplication by 2^112 (exact: a power of two, no flush to zero in grad)
  // gives the value. Infinities and NaNs (exponent 31) take float's
  // all-ones exponent with their fraction bits (a NaN's payload) kept, a NaN
  // made quiet (as the hardware's conversion, x86's vcvtph2ps, makes it).
  static constexpr float scale = 0x1p112f;
  GRAD_HD static float widen(std::uint16_t bits) {
    const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16, magnitude = bits & 0x7fffu;
    const std::uint32_t special = 0x7f800000u | (magnitude & 0x3ffu) << 13 | (magnitude > 0x7c00u ? 0x400000u : 0u);
    const std::uint32_t finite = std::bit_cast<std::uint32_t>(std::bit_cast<float>(magnitude << 13) * scale);
    return std::bit_cast<float>(sign | (magnitude >= 0x7c00u ? special : finite));
  }
  template <class Floats, class Wide>
  [[gnu::always_inline]] static Floats widen_lanes(Wide bits) {
    const Wide sign = (bits & 0x8000u) << 16, magnitude = bits & 0x7fffu;
    const Wide special = 0x7f800000u | (magnitude & 0x3ffu) << 13 | ((Wide)(magnitude > 0x7c00u) & 0x400000u);
    const Wide finite = __builtin_bit_cast(Wide, __builtin_bit_cast(Floats, magnitude << 13) * scale);
    const Wide is_special = (Wide)(magnitude >= 0x7c00u);  // all ones where true
    return __builtin_bit_cast(Floats, sign | (special & is_special) | (finite & ~is_special));
  }
  // Directly from T (a double once, not through float as PyTorch's
  // conversion does: the two differ only where that float lands on a tie).
  // A NaN becomes the quiet NaN of its sign; magnitudes from
  // 65520 (half-way past the largest half, 65504, whose last bit is odd) up
  // become infinities; below 2^-14 the subnormals' fixed step 2^-24.
  template <class T>
  static std::uint16_t round(T x) {
    const auto sign = static_cast<std::uint16_t>(std::signbit(x) ? 0x8000u : 0u);
    if (x != x) return sign | 0x7e00u;
    const T a = std::fabs(x);
    if (!(a < T(65520))) return sign | 0x7c00u;
    if (a == T(0)) return sign;
    const int e = std::max(std::ilogb(a), -14);  // the half's exponent (the subnormals share the least)
    // a in units of its last place (2^(e-10)): exact; to the nearest integer,
    // ties to even (the default rounding mode). 2048 carries into the exponent.
    const auto q = static_cast<std::uint32_t>(std::nearbyint(std::ldexp(a, 10 - e)));
    return static_cast<std::uint16_t>(sign | ((static_cast<std::uint32_t>(e + 14) << 10) + q));
  }
};

// The bfloat16 or half with these bits as T, exactly.
template <class T>
GRAD_HD inline T widen_bf16(std::uint16_t bits) {
  return static_cast<T>(Bf16::widen(bits));
}
template <class T>
GRAD_HD inline T widen_f16(std::uint16_t bits) {
  return static_cast<T>(F16::widen(bits));
}
// (s is bf16 or f16)
template <class T>
GRAD_HD inline T widen(Storage s, std::uint16_t bits) {
  return s == Storage::f16 ? widen_f16<T>(bits) : widen_bf16<T>(bits);
}

// x rounded to the nearest bfloat16 / half, ties to even (see Bf16::round, F16::round).
template <class T>
inline std::uint16_t round_to_bf16(T x) {
  return Bf16::round(x);
}
template <class T>
inline std::uint16_t round_to_f16(T x) {
  return F16::round(x);
}
template <class T>
inline std::uint16_t round_to(Storage s, T x) {
  return s == Storage::f16 ? F16::round(x) : Bf16::round(x);
}

// n values of a 16-bit storage (bf16 or f16) widened to T (loops the compiler vectorises).
template <class T>
inline void widen_run(Storage s, const std::uint16_t* src, T* dst, std::size_t n) {
  if (s == Storage::f16)
    for (std::size_t i = 0; i < n; ++i) dst[i] = widen_f16<T>(src[i]);
  else
    for (std::size_t i = 0; i < n; ++i) dst[i] = widen_bf16<T>(src[i]);
}

}  // namespace grad
