// llama.cpp's (ggml's) quantized block formats, bit for bit: the block
// layouts GGUF files hold, ggml's reference dequantization (the float of every
// weight, computed with ggml's operations in ggml's order) and ggml's
// reference quantizers (quantize_row_*_ref: the same input floats give the
// same block bytes). Written from ggml/src/ggml-common.h and ggml-quants.c
// (read August 2026), not copied.
//
// Block layouts (every multi-byte field little-endian; "half" is an IEEE
// binary16 scale, widened exactly by F16::widen):
//
//   q8_0  32 weights, 34 bytes:  half d | int8 q[32]
//         y[j] = q[j] * d
//   q4_0  32 weights, 18 bytes:  half d | uint8 qs[16]
//         y[j] = ((qs[j] & 15) - 8) * d,  y[j + 16] = ((qs[j] >> 4) - 8) * d
//   q4_K  256 weights, 144 bytes: half d | half dmin | uint8 scales[12] | uint8 qs[128]
//         eight sub-blocks of 32, each with a 6-bit scale sc and a 6-bit min m
//         packed in scales[12] (scale_min_k4 below); sub-block s covers
//         y[32s .. 32s+31], its 4-bit quants are the low nibbles of
//         qs[32*(s/2) ..] for even s and the high nibbles for odd s.
//         y = d1 * q - m1,  d1 = d * sc,  m1 = dmin * m   (each a float, in this order)
//   q5_K  256 weights, 176 bytes: half d | half dmin | uint8 scales[12] | uint8 qh[32] | uint8 qs[128]
//         as q4_K with a fifth bit: bit s of qh[l] is the high bit of y[32s + l].
//         y = d1 * q - m1 with q in 0..31
//   q6_K  256 weights, 210 bytes: uint8 ql[128] | uint8 qh[64] | int8 scales[16] | half d
//         two halves of 128; in half h, for l < 32 the four weights
//         y[128h + l + 32k] (k = 0..3) take their low nibbles from ql[64h + l]
//         (k = 0, 2: low, high nibble) and ql[64h + 32 + l] (k = 1, 3), their two
//         high bits from bits 2k, 2k+1 of qh[32h + l]; q = that 6-bit value - 32,
//         scale scales[(128h + l + 32k) / 16].
//         y = (d * sc) * q   (the product d * sc first, as ggml writes d * sc[is] * q)
//
// Why exact: every dequantized weight is one float computed by a fixed
// sequence of IEEE operations on the block's bits (no reduction, nothing
// reordered), so it has the same bits on every ISA, at every optimisation
// level and every thread count, and a product over quantized weights that
// dequantizes while packing gives the bits of the same product over the
// dequantized floats. It is also immune to contraction: d * sc (a half's 11
// significant bits times a 6-bit integer) and d1 * q (at most 17 + 5 bits)
// are exact in float, so a fused d1 * q - m1 rounds once either way, and
// q8_0, q4_0 and q6_K have no addition to fuse. The quantizers do round in
// many places (weighted sums, the scale searches); they follow ggml's
// operations and order exactly and need contraction off, which grad's build
// and its pkg-config flags set (-ffp-contract=off) and which this header
// sets again around them for GCC and clang, whatever the command line says.
//
// ggml's reference quantizers in C are undefined where a float is converted
// to an integer it does not fit (the subnormal-scale cases: 1/d overflows),
// and the bytes differ across platforms there; grad computes what ggml's
// x86-64 build computes (cvttss2si: out of range or NaN gives INT32_MIN, then
// the low byte), so the bytes match x86-64 ggml for every finite input. NaN
// and infinite inputs are refused (std::invalid_argument). Contraction: ggml's
// x86-64 build has none unless built with FMA; an FMA build of ggml (or an
// aarch64 one with GCC's default -ffp-contract=fast) may contract its
// quantizers' sums and give other bytes; its dequantization agrees (above).
#pragma once

