// Recording cost: an elementwise op on a 16-element tensor, forward plus its
// share of backward, amortised over a 1,000-node episode in a mark/reset loop.
#include <benchmark/benchmark.h>

#include <grad/grad.hpp>

namespace {

// 999 binary ops on 16 elements plus a sum: a 1,000-node episode per iteration,
// with or without its backward pass. Reports seconds per recorded op.
template <class T, bool WithBackward>
void BM_elementwise_episode(benchmark::State& state) {
  constexpr int ops = 1000;
  grad::Tape<T> tp;
  auto x = tp.param(grad::Tensor<T>::full({16}, T(0.5)));
  auto w = tp.param(grad::Tensor<T>::full({16}, T(0.999)));
  const auto m = tp.mark();
  for (auto _ : state) {
    auto v = x;
    for (int i = 0; i < ops - 1; ++i) v = (i & 1) ? v * w : v + w;
    auto loss = grad::sum(v);
    if constexpr (WithBackward) {
      bool ok = tp.backward(loss);
      benchmark::DoNotOptimize(ok);
    }
    benchmark::DoNotOptimize(loss);
    tp.reset_to(m);
  }
  state.counters["per_op"] =
      benchmark::Counter(ops, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

BENCHMARK(BM_elementwise_episode<double, true>)->Name("elementwise_episode/f64");
BENCHMARK(BM_elementwise_episode<float, true>)->Name("elementwise_episode/f32");
BENCHMARK(BM_elementwise_episode<double, false>)->Name("elementwise_record_only/f64");

}  // namespace

BENCHMARK_MAIN();
