// Workload B of issue 7: an MLP 512-1024-1024-512 with relu, batch 256, mse
// loss and one Adam step, on grad's tape. Shared by bench_mlp (grad alone)
// and peer_libtorch_mlp (grad beside libtorch in one binary), so both time
// the same step.
#pragma once

#include <array>
#include <cstddef>

#include <grad/grad.hpp>

namespace grad_bench {

inline constexpr std::size_t mlp_batch = 256;
inline constexpr std::array<std::size_t, 4> mlp_widths{512, 1024, 1024, 512};

// Multiply-adds of one step: forward (3 products) and backward (dX for the
// upper two layers, dW for all three); the first layer's dX is not needed.
inline double mlp_step_flops() {
  double flops = 0;
  for (std::size_t l = 0; l + 1 < mlp_widths.size(); ++l) {
    const double mkn = double(mlp_batch) * double(mlp_widths[l]) * double(mlp_widths[l + 1]);
    flops += 2 * mkn * (l == 0 ? 2 : 3);
  }
  return flops;
}

// Deterministic values in [-scale, scale): a cheap hash of the index.
template <class T>
grad::Tensor<T> mlp_filled(grad::Shape shape, T scale, std::size_t salt) {
  grad::Tensor<T> t(std::move(shape));
  for (std::size_t i = 0; i < t.size(); ++i) {
    const std::size_t h = (i + salt) * 2654435761u % 1000003u;
    t[i] = scale * (T(h) / T(500001.5) - T(1));
  }
  return t;
}

template <class T>
class MlpOnTape {
 public:
  MlpOnTape() : opt_(T(1e-3)) {
    x_ = tp_.constant(mlp_filled<T>({mlp_batch, mlp_widths[0]}, T(1), 1));
    target_ = tp_.constant(mlp_filled<T>({mlp_batch, mlp_widths.back()}, T(0.5), 2));
    for (std::size_t l = 0; l + 1 < mlp_widths.size(); ++l) {
      const T scale = T(1) / T(mlp_widths[l]);  // keeps activations O(1)
      w_[l] = tp_.param(mlp_filled<T>({mlp_widths[l], mlp_widths[l + 1]}, scale * T(1.7), 10 + l));
      b_[l] = tp_.param(mlp_filled<T>({mlp_widths[l + 1]}, T(0.1), 20 + l));
      opt_.add(w_[l]);
      opt_.add(b_[l]);
    }
    mark_ = tp_.mark();
  }

  // Forward, backward, Adam; returns the loss. The tape is rewound after.
  T step() {
    grad::Var<T> h = x_;
    for (std::size_t l = 0; l < w_.size(); ++l) {
      h = grad::matmul(h, w_[l]) + b_[l];
      if (l + 1 < w_.size()) h = grad::relu(h);
    }
    const grad::Var<T> loss = grad::mse(h, target_);
    tp_.backward(loss);
    opt_.step();
    const T value = tp_.scalar(loss);
    tp_.reset_to(mark_);
    return value;
  }
  bool ok() const { return tp_.ok(); }

 private:
  grad::Tape<T> tp_;
  grad::Var<T> x_, target_;
  std::array<grad::Var<T>, 3> w_, b_;
  grad::Adam<T> opt_;
  typename grad::Tape<T>::Mark mark_;
};

}  // namespace grad_bench
