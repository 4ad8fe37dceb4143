// Workloads A and B through the public API only, as an outside project
// would time them: A is the README's autoencoder step (6-64-32-64-6 tanh,
// batch 200, Adam), B the MLP 512-1024-1024-512 relu step (batch 256, mse,
// Adam), one thread each. bench/consumer_bench.sh compiles this file with
// plain g++ at -O2/-O3, with and without -march=native, header-only and
// against the compiled kernel library; bench/meson.build builds it with the
// project's own flags (bench_workloads) for the reference figures.
#include <benchmark/benchmark.h>

#include "../examples/autoencoder.hpp"
#include "mlp_workload.hpp"

namespace {

template <class T>
void A(benchmark::State& state) {
  autoencoder::Trainer<T> trainer(200);
  std::size_t k = 0;
  trainer.step(k++);  // the first step reserves the tape's capacity
  for (auto _ : state) benchmark::DoNotOptimize(trainer.step(k++));
  if (!trainer.tp.ok()) state.SkipWithError(trainer.tp.error().c_str());
}

template <class T>
void B(benchmark::State& state) {
  grad_bench::MlpOnTape<T> mlp;
  mlp.step();  // arenas and packing buffers reach their steady size
  for (auto _ : state) benchmark::DoNotOptimize(mlp.step());
  if (!mlp.ok()) state.SkipWithError("the tape was poisoned");
}

}  // namespace

BENCHMARK_TEMPLATE(A, double)->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(A, float)->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(B, float)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(B, double)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
