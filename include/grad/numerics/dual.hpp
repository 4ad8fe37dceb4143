// Dual<T>: a value and a tangent (T = float or double), the scalar of a
// forward-mode tape (Tape<Dual<T>>, grad/dual.hpp). Arithmetic carries the
// tangent by the chain rule; the value part of every operation is the plain
// operation on the value parts, computed by the very code a plain T uses
// (IEEE + - * /, fma_hd, exact_math.hpp's functions), so it has the plain
// tape's bits. The tags' bodies find the math below by argument-dependent
// lookup (exact_tanh(Dual<T>) ...): no tag is written twice.
//
// Comparisons read the value part alone: a branch (relu's x <= 0) takes the
// side the plain value would take, and the tangent follows that side.
//
// Dual<P> with P a simd::Pack is a pack of dual numbers: the value parts of
// P::lanes consecutive Dual<T> in one pack, their tangents in another. The
// elementwise families' host loops (tags/family.hpp) run the tags' bodies on
// it as they run them on a Pack<T>, every lane doing a scalar Dual<T>'s
// operations: the same bits, a pack's speed. Its load and store take the
// parts apart and put them back together (two shuffles each way).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "grad/config.hpp"
#include "grad/numerics/choice.hpp"
#include "grad/numerics/exact_math.hpp"
#include "grad/numerics/simd.hpp"

GRAD_SIMD_DIAGNOSTICS_BEGIN

namespace grad {

// An arithmetic type other than T.
template <class U, class T>
concept OtherNumber = std::is_arithmetic_v<U> && !std::is_same_v<U, T>;

// What the parts of a dual number may be: float, double or a pack of one.
template <class T>
concept DualPart = Scalar<T> || simd::is_pack<T>;

template <DualPart T>
struct Dual;

namespace dual_detail {
// What a host loop asks of a pack (simd::Stream, map_streams): the element
// type and the lanes. Nothing for a scalar dual number.
template <class T>
struct Lanes {};
template <class E, std::size_t B>
struct Lanes<simd::Pack<E, B>> {
  using value_type = Dual<E>;
  static constexpr std::size_t lanes = B / sizeof(E);
};
}  // namespace dual_detail

template <DualPart T>
struct Dual : dual_detail::Lanes<T> {
  using scalar_type = T;
  T value = T(0);
  T tangent = T(0);

  constexpr Dual() = default;
  // A constant: tangent zero. Implicit, so a plain number (a tag's T(0.5),
  // a scalar operand) is a dual number wherever one is expected.
  constexpr Dual(T v) : value(v) {}  // NOLINT(google-explicit-constructor)
  constexpr Dual(T v, T t) : value(v), tangent(t) {}
  // Other arithmetic types convert to T first (a count in mean's n, a
  // double literal on a float tape: the bits T(x) gives the plain tape).
  template <OtherNumber<T> U>
  explicit constexpr Dual(U v) : value(static_cast<T>(v)) {}

  // The value part as another number type, explicitly: what a tag's body
  // does with an index or an integer test (an id, an integral exponent).
  // It drops the tangent, which is why only the ops whose tangents the
  // suite checks are recorded on a dual tape (grad/dual.hpp). Not bool: a
  // dual number is never a condition by accident.
  template <OtherNumber<bool> U>
  explicit constexpr operator U() const {
    return static_cast<U>(value);
  }