#include <array>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include "grad/numerics/storage.hpp"

namespace grad {

enum class QuantFormat : std::uint8_t { q8_0, q4_0, q4_k, q5_k, q6_k };

// Every format, for loops over them.
inline constexpr std::array<QuantFormat, 5> quant_formats{QuantFormat::q8_0, QuantFormat::q4_0, QuantFormat::q4_k,
                                                          QuantFormat::q5_k, QuantFormat::q6_k};

struct QuantInfo {
  std::string_view name;       // as ggml names the type: "q8_0", "q4_0", "q4_K", "q5_K", "q6_K"
  std::uint32_t ggml_type;     // GGML_TYPE_*, as a GGUF tensor info stores it
  std::size_t block_elements;  // weights per block: 32 or 256 (QK_K)
  std::size_t block_bytes;     // bytes per block
};

inline constexpr QuantInfo quant_info(QuantFormat f) {
  switch (f) {
    case QuantFormat::q8_0: return {"q8_0", 8, 32, 34};
    case QuantFormat::q4_0: return {"q4_0", 2, 32, 18};
    case QuantFormat::q4_k: return {"q4_K", 12, 256, 144};
    case QuantFormat::q5_k: return {"q5_K", 13, 256, 176};
    case QuantFormat::q6_k: return {"q6_K", 14, 256, 210};
  }
  throw std::invalid_argument("grad::quant_info: unknown QuantFormat " + std::to_string(static_cast<unsigned>(f)));
}

// The format of a GGML_TYPE_* value, or nothing for a type grad does not read.
inline std::optional<QuantFormat> quant_format_from_ggml(std::uint32_t ggml_type) {
  for (const QuantFormat f : quant_formats)
    if (quant_info(f).ggml_type == ggml_type) return f;
  return std::nullopt;
}

// Bytes of n elements; n must be a multiple of the block size (quant_check
// says so, or the caller refuses first): the remainder is not counted.
inline constexpr std::size_t quant_bytes(QuantFormat f, std::size_t n) {
  const QuantInfo q = quant_info(f);
  return n / q.block_elements * q.block_bytes;
}

// Throws std::invalid_argument, naming `who`, unless n is a whole number of f's blocks.
inline void quant_check(QuantFormat f, std::size_t n, std::string_view who) {
  const QuantInfo q = quant_info(f);
  if (n % q.block_elements != 0)
    throw std::invalid_argument(std::string(who) + ": " + std::string(q.name) + ": n = " + std::to_string(n) +
                                " elements is not a multiple of the block size " + std::to_string(q.block_elements) +
                                " (expected whole blocks of " + std::to_string(q.block_bytes) + " bytes)");
}

namespace quant_detail {

inline constexpr std::size_t qk_k = 256;  // QK_K: weights per K-quant super-block

// A little-endian 16-bit field (a half's bits), on any host.
[[gnu::always_inline]] inline std::uint16_t load_u16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | p[1] << 8);
}
inline void store_u16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v & 0xffu);
  p[1] = static_cast<std::uint8_t>(v >> 8);
}

// Sub-block j's 6-bit scale and min in a q4_K / q5_K block's scales[12]
// (ggml's get_scale_min_k4): sub-blocks 0..3 hold them in the low 6 bits of
// bytes j and j + 4; 4..7 in the nibbles of byte j + 4, with their top two
// bits in the spare high bits of bytes j - 4 (scale) and j (min).
struct ScaleMin {
  std::uint8_t scale, min;
};
[[gnu::always_inline]] inline ScaleMin scale_min_k4(int j, const std::uint8_t* q) {
  if (j < 4) return {static_cast<std::uint8_t>(q[j] & 63), static_cast<std::uint8_t>(q[j + 4] & 63)};
  return {static_cast<std::uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4)),
          static_cast<std::uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4))};
}

