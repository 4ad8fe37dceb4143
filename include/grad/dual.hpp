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
// Recording any other op on a dual tape poisons it, naming the op and these.
// Not yet: cross_entropy, linear_cross_entropy and embedding (their ids are
// integers held in T, read through casts a dual number does not offer);
// dropout (its mask's key); pow and abs, clamp, maximum, minimum, where and
// the axis max/min (their bodies call libm or test bits); the attention,
// norm and layout tags of the language model (not yet checked).
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

}  // namespace grad
