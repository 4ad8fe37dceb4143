// How nn should reduce rows: a [cols, 1] ones-column matmul (no new op) or
// the row_sum op. Both variants record an RMSNorm forward and backward on a
// fresh episode (mark/reset), which is how the layers are used in training.
//
// Causal attention (nn::attention): the fused recording (causal_attention_probs,
// attention_context: no mask, no repeated k/v) against the unfused one it
// replaced (same bits), forward + backward, f32, with RoPE, at one
// Qwen2.5-0.5B layer (14 query / 2 key-value heads of width 64) and smaller;
// the counter arena_MiB is the tape's high-water mark.
// Then the fused nodes of issue 27 against the composites they replace, at a
// Qwen2.5-0.5B width (f32): rms_norm at [512, 896] (forward + backward to x
// and w) and the tied head [512, 896] x [151936, 896]^T (forward + backward
// to x), each with the bytes its episode adds to the tape (values and
// gradients) as a counter; and the tied head with its cross-entropy
// (forward + backward to x) against linear_cross_entropy, which never holds
// the logits.
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

// The recording nn::attention replaced: [t, n*hd] to heads-major [n, t, hd]
// and back by reshapes and transposes, RoPE as slice, neg, slice, concat,
// two muls and an add, k and v repeated per query head by concat, the
// scores plus nn::causal_mask, softmax, bmm.
Var<float> heads_major_composite(Var<float> m, std::size_t t, std::size_t n, std::size_t hd) {
  return grad::transpose(grad::reshape(grad::transpose(grad::reshape(m, {1, t, n * hd})), {n, hd, t}));
}
Var<float> rope_composite(Var<float> h, Var<float> cos, Var<float> sin, std::size_t n, std::size_t t, std::size_t hd) {
  const std::size_t half = hd / 2;
  Var<float> rotated =
      grad::concat(-grad::slice(h, {0, 0, half}, {n, t, hd}), grad::slice(h, {0, 0, 0}, {n, t, half}), -1);
  return h * cos + rotated * sin;
}
Var<float> unfused_attention(Tape<float>& tp, Var<float> q, Var<float> k, Var<float> v, Var<float> cos,
                             Var<float> sin, std::size_t t, std::size_t H, std::size_t KV, std::size_t hd) {
  const std::size_t group = H / KV;
  Var<float> q3 = rope_composite(heads_major_composite(q, t, H, hd), cos, sin, H, t, hd);
  Var<float> k3 = rope_composite(heads_major_composite(k, t, KV, hd), cos, sin, KV, t, hd);
  Var<float> v3 = heads_major_composite(v, t, KV, hd);
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
  Var<float> context = grad::bmm(grad::softmax(scores, -1), v3);  // [H, t, hd]
  return grad::reshape(grad::transpose(grad::reshape(grad::transpose(context), {1, H * hd, t})), {t, H * hd});
}

template <bool Fused>
void attention_step(benchmark::State& state) {
  const auto t = static_cast<std::size_t>(state.range(0)), H = static_cast<std::size_t>(state.range(1)),
             KV = static_cast<std::size_t>(state.range(2)), hd = static_cast<std::size_t>(state.range(3));
  grad::set_num_threads(static_cast<std::size_t>(state.range(4)));
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
  grad::set_num_threads(1);
}

// t, heads, key/value heads, head width, threads.
void attention_sizes(benchmark::internal::Benchmark* b) {
  b->Args({128, 14, 2, 64, 1})->Args({512, 14, 2, 64, 1})->Args({512, 14, 2, 64, 2})->Args({128, 4, 4, 32, 1});
  b->Unit(benchmark::kMillisecond);
}

BENCHMARK(attention_step<false>)->Apply(attention_sizes);
BENCHMARK(attention_step<true>)->Apply(attention_sizes);

// Bytes of values and gradients the nodes from `first` on hold.
template <class T>
double episode_bytes(const Tape<T>& tp, std::size_t first) {
  std::size_t n = 0;
  for (std::size_t i = first; i < tp.size(); ++i) {
    const grad::Node<T>& node = tp.nodes()[i];
    n += node.dims.size() * sizeof(T) * (node.grad ? 2 : 1);
  }
  return static_cast<double>(n);
}

Tensor<float> filled_f32(grad::Shape shape, float start) {
  Tensor<float> t(std::move(shape));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = start + 0.001f * static_cast<float>(i % 97);
  return t;
}

Var<float> rmsnorm_composite(Var<float> x, Var<float> w) {
  const float cols = static_cast<float>(x.tape()->dims(x).back());
  return x / grad::sqrt(grad::row_sum(x * x) / cols + 1e-6f) * w;
}
Var<float> rmsnorm_fused(Var<float> x, Var<float> w) { return grad::rms_norm(x, w, 1e-6f); }