// q4_K and q5_K dequantization share the scales: d * sc and dmin * m per sub-block.
[[gnu::always_inline]] inline void k_scales(const std::uint8_t* block, float* dsub, float* msub) {
  const float d = F16::widen(load_u16(block)), dmin = F16::widen(load_u16(block + 2));
  for (int j = 0; j < 8; ++j) {
    const ScaleMin sm = scale_min_k4(j, block + 4);
    dsub[j] = d * static_cast<float>(sm.scale);
    msub[j] = dmin * static_cast<float>(sm.min);
  }
}

}  // namespace quant_detail

// The 32 or 256 weights of one block, in ggml's order (dequantize_row_*).
template <QuantFormat F>
[[gnu::always_inline]] inline void dequantize_block(const std::uint8_t* block, float* out) {
  using quant_detail::load_u16;
  if constexpr (F == QuantFormat::q8_0) {
    const float d = F16::widen(load_u16(block));
    const std::uint8_t* q = block + 2;
    for (int j = 0; j < 32; ++j) out[j] = static_cast<float>(static_cast<std::int8_t>(q[j])) * d;
  } else if constexpr (F == QuantFormat::q4_0) {
    const float d = F16::widen(load_u16(block));
    const std::uint8_t* q = block + 2;
    for (int j = 0; j < 16; ++j) {
      out[j] = static_cast<float>((q[j] & 0xF) - 8) * d;
      out[j + 16] = static_cast<float>((q[j] >> 4) - 8) * d;
    }
  } else if constexpr (F == QuantFormat::q4_k) {
    float dsub[8], msub[8];
    quant_detail::k_scales(block, dsub, msub);
    const std::uint8_t* qs = block + 16;
    for (int g = 0; g < 4; ++g) {
      const float d1 = dsub[2 * g], m1 = msub[2 * g], d2 = dsub[2 * g + 1], m2 = msub[2 * g + 1];
      const std::uint8_t* q = qs + 32 * g;
      float* y = out + 64 * g;
      for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) y[32 + l] = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  } else if constexpr (F == QuantFormat::q5_k) {
    float dsub[8], msub[8];
    quant_detail::k_scales(block, dsub, msub);
    const std::uint8_t* qh = block + 16;
    const std::uint8_t* qs = block + 48;
    for (int g = 0; g < 4; ++g) {
      const float d1 = dsub[2 * g], m1 = msub[2 * g], d2 = dsub[2 * g + 1], m2 = msub[2 * g + 1];
      const std::uint8_t* q = qs + 32 * g;
      float* y = out + 64 * g;
      const int s1 = 2 * g, s2 = 2 * g + 1;  // the bits of qh that are these sub-blocks' fifth bits
      for (int l = 0; l < 32; ++l) y[l] = d1 * static_cast<float>((q[l] & 0xF) | ((qh[l] >> s1) & 1) << 4) - m1;
      for (int l = 0; l < 32; ++l) y[32 + l] = d2 * static_cast<float>((q[l] >> 4) | ((qh[l] >> s2) & 1) << 4) - m2;
    }
  } else {
    static_assert(F == QuantFormat::q6_k);
    const std::uint8_t* ql = block;
    const std::uint8_t* qh = block + 128;
    const std::uint8_t* sc = block + 192;
    const float d = F16::widen(load_u16(block + 208));
    float ds[16];  // d * sc, rounded once per scale as ggml's d * sc[is] * q does per weight
    for (int k = 0; k < 16; ++k) ds[k] = d * static_cast<float>(static_cast<std::int8_t>(sc[k]));
    for (int h = 0; h < 2; ++h) {
      const std::uint8_t* l4 = ql + 64 * h;
      const std::uint8_t* h2 = qh + 32 * h;
      float* y = out + 128 * h;
      const float* dh = ds + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((l4[l] & 0xF) | ((h2[l] >> 0) & 3) << 4) - 32;
        const int q2 = ((l4[l + 32] & 0xF) | ((h2[l] >> 2) & 3) << 4) - 32;
        const int q3 = ((l4[l] >> 4) | ((h2[l] >> 4) & 3) << 4) - 32;
        const int q4 = ((l4[l + 32] >> 4) | ((h2[l] >> 6) & 3) << 4) - 32;
        y[l] = dh[is] * static_cast<float>(q1);
        y[l + 32] = dh[is + 2] * static_cast<float>(q2);
        y[l + 64] = dh[is + 4] * static_cast<float>(q3);
        y[l + 96] = dh[is + 6] * static_cast<float>(q4);
      }
    }
  }
}

