// Compile-time configuration shared by host and device code.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define GRAD_HD __host__ __device__
#else
#define GRAD_HD
#endif

namespace grad {

// Which bit-equality promise an op carries across backends (docs/ARCHITECTURE.md).
enum class Tier : std::uint8_t {
  exact,          // + - * / sqrt and data movement: bit-identical everywhere
  transcendental  // would call libm/CUDA math: bit-identical on CPU backends, 1e-12 rel on CUDA.
                  // No op in OpList uses it today: exp/log/tanh/sigmoid/softmax use exact_math.hpp.
};

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
