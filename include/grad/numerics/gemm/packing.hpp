// Packing: copies of a's row panels and b's strips into zero-padded, per-thread buffers in the
// order the micro-kernel reads them. Apart from the kernels: it moves values, never computes.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "grad/numerics/gemm/group_terms.hpp"
#include "grad/numerics/gemm/micro_kernel.hpp"  // strip_width, tail_unit
#include "grad/numerics/gemm/problem.hpp"
#include "grad/numerics/gemm/terms.hpp"
#include "grad/numerics/held.hpp"
#include "grad/numerics/storage.hpp"

namespace grad {
namespace gemm_detail {

// Packed, zero-padded operand blocks; one pair per thread and element type,
// grown to the largest block seen and then reused (no steady-state allocation).
template <class T>
inline T* pack_buffer(std::size_t elements) {
  constexpr std::size_t line = 64 / sizeof(T);
  thread_local std::vector<T> storage;
  if (storage.size() < elements + line) storage.resize(elements + line);
  const auto address = reinterpret_cast<std::uintptr_t>(storage.data());
  return storage.data() + (line - address / sizeof(T) % line) % line;
}

// Strips of b's block, each kc x width (strip_width: NR, or the tail's),
// zero-padded past the last column.
template <class T, std::size_t Lanes, std::size_t NV, class Format>
[[gnu::always_inline]] inline void pack_b_from(const Strided<T>& b, std::size_t p0, std::size_t kc, std::size_t j0,
                                               std::size_t nc, T* out) {
  using E = Terms<T, Lanes, Format>;
  const auto* const e = reinterpret_cast<const typename E::Element*>(b.p);
  constexpr std::size_t nr = NV * Lanes;
  for (std::size_t jr = 0; jr < nc;) {
    const std::size_t width = strip_width<T, Lanes, NV>(nc - jr);
    const std::size_t cols = std::min(width, nc - jr);
    const std::size_t src = p0 * b.rs + (j0 + jr) * b.cs;
    if (b.cs == 1) {  // rows of b contiguous
      for (std::size_t p = 0; p < kc; ++p) {
        const std::size_t row = src + p * b.rs;
        T* dst = out + p * width;
        // Whole strips as fixed-size copies (vector moves at any -O level,
        // not left to the auto-vectoriser); a ragged last strip by element.
        if (cols == nr) {
          E::run(e + row, dst, nr);
        } else if (cols == width) {
          for (std::size_t j = 0; j < width; j += tail_unit<T, Lanes>)
            E::run(e + row + j, dst + j, tail_unit<T, Lanes>);
        } else {
          for (std::size_t j = 0; j < cols; ++j) dst[j] = E::one(e + row + j);
          for (std::size_t j = cols; j < width; ++j) dst[j] = T(0);
        }
      }
    } else {  // columns of b contiguous (b.rs == 1) or general strides
      // A transpose in squares of Lanes columns by Lanes terms (whole squares
      // in vector registers when b's terms are contiguous): each square reads
      // Lanes short runs of b's columns and writes whole vectors of the strip,
      // so b streams in order instead of missing its cache lines column by column.
      const std::size_t square_cols = b.rs == 1 ? cols / Lanes * Lanes : 0, square_terms = kc / Lanes * Lanes;
      for (std::size_t js = 0; js < square_cols; js += Lanes)
        for (std::size_t p = 0; p < square_terms; p += Lanes)
          E::square(e + src + js * b.cs + p, b.cs, out + p * width + js, width);
      for (std::size_t js = 0; js < cols; js += Lanes) {  // the rest, element by element
        const std::size_t je = std::min(cols, js + Lanes);
        for (std::size_t p = js < square_cols ? square_terms : 0; p < kc; ++p)
          for (std::size_t j = js; j < je; ++j) out[p * width + j] = E::one(e + src + j * b.cs + p * b.rs);
      }
      for (std::size_t p = 0; p < kc; ++p)
        for (std::size_t j = cols; j < width; ++j) out[p * width + j] = T(0);
    }
    out += kc * width;
    jr += width;
  }
}
// Terms [p0, p0 + kc) (whole 32-term runs) of a quantized b's columns
// [col0, col0 + cols) held in row groups, dequantized into dst[p * ld + j]:
// whole groups of sixteen by group_terms.hpp, a column outside one from its
// memory row.
template <class T, std::size_t Lanes, QuantFormat F>
[[gnu::always_inline]] inline void dequantize_grouped(const QuantRows& m, const std::uint8_t* held, std::size_t p0,
                                                      std::size_t kc, std::size_t col0, std::size_t cols, T* dst,
                                                      std::size_t ld) {
  constexpr std::size_t L = group_lanes, B = quant_info(F).block_elements;
  alignas(64) float terms[group_terms * L];
  for (std::size_t j = 0; j < cols;) {
    const std::size_t col = col0 + j;
    if (col % L == 0 && j + L <= cols && m.lanes(col / L) == L) {
      for (std::size_t p = 0; p < kc; p += group_terms) {
        const std::uint8_t* gb = held + m.group_block(col / L, (p0 + p) / B);
        const std::size_t s = (p0 + p) % B / group_terms;
        if constexpr (std::is_same_v<T, float>) {
          dequantize_group_terms<F, Lanes>(gb, s, dst + p * ld + j, ld);
        } else {
          dequantize_group_terms<F, Lanes>(gb, s, terms, L);
          for (std::size_t t = 0; t < group_terms; ++t)
            for (std::size_t l = 0; l < L; ++l) dst[(p + t) * ld + j + l] = static_cast<T>(terms[t * L + l]);
        }
      }
      j += L;
    } else {
      thread_local std::vector<float> row;
      row.resize(kc);
      read_row(m, held, col, p0, kc, row.data());
      for (std::size_t p = 0; p < kc; ++p) dst[p * ld + j] = static_cast<T>(row[p]);
      ++j;
    }
  }
}

// A quantized b held in columns (rs == 1: a projection as llama.cpp holds
// it), a block of whole 32-term runs: a strip of whole groups dequantized
// straight into its packed place (term p's sixteen outputs are a run of the
// strip's row p), any other strip through a buffer and packed from there.
template <class T, std::size_t Lanes, std::size_t NV, QuantFormat F>
[[gnu::always_inline]] inline void pack_b_grouped(const Strided<T>& b, std::size_t p0, std::size_t kc, std::size_t j0,
                                                  std::size_t nc, T* out, T* values) {
  constexpr std::size_t L = group_lanes;
  const QuantRows m{F, b.lines, b.cs};
  const auto* held = reinterpret_cast<const std::uint8_t*>(b.p);
  for (std::size_t jr = 0; jr < nc;) {
    const std::size_t width = strip_width<T, Lanes, NV>(nc - jr), cols = std::min(width, nc - jr), col = j0 + jr;
    if (cols == width && width % L == 0 && col % L == 0 && m.lanes((col + width - 1) / L) == L) {
      dequantize_grouped<T, Lanes, F>(m, held, p0, kc, col, width, out, width);
    } else {
      dequantize_grouped<T, Lanes, F>(m, held, p0, kc, col, cols, values, cols);
      pack_b_from<T, Lanes, NV, T>(Strided<T>{values, cols, 1}, 0, kc, 0, cols, out);
    }
    out += kc * width;
    jr += width;
  }
}

// A quantized b's block: its values dequantized (exactly, numerics/held.hpp)
// into a per-thread buffer laid out as b lies (rows or columns contiguous:
// a quantized matrix's memory rows are whole blocks), then packed from there
// as a T matrix. The terms are the same values either way, so the bits are
// those of the product over the dequantized b. Held in columns and cut at
// whole 32-term runs (the usual case: kc is a multiple of 32), by groups.
template <class T, std::size_t Lanes, std::size_t NV>
[[gnu::always_inline]] inline void pack_b_quantized(const Strided<T>& b, std::size_t p0, std::size_t kc, std::size_t j0, std::size_t nc,
                             T* out) {
  thread_local std::vector<T> values;
  if (values.size() < kc * nc) values.resize(kc * nc);
  const void* held = b.p;
  if (b.rs == 1 && p0 % group_terms == 0 && kc % group_terms == 0) {
    switch (b.storage) {
      case Storage::q8_0: return pack_b_grouped<T, Lanes, NV, QuantFormat::q8_0>(b, p0, kc, j0, nc, out, values.data());
      case Storage::q4_0: return pack_b_grouped<T, Lanes, NV, QuantFormat::q4_0>(b, p0, kc, j0, nc, out, values.data());
      case Storage::q4_k: return pack_b_grouped<T, Lanes, NV, QuantFormat::q4_k>(b, p0, kc, j0, nc, out, values.data());
      case Storage::q5_k: return pack_b_grouped<T, Lanes, NV, QuantFormat::q5_k>(b, p0, kc, j0, nc, out, values.data());
      case Storage::q6_k: return pack_b_grouped<T, Lanes, NV, QuantFormat::q6_k>(b, p0, kc, j0, nc, out, values.data());
      default: break;
    }
  }
  if (b.cs == 1) {  // b's rows in memory: kc runs of nc
    for (std::size_t p = 0; p < kc; ++p)
      read_held(b.storage, held, b.lines, b.rs, (p0 + p) * b.rs + j0, nc, values.data() + p * nc);
    pack_b_from<T, Lanes, NV, T>(Strided<T>{values.data(), nc, 1}, 0, kc, 0, nc, out);
  } else {  // b's columns in memory (rs == 1): nc runs of kc
    for (std::size_t j = 0; j < nc; ++j)
      read_held(b.storage, held, b.lines, b.cs, (j0 + j) * b.cs + p0, kc, values.data() + j * kc);
    pack_b_from<T, Lanes, NV, T>(Strided<T>{values.data(), 1, kc}, 0, kc, 0, nc, out);
  }
}

template <class T, std::size_t Lanes, std::size_t NV>
[[gnu::always_inline]] inline void pack_b(const Strided<T>& b, std::size_t p0, std::size_t kc, std::size_t j0,
                                          std::size_t nc, T* out) {
  switch (b.storage) {
    case Storage::bf16: return pack_b_from<T, Lanes, NV, Bf16>(b, p0, kc, j0, nc, out);
    case Storage::f16: return pack_b_from<T, Lanes, NV, F16>(b, p0, kc, j0, nc, out);
    case Storage::native: break;
    default: return pack_b_quantized<T, Lanes, NV>(b, p0, kc, j0, nc, out);
  }
  pack_b_from<T, Lanes, NV, T>(b, p0, kc, j0, nc, out);
}

// Row panels of a's block, each kc x MR (MR values per term), zero-padded.
template <class T, std::size_t MR>
[[gnu::always_inline]] inline void pack_a(const Strided<T>& a, std::size_t i0, std::size_t mc, std::size_t p0,
                                          std::size_t kc, T* out) {
  for (std::size_t ir = 0; ir < mc; ir += MR) {
    const std::size_t rows = std::min(MR, mc - ir);
    const T* src = a.p + (i0 + ir) * a.rs + p0 * a.cs;
    if (a.rs == 1) {  // columns of a contiguous: MR rows of one term side by side
      for (std::size_t p = 0; p < kc; ++p) {
        const T* col = src + p * a.cs;
        T* dst = out + p * MR;
        for (std::size_t r = 0; r < rows; ++r) dst[r] = col[r];
        for (std::size_t r = rows; r < MR; ++r) dst[r] = T(0);
      }
    } else {
      for (std::size_t r = 0; r < rows; ++r) {
        const T* row = src + r * a.rs;
        for (std::size_t p = 0; p < kc; ++p) out[p * MR + r] = row[p * a.cs];
      }
      for (std::size_t p = 0; p < kc; ++p)
        for (std::size_t r = rows; r < MR; ++r) out[p * MR + r] = T(0);
    }
    out += kc * MR;
  }
}

}  // namespace gemm_detail
}  // namespace grad
