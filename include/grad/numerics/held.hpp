// A frozen constant held in anything but T (numerics/storage.hpp's kinds):
// how many bytes it takes, and its values read back as T, exactly.
//
// Elements are counted in the order they lie in memory. A 16-bit constant
// holds one value per element; a quantized one (llama.cpp's blocks,
// numerics/quant.hpp) holds its rows as runs of whole blocks, so element e
// lies in block e / B at place e % B (B = 32 or 256 weights per block), and
// a row of a matrix starts a block when its length is a multiple of B, which
// the tape checks when it records such a constant.
//
// A quantized matrix may hold its transpose (Operand::transposed): a
// projection [in, out] held as llama.cpp holds it, one row of blocks per
// output. Its readers (the matrix products) take its elements by strides,
// which is all the transpose changes. Its memory rows lie in groups of
// sixteen, interleaved (numerics/quant_rows.hpp), so every reader names the
// rows and their length.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

#include "grad/numerics/quant.hpp"
#include "grad/numerics/quant_rows.hpp"
#include "grad/numerics/storage.hpp"

namespace grad {

// The block format of a quantized storage (s quantized).
inline constexpr QuantFormat quant_format(Storage s) {
  switch (s) {
    case Storage::q8_0: return QuantFormat::q8_0;
    case Storage::q4_0: return QuantFormat::q4_0;
    case Storage::q4_k: return QuantFormat::q4_k;
    case Storage::q5_k: return QuantFormat::q5_k;
    default: return QuantFormat::q6_k;
  }
}
inline constexpr Storage storage_of(QuantFormat f) {
  switch (f) {
    case QuantFormat::q8_0: return Storage::q8_0;
    case QuantFormat::q4_0: return Storage::q4_0;
    case QuantFormat::q4_k: return Storage::q4_k;
    case QuantFormat::q5_k: return Storage::q5_k;
    case QuantFormat::q6_k: return Storage::q6_k;
  }
  return Storage::native;
}

// Elements per block: 1 for native and 16-bit storage.
inline constexpr std::size_t block_elements(Storage s) {
  return quantized(s) ? quant_info(quant_format(s)).block_elements : 1;
}
// Bytes that `elements` values take held as s (native: native_bytes each);
// for a quantized s, elements is a multiple of block_elements(s).
inline constexpr std::size_t held_bytes(Storage s, std::size_t elements, std::size_t native_bytes) {
  if (quantized(s)) return quant_bytes(quant_format(s), elements);
  return elements * (s == Storage::native ? native_bytes : 2);
}

// Why a matrix whose memory rows are `row` elements long cannot be held as
// s ("" when it can): a quantized row is whole blocks.
inline std::string held_row_refusal(Storage s, std::size_t row) {
  const std::size_t b = block_elements(s);
  if (row % b == 0) return {};
  return "rows of " + std::to_string(row) + " elements are not whole " + std::string(storage_name(s)) + " blocks of " +
         std::to_string(b) + " (llama.cpp's blocks run along a row)";
}

// Elements [first, first + count) of a constant held as s (not native) at
// `held`, in memory order, as T: exact (every held value is a float
// computed in a fixed order). A quantized constant's memory is `rows` rows
// of `row` elements laid out as numerics/quant_rows.hpp says; a range may
// start and end inside blocks and rows.
template <class T>
inline void read_held(Storage s, const void* held, std::size_t rows, std::size_t row, std::size_t first,
                      std::size_t count, T* out) {
  if (count == 0) return;
  if (sixteen_bit(s)) {
    widen_run(s, static_cast<const std::uint16_t*>(held) + first, out, count);
    return;
  }
  const QuantRows m{quant_format(s), rows, row};
  const auto* bytes = static_cast<const std::uint8_t*>(held);
  float values[256];
  for (std::size_t e = first; e < first + count;) {
    const std::size_t r = e / row, c = e % row;
    const std::size_t take = std::min({row - c, first + count - e, std::size_t{256}});
    if constexpr (std::is_same_v<T, float>) {
      read_row(m, bytes, r, c, take, out);
    } else {
      read_row(m, bytes, r, c, take, values);
      for (std::size_t i = 0; i < take; ++i) out[i] = static_cast<T>(values[i]);
    }
    out += take;
    e += take;
  }
}
template <class T>
inline T held_value(Storage s, const void* held, std::size_t rows, std::size_t row, std::size_t e) {
  T v{};
  read_held(s, held, rows, row, e, 1, &v);
  return v;
}

}  // namespace grad
