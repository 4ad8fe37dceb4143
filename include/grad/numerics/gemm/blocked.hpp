// One rectangle of C on the calling thread: the cache-blocked loop nest over packed blocks, and
// its copy per instruction set (multiply_range). Apart from the split across threads above it.
#pragma once

#include <algorithm>
#include <cstddef>

#include "grad/numerics/gemm/micro_kernel.hpp"
#include "grad/numerics/gemm/one_row.hpp"
#include "grad/numerics/gemm/packing.hpp"
#include "grad/numerics/gemm/problem.hpp"
#include "grad/numerics/isa.hpp"
#include "grad/numerics/storage.hpp"

namespace grad {
namespace gemm_detail {

// The instruction-set choice is shared with the elementwise loops (isa.hpp).
using grad::best_isa;
using grad::Isa;
using grad::supported;

// Output rows [i0, i1) x columns [j0, j1) of the problem (k > 0).
template <class T, std::size_t Lanes, std::size_t MR, std::size_t NV>
[[gnu::always_inline]] inline void multiply_block(const Problem<T>& pr, std::size_t i0, std::size_t i1, std::size_t j0,
                                                  std::size_t j1) {
  if (i1 - i0 == 1) {
    bool done = false;
    switch (pr.b.storage) {
      case Storage::bf16: done = multiply_one_row<T, Lanes, NV, Bf16>(pr, i0, j0, j1); break;
      case Storage::f16: done = multiply_one_row<T, Lanes, NV, F16>(pr, i0, j0, j1); break;
      case Storage::native: done = multiply_one_row<T, Lanes, NV, T>(pr, i0, j0, j1); break;
      // Quantized: held in columns (a decoding step's projections), else packed like any block (pack_b_quantized).
      case Storage::q8_0: done = pr.b.rs == 1 && (multiply_row_grouped<T, Lanes, QuantFormat::q8_0>(pr, i0, j0, j1), true); break;
      case Storage::q4_0: done = pr.b.rs == 1 && (multiply_row_grouped<T, Lanes, QuantFormat::q4_0>(pr, i0, j0, j1), true); break;
      case Storage::q4_k: done = pr.b.rs == 1 && (multiply_row_grouped<T, Lanes, QuantFormat::q4_k>(pr, i0, j0, j1), true); break;
      case Storage::q5_k: done = pr.b.rs == 1 && (multiply_row_grouped<T, Lanes, QuantFormat::q5_k>(pr, i0, j0, j1), true); break;
      case Storage::q6_k: done = pr.b.rs == 1 && (multiply_row_grouped<T, Lanes, QuantFormat::q6_k>(pr, i0, j0, j1), true); break;
    }
    if (done) return;
  }
  constexpr std::size_t nr = NV * Lanes;
  constexpr std::size_t MC = Blocking<T>::mc;
  const std::size_t KC = Blocking<T>::kc(), NC = std::max(Blocking<T>::nc() / nr * nr, nr);
  static_assert(MC % MR == 0, "MC must hold whole row panels");
  const std::size_t ldc = pr.n;
  const std::size_t kc_max = std::min(KC, pr.k);
  const std::size_t nc_max = (std::min(NC, j1 - j0) + Lanes - 1) / Lanes * Lanes;
  const std::size_t mc_max = (std::min(MC, i1 - i0) + MR - 1) / MR * MR;
  T* const bpack = pack_buffer<T>(kc_max * (nc_max + mc_max));
  T* const apack = bpack + kc_max * nc_max;
  for (std::size_t jc = j0; jc < j1; jc += NC) {
    const std::size_t nc = std::min(NC, j1 - jc);
    for (std::size_t pc = 0; pc < pr.k; pc += KC) {
      const std::size_t kc = std::min(KC, pr.k - pc);
      const bool accumulate = pc > 0 || pr.continued;  // later runs continue the stored partial sums
      pack_b<T, Lanes, NV>(pr.b, pc, kc, jc, nc, bpack);
      // Packing a's block pays off when its panels serve several strips
      // (and a is not read in place, Problem::a_in_place).
      const bool pack_whole_a = nc > nr && !pr.a_in_place;
      for (std::size_t ic = i0; ic < i1; ic += MC) {
        const std::size_t mc = std::min(MC, i1 - ic);
        if (pack_whole_a) pack_a<T, MR>(pr.a, ic, mc, pc, kc, apack);
        for (std::size_t jr = 0; jr < nc;) {
          const std::size_t width = strip_width<T, Lanes, NV>(nc - jr);
          const std::size_t cols = std::min(width, nc - jr);
          const T* bp = bpack + jr * kc;
          for (std::size_t ir = 0; ir < mc; ir += MR) {
            const std::size_t rows = std::min(MR, mc - ir);
            T* c = pr.c + (ic + ir) * ldc + jc + jr;
            if (rows < MR) {  // the last, partial panel: packed, so that its padding reads zeros
              const T* panel = apack + ir * kc;
              if (!pack_whole_a) {
                pack_a<T, MR>(pr.a, ic + ir, rows, pc, kc, apack);
                panel = apack;
              }
              partial_panel<T, Lanes, MR, nr>(kc, panel, bp, c, ldc, accumulate, rows, cols, width);
            } else if (pack_whole_a) {
              tile<T, Lanes, MR, nr>(kc, PackedPanel<T, MR>{apack + ir * kc}, bp, c, ldc, accumulate, rows, cols,
                                     width);
            } else {
              const StridedPanel<T> ap{pr.a.p + (ic + ir) * pr.a.rs + pc * pr.a.cs, pr.a.rs, pr.a.cs};
              tile<T, Lanes, MR, nr>(kc, ap, bp, c, ldc, accumulate, rows, cols, width);
            }
          }
          jr += width;
        }
      }
    }
  }
}

// One instantiation per instruction set. Register tiles: AVX-512 has 32
// vector registers (6 x 4 accumulators plus 4 operands; the fma reads a's
// value with an embedded broadcast; measured best of 8x2, 6x3, 12x2, 6x4,
// 4x4 on Zen 4/5 for both types, before the fma), AVX2 and the baseline 16.
// The narrow tails (strip_width, partial_panel) took tinylm's attention
// products at d 96 (hd 24, 32-row causal blocks) from 50-66 to 80-110
// GFLOP/s on Zen 4, where a 32-byte fma costs half a 64-byte one.
// The AVX-512 and AVX2 copies are compiled with FMA3 (isa.hpp): one vfmadd
// per accumulator and term; the baseline's is libm's fma per lane.
template <class T>
void multiply_baseline(const Problem<T>& pr, std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) {
  multiply_block<T, 16 / sizeof(T), 4, 2>(pr, i0, i1, j0, j1);
}
#if GRAD_HAS_ISA_TARGETS
template <class T>
GRAD_TARGET_AVX2 void multiply_avx2(const Problem<T>& pr, std::size_t i0, std::size_t i1, std::size_t j0,
                                    std::size_t j1) {
  multiply_block<T, 32 / sizeof(T), 4, 2>(pr, i0, i1, j0, j1);
}
template <class T>
GRAD_TARGET_AVX512 void multiply_avx512(const Problem<T>& pr, std::size_t i0, std::size_t i1, std::size_t j0,
                                        std::size_t j1) {
  multiply_block<T, 64 / sizeof(T), 6, 4>(pr, i0, i1, j0, j1);
}
#endif

template <class T>
void multiply_range(Isa isa, const Problem<T>& pr, std::size_t i0, std::size_t i1, std::size_t j0, std::size_t j1) {
  (void)isa;
#if GRAD_HAS_ISA_TARGETS && defined(GRAD_ONLY_ISA)  // one copy (isa.hpp)
  if constexpr (only_isa == Isa::avx512)
    multiply_avx512(pr, i0, i1, j0, j1);
  else if constexpr (only_isa == Isa::avx2)
    multiply_avx2(pr, i0, i1, j0, j1);
  else
    multiply_baseline(pr, i0, i1, j0, j1);
#else
#if GRAD_HAS_ISA_TARGETS
  if (isa == Isa::avx512) return multiply_avx512(pr, i0, i1, j0, j1);
  if (isa == Isa::avx2) return multiply_avx2(pr, i0, i1, j0, j1);
#endif
  multiply_baseline(pr, i0, i1, j0, j1);
#endif
}

}  // namespace gemm_detail
}  // namespace grad
