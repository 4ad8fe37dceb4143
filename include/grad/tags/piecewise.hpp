// Ops that pick between their arguments: abs, clamp_min / clamp_max (what
// grad::clamp records), maximum / minimum, and where_true / where_false
// (what grad::where records). Every value is one of the inputs, bit for bit,
// so there is nothing to round; the gradient conventions at the kinks and
// ties are PyTorch's, each stated at its tag (test_op_cases checks them
// against float64 PyTorch on purpose-built ties).
//
// The functors branch on data (?:), so these run element by element rather
// than as vector packs (no `packs`): a pack has no ?:.
#pragma once

#include <string_view>

#include "grad/numerics/choice.hpp"
#include "grad/numerics/exact_math.hpp"
#include "grad/tags/family.hpp"

namespace grad {

// |x|, the sign bit cleared (abs(-0) = +0, abs(-NaN) = NaN, as torch).
// Gradient g * sgn(x), as torch's abs backward: sgn(0) = 0, so the
// gradient at 0 is 0 (times g: an infinite g there gives NaN, as in torch);
// at a NaN input it is NaN (torch gives 0 there; this follows relu's rule,
// so a NaN never hides behind a finite gradient).
struct Abs : Unary<Abs> {
  static constexpr std::string_view name = "abs";
  static constexpr std::string_view torch = "torch.abs(a)";
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T x, T) {
    return exact_math_detail::magnitude_of<T>(x);
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T sign(T x) {
    return x > T(0) ? T(1) : x < T(0) ? T(-1) : x == T(0) ? T(0) : x;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward(T x, T, T g, T) {
    return g * sign(x);
  }
};

// max(x, s): x below s becomes s; NaN stays NaN (as torch.clamp_min). The
// gradient passes where x >= s (inclusive, as torch) and is 0 below; at a
// NaN input it is NaN (torch gives 0 there; this follows relu's rule, so a
// NaN never hides behind a finite gradient). grad::clamp(x, lo, hi) records
// clamp_max(clamp_min(x, lo), hi): torch.clamp's value, and its gradient,
// which passes exactly where lo <= x <= hi.
struct ClampMin : Unary<ClampMin> {
  static constexpr std::string_view name = "clamp_min";
  static constexpr std::string_view torch = "torch.clamp_min(a, s)";
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T x, T s) {
    return x < s ? s : x;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward(T x, T, T g, T s) {
    return x >= s ? g : x < s ? T(0) : x;
  }
};

// min(x, s), the mirror of ClampMin: the gradient passes where x <= s.
struct ClampMax : Unary<ClampMax> {
  static constexpr std::string_view name = "clamp_max";
  static constexpr std::string_view torch = "torch.clamp_max(a, s)";
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T x, T s) {
    return x > s ? s : x;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward(T x, T, T g, T s) {
    return x <= s ? g : x > s ? T(0) : x;
  }
};

// The larger of a and b elementwise, with numpy broadcasting; NaN in either
// gives NaN (as torch.maximum). Gradient, torch's rule: all of g to the
// larger operand, g / 2 to each on a tie (a NaN pair gives g to both, as torch).
// A tie of +0 and -0 gives b (torch's sign there depends on its vector path).
struct Maximum : Binary<Maximum> {
  static constexpr std::string_view name = "maximum";
  static constexpr std::string_view torch = "torch.maximum(a, b)";
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T a, T b) {
    return choice::larger<T>(a, b);
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_a(T a, T b, T, T g) {
    return a < b ? T(0) : a == b ? g / T(2) : g;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_b(T a, T b, T, T g) {
    return a > b ? T(0) : a == b ? g / T(2) : g;
  }
};

// The smaller of a and b: Maximum's mirror (torch.minimum, same tie rule).
struct Minimum : Binary<Minimum> {
  static constexpr std::string_view name = "minimum";
  static constexpr std::string_view torch = "torch.minimum(a, b)";
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T a, T b) {
    return choice::smaller<T>(a, b);
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_a(T a, T b, T, T g) {
    return a > b ? T(0) : a == b ? g / T(2) : g;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_b(T a, T b, T, T g) {
    return a < b ? T(0) : a == b ? g / T(2) : g;
  }
};

// where_true(c, x) = x where c != 0, else -0; where_false(c, x) = x where
// c == 0, else -0 (a NaN mask element counts as true, as torch's bool()).
// grad::where(c, a, b) records where_true(c, a) + where_false(c, b): each
// element is one chosen value plus -0, and v + (-0) = v for every v (+0,
// -0, inf and NaN included), so the sum is torch.where's value bit for bit.
// The mask c is a constant (grad::where refuses one that needs a gradient);
// its own gradient is 0.
struct WhereTrue : Binary<WhereTrue> {
  static constexpr std::string_view name = "where_true";
  static constexpr std::string_view torch = "torch.where(a != 0, b, torch.tensor(-0.0, dtype=b.dtype))";
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T c, T x) {
    return c != T(0) ? x : T(-0.0);
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_a(T, T, T, T) {
    return T(0);
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_b(T c, T, T, T g) {
    return c != T(0) ? g : T(0);
  }
};

struct WhereFalse : Binary<WhereFalse> {
  static constexpr std::string_view name = "where_false";
  static constexpr std::string_view torch = "torch.where(a == 0, b, torch.tensor(-0.0, dtype=b.dtype))";
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T c, T x) {
    return c == T(0) ? x : T(-0.0);
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_a(T, T, T, T) {
    return T(0);
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_b(T c, T, T, T g) {
    return c == T(0) ? g : T(0);
  }
};

}  // namespace grad
