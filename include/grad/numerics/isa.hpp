// Which x86 vector instruction set the host kernels may use, decided once at
// run time, so one binary runs on plain x86-64 and uses AVX-512 where present.
// Dispatching never changes a result bit: the kernels are built with
// -ffp-contract=off and do the same IEEE operations in the same order
// (an fma only where the source calls one, in every copy).
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <type_traits>

namespace grad {

enum class Isa { baseline, avx2, avx512 };

inline bool supported(Isa isa) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__CUDA_ARCH__)
  switch (isa) {
    case Isa::baseline:
      return true;
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("fma");
  }
  return false;
#else
  return isa == Isa::baseline;
#endif
}

// GRAD_ONLY_ISA (0 baseline, 1 avx2, 2 avx512) builds one copy of every
// kernel instead of three, for a binary that runs only on the machine that
// built it: scripts/sanitize.sh sets it to that machine's widest set, since
// the sanitizers multiply a kernel's compile time and a run uses one copy.
// best_isa() is then that set (GRAD_ISA has nothing else to choose).
#ifdef GRAD_ONLY_ISA
inline constexpr Isa only_isa = static_cast<Isa>(GRAD_ONLY_ISA);
static_assert(GRAD_ONLY_ISA >= 0 && GRAD_ONLY_ISA <= 2, "GRAD_ONLY_ISA: 0 (baseline), 1 (avx2) or 2 (avx512)");
#endif

// The widest set the CPU has, capped by the environment variable GRAD_ISA
// (baseline, avx2 or avx512) when it is set: a way to run, and test, the
// narrower code paths on a wide machine. Read once, at the first kernel call.
inline Isa best_isa() {
#ifdef GRAD_ONLY_ISA
  static const Isa only = [] {
    if (!supported(only_isa)) {
      std::fprintf(stderr, "grad: built with GRAD_ONLY_ISA=%d, an instruction set this CPU does not have\n",
                   GRAD_ONLY_ISA);
      std::abort();
    }
    return only_isa;
  }();
  return only;
#else
  static const Isa isa = [] {
    Isa best = supported(Isa::avx512) ? Isa::avx512 : supported(Isa::avx2) ? Isa::avx2 : Isa::baseline;
    if (const char* cap = std::getenv("GRAD_ISA")) {
      const std::string_view name(cap);
      if (name == "baseline")
        best = Isa::baseline;
      else if (name == "avx2" && best == Isa::avx512)
        best = Isa::avx2;
      else if (name != "avx2" && name != "avx512")
        std::fprintf(stderr, "grad: GRAD_ISA=%s is not one of baseline, avx2, avx512; ignored\n", cap);
    }
    return best;
  }();
  return isa;
#endif
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define GRAD_HAS_ISA_TARGETS 1
// Both copies have FMA3 (every AVX2 and AVX-512 CPU does; supported() checks
// it): an explicit fma (fma_hd, simd::fma_lanes) is then one vfmadd. It
// never changes a bit: fma is one correctly rounded IEEE operation, which
// the baseline copy computes through libm.
#define GRAD_TARGET_AVX2 __attribute__((target("avx2,fma")))
#define GRAD_TARGET_AVX512 __attribute__((target("avx512f,avx512dq,fma")))
#else
#define GRAD_HAS_ISA_TARGETS 0
#define GRAD_TARGET_AVX2
#define GRAD_TARGET_AVX512
#endif

// The vector width, in bytes, of the copy a with_best_isa body runs in.
template <std::size_t Bytes>
struct VectorWidth {
  static constexpr std::size_t bytes = Bytes;
};

namespace isa_detail {
template <class Body>
[[gnu::always_inline]] inline void run_baseline(Body& body) {
  if constexpr (std::is_invocable_v<Body&, VectorWidth<16>>)
    body(VectorWidth<16>{});
  else
    body();
}
}  // namespace isa_detail

#if GRAD_HAS_ISA_TARGETS
namespace isa_detail {
template <class Body>
GRAD_TARGET_AVX2 __attribute__((flatten)) void run_avx2(Body& body) {
  if constexpr (std::is_invocable_v<Body&, VectorWidth<32>>)
    body(VectorWidth<32>{});
  else
    body();
}
template <class Body>
GRAD_TARGET_AVX512 __attribute__((flatten)) void run_avx512(Body& body) {
  if constexpr (std::is_invocable_v<Body&, VectorWidth<64>>)
    body(VectorWidth<64>{});
  else
    body();
}
}  // namespace isa_detail
#endif

// Runs body() compiled for the best instruction set this CPU has: body (a
// lambda holding a loop) is inlined, with everything it calls, into a copy
// of a small function built for AVX-512, AVX2 or the baseline, so the loop
// runs as wide as the machine allows. A body that takes an argument is
// called with VectorWidth<64>, <32> or <16>: the width its simd::Pack loops
// should use in that copy (simd.hpp), so that their speed does not depend on
// the auto-vectoriser. Callers keep the loops short and free of calls into
// the pool.
template <class Body>
inline void with_best_isa(Body&& body) {
#if GRAD_HAS_ISA_TARGETS && defined(GRAD_ONLY_ISA)
  (void)best_isa();  // stops with a message on a CPU without the one copy's set
  if constexpr (only_isa == Isa::avx512)
    isa_detail::run_avx512(body);
  else if constexpr (only_isa == Isa::avx2)
    isa_detail::run_avx2(body);
  else
    isa_detail::run_baseline(body);
#elif GRAD_HAS_ISA_TARGETS
  switch (best_isa()) {
    case Isa::avx512:
      return isa_detail::run_avx512(body);
    case Isa::avx2:
      return isa_detail::run_avx2(body);
    case Isa::baseline:
      return isa_detail::run_baseline(body);
  }
#else
  isa_detail::run_baseline(body);
#endif
}

}  // namespace grad
