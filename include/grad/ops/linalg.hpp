// Matrix products and transpose over the last two axes (leading axes are a
// batch). Every inner product accumulates from zero in ascending index:
// acc = acc + a*b, never fused, so the device replays the same bits
// (gemm.hpp holds the kernels and the plain reference loops).
#pragma once

#include <string_view>

#include "grad/ops/family.hpp"
#include "grad/ops/gemm.hpp"  // gemm_nn, gemm_nt, gemm_tn: blocked, same order as grad::reference

namespace grad {

// Shared by Matmul ([m,k]x[k,n]) and Bmm ([B,m,k]x[B,k,n]): same kernels,
// different shape rules (checked where the op is recorded).
template <class Derived>
struct MatrixProduct {
  static constexpr int arity = 2;
  static constexpr bool row_local = false;
  static constexpr Tier tier = Tier::exact;

  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    const std::size_t m = x.a.dims.back(1), k = x.a.dims.back(), n = x.b.dims.back();
    const std::size_t batches = x.out.size() / (m * n == 0 ? 1 : m * n);
    for (std::size_t s = 0; s < batches; ++s)
      gemm_nn(x.a.data + s * m * k, x.b.data + s * k * n, y + s * m * n, m, k, n);
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T*, const T* g, T* dx) {
    const std::size_t m = x.a.dims.back(1), k = x.a.dims.back(), n = x.b.dims.back();
    const std::size_t batches = x.out.size() / (m * n == 0 ? 1 : m * n);
    for (std::size_t s = 0; s < batches; ++s) {
      if constexpr (In == 0)
        gemm_nt(g + s * m * n, x.b.data + s * k * n, dx + s * m * k, m, n, k);
      else
        gemm_tn(x.a.data + s * m * k, g + s * m * n, dx + s * k * n, m, k, n);
    }
  }
};

struct Matmul : MatrixProduct<Matmul> {
  static constexpr std::string_view name = "matmul";
};

struct Bmm : MatrixProduct<Bmm> {
  static constexpr std::string_view name = "bmm";
};

template <class T>
inline void transpose_batches(const T* in, T* out, std::size_t batches, std::size_t rows, std::size_t cols) {
  for (std::size_t s = 0; s < batches; ++s)
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t c = 0; c < cols; ++c) out[s * rows * cols + c * rows + r] = in[s * rows * cols + r * cols + c];
}

// Swaps the last two axes.
struct Transpose {
  static constexpr std::string_view name = "transpose";
  static constexpr Tier tier = Tier::exact;
  static constexpr int arity = 1;
  static constexpr bool row_local = false;
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    const std::size_t r = x.a.dims.back(1), c = x.a.dims.back();
    transpose_batches(x.a.data, y, x.a.dims.size() / (r * c == 0 ? 1 : r * c), r, c);
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T*, const T* g, T* dx) {
    const std::size_t r = x.a.dims.back(1), c = x.a.dims.back();
    transpose_batches(g, dx, x.a.dims.size() / (r * c == 0 ? 1 : r * c), c, r);
  }
};

}  // namespace grad
