// Compile-time configuration shared by host and device code.
#pragma once

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

template <class T>
inline constexpr bool is_scalar_v = false;
template <>
inline constexpr bool is_scalar_v<float> = true;
template <>
inline constexpr bool is_scalar_v<double> = true;

template <class T>
concept Scalar = is_scalar_v<T>;

}  // namespace grad
