// Which x86 vector instruction set the host kernels may use, decided once at
// run time, so one binary runs on plain x86-64 and uses AVX-512 where present.
// Dispatching never changes a result bit: the kernels are built with
// -ffp-contract=off and do the same IEEE operations in the same order.
#pragma once

namespace grad {

enum class Isa { baseline, avx2, avx512 };

inline bool supported(Isa isa) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__) && !defined(__CUDA_ARCH__)
  switch (isa) {
    case Isa::baseline:
      return true;
    case Isa::avx2:
      return __builtin_cpu_supports("avx2");
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq");
  }
  return false;
#else
  return isa == Isa::baseline;
#endif
}

inline Isa best_isa() {
  static const Isa isa = supported(Isa::avx512) ? Isa::avx512 : supported(Isa::avx2) ? Isa::avx2 : Isa::baseline;
  return isa;
}

#if (defined(__x86_64__) || defined(__i386__)) && defined(__GNUC__)
#define GRAD_HAS_ISA_TARGETS 1
#define GRAD_TARGET_AVX2 __attribute__((target("avx2")))
#define GRAD_TARGET_AVX512 __attribute__((target("avx512f,avx512dq")))
#else
#define GRAD_HAS_ISA_TARGETS 0
#define GRAD_TARGET_AVX2
#define GRAD_TARGET_AVX512
#endif

}  // namespace grad
