// A program that uses grad the way a downstream project would. It checks
// one gradient by hand, then trains a small tanh network with Adam for a few
// steps and prints a hash of the parameters' bits: run.sh builds it in
// several modes and at several -O levels and requires the same hash.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <grad/grad.hpp>

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
  std::uint64_t hash = 1469598103934665603ull;  // FNV-1a over every parameter's bits
  for (auto p : {w1, b1, w2, b2})
    for (T v : tp.value(p)) {
      unsigned char bytes[sizeof(T)];
      std::memcpy(bytes, &v, sizeof(T));
      for (unsigned char c : bytes) hash = (hash ^ c) * 1099511628211ull;
    }
  return hash;
}

int main() {
  grad::Tape<double> tp;
  auto x = tp.param(grad::Tensor<double>({3}, {1, 2, 3}));
  if (!tp.backward(grad::sum(x * x))) return 1;
  const auto g = tp.grad(x);
  const bool ok = g[0] == 2 && g[1] == 4 && g[2] == 6;
  std::printf("consumer: d/dx sum(x^2) = [%g, %g, %g] %s\n", g[0], g[1], g[2], ok ? "ok" : "WRONG");
  const std::uint64_t h64 = train_and_hash<double>(), h32 = train_and_hash<float>();
  std::printf("consumer: trained parameters' bits: f64 %016llx f32 %016llx\n", static_cast<unsigned long long>(h64),
              static_cast<unsigned long long>(h32));
  return ok && h64 != 0 && h32 != 0 ? 0 : 1;
}