  // A pack of dual numbers: every lane s (a broadcast operand), and the
  // lanes of p[0], ..., p[lanes - 1] (load, store).
  template <class S>
    requires(simd::is_pack<T> && std::is_same_v<S, Dual<simd::element_t<T>>>)
  GRAD_INLINE Dual(S s) : value(s.value), tangent(s.tangent) {}  // NOLINT(google-explicit-constructor): a broadcast
  GRAD_INLINE static Dual load(const Dual<simd::element_t<T>>* p)
    requires simd::is_pack<T>
  {
    using V = typename T::V;
    V lo, hi;  // the parts of the first and the second half, interleaved
    std::memcpy(&lo, p, sizeof(V));
    std::memcpy(&hi, p + T::lanes / 2, sizeof(V));
#if defined(__GNUC__) && !defined(__clang__)
    return {T::raw(__builtin_shuffle(lo, hi, lane_order(0))), T::raw(__builtin_shuffle(lo, hi, lane_order(1)))};
#else
    Dual r;
    for (std::size_t j = 0; j < T::lanes; ++j) {
      const V& half = j < T::lanes / 2 ? lo : hi;
      r.value.v[j] = half[2 * (j % (T::lanes / 2))];
      r.tangent.v[j] = half[2 * (j % (T::lanes / 2)) + 1];
    }
    return r;
#endif
  }
  GRAD_INLINE void store(Dual<simd::element_t<T>>* p) const
    requires simd::is_pack<T>
  {
    using V = typename T::V;
#if defined(__GNUC__) && !defined(__clang__)
    const V lo = __builtin_shuffle(value.v, tangent.v, interleave_order(0));
    const V hi = __builtin_shuffle(value.v, tangent.v, interleave_order(T::lanes / 2));
#else
    V lo, hi;
    for (std::size_t j = 0; j < T::lanes; ++j) {
      V& half = j < T::lanes / 2 ? lo : hi;
      half[2 * (j % (T::lanes / 2))] = value.v[j];
      half[2 * (j % (T::lanes / 2)) + 1] = tangent.v[j];
    }
#endif
    std::memcpy(static_cast<void*>(p), &lo, sizeof(V));
    std::memcpy(static_cast<void*>(p + T::lanes / 2), &hi, sizeof(V));
  }

  // Hidden friends: found by argument-dependent lookup only, and they take a
  // T or a number where a Dual is expected (one conversion), as a tag's body
  // mixes them.
  friend constexpr Dual operator+(Dual a, Dual b) { return {a.value + b.value, a.tangent + b.tangent}; }
  friend constexpr Dual operator-(Dual a, Dual b) { return {a.value - b.value, a.tangent - b.tangent}; }
  friend constexpr Dual operator-(Dual a) { return {-a.value, -a.tangent}; }
  // (a b)' = a' b + a b', in that order.
  friend constexpr Dual operator*(Dual a, Dual b) {
    return {a.value * b.value, a.tangent * b.value + a.value * b.tangent};
  }
  // (a / b)' = (a' - q b') / b with q = a / b, the value itself.
  friend constexpr Dual operator/(Dual a, Dual b) {
    const T q = a.value / b.value;
    return {q, (a.tangent - q * b.tangent) / b.value};
  }
  friend constexpr bool operator==(Dual a, Dual b) { return a.value == b.value; }
  friend constexpr bool operator!=(Dual a, Dual b) { return a.value != b.value; }
  friend constexpr bool operator<(Dual a, Dual b) { return a.value < b.value; }
  friend constexpr bool operator<=(Dual a, Dual b) { return a.value <= b.value; }
  friend constexpr bool operator>(Dual a, Dual b) { return a.value > b.value; }
  friend constexpr bool operator>=(Dual a, Dual b) { return a.value >= b.value; }

  // a b + c with the value part's one rounding (fma_hd); tangent
  // a' b + a b' + c', each product rounded, summed left to right.
  friend Dual fma_hd(Dual a, Dual b, Dual c) {
    return {fma_hd(a.value, b.value, c.value), (a.tangent * b.value + a.value * b.tangent) + c.tangent};
  }

