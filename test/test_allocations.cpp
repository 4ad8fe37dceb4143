// Steady state: after the first episode, a mark/reset minibatch loop makes no
// heap allocations at all. Counted by replacing the global operator new.
#include <doctest/doctest.h>

#include <bit>
#include <cstring>
#include <vector>

#include "counting_allocator.hpp"
#include "support.hpp"

using namespace grad;
using namespace grad::testing;

TEST_CASE_TEMPLATE("a mark/reset minibatch loop allocates nothing after the first episode", T, double, float) {
  Rng rng(9);
  Tape<T> tp;
  auto w1 = tp.param(random_tensor<T>({6, 16}, rng)), b1 = tp.param(random_tensor<T>({16}, rng));
  auto w2 = tp.param(random_tensor<T>({16, 6}, rng));
  const Tensor<T> data = random_tensor<T>({64, 6}, rng);
  auto x = tp.constant(Tensor<T>({32, 6}));  // the minibatch slot, refreshed in place
  Adam<T> opt(T(0.01));
  for (auto p : {w1, b1, w2}) opt.add(p, T(1e-4));
  opt.set_clip(T(1));  // the global norm and the clip scale, on every step
  const auto m = tp.mark();

  auto episode = [&](std::size_t batch) {
    std::span<T> rows = tp.leaf_value(x);
    std::copy_n(data.data().begin() + static_cast<std::ptrdiff_t>((batch % 2) * rows.size()), rows.size(),
                rows.begin());
    auto h = grad::tanh(matmul(x, w1) + b1);
    auto parts = concat(slice(h, {0, 0}, {32, 8}), slice(h, {0, 8}, {32, 16}), -1);
    auto y = matmul(sigmoid(parts) * h, w2);
    auto loss = mse(y, x) + mean(softmax(reshape(y, {16, 12}), -1)) + sum(transpose(h) * T(0.01));
    if (!tp.backward(loss)) return;  // no doctest macro inside the counted loop: they may allocate
    if (!opt.step()) return;
    tp.reset_to(m);
  };

  episode(0);  // warm-up: arenas and scratch grow to their steady size
  const long before = allocations.load();
  for (std::size_t b = 1; b <= 20; ++b) episode(b);
  const long during = allocations.load() - before;
  CHECK(tp.ok());
  CHECK(during == 0);
}

TEST_CASE("after add, SGD and Adam steps allocate nothing") {
  Rng rng(10);
  Tape<double> tp;
  auto a = tp.param(random_tensor<double>({4, 3}, rng)), b = tp.param(random_tensor<double>({3}, rng));
  Adam adam(0.1);
  SGD sgd(0.1);
  REQUIRE(adam.add(a, 0.1));
  REQUIRE(adam.add(b));
  REQUIRE(sgd.add(a, 0.1));
  adam.set_clip(1.0);
  sgd.set_clip(1.0);
  REQUIRE(tp.backward(sum(matmul(a, reshape(b, {3, 1})))));
  const long before = allocations.load();
  bool ok = true;
  for (int i = 0; i < 5; ++i) ok = adam.step() && sgd.step() && ok;
  const long during = allocations.load() - before;
  CHECK(ok);
  CHECK(during == 0);
  CHECK(adam.steps() == 5);
}

TEST_CASE("the fused loss computes its logits in the idle recompute scope memory, not a buffer of its own") {
  // 64 rows against 300 classes: the loss's logits chunk is 64 x 300 floats (76,800 bytes). Where
  // a recompute scope has run, its memory (256 KiB at least) is idle when the loss records, and
  // the tape lends it; without one the loss allocates the chunk every step. The same bits.
  const std::size_t rows = 64, d = 32, classes = 300;
  auto run = [&](bool scoped, std::size_t& largest) {
    Rng rng(11);
    Tape<float> tp;
    const Var<float> x = tp.constant(random_tensor<float>({rows, d}, rng));
    const Var<float> w1 = tp.param(random_tensor<float>({d, d}, rng, -0.3, 0.3));
    const Var<float> w = tp.constant(random_tensor<float>({classes, d}, rng, -0.3, 0.3));  // frozen: dh kept
    Tensor<float> ids({rows});
    for (std::size_t r = 0; r < rows; ++r) ids.data()[r] = static_cast<float>((r * 37) % classes);
    const Var<float> id = tp.constant(ids);
    const auto m = tp.mark();
    float loss_value = 0;
    auto step = [&] {
      auto block = [&] { return grad::tanh(matmul(x, w1)); };
      const Var<float> h = scoped ? recompute(tp, block) : block();
      const Var<float> loss = linear_cross_entropy(h, w, id);
      const bool ok = tp.backward(loss);
      loss_value = tp.value(loss).data[0];
      return ok;
    };
    bool ok = step();
    tp.reset_to(m);
    largest_allocation = 0;
    for (int i = 0; i < 3; ++i) {
      ok = step() && ok;
      if (i < 2) tp.reset_to(m);
    }
    largest = largest_allocation.load();
    CHECK(ok);
    const View<float> g = tp.grad(w1);
    return std::pair{loss_value, std::vector<float>(g.data.begin(), g.data.end())};
  };
  std::size_t largest_scoped = 0, largest_plain = 0;
  const auto [loss_scoped, grad_scoped] = run(true, largest_scoped);
  const auto [loss_plain, grad_plain] = run(false, largest_plain);
  CHECK(std::bit_cast<std::uint32_t>(loss_scoped) == std::bit_cast<std::uint32_t>(loss_plain));
  REQUIRE(grad_scoped.size() == grad_plain.size());
  CHECK(std::memcmp(grad_scoped.data(), grad_plain.data(), grad_scoped.size() * sizeof(float)) == 0);
  CHECK(largest_plain >= rows * classes * sizeof(float));
  CHECK(largest_scoped < rows * classes * sizeof(float));
}
