// The autoencoder training step in libtorch 1.13 beside grad's, in one
// binary so that the ratio is measured side by side in the same run. Both
// start from the same data and weights (examples/autoencoder.hpp), use Adam
// (lr 0.005) on 200-row minibatches, and run on one thread.
//
//   meson setup build -Dpeer_bench=enabled && ninja -C build bench/peer_libtorch
//   build/bench/peer_libtorch --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include <vector>

#include "../examples/autoencoder.hpp"

namespace {

constexpr std::size_t batch_rows = 200;

template <class T>
void BM_grad_step(benchmark::State& state) {
  autoencoder::Trainer<T> trainer(batch_rows);
  std::size_t k = 0;
  trainer.step(k++);
  for (auto _ : state) benchmark::DoNotOptimize(trainer.step(k++));
  if (!trainer.tp.ok()) state.SkipWithError(trainer.tp.error().c_str());
}

template <class T>
torch::Tensor to_torch(grad::View<T> v) {
  std::vector<std::int64_t> shape(v.shape.begin(), v.shape.end());
  constexpr auto dtype = std::is_same_v<T, double> ? torch::kFloat64 : torch::kFloat32;
  return torch::from_blob(const_cast<T*>(v.data.data()), shape, torch::TensorOptions().dtype(dtype)).clone();
}

template <class T>
void BM_libtorch_step(benchmark::State& state) {
  torch::set_num_threads(1);
  // Same data and initial weights as grad's run.
  autoencoder::Trainer<T> init(batch_rows);
  grad::Tape<T> data_tape;
  const torch::Tensor data = to_torch(data_tape.value(data_tape.constant(init.data)));
  std::vector<torch::Tensor> params;
  for (const grad::Var<T>& p : init.model.params) params.push_back(to_torch(init.tp.value(p)).requires_grad_(true));
  torch::optim::Adam adam(params, torch::optim::AdamOptions(0.005));
  const std::int64_t batches = static_cast<std::int64_t>(autoencoder::rows / batch_rows);

  auto step = [&](std::int64_t k) {
    const torch::Tensor x = data.narrow(0, (k % batches) * static_cast<std::int64_t>(batch_rows), batch_rows);
    adam.zero_grad();
    torch::Tensor h = x;
    for (std::size_t layer = 0; layer < 3; ++layer) h = torch::tanh(h.mm(params[2 * layer]) + params[2 * layer + 1]);
    const torch::Tensor loss = torch::mse_loss(h.mm(params[6]) + params[7], x);
    loss.backward();
    adam.step();
    return loss.item<T>();
  };
  std::int64_t k = 0;
  step(k++);
  for (auto _ : state) benchmark::DoNotOptimize(step(k++));
}

}  // namespace

BENCHMARK_TEMPLATE(BM_grad_step, double)->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_libtorch_step, double)->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_grad_step, float)->Unit(benchmark::kMicrosecond);
BENCHMARK_TEMPLATE(BM_libtorch_step, float)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
