// grad::emit against the tape, side by side in one run: the autoencoder's
// training step (forward, mse, backward, Adam; examples/autoencoder.hpp) as
// the tape runs it and as emitted source, f64 and f32 at batch 200 and f64
// at batches 20 and 2. The emitted programs run in both loop modes
// (bench_emit_programs.cpp). bench/emit_bench.sh adds PyTorch eager (CPU,
// one thread) in the same run and prints the medians and ratios.
#include <benchmark/benchmark.h>

#include "../examples/autoencoder.hpp"
#include "bench_cli.hpp"

void register_emitted_items();
void register_emitted_host_loops();

namespace {

template <class T>
void BM_tape_step(benchmark::State& state) {
  autoencoder::Trainer<T> trainer(static_cast<std::size_t>(state.range(0)));
  std::size_t k = 0;
  trainer.step(k++);  // the first step reserves the tape's capacity
  for (auto _ : state) benchmark::DoNotOptimize(trainer.step(k++));
  if (!trainer.tp.ok()) state.SkipWithError(trainer.tp.error().c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"bench_emit: the autoencoder's training step on the tape and as emitted source", "bench_emit"};
  cli::setup(app);
  cli::allow_benchmark_flags(app);
  if (auto status = cli::parse(app, argc, argv)) return *status;
  benchmark::RegisterBenchmark("tape/ae_b200_f64", BM_tape_step<double>)->Arg(200)->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("tape/ae_b200_f32", BM_tape_step<float>)->Arg(200)->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("tape/ae_b20_f64", BM_tape_step<double>)->Arg(20)->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("tape/ae_b2_f64", BM_tape_step<double>)->Arg(2)->Unit(benchmark::kMicrosecond);
  register_emitted_items();
  register_emitted_host_loops();
  if (!cli::initialize_benchmark(app, argv[0])) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
