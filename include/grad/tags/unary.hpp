// Pointwise nonlinearities. Backward reuses the forward value y where the
// derivative is a function of it (sigmoid, tanh, exp, sqrt).
#pragma once

#include <cmath>
#include <string_view>

#include "grad/numerics/exact_math.hpp"
#include "grad/tags/family.hpp"

namespace grad {

// IEEE square root (correctly rounded) of a scalar or, on the host, of every lane of a pack.
template <class T>
GRAD_HD GRAD_INLINE inline T sqrt_of(T x) {
#if GRAD_SIMD
  if constexpr (simd::is_pack<T>) return simd::sqrt(x);
#endif
  if constexpr (!simd::is_pack<T>) return std::sqrt(x);
}

// NaN propagates, as in PyTorch's forward: relu(NaN) = NaN, and its gradient
// is NaN too (PyTorch gives 0 there), so a NaN input never turns into a
// finite gradient that hides it. relu(-0) = +0; the gradient at 0 is 0.
struct Relu : Unary<Relu> {
  static constexpr std::string_view name = "relu";
  static constexpr std::string_view torch = "torch.relu(a)";
  template <class T>
  GRAD_HD static T forward(T x, T) {
    return x <= T(0) ? T(0) : x;
  }
  template <class T>
  GRAD_HD static T backward(T x, T, T g, T) {
    return x > T(0) ? g : x <= T(0) ? T(0) : x;
  }
};

struct Sqrt : Unary<Sqrt> {
  static constexpr std::string_view name = "sqrt";
  static constexpr std::string_view torch = "torch.sqrt(a)";
  static constexpr bool packs = true;
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T x, T) {
    return sqrt_of(x);
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward(T, T y, T g, T) {
    return g / (y + y);
  }
};

// sigmoid, tanh, exp and log: exact_math.hpp computes them
// with + - * / only, so every backend rounds them identically.
struct Sigmoid : Unary<Sigmoid> {
  static constexpr std::string_view name = "sigmoid";
  static constexpr std::string_view torch = "torch.sigmoid(a)";
  static constexpr bool packs = true;
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T x, T) {
    return exact_sigmoid(x);
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward(T, T y, T g, T) {
    return g * (y * (T(1) - y));
  }
};

struct Tanh : Unary<Tanh> {
  static constexpr std::string_view name = "tanh";
  static constexpr std::string_view torch = "torch.tanh(a)";
  static constexpr bool packs = true;
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T x, T) {
    return exact_tanh(x);
  }
  // The host's loop on packs P: skips the arm a block of elements does not need.
  template <class P, class T>
  static void forward_array(const T* x, T* y, std::size_t n, T) {
    exact_tanh_packs<P>(x, y, n);
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward(T, T y, T g, T) {
    return g * fma_hd(-y, y, T(1));  // 1 - y^2, one rounding
  }
};

// GELU, tanh form (as torch's approximate='tanh'):
//   y = 0.5 x (1 + t),  t = tanh(c (x + k x^3)),  c = sqrt(2/pi), k = 0.044715
//   dy/dx = 0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3k x^2)
// Backward recomputes t from x (one exact_tanh) rather than keeping it.
struct Gelu : Unary<Gelu> {
  static constexpr std::string_view name = "gelu";
  static constexpr std::string_view torch = "torch.nn.functional.gelu(a, approximate='tanh')";
  static constexpr bool packs = true;
  template <class T>
  GRAD_HD GRAD_INLINE static T inner(T x) {
    return T(0.7978845608028654) * fma_hd(T(0.044715), x * x * x, x);
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T x, T) {
    return T(0.5) * x * (T(1) + exact_tanh(inner(x)));
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward(T x, T, T g, T) {
    const T t = exact_tanh(inner(x));
    const T slope = T(0.7978845608028654) * fma_hd(T(0.134145), x * x, T(1));
    return g * fma_hd(T(0.5) * x, fma_hd(-t, t, T(1)) * slope, T(0.5) * (T(1) + t));
  }
};

struct Exp : Unary<Exp> {
  static constexpr std::string_view name = "exp";
  static constexpr std::string_view torch = "torch.exp(a)";
  static constexpr bool packs = true;
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T x, T) {
    return exact_exp(x);
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward(T, T y, T g, T) {
    return g * y;
  }
};

struct Log : Unary<Log> {
  static constexpr std::string_view name = "log";
  static constexpr std::string_view torch = "torch.log(a)";
  static constexpr bool packs = true;
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T x, T) {
    return exact_log(x);
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward(T x, T, T g, T) {
    return g / x;
  }
};

}  // namespace grad
