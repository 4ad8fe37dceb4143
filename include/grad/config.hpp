// Compile-time configuration shared by host and device code.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

// grad's version (meson.build's project version; configuring checks they agree).
#define GRAD_VERSION "0.1.0"

#if defined(__CUDACC__)
#define GRAD_HD __host__ __device__
#else
#define GRAD_HD
#endif

namespace grad {

// "No node": the one sentinel for a node index (an absent operand, a
// rejected Var), on the tape and in the device engine alike.
inline constexpr std::uint32_t no_node = 0xffffffffu;

// The largest rank a tensor recorded on a tape may have; dimensions are
// stored inline so that a node stays plain data.
inline constexpr std::size_t max_rank = 6;

// A fused multiply-add, a*b + c with one rounding: the one IEEE operation
// the determinism contract places explicitly (docs/ARCHITECTURE.md, "The
// determinism contract"), where it stands in the one source (the tags'
// GRAD_HD bodies and the kernels that must equal them). The compiler never
// fuses on its own (-ffp-contract=off, --fmad=false); this call always does,
// with the same bits everywhere: CUDA's __fma_rn on the device, std::fma on
// the host (an x86 vfmadd where the calling copy is compiled with FMA3,
// otherwise libm's fma, which glibc computes correctly rounded, in hardware
// when the CPU has FMA and in software when not).
GRAD_HD inline float fma_hd(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}
GRAD_HD inline double fma_hd(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __fma_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

template <class T>
inline constexpr bool is_scalar_v = false;
template <>
inline constexpr bool is_scalar_v<float> = true;
template <>
inline constexpr bool is_scalar_v<double> = true;

template <class T>
concept Scalar = is_scalar_v<T>;

// What a Tape<T> may hold: float, double, and a scalar type that opts in by
// specialising this (a dual number, numerics/dual.hpp). A tape over such a
// type runs the ops' per-item bodies (contract.hpp: item_forward) and
// records only the ops that say they carry it (carries_tangent).
template <class T>
inline constexpr bool is_tape_scalar_v = is_scalar_v<T>;

}  // namespace grad
