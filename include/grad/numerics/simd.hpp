// The small portable vector layer the host loops are written in, so that
// their speed does not depend on the auto-vectoriser (GCC 12 at -O2 declines
// every loop whose trip count is not a known multiple of the vector width,
// and -O1 vectorises nothing): a Pack<T, Bytes> is Bytes / sizeof(T) lanes
// of T, each lane doing exactly the IEEE operation a scalar would, so a loop
// over packs gives every element the bits of the scalar loop.
//
// Why GCC/Clang vector extensions rather than a SIMD library: the vector
// types are the ones gemm.hpp already uses; they need no dependency (Debian's
// xsimd and Highway would be one more package for every consumer, and both
// fix the vector width at compile time from -m flags, while grad picks it at
// run time: with_best_isa hands the body the width of the copy it runs in);
// and a function compiled for AVX-512 through a target attribute can use
// 64-byte packs while the rest of the program stays at the x86-64 baseline.
//
// Packs only ever live inside loops that with_best_isa flattens into one
// function per instruction set, so no call passes one by value between
// functions built for different instruction sets (what -Wpsabi warns about).
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "grad/config.hpp"  // fma_hd

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__clang__) && defined(__OPTIMIZE__)
#include <immintrin.h>  // declares the sqrt builtins used below
#define GRAD_SIMD_X86_SQRT 1
#else
#define GRAD_SIMD_X86_SQRT 0
#endif

// Vector code is host code: nvcc's device pass and other compilers take the
// scalar loops (same bits).
#if defined(__GNUC__) && !defined(__CUDACC__)
#define GRAD_SIMD 1
#else
#define GRAD_SIMD 0
#endif

#if defined(__GNUC__) && !defined(__clang__)
#define GRAD_SIMD_DIAGNOSTICS_BEGIN _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wpsabi\"")
#define GRAD_SIMD_DIAGNOSTICS_END _Pragma("GCC diagnostic pop")
#else
#define GRAD_SIMD_DIAGNOSTICS_BEGIN
#define GRAD_SIMD_DIAGNOSTICS_END
#endif

// Functions that take packs are always inlined into the with_best_isa copy
// that calls them: a pack never crosses a call (no ABI question, no
// out-of-line copy compiled for the wrong instruction set), at any -O level.
#if GRAD_SIMD
#define GRAD_INLINE __attribute__((always_inline))
#else
#define GRAD_INLINE
#endif

// Full unrolling of short constant-trip loops over packs, which -O2 would
// keep as loops (it only peels loops that do not grow the code).
#if defined(__GNUC__) && !defined(__clang__) && !defined(__CUDACC__)
#define GRAD_UNROLL_ALL _Pragma("GCC unroll 16")
#else
#define GRAD_UNROLL_ALL
#endif

GRAD_SIMD_DIAGNOSTICS_BEGIN

namespace grad::simd {

// Every lane a, exactly (no arithmetic: 0 + a would turn -0 into +0). On
// x86 the 64- and 32-byte vectors use the broadcast builtins (expanded in
// the AVX-512 / AVX2 copy they are inlined into, where an fma then reads
// the scalar with an embedded broadcast): a generic vector expression here
// is lowered before inlining, for the baseline's 16-byte registers, and
// builds the vector through the stack (ten times slower in gemm).
template <class V, class T>
GRAD_INLINE inline V splat(T a) {
#if GRAD_SIMD_X86_SQRT && GRAD_SIMD
  typedef T T16 __attribute__((vector_size(16)));
  if constexpr (std::is_same_v<T, double> && sizeof(V) == 64)
    return __builtin_ia32_broadcastsd512(T16{a}, V{}, static_cast<unsigned char>(-1));
  else if constexpr (std::is_same_v<T, float> && sizeof(V) == 64)
    return __builtin_ia32_broadcastss512(T16{a}, V{}, static_cast<unsigned short>(-1));
  else if constexpr (std::is_same_v<T, double> && sizeof(V) == 32)
    return __builtin_ia32_vbroadcastsd_pd256(T16{a});
  else if constexpr (std::is_same_v<T, float> && sizeof(V) == 32)
    return __builtin_ia32_vbroadcastss_ps256(T16{a});
#endif
  return a - V{};  // a - (+0) is a for every a, -0 included
}

// a*b + c with one rounding in every lane of a GCC vector of T (the IEEE
// fusedMultiplyAdd, like grad::fma_hd on one element: the same bits). On x86
// with optimisation on, one vfmadd for the 64- and 32-byte vectors (built
// only inside the AVX-512 and AVX2 copies of with_best_isa / gemm, which
// are compiled with FMA3; isa.hpp); otherwise lane by lane through fma_hd,
// which in the baseline copy is libm's correctly rounded fma.
template <class T, class V>
GRAD_INLINE inline V fma_lanes(V a, V b, V c) {
#if GRAD_SIMD_X86_SQRT && GRAD_SIMD
  if constexpr (std::is_same_v<T, double> && sizeof(V) == 64)
    return __builtin_ia32_vfmaddpd512_mask(a, b, c, static_cast<unsigned char>(-1), 4);
  else if constexpr (std::is_same_v<T, float> && sizeof(V) == 64)
    return __builtin_ia32_vfmaddps512_mask(a, b, c, static_cast<unsigned short>(-1), 4);
  else if constexpr (std::is_same_v<T, double> && sizeof(V) == 32)
    return __builtin_ia32_vfmaddpd256(a, b, c);
  else if constexpr (std::is_same_v<T, float> && sizeof(V) == 32)
    return __builtin_ia32_vfmaddps256(a, b, c);
#endif
  V r = c;  // every lane is overwritten; initialised so that -Wmaybe-uninitialized has nothing to say
  for (std::size_t i = 0; i < sizeof(V) / sizeof(T); ++i) r[i] = ::grad::fma_hd(T(a[i]), T(b[i]), T(c[i]));
  return r;
}

template <class T, std::size_t Bytes>
struct Pack;

template <class T>
inline constexpr bool is_pack = false;
template <class T, std::size_t B>
inline constexpr bool is_pack<Pack<T, B>> = true;

// The lane type of a pack; T itself for a scalar.
template <class T>
struct element {
  using type = T;
};
template <class T, std::size_t B>
struct element<Pack<T, B>> {
  using type = T;
};
template <class T>
using element_t = typename element<T>::type;

// The pack of Bytes bytes that a host loop over elements of T runs on:
// Pack<T, Bytes> for float and double. Another element type opts in by
// specialising it (a dual number's pack: numerics/dual.hpp).
template <class T, std::size_t Bytes>
struct pack_of {
  using type = Pack<T, Bytes>;
};

#if GRAD_SIMD

// Lanes of T in Bytes bytes. A scalar converts implicitly (every lane gets
// it), so the generic math in exact_math.hpp reads the same for T and packs.
template <class T, std::size_t Bytes>
struct Pack {
  using value_type = T;
  static constexpr std::size_t lanes = Bytes / sizeof(T);
  static constexpr std::size_t bytes = Bytes;
  typedef T V __attribute__((vector_size(Bytes)));
  V v;

