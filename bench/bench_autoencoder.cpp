// One training step of the README's autoencoder (examples/autoencoder.hpp):
// forward, mse, backward and Adam on a 200-row minibatch, one thread.
#include <benchmark/benchmark.h>

#include "../examples/autoencoder.hpp"

template <class T>
static void BM_autoencoder_step(benchmark::State& state) {
  autoencoder::Trainer<T> trainer(static_cast<std::size_t>(state.range(0)));
  std::size_t k = 0;
  trainer.step(k++);  // the first step reserves the tape's capacity
  for (auto _ : state) benchmark::DoNotOptimize(trainer.step(k++));
  if (!trainer.tp.ok()) state.SkipWithError(trainer.tp.error().c_str());
  state.counters["nodes"] = static_cast<double>(trainer.tp.size());
}
BENCHMARK_TEMPLATE(BM_autoencoder_step, double)->Arg(200)->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_autoencoder_step, float)->Arg(200)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
