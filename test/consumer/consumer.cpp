// A program that uses grad the way a downstream project would. It checks
// one gradient by hand, then trains a small tanh network with Adam for a few
// steps, and a classifier built from modules over Batches with int64 labels,
// and prints a hash of the parameters' bits: run.sh builds it in several
// modes and at several -O levels, with -Wall -Wextra -Wshadow -Wconversion
// -Werror (grad's headers must compile warning-free in a strict project),
// and requires the same hash.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <grad/grad.hpp>
#include <initializer_list>
#include <vector>

template <class T>
std::uint64_t hash_values(const grad::Tape<T>& tp, std::initializer_list<grad::Var<T>> params) {
  std::uint64_t hash = 1469598103934665603ull;  // FNV-1a over every parameter's bits
  for (auto p : params)
    for (T v : tp.value(p)) {
      unsigned char bytes[sizeof(T)];
      std::memcpy(bytes, &v, sizeof(T));
      for (unsigned char c : bytes) hash = (hash ^ c) * 1099511628211ull;
    }
  return hash;
}

// The everyday path: modules, Batches with int64 labels, cross_entropy_labels, Adam<float>.
std::uint64_t classify_and_hash() {
  grad::Tape<float> tp;
  grad::SplitMix64 gen(3);
  auto model = grad::nn::mlp<float>(tp, {4, 8, 3}, gen);
  grad::Adam<float> opt(1e-2f);
  grad::nn::add_parameters(opt, model, {.weights = 1e-4, .others = 0});
  grad::Tensor<float> x({12, 4});
  std::vector<std::int64_t> labels(12);
  for (std::size_t r = 0; r < 12; ++r) {
    for (std::size_t c = 0; c < 4; ++c) x[r * 4 + c] = static_cast<float>(gen.uniform(-1, 1));
    labels[r] = static_cast<std::int64_t>(r % 3);
  }
  grad::Batches<float> batches(x, labels, {.batch = 5, .last = grad::LastBatch::keep, .seed = 1});
  const auto mark = tp.mark();
  for (int epoch = 0; epoch < 3; ++epoch)
    for (const auto& b : batches.epoch()) {
      tp.reset_to(mark);
      if (!tp.backward(grad::cross_entropy_labels(model(tp.constant(b.inputs)), b.labels)) || !opt.step()) return 0;
    }
  std::uint64_t hash = 0;
  for (const auto& p : model.parameters()) hash = hash * 31 + hash_values(tp, {p.var});
  return hash;
}

template <class T>
std::uint64_t train_and_hash() {
  grad::SplitMix64 rng{5};
  auto random = [&](grad::Shape shape) {
    grad::Tensor<T> t(shape);
    for (T& v : t.data()) v = static_cast<T>(rng.uniform(-1, 1));
    return t;
  };
  grad::Tape<T> tp;
  // 37 rows and odd widths: whole vectors and ragged tails on every instruction set.
  auto x = tp.constant(random({37, 5}));
  auto w1 = tp.param(random({5, 19})), b1 = tp.param(random({19}));
  auto w2 = tp.param(random({19, 3})), b2 = tp.param(random({3}));
  grad::Adam<T> opt(T(0.01));
  for (auto p : {w1, b1, w2, b2}) opt.add(p, T(1e-4));
  const auto mark = tp.mark();
  for (int step = 0; step < 5; ++step) {
    auto h = grad::tanh(grad::matmul(x, w1) + b1);
    auto y = grad::sigmoid(grad::matmul(h, w2) + b2);
    auto loss = grad::mean(y * y - grad::exp(y) / T(3));
    if (!tp.backward(loss) || !opt.step()) return 0;
    tp.reset_to(mark);
  }
  return hash_values(tp, {w1, b1, w2, b2});
}

int main() {
  grad::Tape<double> tp;
  auto x = tp.param(grad::Tensor<double>({3}, {1, 2, 3}));
  if (!tp.backward(grad::sum(x * x))) return 1;
  const auto g = tp.grad(x);
  const bool ok = g[0] == 2 && g[1] == 4 && g[2] == 6;
  std::printf("consumer: d/dx sum(x^2) = [%g, %g, %g] %s\n", g[0], g[1], g[2], ok ? "ok" : "WRONG");
  const std::uint64_t h64 = train_and_hash<double>(), h32 = train_and_hash<float>(), hc = classify_and_hash();
  std::printf("consumer: trained parameters' bits: f64 %016llx f32 %016llx classifier %016llx\n",
              static_cast<unsigned long long>(h64), static_cast<unsigned long long>(h32),
              static_cast<unsigned long long>(hc));
  return ok && h64 != 0 && h32 != 0 && hc != 0 ? 0 : 1;
}
