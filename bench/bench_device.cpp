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
//
// BM_ae_cpu_*_host_only run the CPU backend with every kernel body skipped:
// what is left is the engine's host-side cost of a step (queueing, graph
// keys, copies, launch dispatch), the part CUDA adds to its kernels.
// Counters: kernels per forward + backward, launches per whole step.
//
// Also, for scripts/device-check.sh (no Google Benchmark flags needed):
//   bench_device --preflight [--expect-cc 9.0]   the CUDA device, or why there is none (exit 3)
//   bench_device --fingerprint [--steps N]       N fused/graph/per-node training steps on CUDA
//                                                (and the CPU backend), one hash of the loss
//                                                trace and weights' bits per line; two runs
//                                                must print the same lines
//   bench_device --short-fused-run               a few fused CUDA steps (for compute-sanitizer)
// Any benchmark that fell back or failed makes the exit status non-zero.
// --help lists these options with Google Benchmark's, which pass on to it.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>
#include <grad/device/device.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "../examples/autoencoder.hpp"
#include "bench_cli.hpp"

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

int failures = 0;  // benchmarks that fell back or threw: the exit status says so

void device_step(benchmark::State& state, const std::function<void(Step&)>& record, dev::Backend backend,
                 dev::Mode mode, bool f32, bool host_only) {
  try {
    Step s;
    record(s);
    auto prog = dev::capture(s.tp, s.loss, {.backend = backend, .mode = mode, .f32 = f32, .host_only = host_only});
    dev::Adam<double> opt(prog, 0.005);
    for (const auto& p : s.params) opt.add(p);
    opt.set_clip(1.0);  // the clip norm is part of the step
    std::size_t k = 0;
    std::uint64_t launches = 0, steps = 0;
    for (auto _ : state) {
      const std::uint64_t before = prog.launches();
      prog.set_input(s.input, s.batches[k++ % s.batches.size()]);
      prog.forward();
      prog.backward();
      opt.step();
      benchmark::DoNotOptimize(prog.loss());
      launches += prog.launches() - before;
      ++steps;
    }
    if (!prog.fallback_reason().empty()) {
      ++failures;
      state.SkipWithError(prog.fallback_reason().c_str());
    }
    state.counters["kernels"] = static_cast<double>(prog.kernels_per_pass());
    state.counters["launches_per_step"] = steps ? static_cast<double>(launches) / static_cast<double>(steps) : 0.0;
  } catch (const std::exception& e) {
    ++failures;
    state.SkipWithError(e.what());
  }
}

void register_device(const std::string& model, const std::function<void(Step&)>& record, dev::Backend backend,
                     dev::Mode mode, bool f32, bool host_only = false) {
  const std::string name = "BM_" + model + "_" + std::string(dev::backend_name(backend)) + "_" +
                           std::string(dev::mode_name(mode)) + (f32 ? "_f32" : "") + (host_only ? "_host_only" : "");
  benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
    device_step(st, record, backend, mode, f32, host_only);
  })->Unit(benchmark::kMicrosecond);
}

// ---- the device check's own modes ----

int preflight(double expect_cc) {
  if (!dev::cuda_available()) {
    std::printf("preflight: FAILED: %s\n", dev::cuda_unavailable_reason().c_str());
    return 3;
  }
  const dev::CudaDeviceInfo d = dev::cuda_device_info();
  std::printf("preflight: %s, compute capability %d.%d, %d SMs, %.1f GiB, driver CUDA %d.%d, runtime %d.%d\n",
              d.name.c_str(), d.major, d.minor, d.multiprocessors, static_cast<double>(d.memory_bytes) / (1 << 30),
              d.driver / 1000, d.driver % 1000 / 10, d.runtime / 1000, d.runtime % 1000 / 10);
  const double cc = d.major + d.minor / 10.0;
  if (expect_cc > 0 && cc != expect_cc) {
    std::printf("preflight: FAILED: the kernels were built for compute capability %.1f, the device has %.1f\n",
                expect_cc, cc);
    return 3;
  }
  if (d.driver < d.runtime) {
    std::printf("preflight: FAILED: the driver supports CUDA %d.%d, older than the runtime linked in (%d.%d)\n",
                d.driver / 1000, d.driver % 1000 / 10, d.runtime / 1000, d.runtime % 1000 / 10);
    return 3;
  }
  return 0;
}

// FNV-1a over the bits of a run's losses and final weights.
std::uint64_t hash_bits(const std::vector<double>& v) {
  std::uint64_t h = 1469598103934665603ULL;
  for (double x : v) {
    std::uint64_t b;
    std::memcpy(&b, &x, sizeof b);
    for (int i = 0; i < 8; ++i) h = (h ^ ((b >> (8 * i)) & 0xff)) * 1099511628211ULL;
  }
  return h;
}