// nblocks whole blocks (the per-row loop; the same bits as block by block).
template <QuantFormat F>
inline void dequantize_blocks(const std::uint8_t* blocks, float* out, std::size_t nblocks) {
  constexpr QuantInfo q = quant_info(F);
  for (std::size_t b = 0; b < nblocks; ++b) dequantize_block<F>(blocks + b * q.block_bytes, out + b * q.block_elements);
}

// n weights (a multiple of the block size, else std::invalid_argument) from quant_bytes(f, n) bytes.
inline void dequantize(QuantFormat f, const std::uint8_t* blocks, float* out, std::size_t n) {
  quant_check(f, n, "grad::dequantize");
  if (n != 0 && (blocks == nullptr || out == nullptr))
    throw std::invalid_argument("grad::dequantize: " + std::string(quant_info(f).name) + ": null pointer for " +
                                std::to_string(n) + " elements");
  const std::size_t nb = n / quant_info(f).block_elements;
  switch (f) {
    case QuantFormat::q8_0: return dequantize_blocks<QuantFormat::q8_0>(blocks, out, nb);
    case QuantFormat::q4_0: return dequantize_blocks<QuantFormat::q4_0>(blocks, out, nb);
    case QuantFormat::q4_k: return dequantize_blocks<QuantFormat::q4_k>(blocks, out, nb);
    case QuantFormat::q5_k: return dequantize_blocks<QuantFormat::q5_k>(blocks, out, nb);
    case QuantFormat::q6_k: return dequantize_blocks<QuantFormat::q6_k>(blocks, out, nb);
  }
}

}  // namespace grad

// The quantizers round in ggml's order with separate products and sums:
// contraction off here whatever the command line says (see the top).
#if defined(__clang__)
#pragma float_control(push)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
#endif

