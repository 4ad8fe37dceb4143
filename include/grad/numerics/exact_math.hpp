// exp, tanh, sigmoid and log written with + - * / and explicit fused
// multiply-adds only, so that they round the same way on every backend: host
// code is built with -ffp-contract=off and device code with --fmad=false, IEEE
// + - * / are correctly rounded on both, and so is an fma (fma_hd: a vfmadd in
// the AVX2 / AVX-512 copies, __fma_rn on CUDA, libm's correctly rounded fma
// elsewhere). The polynomials' steps and the final correction terms are those
// fmas, written where they stand. No libm transcendental, no lookup table, no
// branch on data (bit-mask blends), so a GPU thread and a vector lane compute
// the very same bits. This is what moves exp, tanh, sigmoid and log into the
// exact tier.
//
// Every function is written once for T = float or double and for
// simd::Pack<T, Bytes> (grad/numerics/simd.hpp): the host loops run them on whole
// vectors explicitly, so their speed does not depend on whether the
// consumer's -O level lets the auto-vectoriser in. A pack's lanes do the
// scalar operations in the scalar order: the same bits.
//
// Accuracy, float and double, over the whole domain (test_transcendental.cpp
// measures it against long double libm): under 0.8 ulp for exp, 0.9 for tanh
// and log, 1.2 for sigmoid, including subnormal inputs and results, overflow
// to inf, underflow to 0 and tanh's saturation to exactly +-1.
//
// The polynomial coefficients are relative-error minimax fits computed by a
// Remez exchange at 60 digits (mpmath), rounded to the target type.
#pragma once

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "grad/config.hpp"
#include "grad/numerics/isa.hpp"
#include "grad/numerics/simd.hpp"

GRAD_SIMD_DIAGNOSTICS_BEGIN

