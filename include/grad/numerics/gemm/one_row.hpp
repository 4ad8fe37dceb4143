// One output row (a decoding step's x . W or x . W^T): b read where it lies, no packing. Apart
// from the blocked loop nest because it is a different order of reads for the same sums.
#pragma once

#include <algorithm>
#include <cstddef>
#include <type_traits>

#include "grad/config.hpp"
#include "grad/numerics/gemm/micro_kernel.hpp"
#include "grad/numerics/gemm/problem.hpp"
#include "grad/numerics/gemm/terms.hpp"
#include "grad/numerics/held.hpp"
#include "grad/numerics/simd.hpp"

namespace grad {
namespace gemm_detail {

// Up to this many register strips an output row is narrow: its strips wait in
// registers (multiply_narrow_row), which beats streaming rows of b through it
// (measured on 896 x 128 and 4864 x 128: 2.5x; on 896 x 512, level).
inline constexpr std::size_t narrow_row_strips = 2;
// One narrow output row (no wider than a few register strips, e.g. a
// key/value projection's 128 columns) against b with contiguous rows: the
// row's strips wait in registers over KC terms of b, read where it lies.
// Each element's sum is the blocked kernel's: ascending p, from zero (or from
// C when continued), stored and reloaded unchanged between KC-long runs;
// columns past the last whole vector by scalar fma.
template <class T, std::size_t Lanes, std::size_t NV>
[[gnu::always_inline]] inline void multiply_narrow_row(const Problem<T>& pr, std::size_t i, std::size_t j0,
                                                       std::size_t j1) {
  constexpr std::size_t nr = NV * Lanes;
  const std::size_t KC = Blocking<T>::kc();
  const T* a = pr.a.p + i * pr.a.rs;
  T* c = pr.c + i * pr.n;
  for (std::size_t pc = 0; pc < pr.k; pc += KC) {
    const std::size_t kc = std::min(KC, pr.k - pc);
    const StridedPanel<T> ap{a + pc * pr.a.cs, 0, pr.a.cs};
    const T* b = pr.b.p + pc * pr.b.rs;
    const bool accumulate = pc > 0 || pr.continued;
    std::size_t j = j0;
    for (; j + nr <= j1; j += nr) micro_kernel<T, Lanes, 1, NV>(kc, ap, b + j, c + j, pr.n, accumulate, pr.b.rs);
    for (; j + Lanes <= j1; j += Lanes) micro_kernel<T, Lanes, 1, 1>(kc, ap, b + j, c + j, pr.n, accumulate, pr.b.rs);
    for (; j < j1; ++j) {
      T acc = accumulate ? c[j] : T(0);
      for (std::size_t p = 0; p < kc; ++p) acc = fma_hd(ap.at(0, p), b[p * pr.b.rs + j], acc);
      c[j] = acc;
    }
  }
}

// One pass of multiply_row: R rows of b from term p, added into c[j0, j1).
// A function, not a lambda: at -O1 a lambda is not inlined into the
// instruction set's copy, and its vector code would lack the target.
template <class T, std::size_t Lanes, std::size_t R, class Format>
[[gnu::always_inline]] inline void row_pass(const Problem<T>& pr, const T* a, T* c, std::size_t p, std::size_t j0,
                                            std::size_t vectors_end, std::size_t j1) {
  using V = typename Vec<T, Lanes>::type;
  const std::size_t rs = pr.b.rs;
  using E = Terms<T, Lanes, Format>;
  const auto* b = reinterpret_cast<const typename E::Element*>(pr.b.p) + p * rs;
  V splats[R];
  GRAD_GEMM_UNROLL
  for (std::size_t r = 0; r < R; ++r) splats[r] = simd::splat<V>(a[(p + r) * pr.a.cs]);
  for (std::size_t j = j0; j < vectors_end; j += Lanes) {
    V acc;
    __builtin_memcpy(&acc, c + j, sizeof(V));
    GRAD_GEMM_UNROLL
    for (std::size_t r = 0; r < R; ++r)
      acc = simd::fma_lanes<T>(splats[r], E::load(b + r * rs + j), acc);
    __builtin_memcpy(c + j, &acc, sizeof(V));
  }
  for (std::size_t j = vectors_end; j < j1; ++j)
    for (std::size_t r = 0; r < R; ++r) c[j] = fma_hd(a[(p + r) * pr.a.cs], E::one(b + r * rs + j), c[j]);
}
// One output row (a decoding step's matrix-vector product) against b with
// contiguous rows: b is read where it lies and in the order it lies, Rows
// whole rows per pass over the output row, which waits in cache between
// passes; neither the copy into packed strips nor the MR - 1 padded rows a
// register tile would compute and drop, nor the column strips that would
// read each row of b a few lines at a time. So the product runs at the speed
// b streams from memory (measured 1.3-2x the strip order on 896 x 4864).
// Each element's sum is the blocked kernel's: ascending p, one fma per term,
// from zero (or from what C holds when continued), stored and reloaded
// unchanged between passes; columns past the last whole vector by scalar fma.
// A 16-bit b (Format Bf16 or F16) is widened as it is loaded: half the
// bytes to stream, the same terms.
template <class T, std::size_t Lanes, class Format = T>
[[gnu::always_inline]] inline void multiply_row(const Problem<T>& pr, std::size_t i, std::size_t j0, std::size_t j1) {
  constexpr std::size_t Rows = 8;
  const T* a = pr.a.p + i * pr.a.rs;
  T* c = pr.c + i * pr.n;
  const std::size_t vectors_end = j0 + (j1 - j0) / Lanes * Lanes;
  if (!pr.continued) std::fill(c + j0, c + j1, T(0));
  std::size_t p = 0;
  for (; p + Rows <= pr.k; p += Rows) row_pass<T, Lanes, Rows, Format>(pr, a, c, p, j0, vectors_end, j1);
  for (; p < pr.k; ++p) row_pass<T, Lanes, 1, Format>(pr, a, c, p, j0, vectors_end, j1);
}

// One output row against b with contiguous columns (x . W^T with W [n, k],
// a decoding step's tied output layer): Lanes columns at a time, their terms
// turned into vectors by transpose_square in registers (no packed strip
// written and read back), each lane's sum ascending p from zero (or from C
// when continued); the terms
// past the last square and the columns past the last vector by scalar fma.
// A 16-bit b is widened as it is loaded (Terms::square: the square's rows
// first, then the same transpose).
template <class T, std::size_t Lanes, class Format = T>
[[gnu::always_inline]] inline void multiply_row_transposed(const Problem<T>& pr, std::size_t i, std::size_t j0,
                                                           std::size_t j1) {
  using V = typename Vec<T, Lanes>::type;
  const T* a = pr.a.p + i * pr.a.rs;
  T* c = pr.c + i * pr.n;
  using E = Terms<T, Lanes, Format>;
  const auto* const bp = reinterpret_cast<const typename E::Element*>(pr.b.p);
  const std::size_t terms = pr.k / Lanes * Lanes;
  std::size_t j = j0;
  for (; j + Lanes <= j1; j += Lanes) {
    const auto* b = bp + j * pr.b.cs;
    V acc = V{};
    if (pr.continued) __builtin_memcpy(&acc, c + j, sizeof(V));
    const bool ahead = j + 2 * Lanes <= j1;
    for (std::size_t p = 0; p < terms; p += Lanes) {
      if (ahead) {
        GRAD_GEMM_UNROLL
        for (std::size_t l = 0; l < Lanes; ++l) __builtin_prefetch(b + (Lanes + l) * pr.b.cs + p, 0, 2);
      }
      alignas(64) T square[Lanes * Lanes];
      E::square(b + p, pr.b.cs, square, Lanes);
      GRAD_GEMM_UNROLL
      for (std::size_t q = 0; q < Lanes; ++q) {
        V terms_q;
        __builtin_memcpy(&terms_q, square + q * Lanes, sizeof(V));
        acc = simd::fma_lanes<T>(simd::splat<V>(a[(p + q) * pr.a.cs]), terms_q, acc);
      }
    }
    alignas(64) T out[Lanes];
    __builtin_memcpy(out, &acc, sizeof(V));
    for (std::size_t l = 0; l < Lanes; ++l)
      for (std::size_t p = terms; p < pr.k; ++p)
        out[l] = fma_hd(a[p * pr.a.cs], E::one(b + l * pr.b.cs + p), out[l]);
    __builtin_memcpy(c + j, out, sizeof(V));
  }
  for (; j < j1; ++j) {
    T acc = pr.continued ? c[j] : T(0);
    for (std::size_t p = 0; p < pr.k; ++p) acc = fma_hd(a[p * pr.a.cs], E::one(bp + j * pr.b.cs + p), acc);
    c[j] = acc;
  }
}

// One output row (a decoding step) where b lies in rows or in columns: read
// b where it lies, a 16-bit b widened as it is loaded (its narrow rows too:
// the register-strip kernel reads T). False when b is strided both ways.
template <class T, std::size_t Lanes, std::size_t NV, class Format>
[[gnu::always_inline]] inline bool multiply_one_row(const Problem<T>& pr, std::size_t i, std::size_t j0,
                                                    std::size_t j1) {
  if (pr.b.cs == 1) {
    if constexpr (std::is_same_v<Format, T>) {
      if (j1 - j0 <= narrow_row_strips * 2 * NV * Lanes) {
        multiply_narrow_row<T, Lanes, 2 * NV>(pr, i, j0, j1);
        return true;
      }
    }
    multiply_row<T, Lanes, Format>(pr, i, j0, j1);
    return true;
  }
  if (pr.b.rs == 1) {
    multiply_row_transposed<T, Lanes, Format>(pr, i, j0, j1);
    return true;
  }
  return false;
}

}  // namespace gemm_detail
}  // namespace grad