  // The exact tier. Each value part is exact_math.hpp's function of the
  // value part; each tangent reuses that value y where the derivative is a
  // function of it.
  friend Dual exact_exp(Dual x) {
    const T y = exact_exp(x.value);
    return {y, y * x.tangent};
  }
  friend Dual exact_log(Dual x) { return {exact_log(x.value), x.tangent / x.value}; }
  friend Dual exact_tanh(Dual x) {
    const T y = tanh_value(x.value);
    return {y, fma_hd(-y, y, T(1)) * x.tangent};  // 1 - y^2
  }
  friend Dual exact_sigmoid(Dual x) {
    const T y = exact_sigmoid(x.value);
    return {y, (y * (T(1) - y)) * x.tangent};
  }
  // The tangent alone (the tape refuses a scalar operand that has one).
  friend constexpr T tangent_of(Dual x) { return x.tangent; }

  // unary.hpp's sqrt_of: IEEE square root; (sqrt x)' = x' / (2 y).
  friend Dual sqrt_of(Dual x) {
    T y;
    if constexpr (simd::is_pack<T>)
      y = simd::sqrt(x.value);
    else
      y = std::sqrt(x.value);
    return {y, x.tangent / (y + y)};
  }

 private:
  // exact_tanh's value; on a pack whose lanes all take one arm, that arm
  // alone (as exact_tanh_packs skips work by blocks): the same operations
  // for every lane, so the same bits.
  GRAD_INLINE static T tanh_value(T x) {
    if constexpr (simd::is_pack<T>) {
      using namespace exact_math_detail;
      using E = simd::element_t<T>;
      const T a = magnitude_of<T>(x);
      if (!simd::any_at_least(a, E(Format<E>::tanh_split))) return tanh_finish<T>(x, tanh_near<T>(a));
      if (simd::all_at_least(a, E(Format<E>::tanh_split))) return tanh_finish<T>(x, tanh_far<T>(a));
    }
    return exact_tanh(x);
  }