template <Var<float> (*Norm)(Var<float>, Var<float>)>
void rmsnorm_qwen(benchmark::State& state) {
  const std::size_t rows = 512, cols = 896;
  Tape<float> tp;
  Var<float> x = tp.param(filled_f32({rows, cols}, -0.3f));
  Var<float> w = tp.param(filled_f32({cols}, 0.9f));
  const auto m = tp.mark();
  double bytes = 0;
  for (auto _ : state) {
    const std::size_t first = tp.size();
    Var<float> y = Norm(x, w);
    tp.backward(grad::sum(y));
    benchmark::DoNotOptimize(tp.grad(x).data.data());
    bytes = episode_bytes(tp, first);
    tp.reset_to(m);
  }
  state.counters["tape_bytes"] = bytes;
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * rows * cols));
}

Var<float> head_composite(Var<float> x, Var<float> embed) { return grad::matmul(x, grad::transpose(embed)); }
Var<float> head_fused(Var<float> x, Var<float> embed) { return grad::matmul_nt(x, embed); }

// The tied output layer: the embedding a constant, so backward reaches x only.
template <Var<float> (*Head)(Var<float>, Var<float>)>
void tied_head_qwen(benchmark::State& state) {
  const std::size_t rows = 512, d = 896, vocab = 151936;
  Tape<float> tp;
  Var<float> x = tp.param(filled_f32({rows, d}, -0.3f));
  Var<float> embed = tp.constant(filled_f32({vocab, d}, -0.05f));
  const auto m = tp.mark();
  double bytes = 0;
  for (auto _ : state) {
    const std::size_t first = tp.size();
    Var<float> logits = Head(x, embed);
    if (state.range(0)) tp.backward(grad::sum(logits));
    benchmark::DoNotOptimize(tp.value(logits).data.data());
    bytes = episode_bytes(tp, first);
    tp.reset_to(m);
  }
  state.counters["tape_bytes"] = bytes;
}

Var<float> loss_unfused(Var<float> x, Var<float> embed, Var<float> ids) {
  return grad::cross_entropy(grad::matmul_nt(x, embed), ids, -100.f);
}
Var<float> loss_fused(Var<float> x, Var<float> embed, Var<float> ids) {
  return grad::linear_cross_entropy(x, embed, ids, -100.f);
}

// The tied head and its cross-entropy, forward + backward to x (the
// embedding a constant, as under LoRA): cross_entropy(matmul_nt) against
// linear_cross_entropy (the same bits, no [512, 151936] logits on the tape).
// Counters: the episode's bytes on the tape and the tape's arena high-water mark.
template <Var<float> (*Loss)(Var<float>, Var<float>, Var<float>)>
void tied_head_loss_qwen(benchmark::State& state) {
  const std::size_t rows = 512, d = 896, vocab = 151936;
  Tape<float> tp;
  Var<float> x = tp.param(filled_f32({rows, d}, -0.3f));
  Var<float> embed = tp.constant(filled_f32({vocab, d}, -0.05f));
  Tensor<float> targets({rows});
  for (std::size_t i = 0; i < rows; ++i) targets[i] = static_cast<float>(i * 7919 % vocab);
  Var<float> ids = tp.constant(targets);
  const auto m = tp.mark();
  double bytes = 0;
  for (auto _ : state) {
    const std::size_t first = tp.size();
    Var<float> loss = Loss(x, embed, ids);
    tp.backward(loss);
    benchmark::DoNotOptimize(tp.grad(x).data.data());
    bytes = episode_bytes(tp, first);
    tp.reset_to(m);
  }
  state.counters["tape_bytes"] = bytes;
  state.counters["arena_MiB"] = static_cast<double>(tp.arena_bytes()) / (1 << 20);
}

void sizes(benchmark::internal::Benchmark* b) { b->Args({8, 64})->Args({64, 256})->Args({256, 1024}); }

BENCHMARK(row_mean_step<row_mean_by_matmul>)->Apply(sizes);
BENCHMARK(row_mean_step<row_mean_by_op>)->Apply(sizes);
BENCHMARK(rmsnorm_step<row_mean_by_matmul>)->Apply(sizes);
BENCHMARK(rmsnorm_step<row_mean_by_op>)->Apply(sizes);
BENCHMARK(rmsnorm_qwen<rmsnorm_composite>)->Unit(benchmark::kMillisecond);
BENCHMARK(rmsnorm_qwen<rmsnorm_fused>)->Unit(benchmark::kMillisecond);
// Arg: 0 forward only, 1 forward + backward to x.
BENCHMARK(tied_head_qwen<head_composite>)->Arg(0)->Arg(1)->Iterations(2)->Unit(benchmark::kMillisecond);
BENCHMARK(tied_head_qwen<head_fused>)->Arg(0)->Arg(1)->Iterations(2)->Unit(benchmark::kMillisecond);
BENCHMARK(tied_head_loss_qwen<loss_unfused>)->Iterations(2)->Unit(benchmark::kMillisecond);
BENCHMARK(tied_head_loss_qwen<loss_fused>)->Iterations(2)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