namespace grad {
namespace quant_detail {

// ggml's nearest_int: adding 1.5 * 2^23 leaves round-to-nearest-even of f in
// the low 23 bits of the sum (|f| < 2^22; beyond that ggml asserts in debug
// builds and reads the same bits in release ones, as here).
inline int nearest_int(float f) {
  const float shifted = f + 12582912.f;
  return static_cast<int>(std::bit_cast<std::uint32_t>(shifted) & 0x7fffffu) - 0x400000;
}

// A float truncated to int as x86-64's cvttss2si does (NaN and values outside
// int32 give INT32_MIN), which is what ggml's `(int8_t)float` compiles to
// there; C leaves those cases undefined, this defines them as ggml's x86-64
// build behaves.
inline std::int32_t trunc_i32(float f) {
  if (f >= -2147483648.f && f < 2147483648.f) return static_cast<std::int32_t>(f);
  return INT32_MIN;
}
// The low byte of that, as a (int8_t) cast of a float gives on x86-64.
inline std::int8_t trunc_i8(float f) { return static_cast<std::int8_t>(trunc_i32(f)); }

inline float max_of(float a, float b) { return a > b ? a : b; }  // ggml's MAX(a, b)

// ggml's make_qx_quants with rmse_type 1 and no importance weights (the only
// use in the reference quantizers, q6_K's): the weight of x is x*x. n <= 16.
inline float make_qx_quants(int n, int nmax, const float* x, std::int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = std::fabs(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < 1e-15f) {  // GROUP_MAX_EPS: all zero
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.f;
  }
  const auto level = [nmax](float iscale, float v) {
    const int l = nearest_int(iscale * v);
    return l < nmax - 1 ? (l > -nmax ? l : -nmax) : nmax - 1;  // MAX(-nmax, MIN(nmax-1, l))
  };
  float iscale = static_cast<float>(-nmax) / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = level(iscale, x[i]);
    L[i] = static_cast<std::int8_t>(l + nmax);
    const float w = x[i] * x[i];
    const float fl = static_cast<float>(l);
    sumlx += w * x[i] * fl;
    suml2 += w * fl * fl;
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const float fl = static_cast<float>(level(iscale, x[i]));
      const float w = x[i] * x[i];
      sumlx += w * x[i] * fl;
      suml2 += w * fl * fl;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) L[i] = static_cast<std::int8_t>(nmax + level(iscale, x[i]));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// ggml's make_qkx2_quants with use_mad false (q4_K's and q5_K's): levels
// 0..nmax for x = scale * L - the_min, found by a least-squares search over
// nstep + 1 trial scales, weighted by `weights`. n <= 32.
inline float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, std::uint8_t* L, float* the_min,
                              float rmin, float rdelta, int nstep) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *the_min = -min;
    return 0.f;
  }
  const auto level = [nmax](float iscale, float v) {
    const int l = nearest_int(iscale * v);
    return l < nmax ? (l > 0 ? l : 0) : nmax;  // MAX(0, MIN(nmax, l))
  };
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<std::uint8_t>(level(iscale, x[i] - min));
    const float diff = scale * static_cast<float>(L[i]) + min - x[i];
    best_error += weights[i] * (diff * diff);
  }
  std::uint8_t Laux[32];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = level(iscale, x[i] - min);
      Laux[i] = static_cast<std::uint8_t>(l);
      const float w = weights[i];
      const float fl = static_cast<float>(l);
      sum_l += w * fl;
      sum_l2 += w * fl * fl;
      sum_xl += w * fl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        const float diff = this_scale * static_cast<float>(Laux[i]) + this_min - x[i];
        cur_error += weights[i] * (diff * diff);
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *the_min = -min;
  return scale;
}

// q4_K's and q5_K's common part (quantize_row_q{4,5}_K_ref): per sub-block of
// 32 a scale and a min by make_qkx2_quants (weights av_x + |x|), both
// quantized to 6 bits against the block's largest, written with d and dmin;
// then every weight's level 0..nmax again against the stored scales. Returns
// the levels in L[256].
inline void quantize_k_scales(const float* x, std::uint8_t* block, int nmax, float rmin, int nstep,
                              std::uint8_t* L) {
  float scales[8], mins[8], weights[32];
  float max_scale = 0, max_min = 0;  // the scales are positive: the min is subtracted
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(xs[l]);
    scales[j] = make_qkx2_quants(32, nmax, xs, weights, L + 32 * j, &mins[j], rmin, 0.1f, nstep);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  std::uint8_t* sc = block + 4;
  for (int j = 0; j < 8; ++j) {
    auto ls = static_cast<std::uint8_t>(nearest_int(inv_scale * scales[j]));  // modulo 256, as ggml's uint8_t
    auto lm = static_cast<std::uint8_t>(nearest_int(inv_min * mins[j]));
    if (ls > 63) ls = 63;
    if (lm > 63) lm = 63;
    if (j < 4) {
      sc[j] = ls;
      sc[j + 4] = lm;
    } else {
      sc[j + 4] = static_cast<std::uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      sc[j - 4] = static_cast<std::uint8_t>(sc[j - 4] | ((ls >> 4) << 6));
      sc[j] = static_cast<std::uint8_t>(sc[j] | ((lm >> 4) << 6));
    }
  }
  store_u16(block, F16::round(max_scale / 63.f));
  store_u16(block + 2, F16::round(max_min / 63.f));
  const float d = F16::widen(load_u16(block)), dmin = F16::widen(load_u16(block + 2));
  for (int j = 0; j < 8; ++j) {
    const ScaleMin sm = scale_min_k4(j, sc);
    const float dj = d * static_cast<float>(sm.scale);
    if (dj == 0) continue;  // keeps make_qkx2_quants' levels, as ggml does
    const float dm = dmin * static_cast<float>(sm.min);
    for (int i = 0; i < 32; ++i) {
      const int l = nearest_int((x[32 * j + i] + dm) / dj);
      L[32 * j + i] = static_cast<std::uint8_t>(l < nmax ? (l > 0 ? l : 0) : nmax);
    }
  }
}

}  // namespace quant_detail

