// Tapes of dual numbers: Tape<Dual<T>> records a program whose every value
// carries a tangent (forward mode), and its reverse walk over dual values
// gives the tangent of every gradient: a Hessian-vector product
// (forward over reverse). grad/func.hpp builds jvp, vjp, hvp, jacobian and
// hessian on it; docs/second_order.md explains it.
//
// Nothing here is compiled by a program that does not include this header:
// the tape reaches a dual type's loops (contract.hpp's item_forward: the
// per-item bodies, or the faster loops below, found by argument-dependent
// lookup: the elementwise families on packs of dual numbers, the matrix
// products by gemm) only through `if constexpr` branches that a float or
// double tape discards.
//
// The ops below carry a tangent: their per-item bodies are templates over
// the scalar whose every operation has a rule for Dual<T> (numerics/dual.hpp).
// test_second_order checks each one's tangent and HVP against central
// differences and, over the op case table, against torch.autograd.functional
// in float64. Recording any other op on a dual tape poisons it, naming the
// op and these. At a tie (maximum, minimum, max/min over an axis) the
// tangent is the mean of the tied inputs', as torch's forward mode has it
// (numerics/choice.hpp, docs/second_order.md).
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
// constant, an input that carries none) drops its half of the chain, and
// the value and the tangent are then one gemm: a jvp along a network's
// input costs one product of twice the rows per layer. Fixed orders
// throughout: the same bits on every instruction set and thread count.
// contract.hpp's item_forward / item_backward find these.
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

// The parts of a rows x cols dual matrix at p, written to dst (2 rows cols
// numbers): stacked (every value, row-major, then every tangent) or paired
// (each row's values, then that row's tangents). Returns whether every
// tangent is zero.
template <class T>
bool split_matrix(const Dual<T>* p, std::size_t rows, std::size_t cols, bool paired, T* dst) {
  if (!paired) return split(p, rows * cols, dst, dst + rows * cols);
  bool flat = true;
  for (std::size_t r = 0; r < rows; ++r) flat &= split(p + r * cols, cols, dst + 2 * r * cols, dst + 2 * r * cols + cols);
  return flat;
}

// One operand of a dual product C = X Y as the gemm reads it: its value and
// tangent parts, and both at once (X: [X; X'], twice the rows; Y: [Y Y'],
// twice the columns), which the layouts above make single strided views.
template <class T>
struct DualOperand {
  gemm_detail::Strided<T> value, tangent, both;
  bool flat;
};

// out (m x n) = X Y on dual numbers, X m x k, Y k x n; buffer: 2 m n
// numbers. value = X Y; tangent = X' Y + X Y' as one chain per element
// (X' Y's terms, then X Y''s continued). Where Y carries no tangent the two
// products are one of twice the rows ([X; X'] Y), where X carries none one
// of twice the columns (X [Y Y']): the same fmas, one pass over the other
// operand.
template <class T>
void dual_product(Dual<T>* out, const DualOperand<T>& x, const DualOperand<T>& y, std::size_t m, std::size_t n,
                  std::size_t k, T* buffer) {
  const auto isa = gemm_detail::best_isa();
  auto gemm = [&](gemm_detail::Strided<T> a, gemm_detail::Strided<T> b, T* c, std::size_t rows, std::size_t cols,
                  bool continued) { gemm_detail::multiply<T>(isa, {a, b, c, rows, cols, k, continued}); };
  if (x.flat && y.flat) {
    gemm(x.value, y.value, buffer, m, n, false);
    join(out, m * n, buffer, static_cast<const T*>(nullptr));
  } else if (y.flat) {
    gemm(x.both, y.value, buffer, 2 * m, n, false);
    join(out, m * n, buffer, buffer + m * n);
  } else if (x.flat) {
    gemm(x.value, y.both, buffer, m, 2 * n, false);
    for (std::size_t r = 0; r < m; ++r) join(out + r * n, n, buffer + 2 * r * n, buffer + 2 * r * n + n);
  } else {
    gemm(x.value, y.value, buffer, m, n, false);
    gemm(x.tangent, y.value, buffer + m * n, m, n, false);
    gemm(x.value, y.tangent, buffer + m * n, m, n, true);
    join(out, m * n, buffer, buffer + m * n);
  }
}

// The operands of the three products (element (r, c) of a part at
// p[r * rs + c * cs]): a row-major m x k matrix stacked, as X; paired, as Y;
// its transpose from a stacked copy as Y, from a paired copy as X.
template <class T>
DualOperand<T> rows_stacked(const T* p, std::size_t rows, std::size_t cols, bool flat) {
  return {{p, cols, 1}, {p + rows * cols, cols, 1}, {p, cols, 1}, flat};
}
template <class T>
DualOperand<T> rows_paired(const T* p, std::size_t cols, bool flat) {
  return {{p, 2 * cols, 1}, {p + cols, 2 * cols, 1}, {p, 2 * cols, 1}, flat};
}
template <class T>
DualOperand<T> transposed_stacked(const T* p, std::size_t rows, std::size_t cols, bool flat) {
  return {{p, 1, cols}, {p + rows * cols, 1, cols}, {p, 1, cols}, flat};
}
template <class T>
DualOperand<T> transposed_paired(const T* p, std::size_t cols, bool flat) {
  return {{p, 1, 2 * cols}, {p + cols, 1, 2 * cols}, {p, 1, 2 * cols}, flat};
}

}  // namespace dual_detail

