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

#include <cstddef>
#include <type_traits>
#include <vector>

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

// ---- the matrix products' host loops on dual numbers ----
// (a b)' = a' b + a b': the value part is the plain tape's gemm on the
// value parts (so its bits), the tangent two more gemms of the parts, added
// element by element. Fixed orders throughout: the same bits on every
// instruction set. contract.hpp's item_forward / item_backward find these.
namespace dual_detail {

// The value and tangent parts of n dual numbers, side by side.
template <class T>
struct Parts {
  std::vector<T> value, tangent;
  Parts(const Dual<T>* p, std::size_t n) : value(n), tangent(n) {
    for (std::size_t i = 0; i < n; ++i) {
      value[i] = p[i].value;
      tangent[i] = p[i].tangent;
    }
  }
};

// out[i] = (value[i], first[i] + second[i]).
template <class T>
void join(Dual<T>* out, const std::vector<T>& value, const std::vector<T>& first, const std::vector<T>& second) {
  for (std::size_t i = 0; i < value.size(); ++i) out[i] = Dual<T>(value[i], first[i] + second[i]);
}

}  // namespace dual_detail

template <class Derived, class T>
void dual_forward(const MatrixProduct<Derived>&, const NodeArgs<Dual<T>>& x, Dual<T>* y) {
  const std::size_t m = x.a.dims.back(1), k = x.a.dims.back(), n = x.b.dims.back();
  const std::size_t batches = x.out.size() / (m * n == 0 ? 1 : m * n);
  const dual_detail::Parts<T> a(x.a.data, x.a.dims.size()), b(x.b.data, x.b.dims.size());
  std::vector<T> value(m * n), first(m * n), second(m * n);
  for (std::size_t s = 0; s < batches; ++s) {
    const std::size_t ia = s * m * k, ib = s * k * n;
    gemm_nn(a.value.data() + ia, b.value.data() + ib, value.data(), m, k, n);
    gemm_nn(a.tangent.data() + ia, b.value.data() + ib, first.data(), m, k, n);
    gemm_nn(a.value.data() + ia, b.tangent.data() + ib, second.data(), m, k, n);
    dual_detail::join(y + s * m * n, value, first, second);
  }
}

// dA = G B^T and dB = A^T G, each with its tangent G' B^T + G B'^T
// (A'^T G + A^T G').
template <class Derived, int In, class T>
void dual_backward(const MatrixProduct<Derived>&, std::integral_constant<int, In>, const NodeArgs<Dual<T>>& x,
                   const Dual<T>*, const Dual<T>* g, Dual<T>* dx) {
  const std::size_t m = x.a.dims.back(1), k = x.a.dims.back(), n = x.b.dims.back();
  const std::size_t batches = x.out.size() / (m * n == 0 ? 1 : m * n);
  const dual_detail::Parts<T> grad(g, x.out.size());
  const dual_detail::Parts<T> other(In == 0 ? x.b.data : x.a.data, In == 0 ? x.b.dims.size() : x.a.dims.size());
  const std::size_t size = In == 0 ? m * k : k * n;
  std::vector<T> value(size), first(size), second(size);
  for (std::size_t s = 0; s < batches; ++s) {
    const std::size_t ig = s * m * n;
    if constexpr (In == 0) {
      const std::size_t ib = s * k * n;
      gemm_nt(grad.value.data() + ig, other.value.data() + ib, value.data(), m, n, k);
      gemm_nt(grad.tangent.data() + ig, other.value.data() + ib, first.data(), m, n, k);
      gemm_nt(grad.value.data() + ig, other.tangent.data() + ib, second.data(), m, n, k);
    } else {
      const std::size_t ia = s * m * k;
      gemm_tn(other.value.data() + ia, grad.value.data() + ig, value.data(), m, k, n);
      gemm_tn(other.tangent.data() + ia, grad.value.data() + ig, first.data(), m, k, n);
      gemm_tn(other.value.data() + ia, grad.tangent.data() + ig, second.data(), m, k, n);
    }
    dual_detail::join(dx + s * size, value, first, second);
  }
}

}  // namespace grad
