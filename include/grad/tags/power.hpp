// x^s for a scalar exponent (pow_scalar) and a^b elementwise with numpy
// broadcasting (pow), both through power_of: no libm pow, so every backend
// lands on the same bits.
#pragma once

#include <string_view>

#include "grad/numerics/exact_math.hpp"
#include "grad/tags/family.hpp"
#include "grad/tags/unary.hpp"

namespace grad {

// x^s, exactly as every engine computes it:
//   - s = 0.5, -0.5: the correctly rounded sqrt, 1 / sqrt (torch's own
//     special cases);
//   - s an integer with |s| <= 2^20: x^|s| by binary powering (x * x for 2,
//     x * (x * x) for 3: torch's bits there), 1 / x^|s| for s < 0. Negative
//     bases work (the sign of (-2)^3 is the product's), and x^0 = 1 even for
//     a NaN or infinite x, as std::pow;
//   - 1^s = 1 for every s, NaN and inf included, as std::pow;
//   - an integer s with |s| > 2^20 (every value from 2^53 on, 2^24 for
//     float, is an even integer) and s = +-inf (even, as std::pow counts
//     it): |x|^s = exp(s ln|x|) with x's sign for an odd s, and 1 for
//     |x| = 1 (so (-1)^inf = 1, (-0.999999)^2000001 = -0.135,
//     (-2.5)^-inf = 0, (-3)^1048577 = -inf, not NaN);
//   - otherwise exp(s ln x) with exact_math's exp and log: NaN for x < 0,
//     0 or inf for x = 0 by the sign of s (ln 0 = -inf), as std::pow.
// Only comparisons, exact casts, negation and exact_math's exp and log, so
// every backend lands on the same bits. Within a few ulp of the true power
// for moderate s ln x, so float64 PyTorch agrees to 1e-12.
template <class T>
GRAD_HD inline T power_of(T x, T s) {
  if (s == T(0.5)) return sqrt_of(x);
  if (s == T(-0.5)) return T(1) / sqrt_of(x);
  // 1^s = 1 even for s = NaN or inf, where exp(s * 0) is NaN. Only there: a
  // finite s takes the paths below, which give exactly 1 at x = 1 (a product
  // of ones, exp(s * 0)) and, on a dual tape, the tangent s x' that an early
  // return drops (test_second_order's torch check found it).
  if (x == T(1) && !(s - s == s - s)) return T(1);
  const T limit = T(1 << 20);
  const T magnitude = s < T(0) ? -s : s;
  if (magnitude <= limit && static_cast<T>(static_cast<long>(magnitude)) == magnitude) {
    unsigned long n = static_cast<unsigned long>(magnitude);
    T result = T(1), base = x;
    bool first = true;
    while (n != 0) {
      if (n & 1ul) {
        result = first ? base : result * base;
        first = false;
      }
      n >>= 1;
      if (n != 0) base = base * base;
    }
    return s < T(0) ? T(1) / result : result;
  }
  // From here on every value is an even integer (and inf counts as one).
  const T all_even = sizeof(T) == sizeof(float) ? T(16777216.0f) : T(9007199254740992.0);
  bool integral = magnitude >= all_even, odd = false;
  if (!integral && magnitude == magnitude) {  // finite, below 2^53: the cast is exact
    const unsigned long long n = static_cast<unsigned long long>(magnitude);
    integral = static_cast<T>(n) == magnitude;
    odd = integral && (n & 1ull) != 0;
  }
  if (!integral) return exact_exp(s * exact_log(x));  // NaN for x < 0 and for s = NaN
  const bool negative = x < T(0) || (x == T(0) && T(1) / x < T(0));  // -0 too: (-0)^odd = -0
  const T size = negative ? -x : x;
  // |x| = 1: exp(s * 0) = 1 for a finite s (and, on a dual tape, the
  // tangent s x'); an infinite s would make it exp(NaN), so 1 there.
  const T r = size == T(1) && !(s - s == s - s) ? T(1) : exact_exp(s * exact_log(size));
  return odd && negative ? -r : r;
}

// s = +inf or -inf (not NaN): the exponent at which a power is a step in x.
template <class T>
GRAD_HD inline bool infinite_exponent(T s) {
  return s == s && s - s != s - s;
}

// x^s, s the node's scalar. Gradient g * (s x^(s-1)), and 0 for s = 0 (torch's
// rule: x^0 is constant even at x = 0, where s x^(s-1) would be 0 * inf)
// and for s = +-inf (x^inf is 0, 1 or inf: constant in x but at |x| = 1,
// where its jump gets 0, as relu's kink does; the formula gives inf * 0 =
// NaN or inf there). At x = 0 the rest follows the formula, as in torch: 0
// for s > 1, g for s = 1, inf for 0 < s < 1; a NaN s gives NaN.
struct PowScalar : Unary<PowScalar> {
  static constexpr std::string_view name = "pow_scalar";
  static constexpr std::string_view torch = "torch.pow(a, s)";
  template <class T>
  GRAD_HD static T forward(T x, T s) {
    return power_of(x, s);
  }
  template <class T>
  GRAD_HD static T backward(T x, T, T g, T s) {
    return s == T(0) || infinite_exponent(s) ? T(0) : g * (s * power_of(x, s - T(1)));
  }
};

// a^b elementwise with broadcasting. Gradients, torch's rules:
//   d/da = g * (b a^(b-1)), 0 where b = 0 or b = +-inf (as pow_scalar);
//   d/db = g * (a^b ln a), 0 where a = 0 and b >= 0 (torch's choice; -inf
//          where a = 0 and b < 0, NaN for a < 0, from the formula).
struct Pow : Binary<Pow> {
  static constexpr std::string_view name = "pow";
  static constexpr std::string_view torch = "torch.pow(a, b)";
  template <class T>
  GRAD_HD static T forward(T a, T b) {
    return power_of(a, b);
  }
  template <class T>
  GRAD_HD static T backward_a(T a, T b, T, T g) {
    return b == T(0) || infinite_exponent(b) ? T(0) : g * (b * power_of(a, b - T(1)));
  }
  template <class T>
  GRAD_HD static T backward_b(T a, T b, T y, T g) {
    return a == T(0) && b >= T(0) ? T(0) : g * (y * exact_log(a));
  }
};

}  // namespace grad
