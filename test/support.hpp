// Shared by the test suites: a deterministic generator, random tensors,
// bitwise comparison and the central-difference gradient check.
#pragma once

#include <unistd.h>
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <grad/grad.hpp>
#include <iterator>
#include <string>
#include <vector>

namespace grad::testing {

// A scratch directory for one test process (`tag` names the suite), removed at exit.
struct ScratchDir {
  std::filesystem::path dir;
  explicit ScratchDir(const std::string& tag)
      : dir(std::filesystem::temp_directory_path() / ("grad_" + tag + "_test_" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(dir);
  }
  ~ScratchDir() { std::filesystem::remove_all(dir); }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  std::string file(const std::string& name) const { return (dir / name).string(); }
};

inline std::vector<unsigned char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}
inline void write_bytes(const std::string& path, const std::vector<unsigned char>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

using Rng = SplitMix64;  // include/grad/random.hpp: the same stream on every platform

template <class T>
Tensor<T> random_tensor(Shape shape, Rng& rng, double lo = -1, double hi = 1) {
  Tensor<T> t(std::move(shape));
  for (T& x : t.data()) x = static_cast<T>(rng.uniform(lo, hi));
  return t;
}

// Values with |x| in [lo, hi] and a random sign: keeps relu's kink and
// division's pole out of reach of a finite-difference step.
template <class T>
Tensor<T> away_from_zero(Shape shape, Rng& rng, double lo = 0.2, double hi = 1) {
  Tensor<T> t(std::move(shape));
  for (T& x : t.data()) x = static_cast<T>((rng.next() & 1 ? 1 : -1) * rng.uniform(lo, hi));
  return t;
}

// Draws every parameter of `model` whose name ends in "_bias" from U(lo, hi):
// a model's initialiser leaves its biases at zero, where a bias wrongly
// ordered or dropped by a writer would go unseen.
template <class T, class Model>
void randomize_biases(Tape<T>& tp, const Model& model, std::uint64_t seed, double lo, double hi) {
  Rng rng(seed);
  for (const auto& p : model.base())
    if (p.name.ends_with("_bias"))
      for (T& x : tp.leaf_value(p.var)) x = static_cast<T>(rng.uniform(lo, hi));
}

// Draws every adapter of `model` (lora_a and lora_b) from U(lo, hi): a
// fresh model's lora_b is zero, under which an adapter written in the wrong
// layout or scale would go unseen.
template <class T, class Model>
void randomize_adapters(Tape<T>& tp, const Model& model, std::uint64_t seed, double lo, double hi) {
  Rng rng(seed);
  for (const auto& p : model.adapters())
    for (T& x : tp.leaf_value(p.var)) x = static_cast<T>(rng.uniform(lo, hi));
}

template <class T>
bool bitwise_equal(std::span<const T> a, std::span<const T> b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Reduces any output to a scalar through fixed random weights, so every
// output element sends a different upstream gradient.
template <class T>
Var<T> weighted_sum(Var<T> y) {
  Tape<T>& tp = *y.tape();
  Rng rng(0xfeed);
  const View<T> v = tp.value(y);
  return sum(y * tp.constant(random_tensor<T>(Shape(v.shape.begin(), v.shape.end()), rng, 0.5, 1.5)));
}

template <class T>
using Builder = std::function<Var<T>(Tape<T>&, const std::vector<Var<T>>&)>;

struct FdResult {
  double worst = 0;  // max over elements of |analytic - numeric| / max(|analytic|, |numeric|, floor)
  std::string where;
  std::string error;  // tape error, if recording failed
};

// Central differences over every element of every parameter. The loss is
// re-recorded from scratch for each perturbation.
template <class T>
FdResult check_gradients(const std::vector<Tensor<T>>& params, const Builder<T>& build, double h, double floor = 1e-2) {
  FdResult r;
  Tape<T> tp;
  std::vector<Var<T>> vars;
  for (const auto& p : params) vars.push_back(tp.param(p));
  Var<T> loss = build(tp, vars);
  if (!tp.backward(loss)) {
    r.error = tp.error();
    r.worst = INFINITY;
    return r;
  }
  auto eval = [&](std::size_t k, std::size_t i, double delta) {
    std::vector<Tensor<T>> moved = params;
    moved[k][i] = static_cast<T>(static_cast<double>(moved[k][i]) + delta);
    Tape<T> t2;
    std::vector<Var<T>> v2;
    for (const auto& p : moved) v2.push_back(t2.param(p));
    return static_cast<double>(t2.scalar(build(t2, v2)));
  };
  for (std::size_t k = 0; k < params.size(); ++k) {
    const View<T> g = tp.grad(vars[k]);
    for (std::size_t i = 0; i < params[k].size(); ++i) {
      const double step = h * std::max(1.0, std::abs(static_cast<double>(params[k][i])));
      const double numeric = (eval(k, i, step) - eval(k, i, -step)) / (2 * step);
      const double analytic = static_cast<double>(g[i]);
      const double err = std::abs(analytic - numeric) / std::max({std::abs(analytic), std::abs(numeric), floor});
      if (!(err <= r.worst)) {  // also catches NaN
        r.worst = err;
        r.where = "param " + std::to_string(k) + " element " + std::to_string(i) + ": analytic " +
                  std::to_string(analytic) + " numeric " + std::to_string(numeric);
      }
    }
  }
  return r;
}

}  // namespace grad::testing
