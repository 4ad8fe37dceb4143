// A quantized b held in row groups (numerics/quant_rows.hpp) read as the
// kernels want it: thirty-two terms of sixteen outputs at a time, each term a
// run of sixteen floats (one per output), dequantized exactly as
// quant.hpp's dequantize_block computes each weight. Used by a decoding
// step's one-row product (multiply_row_grouped: the lanes of its vectors are
// outputs, so no transposition) and by packing a prefill's strips.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "grad/numerics/gemm/micro_kernel.hpp"  // Vec, GRAD_GEMM_UNROLL
#include "grad/numerics/gemm/problem.hpp"
#include "grad/numerics/quant_rows.hpp"
#include "grad/numerics/simd.hpp"
#include "grad/numerics/storage.hpp"

namespace grad {
namespace gemm_detail {

inline constexpr std::size_t group_lanes = quant_group_rows;  // outputs per group
inline constexpr std::size_t group_terms = 32;                // terms per call: a q8_0/q4_0 block, a K sub-block

#if GRAD_SIMD
// Lanes lanes of a group block's fields as vectors (functions, not lambdas:
// always inlined into each instruction set's copy, at any -O level).
template <std::size_t Lanes>
struct GroupLanes {
  using Fv = typename Vec<float, Lanes>::type;
  using Iv = typename Vec<std::int32_t, Lanes>::type;
  // Bytes widened to int32 lanes: one vpmovzxbd / vpmovsxbd where the copy
  // has one (GCC 12 turns the generic conversion of a byte vector into
  // scalar code), else through 16 bits.
  template <bool Signed>
  [[gnu::always_inline]] static Iv widen_bytes(const std::uint8_t* p) {
#if GRAD_SIMD_X86_SQRT
    typedef char Chars __attribute__((vector_size(16)));
    if constexpr (Lanes == 16) {
      Chars b;
      __builtin_memcpy(&b, p, 16);
      if constexpr (Signed) return (Iv)__builtin_ia32_pmovsxbd512_mask(b, Iv{}, static_cast<unsigned short>(-1));
      return (Iv)__builtin_ia32_pmovzxbd512_mask(b, Iv{}, static_cast<unsigned short>(-1));
    } else if constexpr (Lanes == 8) {
      Chars b{};
      __builtin_memcpy(&b, p, 8);
      if constexpr (Signed) return (Iv)__builtin_ia32_pmovsxbd256(b);
      return (Iv)__builtin_ia32_pmovzxbd256(b);
    }
#endif
    using Byte = std::conditional_t<Signed, std::int8_t, std::uint8_t>;
    typename Vec<Byte, Lanes>::type b;
    __builtin_memcpy(&b, p, sizeof b);
    return __builtin_convertvector(__builtin_convertvector(b, typename Vec<std::int16_t, Lanes>::type), Iv);
  }
  [[gnu::always_inline]] static Iv bytes(const std::uint8_t* p) { return widen_bytes<false>(p); }
  [[gnu::always_inline]] static Iv signed_bytes(const std::uint8_t* p) { return widen_bytes<true>(p); }
  [[gnu::always_inline]] static Fv halves(const std::uint8_t* p) {  // half scales, widened exactly
    typename Vec<std::uint16_t, Lanes>::type h;
    __builtin_memcpy(&h, p, sizeof h);
    return F16::widen_lanes<Fv>(__builtin_convertvector(h, typename Vec<std::uint32_t, Lanes>::type));
  }
  [[gnu::always_inline]] static void put(float* out, Fv w) { __builtin_memcpy(out, &w, sizeof w); }
};
#endif

// Terms [32 s, 32 s + 32) of a full group block (16 lanes) of format F:
// term t of lane l written to out[t * stride + l]. Computed Lanes lanes at a
// time with the same operations, in the same order, as dequantize_block
// computes each weight: integer unpacking, then the format's float products
// (and difference), so every value has dequantize_block's bits.
template <QuantFormat F, std::size_t Lanes>
[[gnu::always_inline]] inline void dequantize_group_terms(const std::uint8_t* __restrict gb, std::size_t s,
                                                          float* __restrict out, std::size_t stride) {
  constexpr std::size_t L = group_lanes;
#if GRAD_SIMD
  using Fv = typename Vec<float, Lanes>::type;
  using Iv = typename Vec<std::int32_t, Lanes>::type;
  using Q = GroupLanes<Lanes>;
  GRAD_GEMM_UNROLL
  for (std::size_t v = 0; v < L / Lanes; ++v) {
    const std::size_t lane = v * Lanes;
    if constexpr (F == QuantFormat::q8_0) {  // d [16 halves] | q [32][16]
      const Fv d = Q::halves(gb + 2 * lane);
      for (std::size_t t = 0; t < 32; ++t)
        Q::put(out + t * stride + lane, __builtin_convertvector(Q::signed_bytes(gb + 2 * L + t * L + lane), Fv) * d);
    } else if constexpr (F == QuantFormat::q4_0) {  // d [16 halves] | qs [16][16]
      const Fv d = Q::halves(gb + 2 * lane);
      for (std::size_t j = 0; j < 16; ++j) {
        const Iv q = Q::bytes(gb + 2 * L + j * L + lane);
        Q::put(out + j * stride + lane, __builtin_convertvector((q & 15) - 8, Fv) * d);
        Q::put(out + (j + 16) * stride + lane, __builtin_convertvector((q >> 4) - 8, Fv) * d);
      }
    } else if constexpr (F == QuantFormat::q4_k || F == QuantFormat::q5_k) {
      // d [16 halves] | dmin [16 halves] | scales [12][16] | (q5_K: qh [32][16]) | qs [128][16]
      const std::uint8_t* sc = gb + 4 * L + lane;
      Iv scale, min;  // quant.hpp's scale_min_k4, lane by lane
      if (s < 4) {
        scale = Q::bytes(sc + s * L) & 63;
        min = Q::bytes(sc + (s + 4) * L) & 63;
      } else {
        scale = (Q::bytes(sc + (s + 4) * L) & 0xF) | ((Q::bytes(sc + (s - 4) * L) >> 6) << 4);
        min = (Q::bytes(sc + (s + 4) * L) >> 4) | ((Q::bytes(sc + s * L) >> 6) << 4);
      }
      const Fv d1 = Q::halves(gb + 2 * lane) * __builtin_convertvector(scale, Fv);
      const Fv m1 = Q::halves(gb + 2 * L + 2 * lane) * __builtin_convertvector(min, Fv);
      constexpr std::size_t qs_at = F == QuantFormat::q4_k ? 16 * L : 48 * L;
      const std::uint8_t* qs = gb + qs_at + 32 * (s / 2) * L + lane;
      for (std::size_t l = 0; l < 32; ++l) {
        const Iv b = Q::bytes(qs + l * L);  // 0 .. 255: its high nibble needs no mask
        Iv q = s % 2 == 0 ? b & 0xF : b >> 4;
        if constexpr (F == QuantFormat::q5_k) q = q | ((Q::bytes(gb + 16 * L + l * L + lane) >> static_cast<int>(s)) & 1) << 4;
        Q::put(out + l * stride + lane, d1 * __builtin_convertvector(q, Fv) - m1);
      }
    } else {
      static_assert(F == QuantFormat::q6_k);  // ql [128][16] | qh [64][16] | scales [16][16] | d [16 halves]
      const Fv d = Q::halves(gb + 208 * L + 2 * lane);
      const std::size_t h = s / 4, k = s % 4;
      const std::uint8_t* ql = gb + (64 * h + (k % 2) * 32) * L + lane;
      const std::uint8_t* qh = gb + 128 * L + 32 * h * L + lane;
      const int nibble = k < 2 ? 0 : 4, high = static_cast<int>(2 * k);
      for (std::size_t half = 0; half < 2; ++half) {  // 16 terms per scale
        const Fv ds = d * __builtin_convertvector(Q::signed_bytes(gb + 192 * L + (8 * h + 2 * k + half) * L + lane), Fv);
        for (std::size_t l = 16 * half; l < 16 * half + 16; ++l) {
          const Iv q = (((Q::bytes(ql + l * L) >> nibble) & 0xF) | ((Q::bytes(qh + l * L) >> high) & 3) << 4) - 32;
          Q::put(out + l * stride + lane, ds * __builtin_convertvector(q, Fv));
        }
      }
    }
  }
#else  // without vector extensions: each lane's block whole, then its 32 terms
  constexpr QuantInfo info = quant_info(F);
  std::uint8_t block[256];
  float values[256];
  for (std::size_t l = 0; l < L; ++l) {
    quant_detail::move_block<false>(F, const_cast<std::uint8_t*>(gb), L, l, block);
    dequantize_block<F>(block, values);
    for (std::size_t t = 0; t < group_terms; ++t) out[t * stride + l] = values[(32 * s + t) % info.block_elements];
  }
#endif
}

// One output row against a quantized b held in columns (pr.b.rs == 1: its
// memory rows are the outputs, a projection as llama.cpp holds it), the G
// whole groups of sixteen outputs from group g0: 32 terms at a time
// dequantized into an L1 strip laid out as a packed strip of b (term t's G x
// 16 values side by side), then the register tile's kernel over it, one fma
// per term and output in ascending p, from zero (or from C when continued),
// stored and reloaded unchanged between runs: each output's sum is the
// blocked kernel's over the dequantized values. b streams from memory once,
// group after group, in the order it lies.
template <class T, std::size_t Lanes, QuantFormat F, std::size_t G>
[[gnu::always_inline]] inline void multiply_groups(const Problem<T>& pr, const QuantRows& m, std::size_t i,
                                                   std::size_t g0) {
  constexpr std::size_t L = group_lanes, width = G * L, NV = width / Lanes;
  static_assert(width % Lanes == 0);
  constexpr std::size_t B = quant_info(F).block_elements, subs = B / group_terms;
  alignas(64) T strip[group_terms * width];
  alignas(64) float floats[std::is_same_v<T, float> ? 1 : group_terms * width];
  const auto* held = reinterpret_cast<const std::uint8_t*>(pr.b.p);
  T* c = pr.c + i * pr.n + g0 * L;
  const std::size_t step_bytes = L * quant_info(F).block_bytes / subs;  // a group's bytes per 32 terms
  constexpr std::size_t prefetch_distance = 4096;
  for (std::size_t b = 0; b < m.blocks_per_row(); ++b)
    for (std::size_t s = 0; s < subs; ++s) {
      for (std::size_t g = 0; g < G; ++g) {
        const std::uint8_t* gb = held + m.group_block(g0 + g, b);
        // The G streams ahead by a few KiB (measured: without, a matrix
        // streamed from memory ran at two thirds of its speed from cache).
        for (std::size_t line = 0; line < step_bytes; line += 64)
          __builtin_prefetch(gb + s * step_bytes + prefetch_distance + line);
        if constexpr (std::is_same_v<T, float>)
          dequantize_group_terms<F, Lanes>(gb, s, strip + g * L, width);
        else
          dequantize_group_terms<F, Lanes>(gb, s, floats + g * L, width);
      }
      if constexpr (!std::is_same_v<T, float>)
        for (std::size_t e = 0; e < group_terms * width; ++e) strip[e] = static_cast<T>(floats[e]);
      const std::size_t p = b * B + s * group_terms;
      const StridedPanel<T> x{pr.a.p + i * pr.a.rs + p * pr.a.cs, 0, pr.a.cs};
      micro_kernel<T, Lanes, 1, NV>(group_terms, x, strip, c, pr.n, p > 0 || pr.continued);
    }
}

// One output row against a quantized b held in columns (rs == 1), outputs
// [j0, j1): whole groups by multiply_groups (a tile's width at a time, then one), the
// rest (a range starting or ending inside a group, the last group of fewer
// than sixteen rows) a column at a time from its dequantized memory row,
// one fma per term, ascending p: the same sums.
template <class T, std::size_t Lanes, QuantFormat F>
[[gnu::always_inline]] inline void multiply_row_grouped(const Problem<T>& pr, std::size_t i, std::size_t j0,
                                                        std::size_t j1) {
  constexpr std::size_t L = group_lanes;
  const QuantRows m{F, pr.b.lines, pr.k};
  const auto* held = reinterpret_cast<const std::uint8_t*>(pr.b.p);
  auto one_column = [&](std::size_t j) {
    thread_local std::vector<float> row;
    row.resize(pr.k);
    read_row(m, held, j, 0, pr.k, row.data());
    const T* a = pr.a.p + i * pr.a.rs;
    T& c = pr.c[i * pr.n + j];
    T acc = pr.continued ? c : T(0);
    for (std::size_t p = 0; p < pr.k; ++p) acc = fma_hd(a[p * pr.a.cs], static_cast<T>(row[p]), acc);
    c = acc;
  };
  std::size_t j = j0;
  for (; j < j1 && (j % L != 0 || m.lanes(j / L) < L || j + L > j1); ++j) one_column(j);
  // G groups a tile: four vectors of outputs (the register tile's width, NV = 4).
  constexpr std::size_t G = Lanes >= 8 ? Lanes / 4 : 1;
  for (; j + G * L <= j1 && m.lanes(j / L + G - 1) == L; j += G * L) multiply_groups<T, Lanes, F, G>(pr, m, i, j / L);
  for (; j + L <= j1 && m.lanes(j / L) == L; j += L) multiply_groups<T, Lanes, F, 1>(pr, m, i, j / L);
  for (; j < j1; ++j) one_column(j);
}

}  // namespace gemm_detail
}  // namespace grad
