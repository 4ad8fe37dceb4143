// Adam<T> (grad's efficient form or PyTorch's) and AdamW<T> (decoupled
// weight decay) over tape parameters, on the Optimizer<T> base; the element
// rule is AdamRule (update_rules.hpp), the loop update.hpp's.
#pragma once

#include <cstddef>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "grad/numerics/parallel.hpp"
#include "grad/opt/optimizer.hpp"
#include "grad/tags/family.hpp"
#include "grad/update.hpp"
#include "grad/update_rules.hpp"

namespace grad {

template <class T>
class Adam : public Optimizer<T> {
 public:
  static constexpr OptimizerKind kind = OptimizerKind::adam;
  // Throws std::invalid_argument for a setting outside invalid_setting's
  // range. `form` (update_rules.hpp): where eps is added; opt.hpp's step 3.
  explicit Adam(T lr, T beta1 = T(0.9), T beta2 = T(0.999), T eps = T(1e-8), AdamForm form = AdamForm::efficient)
      : Adam("adam", lr, beta1, beta2, eps, form) {}

  // Takes the step's rate (step 0 of opt.hpp's comment), advances the running
  // powers, updates every reached parameter, then counts the step. False,
  // changing nothing, when ready() refuses.
  bool step() {
    if (!this->ready()) return false;
    const T lr = this->begin_step();
    AdamRule::advance(beta1_power_, beta2_power_, beta1_, beta2_);
    const AdamStepConstants<T> c = AdamRule::constants(lr, beta1_, beta2_, beta1_power_, beta2_power_, form_);
    this->for_each_reached([&](const auto& e, std::span<T> w, std::span<const T> g, T scale) {
      T* m = m_.data() + e.offset;
      T* v = v_.data() + e.offset;
      const T decay = AdamRule::decay_factor(lr, e.weight_decay);  // 1 unless AdamW
      parallel_ranges(e.size, elementwise_grain, [&](std::size_t lo, std::size_t hi) {  // elements are independent
        adam_loop(w.data() + lo, m + lo, v + lo, g.data() + lo, hi - lo, scale, e.l2, beta1_, beta2_, eps_, c, decay);
      });
    });
    this->end_step();
    return true;
  }

  T beta1() const { return beta1_; }
  T beta2() const { return beta2_; }
  T eps() const { return eps_; }
  AdamForm form() const { return form_; }
  T beta1_power() const { return beta1_power_; }  // b1^steps()
  T beta2_power() const { return beta2_power_; }
  // First and second moments of every parameter, in add order (Entry::offset).
  std::span<const T> first_moments() const { return m_; }
  std::span<const T> second_moments() const { return v_; }
  std::string feature_not_emitted() const override {
    return form_ == AdamForm::efficient ? "" : "the PyTorch form (AdamForm::pytorch)";
  }

 protected:
  Adam(std::string_view name, T lr, T beta1, T beta2, T eps, AdamForm form)
      : Optimizer<T>(name, lr),
        beta1_(this->checked("beta1", beta1)),
        beta2_(this->checked("beta2", beta2)),
        eps_(this->checked("eps", eps)),
        form_(form) {
    if (form != AdamForm::efficient && form != AdamForm::pytorch)
      throw std::invalid_argument(std::string(name) + ": form " + std::to_string(static_cast<int>(form)) +
                                  " is not an AdamForm");
  }

 private:
  // Explicit vector code, as sgd_loop.
  static void adam_loop(T* w, T* m, T* v, const T* g, std::size_t n, T scale, T l2, T beta1, T beta2, T eps,
                        const AdamStepConstants<T>& c, T decay) {
    kernels::adam_update<ClipRule, AdamRule>(w, m, v, g, n, scale, l2, beta1, beta2, eps, c, decay);
  }
  const char* kind_name() const override { return "adam"; }
  void on_add(std::size_t size) override {
    m_.resize(m_.size() + size, T(0));
    v_.resize(v_.size() + size, T(0));
  }

  T beta1_, beta2_, eps_;
  AdamForm form_;
  T beta1_power_ = T(1), beta2_power_ = T(1);
  std::vector<T> m_, v_;
  template <class U, class Opt>
  friend struct CheckpointAccess;
};

// torch.optim.AdamW: Adam in the PyTorch form with decoupled weight decay,
// w = w * (1 - lr * weight_decay) before the Adam update (the gradient is
// not decayed; add()'s coefficient is that decay, not an L2 term).
// weight_decay is every add()'s default (torch's 0.01), and
// nn::add_parameters(opt, model)'s for every parameter; add(param, wd)
// gives one parameter its own, as a torch parameter group would (0 for
// biases and norm gains: nn::add_parameters(opt, model, {.others = 0})).
template <class T>
class AdamW : public Adam<T> {
 public:
  static constexpr OptimizerKind kind = OptimizerKind::adamw;
  // Throws std::invalid_argument for a setting outside invalid_setting's range.
  explicit AdamW(T lr, T beta1 = T(0.9), T beta2 = T(0.999), T eps = T(1e-8), T weight_decay = T(0.01))
      : Adam<T>("adamw", lr, beta1, beta2, eps, AdamForm::pytorch),
        weight_decay_(this->checked("weight_decay", weight_decay)) {}

  T weight_decay() const { return weight_decay_; }
  std::string feature_not_emitted() const override { return "decoupled weight decay (AdamW)"; }

 private:
  const char* kind_name() const override { return "adamw"; }
  bool decouples_decay() const override { return true; }
  T default_decay() const override { return weight_decay_; }
  T weight_decay_;
  template <class U, class Opt>
  friend struct CheckpointAccess;
};

// grad::Adam opt(1e-3) is Adam<double>; Adam opt(1e-3f) is Adam<float> (AdamW alike).
template <class T>
Adam(T) -> Adam<T>;
template <class T>
Adam(T, T) -> Adam<T>;
template <class T>
Adam(T, T, T) -> Adam<T>;
template <class T>
Adam(T, T, T, T) -> Adam<T>;
template <class T>
Adam(T, T, T, T, AdamForm) -> Adam<T>;
template <class T>
AdamW(T) -> AdamW<T>;
template <class T>
AdamW(T, T) -> AdamW<T>;
template <class T>
AdamW(T, T, T) -> AdamW<T>;
template <class T>
AdamW(T, T, T, T) -> AdamW<T>;
template <class T>
AdamW(T, T, T, T, T) -> AdamW<T>;

}  // namespace grad
