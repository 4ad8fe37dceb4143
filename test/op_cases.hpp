// The one case table of every op. Each case is listed once: its parameters
// and constants (shapes and input domains: `nz` keeps away from zero, where
// relu has its kink and division blows up; `pos` keeps log and sqrt in their
// domain) and the op it builds. The loss is always weighted_sum of the op's
// output (support.hpp). One table drives every check:
//
//   test_finite_differences  the backward against central differences (f64, f32)
//   test_op_cases            the host loops against the tags' per-item bodies,
//                            bit for bit; the same bits on 1, 2 and 3 threads;
//                            (run again under GRAD_ISA=baseline and avx2);
//                            every op in OpList has a case; the torch oracle
//   test_device_parity       the device engine, every backend, mode and schedule
//   oracle/cases.py          float64 PyTorch, from the tapes this table
//                            records (cases_golden.txt): no graph written twice
//   test_second_order        each case on a Tape<Dual<double>> (the table
//                            instantiated for Dual<double>): JVP and HVP against
//                            float64 PyTorch's, from the same tapes
//                            (oracle/second_order_cases.py)
//
// Adding an op: its tag, its entry in OpList, and its cases here.
#pragma once

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "support.hpp"

namespace grad::testing {

template <class T>
struct OpCase {
  std::string name;
  std::vector<Tensor<T>> params;
  std::vector<Tensor<T>> constants;                                   // after the params in the Var list
  std::function<Var<T>(Tape<T>&, const std::vector<Var<T>>&)> build;  // the op's output
  bool large = false;  // sized for the threaded and vector paths: too big for finite differences
  // On a kink or tie on purpose (abs at 0, a clamp bound, maximum's ties):
  // the convention there is torch's, which the oracle checks; a central
  // difference straddles the kink, so finite differences skip it.
  bool at_kink = false;
};

template <class T>
std::vector<OpCase<T>> op_cases() {
  Rng rng(2024);
  auto r = [&](Shape s) { return random_tensor<T>(std::move(s), rng); };
  auto nz = [&](Shape s) { return away_from_zero<T>(std::move(s), rng); };
  auto pos = [&](Shape s) { return random_tensor<T>(std::move(s), rng, 0.5, 2.0); };
  using V = const std::vector<Var<T>>&;
  using Tp = Tape<T>&;
  std::vector<OpCase<T>> t;
  auto add = [&](std::string name, std::vector<Tensor<T>> p, std::function<Var<T>(Tp, V)> f,
                 std::vector<Tensor<T>> c = {}) {
    t.push_back({std::move(name), std::move(p), std::move(c), std::move(f)});
  };
  auto add_large = [&](std::string name, std::vector<Tensor<T>> p, std::function<Var<T>(Tp, V)> f) {
    add(std::move(name), std::move(p), std::move(f));
    t.back().large = true;
  };
  // binary, same shapes and broadcast both ways
  add("add", {r({3, 5}), r({3, 5})}, [](Tp, V v) { return v[0] + v[1]; });
  add("add row broadcast", {r({4, 3}), r({3})}, [](Tp, V v) { return v[0] + v[1]; });
  add("add both broadcast", {r({2, 1}), r({1, 3})}, [](Tp, V v) { return v[0] + v[1]; });
  add("sub rank-3 broadcast", {r({2, 1, 3}), r({4, 1})}, [](Tp, V v) { return v[0] - v[1]; });
  add("sub same size, different rank", {r({3}), r({1, 3})}, [](Tp, V v) { return v[0] - v[1]; });
  add("mul column broadcast", {r({3, 4}), r({3, 1})}, [](Tp, V v) { return v[0] * v[1]; });
  add("mul scalar-shaped", {r({30, 7}), r({1})}, [](Tp, V v) { return v[1] * v[0]; });
  add("div broadcast", {r({2, 3}), nz({3})}, [](Tp, V v) { return v[0] / v[1]; });
  add("div broadcast numerator", {r({3}), nz({2, 3})}, [](Tp, V v) { return v[0] / v[1]; });
  add("neg", {r({5})}, [](Tp, V v) { return -v[0]; });
  // scalar forms on both sides
  add("add_scalar", {r({2, 2})}, [](Tp, V v) { return (v[0] + T(0.5)) - T(2) + (T(1.5) + v[0]); });
  add("mul_scalar", {r({2, 2})}, [](Tp, V v) { return v[0] * T(1.7) + T(-0.3) * v[0]; });
  add("div_scalar", {r({2, 2})}, [](Tp, V v) { return v[0] / T(3); });
  add("scalar_sub", {r({2, 2})}, [](Tp, V v) { return T(3) - v[0]; });
  add("scalar_div", {nz({2, 2})}, [](Tp, V v) { return T(2) / v[0]; });
  // pointwise
  add("relu", {nz({3, 3})}, [](Tp, V v) { return relu(v[0]); });
  add("sigmoid", {r({3, 3})}, [](Tp, V v) { return sigmoid(v[0]); });
  add("tanh", {r({3, 3})}, [](Tp, V v) { return grad::tanh(v[0]); });
  add("gelu", {r({3, 3})}, [](Tp, V v) { return gelu(v[0] * T(2)); });
  add("exp", {r({3, 3})}, [](Tp, V v) { return grad::exp(v[0]); });
  add("log", {pos({3, 3})}, [](Tp, V v) { return grad::log(v[0]); });
  add("sqrt", {pos({3, 3})}, [](Tp, V v) { return grad::sqrt(v[0]); });
  // reductions
  add("sum", {r({5, 7})}, [](Tp, V v) { return sum(v[0] * v[0]); });
  add("mean", {r({3, 4})}, [](Tp, V v) { return mean(grad::tanh(v[0])); });
  add("mse", {r({3, 4}), r({3, 4})}, [](Tp, V v) { return mse(v[0], v[1]); });
  add("row_sum", {r({4, 6})}, [](Tp, V v) { return row_sum(v[0]); });
  add("row_sum rank 3", {r({2, 3, 4})}, [](Tp, V v) { return row_sum(v[0] * v[0]); });
  // linear algebra
  add("matmul", {r({7, 33}), r({33, 5})}, [](Tp, V v) { return matmul(v[0], v[1]); });
  add("bmm", {r({2, 3, 4}), r({2, 4, 2})}, [](Tp, V v) { return bmm(v[0], v[1]); });
  add("transpose", {r({3, 4})}, [](Tp, V v) { return transpose(v[0]); });
  add("transpose rank 3", {r({2, 3, 4})}, [](Tp, V v) { return transpose(v[0]); });
  // layout
  add("reshape", {r({2, 6})}, [](Tp, V v) { return reshape(v[0], {3, 2, 2}); });
  add("slice", {r({4, 5})}, [](Tp, V v) { return slice(v[0], {1, 0}, {3, 4}); });
  add("slice rank 3", {r({3, 4, 5})}, [](Tp, V v) { return slice(v[0], {1, 1, 2}, {3, 4, 5}); });
  add("concat axis 0", {r({2, 3}), r({1, 3})}, [](Tp, V v) { return concat(v[0], v[1], 0); });
  add("concat axis -1", {r({2, 3}), r({2, 2})}, [](Tp, V v) { return concat(v[0], v[1], -1); });
  add("concat middle axis", {r({2, 1, 3}), r({2, 2, 3})}, [](Tp, V v) { return concat(v[0], v[1], 1); });
  add("softmax last axis", {r({3, 4})}, [](Tp, V v) { return softmax(v[0], -1); });
  add("softmax axis 0", {r({3, 4})}, [](Tp, V v) { return softmax(v[0], 0); });
  add("softmax middle axis", {r({2, 3, 4})}, [](Tp, V v) { return softmax(v[0], 1); });
  // fan-out: later contributions are added to the first, in the tape's order
  add("fan-out x*x", {r({2, 3})}, [](Tp, V v) { return v[0] * v[0]; });
  add("fan-out x+x", {r({2, 3})}, [](Tp, V v) { return v[0] + v[0]; });
  add("fan-out through broadcast", {r({3}), r({2, 3})}, [](Tp, V v) { return v[0] * v[1] + v[0] + sum(v[0]) * v[1]; });
  add("fan-out branches", {r({3, 3}), r({3, 3})}, [](Tp, V v) {
    Var<T> h = grad::tanh(matmul(v[0], v[1]));
    return h * sigmoid(h) + matmul(h, v[0]) - v[0];
  });
  // a constant operand: no gradient buffer, still replayed
  add("constant operand", {r({2, 2})}, [](Tp, V v) { return matmul(v[1], v[0]) * v[1]; }, {r({2, 2})});
  // Composite graphs (once test_oracle's, now checked like every case):
  // broadcasting on either operand and on both, the scalar forms on both
  // sides, fan-out, and every op in one episode.
  auto u = [&](Shape s, double lo, double hi) { return random_tensor<T>(std::move(s), rng, lo, hi); };
  add("graph mlp", {u({3, 5}, -1, 1), u({5}, -0.5, 0.5), u({5, 2}, -1, 1), u({1, 2}, -0.5, 0.5)},
      [](Tp, V v) {
        Var<T> z1 = matmul(v[4], v[0]) + v[1];    // [4,5] + [5]
        Var<T> h = grad::tanh(z1), a = relu(z1);  // fan-out of z1
        Var<T> m = T(0.5) * h + a * T(0.25) + T(0.125);
        Var<T> o = sigmoid(matmul(m, v[2]) + v[3]);  // [4,2] + [1,2]
        return mse(o, v[5]) + sum(v[0] * v[0]) * T(0.01);
      },
      {u({4, 3}, -1, 1), u({4, 2}, 0.2, 0.8)});
  add("graph attention",
      {u({2, 3, 4}, -1, 1), u({2, 3, 4}, -1, 1), u({2, 3, 4}, -1, 1), u({2, 1, 4}, -1.5, -0.5), u({3, 1}, -1.5, -0.5)},
      [](Tp, V v) {
        Var<T> attn = softmax(bmm(v[0], transpose(v[1])) / T(2), -1);
        Var<T> y = bmm(attn, v[2]) - (v[3] + v[4]);  // [2,1,4] + [3,1] -> [2,3,4]
        Var<T> flat = reshape(y, {6, 4});
        Var<T> joined = concat(slice(flat, {0, 0}, {3, 4}), slice(flat, {3, 1}, {6, 4}), 1);
        return mean(joined * joined) + mean(row_sum(y)) * T(0.1);
      });
  add("graph pointwise", {u({3, 4}, 0.5, 2), u({4}, 0.5, 1.5), u({3, 1}, -1, 1)}, [](Tp, V v) {
    Var<T> a = v[0], b = v[1], c = v[2];
    Var<T> e1 = grad::log(a + T(0.5)) + grad::sqrt(T(1) + a);
    Var<T> e2 = grad::exp(-a) * (T(3) - a);
    Var<T> e3 = a / b + T(2) / a;   // [3,4] / [4]
    Var<T> e4 = b / (a - T(0.25));  // [4] / [3,4]
    Var<T> e5 = softmax(c * a, 0);  // [3,1] * [3,4], softmax down the columns
    return mean(e1 * e2 + e3 + e4 * e5 + e4 / T(3)) + gelu(c);
  });
  // Sized so that the host loops take their threaded, vector and blocked paths
  // (elementwise_grain, gemm's tiles): finite differences skip these.
  add_large("large broadcast add and tanh", {r({300, 260}), r({260})},
            [](Tp, V v) { return grad::tanh(v[0] + v[1]) * v[1]; });
  add_large("large column broadcast div", {r({260, 300}), nz({260, 1})}, [](Tp, V v) { return v[0] / v[1]; });
  add_large("large matmul", {r({70, 130}), r({130, 90})}, [](Tp, V v) { return matmul(v[0], v[1]); });
  add_large("large sum over chunks", {r({300, 260})}, [](Tp, V v) { return sum(v[0] * v[0]) * v[0]; });
  add_large("large softmax and row_sum", {r({200, 330})}, [](Tp, V v) { return row_sum(softmax(v[0], -1)) + v[0]; });
  // token ids: constants of exact integers (after the large cases, so that
  // adding them left every earlier case's random draws as they were)
  add("embedding", {r({7, 5})}, [](Tp, V v) { return grad::tanh(embedding(v[0], v[1])); },
      {Tensor<T>({3, 4}, {1, 6, 1, 0, 6, 2, 3, 3, 0, 5, 4, 1})});
  add("cross_entropy with ids and an ignored row", {r({6, 9})},
      [](Tp, V v) { return grad::cross_entropy(v[0] * T(3), v[1], T(-100)); }, {Tensor<T>({6}, {2, 8, -100, 0, 8, 5})});
  add("cross_entropy through embedding", {r({6, 4}), r({4, 6})},
      [](Tp, V v) { return grad::cross_entropy(matmul(embedding(v[0], v[2]), v[1]), v[3], T(-1)); },
      {Tensor<T>({5}, {3, 0, 5, 3, 1}), Tensor<T>({5, 1}, {0, 5, 3, 1, 2})});
  // Ops of issue 28 (after every earlier case, so that their draws stay as
  // they were). Domains keep finite differences (an f32 step of 1e-2) away
  // from the kinks; the cases marked at_kink sit on them for the oracle.
  auto add_at_kink = [&](std::string name, std::vector<Tensor<T>> p, std::function<Var<T>(Tp, V)> f,
                         std::vector<Tensor<T>> c = {}) {
    add(std::move(name), std::move(p), std::move(f), std::move(c));
    t.back().at_kink = true;
  };
  // Uniform in [-1, 1], at least 0.1 from every kink.
  auto apart_from = [&](Shape s, std::vector<double> kinks) {
    Tensor<T> out(std::move(s));
    for (T& x : out.data()) {
      double v;
      do v = rng.uniform(-1, 1);
      while (std::any_of(kinks.begin(), kinks.end(), [&](double k) { return std::fabs(v - k) < 0.1; }));
      x = static_cast<T>(v);
    }
    return out;
  };
  // Uniform in [-1, 1], element k at least 0.1 from other[k % other.size()]
  // (other broadcast along the last axes): no ties for maximum / minimum.
  auto apart_columns = [&](Shape s, const Tensor<T>& other) {
    Tensor<T> out(std::move(s));
    for (std::size_t k = 0; k < out.size(); ++k) {
      double v;
      do v = rng.uniform(-1, 1);
      while (std::fabs(v - static_cast<double>(other.data()[k % other.size()])) < 0.1);
      out.data()[k] = static_cast<T>(v);
    }
    return out;
  };
  // Distinct values in [-1, 1], spaced 2 / n apart (up to a small jitter), shuffled: no near-ties.
  auto distinct = [&](Shape s) {
    Tensor<T> out(std::move(s));
    const std::size_t n = out.size();
    for (std::size_t k = 0; k < n; ++k)
      out.data()[k] = static_cast<T>(-1 + (2 * static_cast<double>(k) + 1 + rng.uniform(-0.4, 0.4)) / static_cast<double>(n));
    for (std::size_t k = n; k-- > 1;) std::swap(out.data()[k], out.data()[rng.next() % (k + 1)]);
    return out;
  };
  add("abs", {nz({3, 4})}, [](Tp, V v) { return grad::abs(v[0]); });
  add("pow_scalar integer exponents", {nz({3, 3})},
      [](Tp, V v) { return grad::pow(v[0], T(2)) + grad::pow(v[0], T(3)) - grad::pow(v[0], T(-2)) * T(0.1); });
  add("pow_scalar fractional exponents", {pos({3, 3})}, [](Tp, V v) {
    return grad::pow(v[0], T(0.5)) + grad::pow(v[0], T(1.7)) + grad::pow(v[0], T(-0.5)) - grad::pow(v[0], T(-2.5));
  });
  add("pow broadcast exponent", {pos({3, 4}), r({4})}, [](Tp, V v) { return grad::pow(v[0], v[1] * T(2)); });
  // abs: a sum of signed powers cancels, and torch's std::pow and power_of's
  // products differ by an ulp, too much for the oracle's 1e-14 on the loss;
  // the sign still reaches the gradient through abs.
  add("pow negative bases, integer exponents", {nz({2, 3})},
      [](Tp, V v) { return grad::abs(grad::pow(v[0], v[1])); }, {Tensor<T>({3}, {2, 3, -1})});
  add("clamp", {apart_from({4, 5}, {-0.5, 0.5})}, [](Tp, V v) { return grad::clamp(v[0], T(-0.5), T(0.5)); });
  add("clamp_min and clamp_max", {apart_from({3, 4}, {-0.25, 0.3})},
      [](Tp, V v) { return grad::clamp_min(v[0], T(-0.25)) * grad::clamp_max(v[0], T(0.3)); });
  {
    Tensor<T> b = r({4});
    Tensor<T> a = apart_columns({3, 4}, b);
    add("maximum row broadcast", {a, b}, [](Tp, V v) { return grad::maximum(v[0], v[1]); });
    Tensor<T> c = r({3, 1});
    Tensor<T> d = apart_columns({3, 1}, c);
    add("minimum column broadcast", {apart_columns({3, 4}, Tensor<T>({1}, {T(0)})), c},
        [](Tp, V v) { return grad::minimum(v[0], v[1] * T(0.05)); });
    add("minimum same shape", {c, d}, [](Tp, V v) { return grad::minimum(v[1], v[0]); });
  }
  add("where broadcast", {r({3, 4}), r({4})}, [](Tp, V v) { return grad::where(v[2], v[0], v[1] * T(2)); },
      {Tensor<T>({3, 1}, {1, 0, -2})});
  add("where mask broadcast over both", {r({2, 1}), r({1, 3})}, [](Tp, V v) { return grad::where(v[2], v[0], v[1]); },
      {Tensor<T>({2, 3}, {0, 1, 1, 1, 0, 0})});
  add("max over the last axis", {distinct({3, 5})}, [](Tp, V v) { return grad::max(v[0], -1); });
  add("min over axis 0, axis dropped", {distinct({4, 3})}, [](Tp, V v) { return grad::min(v[0], 0, false); });
  add("max over a middle axis", {distinct({2, 3, 4})}, [](Tp, V v) { return grad::max(v[0] * v[0], 1, false); });
  add("min of a vector", {distinct({6})}, [](Tp, V v) { return grad::min(v[0], 0, false); });
  add("log_softmax last axis", {r({3, 5})}, [](Tp, V v) { return grad::log_softmax(v[0] * T(3)); });
  add("log_softmax axis 0", {r({4, 3})}, [](Tp, V v) { return grad::log_softmax(v[0], 0); });
  add("log_softmax middle axis", {r({2, 3, 4})}, [](Tp, V v) { return grad::log_softmax(v[0], 1); });
  // On the kinks and ties, where the conventions are (torch's, the oracle checks them).
  add_at_kink("abs, clamp and pow at their kinks", {Tensor<T>({7}, {0, -0.5, 0.5, 1, -1, 0.25, -0.0})}, [](Tp, V v) {
    return grad::abs(v[0]) + grad::clamp(v[0], T(-0.5), T(0.5)) * T(3) + grad::pow(v[0], T(2)) +
           grad::pow(v[0], T(0)) * T(5) + grad::pow(v[0], T(1)) * T(7) + grad::pow(v[0], T(3));
  });
  add_at_kink("maximum and minimum ties", {Tensor<T>({2, 3}, {1, 2, 3, 0.5, 0.5, -1}), Tensor<T>({3}, {1, 0.5, 3})},
              [](Tp, V v) { return grad::maximum(v[0], v[1]) * T(2) + grad::minimum(v[1], v[0]); });
  add_at_kink("max and min over an axis with ties", {Tensor<T>({3, 4}, {1, 3, 3, 0, 2, 2, 2, 2, -1, 4, -1, -1})},
              [](Tp, V v) { return grad::max(v[0], 1) * T(2) + grad::min(v[0], -1) + grad::max(v[0], 0, false); });
  add_at_kink("pow at a zero base", {Tensor<T>({4}, {0, 0, 2, 0}), Tensor<T>({4}, {2, 0, 1.5, 1})},
              [](Tp, V v) { return grad::pow(v[0], v[1]); });
  // dropout: a fixed key, so the mask is fixed; one above 2^63, which
  // emitted code must spell as an unsigned literal (last: a new case draws
  // its inputs after every earlier case's, which keep theirs)
  add("dropout", {r({4, 5})}, [](Tp, V v) { return dropout(v[0], 0.3, 0xfedcba9876543210u); });
  // causal attention: GQA (3 query heads per key head) and MHA; the context
  // of a group's heads with the one v
  add("causal_attention_probs, groups of 3", {r({2, 12, 3}), r({2, 4, 3})},
      [](Tp, V v) { return causal_attention_probs(v[0], v[1], T(0.7)); });
  add("causal_attention_probs, one head per key head", {r({3, 5, 2}), r({3, 5, 2})},
      [](Tp, V v) { return causal_attention_probs(v[0] * T(2), v[1], T(1.3)); });
  add("attention_context, groups of 2", {r({2, 6, 3}), r({2, 3, 4})},
      [](Tp, V v) { return attention_context(v[0], v[1]); });
  // a . b^T with b [n, k]; a batched a; one row; shapes off every vector width
  add("matmul_nt", {r({3, 4}), r({5, 4})}, [](Tp, V v) { return matmul_nt(v[0], v[1]); });
  add("matmul_nt batched a", {r({2, 3, 5}), r({4, 5})}, [](Tp, V v) { return matmul_nt(v[0], v[1]); });
  add("matmul_nt one row", {r({1, 7}), r({3, 7})}, [](Tp, V v) { return matmul_nt(v[0], v[1]); });
  add_large("matmul_nt large", {r({37, 41}), r({29, 41})}, [](Tp, V v) { return matmul_nt(v[0], v[1]); });
  // RMS norm: rows, a rank-3 x, one row; a large eps; rows long and many enough for the threads
  add("rms_norm", {r({3, 5}), pos({5})}, [](Tp, V v) { return rms_norm(v[0], v[1], T(1e-6)); });
  add("rms_norm rank 3, large eps", {r({2, 3, 4}), r({4})}, [](Tp, V v) { return rms_norm(v[0], v[1], T(0.5)); });
  add("rms_norm one row", {r({1, 6}), pos({6})}, [](Tp, V v) { return rms_norm(v[0] * T(3), v[1], T(1e-5)); });
  add_large("rms_norm large", {r({300, 131}), pos({131})}, [](Tp, V v) { return rms_norm(v[0], v[1], T(1e-6)); });
  // layer norm's normalisation: rows, a rank-3 x with a large eps, one row, threads
  add("layer_norm", {r({3, 5})}, [](Tp, V v) { return layer_norm(v[0], T(1e-5)); });
  add("layer_norm rank 3, large eps", {r({2, 3, 4})}, [](Tp, V v) { return layer_norm(v[0], T(0.5)); });
  add("layer_norm one row", {r({1, 6})}, [](Tp, V v) { return layer_norm(v[0] * T(3), T(1e-5)) + T(2); });  // + 2: a loss far from zero
  add_large("layer_norm large", {r({300, 131})}, [](Tp, V v) { return layer_norm(v[0], T(1e-5)); });
  // linear_cross_entropy (after every earlier case, so that their draws stay
  // as they were): W in both layouts, ignored rows; the large case runs over
  // two chunks of rows (chunk_rows: 128).
  add("linear_cross_entropy tied", {r({5, 4}), r({7, 4})},
      [](Tp, V v) { return linear_cross_entropy(v[0] * T(2), v[1], v[2], T(-100)); },
      {Tensor<T>({5}, {2, 6, -100, 0, 6})});
  add("linear_cross_entropy untied", {r({4, 3}), r({3, 6})},
      [](Tp, V v) { return linear_cross_entropy(v[0] * T(2), v[1], v[2], T(-1), ClassAxis::columns); },
      {Tensor<T>({4, 1}, {5, -1, 0, 3})});
  {
    Tensor<T> ids({140});
    for (std::size_t i = 0; i < 140; ++i) ids[i] = i % 9 == 4 ? T(-100) : static_cast<T>(i * 7 % 12);
    add("linear_cross_entropy over chunks", {r({140, 8}), r({12, 8})},
        [](Tp, V v) { return linear_cross_entropy(v[0], v[1], v[2]); }, {ids});
    t.back().large = true;
  }
  // attention's layouts: rows [batch*t, heads*hd] to heads-major [batch*heads, t, hd] (batch 2, t 3, 3 heads of
  // 4) and back; RoPE on the way with a trainable [2, t, hd] table (2 heads of 6; one head of 2)
  add("heads_major", {r({6, 12})}, [](Tp, V v) { return heads_major(v[0], 2, 3); });
  add("rows_major", {r({6, 3, 4})}, [](Tp, V v) { return rows_major(v[0], 2); });
  add("rope_heads_major", {r({6, 12}), r({2, 3, 6})}, [](Tp, V v) { return rope_heads_major(v[0], v[1]); });
  add("rope_heads_major one head of 2", {r({4, 2}), r({2, 4, 2})},
      [](Tp, V v) { return rope_heads_major(v[0], v[1]); });
  // the fused elementwise pairs (tags/gated.hpp)
  add("add_scaled", {r({3, 5}), r({3, 5})}, [](Tp, V v) { return add_scaled(v[0], v[1], T(2.5)); });
  add("add_scaled broadcast", {r({4, 3}), r({3})}, [](Tp, V v) { return add_scaled(v[0], v[1], T(-0.75)); });
  add("silu_mul", {r({3, 5}), r({3, 5})}, [](Tp, V v) { return silu_mul(v[0] * T(3), v[1]); });
  add("silu_mul broadcast gate", {r({5}), r({2, 5})}, [](Tp, V v) { return silu_mul(v[0], v[1]); });
  add_large("silu_mul large", {r({37, 300}), r({37, 300})}, [](Tp, V v) { return silu_mul(v[0] * T(4), v[1]); });
  return t;
}

// A case recorded on a fresh tape: its Vars (params, then constants), the
// op's output and the loss, with backward run.
template <class T>
struct RecordedCase {
  Tape<T> tp;
  std::vector<Var<T>> vars;
  Var<T> out, loss;
};

// Returns backward's answer.
template <class T>
bool record_case(const OpCase<T>& c, RecordedCase<T>& r) {
  for (const auto& p : c.params) r.vars.push_back(r.tp.param(p));
  for (const auto& k : c.constants) r.vars.push_back(r.tp.constant(k));
  r.out = c.build(r.tp, r.vars);
  r.loss = weighted_sum(r.out);
  return r.tp.backward(r.loss);
}

}  // namespace grad::testing
