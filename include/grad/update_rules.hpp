// The optimizers' per-element rules (opt.hpp documents one step exactly):
// GRAD_HD, free of the tape, so that the host loops (update.hpp), the CPU
// backend and CUDA call the same functions and land on the same bits. Each
// a*b + c of a rule is one explicit fma (fma_hd: std::fma / __fma_rn; on the
// host's vector packs simd::fma_hd, found by argument-dependent lookup), the
// determinism contract's rule 1.
#pragma once

#include <cmath>
#include <cstddef>

#include "grad/config.hpp"
#include "grad/numerics/fixed_order.hpp"

namespace grad {

// Global-norm clipping, split into the pieces a device reduction needs.
struct ClipRule {
  // One parameter's share of the squared norm, in the documented order.
  template <class T>
  GRAD_HD static T squares(const T* g, std::size_t n) {
    return sum_fixed(g, n, fixed_order::Square{});
  }
  // Adds a parameter's share (parameters in add order, from zero).
  template <class T>
  GRAD_HD static T accumulate(T acc, T share) {
    return acc + share;
  }
  // The factor every gradient is multiplied by; 1 when clipping is off
  // (max_norm == 0) or the norm is within bounds.
  template <class T>
  GRAD_HD static T scale(T sum_of_squares, T max_norm) {
    const T norm = std::sqrt(sum_of_squares);
    return max_norm > T(0) && norm > max_norm ? max_norm / norm : T(1);
  }
  // The gradient the rules see: clipped raw gradient plus L2 decay.
  template <class T>
  GRAD_HD static T effective(T grad, T w, T scale, T l2) {
    return fma_hd(grad, scale, l2 * w);
  }
};

struct SgdRule {
  template <class T>
  GRAD_HD static T update(T w, T g, T lr) {
    return fma_hd(-lr, g, w);  // w - lr * g, one rounding
  }
};

// Per-step constants, computed once (host or device) from the running powers.
template <class T>
struct AdamStepConstants {
  T step_size;     // lr * sqrt(1 - b2^t) / (1 - b1^t)
  T one_minus_b1;  // 1 - b1
  T one_minus_b2;  // 1 - b2
};

struct AdamRule {
  // Advances the running powers b1^t, b2^t by one step.
  template <class T>
  GRAD_HD static void advance(T& beta1_power, T& beta2_power, T beta1, T beta2) {
    beta1_power = beta1_power * beta1;
    beta2_power = beta2_power * beta2;
  }
  template <class T>
  GRAD_HD static AdamStepConstants<T> constants(T lr, T beta1, T beta2, T beta1_power, T beta2_power) {
    return {lr * std::sqrt(T(1) - beta2_power) / (T(1) - beta1_power), T(1) - beta1, T(1) - beta2};
  }
  template <class T>
  GRAD_HD static void update(T& w, T& m, T& v, T g, T beta1, T beta2, T eps, const AdamStepConstants<T>& c) {
    m = fma_hd(beta1, m, c.one_minus_b1 * g);
    v = fma_hd(beta2, v, c.one_minus_b2 * (g * g));
    w = fma_hd(-c.step_size, m / (std::sqrt(v) + eps), w);
  }
};

}  // namespace grad