namespace grad {

// float, double, or a simd::Pack of either.
template <class T>
concept ScalarOrPack = Scalar<simd::element_t<T>>;

namespace exact_math_detail {

// x^M for M a power of two, by repeated squaring.
template <std::size_t M, class T>
GRAD_HD GRAD_INLINE constexpr T power(T x) {
  if constexpr (M == 1) {
    return x;
  } else {
    const T h = power<M / 2>(x);
    return h * h;
  }
}

// c[0] + c[1] x + ... + c[N-1] x^(N-1) by Estrin's scheme: x^m times the
// high half plus the low half, recursively, each step one fma (a single
// rounding: fma_hd on a T, simd::fma_hd on a pack, found by argument-dependent
// lookup). The order is fixed here, so every backend rounds alike; its
// dependency chain is O(log N) long instead of Horner's N, which is what
// bounds a vectorised loop of these.
template <std::size_t N, class T, class C>
GRAD_HD GRAD_INLINE inline T estrin(T x, const C* c) {
  if constexpr (N == 1) {
    return T(c[0]);
  } else {
    constexpr std::size_t m = std::bit_floor(N - 1);
    return fma_hd(power<m>(x), estrin<N - m>(x, c + m), estrin<m>(x, c));
  }
}

template <class T>
struct Format;

template <>
struct Format<double> {
  using Bits = std::uint64_t;
  static constexpr int mantissa_bits = 52;
  static constexpr Bits exponent_bias = 1023;
  static constexpr Bits sign_mask = Bits{1} << 63;
  static constexpr int sign_shift = 63;  // bits >> sign_shift is the sign bit
  // Adding 1.5 * 2^52 rounds any |v| < 2^51 to an integer (round to nearest
  // even), and that integer sits in the low mantissa bits of the sum.
  static constexpr double round_magic = 0x1.8p52;
  // exp overflows above ln(DBL_MAX) ~ 709.78 and is below half the smallest
  // subnormal under -745.13: clamping |x| to just beyond keeps each half of
  // 2^n a normal number while the result still rounds to inf or 0.
  static constexpr double exp_limit = 746.0;
  static constexpr double log2e = 0x1.71547652b82fep+0;
  // ln 2 split for Cody-Waite reduction: ln2_hi has 42 significant bits, so
  // n * ln2_hi is exact for |n| < 2^11 and x - n * ln2_hi is exact (Sterbenz).
  static constexpr double ln2_hi = 0x1.62e42fefa3800p-1;
  static constexpr double ln2_lo = 0x1.ef35793c76730p-45;
  // tanh uses its odd series below this, 1 - 2/(e^2|x| + 1) above it.
  static constexpr double tanh_split = 0.625;
  // 2 / (e^40 + 1) < 2^-54: tanh rounds to 1 from well below here.
  static constexpr double tanh_saturated = 20.0;
  // log: subnormal inputs are first scaled into the normal range.
  static constexpr double subnormal_scale = 0x1p54, subnormal_scale_log2 = 54.0;
  static constexpr double sqrt2 = 0x1.6a09e667f3bcdp+0;
};

template <>
struct Format<float> {
  using Bits = std::uint32_t;
  static constexpr int mantissa_bits = 23;
  static constexpr Bits exponent_bias = 127;
  static constexpr Bits sign_mask = Bits{1} << 31;
  static constexpr int sign_shift = 31;
  static constexpr float round_magic = 0x1.8p23f;
  // ln(FLT_MAX) ~ 88.72; half the smallest subnormal is e^-103.97.
  static constexpr float exp_limit = 104.0f;
  static constexpr float log2e = 0x1.715476p+0f;
  // 15 significant bits: n * ln2_hi exact for |n| < 2^9.
  static constexpr float ln2_hi = 0x1.62e4p-1f;
  static constexpr float ln2_lo = 0x1.7f7d1cp-20f;
  static constexpr float tanh_split = 0.625f;
  static constexpr float tanh_saturated = 20.0f;
  static constexpr float subnormal_scale = 0x1p25f, subnormal_scale_log2 = 25.0f;
  static constexpr float sqrt2 = 0x1.6a09e6p+0f;
};

#if GRAD_SIMD
// A pack's format: its lane type's constants, its bits a pack of unsigned lanes.
template <class T, std::size_t B>
struct Format<simd::Pack<T, B>> : Format<T> {
  using Bits = simd::Pack<typename Format<T>::Bits, B>;
};
#endif

template <class T>
GRAD_HD GRAD_INLINE constexpr typename Format<T>::Bits to_bits(T x) {
  return std::bit_cast<typename Format<T>::Bits>(x);
}
template <class T>
GRAD_HD GRAD_INLINE constexpr T from_bits(typename Format<T>::Bits b) {
  return std::bit_cast<T>(b);
}

// Selections are bit blends under all-ones/all-zero masks computed without a
// comparison. A ?: would let GCC sink work that one arm alone uses into a
// branch (then not vectorisable: division may trap) or thread branches through
// the constant arm; and SSE2 has no 64-bit select to turn a bool into a mask.
template <class T>
GRAD_HD GRAD_INLINE constexpr T blend(typename Format<T>::Bits mask, T if_set, T if_clear) {
  return from_bits<T>((to_bits<T>(if_set) & mask) | (to_bits<T>(if_clear) & ~mask));
}

// |x| (NaN stays NaN), and magnitude m with x's sign bit.
template <class T>
GRAD_HD GRAD_INLINE constexpr T magnitude_of(T x) {
  return from_bits<T>(to_bits<T>(x) & ~Format<T>::sign_mask);
}
template <class T>
GRAD_HD GRAD_INLINE constexpr T with_sign_of(T m, T x) {
  return from_bits<T>(to_bits<T>(m) | (to_bits<T>(x) & Format<T>::sign_mask));
}

// All ones where a < b, for a, b not NaN: the sign of a - b is exact.
template <class T>
GRAD_HD GRAD_INLINE constexpr typename Format<T>::Bits less_mask(T a, T b) {
  using Bits = typename Format<T>::Bits;
  return Bits(0) - (to_bits<T>(a - b) >> Format<T>::sign_shift);
}

// All ones where x is NaN: |x|'s bits exceed those of inf, so inf - |x| wraps.
template <class T>
GRAD_HD GRAD_INLINE constexpr typename Format<T>::Bits nan_mask(T x) {
  using Bits = typename Format<T>::Bits;
  using LaneBits = typename Format<simd::element_t<T>>::Bits;
  constexpr LaneBits inf = LaneBits(LaneBits(2) * Format<T>::exponent_bias + 1) << Format<T>::mantissa_bits;
  return Bits(0) - (Bits(inf - (to_bits<T>(x) & ~Format<T>::sign_mask)) >> Format<T>::sign_shift);
}

// min(x, limit) that keeps NaN, as one minpd/minps. Only where the result
// is never the constant limit itself (exact_exp puts x's sign back on it):
// GCC would fold everything downstream of a constant arm, sink the rest into
// a branch and give up vectorising; elsewhere clamps are blends.
template <class T>
GRAD_HD GRAD_INLINE constexpr T at_most(T x, T limit) {
  if constexpr (simd::is_pack<T>)
    return simd::at_most(x, limit);
  else
    return limit < x ? limit : x;
}

// Nearest integer to v (ties to even) for |v| < 2^(mantissa_bits - 1), as a T.
template <class T>
GRAD_HD GRAD_INLINE constexpr T round_to_integer(T v) {
  return (v + Format<T>::round_magic) - Format<T>::round_magic;
}

// 2^k for an integer-valued k within the normal exponent range, built in the
// exponent field: (k + magic) carries k in its low bits, the shift drops the
// rest, and adding the bias in the exponent field makes it a power of two.
template <class T>
GRAD_HD GRAD_INLINE constexpr T pow2(T k) {
  using F = Format<T>;
  const typename F::Bits low = to_bits<T>(k + F::round_magic);
  return from_bits<T>(
      static_cast<typename F::Bits>((low << F::mantissa_bits) + (F::exponent_bias << F::mantissa_bits)));
}

// (e^r - 1 - r) / r^2 on |r| <= ln2/2: relative error 2^-58 (double), 2^-28 (float).
template <class T>
GRAD_HD GRAD_INLINE inline T exp_tail(T r) {
  if constexpr (std::is_same_v<simd::element_t<T>, double>) {
    const double c[] = {0x1.0000000000000p-1,  0x1.5555555555557p-3,  0x1.555555555554ep-5,  0x1.11111111100ebp-7,
                        0x1.6c16c16c1a07fp-10, 0x1.a01a01abe0ceap-13, 0x1.a01a01905fb43p-16, 0x1.71de024587b95p-19,
                        0x1.27e510dcf7816p-22, 0x1.af4dc495d3ce5p-26, 0x1.1f19f611f2d8bp-29};
    return estrin<11>(r, c);
  } else {
    const float c[] = {0x1.0p-1f, 0x1.555556p-3f, 0x1.5554eap-5f, 0x1.11114cp-7f, 0x1.6d42dap-10f, 0x1.a072c4p-13f};
    return estrin<6>(r, c);
  }
}

// (tanh(x)/x - 1) / x^2 as a function of z = x^2 on [0, 0.625^2]: relative
// error 2^-56 (double), 2^-27 (float).
template <class T>
GRAD_HD GRAD_INLINE inline T tanh_tail(T z) {
  if constexpr (std::is_same_v<simd::element_t<T>, double>) {
    const double c[] = {-0x1.5555555555555p-2,  0x1.11111111110a8p-3,  -0x1.ba1ba1ba0f149p-5,  0x1.664f487e0b227p-6,
                        -0x1.226e3473f8991p-7,  0x1.d6d39ae8b74e8p-9,  -0x1.7d9f6f7067b06p-10, 0x1.3526ecc6fea05p-11,
                        -0x1.f243a52cba6fdp-13, 0x1.84460c0e349b5p-14, -0x1.05bcf90ea952fp-15, 0x1.b33a6a4342501p-18};
    return estrin<12>(z, c);
  } else {
    const float c[] = {-0x1.555556p-2f, 0x1.1110eap-3f,  -0x1.ba08c8p-5f,
                       0x1.64a996p-6f,  -0x1.116acap-7f, 0x1.2c869ep-9f};
    return estrin<6>(z, c);
  }
}

// e^x = 2^n (hi + lo), hi being e^x / 2^n rounded and lo (nearly) its
// rounding error: x = n ln2 + r with |r| <= ln2/2 and e^r = 1 + r + r^2 q(r).
// The rounding error of 1 + r_hi is recovered exactly and folded into the
// small terms before the one rounding that makes hi. x must lie within
// [-exp_limit, exp_limit] or be NaN (giving NaN in hi).
template <class T>
struct ExpParts {
  T n, hi, lo;
};

template <class T>
GRAD_HD GRAD_INLINE inline ExpParts<T> exp_parts(T x) {
  using F = Format<T>;
  const T n = round_to_integer<T>(x * F::log2e);
  const T r_hi = x - n * F::ln2_hi;  // exact
  const T r_lo = n * F::ln2_lo;
  const T r = r_hi - r_lo;
  const T tail = (r * r) * exp_tail<T>(r);
  const T head = T(1) + r_hi;
  // Both error terms below are exact (Fast2Sum: the first operand is the larger).
  const T small = ((T(1) - head) + r_hi) + (tail - r_lo);
  const T hi = head + small;
  return {n, hi, (head - hi) + small};
}

// e^x = hi + lo for |x| <= exp_limit (or NaN). 2^n is applied as two
// factors, each a normal number, so that overflow gives inf and subnormal
// results round once, at the last multiplication.
template <class T>
struct SplitExp {
  T hi, lo;
};

template <class T>
GRAD_HD GRAD_INLINE inline SplitExp<T> split_exp(T x) {
  const ExpParts<T> e = exp_parts<T>(x);
  const T n_half = round_to_integer<T>(e.n * T(0.5));
  const T scale_a = pow2<T>(n_half), scale_b = pow2<T>(e.n - n_half);
  return {(e.hi * scale_a) * scale_b, (e.lo * scale_a) * scale_b};
}

// (2 atanh(s) / s - 2) / s^2 as a function of z = s^2 on [0, 0.1716^2]:
// relative error 2^-51 (double), 2^-21 (float); it enters log scaled by s^3.
template <class T>
GRAD_HD GRAD_INLINE inline T log_tail(T z) {
  if constexpr (std::is_same_v<simd::element_t<T>, double>) {
    const double c[] = {0x1.5555555555558p-1, 0x1.9999999995290p-2, 0x1.2492492df97bap-2, 0x1.c71c62dbdc1d9p-3,
                        0x1.7462b739ffa32p-3, 0x1.39fe106dc50e4p-3, 0x1.2b5bf2ff5647ap-3};
    return estrin<7>(z, c);
  } else {
    const float c[] = {0x1.55555cp-1f, 0x1.997c22p-2f, 0x1.2ee814p-2f};
    return estrin<3>(z, c);
  }
}

}  // namespace exact_math_detail

// e^x. |x| is clamped (sign kept) to where e^x has long overflowed or
// underflowed; NaN passes the clamp and every operation after it.
template <ScalarOrPack T>
GRAD_HD GRAD_INLINE inline T exact_exp(T x) {
  using namespace exact_math_detail;
  return split_exp<T>(with_sign_of<T>(at_most<T>(magnitude_of<T>(x), Format<T>::exp_limit), x)).hi;
}

namespace exact_math_detail {

// tanh's two arms for a = |x|, and how their results are put together.
// Small a: a + a * (a^2 * t(a^2)), the last step one fma.
template <class T>
GRAD_HD GRAD_INLINE inline T tanh_near(T a) {
  const T z = a * a;
  return fma_hd(a, z * tanh_tail<T>(z), a);
}

// Otherwise 1 - d with d = 2 / (E + 1), E = e^2a = hi + lo: E + 1 and 1 - d
// are formed with their rounding errors kept (Fast2Sum) and d is corrected
// to first order, so that only the roundings of 2 / (E + 1) and of the
// result remain. a is capped where 1 - d has long rounded to 1, so that E
// stays finite.
template <class T>
GRAD_HD GRAD_INLINE inline T tanh_far(T a) {
  using F = Format<T>;
  const T a_far = blend<T>(less_mask<T>(F::tanh_saturated, a), F::tanh_saturated, a);
  const ExpParts<T> e = exp_parts<T>(a_far + a_far);  // n <= 58: one exact scaling
  const T scale = pow2<T>(e.n);
  const T hi = e.hi * scale;
  const T s = hi + T(1);
  const T s_low = ((hi - s) + T(1)) + e.lo * scale;  // exact part: hi >= 1 here
  const T q = T(2) / s;
  const T w = T(1) - q;
  // d = 2 / (s + s_low) ~ q - q * s_low / s, and 1 / s ~ q / 2 is plenty for
  // a term this small (one division fewer).
  return w + fma_hd(q, s_low * (q * T(0.5)), (T(1) - w) - q);  // (1 - w) - q: exact
}

// All ones where a takes the near arm.
template <class T>
GRAD_HD GRAD_INLINE constexpr typename Format<T>::Bits tanh_near_mask(T a) {
  return less_mask<T>(a, Format<T>::tanh_split);
}

// x's sign on the magnitude; NaN x gives NaN (whatever the magnitude was).
template <class T>
GRAD_HD GRAD_INLINE constexpr T tanh_finish(T x, T magnitude) {
  return blend<T>(nan_mask<T>(x), x + x, with_sign_of<T>(magnitude, x));
}

}  // namespace exact_math_detail

// tanh(x), odd: the near arm below tanh_split, the far arm from there on,
// both computed and one kept by a bit blend (a GPU thread and a vector lane
// alike). For NaN x the mask is arbitrary: the result is replaced.
template <ScalarOrPack T>
GRAD_HD GRAD_INLINE inline T exact_tanh(T x) {
  using namespace exact_math_detail;
  const T a = magnitude_of(x);
  return tanh_finish<T>(x, blend<T>(tanh_near_mask<T>(a), tanh_near<T>(a), tanh_far<T>(a)));
}

// y[i] = exact_tanh(x[i]) for a whole array, host only: in blocks of 16,
// a block whose elements all take one arm computes that arm alone. Each
// element still comes out of the very operations exact_tanh does, so the
// bits are the same; only work whose result the blend would discard is
// skipped (most activations of a trained network sit in one arm).
// P is the pack the loop runs on (a simd::Pack, or T itself: one lane).
template <class P, Scalar T>
[[gnu::always_inline]] inline void exact_tanh_packs(const T* __restrict x, T* __restrict y, std::size_t n) {
  using namespace exact_math_detail;
  constexpr std::size_t block = 16;
  constexpr std::size_t lanes = sizeof(P) / sizeof(T), packs = block / lanes;
  static_assert(block % lanes == 0, "a block is whole packs");
  auto load = [](const T* p) {
    if constexpr (simd::is_pack<P>)
      return P::load(p);
    else
      return *p;
  };
  auto store = [](const P& v, T* p) {
    if constexpr (simd::is_pack<P>)
      v.store(p);
    else
      *p = v;
  };
  std::size_t i = 0;
  for (; i + block <= n; i += block) {
    // Which arm each element takes: |x| >= split is far; NaN counts as near
    // (its result is replaced whichever arm ran). Agrees with tanh_near_mask
    // on every non-NaN input.
    bool any_far = false, all_far = true;
    GRAD_UNROLL_ALL
    for (std::size_t k = 0; k < packs; ++k) {
      const P a = magnitude_of<P>(load(x + i + k * lanes));
      if constexpr (simd::is_pack<P>) {
        any_far |= simd::any_at_least(a, T(Format<T>::tanh_split));
        all_far &= simd::all_at_least(a, T(Format<T>::tanh_split));
      } else {
        const bool far = a >= Format<T>::tanh_split;
        any_far |= far;
        all_far &= far;
      }
    }
    if (!any_far) {
      GRAD_UNROLL_ALL
      for (std::size_t k = 0; k < packs; ++k) {
        const P v = load(x + i + k * lanes);
        store(tanh_finish<P>(v, tanh_near<P>(magnitude_of<P>(v))), y + i + k * lanes);
      }
    } else if (all_far) {
      GRAD_UNROLL_ALL
      for (std::size_t k = 0; k < packs; ++k) {
        const P v = load(x + i + k * lanes);
        store(tanh_finish<P>(v, tanh_far<P>(magnitude_of<P>(v))), y + i + k * lanes);
      }
    } else {
      GRAD_UNROLL_ALL
      for (std::size_t k = 0; k < packs; ++k) store(exact_tanh<P>(load(x + i + k * lanes)), y + i + k * lanes);
    }
  }
  for (; i < n; ++i) y[i] = exact_tanh(x[i]);
}

// The same for any caller: runs on the widest packs this CPU has.
template <Scalar T>
inline void exact_tanh_array(const T* __restrict x, T* __restrict y, std::size_t n) {
#if GRAD_SIMD
  with_best_isa([&](auto width) { exact_tanh_packs<simd::Pack<T, decltype(width)::bytes>>(x, y, n); });
#else
  exact_tanh_packs<T>(x, y, n);
#endif
}

// 1 / (1 + e^-x), written with e = e^-|x| in (0, 1] as 1 / (1 + e) for x >= 0
// and e / (1 + e) for x < 0, so that the left tail follows e^x down into the
// subnormals instead of hitting 0 where e^-x overflows. 1 + e keeps its
// rounding error and e its low part; the quotient is corrected to first order.
template <ScalarOrPack T>
GRAD_HD GRAD_INLINE inline T exact_sigmoid(T x) {
  using namespace exact_math_detail;
  using Bits = typename Format<T>::Bits;
  const T magnitude = magnitude_of<T>(x);
  const SplitExp<T> e =
      split_exp<T>(-blend<T>(less_mask<T>(Format<T>::exp_limit, magnitude), Format<T>::exp_limit, magnitude));
  const Bits negative = Bits(0) - (to_bits<T>(x) >> Format<T>::sign_shift);
  const T num = blend<T>(negative, e.hi, T(1));
  const T num_low = blend<T>(negative, e.lo, T(0));
  const T den = T(1) + e.hi;
  const T den_low = ((T(1) - den) + e.hi) + e.lo;  // exact part: e.hi <= 1
  const T q = num / den;
  // The correction divides by den; 1 / den is q itself for x >= 0 and
  // 1 - q for x < 0 (1/(1+e) = 1 - e/(1+e)), close enough for a term this small.
  const T inv_den = blend<T>(negative, T(1) - q, q);
  return blend<T>(nan_mask<T>(x), x + x, fma_hd(fma_hd(-q, den_low, num_low), inv_den, q));
}

// ln x. x = 2^k m with m in [sqrt(1/2), sqrt(2)), read off the bits (after
// scaling a subnormal x up); f = m - 1 is exact, and with s = f / (2 + f),
// ln(1 + f) = 2 atanh(s) = f - (f^2/2 - s (f^2/2 + R(s^2))), where the large
// terms are formed from f directly and only R is approximated. k ln2 is
// added in two parts, the high one exactly.
template <ScalarOrPack T>
GRAD_HD GRAD_INLINE inline T exact_log(T x) {
  using namespace exact_math_detail;
  using F = Format<T>;
  using Bits = typename F::Bits;
  using E = simd::element_t<T>;
  using LaneBits = typename Format<E>::Bits;  // constants are lane values; packs broadcast them
  constexpr LaneBits one_bits = F::exponent_bias << F::mantissa_bits;
  constexpr LaneBits mantissa_mask = (LaneBits(1) << F::mantissa_bits) - 1;
  constexpr LaneBits inf_bits = (2 * F::exponent_bias + 1) << F::mantissa_bits;
  constexpr E smallest_normal = from_bits<E>(LaneBits(1) << F::mantissa_bits);

  const Bits tiny = less_mask<T>(x, smallest_normal);
  const T scaled = blend<T>(tiny, x * F::subnormal_scale, x);
  const Bits bits = to_bits<T>(scaled);
  // The biased exponent as a T, through the same magic as round_to_integer.
  const T biased = from_bits<T>(to_bits<T>(T(F::round_magic)) + (bits >> F::mantissa_bits)) - F::round_magic;
  const T m1 = from_bits<T>((bits & mantissa_mask) | one_bits);  // in [1, 2)
  const Bits halve = less_mask<T>(F::sqrt2, m1);
  const T m = blend<T>(halve, m1 * T(0.5), m1);
  const T k =
      (biased - T(F::exponent_bias)) + blend<T>(halve, T(1), T(0)) - blend<T>(tiny, F::subnormal_scale_log2, T(0));

  const T f = m - T(1);  // exact
  const T s = f / (T(2) + f);
  const T z = s * s;
  const T half_f2 = T(0.5) * (f * f);
  const T r = z * log_tail<T>(z);
  const T y = k * F::ln2_hi + (f - (half_f2 - fma_hd(s, half_f2 + r, k * F::ln2_lo)));

  // ln(+inf) = inf and NaN stays NaN (x + x); negative x gives NaN; ln(+-0) = -inf.
  const Bits magnitude = to_bits<T>(x) & ~F::sign_mask;
  const Bits inf_or_nan = Bits(0) - (Bits(inf_bits - 1 - magnitude) >> F::sign_shift);
  const Bits zero = Bits(0) - (Bits(magnitude - 1) >> F::sign_shift);
  const Bits negative = (Bits(0) - (to_bits<T>(x) >> F::sign_shift)) & ~zero;
  T out = blend<T>(inf_or_nan, x + x, y);
  out = blend<T>(negative, from_bits<E>(inf_bits | (LaneBits(1) << (F::mantissa_bits - 1))), out);
  return blend<T>(zero, from_bits<E>(inf_bits | F::sign_mask), out);
}

}  // namespace grad

GRAD_SIMD_DIAGNOSTICS_END
