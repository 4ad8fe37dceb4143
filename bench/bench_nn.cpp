// How nn should reduce rows: a [cols, 1] ones-column matmul (no new op) or
// the row_sum op. Both variants record an RMSNorm forward and backward on a
// fresh episode (mark/reset), which is how the layers are used in training.
#include <benchmark/benchmark.h>

#include <grad/grad.hpp>

namespace {

using grad::Tape;
using grad::Tensor;
using grad::Var;

Tensor<double> filled(grad::Shape shape, double start) {
  Tensor<double> t(std::move(shape));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = start + 0.001 * static_cast<double>(i % 97);
  return t;
}

// mean over the last axis of x [rows, cols] as x . ones[cols, 1] / cols.
Var<double> row_mean_by_matmul(Tape<double>& tp, Var<double> x, std::size_t cols) {
  return grad::matmul(x, tp.constant(Tensor<double>::ones({cols, 1}))) / static_cast<double>(cols);
}

Var<double> row_mean_by_op(Tape<double>&, Var<double> x, std::size_t cols) {
  return grad::row_sum(x) / static_cast<double>(cols);
}

template <Var<double> (*RowMean)(Tape<double>&, Var<double>, std::size_t)>
void rmsnorm_step(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0)), cols = static_cast<std::size_t>(state.range(1));
  Tape<double> tp;
  Var<double> x = tp.param(filled({rows, cols}, -0.3));
  Var<double> w = tp.param(filled({cols}, 0.9));
  const auto m = tp.mark();
  for (auto _ : state) {
    Var<double> ms = RowMean(tp, x * x, cols);
    Var<double> y = x / grad::sqrt(ms + 1e-6) * w;
    Var<double> loss = grad::sum(y);
    tp.backward(loss);
    benchmark::DoNotOptimize(tp.grad(x).data.data());
    tp.reset_to(m);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * rows * cols));
}

// The reduction alone (forward + backward), without the rest of the layer.
template <Var<double> (*RowMean)(Tape<double>&, Var<double>, std::size_t)>
void row_mean_step(benchmark::State& state) {
  const auto rows = static_cast<std::size_t>(state.range(0)), cols = static_cast<std::size_t>(state.range(1));
  Tape<double> tp;
  Var<double> x = tp.param(filled({rows, cols}, -0.3));
  const auto m = tp.mark();
  for (auto _ : state) {
    tp.backward(grad::sum(RowMean(tp, x, cols)));
    benchmark::DoNotOptimize(tp.grad(x).data.data());
    tp.reset_to(m);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * rows * cols));
}

void sizes(benchmark::internal::Benchmark* b) { b->Args({8, 64})->Args({64, 256})->Args({256, 1024}); }

BENCHMARK(row_mean_step<row_mean_by_matmul>)->Apply(sizes);
BENCHMARK(row_mean_step<row_mean_by_op>)->Apply(sizes);
BENCHMARK(rmsnorm_step<row_mean_by_matmul>)->Apply(sizes);
BENCHMARK(rmsnorm_step<row_mean_by_op>)->Apply(sizes);

}  // namespace

BENCHMARK_MAIN();
