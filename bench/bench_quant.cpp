// A frozen base held in llama.cpp's quantized blocks, read by the products
// that use it: one output row (a decoding step's x . W^T with W [out, in]
// held as llama.cpp holds it) and a prefill's [rows, in] block, for each
// storage at Qwen2.5-1.5B's MLP shape (in 1536, out 8960) and its
// attention output (1536 x 1536). Counters: the weights' bytes read per
// second and the weights per second (each dequantized exactly, then one fma
// per output and term: the same bits as over the dequantized floats).
//
//   build/bench/bench_quant --benchmark_filter=row --benchmark_repetitions=5
//
// The f32 rows are the native matrix held [in, out] (the decoder's native
// layout: rows streamed, no transposition) and held [out, in] (the layout
// the quantized ones share).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <grad/grad.hpp>
#include <grad/numerics/gemm.hpp>
#include <grad/numerics/held.hpp>
#include <vector>

namespace {

using grad::Storage;

struct Held {
  std::vector<float> x, y, w;
  std::vector<std::uint8_t> blocks;
  const float* b = nullptr;
  std::size_t bytes = 0;
};

// x [rows, in], W [in, out] held as `s` ([out, in] rows of blocks; f32 as
// the product's `transposed` says: random values either way).
Held make(Storage s, std::size_t rows, std::size_t in, std::size_t out) {
  Held h;
  grad::SplitMix64 g(7);
  h.x.resize(rows * in);
  h.y.resize(rows * out);
  h.w.resize(in * out);
  for (float& v : h.x) v = static_cast<float>(g.uniform(-1, 1));
  for (float& v : h.w) v = static_cast<float>(g.uniform(-0.05, 0.05));
  h.b = h.w.data();
  h.bytes = h.w.size() * sizeof(float);
  if (s != Storage::native) {
    h.blocks.resize(grad::held_bytes(s, in * out, sizeof(float)));
    grad::quantize(grad::quant_format(s), h.w.data(), h.blocks.data(), in * out);
    h.b = reinterpret_cast<const float*>(h.blocks.data());
    h.bytes = h.blocks.size();
  }
  return h;
}

// range(3) copies of the matrix, used in turn: with enough of them the
// weights stream from memory, as a decoding step's do (each layer's matrices
// are read once per token), instead of waiting in the last-level cache.
void product(benchmark::State& state, Storage s, bool transposed) {
  const auto rows = static_cast<std::size_t>(state.range(0)), in = static_cast<std::size_t>(state.range(1)),
             out = static_cast<std::size_t>(state.range(2)), copies = static_cast<std::size_t>(state.range(3));
  grad::set_num_threads(1);
  std::vector<Held> held;
  for (std::size_t c = 0; c < copies; ++c) held.push_back(make(s, rows, in, out));
  std::size_t turn = 0;
  for (auto _ : state) {
    Held& h = held[turn++ % copies];
    grad::gemm_nn(h.x.data(), h.b, h.y.data(), rows, in, out, s, transposed);
    benchmark::DoNotOptimize(h.y.data());
    benchmark::ClobberMemory();
  }
  const Held& h = held[0];
  const double n = static_cast<double>(state.iterations());
  state.counters["weight_GB/s"] = benchmark::Counter(static_cast<double>(h.bytes) * n, benchmark::Counter::kIsRate);
  state.counters["Gweights/s"] =
      benchmark::Counter(static_cast<double>(in * out) * n * 1e-9, benchmark::Counter::kIsRate);
  state.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * static_cast<double>(rows * in * out) * n * 1e-9, benchmark::Counter::kIsRate);
}

void shapes(benchmark::internal::Benchmark* b) {
  // Cache-resident (one copy) and streamed from memory (copies > 32 MiB of last-level cache).
  b->Args({1, 1536, 8960, 1})->Args({1, 1536, 1536, 1})->Args({1, 1536, 8960, 8})->Unit(benchmark::kMillisecond)->UseRealTime();
  // The 124M shape's (hidden 768, MLP 3072, vocabulary 50,304), streamed.
  b->Args({1, 768, 3072, 16})->Args({1, 3072, 768, 16})->Args({1, 768, 50304, 2});
}
void prefill(benchmark::internal::Benchmark* b) {
  b->Args({128, 1536, 8960, 1})->Unit(benchmark::kMillisecond)->UseRealTime();
}

}  // namespace

BENCHMARK_CAPTURE(product, row_f32_in_out, Storage::native, false)->Apply(shapes);
BENCHMARK_CAPTURE(product, row_f32_out_in, Storage::native, true)->Apply(shapes);
BENCHMARK_CAPTURE(product, row_q8_0, Storage::q8_0, true)->Apply(shapes);
BENCHMARK_CAPTURE(product, row_q4_0, Storage::q4_0, true)->Apply(shapes);
BENCHMARK_CAPTURE(product, row_q4_k, Storage::q4_k, true)->Apply(shapes);
BENCHMARK_CAPTURE(product, row_q5_k, Storage::q5_k, true)->Apply(shapes);
BENCHMARK_CAPTURE(product, row_q6_k, Storage::q6_k, true)->Apply(shapes);
BENCHMARK_CAPTURE(product, prefill_f32, Storage::native, false)->Apply(prefill);
BENCHMARK_CAPTURE(product, prefill_q8_0, Storage::q8_0, true)->Apply(prefill);
BENCHMARK_CAPTURE(product, prefill_q4_k, Storage::q4_k, true)->Apply(prefill);
BENCHMARK_CAPTURE(product, prefill_q6_k, Storage::q6_k, true)->Apply(prefill);

BENCHMARK_MAIN();