  Pack() = default;
  // Every lane s, -0 and NaN included: the one broadcast, splat.
  GRAD_INLINE Pack(T s) : v(splat<V>(s)) {}  // NOLINT: implicit on purpose, a broadcast
  GRAD_INLINE static Pack raw(V x) {
    Pack p;
    p.v = x;
    return p;
  }
  GRAD_INLINE static Pack load(const T* p) {
    Pack r;
    __builtin_memcpy(&r.v, p, sizeof(V));
    return r;
  }
  GRAD_INLINE void store(T* p) const { __builtin_memcpy(p, &v, sizeof(V)); }
  GRAD_INLINE T operator[](std::size_t i) const { return v[i]; }

  GRAD_INLINE friend Pack operator+(Pack a, Pack b) { return raw(a.v + b.v); }
  GRAD_INLINE friend Pack operator-(Pack a, Pack b) { return raw(a.v - b.v); }
  GRAD_INLINE friend Pack operator*(Pack a, Pack b) { return raw(a.v * b.v); }
  GRAD_INLINE friend Pack operator/(Pack a, Pack b) { return raw(a.v / b.v); }
  GRAD_INLINE friend Pack operator-(Pack a) { return raw(-a.v); }
  // Bit operations, for the unsigned packs that hold a float's bits.
  GRAD_INLINE friend Pack operator&(Pack a, Pack b) { return raw(a.v & b.v); }
  GRAD_INLINE friend Pack operator|(Pack a, Pack b) { return raw(a.v | b.v); }
  GRAD_INLINE friend Pack operator~(Pack a) { return raw(~a.v); }
  GRAD_INLINE friend Pack operator<<(Pack a, int s) { return raw(a.v << s); }
  GRAD_INLINE friend Pack operator>>(Pack a, int s) { return raw(a.v >> s); }
};

// Lane by lane `limit < x ? limit : x` (NaN x stays NaN), a selection: no rounding.
template <class T, std::size_t B>
GRAD_INLINE inline Pack<T, B> at_most(Pack<T, B> x, Pack<T, B> limit) {
  return Pack<T, B>::raw(limit.v < x.v ? limit.v : x.v);
}

// Whether any (all) lanes of a are >= b (false for a NaN lane, as a scalar compare).
template <class T, std::size_t B>
GRAD_INLINE inline bool any_at_least(Pack<T, B> a, T b) {
  const auto m = a.v >= b;
  bool any = false;
  GRAD_UNROLL_ALL
  for (std::size_t j = 0; j < Pack<T, B>::lanes; ++j) any |= m[j] != 0;
  return any;
}
template <class T, std::size_t B>
GRAD_INLINE inline bool all_at_least(Pack<T, B> a, T b) {
  const auto m = a.v >= b;
  bool all = true;
  GRAD_UNROLL_ALL
  for (std::size_t j = 0; j < Pack<T, B>::lanes; ++j) all &= m[j] != 0;
  return all;
}

// Correctly rounded square root in every lane (IEEE sqrt, like std::sqrt).
// On x86 with optimisation on, one instruction for the width the enclosing
// copy was compiled for (the builtins are only expanded once inlined there);
// otherwise lane by lane, the same bits.
template <class T, std::size_t B>
GRAD_INLINE inline Pack<T, B> sqrt(Pack<T, B> x) {
#if GRAD_SIMD_X86_SQRT
  if constexpr (std::is_same_v<T, double> && B == 64)
    return Pack<T, B>::raw(__builtin_ia32_sqrtpd512_mask(x.v, x.v, static_cast<unsigned char>(-1), 4));
  else if constexpr (std::is_same_v<T, float> && B == 64)
    return Pack<T, B>::raw(__builtin_ia32_sqrtps512_mask(x.v, x.v, static_cast<unsigned short>(-1), 4));
  else if constexpr (std::is_same_v<T, double> && B == 32)
    return Pack<T, B>::raw(__builtin_ia32_sqrtpd256(x.v));
  else if constexpr (std::is_same_v<T, float> && B == 32)
    return Pack<T, B>::raw(__builtin_ia32_sqrtps256(x.v));
  else if constexpr (std::is_same_v<T, double> && B == 16)
    return Pack<T, B>::raw(__builtin_ia32_sqrtpd(x.v));
  else if constexpr (std::is_same_v<T, float> && B == 16)
    return Pack<T, B>::raw(__builtin_ia32_sqrtps(x.v));
#endif
  Pack<T, B> r = x;  // every lane is overwritten (as in fma_lanes)
  for (std::size_t i = 0; i < Pack<T, B>::lanes; ++i) {
    if constexpr (std::is_same_v<T, float>)
      r.v[i] = __builtin_sqrtf(x.v[i]);  // not through double: no narrowing conversion to warn about
    else
      r.v[i] = __builtin_sqrt(x.v[i]);
  }
  return r;
}

// a*b + c with one rounding in every lane (fma_lanes; the bits of fma_hd).
template <class T, std::size_t B>
GRAD_INLINE inline Pack<T, B> fma(Pack<T, B> a, Pack<T, B> b, Pack<T, B> c) {
  return Pack<T, B>::raw(fma_lanes<T>(a.v, b.v, c.v));
}

// The same under the name the GRAD_HD rules call (update_rules.hpp: an
// unqualified fma_hd finds this one for packs by argument-dependent lookup).
template <class T, std::size_t B>
GRAD_INLINE inline Pack<T, B> fma_hd(Pack<T, B> a, Pack<T, B> b, Pack<T, B> c) {
  return fma(a, b, c);
}

// An operand of a loop over packs: contiguous (one element per lane, from
// p + i) or broadcast (every lane *p) — a bias row read along a row, a
// per-row scalar. Contiguous is a template argument so that the loop has no
// branch inside.
template <class P, bool Contiguous>
struct Stream {
  const typename P::value_type* p;
  GRAD_INLINE P at(std::size_t i) const {
    if constexpr (Contiguous)
      return P::load(p + i);
    else
      return P(*p);
  }
  // The same over a ragged tail of `rest` lanes, zero past the end.
  GRAD_INLINE P tail(std::size_t i, std::size_t rest) const {
    if constexpr (Contiguous) {
      typename P::value_type buf[P::lanes] = {};
      for (std::size_t j = 0; j < rest; ++j) buf[j] = p[i + j];
      return P::load(buf);
    } else {
      return P(*p);
    }
  }
};

// out[i] = f(in.at(i)...) for i in [0, n), or with Accumulate
// out[i] = f(out[i], in.at(i)...) (out may then not be one of the inputs).
template <class P, bool Accumulate = false, class F, class... S>
[[gnu::always_inline]] inline void map_streams(std::size_t n, typename P::value_type* __restrict out, F&& f, S... in) {
  using T = typename P::value_type;
  constexpr std::size_t L = P::lanes;
  std::size_t i = 0;
  for (; i + L <= n; i += L) {
    if constexpr (Accumulate)
      f(P::load(out + i), in.at(i)...).store(out + i);
    else
      f(in.at(i)...).store(out + i);
  }
  if (i < n) {
    const std::size_t rest = n - i;
    T res[L] = {};
    if constexpr (Accumulate) {
      for (std::size_t j = 0; j < rest; ++j) res[j] = out[i + j];
      f(P::load(res), in.tail(i, rest)...).store(res);
    } else {
      f(in.tail(i, rest)...).store(res);
    }
    for (std::size_t j = 0; j < rest; ++j) out[i + j] = res[j];
  }
}

#else  // !GRAD_SIMD

// Named in discarded branches of generic code (never instantiated here).
template <class T, std::size_t B>
Pack<T, B> at_most(Pack<T, B> x, Pack<T, B> limit);
template <class T, std::size_t B>
bool any_at_least(Pack<T, B> a, T b);
template <class T, std::size_t B>
bool all_at_least(Pack<T, B> a, T b);
template <class T, std::size_t B>
Pack<T, B> sqrt(Pack<T, B> x);
template <class T, std::size_t B>
Pack<T, B> fma(Pack<T, B> a, Pack<T, B> b, Pack<T, B> c);

#endif  // GRAD_SIMD

}  // namespace grad::simd

GRAD_SIMD_DIAGNOSTICS_END