  // The shuffles' lane indices (a pack's: its parts, from the two halves
  // of the interleaved memory; and back). Integer vectors of T's lane width.
  template <class I, std::size_t L, std::size_t... J>
  static constexpr auto indices(std::index_sequence<J...>, auto index) {
    typedef I M __attribute__((vector_size(L * sizeof(I))));
    return M{static_cast<I>(index(J))...};
  }
  using Index = std::conditional_t<sizeof(simd::element_t<T>) == 8, std::int64_t, std::int32_t>;
  // Part `part` (0 value, 1 tangent) of lane j sits at 2 j + part of lo ++ hi.
  static constexpr auto lane_order(std::size_t part) {
    constexpr std::size_t L = sizeof(T) / sizeof(simd::element_t<T>);
    return indices<Index, L>(std::make_index_sequence<L>{}, [part](std::size_t j) { return 2 * j + part; });
  }
  // Memory slot k of a half starting at lane `first`: lane first + k / 2's
  // value (k even, index into value) or tangent (k odd, index L + lane).
  static constexpr auto interleave_order(std::size_t first) {
    constexpr std::size_t L = sizeof(T) / sizeof(simd::element_t<T>);
    return indices<Index, L>(std::make_index_sequence<L>{},
                             [first](std::size_t k) { return (k % 2 ? L : 0) + first + k / 2; });
  }
};

// |x| as abs's body takes it (exact_math_detail::magnitude_of<T>, named
// with its type, so no lookup finds an overload): the value's sign bit
// cleared; the tangent times the sign of x (0 at 0, torch's sgn; NaN at NaN).
namespace exact_math_detail {
template <class T>
GRAD_HD GRAD_INLINE constexpr Dual<T> dual_magnitude(Dual<T> x) {
  return {magnitude_of<T>(x.value), x.value > 0    ? x.tangent
                                    : x.value < 0  ? -x.tangent
                                    : x.value == 0 ? T(0) * x.tangent
                                                   : x.value};
}
template <>
GRAD_HD GRAD_INLINE constexpr Dual<float> magnitude_of<Dual<float>>(Dual<float> x) {
  return dual_magnitude(x);
}
template <>
GRAD_HD GRAD_INLINE constexpr Dual<double> magnitude_of<Dual<double>>(Dual<double> x) {
  return dual_magnitude(x);
}
}  // namespace exact_math_detail

// Picks (numerics/choice.hpp): the value part the plain pick's; the tangent
// the picked input's, and at a tie the mean of the tied inputs' tangents
// (torch's forward mode: maximum's (a' + b') / 2, amax's mean over the ties;
// a NaN lane's is 0 / 0, as torch's).
namespace choice {
// The pick of a or b (the plain pick's value, so its bits), with a's tangent
// when the plain pick is a.
template <class T>
GRAD_HD GRAD_INLINE constexpr Dual<T> dual_pick(Dual<T> a, Dual<T> b, bool picks_a) {
  const T tangent = a.value == b.value ? (a.tangent + b.tangent) / T(2) : picks_a ? a.tangent : b.tangent;
  return {picks_a ? a.value : b.value, tangent};
}
template <>
GRAD_HD GRAD_INLINE constexpr Dual<float> larger<Dual<float>>(Dual<float> a, Dual<float> b) {
  return dual_pick(a, b, larger_is_first(a.value, b.value));
}
template <>
GRAD_HD GRAD_INLINE constexpr Dual<double> larger<Dual<double>>(Dual<double> a, Dual<double> b) {
  return dual_pick(a, b, larger_is_first(a.value, b.value));
}
template <>
GRAD_HD GRAD_INLINE constexpr Dual<float> smaller<Dual<float>>(Dual<float> a, Dual<float> b) {
  return dual_pick(a, b, smaller_is_first(a.value, b.value));
}
template <>
GRAD_HD GRAD_INLINE constexpr Dual<double> smaller<Dual<double>>(Dual<double> a, Dual<double> b) {
  return dual_pick(a, b, smaller_is_first(a.value, b.value));
}
template <class T>
GRAD_HD GRAD_INLINE constexpr Dual<T> dual_of_lane(Dual<T> best, const Dual<T>* x, std::size_t n, std::size_t stride) {
  T sum = T(0), count = T(0);
  for (std::size_t i = 0; i < n; ++i)
    if (x[i * stride].value == best.value) {
      sum = sum + x[i * stride].tangent;
      count = count + T(1);
    }
  return {best.value, sum / count};
}
template <>
GRAD_HD GRAD_INLINE constexpr Dual<float> of_lane<Dual<float>>(Dual<float> best, const Dual<float>* x, std::size_t n,
                                                             std::size_t stride) {
  return dual_of_lane(best, x, n, stride);
}
template <>
GRAD_HD GRAD_INLINE constexpr Dual<double> of_lane<Dual<double>>(Dual<double> best, const Dual<double>* x,
                                                               std::size_t n, std::size_t stride) {
  return dual_of_lane(best, x, n, stride);
}
}  // namespace choice

template <class T>
inline constexpr bool is_dual_v = false;
template <class T>
inline constexpr bool is_dual_v<Dual<T>> = true;

// A tape over dual numbers is a tape (contract.hpp's extension point).
template <Scalar T>
inline constexpr bool is_tape_scalar_v<Dual<T>> = true;

// A host loop over dual numbers runs on packs of them.
namespace simd {
template <Scalar E, std::size_t B>
struct pack_of<Dual<E>, B> {
  using type = Dual<Pack<E, B>>;
};
template <Scalar E, std::size_t B>
inline constexpr bool is_pack<Dual<Pack<E, B>>> = true;
}  // namespace simd

}  // namespace grad

GRAD_SIMD_DIAGNOSTICS_END

// The value part's limits; quiet_NaN() (Tape::scalar's "no value") NaN in both parts.
namespace std {
template <class T>
struct numeric_limits<grad::Dual<T>> : numeric_limits<T> {  // T's range and digits (read by the id checks)
  static constexpr grad::Dual<T> quiet_NaN() noexcept {
    return {numeric_limits<T>::quiet_NaN(), numeric_limits<T>::quiet_NaN()};
  }
};
}  // namespace std
