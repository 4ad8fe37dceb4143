// Exact identities, checked bit for bit: the documented accumulation orders
// are what the tape actually does.
#include <doctest/doctest.h>

#include "support.hpp"

using namespace grad;
using namespace grad::testing;

TEST_CASE_TEMPLATE("d/dx sum(x*x) is exactly 2x", T, double, float) {
  Rng rng(1);
  Tape<T> tp;
  auto x = tp.param(random_tensor<T>({7, 5}, rng, -3, 3));
  REQUIRE(tp.backward(sum(x * x)));
  const View<T> g = tp.grad(x), v = tp.value(x);
  std::vector<T> twice(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) twice[i] = T(2) * v[i];
  CHECK(bitwise_equal<T>(g.data, twice));
}

// The documented order of every full reduction (README, grad/tags/reduce.hpp),
// written out here from its definition rather than from the library's code:
// 32 lanes, lane j summing j, j+32, ... ascending from zero, a fixed tree
// (w = 16, 8, 4, 2, 1), chunks of 4096 reduced level by level.
template <class T>
T documented_sum(std::vector<T> v, int level = 0) {
  if (v.size() > 4096 && level < 4) {
    std::vector<T> next;
    for (std::size_t c = 0; c < v.size(); c += 4096)
      next.push_back(documented_sum(std::vector<T>(v.begin() + c, v.begin() + std::min(v.size(), c + 4096)), 4));
    return documented_sum(std::move(next), level + 1);
  }
  T lane[32] = {};
  for (std::size_t i = 0; i < v.size(); ++i) lane[i % 32] = lane[i % 32] + v[i];
  for (std::size_t w = 16; w > 0; w /= 2)
    for (std::size_t j = 0; j < w; ++j) lane[j] = lane[j] + lane[j + w];
  return lane[0];
}

TEST_CASE_TEMPLATE("forward sum, mean and row_sum follow the documented order (32 lanes, fixed tree, chunks)", T,
                   double, float) {
  Rng rng(2);
  for (const Shape& shape :
       {Shape{13, 17}, Shape{1}, Shape{31}, Shape{32}, Shape{33}, Shape{4096}, Shape{3, 4099}, Shape{5, 7, 1000}}) {
    CAPTURE(shape_string(Dims::of(shape)));
    const Tensor<T> t = random_tensor<T>(shape, rng, -1e3, 1e3);
    const std::vector<T> all(t.data().begin(), t.data().end());
    const T acc = documented_sum(all), expected_mean = acc / T(t.size());
    // The order is not the serial chain (else this test would pin nothing new).
    T serial = 0;
    for (T e : all) serial = serial + e;
    if (t.size() >= 1000) CHECK(std::memcmp(&serial, &acc, sizeof(T)) != 0);
    Tape<T> tp;
    auto x = tp.constant(t);
    const T s = tp.scalar(sum(x)), m = tp.scalar(mean(x));
    CHECK(std::memcmp(&s, &acc, sizeof(T)) == 0);
    CHECK(std::memcmp(&m, &expected_mean, sizeof(T)) == 0);
    // row_sum sums each row in the same order: a single row equals sum.
    const std::size_t n = shape.back(), rows = t.size() / n;
    const View<T> r = tp.value(row_sum(x));
    REQUIRE(r.size() == rows);
    for (std::size_t i = 0; i < rows; ++i) {
      const T want = documented_sum(std::vector<T>(all.begin() + i * n, all.begin() + (i + 1) * n));
      CHECK(std::memcmp(&r[i], &want, sizeof(T)) == 0);
    }
  }
}

TEST_CASE_TEMPLATE("matmul equals a plain loop of fmas accumulating in ascending k, forward and backward", T, double, float) {
  Rng rng(3);
  const std::size_t m = 5, k = 9, n = 4;
  const Tensor<T> a = random_tensor<T>({m, k}, rng), b = random_tensor<T>({k, n}, rng),
                  w = random_tensor<T>({m, n}, rng);
  Tape<T> tp;
  auto va = tp.param(a), vb = tp.param(b);
  auto y = matmul(va, vb);
  REQUIRE(tp.backward(sum(y * tp.constant(w))));
  std::vector<T> c(m * n), da(m * k), db(k * n);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      T acc = 0;
      for (std::size_t p = 0; p < k; ++p) acc = grad::fma_hd(a[i * k + p], b[p * n + j], acc);
      c[i * n + j] = acc;
    }
  // upstream gradient of y is w * 1 (sum's gradient is exactly 1)
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t p = 0; p < k; ++p) {
      T acc = 0;
      for (std::size_t j = 0; j < n; ++j) acc = grad::fma_hd(w[i * n + j], b[p * n + j], acc);
      da[i * k + p] = acc;
    }
  for (std::size_t p = 0; p < k; ++p)
    for (std::size_t j = 0; j < n; ++j) {
      T acc = 0;
      for (std::size_t i = 0; i < m; ++i) acc = grad::fma_hd(a[i * k + p], w[i * n + j], acc);
      db[p * n + j] = acc;
    }
  CHECK(bitwise_equal<T>(tp.value(y).data, c));
  CHECK(bitwise_equal<T>(tp.grad(va).data, da));
  CHECK(bitwise_equal<T>(tp.grad(vb).data, db));
}

TEST_CASE_TEMPLATE("a broadcast operand's gradient sums its outputs in ascending order", T, double, float) {
  Rng rng(4);
  const Tensor<T> g = random_tensor<T>({6, 3}, rng, -5, 5);
  Tape<T> tp;
  auto a = tp.param(random_tensor<T>({6, 3}, rng)), bias = tp.param(random_tensor<T>({3}, rng));
  REQUIRE(tp.backward(sum((a + bias) * tp.constant(g))));
  std::vector<T> expected(3, T(0));
  for (std::size_t r = 0; r < 6; ++r)
    for (std::size_t c = 0; c < 3; ++c) expected[c] = expected[c] + g[r * 3 + c];
  CHECK(bitwise_equal<T>(tp.grad(bias).data, expected));
}

TEST_CASE_TEMPLATE("an episode after reset_to is bitwise equal to the one before it", T, double, float) {
  Rng rng(5);
  Tape<T> tp;
  auto w1 = tp.param(random_tensor<T>({4, 8}, rng)), b1 = tp.param(random_tensor<T>({8}, rng));
  auto w2 = tp.param(random_tensor<T>({8, 2}, rng));
  const Tensor<T> x = random_tensor<T>({5, 4}, rng), target = random_tensor<T>({5, 2}, rng);
  const auto m = tp.mark();
  auto episode = [&] {
    auto h = grad::tanh(matmul(tp.constant(x), w1) + b1);
    auto y = softmax(matmul(h, w2), -1);
    auto loss = mse(y, tp.constant(target)) + mean(sigmoid(h)) * T(0.1);
    REQUIRE(tp.backward(loss));
    std::vector<T> out{tp.scalar(loss)};
    for (auto p : {w1, b1, w2}) out.insert(out.end(), tp.grad(p).begin(), tp.grad(p).end());
    return out;
  };
  const std::vector<T> first = episode();
  const std::size_t nodes = tp.size();
  tp.reset_to(m);
  CHECK(tp.size() == 3);
  for (auto p : {w1, b1, w2})
    for (T e : tp.grad(p)) CHECK(e == T(0));  // survivors' gradients zeroed
  const std::vector<T> second = episode();
  CHECK(tp.size() == nodes);
  CHECK(bitwise_equal<T>(first, second));
}