// One block of 32 or 256 weights, as ggml's quantize_row_*_ref writes it.
// The input must be finite (quantize checks; this does not).
template <QuantFormat F>
inline void quantize_block(const float* x, std::uint8_t* block) {
  using namespace quant_detail;
  if constexpr (F == QuantFormat::q8_0) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = max_of(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0 ? 1.0f / d : 0.0f;
    store_u16(block, F16::round(d));
    for (int j = 0; j < 32; ++j) block[2 + j] = static_cast<std::uint8_t>(trunc_i8(std::round(x[j] * id)));
  } else if constexpr (F == QuantFormat::q4_0) {
    float amax = 0, max = 0;  // the largest magnitude, and its signed value (the first of equals)
    for (int j = 0; j < 32; ++j)
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    const float d = max / -8;  // the largest magnitude becomes level -8 (the sign follows it)
    const float id = d != 0 ? 1.0f / d : 0.0f;
    store_u16(block, F16::round(d));
    const auto level = [id](float v) -> std::uint8_t {
      const int l = trunc_i8(v * id + 8.5f);
      return static_cast<std::uint8_t>(15 < l ? 15 : l);  // ggml's MIN(15, (int8_t)...) into a uint8_t
    };
    for (int j = 0; j < 16; ++j)
      block[2 + j] = static_cast<std::uint8_t>(level(x[j]) | level(x[16 + j]) << 4);
  } else if constexpr (F == QuantFormat::q4_k) {
    std::uint8_t L[qk_k];
    quantize_k_scales(x, block, 15, -1.f, 20, L);
    std::uint8_t* q = block + 16;
    for (int g = 0; g < 4; ++g)
      for (int l = 0; l < 32; ++l) q[32 * g + l] = static_cast<std::uint8_t>(L[64 * g + l] | L[64 * g + 32 + l] << 4);
  } else if constexpr (F == QuantFormat::q5_k) {
    std::uint8_t L[qk_k];
    quantize_k_scales(x, block, 31, -0.5f, 15, L);
    std::uint8_t* qh = block + 16;
    std::uint8_t* ql = block + 48;
    for (int l = 0; l < 32; ++l) qh[l] = 0;
    for (int g = 0; g < 4; ++g)
      for (int l = 0; l < 32; ++l) {
        const int l1 = L[64 * g + l], l2 = L[64 * g + 32 + l];
        qh[l] = static_cast<std::uint8_t>(qh[l] | (l1 >> 4) << (2 * g) | (l2 >> 4) << (2 * g + 1));
        ql[32 * g + l] = static_cast<std::uint8_t>((l1 & 0xF) | (l2 & 0xF) << 4);
      }
  } else {
    static_assert(F == QuantFormat::q6_k);
    std::int8_t L[qk_k];
    float scales[16];
    float max_scale = 0, max_abs_scale = 0;
    for (int ib = 0; ib < 16; ++ib) {
      const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
      scales[ib] = scale;
      const float abs_scale = std::fabs(scale);
      if (abs_scale > max_abs_scale) {
        max_abs_scale = abs_scale;
        max_scale = scale;
      }
    }
    if (max_abs_scale < 1e-15f) {  // GROUP_MAX_EPS: an all-zero block (d = +0)
      std::memset(block, 0, 210);
      return;
    }
    std::uint8_t* ql = block;
    std::uint8_t* qh = block + 128;
    std::uint8_t* sc = block + 192;
    const float iscale = -128.f / max_scale;
    store_u16(block + 208, F16::round(1 / iscale));
    for (int ib = 0; ib < 16; ++ib) {
      const int l = nearest_int(iscale * scales[ib]);
      sc[ib] = static_cast<std::uint8_t>(static_cast<std::int8_t>(l < 127 ? l : 127));
    }
    const float d = F16::widen(load_u16(block + 208));
    for (int j = 0; j < 16; ++j) {
      const float dj = d * static_cast<float>(static_cast<std::int8_t>(sc[j]));
      if (dj == 0) continue;  // keeps make_qx_quants' levels, as ggml does
      for (int i = 0; i < 16; ++i) {
        const int l = nearest_int(x[16 * j + i] / dj);
        L[16 * j + i] = static_cast<std::int8_t>((l < 31 ? (l > -32 ? l : -32) : 31) + 32);
      }
    }
    for (int h = 0; h < 2; ++h)
      for (int l = 0; l < 32; ++l) {
        const std::int8_t* Lh = L + 128 * h;
        ql[64 * h + l] = static_cast<std::uint8_t>((Lh[l] & 0xF) | (Lh[l + 64] & 0xF) << 4);
        ql[64 * h + 32 + l] = static_cast<std::uint8_t>((Lh[l + 32] & 0xF) | (Lh[l + 96] & 0xF) << 4);
        qh[32 * h + l] =
            static_cast<std::uint8_t>((Lh[l] >> 4) | (Lh[l + 32] >> 4) << 2 | (Lh[l + 64] >> 4) << 4 | (Lh[l + 96] >> 4) << 6);
      }
  }
}

