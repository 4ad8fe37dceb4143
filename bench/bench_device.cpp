// One training step (upload the minibatch, forward, backward, Adam step on
// the backend, read the loss back) of two models, in every mode:
//
//   autoencoder  the README's d-64-32-64-d tanh autoencoder, batch 200
//   wide MLP     32-256-256-32 relu, batch 256, mse
//
// against the CPU tape doing the same step. Modes: per-node (a kernel per
// launch), graph (the step as one CUDA graph), fused (the fusion plan's
// kernels, under one graph). The CPU backend runs the device kernel bodies
// one work item at a time: it checks bit-exactness and is not meant to be
// fast (its graph and fused cases show the planner's overhead is nil). CUDA
// cases register only where a device answers.
#include <benchmark/benchmark.h>

#include <functional>
#include <grad/device/device.hpp>
#include <string>
#include <vector>

#include "../examples/autoencoder.hpp"

namespace {

namespace dev = grad::device;

constexpr std::size_t mlp_batch = 256;
constexpr std::array<std::size_t, 4> mlp_widths{32, 256, 256, 32};

// A recorded step: loss, parameters, the input leaf and minibatches for it.
struct Step {
  grad::Tape<double> tp;
  grad::Var<double> loss, input;
  std::vector<grad::Var<double>> params;
  std::vector<grad::Tensor<double>> batches;
};

void record_autoencoder(Step& s, std::size_t batch_rows) {
  namespace ae = autoencoder;
  const grad::Tensor<double> data = ae::make_data<double>();
  const ae::Model<double> m = ae::make_model(s.tp);
  for (std::size_t first = 0; first + batch_rows <= ae::rows; first += batch_rows) {
    grad::Tensor<double> t({batch_rows, ae::dim});
    ae::copy_rows(data, first, batch_rows, t.data());
    s.batches.push_back(std::move(t));
  }
  s.input = s.tp.constant(s.batches[0]);
  s.loss = ae::record_step(m, s.input);
  s.params.assign(m.params.begin(), m.params.end());
}

// Deterministic values in [-scale, scale).
grad::Tensor<double> filled(grad::Shape shape, double scale, std::size_t salt) {
  grad::Tensor<double> t(std::move(shape));
  for (std::size_t i = 0; i < t.size(); ++i)
    t[i] = scale * (double((i + salt) * 2654435761u % 1000003u) / 500001.5 - 1.0);
  return t;
}

grad::Var<double> mlp_forward(const std::vector<grad::Var<double>>& p, grad::Var<double> x) {
  grad::Var<double> h = x;
  for (std::size_t l = 0; l + 1 < mlp_widths.size(); ++l) {
    h = grad::matmul(h, p[2 * l]) + p[2 * l + 1];
    if (l + 2 < mlp_widths.size()) h = grad::relu(h);
  }
  return h;
}

void record_mlp(Step& s) {
  for (std::size_t l = 0; l + 1 < mlp_widths.size(); ++l) {
    s.params.push_back(s.tp.param(filled({mlp_widths[l], mlp_widths[l + 1]}, 1.0 / 16, l)));
    s.params.push_back(s.tp.param(grad::Tensor<double>({mlp_widths[l + 1]})));
  }
  for (std::size_t k = 0; k < 4; ++k) s.batches.push_back(filled({mlp_batch, mlp_widths[0]}, 1.0, 100 + k));
  s.input = s.tp.constant(s.batches[0]);
  const grad::Var<double> target = s.tp.constant(filled({mlp_batch, mlp_widths.back()}, 0.5, 7));
  s.loss = grad::mse(mlp_forward(s.params, s.input), target);
}

void BM_tape_step(benchmark::State& state) {
  autoencoder::Trainer<double> trainer(static_cast<std::size_t>(state.range(0)));
  std::size_t k = 0;
  trainer.step(k++);  // the first step reserves the tape's capacity
  for (auto _ : state) benchmark::DoNotOptimize(trainer.step(k++));
  if (!trainer.tp.ok()) state.SkipWithError(trainer.tp.error().c_str());
}

void BM_tape_mlp_step(benchmark::State& state) {
  Step s;
  record_mlp(s);
  grad::Adam<double> opt(1e-3);
  for (const auto& p : s.params) opt.add(p);
  // Each step re-records the graph after the leaves (the recorded one stays unused).
  const grad::Var<double> target = s.tp.constant(filled({mlp_batch, mlp_widths.back()}, 0.5, 7));
  const auto leaf = s.tp.mark();
  std::size_t k = 0;
  for (auto _ : state) {
    s.tp.reset_to(leaf);
    const grad::Tensor<double>& b = s.batches[k++ % s.batches.size()];
    std::copy(b.data().begin(), b.data().end(), s.tp.leaf_value(s.input).begin());
    const grad::Var<double> loss = grad::mse(mlp_forward(s.params, s.input), target);
    if (!s.tp.backward(loss) || !opt.step()) state.SkipWithError("tape step failed");
    benchmark::DoNotOptimize(s.tp.scalar(loss));
  }
}

void device_step(benchmark::State& state, const std::function<void(Step&)>& record, dev::Backend backend,
                 dev::Mode mode, bool f32) {
  Step s;
  record(s);
  auto prog = dev::capture(s.tp, s.loss, {.backend = backend, .mode = mode, .f32 = f32});
  dev::Adam<double> opt(prog, 0.005);
  for (const auto& p : s.params) opt.add(p);
  std::size_t k = 0;
  for (auto _ : state) {
    prog.set_input(s.input, s.batches[k++ % s.batches.size()]);
    prog.forward();
    prog.backward();
    opt.step();
    benchmark::DoNotOptimize(prog.loss());
  }
  if (!prog.fallback_reason().empty()) state.SkipWithError(prog.fallback_reason().c_str());
  state.counters["kernels"] = static_cast<double>(prog.kernels_per_pass());
}

void register_device(const std::string& model, const std::function<void(Step&)>& record, dev::Backend backend,
                     dev::Mode mode, bool f32) {
  const std::string name = "BM_" + model + "_" + std::string(dev::backend_name(backend)) + "_" +
                           std::string(dev::mode_name(mode)) + (f32 ? "_f32" : "");
  benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
    device_step(st, record, backend, mode, f32);
  })->Unit(benchmark::kMicrosecond);
}

}  // namespace

BENCHMARK(BM_tape_step)->Arg(200)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_tape_mlp_step)->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  const auto ae200 = [](Step& s) { record_autoencoder(s, 200); };
  for (dev::Mode mode : {dev::Mode::per_node, dev::Mode::graph, dev::Mode::fused})
    register_device("ae", ae200, dev::Backend::cpu, mode, false);
  if (dev::cuda_available()) {
    for (dev::Mode mode : {dev::Mode::per_node, dev::Mode::graph, dev::Mode::fused}) {
      register_device("ae", ae200, dev::Backend::cuda, mode, false);
      register_device("mlp", record_mlp, dev::Backend::cuda, mode, false);
    }
    register_device("ae", ae200, dev::Backend::cuda, dev::Mode::fused, true);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
