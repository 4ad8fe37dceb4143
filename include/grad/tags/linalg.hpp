// Matrix products and transpose over the last two axes (leading axes are a
// batch). Every inner product accumulates from zero in ascending index:
// acc = fma(a, b, acc), one explicit fused multiply-add per term (fma_hd:
// std::fma on the host, __fma_rn on CUDA), so the host's gemm, the device
// and emitted code land on the same bits (gemm.hpp holds the kernels and the
// plain reference loops).
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <utility>

#include "grad/numerics/gemm.hpp"  // gemm_nn, gemm_nt, gemm_tn: blocked, same order as grad::reference
#include "grad/tags/family.hpp"

namespace grad {

// Shared by Matmul ([m,k]x[k,n]) and Bmm ([B,m,k]x[B,k,n]): same kernels,
// different shape rules.
template <class Derived>
struct MatrixProduct {
  static constexpr int arity = 2;
  static constexpr std::array<std::uint8_t, 2> backward_reads{reads_b, reads_a};  // dA = g b^T, dB = a^T g

  // The per-item bodies: output element w (or gradient element w) is one
  // inner product from zero in ascending index.
  struct Sizes {
    std::size_t m, k, n;
  };
  template <class T>
  GRAD_HD static Sizes sizes(const NodeArgs<T>& x) {
    return {x.a.dims.back(1), x.a.dims.back(), x.b.dims.back()};
  }
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    const auto [m, k, n] = sizes(x);
    const std::size_t s = w / (m * n), i = w % (m * n) / n, j = w % n;
    const T* A = x.a.data + s * m * k + i * k;
    const T* B = x.b.data + s * k * n + j;
    T acc = T(0);
    for (std::size_t p = 0; p < k; ++p) acc = fma_hd(A[p], B[p * n], acc);
    y[w] = acc;
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    const auto [m, k, n] = sizes(x);
    T acc = T(0);
    if constexpr (In == 0) {  // dA[i,p] = sum_j G[i,j] B[p,j]
      const std::size_t s = w / (m * k), i = w % (m * k) / k, p = w % k;
      const T* G = g + s * m * n + i * n;
      const T* B = x.b.data + s * k * n + p * n;
      for (std::size_t j = 0; j < n; ++j) acc = fma_hd(G[j], B[j], acc);
    } else {  // dB[p,j] = sum_i A[i,p] G[i,j]
      const std::size_t s = w / (k * n), p = w % (k * n) / n, j = w % n;
      const T* A = x.a.data + s * m * k + p;
      const T* G = g + s * m * n + j;
      for (std::size_t i = 0; i < m; ++i) acc = fma_hd(A[i * k], G[i * n], acc);
    }
    dx[w] = acc;
  }

  // The host loops: blocked gemm in the same order per element (gemm.hpp).

  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    const std::size_t m = x.a.dims.back(1), k = x.a.dims.back(), n = x.b.dims.back();
    const std::size_t batches = x.out.size() / (m * n == 0 ? 1 : m * n);
    for (std::size_t s = 0; s < batches; ++s)
      gemm_nn(x.a.data + s * m * k, x.b.data + s * k * n, y + s * m * n, m, k, n, x.b.storage, x.b.transposed);
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T*, const T* g, T* dx) {
    const std::size_t m = x.a.dims.back(1), k = x.a.dims.back(), n = x.b.dims.back();
    const std::size_t batches = x.out.size() / (m * n == 0 ? 1 : m * n);
    for (std::size_t s = 0; s < batches; ++s) {
      if constexpr (In == 0)
        gemm_nt(g + s * m * n, x.b.data + s * k * n, dx + s * m * k, m, n, k, x.b.storage, x.b.transposed);
      else
        gemm_tn(x.a.data + s * m * k, g + s * m * n, dx + s * k * n, m, k, n);
    }
  }
};

struct Matmul : MatrixProduct<Matmul> {
  static constexpr std::string_view name = "matmul";
  static constexpr std::string_view torch = "a @ b";
  // b may be a 16-bit constant (a frozen base's weight [in, out]): the
  // gemm widens it exactly while packing. (One matrix: no batch offsets.)
  static constexpr std::array<bool, 2> reads_narrow{false, true};
  static std::string output_dims(const Dims& a, const Dims& b, OpAttrs&, Dims& out) {
    if (a.rank != 2 || b.rank != 2 || a[1] != b[0])
      return "expected [m, k] x [k, n], got " + shape_string(a) + " x " + shape_string(b);
    out = Dims::of(std::array<std::size_t, 2>{a[0], b[1]});
    return {};
  }
};

struct Bmm : MatrixProduct<Bmm> {
  static constexpr std::string_view name = "bmm";
  static constexpr std::string_view torch = "torch.bmm(a, b)";
  static std::string output_dims(const Dims& a, const Dims& b, OpAttrs&, Dims& out) {
    if (a.rank != 3 || b.rank != 3 || a[0] != b[0] || a[2] != b[1])
      return "expected [B, m, k] x [B, k, n], got " + shape_string(a) + " x " + shape_string(b);
    out = Dims::of(std::array<std::size_t, 3>{a[0], a[1], b[2]});
    return {};
  }
};

