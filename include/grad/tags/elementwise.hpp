// Arithmetic: broadcasting binary ops, negation and the scalar forms.
// IEEE + - * / are correctly rounded on every backend.
// Every tag here takes simd packs as well as scalars (packs = true): the
// host loops run them on whole vectors (family.hpp).
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "grad/tags/family.hpp"

namespace grad {

struct Add : Binary<Add> {
  static constexpr std::string_view name = "add";
  static constexpr std::string_view torch = "a + b";
  static constexpr bool packs = true;
  static constexpr std::array<std::uint8_t, 2> backward_reads{0, 0};  // g alone
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T a, T b) {
    return a + b;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_a(T, T, T, T g) {
    return g;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_b(T, T, T, T g) {
    return g;
  }
};

struct Sub : Binary<Sub> {
  static constexpr std::string_view name = "sub";
  static constexpr std::string_view torch = "a - b";
  static constexpr bool packs = true;
  static constexpr std::array<std::uint8_t, 2> backward_reads{0, 0};  // g alone
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T a, T b) {
    return a - b;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_a(T, T, T, T g) {
    return g;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_b(T, T, T, T g) {
    return -g;
  }
};

struct Mul : Binary<Mul> {
  static constexpr std::string_view name = "mul";
  static constexpr std::string_view torch = "a * b";
  static constexpr bool packs = true;
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T a, T b) {
    return a * b;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_a(T, T b, T, T g) {
    return g * b;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_b(T a, T, T, T g) {
    return g * a;
  }
};

struct Div : Binary<Div> {
  static constexpr std::string_view name = "div";
  static constexpr std::string_view torch = "a / b";
  static constexpr bool packs = true;
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T a, T b) {
    return a / b;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_a(T, T b, T, T g) {
    return g / b;
  }
  // d(a/b)/db = -a/b^2, written as -(y/b) so that it reuses the forward value.
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_b(T, T b, T y, T g) {
    return -(g * (y / b));
  }
};

struct Neg : Unary<Neg> {
  static constexpr std::string_view name = "neg";
  static constexpr std::string_view torch = "-a";
  static constexpr bool packs = true;
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T x, T) {
    return -x;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward(T, T, T g, T) {
    return -g;
  }
};

// a + s (and a - s, recorded as a + (-s), which IEEE rounds identically).
struct AddScalar : Unary<AddScalar> {
  static constexpr std::string_view name = "add_scalar";
  static constexpr std::string_view torch = "a + s";
  static constexpr bool packs = true;
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T x, T s) {
    return x + s;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward(T, T, T g, T) {
    return g;
  }
};

struct MulScalar : Unary<MulScalar> {
  static constexpr std::string_view name = "mul_scalar";
  static constexpr std::string_view torch = "a * s";
  static constexpr bool packs = true;
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T x, T s) {
    return x * s;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward(T, T, T g, T s) {
    return g * s;
  }
};

struct DivScalar : Unary<DivScalar> {
  static constexpr std::string_view name = "div_scalar";
  static constexpr std::string_view torch = "a / s";
  static constexpr bool packs = true;
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T x, T s) {
    return x / s;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward(T, T, T g, T s) {
    return g / s;
  }
};

// s - a
struct ScalarSub : Unary<ScalarSub> {
  static constexpr std::string_view name = "scalar_sub";
  static constexpr std::string_view torch = "s - a";
  static constexpr bool packs = true;
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T x, T s) {
    return s - x;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward(T, T, T g, T) {
    return -g;
  }
};

// s / a
struct ScalarDiv : Unary<ScalarDiv> {
  static constexpr std::string_view name = "scalar_div";
  static constexpr std::string_view torch = "s / a";
  static constexpr bool packs = true;
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T x, T s) {
    return s / x;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward(T x, T y, T g, T) {
    return -(g * (y / x));
  }
};

}  // namespace grad
