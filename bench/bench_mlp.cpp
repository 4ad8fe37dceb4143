// Workload B of issue 7: one training step (forward, backward, Adam) of an
// MLP 512-1024-1024-512 relu at batch 256, f32 and f64, on 1 and 2 threads.
// Matmul-bound (3.2 GFLOP per step): "GFLOPS" is the products' throughput.
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include "mlp_workload.hpp"

namespace {

template <class T>
void BM_mlp_step(benchmark::State& state) {
  const auto threads = static_cast<std::size_t>(state.range(0));
  grad::set_num_threads(threads);
  grad_bench::MlpOnTape<T> mlp;
  mlp.step();  // warm-up: arenas, packing buffers and the pool reach their steady size
  for (auto _ : state) benchmark::DoNotOptimize(mlp.step());
  if (!mlp.ok()) state.SkipWithError("the tape was poisoned");
  // The process's peak so far (run one benchmark per process, with
  // --benchmark_filter, to read one workload's own peak).
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  state.counters["peak_rss_MB"] = static_cast<double>(usage.ru_maxrss) / 1024.0;
  state.counters["GFLOPS"] =
      benchmark::Counter(grad_bench::mlp_step_flops() / 1e9, benchmark::Counter::kIsIterationInvariantRate);
  grad::set_num_threads(1);
}

BENCHMARK(BM_mlp_step<float>)->ArgName("threads")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_mlp_step<double>)->ArgName("threads")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
