// The device optimizers' bodies: grad/update_rules.hpp's rules over the
// parameter buffers, the clip norm by a whole block (block_reduce.hpp).
#pragma once

#include <cstddef>

#include "block_reduce.hpp"
#include "grad/device/launch.hpp"
#include "grad/update_rules.hpp"

namespace grad::device {

// The clip factor (opt.hpp's order: each parameter's squares in the fixed
// order, by the whole block; those shares in add order from zero), then
// Adam's per-step constants, on thread 0. The hyperparameters are read from
// device memory (`hyper`), so a captured graph sees each step's upload.
template <class S, class Block>
GRAD_HD inline void optimizer_prepare(const ParamView<S>* params, std::size_t count, const OptimizerHyper<S>* hyper,
                                      OptimizerState<S>* st, S* shared, Block& block) {
  const OptimizerHyper<S> h = *hyper;
  S acc = S(0);
  if (h.clip != S(0))
    for (std::size_t k = 0; k < count; ++k) {
      const S share = block_sum_fixed(params[k].g, params[k].size, fixed_order::Square{}, shared, block);
      block.step_one([&] { acc = ClipRule::accumulate(acc, share); });
    }
  block.step_one([&] {
    st->scale = h.clip != S(0) ? ClipRule::scale(acc, h.clip) : S(1);
    if (h.adam) {
      AdamRule::advance(st->beta1_power, st->beta2_power, h.beta1, h.beta2);
      st->constants = AdamRule::constants(h.lr, h.beta1, h.beta2, st->beta1_power, st->beta2_power, h.form);
    }
  });
}

template <class S>
GRAD_HD inline void optimizer_update(const ParamView<S>& p, const OptimizerHyper<S>& h, const OptimizerState<S>& st,
                                     std::size_t i) {
  const S g = ClipRule::effective(p.g[i], p.w[i], st.scale, p.l2);
  if (h.adam)
    AdamRule::update(p.w[i], p.m[i], p.v[i], g, h.beta1, h.beta2, h.eps, st.constants,
                     AdamRule::decay_factor(h.lr, p.weight_decay));
  else
    p.w[i] = SgdRule::update(p.w[i], g, h.lr);
}

// Fused mode: every parameter's update in one grid, block b belonging to the
// parameter whose block range holds it (the per-parameter kernels' items).
template <class S>
GRAD_HD inline void optimizer_update_block(const ParamView<S>* params, std::size_t count, const OptimizerHyper<S>& h,
                                           const OptimizerState<S>& st, std::size_t block, std::size_t thread,
                                           std::size_t block_items) {
  for (std::size_t k = 0; k < count; ++k) {
    const std::size_t blocks = blocks_for(params[k].size, block_items);
    if (block < blocks) {
      const std::size_t i = block * block_items + thread;
      if (i < params[k].size) optimizer_update(params[k], h, st, i);
      return;
    }
    block -= blocks;
  }
}

}  // namespace grad::device
