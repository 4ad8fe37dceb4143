// A full sum of 10^6 doubles on one thread: the documented order (32 lanes,
// a fixed tree, chunks of 4096: grad::sum_fixed, which vectorises) against
// the serial ascending chain it replaced (acc = acc + x[i], one add waiting
// for the previous). Also the tape's sum node and the clip norm's squares.
//
//   build/bench/bench_reduction --benchmark_enable_random_interleaving=true --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <grad/grad.hpp>
#include <vector>

namespace {

std::vector<double> data(std::size_t n) {
  grad::SplitMix64 rng(42);
  std::vector<double> v(n);
  for (double& x : v) x = rng.uniform(-1, 1);
  return v;
}

// The order before issue 16, kept here as the peer.
__attribute__((noinline)) double serial_chain(const double* x, std::size_t n) {
  double acc = 0;
  for (std::size_t i = 0; i < n; ++i) acc = acc + x[i];
  return acc;
}

void BM_sum_serial_chain(benchmark::State& state) {
  const std::vector<double> v = data(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(serial_chain(v.data(), v.size()));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

void BM_sum_fixed(benchmark::State& state) {
  const std::vector<double> v = data(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(grad::sum_fixed(v.data(), v.size()));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

void BM_squares_fixed(benchmark::State& state) {
  const std::vector<double> v = data(static_cast<std::size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(grad::ClipRule::squares(v.data(), v.size()));
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

// The tape's sum node forward (recording included), as a user sees it.
void BM_tape_sum(benchmark::State& state) {
  const std::size_t n = static_cast<std::size_t>(state.range(0));
  grad::Tape<double> tp;
  const auto x = tp.constant(grad::Tensor<double>({n}, data(n)));
  const auto mark = tp.mark();
  for (auto _ : state) {
    tp.reset_to(mark);
    benchmark::DoNotOptimize(tp.scalar(grad::sum(x)));
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
}

}  // namespace

BENCHMARK(BM_sum_serial_chain)->Arg(1000000)->Arg(100000)->Arg(1200)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_sum_fixed)->Arg(1000000)->Arg(100000)->Arg(1200)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_squares_fixed)->Arg(1000000)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_tape_sum)->Arg(1000000)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
