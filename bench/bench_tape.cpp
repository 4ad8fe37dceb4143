// Recording cost: an elementwise op on a 16-element tensor, forward plus its
// share of backward, amortised over a 1,000-node episode in a mark/reset loop.
#include <benchmark/benchmark.h>

#include <grad/grad.hpp>

namespace {

// Seconds per recorded op (Google Benchmark prints it with a unit, e.g. "103n").
benchmark::Counter per_op(int ops) {
  return benchmark::Counter(ops, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

template <class T>
void BM_elementwise_episode(benchmark::State& state) {
  constexpr int ops = 1000;
  grad::Tape<T> tp;
  auto x = tp.param(grad::Tensor<T>::full({16}, T(0.5)));
  auto w = tp.param(grad::Tensor<T>::full({16}, T(0.999)));
  const auto m = tp.mark();
  for (auto _ : state) {
    auto v = x;
    for (int i = 0; i < ops - 1; ++i) v = (i & 1) ? v * w : v + w;  // 999 binary ops
    auto loss = grad::sum(v);                                       // the 1,000th node
    bool ok = tp.backward(loss);
    benchmark::DoNotOptimize(ok);
    tp.reset_to(m);
  }
  state.counters["per_op"] = per_op(ops);
}

// Forward only: what recording alone costs.
template <class T>
void BM_elementwise_record_only(benchmark::State& state) {
  constexpr int ops = 1000;
  grad::Tape<T> tp;
  auto x = tp.param(grad::Tensor<T>::full({16}, T(0.5)));
  auto w = tp.param(grad::Tensor<T>::full({16}, T(0.999)));
  const auto m = tp.mark();
  for (auto _ : state) {
    auto v = x;
    for (int i = 0; i < ops; ++i) v = (i & 1) ? v * w : v + w;
    benchmark::DoNotOptimize(v);
    tp.reset_to(m);
  }
  state.counters["per_op"] = per_op(ops);
}

BENCHMARK(BM_elementwise_episode<double>);
BENCHMARK(BM_elementwise_episode<float>);
BENCHMARK(BM_elementwise_record_only<double>);

}  // namespace

BENCHMARK_MAIN();
