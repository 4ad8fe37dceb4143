// Workload B side by side: the same MLP step (512-1024-1024-512 relu, batch
// 256, mse, Adam lr 1e-3) in libtorch 1.13 and in grad, in one binary so the
// ratio comes from one run on one machine state. Both take the same thread
// count (torch::set_num_threads / grad::set_num_threads).
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "mlp_workload.hpp"

namespace {

using grad_bench::mlp_batch;
using grad_bench::mlp_widths;

template <class T>
torch::Tensor to_torch(const grad::Tensor<T>& t) {
  std::vector<std::int64_t> shape(t.shape().begin(), t.shape().end());
  const auto dtype = std::is_same_v<T, float> ? torch::kFloat32 : torch::kFloat64;
  return torch::from_blob(const_cast<T*>(t.data().data()), shape, dtype).clone();
}

template <class T>
struct TorchMlp {
  torch::nn::Sequential net;
  torch::Tensor x, target;
  std::unique_ptr<torch::optim::Adam> opt;

  TorchMlp() {
    for (std::size_t l = 0; l + 1 < mlp_widths.size(); ++l) {
      torch::nn::Linear layer(static_cast<std::int64_t>(mlp_widths[l]), static_cast<std::int64_t>(mlp_widths[l + 1]));
      // Same initial values as grad's (torch stores the weight as [out, in]).
      torch::NoGradGuard no_grad;
      const T scale = T(1) / T(mlp_widths[l]);
      layer->to(std::is_same_v<T, float> ? torch::kFloat32 : torch::kFloat64);
      layer->weight.copy_(
          to_torch(grad_bench::mlp_filled<T>({mlp_widths[l], mlp_widths[l + 1]}, scale * T(1.7), 10 + l)).t());
      layer->bias.copy_(to_torch(grad_bench::mlp_filled<T>({mlp_widths[l + 1]}, T(0.1), 20 + l)));
      net->push_back(layer);
      if (l + 2 < mlp_widths.size()) net->push_back(torch::nn::ReLU());
    }
    x = to_torch(grad_bench::mlp_filled<T>({mlp_batch, mlp_widths[0]}, T(1), 1));
    target = to_torch(grad_bench::mlp_filled<T>({mlp_batch, mlp_widths.back()}, T(0.5), 2));
    opt = std::make_unique<torch::optim::Adam>(net->parameters(), torch::optim::AdamOptions(1e-3));
  }

  double step() {
    opt->zero_grad();
    torch::Tensor loss = torch::mse_loss(net->forward(x), target);
    loss.backward();
    opt->step();
    return loss.item<double>();
  }
};

void report_flops(benchmark::State& state) {
  state.counters["GFLOPS"] =
      benchmark::Counter(grad_bench::mlp_step_flops() / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

template <class T>
void BM_torch_mlp_step(benchmark::State& state) {
  torch::set_num_threads(static_cast<int>(state.range(0)));
  TorchMlp<T> mlp;
  mlp.step();
  for (auto _ : state) benchmark::DoNotOptimize(mlp.step());
  report_flops(state);
  torch::set_num_threads(1);
}

template <class T>
void BM_grad_mlp_step(benchmark::State& state) {
  grad::set_num_threads(static_cast<std::size_t>(state.range(0)));
  grad_bench::MlpOnTape<T> mlp;
  mlp.step();
  for (auto _ : state) benchmark::DoNotOptimize(mlp.step());
  if (!mlp.ok()) state.SkipWithError("the tape was poisoned");
  report_flops(state);
  grad::set_num_threads(1);
}

#define MLP_CASE(fn) BENCHMARK(fn)->ArgName("threads")->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime()
MLP_CASE(BM_torch_mlp_step<float>);
MLP_CASE(BM_grad_mlp_step<float>);
MLP_CASE(BM_torch_mlp_step<double>);
MLP_CASE(BM_grad_mlp_step<double>);

}  // namespace

BENCHMARK_MAIN();
