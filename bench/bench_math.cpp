// glibc's scalar tanh/exp against exact_math.hpp's, over the 32,000 elements
// one autoencoder step evaluates (workload A: batch 200, hidden layers
// 64 + 32 + 64, forward tanh; see issue 7). Inputs are spread over [-4, 4]
// unless a case says otherwise. Run with --benchmark_repetitions and compare
// medians; the "tag" cases run the tape's own Tanh::forward_tensor loop.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include "grad/grad.hpp"
#include "grad/numerics/exact_math.hpp"

namespace {

constexpr std::size_t evaluations = 32'000;

// [-half_width, half_width], scrambled: no branch predictor can learn it.
template <class T>
std::vector<T> inputs(double half_width = 4.0) {
  std::vector<T> x(evaluations);
  for (std::size_t i = 0; i < evaluations; ++i)
    x[i] = static_cast<T>(half_width * (-1.0 + 2.0 * static_cast<double>((i * 7919) % evaluations) / evaluations));
  return x;
}

template <class T, class F>
void run(benchmark::State& state, F f) {
  const std::vector<T> x = inputs<T>();
  std::vector<T> y(evaluations);
  for (auto _ : state) {
    const T* in = x.data();
    T* out = y.data();
    for (std::size_t i = 0; i < evaluations; ++i) out[i] = f(in[i]);
    benchmark::DoNotOptimize(out);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * evaluations));
}

template <class T>
void BM_tanh_glibc(benchmark::State& state) {
  run<T>(state, [](T v) { return std::tanh(v); });
}
template <class T>
void BM_tanh_exact(benchmark::State& state) {
  run<T>(state, [](T v) { return grad::exact_tanh(v); });
}
template <class T>
void BM_exp_glibc(benchmark::State& state) {
  run<T>(state, [](T v) { return std::exp(v); });
}
template <class T>
void BM_exp_exact(benchmark::State& state) {
  run<T>(state, [](T v) { return grad::exact_exp(v); });
}
template <class T>
void BM_sigmoid_glibc(benchmark::State& state) {
  run<T>(state, [](T v) { return T(1) / (T(1) + std::exp(-v)); });
}
template <class T>
void BM_sigmoid_exact(benchmark::State& state) {
  run<T>(state, [](T v) { return grad::exact_sigmoid(v); });
}

// The tape's kernel for a tanh node: what an autoencoder step actually runs.
// Argument: the inputs' half-width in hundredths. 400 mixes both of
// exact_tanh's arms in nearly every block of 16; 50 keeps every block in the
// near arm, as 96 % of workload A's blocks are.
template <class T>
void BM_tanh_tag(benchmark::State& state) {
  const std::vector<T> x = inputs<T>(static_cast<double>(state.range(0)) / 100.0);
  std::vector<T> y(evaluations);
  grad::NodeArgs<T> args;
  args.a.data = x.data();
  const std::size_t shape[] = {evaluations};
  args.a.dims = grad::Dims::of(shape);
  args.out = args.a.dims;
  for (auto _ : state) {
    grad::Tanh::forward_tensor(args, y.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * evaluations));
}

}  // namespace

BENCHMARK_TEMPLATE(BM_tanh_glibc, double);
BENCHMARK_TEMPLATE(BM_tanh_exact, double);
BENCHMARK_TEMPLATE(BM_tanh_tag, double)->ArgName("half_width_x100")->Arg(400)->Arg(50);
BENCHMARK_TEMPLATE(BM_tanh_glibc, float);
BENCHMARK_TEMPLATE(BM_tanh_exact, float);
BENCHMARK_TEMPLATE(BM_tanh_tag, float)->ArgName("half_width_x100")->Arg(400)->Arg(50);
BENCHMARK_TEMPLATE(BM_exp_glibc, double);
BENCHMARK_TEMPLATE(BM_exp_exact, double);
BENCHMARK_TEMPLATE(BM_exp_glibc, float);
BENCHMARK_TEMPLATE(BM_exp_exact, float);
BENCHMARK_TEMPLATE(BM_sigmoid_glibc, double);
BENCHMARK_TEMPLATE(BM_sigmoid_exact, double);
BENCHMARK_TEMPLATE(BM_sigmoid_glibc, float);
BENCHMARK_TEMPLATE(BM_sigmoid_exact, float);

BENCHMARK_MAIN();
