// Steady state: after the first episode, a mark/reset minibatch loop makes no
// heap allocations at all. Counted by replacing the global operator new.
#include <doctest/doctest.h>

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
