// The ops whose value is one of their inputs, maximum, minimum and max / min
// over an axis, pick it through these functions, so that a dual number
// (numerics/dual.hpp, which specializes them) can give the tangent where the
// pick is a tie. There the function has no derivative and the tangent is a
// convention: torch's forward mode's, the mean of the tied inputs' tangents
// (the even split the plain backward makes of the gradient). For a plain
// number they are the tags' choices and nothing more. Named with their type
// at each call, as exact_math's functions are: no lookup finds an overload.
#pragma once

#include <cstddef>

#include "grad/config.hpp"
#include "grad/numerics/simd.hpp"  // GRAD_INLINE

namespace grad::choice {

// Whether torch.maximum's value is a: a NaN a is kept, else a NaN b (a >
// NaN is false). The one statement of the rule: the dual picks read it too.
template <class T>
GRAD_HD GRAD_INLINE constexpr bool larger_is_first(T a, T b) {
  return a != a || a > b;
}
// torch.minimum's (the same NaN rule).
template <class T>
GRAD_HD GRAD_INLINE constexpr bool smaller_is_first(T a, T b) {
  return a != a || a < b;
}
// The larger of a and b, torch.maximum's value.
template <class T>
GRAD_HD GRAD_INLINE constexpr T larger(T a, T b) {
  return larger_is_first(a, b) ? a : b;
}
// The smaller, torch.minimum's value.
template <class T>
GRAD_HD GRAD_INLINE constexpr T smaller(T a, T b) {
  return smaller_is_first(a, b) ? a : b;
}
// `best`, the extreme a lane's forward picked among x[0], x[stride], ...,
// x[(n - 1) stride]; a dual number's tangent becomes the mean of the
// tangents of the values equal to it.
template <class T>
GRAD_HD GRAD_INLINE constexpr T of_lane(T best, const T*, std::size_t, std::size_t) {
  return best;
}

}  // namespace grad::choice