template <class Derived, class T>
void dual_forward(const MatrixProduct<Derived>&, const NodeArgs<Dual<T>>& x, Dual<T>* y) {
  using namespace dual_detail;
  const std::size_t m = x.a.dims.back(1), k = x.a.dims.back(), n = x.b.dims.back();
  const std::size_t batches = x.out.size() / (m * n == 0 ? 1 : m * n);
  Scratch<T> scratch(2 * (m * k + k * n + m * n));
  T* const a = scratch.take(2 * m * k);
  T* const b = scratch.take(2 * k * n);
  T* const buffer = scratch.take(2 * m * n);
  for (std::size_t s = 0; s < batches; ++s) {  // C [m, n] = A [m, k] B [k, n]
    const bool a_flat = split_matrix(x.a.data + s * m * k, m, k, false, a);
    const bool b_flat = split_matrix(x.b.data + s * k * n, k, n, true, b);
    dual_product(y + s * m * n, rows_stacked(a, m, k, a_flat), rows_paired(b, n, b_flat), m, n, k, buffer);
  }
}

// dA = G B^T and dB = A^T G, each with its tangent G' B^T + G B'^T
// (A'^T G + A^T G').
template <class Derived, int In, class T>
void dual_backward(const MatrixProduct<Derived>&, std::integral_constant<int, In>, const NodeArgs<Dual<T>>& x,
                   const Dual<T>*, const Dual<T>* g, Dual<T>* dx) {
  using namespace dual_detail;
  const std::size_t m = x.a.dims.back(1), k = x.a.dims.back(), n = x.b.dims.back();
  const std::size_t batches = x.out.size() / (m * n == 0 ? 1 : m * n);
  Scratch<T> scratch(2 * (m * n + (In == 0 ? k * n + m * k : m * k + k * n)));
  T* const gp = scratch.take(2 * m * n);
  T* const other = scratch.take(2 * (In == 0 ? k * n : m * k));
  T* const buffer = scratch.take(2 * (In == 0 ? m * k : k * n));
  for (std::size_t s = 0; s < batches; ++s) {
    if constexpr (In == 0) {  // dA [m, k] = G [m, n] B^T
      const bool g_flat = split_matrix(g + s * m * n, m, n, false, gp);
      const bool b_flat = split_matrix(x.b.data + s * k * n, k, n, false, other);
      dual_product(dx + s * m * k, rows_stacked(gp, m, n, g_flat), transposed_stacked(other, k, n, b_flat), m, k, n,
                   buffer);
    } else {  // dB [k, n] = A^T [k, m] G [m, n]
      const bool a_flat = split_matrix(x.a.data + s * m * k, m, k, true, other);
      const bool g_flat = split_matrix(g + s * m * n, m, n, true, gp);
      dual_product(dx + s * k * n, transposed_paired(other, k, a_flat), rows_paired(gp, n, g_flat), k, n, m, buffer);
    }
  }
}

// matmul_nt: y = a b^T (a [..., k] as rows x k, b [n, k]); dA = G B and
// dB = G^T A, with the same gemms' layouts as the plain tag's host loops.
template <class T>
void dual_forward(const MatmulNt&, const NodeArgs<Dual<T>>& x, Dual<T>* y) {
  using namespace dual_detail;
  const auto [rows, k, n] = MatmulNt::sizes(x);
  Scratch<T> scratch(2 * (rows * k + n * k + rows * n));
  T* const a = scratch.take(2 * rows * k);
  T* const b = scratch.take(2 * n * k);
  const bool a_flat = split_matrix(x.a.data, rows, k, false, a), b_flat = split_matrix(x.b.data, n, k, false, b);
  dual_product(y, rows_stacked(a, rows, k, a_flat), transposed_stacked(b, n, k, b_flat), rows, n, k,
               scratch.take(2 * rows * n));
}
template <int In, class T>
void dual_backward(const MatmulNt&, std::integral_constant<int, In>, const NodeArgs<Dual<T>>& x, const Dual<T>*,
                   const Dual<T>* g, Dual<T>* dx) {
  using namespace dual_detail;
  const auto [rows, k, n] = MatmulNt::sizes(x);
  Scratch<T> scratch(2 * (rows * n + (In == 0 ? n * k + rows * k : rows * k + n * k)));
  T* const gp = scratch.take(2 * rows * n);
  if constexpr (In == 0) {  // dA [rows, k] = G [rows, n] B [n, k]
    T* const b = scratch.take(2 * n * k);
    const bool g_flat = split_matrix(g, rows, n, false, gp), b_flat = split_matrix(x.b.data, n, k, true, b);
    dual_product(dx, rows_stacked(gp, rows, n, g_flat), rows_paired(b, k, b_flat), rows, k, n,
                 scratch.take(2 * rows * k));
  } else {  // dB [n, k] = G^T [n, rows] A [rows, k]
    T* const a = scratch.take(2 * rows * k);
    const bool g_flat = split_matrix(g, rows, n, true, gp), a_flat = split_matrix(x.a.data, rows, k, true, a);
    dual_product(dx, transposed_paired(gp, n, g_flat), rows_paired(a, k, a_flat), n, k, rows, scratch.take(2 * n * k));
  }
}

}  // namespace grad
