// grad::reference::gemm_*: the plain loops that define each product's order. Apart from the
// blocked kernels so that the definition reads alone and a test includes it without them.
#pragma once

#include <cstddef>

#include "grad/config.hpp"

namespace grad {

// The plain loops that define the order; kept as the reference the blocked
// kernels are tested against.
namespace reference {

// C[m,n] = A[m,k] B[k,n]. The i-p-j loop order keeps each C[i,j] summing in
// ascending p while the innermost loop runs along contiguous rows.
template <class T>
inline void gemm_nn(const T* A, const T* B, T* C, std::size_t m, std::size_t k, std::size_t n) {
  for (std::size_t i = 0; i < m; ++i) {
    T* c = C + i * n;
    for (std::size_t j = 0; j < n; ++j) c[j] = T(0);
    for (std::size_t p = 0; p < k; ++p) {
      const T a = A[i * k + p];
      const T* b = B + p * n;
      for (std::size_t j = 0; j < n; ++j) c[j] = fma_hd(a, b[j], c[j]);
    }
  }
}

// C[m,k] = G[m,n] B[k,n]^T: C[i,p] sums G[i,j] B[p,j] in ascending j.
template <class T>
inline void gemm_nt(const T* G, const T* B, T* C, std::size_t m, std::size_t n, std::size_t k) {
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t p = 0; p < k; ++p) {
      const T* g = G + i * n;
      const T* b = B + p * n;
      T acc = T(0);
      for (std::size_t j = 0; j < n; ++j) acc = fma_hd(g[j], b[j], acc);
      C[i * k + p] = acc;
    }
}

// C[k,n] = A[m,k]^T G[m,n]: C[p,j] sums A[i,p] G[i,j] in ascending i.
template <class T>
inline void gemm_tn(const T* A, const T* G, T* C, std::size_t m, std::size_t k, std::size_t n) {
  for (std::size_t x = 0; x < k * n; ++x) C[x] = T(0);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t p = 0; p < k; ++p) {
      const T a = A[i * k + p];
      const T* g = G + i * n;
      T* c = C + p * n;
      for (std::size_t j = 0; j < n; ++j) c[j] = fma_hd(a, g[j], c[j]);
    }
}

}  // namespace reference

}  // namespace grad
