// One training step of the README's autoencoder (examples/autoencoder.hpp,
// batch 200, Adam): the CPU tape against the device engine's per-node
// replay (upload the minibatch, forward, backward, Adam step on the
// backend, read the loss back). The CPU backend runs the device kernel
// bodies one work item at a time: it checks bit-exactness, it is not meant
// to be fast. The CUDA case registers only where a device answers.
#include <benchmark/benchmark.h>

#include <grad/device/device.hpp>

#include "../examples/autoencoder.hpp"

namespace {

void BM_tape_step(benchmark::State& state) {
  autoencoder::Trainer<double> trainer(static_cast<std::size_t>(state.range(0)));
  std::size_t k = 0;
  trainer.step(k++);  // the first step reserves the tape's capacity
  for (auto _ : state) benchmark::DoNotOptimize(trainer.step(k++));
  if (!trainer.tp.ok()) state.SkipWithError(trainer.tp.error().c_str());
}

void device_step(benchmark::State& state, grad::device::Backend backend, bool f32) {
  namespace ae = autoencoder;
  const std::size_t batch_rows = static_cast<std::size_t>(state.range(0));
  const grad::Tensor<double> data = ae::make_data<double>();
  grad::Tape<double> tp;
  const ae::Model<double> m = ae::make_model(tp);
  const grad::Var<double> batch = tp.constant(grad::Tensor<double>({batch_rows, ae::dim}));
  const grad::Var<double> loss = ae::record_step(m, batch);
  auto prog = grad::device::capture(tp, loss, {.backend = backend, .f32 = f32});
  grad::device::Adam<double> opt(prog, 0.005);
  ae::add_params(opt, m);
  // Minibatches prepared up front: the timed loop is the step alone.
  std::vector<grad::Tensor<double>> batches;
  for (std::size_t first = 0; first + batch_rows <= ae::rows; first += batch_rows) {
    grad::Tensor<double> t({batch_rows, ae::dim});
    ae::copy_rows(data, first, batch_rows, t.data());
    batches.push_back(std::move(t));
  }
  std::size_t k = 0;
  for (auto _ : state) {
    prog.set_input(batch, batches[k++ % batches.size()]);
    prog.forward();
    prog.backward();
    opt.step();
    benchmark::DoNotOptimize(prog.loss());
  }
  state.counters["launches"] = static_cast<double>(prog.forward_launches() + prog.backward_launches());
}

void BM_device_cpu_step(benchmark::State& state) { device_step(state, grad::device::Backend::cpu, false); }
void BM_device_cuda_step(benchmark::State& state) { device_step(state, grad::device::Backend::cuda, false); }
void BM_device_cuda_f32_step(benchmark::State& state) { device_step(state, grad::device::Backend::cuda, true); }

}  // namespace

BENCHMARK(BM_tape_step)->Arg(200)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_device_cpu_step)->Arg(200)->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  if (grad::device::cuda_available()) {
    benchmark::RegisterBenchmark("BM_device_cuda_step", BM_device_cuda_step)->Arg(200)->Unit(benchmark::kMicrosecond);
    benchmark::RegisterBenchmark("BM_device_cuda_f32_step", BM_device_cuda_f32_step)
        ->Arg(200)
        ->Unit(benchmark::kMicrosecond);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
