// Fused elementwise pairs that real models record at full activation size:
// one node where the composite kept two or three, each a full pass with its
// own value and gradient buffers (a Qwen2.5-0.5B MLP's [512, 4864] per node:
// 19 MiB of a recompute scope). Both keep the composite's bits: the bodies
// below perform its roundings in its order.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>

#include "grad/tags/family.hpp"
#include "grad/tags/unary.hpp"  // Sigmoid

namespace grad {

// a + b * s: the bits of add(a, mul_scalar(b, s)) (LoRA's x.w0 + scale *
// (x.A).B, PEFT's order). Gradients g and g * s, as add and mul_scalar
// hand them down; for a b broadcast against a the composite summed g over
// the broadcast rows and then scaled, the node sums g * s.
struct AddScaled : Binary<AddScaled> {
  static constexpr std::string_view name = "add_scaled";
  static constexpr std::string_view torch = "a + b * s";
  static constexpr bool packs = true;
  static constexpr std::array<std::uint8_t, 2> backward_reads{0, 0};  // g and s alone
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T a, T b, T s) {
    return a + b * s;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_a(T, T, T, T g, T) {
    return g;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_b(T, T, T, T g, T s) {
    return g * s;
  }
};

// silu(a) * b = (a * sigmoid(a)) * b, SwiGLU's gated unit: the bits of
// mul(mul(a, sigmoid(a)), b). The sigmoid is computed again in backward
// instead of stored. a's gradient is the composite's two contributions in
// the order its reverse walk adds them: mul's (d silu * sigmoid) first, then
// sigmoid's; so the node gives the composite's bits whenever a has no other
// consumer and is not broadcast (an MLP's gate). Where it has, the composite
// added the two one by one to what the later consumers had left, the node
// adds their sum once; a broadcast a: the composite summed d silu over the
// broadcast rows before the two terms, the node sums the terms.
struct SiluMul : Binary<SiluMul> {
  static constexpr std::string_view name = "silu_mul";
  static constexpr std::string_view torch = "a * torch.sigmoid(a) * b";
  static constexpr bool packs = true;
  template <class T>
  GRAD_HD GRAD_INLINE static T forward(T a, T b) {
    return (a * exact_sigmoid(a)) * b;
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_a(T a, T b, T, T g) {
    const T sig = exact_sigmoid(a);
    const T d_silu = g * b;
    return d_silu * sig + Sigmoid::backward(a, sig, d_silu * a, T(0));
  }
  template <class T>
  GRAD_HD GRAD_INLINE static T backward_b(T a, T, T, T g) {
    return g * (a * exact_sigmoid(a));
  }
};

}  // namespace grad
