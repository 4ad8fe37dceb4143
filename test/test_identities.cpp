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

// ---- the ops of issue 28: what their values are, exactly ----

TEST_CASE_TEMPLATE("where picks its values bit for bit: signed zeros, inf and NaN pass through", T, double, float) {
  Tape<T> tp;
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  auto cond = tp.constant(Tensor<T>({6}, {1, 0, 1, 0, nan, 0}));  // a NaN mask element counts as true
  auto a = tp.param(Tensor<T>({6}, {T(-0.0), 1, inf, 2, T(-0.0), 3}));
  auto b = tp.param(Tensor<T>({6}, {5, T(-0.0), 6, nan, 7, -inf}));
  auto y = where(cond, a, b);
  REQUIRE(tp.backward(sum(y)));
  const std::vector<T> want = {T(-0.0), T(-0.0), inf, nan, T(-0.0), -inf};
  CHECK(bitwise_equal<T>(tp.value(y).data, want));
  CHECK(bitwise_equal<T>(tp.grad(a).data, std::vector<T>{1, 0, 1, 0, 1, 0}));
  CHECK(bitwise_equal<T>(tp.grad(b).data, std::vector<T>{0, 1, 0, 1, 0, 1}));
}

TEST_CASE_TEMPLATE("pow with torch's special exponents is the plain arithmetic", T, double, float) {
  Rng rng(28);
  Tape<T> tp;
  auto x = tp.constant(random_tensor<T>({40}, rng, 0.1, 3));
  const View<T> v = tp.value(x);
  auto each = [&](T s, auto f) {
    CAPTURE(s);
    auto y = grad::pow(x, s);
    REQUIRE(tp.ok());
    std::vector<T> want(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) want[i] = f(v[i]);
    CHECK(bitwise_equal<T>(tp.value(y).data, want));
  };
  each(T(2), [](T a) { return a * a; });
  each(T(3), [](T a) { return a * a * a; });
  each(T(-1), [](T a) { return T(1) / a; });
  each(T(-2), [](T a) { return T(1) / (a * a); });
  each(T(0.5), [](T a) { return std::sqrt(a); });
  each(T(-0.5), [](T a) { return T(1) / std::sqrt(a); });
  each(T(0), [](T) { return T(1); });
  each(T(1.5), [](T a) { return exact_exp(T(1.5) * exact_log(a)); });
}

TEST_CASE_TEMPLATE("pow's edge values are std::pow's", T, double, float) {
  const T inf = std::numeric_limits<T>::infinity();
  CHECK(power_of(T(-2), T(3)) == T(-8));
  CHECK(power_of(T(-2), T(-3)) == T(-0.125));
  CHECK(std::isnan(power_of(T(-2), T(1.5))));
  CHECK(power_of(T(0), T(1.5)) == T(0));
  CHECK(power_of(T(0), T(-1.5)) == inf);
  CHECK(power_of(std::numeric_limits<T>::quiet_NaN(), T(0)) == T(1));
  CHECK(power_of(inf, T(0.25)) == inf);
  CHECK(power_of(T(10), T(400)) == inf);
}

TEST_CASE_TEMPLATE("pow at std::pow's special points: 1^inf, 1^NaN, (-1)^inf, huge integer exponents, (-x)^-inf",
                   T, double, float) {
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  struct Case {
    T x, s;
  };
  const Case cases[] = {{1, inf},         {1, -inf},         {1, nan},           {-1, inf},         {-1, -inf},
                        {-1, 2097152},    {-1, 2097153},     {-1, -2097153},     {T(-0.999999), 2000001},
                        {T(-0.999999), 2000000}, {T(0.999999), 2000001}, {T(-2.5), -inf}, {T(-2.5), inf},
                        {T(-0.5), inf},   {T(-0.5), -inf},   {T(0.5), inf},      {-3, 1048577},     {-3, -1048577},
                        {-3, 1048578},    {0, inf},          {0, -inf},          {T(-0.0), 2097153}, {-inf, 2097153},
                        {2, 16777216},    {T(1.0000001), T(16777217)}};
  for (const Case& c : cases) {
    CAPTURE(c.x);
    CAPTURE(c.s);
    const T want = std::pow(c.x, c.s), got = power_of(c.x, c.s);
    CAPTURE(want);
    CAPTURE(got);
    REQUIRE(!std::isnan(want));  // every case is a number, for std::pow and torch
    CHECK(std::signbit(got) == std::signbit(want));
    if (!std::isfinite(want) || want == T(0) || want == T(1) || want == T(-1))
      CHECK(got == want);  // the exact ones exactly
    else  // exp(s ln|x|): a few ulp of s ln|x| apart
      CHECK(got == doctest::Approx(want).epsilon(std::is_same_v<T, float> ? 2e-6 : 1e-12));
  }
  if constexpr (std::is_same_v<T, double>) CHECK(power_of(-0.999999, 2000001.0) == doctest::Approx(-0.135335).epsilon(1e-5));
  CHECK(std::isnan(power_of(T(-1), nan)));  // as std::pow: only 1^NaN is a number
  CHECK(std::isnan(power_of(T(-2), T(2097152.5))));
}

