// Tapes of dual numbers: Tape<Dual<T>> records a program whose every value
// carries a tangent (forward mode), and its reverse walk over dual values
// gives the tangent of every gradient: a Hessian-vector product
// (forward over reverse). grad/func.hpp builds jvp, vjp, hvp, jacobian and
// hessian on it; docs/second_order.md explains it.
//
// Nothing here is compiled by a program that does not include this header:
// the tape reaches the per-item bodies for a dual type only through
// `if constexpr` branches that a float or double tape discards.
//
// The ops below carry a tangent: their per-item bodies are templates over
// the scalar whose every operation has a rule for Dual<T> (numerics/dual.hpp).
// test_second_order checks each one's tangent and HVP against central
// differences. Recording any other op on a dual tape poisons it, naming the
// op and these.
// Not yet: pow with a tensor exponent (its integral-exponent branch tests
// the exponent's value and would drop the exponent's tangent), dropout (its
// mask's key) and linear_cross_entropy (a fused loss whose host loops keep
// dh: not checked yet). A scalar operand (x * s, pow(x, s)) is a constant
// on a dual tape: one with a tangent is refused.
#pragma once

#include "grad/core.hpp"
#include "grad/numerics/dual.hpp"

namespace grad {

template <>
inline constexpr bool carries_tangent<Add> = true;
template <>
inline constexpr bool carries_tangent<Sub> = true;
template <>
inline constexpr bool carries_tangent<Mul> = true;
template <>
inline constexpr bool carries_tangent<Div> = true;
template <>
inline constexpr bool carries_tangent<Neg> = true;
template <>
inline constexpr bool carries_tangent<AddScalar> = true;
template <>
inline constexpr bool carries_tangent<MulScalar> = true;
template <>
inline constexpr bool carries_tangent<DivScalar> = true;
template <>
inline constexpr bool carries_tangent<ScalarSub> = true;
template <>
inline constexpr bool carries_tangent<ScalarDiv> = true;
template <>
inline constexpr bool carries_tangent<Relu> = true;
template <>
inline constexpr bool carries_tangent<Sigmoid> = true;
template <>
inline constexpr bool carries_tangent<Tanh> = true;
template <>
inline constexpr bool carries_tangent<Gelu> = true;
template <>
inline constexpr bool carries_tangent<Exp> = true;
template <>
inline constexpr bool carries_tangent<Log> = true;
template <>
inline constexpr bool carries_tangent<Sqrt> = true;
template <>
inline constexpr bool carries_tangent<Sum> = true;
template <>
inline constexpr bool carries_tangent<Mean> = true;
template <>
inline constexpr bool carries_tangent<RowSum> = true;
template <>
inline constexpr bool carries_tangent<Matmul> = true;
template <>
inline constexpr bool carries_tangent<Bmm> = true;
template <>
inline constexpr bool carries_tangent<Transpose> = true;
template <>
inline constexpr bool carries_tangent<Reshape> = true;
template <>
inline constexpr bool carries_tangent<Softmax> = true;
template <>
inline constexpr bool carries_tangent<LogSoftmax> = true;
template <>
inline constexpr bool carries_tangent<Abs> = true;
template <>
inline constexpr bool carries_tangent<ClampMin> = true;
template <>
inline constexpr bool carries_tangent<ClampMax> = true;
template <>
inline constexpr bool carries_tangent<Maximum> = true;
template <>
inline constexpr bool carries_tangent<Minimum> = true;
template <>
inline constexpr bool carries_tangent<WhereTrue> = true;
template <>
inline constexpr bool carries_tangent<WhereFalse> = true;
template <>
inline constexpr bool carries_tangent<PowScalar> = true;
template <>
inline constexpr bool carries_tangent<Slice> = true;
template <>
inline constexpr bool carries_tangent<Concat> = true;
template <>
inline constexpr bool carries_tangent<AxisMax> = true;
template <>
inline constexpr bool carries_tangent<AxisMin> = true;
template <>
inline constexpr bool carries_tangent<MatmulNt> = true;
template <>
inline constexpr bool carries_tangent<RmsNorm> = true;
template <>
inline constexpr bool carries_tangent<LayerNorm> = true;
template <>
inline constexpr bool carries_tangent<AddScaled> = true;
template <>
inline constexpr bool carries_tangent<SiluMul> = true;
template <>
inline constexpr bool carries_tangent<CrossEntropy> = true;
template <>
inline constexpr bool carries_tangent<Embedding> = true;
template <>
inline constexpr bool carries_tangent<CausalAttentionProbs> = true;
template <>
inline constexpr bool carries_tangent<AttentionContext> = true;
template <>
inline constexpr bool carries_tangent<HeadsMajor> = true;
template <>
inline constexpr bool carries_tangent<RowsMajor> = true;
template <>
inline constexpr bool carries_tangent<RopeHeadsMajor> = true;

}  // namespace grad
