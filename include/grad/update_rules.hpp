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

// SGD with momentum, torch.optim.SGD's formulas: the buffer starts as the
// parameter's first gradient (`first`), then buf = momentum * buf +
// (1 - dampening) * g; the step follows the buffer, or with Nesterov
// g + momentum * buf.
struct SgdMomentumRule {
  template <class T>
  GRAD_HD static T update(T w, T& buf, T g, T lr, T momentum, T one_minus_dampening, bool first, bool nesterov) {
    buf = first ? g : fma_hd(momentum, buf, one_minus_dampening * g);
    const T direction = nesterov ? fma_hd(momentum, buf, g) : buf;
    return fma_hd(-lr, direction, w);
  }
};

// Where Adam adds eps (opt.hpp): `efficient` to the uncorrected root, the
// bias correction folded into the step size (the Adam paper's efficient
// form, grad's default); `pytorch` to the bias-corrected root, as
// torch.optim.Adam, AdamW and llm.c do.
enum class AdamForm : unsigned char { efficient = 0, pytorch = 1 };

// Per-step constants, computed once (host or device) from the running powers.
template <class T>
struct AdamStepConstants {
  T step_size;     // efficient: lr * sqrt(1 - b2^t) / (1 - b1^t); pytorch: lr / (1 - b1^t)
  T one_minus_b1;  // 1 - b1
  T one_minus_b2;  // 1 - b2
  // The root's divisor: pytorch sqrt(1 - b2^t); efficient 1, which leaves
  // sqrt(v) / 1 == sqrt(v) exactly, so the efficient form keeps its bits.
  T root_correction = T(1);
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
  GRAD_HD static AdamStepConstants<T> constants(T lr, T beta1, T beta2, T beta1_power, T beta2_power, AdamForm form) {
    if (form == AdamForm::efficient) return constants(lr, beta1, beta2, beta1_power, beta2_power);
    return {lr / (T(1) - beta1_power), T(1) - beta1, T(1) - beta2, std::sqrt(T(1) - beta2_power)};
  }
  // AdamW's decoupled weight decay, torch's w * (1 - lr * weight_decay): the
  // factor `decay` that update() multiplies w by (1 without decay: exact).
  template <class T>
  GRAD_HD static T decay_factor(T lr, T weight_decay) {
    return T(1) - lr * weight_decay;
  }
  template <class T>
  GRAD_HD static void update(T& w, T& m, T& v, T g, T beta1, T beta2, T eps, const AdamStepConstants<T>& c,
                             T decay = T(1)) {
    m = fma_hd(beta1, m, c.one_minus_b1 * g);
    v = fma_hd(beta2, v, c.one_minus_b2 * (g * g));
    w = fma_hd(-c.step_size, m / (std::sqrt(v) / c.root_correction + eps), w * decay);
  }
};

}  // namespace grad
