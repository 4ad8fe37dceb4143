// The hot host loops the compiled kernel library (grad_kernels, src/)
// holds for float and double, listed once: src/ instantiates every entry,
// and a consumer built with GRAD_COMPILED_KERNELS (set by grad_kernels_dep
// and grad-kernels.pc) declares them `extern template`, so its translation
// units compile only the recording layer and call the library's copies,
// built with the project's flags (meson.build; one copy per instruction set). The
// results are the same bits in both modes: same source, and the contract
// (no contraction, fixed orders) does not depend on the optimisation level.
//
// The tape reaches every op's forward and backward through two functions the
// library also compiles (core.hpp: Tape::forward_by_code and the reverse
// walk), so a consumer's unit compiles no op's loop; the entries here are
// the loops other code calls directly too (the optimizers' updates, the
// gemm, the elementwise families).
#pragma once

#include "grad/numerics/gemm.hpp"
#include "grad/tags/family.hpp"
#include "grad/update.hpp"

namespace grad {

struct Add;
struct Sub;
struct Mul;
struct Div;
struct Neg;
struct AddScalar;
struct MulScalar;
struct DivScalar;
struct ScalarSub;
struct ScalarDiv;
struct Relu;
struct Sigmoid;
struct Tanh;
struct Exp;
struct Log;
struct Sqrt;
struct AddScaled;
struct SiluMul;
struct ClipRule;
struct SgdRule;
struct AdamRule;
template <class T>
struct AdamStepConstants;

}  // namespace grad

// GRAD_KERNEL_INSTANCES(E, T) expands to one explicit instantiation per hot
// loop for element type T, each prefixed by E (`extern` or nothing).
#define GRAD_KERNEL_UNARY_(E, Op, T)                                                       \
  E template void grad::kernels::unary_forward<grad::Op, T>(const grad::NodeArgs<T>&, T*); \
  E template void grad::kernels::unary_backward<grad::Op, T>(const grad::NodeArgs<T>&, const T*, const T*, T*);
#define GRAD_KERNEL_BINARY_(E, Op, T)                                                                               \
  E template void grad::kernels::binary_forward<grad::Op, T>(const grad::NodeArgs<T>&, T*);                         \
  E template void grad::kernels::binary_backward<grad::Op, 0, T>(const grad::NodeArgs<T>&, const T*, const T*, T*); \
  E template void grad::kernels::binary_backward<grad::Op, 1, T>(const grad::NodeArgs<T>&, const T*, const T*, T*);
#define GRAD_KERNEL_INSTANCES(E, T)                                                                                \
  GRAD_KERNEL_BINARY_(E, Add, T)                                                                                   \
  GRAD_KERNEL_BINARY_(E, Sub, T)                                                                                   \
  GRAD_KERNEL_BINARY_(E, Mul, T)                                                                                   \
  GRAD_KERNEL_BINARY_(E, Div, T)                                                                                   \
  GRAD_KERNEL_UNARY_(E, Neg, T)                                                                                    \
  GRAD_KERNEL_UNARY_(E, AddScalar, T)                                                                              \
  GRAD_KERNEL_UNARY_(E, MulScalar, T)                                                                              \
  GRAD_KERNEL_UNARY_(E, DivScalar, T)                                                                              \
  GRAD_KERNEL_UNARY_(E, ScalarSub, T)                                                                              \
  GRAD_KERNEL_UNARY_(E, ScalarDiv, T)                                                                              \
  GRAD_KERNEL_UNARY_(E, Relu, T)                                                                                   \
  GRAD_KERNEL_UNARY_(E, Sigmoid, T)                                                                                \
  GRAD_KERNEL_UNARY_(E, Tanh, T)                                                                                   \
  GRAD_KERNEL_UNARY_(E, Exp, T)                                                                                    \
  GRAD_KERNEL_UNARY_(E, Log, T)                                                                                    \
  GRAD_KERNEL_UNARY_(E, Sqrt, T)                                                                                   \
  GRAD_KERNEL_BINARY_(E, AddScaled, T)                                                                             \
  GRAD_KERNEL_BINARY_(E, SiluMul, T)                                                                               \
  E template void grad::gemm_detail::multiply<T>(grad::Isa, const grad::gemm_detail::Problem<T>&);                 \
  E template void grad::kernels::sgd_update<grad::ClipRule, grad::SgdRule, T>(T*, const T*, std::size_t, T, T, T); \
  E template void grad::kernels::adam_update<grad::ClipRule, grad::AdamRule, T, grad::AdamStepConstants<T>>(       \
      T*, T*, T*, const T*, std::size_t, T, T, T, T, T, const grad::AdamStepConstants<T>&, T);

#if defined(GRAD_COMPILED_KERNELS) && GRAD_SIMD
GRAD_KERNEL_INSTANCES(extern, float)
GRAD_KERNEL_INSTANCES(extern, double)
#endif
