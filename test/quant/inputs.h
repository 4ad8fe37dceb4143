/* The inputs behind the fixtures in test/quant/, recomputed by test_quant.cpp and by the
 * oracle that wrote the fixtures (make_fixtures.c): plain C, integer
 * arithmetic and IEEE + - * on floats only (no libm), so both compute the
 * same bits. Every product that an addition takes is exact (a power of two
 * times a float, or an integer times 2^-24), so even a compiler that fuses
 * a*b+c (test_quant_fma) computes the same inputs. */
#ifndef GRAD_TEST_QUANT_INPUTS_H
#define GRAD_TEST_QUANT_INPUTS_H

#include <stdint.h>
#include <string.h>

/* splitmix64 */
static inline uint64_t quant_rng_next(uint64_t* s) {
  uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
  z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
  z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
  return z ^ (z >> 31);
}
/* [0, 1) in steps of 2^-24: exact */
static inline float quant_uniform(uint64_t* s) { return (float)(quant_rng_next(s) >> 40) * 0x1p-24f; }
/* Irwin-Hall: twelve uniforms less 6, summed left to right (mean 0, variance 1) */
static inline float quant_gauss(uint64_t* s) {
  float sum = 0.0f;
  for (int k = 0; k < 12; ++k) sum += quant_uniform(s);
  return sum - 6.0f;
}
/* 2^e for -149 <= e <= 127, exactly */
static inline float quant_pow2(int e) {
  float p = 1.0f;
  for (; e > 0; --e) p *= 2.0f;
  for (; e < 0; ++e) p *= 0.5f;
  return p;
}

enum { quant_kinds = 14 };
static const char* const quant_kind_names[quant_kinds] = {
    "gaussian",  "uniform",   "zero",    "tiny",     "huge",   "constant",         "outliers",
    "negative",  "positive",  "mixture", "ties",     "subnormal", "sparse", "wide-range"};

/* Block b's n inputs (n = 32 or 256) for a format whose blocks hold n: the
 * kind is b % quant_kinds, the scale varies with b / quant_kinds. */
static inline void quant_block_inputs(uint32_t n, uint32_t b, float* x) {
  uint64_t s = UINT64_C(0x5151AB1E) ^ ((uint64_t)n << 32) ^ (uint64_t)b * UINT64_C(0x2545F4914F6CDD1D);
  const int kind = (int)(b % quant_kinds);
  const int rep = (int)(b / quant_kinds);
  const float scale = quant_pow2(rep % 9 - 4) * (1.0f + 0.25f * (float)(rep % 3)); /* 2^-4 .. 2^4 */
  uint32_t i;
  for (i = 0; i < n; ++i) {
    const float g = quant_gauss(&s);
    const float u = quant_uniform(&s);
    float v = 0.0f;
    switch (kind) {
      case 0: v = scale * g; break;
      case 1: v = scale * (2.0f * u - 1.0f); break;
      case 2: v = (rep & 1) ? -0.0f : 0.0f; break;
      case 3: v = g * 1e-6f * scale; break;          /* scales below half's range: d rounds to 0 or a subnormal half */
      case 4: v = g * 2000.0f * scale; break;        /* up to ~3e5: large scales, still finite halves */
      case 5: v = (rep & 1) ? -scale * 0.7f : scale * 1.3f; break;
      case 6: v = u < 0.04f ? (u < 0.02f ? 50.0f : -80.0f) * scale : 0.01f * scale * g; break;
      case 7: v = -(scale * ((g < 0 ? -g : g) + 0.5f)); break;
      case 8: v = scale * ((g < 0 ? -g : g) + 2.0f); break;
      case 9: v = scale * (g * quant_pow2((int)(i / 32) % 8 - 4) + ((i / 16) % 3 == 0 ? 1.0f : 0.0f)); break;
      case 10: v = 0.5f * (float)((int)(u * 33.0f) - 16) * scale; break; /* halves of integers: rounding ties */
      case 11: v = g * quant_pow2(-140 + rep % 8); break;               /* subnormal and near-subnormal floats */
      case 12: v = u < 0.1f ? scale * g * 4.0f : 0.0f; break;
      default: v = g * quant_pow2((int)(quant_rng_next(&s) % 35) - 20); break; /* 2^-20 .. 2^14 per weight */
    }
    x[i] = v;
  }
}

/* A block of arbitrary bytes (for dequantization alone) with finite scales:
 * the halves' exponents are kept below 31 (no infinity or NaN). */
static inline void quant_random_block(uint32_t block_bytes, uint32_t b, uint8_t* y) {
  uint64_t s = UINT64_C(0xB10CB10C) ^ ((uint64_t)block_bytes << 32) ^ (uint64_t)b * UINT64_C(0x9E3779B97F4A7C15);
  uint32_t i;
  for (i = 0; i < block_bytes; ++i) y[i] = (uint8_t)(quant_rng_next(&s) >> 56);
  /* the half fields: d at 0 (q8_0, q4_0), d and dmin at 0 and 2 (q4_K, q5_K), d at 208 (q6_K) */
  if (block_bytes == 210) {
    y[209] &= 0xFB;
  } else {
    y[1] &= 0xFB;
    if (block_bytes > 34) y[3] &= 0xFB;
  }
}

/* FNV-1a over floats' bits, each as four little-endian bytes */
static inline uint64_t quant_hash_floats(const float* v, uint32_t n) {
  uint64_t h = UINT64_C(0xCBF29CE484222325);
  uint32_t i;
  int k;
  for (i = 0; i < n; ++i) {
    uint32_t u;
    memcpy(&u, &v[i], 4);
    for (k = 0; k < 4; ++k) {
      h ^= (u >> (8 * k)) & 0xFFu;
      h *= UINT64_C(0x100000001B3);
    }
  }
  return h;
}

#endif