TEST_CASE_TEMPLATE("pow's gradient at those points: 0 for an infinite exponent, the formula for a huge integer one", T,
                   double, float) {
  const T inf = std::numeric_limits<T>::infinity(), nan = std::numeric_limits<T>::quiet_NaN();
  // d/da of a^b for one element, through pow(a, b) and pow_scalar(a, b).
  auto grads = [](T a, T b) {
    Tape<T> tp;
    auto x = tp.param(Tensor<T>({1}, {a}));
    auto e = tp.constant(Tensor<T>({1}, {b}));
    REQUIRE(tp.backward(sum(grad::pow(x, e))));
    const T binary = tp.grad(x)[0];
    Tape<T> tp2;
    auto x2 = tp2.param(Tensor<T>({1}, {a}));
    REQUIRE(tp2.backward(sum(grad::pow(x2, b))));
    return std::pair{binary, tp2.grad(x2)[0]};
  };
  auto check = [&](T a, T b, auto want) {
    CAPTURE(a);
    CAPTURE(b);
    const auto [binary, scalar] = grads(a, b);
    want(binary);
    want(scalar);
  };
  auto is = [](T v) { return [v](T g) { CHECK(g == v); }; };
  for (T b : {inf, -inf})
    for (T a : {T(1), T(-1), T(-2.5), T(0.5), T(-0.5), T(3), T(0)}) check(a, b, is(T(0)));
  check(T(-1), T(2097152), is(T(-2097152)));
  check(T(-1), T(2097153), is(T(2097153)));
  check(T(-0.999999), T(2000001), [](T g) {
    CHECK(g == doctest::Approx(T(2000001) * std::pow(T(-0.999999), T(2000000))).epsilon(std::is_same_v<T, float> ? 2e-6 : 1e-12));
  });
  check(T(-3), T(1048577), is(inf));                           // the gradient of a power that overflowed
  check(T(1), nan, [](T g) { CHECK(std::isnan(g)); });         // a NaN exponent's, documented
  // d/db at a positive base: y ln a, 0 at 1^inf and 1^NaN.
  Tape<T> tp;
  auto a = tp.constant(Tensor<T>({3}, {1, 1, T(0.5)}));
  auto b = tp.param(Tensor<T>({3}, {inf, nan, inf}));
  REQUIRE(tp.backward(sum(grad::pow(a, b))));
  CHECK(tp.grad(b)[0] == T(0));
  CHECK(tp.grad(b)[1] == T(0));
  CHECK(tp.grad(b)[2] == T(0));
}

TEST_CASE_TEMPLATE("log_softmax is (x - max) - log(sum exp(x - max)), finite where log(softmax) is not", T, double,
                   float) {
  Tape<T> tp;
  auto x = tp.param(Tensor<T>({2, 3}, {1000, 0, -1000, 1, 2, 3}));
  auto y = log_softmax(x);
  auto naive = grad::log(softmax(x, -1));
  REQUIRE(tp.backward(sum(y)));
  const View<T> v = tp.value(y);
  for (std::size_t r = 0; r < 2; ++r) {
    const T* row = tp.value(x).data.data() + 3 * r;
    const T hi = std::max({row[0], row[1], row[2]});
    const T lse = exact_log(exact_exp(row[0] - hi) + exact_exp(row[1] - hi) + exact_exp(row[2] - hi));
    for (std::size_t i = 0; i < 3; ++i) {
      const T want = (row[i] - hi) - lse;
      CHECK(std::memcmp(&v[3 * r + i], &want, sizeof(T)) == 0);
    }
  }
  CHECK(v[0] == T(0));
  CHECK(v[2] == T(-2000));
  CHECK(std::isinf(tp.value(naive)[2]));  // what one node avoids
  for (T g : tp.grad(x).data) CHECK(std::isfinite(g));
}

TEST_CASE("max and min over an axis: shapes with and without the axis") {
  Tape<double> tp;
  auto x = tp.param(Tensor<double>({2, 3, 4}, std::vector<double>(24, 1.0)));
  auto shape = [&](Var<double> y) {
    const View<double> v = tp.value(y);
    return Shape(v.shape.begin(), v.shape.end());
  };
  CHECK(shape(grad::max(x, 1)) == Shape{2, 1, 4});
  CHECK(shape(grad::max(x, 1, false)) == Shape{2, 4});
  CHECK(shape(grad::min(x, -1, false)) == Shape{2, 3});
  auto v = tp.param(Tensor<double>({5}, {3, -1, 4, -1, 5}));
  auto lo = grad::min(v, 0, false);
  CHECK(shape(lo) == Shape{1});
  REQUIRE(tp.backward(sum(lo)));
  CHECK(bitwise_equal<double>(tp.grad(v).data, std::vector<double>{0, 0.5, 0, 0.5, 0}));  // the tie shares
}
