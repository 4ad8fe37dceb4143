// The register tile: the micro-kernel that keeps an MR x NR tile of C in vector registers, its
// edge and tail-strip variants, and where it reads a's panel from. Apart as the one place the
// fmas of the blocked product are written.
#pragma once

#include <algorithm>
#include <cstddef>

#include "grad/numerics/simd.hpp"

// Full unrolling of the register tile's constant-trip loops. nvcc's front end
// (which sees this header through op_list.hpp) does not know GCC's pragma.
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define GRAD_GEMM_UNROLL _Pragma("GCC unroll 16")
#else
#define GRAD_GEMM_UNROLL
#endif

namespace grad {
namespace gemm_detail {

template <class T, std::size_t Lanes>
struct Vec {
  typedef T type __attribute__((vector_size(Lanes * sizeof(T))));
};

// Where a micro-kernel reads its MR x kc panel of a: packed (the MR values
// of each term side by side) or straight from the operand through its
// strides, which saves the copy when the panel is used for one strip only.
template <class T, std::size_t MR>
struct PackedPanel {
  const T* p;
  T at(std::size_t r, std::size_t q) const { return p[q * MR + r]; }
};
template <class T>
struct StridedPanel {
  const T* p;
  std::size_t rs, cs;
  T at(std::size_t r, std::size_t q) const { return p[r * rs + q * cs]; }
};

// The MR x (NV vectors, plus HV half vectors) tile of C at c (row stride
// ldc) after kc more terms: lane by lane acc = fma(a, b, acc) in ascending p,
// from zero or from what c holds (one vfmadd per vector in the AVX-512 and
// AVX2 copies). Term p's vectors of b are at bp + p * ldb: a packed strip's,
// or b's own row. The half vector (HV = 1) ends a tail strip whose width is
// an odd number of half vectors (e.g. 24 floats: 16 + 8), so that no lane of
// a padded vector computes a column only to drop it.
template <class T, std::size_t Lanes, std::size_t MR, std::size_t NV, std::size_t HV = 0, class Panel>
[[gnu::always_inline]] inline void micro_kernel(std::size_t kc, Panel ap, const T* __restrict bp, T* __restrict c,
                                                std::size_t ldc, bool accumulate,
                                                std::size_t ldb = NV * Lanes + HV * Lanes / 2) {
  using V = typename Vec<T, Lanes>::type;
  using H = typename Vec<T, (HV ? Lanes / 2 : Lanes)>::type;
  constexpr std::size_t nv = NV > 0 ? NV : 1;  // no zero-length arrays: a tail of one half vector has NV = 0
  V acc[MR][nv];
  H half[MR];
  GRAD_GEMM_UNROLL
  for (std::size_t r = 0; r < MR; ++r) {
    GRAD_GEMM_UNROLL
    for (std::size_t v = 0; v < NV; ++v) {
      if (accumulate)
        __builtin_memcpy(&acc[r][v], c + r * ldc + v * Lanes, sizeof(V));
      else
        acc[r][v] = V{};
    }
    if constexpr (HV != 0) {
      if (accumulate)
        __builtin_memcpy(&half[r], c + r * ldc + NV * Lanes, sizeof(H));
      else
        half[r] = H{};
    }
  }
  for (std::size_t p = 0; p < kc; ++p) {
    V b[nv];
    H bh;
    GRAD_GEMM_UNROLL
    for (std::size_t v = 0; v < NV; ++v) __builtin_memcpy(&b[v], bp + p * ldb + v * Lanes, sizeof(V));
    if constexpr (HV != 0) __builtin_memcpy(&bh, bp + p * ldb + NV * Lanes, sizeof(H));
    GRAD_GEMM_UNROLL
    for (std::size_t r = 0; r < MR; ++r) {
      const T ar = ap.at(r, p);
      const V a = simd::splat<V>(ar);
      GRAD_GEMM_UNROLL
      for (std::size_t v = 0; v < NV; ++v) acc[r][v] = simd::fma_lanes<T>(a, b[v], acc[r][v]);
      if constexpr (HV != 0) half[r] = simd::fma_lanes<T>(simd::splat<H>(ar), bh, half[r]);
    }
  }
  GRAD_GEMM_UNROLL
  for (std::size_t r = 0; r < MR; ++r) {
    GRAD_GEMM_UNROLL
    for (std::size_t v = 0; v < NV; ++v) __builtin_memcpy(c + r * ldc + v * Lanes, &acc[r][v], sizeof(V));
    if constexpr (HV != 0) __builtin_memcpy(c + r * ldc + NV * Lanes, &half[r], sizeof(H));
  }
}

// A partial tile (rows < MR or cols < the strip width) runs the same kernel
// on a local tile; only the valid part is read from and written to C.
template <class T, std::size_t Lanes, std::size_t MR, std::size_t NV, std::size_t HV, class Panel>
[[gnu::always_inline]] inline void edge_kernel(std::size_t kc, Panel ap, const T* bp, T* c, std::size_t ldc,
                                               bool accumulate, std::size_t rows, std::size_t cols) {
  constexpr std::size_t width = NV * Lanes + HV * Lanes / 2;
  alignas(64) T tile[MR * width] = {};
  if (accumulate)
    for (std::size_t r = 0; r < rows; ++r)
      for (std::size_t j = 0; j < cols; ++j) tile[r * width + j] = c[r * ldc + j];
  micro_kernel<T, Lanes, MR, NV, HV>(kc, ap, bp, tile, width, accumulate);
  for (std::size_t r = 0; r < rows; ++r)
    for (std::size_t j = 0; j < cols; ++j) c[r * ldc + j] = tile[r * width + j];
}

// Strips of b: full ones NV vectors wide while that many columns are left,
// then one tail strip over the rest, rounded up to whole half vectors where
// a vector is 64 bytes (AVX-512: a 24-column tail is one vector and a half,
// not two vectors) and to whole vectors below that (a 16-byte half would
// run lane by lane).
template <class T, std::size_t Lanes>
inline constexpr std::size_t tail_unit = Lanes * sizeof(T) == 64 ? Lanes / 2 : Lanes;
template <class T, std::size_t Lanes, std::size_t NV>
inline std::size_t strip_width(std::size_t columns_left) {
  constexpr std::size_t nr = NV * Lanes, unit = tail_unit<T, Lanes>;
  return columns_left >= nr ? nr : (columns_left + unit - 1) / unit * unit;
}

// One rows x cols tile of a strip W columns wide, by the micro-kernel when
// the tile is whole.
template <class T, std::size_t Lanes, std::size_t MR, std::size_t W, class Panel>
[[gnu::always_inline]] inline void strip_tile(std::size_t kc, Panel ap, const T* bp, T* c, std::size_t ldc,
                                              bool accumulate, std::size_t rows, std::size_t cols) {
  constexpr std::size_t NV = W / Lanes, HV = W % Lanes != 0 ? 1 : 0;
  static_assert(W == NV * Lanes + HV * Lanes / 2, "a strip is whole vectors and at most one half vector");
  if (rows == MR && cols == W)
    micro_kernel<T, Lanes, MR, NV, HV>(kc, ap, bp, c, ldc, accumulate);
  else
    edge_kernel<T, Lanes, MR, NV, HV>(kc, ap, bp, c, ldc, accumulate, rows, cols);
}
// The strip width (a multiple of the tail unit up to W) as a template
// argument: the tail's widths one by one. A function, not a lambda over
// mp_with_index: at -O1 a lambda is not inlined into the instruction set's
// copy (see row_pass).
template <class T, std::size_t Lanes, std::size_t MR, std::size_t W, class Panel>
[[gnu::always_inline]] inline void tile(std::size_t kc, Panel ap, const T* bp, T* c, std::size_t ldc, bool accumulate,
                                        std::size_t rows, std::size_t cols, std::size_t width) {
  if constexpr (W > tail_unit<T, Lanes>) {
    constexpr std::size_t narrower = W - tail_unit<T, Lanes>;
    if (width != W) return tile<T, Lanes, MR, narrower>(kc, ap, bp, c, ldc, accumulate, rows, cols, width);
  }
  strip_tile<T, Lanes, MR, W>(kc, ap, bp, c, ldc, accumulate, rows, cols);
}

// The rows < MR of a block's last, packed (zero-padded) row panel, two at a
// time: an MR-row tile there would compute MR - rows rows only to drop them
// (a causal attention block of 32 rows is five 6-row panels and two rows:
// a sixth of its work). Each two-row tile reads its rows of the same panel.
template <class T, std::size_t Lanes, std::size_t MR, std::size_t W>
[[gnu::always_inline]] inline void partial_panel(std::size_t kc, const T* panel, const T* bp, T* c, std::size_t ldc,
                                                 bool accumulate, std::size_t rows, std::size_t cols,
                                                 std::size_t width) {
  for (std::size_t r = 0; r < rows; r += 2)
    tile<T, Lanes, 2, W>(kc, PackedPanel<T, MR>{panel + r}, bp, c + r * ldc, ldc, accumulate,
                         std::min<std::size_t>(2, rows - r), cols, width);
}

}  // namespace gemm_detail
}  // namespace grad