std::vector<double> train_run(dev::Backend backend, dev::Mode mode, bool f32, int steps) {
  Step s;
  record_autoencoder(s, 200);
  auto prog = dev::capture(s.tp, s.loss, {.backend = backend, .mode = mode, .f32 = f32});
  dev::Adam<double> opt(prog, 0.005);
  for (const auto& p : s.params) opt.add(p, 1e-4);
  opt.set_clip(1.0);
  std::vector<double> out;
  for (int k = 0; k < steps; ++k) {
    prog.set_input(s.input, s.batches[static_cast<std::size_t>(k) % s.batches.size()]);
    prog.forward();
    prog.backward();
    opt.step();
    out.push_back(prog.loss());
  }
  for (const auto& p : s.params) {
    const grad::Tensor<double> w = prog.value(p);
    out.insert(out.end(), w.data().begin(), w.data().end());
  }
  if (!prog.fallback_reason().empty()) throw std::runtime_error(prog.fallback_reason());
  return out;
}

int fingerprint(int steps) {
  int rc = 0;
  std::vector<std::pair<std::string, std::vector<double>>> runs;
  for (bool f32 : {false, true})
    for (dev::Backend b : {dev::Backend::cpu, dev::Backend::cuda})
      for (dev::Mode m : {dev::Mode::per_node, dev::Mode::graph, dev::Mode::fused}) {
        const std::string name =
            std::string(dev::backend_name(b)) + "_" + std::string(dev::mode_name(m)) + (f32 ? "_f32" : "_f64");
        try {
          runs.emplace_back(name, train_run(b, m, f32, steps));
          std::printf("fingerprint %-18s %016llx  final loss %.17g\n", name.c_str(),
                      static_cast<unsigned long long>(hash_bits(runs.back().second)), runs.back().second[steps - 1]);
        } catch (const std::exception& e) {
          std::printf("fingerprint %-18s FAILED: %s\n", name.c_str(), e.what());
          rc = 1;
        }
      }
  // Every op of the autoencoder is exact tier: every backend and mode must
  // agree with the first run of its precision.
  for (const auto& [name, bits] : runs) {
    const std::string precision = name.substr(name.size() - 4);  // "_f64" or "_f32"
    const auto& ref = *std::find_if(runs.begin(), runs.end(),
                                    [&](const auto& r) { return r.first.substr(r.first.size() - 4) == precision; });
    if (ref.second.size() == bits.size() && std::memcmp(ref.second.data(), bits.data(), bits.size() * 8) == 0) continue;
    std::printf("fingerprint MISMATCH: %s differs from %s\n", name.c_str(), ref.first.c_str());
    rc = 1;
  }
  return rc;
}

}  // namespace

BENCHMARK(BM_tape_step)->Arg(200)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_tape_mlp_step)->Unit(benchmark::kMicrosecond);

int main(int argc, char** argv) {
  CLI::App app{"bench_device: one training step on the device engine's backends in every mode, against the tape",
               "bench_device"};
  cli::setup(app);
  cli::allow_benchmark_flags(app);
  bool preflight_only = false, fingerprint_only = false, short_fused_run = false;
  double expect_cc = 0;
  int steps = 20;
  app.add_flag("--preflight", preflight_only, "only: the CUDA device, or why there is none (exit 3)");
  app.add_option("--expect-cc", expect_cc, "--preflight: the compute capability expected (0: any)")
      ->check(cli::range(0.0, 20.0));
  app.add_flag("--fingerprint", fingerprint_only,
               "only: --steps training steps per mode on CUDA and the CPU backend, one hash per line");
  app.add_option("--steps", steps, "--fingerprint: training steps")->check(cli::range(1, 100'000));
  app.add_flag("--short-fused-run", short_fused_run, "only: a few fused CUDA steps (for compute-sanitizer)");
  if (auto status = cli::parse(app, argc, argv)) return *status;
  try {
    if (preflight_only) return preflight(expect_cc);
    if (fingerprint_only) return fingerprint(steps);
    if (short_fused_run) {
      const std::vector<double> r = train_run(dev::Backend::cuda, dev::Mode::fused, false, 3);
      std::printf("short fused run: 3 steps, final loss %.17g\n", r[2]);
      return 0;
    }
  } catch (const std::exception& e) {
    std::printf("bench_device: FAILED: %s\n", e.what());
    return 1;
  }

  const auto ae200 = [](Step& s) { record_autoencoder(s, 200); };
  for (dev::Mode mode : {dev::Mode::per_node, dev::Mode::graph, dev::Mode::fused}) {
    register_device("ae", ae200, dev::Backend::cpu, mode, false);
    register_device("ae", ae200, dev::Backend::cpu, mode, false, true);
  }
  if (dev::cuda_available()) {
    for (dev::Mode mode : {dev::Mode::per_node, dev::Mode::graph, dev::Mode::fused}) {
      register_device("ae", ae200, dev::Backend::cuda, mode, false);
      register_device("mlp", record_mlp, dev::Backend::cuda, mode, false);
    }
    register_device("ae", ae200, dev::Backend::cuda, dev::Mode::fused, true);
  }
  if (!cli::initialize_benchmark(app, argv[0])) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  if (failures) std::fprintf(stderr, "bench_device: %d benchmark(s) fell back or failed\n", failures);
  return failures ? 1 : 0;
}
