// How nn should reduce rows: a [cols, 1] ones-column matmul (no new op) or
// the row_sum op. Both variants record an RMSNorm forward and backward on a
// fresh episode (mark/reset), which is how the layers are used in training.
//
// Causal attention (nn::attention): the fused recording (causal_attention_probs,
// attention_context: no mask, no repeated k/v) against the unfused one it
// replaced (same bits), forward + backward, f32, with RoPE, at one
// Qwen2.5-0.5B layer (14 query / 2 key-value heads of width 64) and smaller;
// the counter arena_MiB is the tape's high-water mark.
#include <benchmark/benchmark.h>

#include <cmath>

#include <grad/grad.hpp>
#include <grad/nn.hpp>

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

// The recording nn::attention replaced: k and v repeated per query head by
// concat, the scores plus nn::causal_mask, softmax, bmm.
Var<float> unfused_attention(Tape<float>& tp, Var<float> q, Var<float> k, Var<float> v, Var<float> cos,
                             Var<float> sin, std::size_t t, std::size_t H, std::size_t KV, std::size_t hd) {
  namespace d = grad::nn::detail;
  const std::size_t group = H / KV;
  Var<float> q3 = d::rope_heads(d::heads_major(q, 1, t, H, hd), cos, sin, H, t, hd);
  Var<float> k3 = d::rope_heads(d::heads_major(k, 1, t, KV, hd), cos, sin, KV, t, hd);
  Var<float> v3 = d::heads_major(v, 1, t, KV, hd);
  auto repeat = [&](Var<float> m) {
    Var<float> one = grad::reshape(m, {KV, 1, t * hd}), all = one;
    for (std::size_t g = 1; g < group; ++g) all = grad::concat(all, one, 1);
    return grad::reshape(all, {H, t, hd});
  };
  if (group > 1) {
    k3 = repeat(k3);
    v3 = repeat(v3);
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Var<float> scores = grad::bmm(q3, grad::transpose(k3)) * scale + tp.constant(grad::nn::causal_mask<float>(t));
  return d::rows_major(grad::bmm(grad::softmax(scores, -1), v3), 1, t, H, hd);
}

template <bool Fused>
void attention_step(benchmark::State& state) {
  const auto t = static_cast<std::size_t>(state.range(0)), H = static_cast<std::size_t>(state.range(1)),
             KV = static_cast<std::size_t>(state.range(2)), hd = static_cast<std::size_t>(state.range(3));
  Tape<float> tp;
  auto filled_f = [](grad::Shape shape, float start) {
    Tensor<float> x(std::move(shape));
    for (std::size_t i = 0; i < x.size(); ++i) x[i] = start + 0.01f * static_cast<float>(i % 97);
    return x;
  };
  Var<float> q = tp.param(filled_f({t, H * hd}, -0.4f)), k = tp.param(filled_f({t, KV * hd}, -0.5f)),
             v = tp.param(filled_f({t, KV * hd}, -0.3f));
  const auto tables = grad::nn::rope_tables<float>(t, hd, 10000.0f);
  Var<float> cos = tp.constant(tables.cos), sin = tp.constant(tables.sin);
  const auto m = tp.mark();
  for (auto _ : state) {
    Var<float> ctx = Fused ? grad::nn::attention(q, k, v, 1, H, KV, cos, sin)
                           : unfused_attention(tp, q, k, v, cos, sin, t, H, KV, hd);
    tp.backward(grad::sum(ctx));
    benchmark::DoNotOptimize(tp.grad(q).data.data());
    tp.reset_to(m);
  }
  state.counters["arena_MiB"] = static_cast<double>(tp.arena_bytes()) / (1 << 20);
}

void attention_sizes(benchmark::internal::Benchmark* b) {
  b->Args({128, 14, 2, 64})->Args({512, 14, 2, 64})->Args({128, 4, 4, 32})->Unit(benchmark::kMillisecond);
}

BENCHMARK(attention_step<false>)->Apply(attention_sizes);
BENCHMARK(attention_step<true>)->Apply(attention_sizes);

void sizes(benchmark::internal::Benchmark* b) { b->Args({8, 64})->Args({64, 256})->Args({256, 1024}); }

BENCHMARK(row_mean_step<row_mean_by_matmul>)->Apply(sizes);
BENCHMARK(row_mean_step<row_mean_by_op>)->Apply(sizes);
BENCHMARK(rmsnorm_step<row_mean_by_matmul>)->Apply(sizes);
BENCHMARK(rmsnorm_step<row_mean_by_op>)->Apply(sizes);

}  // namespace

BENCHMARK_MAIN();