// n weights (a multiple of the block size, all finite; else
// std::invalid_argument) into quant_bytes(f, n) bytes, block after block.
inline void quantize(QuantFormat f, const float* in, std::uint8_t* blocks, std::size_t n) {
  const QuantInfo q = quant_info(f);
  quant_check(f, n, "grad::quantize");
  if (n != 0 && (in == nullptr || blocks == nullptr))
    throw std::invalid_argument("grad::quantize: " + std::string(q.name) + ": null pointer for " + std::to_string(n) +
                                " elements");
  for (std::size_t i = 0; i < n; ++i)
    if (!std::isfinite(in[i]))
      throw std::invalid_argument("grad::quantize: " + std::string(q.name) + ": element " + std::to_string(i) + " is " +
                                  (std::isnan(in[i]) ? "nan" : in[i] > 0 ? "inf" : "-inf") +
                                  " (expected finite values: ggml's quantizers are undefined on them)");
  const std::size_t nb = n / q.block_elements;
  for (std::size_t b = 0; b < nb; ++b) {
    const float* x = in + b * q.block_elements;
    std::uint8_t* y = blocks + b * q.block_bytes;
    switch (f) {
      case QuantFormat::q8_0: quantize_block<QuantFormat::q8_0>(x, y); break;
      case QuantFormat::q4_0: quantize_block<QuantFormat::q4_0>(x, y); break;
      case QuantFormat::q4_k: quantize_block<QuantFormat::q4_k>(x, y); break;
      case QuantFormat::q5_k: quantize_block<QuantFormat::q5_k>(x, y); break;
      case QuantFormat::q6_k: quantize_block<QuantFormat::q6_k>(x, y); break;
    }
  }
}

}  // namespace grad

#if defined(__clang__)
#pragma float_control(pop)
#elif defined(__GNUC__)
#pragma GCC pop_options
#endif
