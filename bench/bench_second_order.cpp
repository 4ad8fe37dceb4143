// Issue 56's speed goals, one thread, float64: a Hessian-vector product
// (forward over reverse: the reverse walk of a Tape<Dual<double>>) of
// workload A's autoencoder (6-64-32-64-6 tanh, batch 200, mse) and of
// workload B's MLP (512-1024-1024-512 relu, batch 256, mse), each beside
// grad's own gradient of the same loss (forward + backward on a
// Tape<double>); and a jvp beside the forward alone. The HVP is with respect
// to every weight and bias, along a fixed direction v; the jvp along the
// same direction (jvp) or along the input, the weights fixed (jvp_input:
// func::jvp of the network as a function of its input). The goal: HVP <= 3x
// the gradient, jvp <= 2x the forward; bench/second_order.sh runs this
// beside PyTorch's torch.autograd.functional.hvp (bench/peer_torch_hvp.py).
#include <benchmark/benchmark.h>

#include <array>
#include <cstddef>
#include <grad/dual.hpp>
#include <grad/grad.hpp>
#include <type_traits>
#include <vector>

namespace {

using grad::Dual;

// Deterministic values in [-scale, scale): a cheap hash of the index
// (mlp_workload.hpp's, so B's values are the workload's).
grad::Tensor<double> filled(grad::Shape shape, double scale, std::size_t salt) {
  grad::Tensor<double> t(std::move(shape));
  for (std::size_t i = 0; i < t.size(); ++i) {
    const std::size_t h = (i + salt) * 2654435761u % 1000003u;
    t[i] = scale * (double(h) / 500001.5 - 1);
  }
  return t;
}

template <class S>
grad::Tensor<S> lifted(const grad::Tensor<double>& value, const grad::Tensor<double>& tangent) {
  if constexpr (std::is_same_v<S, double>) {
    return value;
  } else {
    std::vector<S> d(value.size());
    for (std::size_t i = 0; i < d.size(); ++i) d[i] = S(value[i], tangent[i]);
    return grad::Tensor<S>(value.shape(), std::move(d));
  }
}

struct Workload {
  std::vector<std::size_t> widths;
  std::size_t batch;
  bool tanh;  // else relu
};
const Workload workload_a{{6, 64, 32, 64, 6}, 200, true};
const Workload workload_b{{512, 1024, 1024, 512}, 256, false};

// The network on a Tape<S>: S = double gives the gradient, S = Dual<double>
// with the parameters' tangents v gives the gradient and H v.
template <class S>
class Net {
 public:
  // along_input: the tangents are the input's (the weights carry none),
  // else the weights' and biases'.
  Net(const Workload& w, bool params, bool along_input = false) : w_(w) {
    const std::size_t layers = w.widths.size() - 1;
    const grad::Shape xs{w.batch, w.widths[0]};
    x_ = tp_.constant(lifted<S>(filled(xs, 1, 1), along_input ? filled(xs, 1, 3) : grad::Tensor<double>(xs)));
    const grad::Shape out{w.batch, w.widths.back()};
    target_ = tp_.constant(lifted<S>(filled(out, 0.5, 2), grad::Tensor<double>(out)));
    for (std::size_t l = 0; l < layers; ++l) {
      const grad::Shape ws{w.widths[l], w.widths[l + 1]}, bs{w.widths[l + 1]};
      const double scale = 1.7 / double(w.widths[l]);
      const auto wv = lifted<S>(filled(ws, scale, 10 + l), along_input ? grad::Tensor<double>(ws) : filled(ws, 1, 30 + l));
      const auto bv = lifted<S>(filled(bs, 0.1, 20 + l), along_input ? grad::Tensor<double>(bs) : filled(bs, 1, 40 + l));
      weights_.push_back(params ? tp_.param(wv) : tp_.constant(wv));
      biases_.push_back(params ? tp_.param(bv) : tp_.constant(bv));
    }
    mark_ = tp_.mark();
  }

  grad::Var<S> loss() {
    grad::Var<S> h = x_;
    for (std::size_t l = 0; l < weights_.size(); ++l) {
      h = grad::matmul(h, weights_[l]) + biases_[l];
      if (l + 1 < weights_.size()) h = w_.tanh ? grad::tanh(h) : grad::relu(h);
    }
    return grad::mse(h, target_);
  }
  // Forward and backward; the tape is rewound after (gradients dropped).
  S gradient() {
    const grad::Var<S> l = loss();
    tp_.backward(l);
    const S value = tp_.value(l)[0];
    tp_.reset_to(mark_, grad::drop_gradients);
    return value;
  }
  S forward() {
    const S value = tp_.value(loss())[0];
    tp_.reset_to(mark_);
    return value;
  }
  const grad::Tape<S>& tape() const { return tp_; }

 private:
  Workload w_;
  grad::Tape<S> tp_;
  grad::Var<S> x_, target_;
  std::vector<grad::Var<S>> weights_, biases_;
  typename grad::Tape<S>::Mark mark_;
};

template <class S, bool Backward>
void run(benchmark::State& state, const Workload& w, bool along_input = false) {
  Net<S> net(w, Backward, along_input);
  auto once = [&] { return Backward ? net.gradient() : net.forward(); };
  once();  // the first pass reserves the tape's capacity
  for (auto _ : state) benchmark::DoNotOptimize(once());
  if (!net.tape().ok()) state.SkipWithError(net.tape().error().c_str());
}

void BM_A_gradient(benchmark::State& s) { run<double, true>(s, workload_a); }
void BM_A_hvp(benchmark::State& s) { run<Dual<double>, true>(s, workload_a); }
void BM_A_forward(benchmark::State& s) { run<double, false>(s, workload_a); }
void BM_A_jvp(benchmark::State& s) { run<Dual<double>, false>(s, workload_a); }
void BM_A_jvp_input(benchmark::State& s) { run<Dual<double>, false>(s, workload_a, true); }
void BM_B_gradient(benchmark::State& s) { run<double, true>(s, workload_b); }
void BM_B_hvp(benchmark::State& s) { run<Dual<double>, true>(s, workload_b); }
void BM_B_forward(benchmark::State& s) { run<double, false>(s, workload_b); }
void BM_B_jvp(benchmark::State& s) { run<Dual<double>, false>(s, workload_b); }
void BM_B_jvp_input(benchmark::State& s) { run<Dual<double>, false>(s, workload_b, true); }

}  // namespace

BENCHMARK(BM_A_gradient)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_A_hvp)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_A_forward)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_A_jvp)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_A_jvp_input)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_B_gradient)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_B_hvp)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_B_forward)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_B_jvp)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_B_jvp_input)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