// a . b^T with b stored [n, k], as Hugging Face and llm.c store a linear
// layer's weight [out, in]: the bits of matmul(a, transpose(b)) in value and
// in both gradients, without the transposed copy of b that the composite
// records every forward (a tied [vocab, d] embedding: 545 MB per step at
// Qwen2.5-0.5B). The leading axes of a are rows: a [..., m, k] gives
// [..., m, n], as matmul would give it for a reshaped to [rows, k].
struct MatmulNt {
  static constexpr std::string_view name = "matmul_nt";
  static constexpr std::string_view torch = "a @ b.transpose(-1, -2)";
  static constexpr int arity = 2;
  static constexpr std::array<std::uint8_t, 2> backward_reads{reads_b, reads_a};  // dA = g b, db = g^T a
  static constexpr std::array<bool, 2> reads_narrow{false, true};  // b a 16-bit constant [out, in], as Matmul's
  static std::string output_dims(const Dims& a, const Dims& b, OpAttrs&, Dims& out) {
    if (a.rank < 2 || b.rank != 2 || a.back() != b[1])
      return "expected [..., m, k] x [n, k] (b stored [out, in]), got " + shape_string(a) + " x " + shape_string(b);
    out = a;
    out.d[out.rank - 1] = b[0];
    return {};
  }

  // The per-item bodies, each the composite's inner product term for term:
  // y[i,j] = sum_p a[i,p] b[j,p] (matmul's forward over b^T's column j);
  // da[i,p] = sum_j g[i,j] b[j,p] (matmul's dA against b^T's row p);
  // db[j,p] = sum_i a[i,p] g[i,j] (matmul's dB[p,j], which transpose's
  // backward copies to [j,p]). All from zero, ascending, one fma per term.
  struct Sizes {
    std::size_t rows, k, n;
  };
  template <class T>
  GRAD_HD static Sizes sizes(const NodeArgs<T>& x) {
    std::size_t rows = 1;
    for (std::size_t ax = 0; ax + 1 < x.a.dims.rank; ++ax) rows *= x.a.dims.d[ax];
    return {rows, x.a.dims.back(), x.b.dims.back(1)};
  }
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    const auto [rows, k, n] = sizes(x);
    const T* A = x.a.data + w / n * k;
    const T* B = x.b.data + w % n * k;
    T acc = T(0);
    for (std::size_t p = 0; p < k; ++p) acc = fma_hd(A[p], B[p], acc);
    y[w] = acc;
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    const auto [rows, k, n] = sizes(x);
    const std::size_t p = w % k;
    T acc = T(0);
    if constexpr (In == 0) {  // w = (i, p)
      const T* G = g + w / k * n;
      for (std::size_t j = 0; j < n; ++j) acc = fma_hd(G[j], x.b.data[j * k + p], acc);
    } else {  // w = (j, p)
      const std::size_t j = w / k;
      for (std::size_t i = 0; i < rows; ++i) acc = fma_hd(x.a.data[i * k + p], g[i * n + j], acc);
    }
    dx[w] = acc;
  }

  // The host loops: blocked gemm, b read in place through the packing's
  // strides (gemm.hpp's nt layout is exactly y = a b^T; dA = g b is nn;
  // db = g^T a is tn).
  template <class T>
  static void forward_tensor(const NodeArgs<T>& x, T* y) {
    const auto [rows, k, n] = sizes(x);
    gemm_nt(x.a.data, x.b.data, y, rows, k, n, x.b.storage, x.b.transposed);
  }
  template <int In, class T>
  static void backward_tensor(const NodeArgs<T>& x, const T*, const T* g, T* dx) {
    const auto [rows, k, n] = sizes(x);
    if constexpr (In == 0)
      gemm_nn(g, x.b.data, dx, rows, n, k, x.b.storage, x.b.transposed);
    else
      gemm_tn(g, x.a.data, dx, rows, n, k);
  }
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
  static constexpr std::string_view torch = "a.transpose(-1, -2)";
  static constexpr int arity = 1;
  static std::string output_dims(const Dims& a, const Dims&, OpAttrs&, Dims& out) {
    if (a.rank < 2) return "expected rank >= 2, got shape " + shape_string(a);
    out = a;
    std::swap(out.d[out.rank - 1], out.d[out.rank - 2]);
    return {};
  }
  template <class T>
  GRAD_HD static void forward_item(const NodeArgs<T>& x, T* y, std::size_t w) {
    const std::size_t r = x.a.dims.back(1), c = x.a.dims.back(), s = w / (r * c), q = w % (r * c);
    y[w] = x.a.data[s * r * c + (q % r) * c + q / r];
  }
  template <int In, class T>
  GRAD_HD static void backward_item(const NodeArgs<T>& x, const T*, const T* g, T* dx, std::size_t w) {
    const std::size_t r = x.a.dims.back(1), c = x.a.dims.back(), s = w / (r * c), q = w % (r * c);
    dx[w] = g[s * r * c + (q % c) * r + q / c];
  }

  // The host loops: the same copies, without a division per element.
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
