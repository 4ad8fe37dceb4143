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
#include <memory>
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

// ---- the elementwise families' host loops on dual numbers ----
// A Unary or Binary tag's host loops (tags/family.hpp: rows, broadcasting,
// packs) are templates over the element type; on a dual tape they run on
// packs of dual numbers (numerics/dual.hpp), each lane doing the per-item
// body's operations, so the bits are the per-item bodies'.
template <class Op>
concept ElementwiseTag = std::is_base_of_v<Unary<Op>, Op> || std::is_base_of_v<Binary<Op>, Op>;

template <ElementwiseTag Op, class T>
void dual_forward(const Op&, const NodeArgs<Dual<T>>& x, Dual<T>* y) {
  Op::forward_tensor(x, y);
}
template <ElementwiseTag Op, int In, class T>
void dual_backward(const Op&, std::integral_constant<int, In>, const NodeArgs<Dual<T>>& x, const Dual<T>* y,
                   const Dual<T>* g, Dual<T>* dx) {
  Op::template backward_tensor<In>(x, y, g, dx);
}

// ---- the matrix products' host loops on dual numbers ----
// (a b)' = a' b + a b': the value part is the plain tape's gemm on the
// value parts (so its bits); the tangent is one chain of fmas per element,
// over a' b's terms and then on over a b''s (the gemm continued, as a later
// cache block continues it). An operand whose tangent is zero throughout (a
// constant, an input that carries none) drops its half of the chain: a jvp
// costs two products where one operand is such, an HVP's first layer
// likewise. Fixed orders throughout: the same bits on every instruction set
// and thread count. contract.hpp's item_forward / item_backward find these.
namespace dual_detail {

// Working memory for one product: the operands' parts side by side and
// the result's. Kept by the thread between products up to 2^24 numbers
// (128 MiB of double), so that a step's products do not map and fault in
// fresh pages each time; a larger product allocates its own.
template <class T>
class Scratch {
 public:
  explicit Scratch(std::size_t n) {
    constexpr std::size_t kept = std::size_t{1} << 24;
    thread_local std::vector<T> reused;
    if (n <= kept) {
      if (reused.size() < n) reused.resize(n);
      data_ = reused.data();
    } else {
      own_.reset(new T[n]);
      data_ = own_.get();
    }
  }
  // The next n numbers (uninitialised: each is written before it is read).
  T* take(std::size_t n) {
    T* p = data_ + used_;
    used_ += n;
    return p;
  }

 private:
  std::unique_ptr<T[]> own_;
  T* data_ = nullptr;
  std::size_t used_ = 0;
};

// value[i] = p[i].value, tangent[i] = p[i].tangent for i < n, packs of
// dual numbers at a time; returns whether every tangent is zero.
template <class T>
bool split(const Dual<T>* p, std::size_t n, T* value, T* tangent) {
  bool flat = true;
  with_best_isa([&](auto width) {
    using P = pack_for<Dual<T>, decltype(width)>;
    using V = decltype(P::value);
    constexpr std::size_t L = sizeof(V) / sizeof(T);
    std::size_t i = 0;
    if constexpr (L > 1) {
      decltype(V().v != T(0)) nonzero{};  // lanes that have met a nonzero tangent
      for (; i + L <= n; i += L) {
        const P d = P::load(p + i);
        d.value.store(value + i);
        d.tangent.store(tangent + i);
        nonzero |= d.tangent.v != T(0);
      }
      for (std::size_t j = 0; j < L; ++j) flat &= nonzero[j] == 0;
    }
    for (; i < n; ++i) {
      value[i] = p[i].value;
      tangent[i] = p[i].tangent;
      flat &= p[i].tangent == T(0);
    }
  });
  return flat;
}

// out[i] = (value[i], tangent[i]) for i < n (tangent null: zero).
template <class T>
void join(Dual<T>* out, std::size_t n, const T* value, const T* tangent) {
  with_best_isa([&](auto width) {
    using P = pack_for<Dual<T>, decltype(width)>;
    using V = decltype(P::value);
    constexpr std::size_t L = sizeof(V) / sizeof(T);
    std::size_t i = 0;
    if constexpr (L > 1)
      for (; i + L <= n; i += L) P(V::load(value + i), tangent ? V::load(tangent + i) : V(T(0))).store(out + i);
    for (; i < n; ++i) out[i] = Dual<T>(value[i], tangent ? tangent[i] : T(0));
  });
}

// The value and tangent parts of n dual numbers, each contiguous, and
// whether every tangent is zero.
template <class T>
struct Parts {
  T* value;
  T* tangent;
  bool flat;
  Parts(const Dual<T>* p, std::size_t n, Scratch<T>& scratch)
      : value(scratch.take(n)), tangent(scratch.take(n)), flat(split(p, n, value, tangent)) {}
};

// out[0, size) = p q on dual numbers: product(x, y, c, continued) computes
// c = x y (or c += x y, continuing each element's chain) on one pair of
// parts, offsets ip and iq into p's and q's.
template <class T, class Product>
void dual_product(Dual<T>* out, std::size_t size, const Parts<T>& p, std::size_t ip, const Parts<T>& q,
                  std::size_t iq, T* value, T* tangent, Product product) {
  product(p.value + ip, q.value + iq, value, false);
  if (!p.flat) product(p.tangent + ip, q.value + iq, tangent, false);
  if (!q.flat) product(p.value + ip, q.tangent + iq, tangent, !p.flat);
  join(out, size, value, p.flat && q.flat ? nullptr : tangent);
}

// C = X Y (continued: C += X Y) with X and Y strided as gemm_nn, gemm_nt
// and gemm_tn read them (their operands A B, G B^T, A^T G).
template <class T>
void gemm_parts(gemm_detail::Strided<T> x, gemm_detail::Strided<T> y, T* c, std::size_t m, std::size_t n,
                std::size_t k, bool continued) {
  gemm_detail::multiply<T>(gemm_detail::best_isa(), {x, y, c, m, n, k, continued});
}

}  // namespace dual_detail

