// How the kernels read b's elements (Terms): as T, or widened exactly from 16 bits, by vector,
// run or transposed square. Apart because packing and the one-row paths both read b through it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "grad/numerics/gemm/micro_kernel.hpp"  // Vec, GRAD_GEMM_UNROLL
#include "grad/numerics/simd.hpp"
#include "grad/numerics/storage.hpp"

namespace grad {
namespace gemm_detail {

// dst[i * dst_stride + j] = src[j * src_stride + i] for a Lanes x Lanes
// square: Lanes vector loads, log2(Lanes) rounds of two-input shuffles (round
// d swaps the d-blocks across pairs of rows d apart), Lanes vector stores.
// Copies only: no value changes.
template <class T, std::size_t Lanes>
[[gnu::always_inline]] inline void transpose_square(const T* src, std::size_t src_stride, T* dst,
                                                    std::size_t dst_stride) {
#if GRAD_SIMD
  using V = typename Vec<T, Lanes>::type;
  using I = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
  typedef I M __attribute__((vector_size(Lanes * sizeof(T))));
  V r[Lanes];
  GRAD_GEMM_UNROLL
  for (std::size_t i = 0; i < Lanes; ++i) __builtin_memcpy(&r[i], src + i * src_stride, sizeof(V));
  GRAD_GEMM_UNROLL
  for (std::size_t d = Lanes / 2; d > 0; d /= 2) {
    M keep{}, swap{};  // lane l of row i: its own (bit d of l clear) or row i + d's lane l - d; row i + d the mirror
    GRAD_GEMM_UNROLL
    for (std::size_t l = 0; l < Lanes; ++l) {
      keep[l] = static_cast<I>(l & d ? Lanes + (l ^ d) : l);
      swap[l] = static_cast<I>(l & d ? Lanes + l : l ^ d);
    }
    GRAD_GEMM_UNROLL
    for (std::size_t i = 0; i < Lanes; ++i)
      if ((i & d) == 0) {
        const V a = r[i], b = r[i + d];
        r[i] = __builtin_shuffle(a, b, keep);
        r[i + d] = __builtin_shuffle(a, b, swap);
      }
  }
  GRAD_GEMM_UNROLL
  for (std::size_t i = 0; i < Lanes; ++i) __builtin_memcpy(dst + i * dst_stride, &r[i], sizeof(V));
#else
  for (std::size_t i = 0; i < Lanes; ++i)
    for (std::size_t j = 0; j < Lanes; ++j) dst[i * dst_stride + j] = src[j * src_stride + i];
#endif
}

// Where the kernels read b's elements: T itself (Format = T), or 16-bit
// values of a Format (Bf16, F16: a frozen base as its checkpoint holds it)
// widened to T exactly as they are loaded, so a 16-bit b streams half the
// bytes and gives the bits of the product over its widened values. Lanes
// terms as a vector, one term, a run of n, or a Lanes x Lanes square
// transposed (Lanes runs of Lanes terms, `stride` apart, become dst's rows).
template <class T, std::size_t Lanes, class Format = T>
struct Terms {
  static constexpr bool native = std::is_same_v<Format, T>;
  using Element = std::conditional_t<native, T, std::uint16_t>;
  using V = typename Vec<T, Lanes>::type;

  [[gnu::always_inline]] static V load(const Element* p) {
    V v;
    if constexpr (native) {
      __builtin_memcpy(&v, p, sizeof(V));
    } else {
#if GRAD_SIMD_X86_SQRT && GRAD_SIMD
      // AVX-512 (the only copy with 16 float lanes): one vcvtph2ps per
      // vector of halves (the same bits as F16::widen_lanes' six operations).
      if constexpr (std::is_same_v<Format, F16> && std::is_same_v<T, float> && sizeof(V) == 64) {
        typedef short Halves __attribute__((vector_size(32)));
        Halves h;
        __builtin_memcpy(&h, p, sizeof(h));
        return __builtin_ia32_vcvtph2ps512_mask(h, V{}, static_cast<unsigned short>(-1), 4);
      }
#endif
#if GRAD_SIMD
      typename Vec<std::uint16_t, Lanes>::type bits;
      __builtin_memcpy(&bits, p, sizeof(bits));
      using Floats = typename Vec<float, Lanes>::type;
      const Floats f = Format::template widen_lanes<Floats>(
          __builtin_convertvector(bits, typename Vec<std::uint32_t, Lanes>::type));
      if constexpr (std::is_same_v<T, float>)
        v = f;
      else
        v = __builtin_convertvector(f, V);
#else  // nvcc's front end and other compilers: lane by lane
      T lanes[Lanes];
      for (std::size_t l = 0; l < Lanes; ++l) lanes[l] = one(p + l);
      __builtin_memcpy(&v, lanes, sizeof(V));
#endif
    }
    return v;
  }
  [[gnu::always_inline]] static T one(const Element* p) {
    if constexpr (native)
      return *p;
    else
      return static_cast<T>(Format::widen(*p));
  }
  [[gnu::always_inline]] static void run(const Element* p, T* dst, std::size_t n) {
    if constexpr (native) {
      __builtin_memcpy(dst, p, n * sizeof(T));
    } else {
      std::size_t j = 0;
      for (; j + Lanes <= n; j += Lanes) {
        const V v = load(p + j);
        __builtin_memcpy(dst + j, &v, sizeof(V));
      }
      for (; j < n; ++j) dst[j] = one(p + j);
    }
  }
  [[gnu::always_inline]] static void square(const Element* p, std::size_t stride, T* dst, std::size_t dst_stride) {
    if constexpr (native) {
      transpose_square<T, Lanes>(p, stride, dst, dst_stride);
    } else {
      alignas(64) T rows[Lanes * Lanes];
      GRAD_GEMM_UNROLL
      for (std::size_t l = 0; l < Lanes; ++l) {
        const V row = load(p + l * stride);
        __builtin_memcpy(rows + l * Lanes, &row, sizeof(V));
      }
      transpose_square<T, Lanes>(rows, Lanes, dst, dst_stride);
    }
  }
};

}  // namespace gemm_detail
}  // namespace grad
