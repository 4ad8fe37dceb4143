// How grad lays out a quantized matrix in memory: ggml's blocks (quant.hpp),
// each memory row a run of whole blocks, with the rows taken sixteen at a
// time and their blocks interleaved field by field.
//
// Why: a decoding step multiplies one row x by a projection held as
// llama.cpp holds it ([out, in], one memory row per output), and grad's sums
// run one fma per term in ascending order (the determinism contract), so the
// lanes of a vector are sixteen outputs at one term. In ggml's own layout the
// sixteen weights of a term lie in sixteen different rows; here they lie side
// by side, and a group of sixteen rows streams from memory in one sequential
// pass (measured: a 1 x 1536 x 8960 q8_0 product streamed from memory ran 3.1
// G weights/s with the rows apart).
//
// The layout. Memory rows r = 16 g + l (lane l of group g; the last group
// has rows % 16 lanes, one lane being ggml's layout itself) occupy exactly
// the bytes their blocks would occupy one row after another, so the sizes
// are ggml's (held_bytes). Within group g, its lanes' block b together form a
// group block of L * block_bytes bytes, groups blocks in ascending b. A block
// is a list of fields (a half scale, an array of quant bytes, ...); the group
// block holds each field of the L lanes in turn, element by element across
// the lanes: element i of field f of lane l lies at L * offset(f) + (i * L +
// l) * size(f). So block b of a row is recovered byte for byte (row_blocks),
// and the lanes of one quant byte are contiguous.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "grad/numerics/quant.hpp"

namespace grad {

inline constexpr std::size_t quant_group_rows = 16;

// One field of a ggml block: `count` elements of `size` bytes from byte `offset`.
struct QuantField {
  std::uint16_t offset, size, count;
};

namespace quant_detail {
inline constexpr std::array<QuantField, 2> q8_0_fields{{{0, 2, 1}, {2, 1, 32}}};
inline constexpr std::array<QuantField, 2> q4_0_fields{{{0, 2, 1}, {2, 1, 16}}};
inline constexpr std::array<QuantField, 4> q4_k_fields{{{0, 2, 1}, {2, 2, 1}, {4, 1, 12}, {16, 1, 128}}};
inline constexpr std::array<QuantField, 5> q5_k_fields{{{0, 2, 1}, {2, 2, 1}, {4, 1, 12}, {16, 1, 32}, {48, 1, 128}}};
inline constexpr std::array<QuantField, 4> q6_k_fields{{{0, 1, 128}, {128, 1, 64}, {192, 1, 16}, {208, 2, 1}}};
}  // namespace quant_detail

// Every field of a block of f, in the order the block lays them out (quant.hpp's table).
inline constexpr std::span<const QuantField> quant_fields(QuantFormat f) {
  switch (f) {
    case QuantFormat::q8_0: return quant_detail::q8_0_fields;
    case QuantFormat::q4_0: return quant_detail::q4_0_fields;
    case QuantFormat::q4_k: return quant_detail::q4_k_fields;
    case QuantFormat::q5_k: return quant_detail::q5_k_fields;
    case QuantFormat::q6_k: return quant_detail::q6_k_fields;
  }
  return {};
}

// A quantized matrix's memory: `rows` memory rows of `row` elements (whole
// blocks) in format f, grouped as above.
struct QuantRows {
  QuantFormat format;
  std::size_t rows, row;

  std::size_t block_bytes() const { return quant_info(format).block_bytes; }
  std::size_t blocks_per_row() const { return row / quant_info(format).block_elements; }
  std::size_t row_bytes() const { return blocks_per_row() * block_bytes(); }
  std::size_t groups() const { return (rows + quant_group_rows - 1) / quant_group_rows; }
  std::size_t lanes(std::size_t g) const { return std::min(quant_group_rows, rows - g * quant_group_rows); }
  // Byte offset of group g's block b (its lanes' blocks b together).
  std::size_t group_block(std::size_t g, std::size_t b) const {
    return g * quant_group_rows * row_bytes() + b * lanes(g) * block_bytes();
  }
};

namespace quant_detail {
// Block `block` of lane l to or from its place in a group block of L lanes.
template <bool Into>
inline void move_block(QuantFormat f, std::uint8_t* group_block, std::size_t lanes, std::size_t l,
                       std::uint8_t* block) {
  for (const QuantField& q : quant_fields(f))
    for (std::size_t i = 0; i < q.count; ++i) {
      std::uint8_t* at = group_block + lanes * q.offset + (i * lanes + l) * q.size;
      std::uint8_t* own = block + q.offset + i * q.size;
      if constexpr (Into)
        std::memcpy(at, own, q.size);
      else
        std::memcpy(own, at, q.size);
    }
}
}  // namespace quant_detail

// Memory row r's blocks (row_bytes(), ggml's layout) written into `held`.
inline void put_row_blocks(const QuantRows& m, std::uint8_t* held, std::size_t r, const std::uint8_t* blocks) {
  const std::size_t g = r / quant_group_rows, l = r % quant_group_rows, lanes = m.lanes(g), bb = m.block_bytes();
  for (std::size_t b = 0; b < m.blocks_per_row(); ++b)
    quant_detail::move_block<true>(m.format, held + m.group_block(g, b), lanes, l,
                                   const_cast<std::uint8_t*>(blocks + b * bb));
}
// Block b of memory row r, in ggml's layout.
inline void get_block(const QuantRows& m, const std::uint8_t* held, std::size_t r, std::size_t b,
                      std::uint8_t* block) {
  const std::size_t g = r / quant_group_rows;
  quant_detail::move_block<false>(m.format, const_cast<std::uint8_t*>(held + m.group_block(g, b)), m.lanes(g),
                                  r % quant_group_rows, block);
}
// Memory row r's blocks (row_bytes()), in ggml's layout.
inline void get_row_blocks(const QuantRows& m, const std::uint8_t* held, std::size_t r, std::uint8_t* blocks) {
  for (std::size_t b = 0; b < m.blocks_per_row(); ++b) get_block(m, held, r, b, blocks + b * m.block_bytes());
}

// Elements [c0, c0 + n) of memory row r, dequantized (exactly, as quant.hpp's dequantize).
inline void read_row(const QuantRows& m, const std::uint8_t* held, std::size_t r, std::size_t c0, std::size_t n,
                     float* out) {
  const QuantInfo info = quant_info(m.format);
  const std::size_t B = info.block_elements;
  std::uint8_t block[256];  // the largest block: q6_K's 210 bytes
  float values[256];
  for (std::size_t c = c0; c < c0 + n;) {
    const std::size_t b = c / B, at = c % B, take = std::min(B - at, c0 + n - c);
    get_block(m, held, r, b, block);
    if (at == 0 && take == B) {
      dequantize(m.format, block, out, B);
    } else {
      dequantize(m.format, block, values, B);
      std::copy_n(values + at, take, out);
    }
    out += take;
    c += take;
  }
}

}  // namespace grad