template <class Derived, class T>
void dual_forward(const MatrixProduct<Derived>&, const NodeArgs<Dual<T>>& x, Dual<T>* y) {
  const std::size_t m = x.a.dims.back(1), k = x.a.dims.back(), n = x.b.dims.back();
  const std::size_t batches = x.out.size() / (m * n == 0 ? 1 : m * n);
  const std::size_t sa = x.a.dims.size(), sb = x.b.dims.size();
  dual_detail::Scratch<T> scratch(2 * (sa + sb + m * n));
  const dual_detail::Parts<T> a(x.a.data, sa, scratch), b(x.b.data, sb, scratch);
  T* const value = scratch.take(m * n);
  T* const tangent = scratch.take(m * n);
  for (std::size_t s = 0; s < batches; ++s)  // C = A B
    dual_detail::dual_product(y + s * m * n, m * n, a, s * m * k, b, s * k * n, value, tangent,
                              [&](const T* p, const T* q, T* c, bool continued) {
                                dual_detail::gemm_parts<T>({p, k, 1}, {q, n, 1}, c, m, n, k, continued);
                              });
}

// dA = G B^T and dB = A^T G, each with its tangent G' B^T + G B'^T
// (A'^T G + A^T G').
template <class Derived, int In, class T>
void dual_backward(const MatrixProduct<Derived>&, std::integral_constant<int, In>, const NodeArgs<Dual<T>>& x,
                   const Dual<T>*, const Dual<T>* g, Dual<T>* dx) {
  const std::size_t m = x.a.dims.back(1), k = x.a.dims.back(), n = x.b.dims.back();
  const std::size_t batches = x.out.size() / (m * n == 0 ? 1 : m * n);
  const std::size_t size = In == 0 ? m * k : k * n;
  const std::size_t so = (In == 0 ? x.b : x.a).dims.size();
  dual_detail::Scratch<T> scratch(2 * (x.out.size() + so + size));
  const dual_detail::Parts<T> grad(g, x.out.size(), scratch);
  const dual_detail::Parts<T> other(In == 0 ? x.b.data : x.a.data, so, scratch);
  T* const value = scratch.take(size);
  T* const tangent = scratch.take(size);
  for (std::size_t s = 0; s < batches; ++s) {
    if constexpr (In == 0)  // dA [m, k] = G [m, n] B^T
      dual_detail::dual_product(dx + s * size, size, grad, s * m * n, other, s * k * n, value, tangent,
                                [&](const T* p, const T* q, T* c, bool continued) {
                                  dual_detail::gemm_parts<T>({p, n, 1}, {q, 1, n}, c, m, k, n, continued);
                                });
    else  // dB [k, n] = A^T [k, m] G [m, n]
      dual_detail::dual_product(dx + s * size, size, other, s * m * k, grad, s * m * n, value, tangent,
                                [&](const T* p, const T* q, T* c, bool continued) {
                                  dual_detail::gemm_parts<T>({p, 1, k}, {q, n, 1}, c, k, n, m, continued);
                                });
  }
}

}  // namespace grad
