// The autoencoder the demo trains, shared with the benchmarks and the device
// tests: a deterministic noisy 2-D manifold in 6-D, a d-64-32-64-d tanh
// autoencoder with deterministic initialisation, and the function that
// records one training step's graph.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <grad/grad.hpp>
#include <limits>
#include <numbers>
#include <span>

namespace autoencoder {

inline constexpr std::size_t dim = 6;      // d: features per row
inline constexpr std::size_t rows = 2000;  // rows in the data set
inline constexpr std::uint64_t default_seed = 7;
inline constexpr double noise_sigma = 0.01;  // std. dev. of the Gaussian noise on every coordinate
inline constexpr std::array<std::size_t, 5> widths = {dim, 64, 32, 64, dim};

// rows x 6: latent (s, t) uniform on [-1, 1]^2 mapped smoothly into 6-D,
// scaled so that the mean square per coordinate is about 0.3 (the MSE of an
// untrained network that outputs about zero), plus Gaussian noise.
template <class T>
grad::Tensor<T> make_data(std::uint64_t seed = default_seed, std::size_t n = rows) {
  grad::SplitMix64 rng{seed};
  grad::Tensor<T> x({n, dim});
  const double pi = std::numbers::pi, scale = 1.3;
  for (std::size_t r = 0; r < n; ++r) {
    const double s = rng.uniform(-1, 1), t = rng.uniform(-1, 1);
    const double clean[dim] = {s, t, 0.5 * std::sin(pi * s), 0.5 * std::cos(pi * t), s * t, 0.5 * (s * s - t * t)};
    for (std::size_t c = 0; c < dim; ++c)
      x[r * dim + c] = static_cast<T>(scale * clean[c] + noise_sigma * rng.normal());
  }
  return x;
}

// Weights w_i [in, out] and biases b_i [out] of the four layers, in that
// order: the optimizer's add order and the checkpoint's parameter order.
template <class T>
struct Model {
  std::array<grad::Var<T>, 8> params;
  grad::Var<T> w(std::size_t layer) const { return params[2 * layer]; }
  grad::Var<T> b(std::size_t layer) const { return params[2 * layer + 1]; }
};

// Glorot-uniform weights from the seed, zero biases.
template <class T>
Model<T> make_model(grad::Tape<T>& tp, std::uint64_t seed = default_seed) {
  grad::SplitMix64 rng{seed ^ 0x5eedull};
  Model<T> m;
  for (std::size_t layer = 0; layer + 1 < widths.size(); ++layer) {
    const std::size_t in = widths[layer], out = widths[layer + 1];
    const double bound = std::sqrt(6.0 / static_cast<double>(in + out));
    grad::Tensor<T> w({in, out});
    for (T& v : w.data()) v = static_cast<T>(rng.uniform(-bound, bound));
    m.params[2 * layer] = tp.param(w);
    m.params[2 * layer + 1] = tp.param(grad::Tensor<T>({out}));
  }
  return m;
}

template <class Opt, class T>
void add_params(Opt& opt, const Model<T>& m) {
  for (const grad::Var<T>& p : m.params) opt.add(p);
}

// tanh on the three hidden layers, linear output.
template <class T>
grad::Var<T> forward(const Model<T>& m, grad::Var<T> x) {
  grad::Var<T> h = x;
  for (std::size_t layer = 0; layer < 3; ++layer) h = grad::tanh(grad::matmul(h, m.w(layer)) + m.b(layer));
  return grad::matmul(h, m.w(3)) + m.b(3);
}

// One training step's graph: reconstruction MSE of the batch (a [rows, 6]
// leaf). The caller runs backward and the optimizer.
template <class T>
grad::Var<T> record_step(const Model<T>& m, grad::Var<T> batch) {
  return grad::mse(forward(m, batch), batch);
}

// Copies rows [first, first + count) of data into a leaf's value (a
// minibatch constant made once, refilled every step).
template <class T>
void copy_rows(const grad::Tensor<T>& data, std::size_t first, std::size_t count, std::span<T> dst) {
  const auto src = data.data().subspan(first * dim, count * dim);
  std::copy(src.begin(), src.end(), dst.begin());
}

}  // namespace autoencoder

namespace autoencoder {

// The whole training setup in one place, for the benchmarks and the device
// tests: data, model, Adam, a [batch, 6] input leaf and the mark to rewind to.
template <class T>
struct Trainer {
  grad::Tensor<T> data;
  grad::Tape<T> tp;
  Model<T> model;
  grad::Adam<T> opt;
  grad::Var<T> batch;
  typename grad::Tape<T>::Mark mark;
  std::size_t batch_rows;

  explicit Trainer(std::size_t batch_rows = 200, T lr = T(0.005), std::uint64_t seed = default_seed)
      : data(make_data<T>(seed)), model(make_model(tp, seed)), opt(lr), batch_rows(batch_rows) {
    add_params(opt, model);
    batch = tp.constant(grad::Tensor<T>({batch_rows, dim}));
    mark = tp.mark();
  }
  Trainer(const Trainer&) = delete;  // Vars point into the tape

  // One Adam step (forward, mse, backward, update) on the k-th minibatch;
  // returns its loss, NaN if the tape is poisoned.
  T step(std::size_t k) {
    const std::size_t first = (k % (rows / batch_rows)) * batch_rows;
    tp.reset_to(mark);
    copy_rows(data, first, batch_rows, tp.leaf_value(batch));
    const grad::Var<T> loss = record_step(model, batch);
    if (!tp.backward(loss) || !opt.step()) return std::numeric_limits<T>::quiet_NaN();
    return tp.scalar(loss);
  }
};

}  // namespace autoencoder
