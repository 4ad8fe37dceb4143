// The optimizers' element loops (opt.hpp documents the update), written on
// simd packs so that their speed does not depend on the consumer's -O level,
// and kept out of line so that the compiled kernel library can hold them
// (kernels_extern.hpp). The rule structs come in as template arguments
// (Clip = ClipRule, Rule = SgdRule or AdamRule): this header does not need
// opt.hpp, and opt.hpp stays the one place that defines the math.
#pragma once

#include <cstddef>

#include "grad/numerics/isa.hpp"
#include "grad/numerics/simd.hpp"

GRAD_SIMD_DIAGNOSTICS_BEGIN

namespace grad::kernels {

// w[i] = Rule::update(w[i], Clip::effective(g[i], w[i], scale, l2), lr).
// Parameters and gradients never overlap.
template <class Clip, class Rule, class T>
void sgd_update(T* __restrict w, const T* __restrict g, std::size_t n, T scale, T l2, T lr) {
  with_best_isa([&](auto width) {
#if GRAD_SIMD
    using P = simd::Pack<T, decltype(width)::bytes>;
    // The rules are plain arithmetic, so they take packs as they are.
    simd::map_streams<P, true>(
        n, w, [&](P wv, P gv) GRAD_INLINE { return Rule::update(wv, Clip::effective(gv, wv, P(scale), P(l2)), P(lr)); },
        simd::Stream<P, true>{g});
#else
    (void)width;
    for (std::size_t i = 0; i < n; ++i) w[i] = Rule::update(w[i], Clip::effective(g[i], w[i], scale, l2), lr);
#endif
  });
}

// SgdMomentumRule over a parameter (Rule::update with its buffer); plain
// loops: the rule's choices (first step, Nesterov) are per parameter.
template <class Clip, class Rule, class T>
void sgd_momentum_update(T* __restrict w, T* __restrict buf, const T* __restrict g, std::size_t n, T scale, T l2, T lr,
                         T momentum, T one_minus_dampening, bool first, bool nesterov) {
  for (std::size_t i = 0; i < n; ++i)
    w[i] = Rule::update(w[i], buf[i], Clip::effective(g[i], w[i], scale, l2), lr, momentum, one_minus_dampening, first,
                        nesterov);
}

// Rule::update(w[i], m[i], v[i], Clip::effective(g[i], w[i], scale, l2),
// beta1, beta2, eps, c, decay) for i < n (decay: AdamW's factor, 1 without).
// Parameters, moments and gradients never overlap.
template <class Clip, class Rule, class T, class Constants>
void adam_update(T* __restrict w, T* __restrict m, T* __restrict v, const T* __restrict g, std::size_t n, T scale, T l2,
                 T beta1, T beta2, T eps, const Constants& c, T decay) {
  with_best_isa([&](auto width) {
    std::size_t i = 0;
#if GRAD_SIMD
    using P = simd::Pack<T, decltype(width)::bytes>;
    constexpr std::size_t L = P::lanes;
    const P b1(beta1), b2(beta2), e(eps), one_minus_b1(c.one_minus_b1), one_minus_b2(c.one_minus_b2), step(c.step_size),
        root(c.root_correction), factor(decay);
    for (; i + L <= n; i += L) {
      const P wv = P::load(w + i);
      const P gv = Clip::effective(P::load(g + i), wv, P(scale), P(l2));
      // AdamRule::update lane by lane, in its order (opt.hpp); its one
      // library call, sqrt, is the vector instruction here (same IEEE
      // result). test_gemm checks these bits against the rule's.
      const P mv = simd::fma(b1, P::load(m + i), one_minus_b1 * gv);
      const P vv = simd::fma(b2, P::load(v + i), one_minus_b2 * (gv * gv));
      mv.store(m + i);
      vv.store(v + i);
      simd::fma(-step, mv / (simd::sqrt(vv) / root + e), wv * factor).store(w + i);
    }
#else
    (void)width;
#endif
    for (; i < n; ++i)
      Rule::update(w[i], m[i], v[i], Clip::effective(g[i], w[i], scale, l2), beta1, beta2, eps, c, decay);
  });
}

}  // namespace grad::kernels

GRAD_SIMD_DIAGNOSTICS_END
