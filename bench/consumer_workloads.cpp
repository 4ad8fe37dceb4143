// Workloads A, B and LM through the public API only, as an outside project
// would time them: A is the README's autoencoder step (6-64-32-64-6 tanh,
// batch 200, Adam), B the MLP 512-1024-1024-512 relu step (batch 256, mse,
// Adam), LM a language-model training step in f32 (forward, cross-entropy,
// backward, Adam) at tinylm's default size on 4 x 256 byte windows (as
// `tinylm bench` and bench/peer_torch_lm.py) and at d 96 / 3 layers on
// 4 x 128; one thread each. bench/consumer_bench.sh compiles this file with
// plain g++ at -O2/-O3, with and without -march=native, header-only and
// against the compiled kernel library; bench/meson.build builds it with the
// project's own flags (bench_workloads) for the reference figures.
#include <benchmark/benchmark.h>

#include <grad/grad.hpp>

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

// Arguments: d_model, layers, batch, seq (heads 4 / 2 key-value, ffn
// 176 * d / 64 rounded as tinylm's default, byte vocabulary).
void LM(benchmark::State& state) {
  grad::nn::LmConfig c;
  c.d_model = static_cast<std::size_t>(state.range(0));
  c.layers = static_cast<std::size_t>(state.range(1));
  c.ffn = c.d_model * 11 / 4;
  const auto batch = static_cast<std::size_t>(state.range(2)), seq = static_cast<std::size_t>(state.range(3));
  c.max_seq = seq;
  grad::Tape<float> tp;
  grad::nn::Lm<float> model(tp, c, 1);
  grad::Adam<float> opt(1e-3f);
  for (const auto& p : model.trainable()) opt.add(p.var);
  const auto mark = tp.mark();
  grad::SplitMix64 rng(5);
  std::vector<int> in(batch * seq), out(batch * seq);
  for (int& x : in) x = static_cast<int>(rng.next() % 256);
  for (int& x : out) x = static_cast<int>(rng.next() % 256);
  auto step = [&] {
    tp.reset_to(mark);
    auto r = model.forward(model.ids(in, batch, seq), model.ids(out, batch * seq, 0));
    return tp.backward(r.loss) && opt.step();
  };
  step();
  for (auto _ : state) benchmark::DoNotOptimize(step());
  if (!tp.ok()) state.SkipWithError(tp.error().c_str());
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(batch * seq), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(LM)->Args({64, 2, 4, 256})->Args({96, 3, 4, 128})->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(A, double)->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(A, float)->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(B, float)->Unit(benchmark::kMillisecond);
BENCHMARK_TEMPLATE(B, double)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
