// SGD<T>: torch.optim.SGD over tape parameters (momentum, dampening,
// Nesterov), one optimizer on the Optimizer<T> base; its element rules are
// SgdRule and SgdMomentumRule (update_rules.hpp), its loops update.hpp's.
#pragma once

#include <cstdint>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "grad/numerics/parallel.hpp"
#include "grad/opt/optimizer.hpp"
#include "grad/tags/family.hpp"
#include "grad/update.hpp"
#include "grad/update_rules.hpp"

namespace grad {

template <class T>
class SGD : public Optimizer<T> {
 public:
  static constexpr OptimizerKind kind = OptimizerKind::sgd;
  // torch.optim.SGD(lr, momentum, dampening, nesterov), all off by default.
  // Throws std::invalid_argument for a setting outside invalid_setting's
  // range, and (as torch) for Nesterov without momentum or with dampening.
  explicit SGD(T lr, T momentum = T(0), T dampening = T(0), bool nesterov = false)
      : Optimizer<T>("sgd", lr),
        momentum_(this->checked("momentum", momentum)),
        dampening_(this->checked("dampening", dampening)),
        nesterov_(nesterov) {
    if (nesterov && (momentum == T(0) || dampening != T(0))) {
      char m[32], d[32];
      std::snprintf(m, sizeof m, "%.17g", static_cast<double>(momentum));
      std::snprintf(d, sizeof d, "%.17g", static_cast<double>(dampening));
      throw std::invalid_argument(std::string("sgd: Nesterov momentum requires momentum > 0 and dampening 0, got momentum ") +
                                  m + " and dampening " + d);
    }
  }

  // For every reached parameter, with d = grad * clip_scale + l2 * w:
  //   no momentum: w -= lr * d
  //   momentum:    buf = d at the parameter's first step, else
  //                buf = momentum * buf + (1 - dampening) * d;
  //                w -= lr * (nesterov ? d + momentum * buf : buf)
  // (SgdRule, SgdMomentumRule). False, changing nothing, when ready() refuses.
  bool step() {
    if (!this->ready()) return false;
    const T lr = this->begin_step();
    this->for_each_reached([&](const auto& e, std::span<T> w, std::span<const T> g, T scale) {
      if (momentum_ == T(0)) {
        parallel_ranges(e.size, elementwise_grain, [&](std::size_t lo, std::size_t hi) {  // elements are independent
          sgd_loop(w.data() + lo, g.data() + lo, hi - lo, scale, e.l2, lr);
        });
        return;
      }
      const std::size_t k = static_cast<std::size_t>(&e - this->entries_.data());
      const bool first = !started_[k];
      T* buf = buffers_.data() + e.offset;
      parallel_ranges(e.size, elementwise_grain, [&](std::size_t lo, std::size_t hi) {
        kernels::sgd_momentum_update<ClipRule, SgdMomentumRule>(w.data() + lo, buf + lo, g.data() + lo, hi - lo, scale,
                                                                e.l2, lr, momentum_, T(1) - dampening_, first,
                                                                nesterov_);
      });
      started_[k] = 1;
    });
    this->end_step();
    return true;
  }

  T momentum() const { return momentum_; }
  T dampening() const { return dampening_; }
  bool nesterov() const { return nesterov_; }
  // The momentum buffers of every parameter, in add order (Entry::offset);
  // empty without momentum.
  std::span<const T> momentum_buffers() const { return buffers_; }
  std::string feature_not_emitted() const override { return momentum_ == T(0) ? "" : "momentum"; }

 private:
  // Explicit vector code for the best instruction set (update.hpp; in the
  // compiled kernel library when the consumer links it).
  static void sgd_loop(T* w, const T* g, std::size_t n, T scale, T l2, T lr) {
    kernels::sgd_update<ClipRule, SgdRule>(w, g, n, scale, l2, lr);
  }
  const char* kind_name() const override { return "sgd"; }
  void on_add(std::size_t size) override {
    if (momentum_ == T(0)) return;
    buffers_.resize(buffers_.size() + size, T(0));
    started_.push_back(0);
  }

  T momentum_, dampening_;
  bool nesterov_;
  std::vector<T> buffers_;
  std::vector<std::uint8_t> started_;  // per parameter: its buffer holds a first gradient
  template <class U, class Opt>
  friend struct CheckpointAccess;
};

// grad::SGD opt(0.1) is SGD<double>; SGD opt(0.1f) is SGD<float>.
template <class T>
SGD(T) -> SGD<T>;
template <class T>
SGD(T, T) -> SGD<T>;
template <class T>
SGD(T, T, T) -> SGD<T>;
template <class T>
SGD(T, T, T, bool) -> SGD<T>;

}  // namespace grad
