// Second-order derivatives (grad/func.hpp over Tape<Dual<T>>): every op
// that carries a tangent against central differences of its forward (the
// tangent) and of its gradient (the Hessian-vector product), and every case
// of the op table (op_cases.hpp) against float64 PyTorch's JVP and HVP
// (oracle/second_order_cases.py); the value parts against the plain tape bit
// for bit; Hessians against analytic ones and PyTorch's; docs/second_order.md's
// worked examples (Newton's method, a Laplace approximation, WGAN-GP's
// penalty and a physics-informed fit, the last three against torch's
// create_graph=True or torch.autograd.functional: oracle/second_order.py);
// and bad input. The suite never runs Python: the oracles' headers are
// committed.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <grad/func.hpp>
#include <map>
#include <numeric>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "op_cases.hpp"
#include "oracle/second_order_cases_golden.hpp"
#include "oracle/second_order_golden.hpp"
#include "support.hpp"

using namespace grad;
using namespace grad::testing;
using D = Dual<double>;

namespace {

// The golden inputs test/oracle/second_order.py builds the same way: element
// (i, j) is ((offset + 5 i + 3 j) % 13 - 6) / 16, exact in float and double.
Tensor<double> grid(std::size_t rows, std::size_t cols, std::size_t offset) {
  Tensor<double> t({rows, cols});
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) t[i * cols + j] = (double((offset + 5 * i + 3 * j) % 13) - 6) / 16.0;
  return t;
}

// f(x) on a plain tape: the values a dual tape's value parts must equal.
template <class T, class F>
Tensor<T> plain_forward(F f, const Tensor<T>& x) {
  Tape<T> tp;
  const Var<T> out = f(tp.param(x));
  REQUIRE(tp.ok());
  return tp.value(out).tensor();
}

Tensor<double> axpy(const Tensor<double>& x, double a, const Tensor<double>& v) {
  Tensor<double> y = x;
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = x[i] + a * v[i];
  return y;
}

double max_abs(const Tensor<double>& t) {
  double m = 0;
  for (double x : t.data()) m = std::max(m, std::abs(x));
  return m;
}

// |a - b| <= tol * (1 + max|b|) element by element.
void check_close(const Tensor<double>& a, const Tensor<double>& b, double tol) {
  REQUIRE(a.shape() == b.shape());
  const double scale = 1 + max_abs(b);
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    CHECK(std::abs(a[i] - b[i]) <= tol * scale);
  }
}

// The whole check for one function f (any output shape) at x:
//  - jvp: the value part has the plain tape's bits, the tangent matches
//    central differences of f along v;
//  - hvp of s(x) = sum(f(x) * w) (fixed random weights): the value and the
//    gradient have value_and_grad's bits, H v matches central differences
//    of the gradient along v, and the directional derivative is grad . v.
template <class F>
void check_function(const std::string& name, F f, const Tensor<double>& x, std::uint64_t seed) {
  CAPTURE(name);
  Rng rng(seed);
  const Tensor<double> v = random_tensor<double>(x.shape(), rng);

  const func::JvpResult<double> j = func::jvp(f, x, v);
  const Tensor<double> plain = plain_forward<double>(f, x);
  CHECK(bitwise_equal<double>(j.value.data(), plain.data()));
  const double h = 1e-6;
  Tensor<double> fd = plain_forward<double>(f, axpy(x, h, v));
  const Tensor<double> below = plain_forward<double>(f, axpy(x, -h, v));
  for (std::size_t i = 0; i < fd.size(); ++i) fd[i] = (fd[i] - below[i]) / (2 * h);
  check_close(j.tangent, fd, 1e-6);

  const Tensor<double> w = random_tensor<double>(plain.shape(), rng, 0.5, 1.5);
  auto s = [&](auto xv) { return sum(f(xv) * func::constant(xv, w)); };
  const func::HvpResult<double> r = func::hvp(s, x, v);
  const func::GradResult<double> g = func::value_and_grad(s, x);
  CHECK(std::memcmp(&r.value, &g.value, sizeof(double)) == 0);
  CHECK(bitwise_equal<double>(r.grad.data(), g.grad.data()));
  double dot = 0;
  for (std::size_t i = 0; i < v.size(); ++i) dot += g.grad[i] * v[i];
  CHECK(std::abs(r.directional - dot) <= 1e-12 * (1 + std::abs(dot)));
  const double k = 1e-5;
  Tensor<double> gfd = func::value_and_grad(s, axpy(x, k, v)).grad;
  const Tensor<double> gbelow = func::value_and_grad(s, axpy(x, -k, v)).grad;
  for (std::size_t i = 0; i < gfd.size(); ++i) gfd[i] = (gfd[i] - gbelow[i]) / (2 * k);
  check_close(r.hvp, gfd, 1e-6);
}

// Solves a x = b (n x n, row-major) by Gaussian elimination with partial pivoting.
std::vector<double> solve(std::vector<double> a, std::vector<double> b) {
  const std::size_t n = b.size();
  for (std::size_t c = 0; c < n; ++c) {
    std::size_t p = c;
    for (std::size_t r = c + 1; r < n; ++r)
      if (std::abs(a[r * n + c]) > std::abs(a[p * n + c])) p = r;
    for (std::size_t k = 0; k < n; ++k) std::swap(a[c * n + k], a[p * n + k]);
    std::swap(b[c], b[p]);
    for (std::size_t r = c + 1; r < n; ++r) {
      const double m = a[r * n + c] / a[c * n + c];
      for (std::size_t k = c; k < n; ++k) a[r * n + k] -= m * a[c * n + k];
      b[r] -= m * b[c];
    }
  }
  std::vector<double> x(n);
  for (std::size_t r = n; r-- > 0;) {
    double s = b[r];
    for (std::size_t k = r + 1; k < n; ++k) s -= a[r * n + k] * x[k];
    x[r] = s / a[r * n + r];
  }
  return x;
}

// Logistic regression's mean negative log-likelihood of weights w [d, 1]
// on rows X [N, d] with labels y [N, 1] in {0, 1}.
struct Logistic {
  Tensor<double> X, y;
  template <class V>
  V operator()(V w) const {
    const V p = sigmoid(matmul(func::constant(w, X), w));
    const V labels = func::constant(w, y);
    return -mean(labels * log(p) + (1.0 - labels) * log(1.0 - p));
  }
};

Logistic logistic_problem(std::size_t n, std::size_t d, std::uint64_t seed) {
  Rng rng(seed);
  Logistic l{random_tensor<double>({n, d}, rng, -2, 2), Tensor<double>({n, 1})};
  for (std::size_t i = 0; i < n; ++i) l.X[i * d] = 1;  // an intercept column
  const Tensor<double> truth = random_tensor<double>({d, 1}, rng, -1, 1);
  for (std::size_t i = 0; i < n; ++i) {
    double z = 0;
    for (std::size_t k = 0; k < d; ++k) z += l.X[i * d + k] * truth[k];
    l.y[i] = rng.uniform(0, 1) < 1 / (1 + std::exp(-z)) ? 1 : 0;  // noisy labels: not separable
  }
  return l;
}

}  // namespace

TEST_CASE("a dual number's value part is the plain function's, bit for bit, and its tangent the derivative") {
  for (double x : {-30.0, -3.5, -0.7, -1e-3, 0.0, 2e-5, 0.3, 1.1, 4.0, 25.0}) {
    CAPTURE(x);
    const D d(x, 1.0);
    auto same = [](double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; };
    CHECK(same(exact_tanh(d).value, exact_tanh(x)));
    CHECK(same(exact_sigmoid(d).value, exact_sigmoid(x)));
    CHECK(same(exact_exp(D(x / 10, 1)).value, exact_exp(x / 10)));
    const double h = 1e-6;
    CHECK(exact_tanh(d).tangent == doctest::Approx((std::tanh(x + h) - std::tanh(x - h)) / (2 * h)).epsilon(1e-7));
    CHECK(exact_sigmoid(d).tangent ==
          doctest::Approx((1 / (1 + std::exp(-x - h)) - 1 / (1 + std::exp(-x + h))) / (2 * h)).epsilon(1e-7));
    if (x > 0) {
      CHECK(same(exact_log(d).value, exact_log(x)));
      CHECK(exact_log(d).tangent == doctest::Approx(1 / x).epsilon(1e-15));
      CHECK(same(sqrt_of(d).value, std::sqrt(x)));
    }
  }
  // Products, quotients and fma keep the value part's one rounding each.
  const D a(0.1, 2.0), b(0.7, -1.0), c(-0.3, 0.5);
  CHECK((a * b).value == 0.1 * 0.7);
  CHECK((a * b).tangent == 2.0 * 0.7 + 0.1 * -1.0);
  CHECK((a / b).value == 0.1 / 0.7);
  CHECK((a / b).tangent == doctest::Approx((2.0 * 0.7 - 0.1 * -1.0) / (0.7 * 0.7)).epsilon(1e-15));
  CHECK(fma_hd(a, b, c).value == std::fma(0.1, 0.7, -0.3));
  CHECK(fma_hd(a, b, c).tangent == doctest::Approx(2.0 * 0.7 + 0.1 * -1.0 + 0.5).epsilon(1e-15));
  CHECK(D(1.0, 5.0) < D(2.0, -5.0));  // comparisons read the value part
}

TEST_CASE("every op that carries a tangent: jvp and hvp against central differences, values bit-equal") {
  Rng rng(7);
  const Tensor<double> x = away_from_zero<double>({3, 4}, rng, 0.3, 1.2);
  const Tensor<double> pos = random_tensor<double>({3, 4}, rng, 0.5, 2.0);
  const Tensor<double> c = random_tensor<double>({3, 4}, rng);
  const Tensor<double> row = away_from_zero<double>({4}, rng, 0.5, 1.5);
  const Tensor<double> m = random_tensor<double>({4, 2}, rng);
  const Tensor<double> left = random_tensor<double>({5, 3}, rng);
  auto C = [&](auto xv, const Tensor<double>& t) { return func::constant(xv, t); };

  check_function(
      "add, sub, mul, div, neg (broadcasting)",
      [&](auto v) { return (v * v + C(v, row)) / (C(v, c) - v * 3.0 + 4.0) - (-v) * C(v, row); }, x, 1);
  check_function(
      "scalar forms", [](auto v) { return (2.0 - v) / 3.0 + 1.5 / (v * v + 1.0) - v; }, x, 2);
  check_function(
      "relu, sigmoid, tanh, gelu", [](auto v) { return relu(v) * sigmoid(v) + tanh(v * v) * gelu(v); }, x, 3);
  check_function(
      "exp, log, sqrt", [](auto v) { return exp(v) * log(v) + sqrt(v) / v; }, pos, 4);
  check_function(
      "sum, mean, row_sum", [](auto v) { return row_sum(v * v) * mean(tanh(v)) + sum(v * v * v); }, x, 5);
  check_function(
      "matmul, transpose",
      [&](auto v) {
        const auto first = matmul(C(v, left), tanh(matmul(v, C(v, m))));              // [5, 2]
        const auto second = transpose(matmul(matmul(transpose(v), v * v), C(v, m)));  // [2, 4]
        return matmul(first, second);
      },
      x, 6);
  check_function(
      "bmm, reshape",
      [](auto v) {
        const auto b = reshape(v, {2, 3, 2});
        return bmm(b, reshape(tanh(b), {2, 2, 3}));
      },
      x, 7);
  check_function(
      "softmax, log_softmax", [](auto v) { return softmax(v * v, 1) * log_softmax(v, 0); }, x, 8);
  check_function(
      "mse", [&](auto v) { return mse(tanh(v), C(v, c)); }, x, 9);
}

TEST_CASE("the piecewise, layout, norm, id and attention ops carry a tangent too") {
  Rng rng(17);
  const Tensor<double> x = away_from_zero<double>({3, 4}, rng, 0.3, 1.2);
  const Tensor<double> pos = random_tensor<double>({3, 4}, rng, 0.5, 2.0);
  const Tensor<double> c = random_tensor<double>({3, 4}, rng);
  const Tensor<double> cond({3, 4}, {1, 0, 0, 1, 1, 1, 0, 0, 1, 0, 1, 0});
  const Tensor<double> ids({3}, {2, 0, 3});
  const Tensor<double> scale = random_tensor<double>({4}, rng, 0.5, 1.5);
  auto C = [&](auto xv, const Tensor<double>& t) { return func::constant(xv, t); };

  check_function(
      "abs, clamp, maximum, minimum, where",
      [&](auto v) {
        return abs(v) * clamp(v, -0.25, 2.0) + maximum(v, C(v, c)) * minimum(v * v, C(v, c)) +
               where(C(v, cond), tanh(v), v * v);
      },
      x, 21);
  check_function(
      "pow with a scalar exponent", [](auto v) { return pow(v, 3.0) + pow(v, 2.5) - pow(v, -2.0); }, pos, 22);
  check_function(
      "slice, concat, max and min over an axis",
      [](auto v) {
        const auto s = slice(v, {0, 1}, {2, 4});                   // [2, 3]
        const auto top = max(v * v, 1);                            // [3, 1]
        const auto low = reshape(min(tanh(v), 0, false), {4, 1});  // [4] -> [4, 1]
        return concat(top, low, 0) * sum(s * s);                   // [7, 1]
      },
      x, 23);
  check_function(
      "matmul_nt, rms_norm, layer_norm, add_scaled, silu_mul",
      [&](auto v) {
        const auto n = rms_norm(v, C(v, scale), 1e-5) + layer_norm(v * v, 1e-5);
        return matmul_nt(add_scaled(n, v, 0.5), silu_mul(v, tanh(v)));
      },
      x, 24);
  check_function(
      "cross_entropy_ids, embedding",
      [&](auto v) {
        const auto rows = embedding(v, C(v, Tensor<double>({2}, {2, 0})));  // [2, 4]
        return cross_entropy_ids(v * 2.0, C(v, ids)) * sum(rows * rows);
      },
      x, 25);
  const Tensor<double> q = random_tensor<double>({2, 3, 2}, rng);  // N = 2, t = 3, hd = 2
  check_function(
      "causal_attention_probs, attention_context",
      [](auto v) { return attention_context(causal_attention_probs(v, tanh(v), 0.7), v * v); }, q, 26);
  Tensor<double> table({2, 3, 2});  // RoPE's cos and sin for t = 3, hd = 2
  for (std::size_t p = 0; p < 3; ++p)
    for (std::size_t h = 0; h < 2; ++h) {
      table[p * 2 + h] = std::cos(0.3 * double(p + 1) * double(h + 1));
      table[6 + p * 2 + h] = std::sin(0.3 * double(p + 1) * double(h + 1));
    }
  const Tensor<double> rows = random_tensor<double>({6, 4}, rng);  // batch 2 * t 3, heads 2 * hd 2
  check_function(
      "heads_major, rows_major, rope_heads_major",
      [&](auto v) { return rows_major(heads_major(v, 2, 2) * rope_heads_major(tanh(v), C(v, table)), 2); }, rows, 27);
}

TEST_CASE("at a tie the tangent is the tied inputs' mean, as torch's forward mode; pow at |x| = 1 keeps its tangent") {
  // x = [1, 1, 2, 2, 3, -1], v = [0.5, 0.25, 1, -1, 2, 0.75]; the constant c = [1, 0, 2, 5, 3, -1].
  const Tensor<double> x({6}, {1, 1, 2, 2, 3, -1}), v({6}, {0.5, 0.25, 1, -1, 2, 0.75});
  const Tensor<double> c({6}, {1, 0, 2, 5, 3, -1});
  auto as_vector = [](const Tensor<double>& t) { return std::vector<double>(t.data().begin(), t.data().end()); };
  auto C = [&](auto xv) { return func::constant(xv, c); };
  // maximum / minimum against a constant: a tie gives half the input's tangent (the constant's is 0).
  const auto mx = func::jvp([&](auto xv) { return maximum(xv, C(xv)); }, x, v).tangent;
  const auto mn = func::jvp([&](auto xv) { return minimum(C(xv), xv); }, x, v).tangent;
  CHECK(as_vector(mx) == std::vector<double>{0.25, 0.25, 0.5, 0, 1, 0.375});
  CHECK(as_vector(mn) == std::vector<double>{0.25, 0, 0.5, -1, 1, 0.375});
  // max / min over an axis: the mean of the tied elements' tangents ([1, 1] ties in the first row,
  // [2, 2] in the second: x viewed as [3, 2]).
  const auto top = func::jvp([](auto xv) { return max(reshape(xv, {3, 2}), 1); }, x, v).tangent;
  const auto low = func::jvp([](auto xv) { return min(reshape(xv, {3, 2}), 1); }, x, v).tangent;
  CHECK(as_vector(top) == std::vector<double>{0.375, 0, 2});
  CHECK(as_vector(low) == std::vector<double>{0.375, 0, 0.75});
  // pow with an integral exponent beyond 2^20 at x = +-1: s x^(s - 1) x' (the value 1 or -1 exactly).
  const Tensor<double> ones({2}, {1, -1}), u({2}, {0.5, 0.25});
  const double odd = 2097153, even = 2097152;  // 2^21 + 1, 2^21
  const auto p_odd = func::jvp([&](auto xv) { return pow(xv, odd); }, ones, u);
  const auto p_even = func::jvp([&](auto xv) { return pow(xv, even); }, ones, u);
  CHECK(as_vector(p_odd.value) == std::vector<double>{1, -1});
  CHECK(as_vector(p_even.value) == std::vector<double>{1, 1});
  CHECK(as_vector(p_odd.tangent) == std::vector<double>{odd * 0.5, odd * 0.25});
  CHECK(as_vector(p_even.tangent) == std::vector<double>{even * 0.5, -even * 0.25});
}

TEST_CASE("the composites of nn.hpp and classify.hpp carry a tangent through their ops") {
  Rng rng(19);
  const Tensor<double> x = random_tensor<double>({4, 3}, rng);
  const Tensor<double> w = random_tensor<double>({3, 5}, rng), b = random_tensor<double>({5}, rng);
  const Tensor<double> g = random_tensor<double>({5}, rng, 0.5, 1.5),
                       onehot({4, 5}, {1, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0});
  const std::vector<int> labels{0, 2, 4, 1};
  auto C = [&](auto xv, const Tensor<double>& t) { return func::constant(xv, t); };
  check_function(
      "nn::linear_bias, nn::layernorm, nn::silu, cross_entropy_labels",
      [&](auto v) {
        const auto h = nn::silu(nn::layernorm(nn::linear_bias(v, C(v, w), C(v, b)), C(v, g), C(v, b), 1e-5));
        return cross_entropy_labels(h, labels) + nn::cross_entropy_onehot(h * h, C(v, onehot));
      },
      x, 31);
}

TEST_CASE("a recompute scope on a dual tape gives the HVP of the same function recorded whole") {
  Rng rng(23);
  const Tensor<double> x = random_tensor<double>({3, 4}, rng), v = random_tensor<double>({3, 4}, rng);
  const Tensor<double> m = random_tensor<double>({4, 4}, rng);
  auto layer = [&](auto h) { return tanh(matmul(h, func::constant(h, m))); };
  auto whole = [&](auto h) { return mean(layer(layer(h)) * h); };
  auto scoped = [&](auto h) {
    const auto inner = recompute(*h.tape(), [&] { return layer(layer(h)); });  // values computed again in backward
    return mean(inner * h);
  };
  const func::HvpResult<double> a = func::hvp(whole, x, v), b = func::hvp(scoped, x, v);
  CHECK(bitwise_equal<double>(a.grad.data(), b.grad.data()));
  CHECK(bitwise_equal<double>(a.hvp.data(), b.hvp.data()));
  Tape<D> tp;  // the scope's values were computed again
  std::vector<D> duals(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) duals[i] = D(x[i], v[i]);
  const Var<D> p = tp.param(Tensor<D>(x.shape(), duals));
  REQUIRE(tp.backward(scoped(p)));
  CHECK(tp.recomputed_nodes() > 0);
}

TEST_CASE("a quadratic form's Hessian is A + A^T, and its HVP is (A + A^T) v") {
  const std::size_t n = 5;
  Rng rng(11);
  const Tensor<double> A = random_tensor<double>({n, n}, rng);
  const Tensor<double> x = random_tensor<double>({n, 1}, rng);
  auto f = [&](auto v) { return sum(v * matmul(func::constant(v, A), v)); };
  const Tensor<double> h = func::hessian(f, x);
  REQUIRE(h.shape() == Shape{n, 1, n, 1});
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      CAPTURE(i);
      CAPTURE(j);
      CHECK(h[i * n + j] == doctest::Approx(A[i * n + j] + A[j * n + i]).epsilon(1e-14));
    }
  const Tensor<double> v = random_tensor<double>({n, 1}, rng);
  const func::HvpResult<double> r = func::hvp(f, x, v);
  for (std::size_t i = 0; i < n; ++i) {
    double e = 0;
    for (std::size_t j = 0; j < n; ++j) e += (A[i * n + j] + A[j * n + i]) * v[j];
    CHECK(r.hvp[i] == doctest::Approx(e).epsilon(1e-13));
  }
}

TEST_CASE("logistic regression's Hessian is X^T diag(p (1 - p)) X / N") {
  const std::size_t n = 30, d = 4;
  const Logistic f = logistic_problem(n, d, 5);
  Rng rng(6);
  const Tensor<double> w = random_tensor<double>({d, 1}, rng);
  const Tensor<double> h = func::hessian(f, w);
  double scale = 0;
  std::vector<double> expected(d * d, 0.0);
  for (std::size_t i = 0; i < n; ++i) {
    double z = 0;
    for (std::size_t k = 0; k < d; ++k) z += f.X[i * d + k] * w[k];
    const double p = 1 / (1 + std::exp(-z));
    for (std::size_t a = 0; a < d; ++a)
      for (std::size_t b = 0; b < d; ++b) expected[a * d + b] += f.X[i * d + a] * p * (1 - p) * f.X[i * d + b] / n;
  }
  for (double e : expected) scale = std::max(scale, std::abs(e));
  for (std::size_t k = 0; k < d * d; ++k) {
    CAPTURE(k);
    CHECK(std::abs(h[k] - expected[k]) <= 1e-12 * scale);
  }
}

TEST_CASE("value, gradient, HVP, JVP and Hessian against torch.autograd.functional in float64") {
  // test/oracle/second_order.py made the golden values from the same inputs.
  const Tensor<double> X = grid(2, 3, 1), C = grid(2, 4, 4), W = grid(3, 4, 7), V = grid(3, 4, 2);
  auto f = [&](auto w) {
    const auto probs = softmax(tanh(matmul(func::constant(w, X), w)), 1);
    return sum(probs * func::constant(w, C)) + mean(gelu(w) * w) + sum(log(sigmoid(w)));
  };
  namespace golden = second_order_golden;
  auto near = [](double a, double b) { return std::abs(a - b) <= 1e-12 * std::max(1.0, std::abs(b)); };
  const func::HvpResult<double> r = func::hvp(f, W, V);
  CHECK(near(r.value, golden::value));
  CHECK(near(r.directional, golden::directional));
  CHECK(near(func::jvp(f, W, V).tangent[0], golden::directional));
  const Tensor<double> h = func::hessian(f, W);
  for (std::size_t i = 0; i < 12; ++i) {
    CAPTURE(i);
    CHECK(near(r.grad[i], golden::grad[i]));
    CHECK(near(r.hvp[i], golden::hvp[i]));
    for (std::size_t j = 0; j < 12; ++j) {
      CAPTURE(j);
      CHECK(near(h[i * 12 + j], golden::hessian[i * 12 + j]));
    }
  }
}

namespace {

// The tangent of element e of a case's param p: a multiple of 1/8 in
// [-1/2, 1/2], exact in binary; oracle/second_order_cases.py builds the same.
double case_tangent(std::size_t p, std::size_t e) { return double(int((5 * e + 3 * p + 2) % 9) - 4) / 8.0; }

// The dump's key of a case name (test_op_cases.cpp's key_of).
std::string case_key(std::string name) {
  for (char& ch : name)
    if (ch == ' ' || ch == ',' || ch == '/') ch = '_';
  return name;
}

// The ops of a case's tape that do not carry a tangent (grad/dual.hpp), by name.
std::vector<std::string> ops_without_tangent(const OpCase<double>& c, std::set<std::uint8_t>& ops) {
  RecordedCase<double> r;
  record_case(c, r);
  REQUIRE(r.tp.ok());
  std::vector<std::string> missing;
  for (const Node<double>& n : r.tp.nodes())
    with_op(n.op, [&](auto op) {
      using Op = decltype(op);
      if constexpr (Op::arity > 0) {
        ops.insert(n.op);
        if (!carries_tangent<Op>) missing.emplace_back(Op::name);
      }
    });
  return missing;
}

}  // namespace

TEST_CASE("every case of the op table on a dual tape: JVP and HVP against torch.autograd.functional, 1e-12") {
  // oracle/second_order_cases.py replayed the table's tapes (each node its
  // tag's torch expression) in float64 torch; per case: the loss
  // sum(out * weights), its directional derivative, out's JVP and each
  // param's HVP along case_tangent. Here the same case runs on a
  // Tape<Dual<double>>: the table instantiated for dual numbers draws the
  // same values (checked), the params carry the tangents, the constants
  // (ids, masks, weights) none. Each element within 1e-12 of torch's,
  // relative to max(1, |torch's|).
  // At a tie (maximum, minimum, max and min over an axis) the function has
  // no derivative and the JVP is a convention: torch's, the mean of the
  // tied operands' tangents, which a dual tape follows (numerics/choice.hpp;
  // the plain backward splits the gradient the same way). The two cases on
  // ties are compared like every other.
  const std::set<std::string> ties{"maximum and minimum ties", "max and min over an axis with ties"};
  std::map<std::string_view, const second_order_cases_golden::Case*> golden;
  for (const auto& g : second_order_cases_golden::cases) golden[g.key] = &g;
  const std::vector<OpCase<double>> plain = op_cases<double>();
  const std::vector<OpCase<D>> duals = op_cases<D>();
  REQUIRE(plain.size() == duals.size());
  std::set<std::uint8_t> checked;
  std::vector<std::string> refused;
  std::size_t cases = 0, ties_seen = 0;
  for (std::size_t k = 0; k < plain.size(); ++k) {
    if (plain[k].large) continue;  // the dump (and so the oracle) leaves them out
    const OpCase<D>& c = duals[k];
    const std::string key = case_key(c.name);
    CAPTURE(key);
    std::set<std::uint8_t> ops;
    const std::vector<std::string> missing = ops_without_tangent(plain[k], ops);
    Tape<D> tp;
    std::vector<Var<D>> vars;
    REQUIRE(c.params.size() == plain[k].params.size());
    for (std::size_t p = 0; p < c.params.size(); ++p) {
      const Tensor<double>& x = plain[k].params[p];
      REQUIRE(c.params[p].size() == x.size());
      std::vector<D> values(x.size());
      for (std::size_t e = 0; e < x.size(); ++e) {
        REQUIRE(std::memcmp(&c.params[p][e].value, &x[e], sizeof(double)) == 0);  // the same draws
        values[e] = D(x[e], case_tangent(p, e));
      }
      vars.push_back(tp.param(Tensor<D>(x.shape(), std::move(values))));
    }
    for (const auto& t : c.constants) vars.push_back(tp.constant(t));
    const Var<D> out = c.build(tp, vars);
    const Var<D> loss = weighted_sum(out);
    if (!missing.empty()) {
      // An op without a tangent rule is refused by name when recorded.
      CHECK_FALSE(tp.ok());
      CHECK(tp.error().rfind("grad: " + missing.front() + ": cannot be recorded on a tape of dual numbers", 0) == 0);
      refused.push_back(c.name + " (" + missing.front() + ")");
      continue;
    }
    REQUIRE(tp.ok());
    REQUIRE(tp.backward(loss));
    const auto found = golden.find(key);
    REQUIRE_MESSAGE(found != golden.end(), "no golden values: regenerate oracle/second_order_cases_golden.hpp");
    const second_order_cases_golden::Case& g = *found->second;
    std::size_t at = 0;
    auto compare = [&](std::string_view part, std::size_t element, double got) {
      REQUIRE(at < g.size);
      const double want = g.values[at++];
      if (!(std::abs(got - want) <= 1e-12 * std::max(1.0, std::abs(want))))
        FAIL_CHECK(key << ": " << part << " element " << element << " is " << got << ", torch " << want);
    };
    const D value = tp.value(loss)[0];
    compare("loss", 0, value.value);
    const View<D> y = tp.value(out);
    ties_seen += ties.count(c.name);
    compare("directional derivative", 0, value.tangent);
    for (std::size_t e = 0; e < y.size(); ++e) compare("jvp of the output", e, y[e].tangent);
    for (std::size_t p = 0; p < c.params.size(); ++p) {
      const View<D> h = tp.grad(vars[p]);
      const std::string part = "hvp of param " + std::to_string(p);
      for (std::size_t e = 0; e < h.size(); ++e) compare(part, e, h[e].tangent);
    }
    CHECK(at == g.size);
    checked.insert(ops.begin(), ops.end());
    ++cases;
  }
  CHECK(ties_seen == ties.size());  // the cases on ties are in the table, and compared
  MESSAGE(cases << " cases checked; refused on a dual tape, as grad/dual.hpp says: " << [&] {
    std::string s;
    for (const std::string& r : refused) s += (s.empty() ? "" : "; ") + r;
    return s;
  }());
  // Every op that carries a tangent is in a checked case.
  boost::mp11::mp_for_each<OpList>([&](auto op) {
    using Op = decltype(op);
    if constexpr (Op::arity > 0 && carries_tangent<Op>) {
      CAPTURE(Op::name);
      CHECK(checked.count(op_code<Op>) == 1);
    }
  });
}

TEST_CASE("mixed: a WGAN-GP penalty's gradient with respect to the critic's weights") {
  // D(W, x) = sum(tanh(x W) * c); the penalty P(W) = |grad_x D|^2 has the
  // gradient 2 (d2D / dW dx) grad_x D, one mixed() call.
  Rng rng(31);
  const Tensor<double> W = random_tensor<double>({3, 2}, rng);
  const Tensor<double> x = random_tensor<double>({4, 3}, rng);
  const Tensor<double> c = random_tensor<double>({4, 2}, rng);
  auto critic = [&](auto w, auto input) { return sum(tanh(matmul(input, w)) * func::constant(w, c)); };
  auto grad_x = [&](const Tensor<double>& weights) {
    return func::value_and_grad([&](auto input) { return critic(func::constant(input, weights), input); }, x).grad;
  };
  auto penalty = [&](const Tensor<double>& weights) {
    const Tensor<double> g = grad_x(weights);
    return std::inner_product(g.data().begin(), g.data().end(), g.data().begin(), 0.0);
  };
  const func::MixedResult<double> r = func::mixed(critic, W, x, grad_x(W));
  const func::GradResult<double> plain =
      func::value_and_grad([&](auto w) { return critic(w, func::constant(w, x)); }, W);
  CHECK(std::memcmp(&r.value, &plain.value, sizeof(double)) == 0);
  CHECK(bitwise_equal<double>(r.grad.data(), plain.grad.data()));
  const double h = 1e-5;
  for (std::size_t k = 0; k < W.size(); ++k) {
    CAPTURE(k);
    Tensor<double> up = W, down = W;
    up[k] += h;
    down[k] -= h;
    CHECK(2 * r.mixed[k] == doctest::Approx((penalty(up) - penalty(down)) / (2 * h)).epsilon(1e-7));
  }
  CHECK_THROWS_WITH(func::mixed(critic, W, x, Tensor<double>({3}, {1, 2, 3})),
                    "mixed: the tangent u has shape [3] but x has shape [4, 3]; expected the same shape");
}

TEST_CASE("docs/second_order.md's physics-informed recipe: the gradient of a loss on u'(t)") {
  // u(theta, t) = tanh(t w1) w2^T, theta = [w1; w2] [2, H], t [N, 1]; the
  // loss L = mean((u'(t) - cos t)^2) on the derivative in t. u'(t_i) is the
  // gradient of sum(u) in t (each u_i reads t_i alone), and
  // grad_theta L = (2 / N) (d2 sum(u) / dtheta dt) r with r = u' - cos t.
  const std::size_t hidden = 5, n = 7;
  Rng rng(41);
  const Tensor<double> theta = random_tensor<double>({2, hidden}, rng);
  Tensor<double> t({n, 1});
  for (std::size_t i = 0; i < n; ++i) t[i] = -1.5 + 0.5 * double(i);
  auto u_sum = [&](auto th, auto time) {
    const auto w1 = slice(th, {0, 0}, {1, hidden}), w2 = slice(th, {1, 0}, {2, hidden});
    return sum(matmul_nt(tanh(matmul(time, w1)), w2));
  };
  auto residual = [&](const Tensor<double>& th) {
    Tensor<double> r = func::value_and_grad([&](auto time) { return u_sum(func::constant(time, th), time); }, t).grad;
    for (std::size_t i = 0; i < n; ++i) r[i] -= std::cos(t[i]);
    return r;
  };
  auto loss = [&](const Tensor<double>& th) {
    const Tensor<double> r = residual(th);
    return std::inner_product(r.data().begin(), r.data().end(), r.data().begin(), 0.0) / double(n);
  };
  const func::MixedResult<double> m = func::mixed(u_sum, theta, t, residual(theta));
  const double h = 1e-5;
  for (std::size_t k = 0; k < theta.size(); ++k) {
    CAPTURE(k);
    Tensor<double> up = theta, down = theta;
    up[k] += h;
    down[k] -= h;
    CHECK(2.0 / double(n) * m.mixed[k] == doctest::Approx((loss(up) - loss(down)) / (2 * h)).epsilon(1e-7));
  }
}

namespace {

// |got - want| <= tol * max(1, |want|), element by element, naming the element.
void check_against(std::string_view what, const double* got, const double* want, std::size_t n, double tol) {
  for (std::size_t i = 0; i < n; ++i)
    if (!(std::abs(got[i] - want[i]) <= tol * std::max(1.0, std::abs(want[i]))))
      FAIL_CHECK(what << " element " << i << " is " << got[i] << ", torch " << want[i]);
}

// The Cholesky factor L (lower, row-major) of a symmetric n x n matrix; false
// when it is not positive definite.
bool cholesky(const std::vector<double>& a, std::size_t n, std::vector<double>& l) {
  l.assign(n * n, 0.0);
  for (std::size_t j = 0; j < n; ++j) {
    double d = a[j * n + j];
    for (std::size_t k = 0; k < j; ++k) d -= l[j * n + k] * l[j * n + k];
    if (!(d > 0)) return false;
    l[j * n + j] = std::sqrt(d);
    for (std::size_t i = j + 1; i < n; ++i) {
      double s = a[i * n + j];
      for (std::size_t k = 0; k < j; ++k) s -= l[i * n + k] * l[j * n + k];
      l[i * n + j] = s / l[j * n + j];
    }
  }
  return true;
}

// Solves L L^T x = b.
std::vector<double> cholesky_solve(const std::vector<double>& l, std::vector<double> b) {
  const std::size_t n = b.size();
  for (std::size_t i = 0; i < n; ++i) {
    for (std::size_t k = 0; k < i; ++k) b[i] -= l[i * n + k] * b[k];
    b[i] /= l[i * n + i];
  }
  for (std::size_t i = n; i-- > 0;) {
    for (std::size_t k = i + 1; k < n; ++k) b[i] -= l[k * n + i] * b[k];
    b[i] /= l[i * n + i];
  }
  return b;
}

double dot(const Tensor<double>& a, const Tensor<double>& b) {
  return std::inner_product(a.data().begin(), a.data().end(), b.data().begin(), 0.0);
}

// The Laplace example's problem (oracle/second_order.py's laplace()): a
// 2-4-1 tanh MLP on 15 grid points, theta [17] = [W1 (2x4), b1, W2 (4x1), b2].
struct LaplaceProblem {
  static constexpr std::size_t d = 17, n = 15;
  static constexpr double s2 = 1.0 / 16, alpha = 1.0;  // noise variance, prior precision
  Tensor<double> X{Shape{n, 2}}, Y{Shape{n, 1}};
  LaplaceProblem() {
    for (std::size_t k = 0; k < n; ++k) {
      const double a = (-4.0 + 2.0 * double(k % 5)) / 4, b = (-3.0 + 2.0 * double(k / 5)) / 4;
      X[2 * k] = a;
      X[2 * k + 1] = b;
      Y[k] = a * b + a / 2 - b * b;  // exact in binary
    }
  }
};

}  // namespace

TEST_CASE("docs/second_order.md's Laplace approximation: the Hessian of an MLP's posterior against torch") {
  const LaplaceProblem problem;
  const Tensor<double>& X = problem.X;
  const Tensor<double>& Y = problem.Y;
  constexpr std::size_t d = LaplaceProblem::d, n = LaplaceProblem::n;
  constexpr double s2 = LaplaceProblem::s2, alpha = LaplaceProblem::alpha;
  namespace golden = second_order_golden::laplace;
  // The page's code.
  auto mlp = [](auto theta, auto x) {  // a 2-4-1 tanh MLP; theta [17] sliced into its layers
    const auto W1 = grad::reshape(grad::slice(theta, {0}, {8}), {2, 4}), b1 = grad::slice(theta, {8}, {12});
    const auto W2 = grad::reshape(grad::slice(theta, {12}, {16}), {4, 1}), b2 = grad::slice(theta, {16}, {17});
    return grad::matmul(grad::tanh(grad::matmul(x, W1) + b1), W2) + b2;
  };
  const double pi = std::acos(-1.0);
  const double normalisers = double(n) / 2 * std::log(2 * pi * s2) - double(d) / 2 * std::log(alpha / (2 * pi));
  auto nlp = [&](auto theta) {  // -log p(Y | X, theta) - log p(theta): Gaussian noise s2, prior N(0, 1 / alpha)
    const auto r = mlp(theta, grad::func::constant(theta, X)) - grad::func::constant(theta, Y);
    return grad::sum(r * r) * (1 / (2 * s2)) + grad::sum(theta * theta) * (alpha / 2) + normalisers;
  };
  // The mode by Levenberg-Marquardt: the posterior is not convex (Newton from
  // theta0 diverges), so each step solves (H + lambda I) delta = g, taken
  // unless the NLP rises (lambda / 4), else lambda * 4; Newton near the mode.
  grad::Tensor<double> theta({d});
  for (std::size_t k = 0; k < d; ++k) theta[k] = double(int((7 * k + 3) % 11) - 5) / 8;
  const grad::Tensor<double> h0 = grad::func::hessian(nlp, theta);  // [17, 17]
  check_against("the Hessian at theta0", h0.data().data(), golden::hessian_at_theta0, d * d, 1e-12);
  double lambda = 1;
  int steps = 0;
  std::vector<double> l;
  for (; steps < 60; ++steps) {
    const auto g = grad::func::value_and_grad(nlp, theta);
    if (std::sqrt(dot(g.grad, g.grad)) < 1e-11) break;
    const grad::Tensor<double> h = grad::func::hessian(nlp, theta);
    for (;; lambda *= 4) {
      REQUIRE_MESSAGE(lambda < 1e12, "Levenberg-Marquardt found no step at step ", steps);  // a NaN H or g
      std::vector<double> a(h.data().begin(), h.data().end());
      for (std::size_t k = 0; k < d; ++k) a[k * d + k] += lambda;
      if (!cholesky(a, d, l)) continue;  // not positive definite yet
      const std::vector<double> delta = cholesky_solve(l, std::vector<double>(g.grad.data().begin(), g.grad.data().end()));
      grad::Tensor<double> candidate = theta;
      for (std::size_t k = 0; k < d; ++k) candidate[k] -= delta[k];
      // <=: at the mode the NLP is flat to its rounding, and the last step
      // (|g| ~ 3e-11) may not lower it by an ulp.
      if (grad::func::value_and_grad(nlp, candidate).value <= g.value) {
        theta = candidate;
        lambda /= 4;
        break;
      }
    }
  }
  // The Laplace approximation at the mode: posterior N(theta*, H^-1), and
  // log p(Y | X) ~ -NLP(theta*) + (d / 2) log(2 pi) - (1 / 2) log det H.
  const grad::Tensor<double> h = grad::func::hessian(nlp, theta);
  REQUIRE(cholesky(std::vector<double>(h.data().begin(), h.data().end()), d, l));
  double log_det = 0;
  for (std::size_t k = 0; k < d; ++k) log_det += 2 * std::log(l[k * d + k]);
  const double log_evidence = -grad::func::value_and_grad(nlp, theta).value + double(d) / 2 * std::log(2 * pi) - log_det / 2;
  std::vector<double> variance(d);  // the posterior's marginal variances: diag(H^-1)
  for (std::size_t k = 0; k < d; ++k) {
    std::vector<double> e(d, 0.0);
    e[k] = 1;
    variance[k] = cholesky_solve(l, e)[k];
  }
  const grad::Tensor<double> xstar({1, 2}, {0.5, -0.25});  // a prediction's variance there: g^T H^-1 g
  const auto u = grad::func::value_and_grad([&](auto th) { return grad::sum(mlp(th, grad::func::constant(th, xstar))); }, theta);
  const std::vector<double> hu = cholesky_solve(l, std::vector<double>(u.grad.data().begin(), u.grad.data().end()));
  const double predictive_variance = std::inner_product(hu.begin(), hu.end(), u.grad.data().begin(), 0.0);

  CHECK(steps == golden::map_steps);  // the same path as torch's
  check_against("the mode theta*", theta.data().data(), golden::theta_map, d, 1e-10);
  // At torch's own mode (exact input): every second derivative within 1e-12.
  const grad::Tensor<double> at_torch(Shape{d}, std::vector<double>(golden::theta_map, golden::theta_map + d));
  check_against("the Hessian at torch's theta*", grad::func::hessian(nlp, at_torch).data().data(), golden::hessian_at_map,
                d * d, 1e-12);
  const double at_map = grad::func::value_and_grad(nlp, at_torch).value;
  check_against("NLP(theta*)", &at_map, &golden::nlp_at_map, 1, 1e-12);
  // From this side's mode: the Laplace quantities.
  check_against("log det H", &log_det, &golden::log_det, 1, 1e-10);
  check_against("the log evidence", &log_evidence, &golden::log_evidence, 1, 1e-10);
  check_against("the posterior variances", variance.data(), golden::posterior_variance, d, 1e-10);
  check_against("the predictive mean", &u.value, &golden::predictive_mean, 1, 1e-10);
  check_against("the predictive variance", &predictive_variance, &golden::predictive_variance, 1, 1e-10);
}

TEST_CASE("docs/second_order.md's WGAN-GP: the penalty's gradient against torch's create_graph=True") {
  // oracle/second_order.py's wgan_gp(): torch differentiates the gradient it
  // took with create_graph=True; here one value_and_grad and one mixed.
  const grad::Tensor<double> x = grid(4, 3, 5);  // 4 samples of 3 features
  grad::Tensor<double> theta({20});
  for (std::size_t k = 0; k < 20; ++k) theta[k] = (double((5 * k + 4) % 13) - 6.5) / 8;
  namespace golden = second_order_golden::wgan_gp;
  // The page's code. The critic's scores, one per sample, summed: row i of
  // its gradient in x is the gradient of D(theta, x_i).
  auto critic = [](auto theta, auto x) {  // theta [20] = [W1 (3x4), b1 (4), w2 (4)]
    const auto W1 = grad::reshape(grad::slice(theta, {0}, {12}), {3, 4}), b1 = grad::slice(theta, {12}, {16});
    const auto w2 = grad::reshape(grad::slice(theta, {16}, {20}), {4, 1});
    return grad::sum(grad::matmul(grad::tanh(grad::matmul(x, W1) + b1), w2));
  };
  const grad::Tensor<double> g =  // [4, 3]: grad_x D
      grad::func::value_and_grad([&](auto input) { return critic(grad::func::constant(input, theta), input); }, x).grad;
  // |grad_x D|^2 has the gradient 2 (d2D / dtheta dx) grad_x D:
  const auto squared = grad::func::mixed(critic, theta, x, g);  // 2 * squared.mixed
  // WGAN-GP's penalty mean_i (|g_i| - 1)^2 has the gradient (d2D / dtheta dx) u
  // with row u_i = (2 / N) (|g_i| - 1) / |g_i| g_i:
  const std::size_t samples = 4, features = 3;
  grad::Tensor<double> weights({samples, features});
  double penalty = 0;
  for (std::size_t i = 0; i < samples; ++i) {
    double norm = 0;
    for (std::size_t j = 0; j < features; ++j) norm += g[i * features + j] * g[i * features + j];
    norm = std::sqrt(norm);
    penalty += (norm - 1) * (norm - 1) / double(samples);
    for (std::size_t j = 0; j < features; ++j)
      weights[i * features + j] = 2.0 / double(samples) * (norm - 1) / norm * g[i * features + j];
  }
  const auto gp = grad::func::mixed(critic, theta, x, weights);  // gp.mixed: d penalty / dtheta

  check_against("grad_x D", g.data().data(), golden::grad_x, g.size(), 1e-12);
  const double squared_norm = dot(g, g);
  check_against("|grad_x D|^2", &squared_norm, &golden::squared_norm, 1, 1e-12);
  grad::Tensor<double> twice = squared.mixed;
  for (double& v : twice.data()) v *= 2;
  check_against("2 mixed, the gradient of |grad_x D|^2", twice.data().data(), golden::d_squared_norm, 20, 1e-12);
  check_against("the penalty", &penalty, &golden::penalty, 1, 1e-12);
  check_against("the penalty's gradient", gp.mixed.data().data(), golden::d_penalty, 20, 1e-12);
}

TEST_CASE("docs/second_order.md's physics-informed fit: u' = cos t, u(0) = 0 by Adam on mixed's gradient") {
  const std::size_t n = 16;
  const double pi = std::acos(-1.0);
  grad::Tensor<double> t({n, 1});  // collocation points on [0, pi]
  for (std::size_t i = 0; i < n; ++i) t[i] = double(i) * (pi / 15);
  grad::Tensor<double> theta({25});  // oracle/second_order.py's pinn() starts there too
  for (std::size_t k = 0; k < 25; ++k) theta[k] = (double((3 * k + 1) % 7) - 3.5) / 4;
  grad::Tensor<double> m1({25}), m2({25});
  // The page's code: u(theta, t) = tanh(t w1 + b1) w2 + b2, theta [25] = [w1 (8), b1 (8), w2 (8), b2];
  // L(theta) = mean((u'(t_i) - cos t_i)^2) + u(theta, 0)^2 and its gradient.
  auto u_sum = [](auto theta, auto t) {  // U(theta, t) = sum_i u(theta, t_i), t [N, 1]
    const auto w1 = grad::reshape(grad::slice(theta, {0}, {8}), {1, 8}), b1 = grad::slice(theta, {8}, {16});
    const auto w2 = grad::reshape(grad::slice(theta, {16}, {24}), {8, 1}), b2 = grad::slice(theta, {24}, {25});
    return grad::sum(grad::matmul(grad::tanh(grad::matmul(t, w1) + b1), w2) + b2);
  };
  auto loss_and_grad = [&](const grad::Tensor<double>& theta) {
    grad::Tensor<double> r =
        grad::func::value_and_grad([&](auto time) { return u_sum(grad::func::constant(time, theta), time); }, t).grad;
    for (std::size_t i = 0; i < n; ++i) r[i] -= std::cos(t[i]);  // u'(t_i) - cos t_i
    const auto m = grad::func::mixed(u_sum, theta, t, r);        // (d2U / dtheta dt) r
    const auto u0 = grad::func::value_and_grad(
        [&](auto th) { return u_sum(th, grad::func::constant(th, grad::Tensor<double>({1, 1}))); }, theta);  // u(0)
    double loss = u0.value * u0.value;
    for (std::size_t i = 0; i < n; ++i) loss += r[i] * r[i] / double(n);
    grad::Tensor<double> g = m.mixed;
    for (std::size_t k = 0; k < theta.size(); ++k) g[k] = 2.0 / double(n) * m.mixed[k] + 2 * u0.value * u0.grad[k];
    return std::pair{loss, g};
  };
  // The loss's gradient at the start against torch's create_graph=True.
  namespace golden = second_order_golden::pinn;
  const auto [start, start_grad] = loss_and_grad(theta);
  check_against("the loss", &start, &golden::loss, 1, 1e-12);
  check_against("the loss's gradient", start_grad.data().data(), golden::d_loss, 25, 1e-12);
  double last = start;
  // Adam (torch's defaults but the rate 0.1), 600 steps:
  for (int step = 1; step <= 600; ++step) {
    const auto [loss, g] = loss_and_grad(theta);
    for (std::size_t k = 0; k < 25; ++k) {
      m1[k] = 0.9 * m1[k] + 0.1 * g[k];
      m2[k] = 0.999 * m2[k] + 0.001 * g[k] * g[k];
      theta[k] -= 0.1 * (m1[k] / (1 - std::pow(0.9, step))) / (std::sqrt(m2[k] / (1 - std::pow(0.999, step))) + 1e-8);
    }
    last = loss;
  }
  CAPTURE(start);
  CAPTURE(last);
  CHECK(last < 1e-4 * start);  // 1.85 -> 7.8e-5
  double worst = 0;            // u against sin t on a fine grid, between the collocation points too
  for (std::size_t i = 0; i <= 100; ++i) {
    const grad::Tensor<double> at({1, 1}, {double(i) * (pi / 100)});
    const double u =
        grad::func::value_and_grad([&](auto th) { return u_sum(th, grad::func::constant(th, at)); }, theta).value;
    worst = std::max(worst, std::abs(u - std::sin(at[0])));
  }
  CAPTURE(worst);
  CHECK(worst < 1e-2);  // 4.5e-3
}

TEST_CASE("jacobian: forward and reverse agree, and with the jvp of each column") {
  Rng rng(12);
  const Tensor<double> x = random_tensor<double>({2, 3}, rng);
  const Tensor<double> m = random_tensor<double>({3, 4}, rng);
  auto f = [&](auto v) { return tanh(matmul(v, func::constant(v, m))); };  // [2, 3] -> [2, 4]
  const Tensor<double> fwd = func::jacobian(f, x, func::Mode::forward);
  const Tensor<double> rev = func::jacobian(f, x, func::Mode::reverse);
  REQUIRE(fwd.shape() == Shape{2, 4, 2, 3});
  check_close(fwd, rev, 1e-14);
  // d tanh(x m)[i, j] / dx[i, k] = (1 - y^2) m[k, j]; other rows 0.
  const Tensor<double> y = plain_forward<double>(f, x);
  for (std::size_t i = 0; i < 2; ++i)
    for (std::size_t j = 0; j < 4; ++j)
      for (std::size_t r = 0; r < 2; ++r)
        for (std::size_t k = 0; k < 3; ++k) {
          const double e = r == i ? (1 - y[i * 4 + j] * y[i * 4 + j]) * m[k * 4 + j] : 0.0;
          CHECK(fwd[((i * 4 + j) * 2 + r) * 3 + k] == doctest::Approx(e).epsilon(1e-13));
        }
  const func::VjpResult<double> u = func::vjp(f, x, Tensor<double>::ones({2, 4}));
  for (std::size_t k = 0; k < 6; ++k) {
    double col = 0;
    for (std::size_t i = 0; i < 8; ++i) col += rev[i * 6 + k];
    CHECK(u.grad[k] == doctest::Approx(col).epsilon(1e-14));
  }
}

TEST_CASE("float: a Tape<Dual<float>>'s value parts have Tape<float>'s bits") {
  Rng rng(13);
  const Tensor<float> x = random_tensor<float>({3, 5}, rng);
  const Tensor<float> v = random_tensor<float>({3, 5}, rng);
  const Tensor<float> m = random_tensor<float>({5, 2}, rng);
  auto g = [&](auto a) { return mean(gelu(matmul(tanh(a), func::constant(a, m)))) + sum(exp(a) * 0.25f); };
  const func::JvpResult<float> j = func::jvp(g, x, v);
  CHECK(bitwise_equal<float>(j.value.data(), plain_forward<float>(g, x).data()));
  const func::HvpResult<float> r = func::hvp(g, x, v);
  const func::GradResult<float> p = func::value_and_grad(g, x);
  CHECK(std::memcmp(&r.value, &p.value, sizeof(float)) == 0);
  CHECK(bitwise_equal<float>(r.grad.data(), p.grad.data()));
}

TEST_CASE("docs/second_order.md's example: Newton's method on logistic regression converges quadratically") {
  const std::size_t d = 3;
  const Logistic problem = logistic_problem(60, d, 21);
  const Tensor<double>& X = problem.X;
  const Tensor<double>& y = problem.y;
  auto solve = [](const Tensor<double>& h, const Tensor<double>& g) {
    return ::solve(std::vector<double>(h.data().begin(), h.data().end()),
                   std::vector<double>(g.data().begin(), g.data().end()));
  };
  std::vector<double> norms;
  // The page's code, with the gradient's norm noted at each step.
  auto nll = [&](auto w) {
    const auto p = grad::sigmoid(grad::matmul(grad::func::constant(w, X), w));
    const auto labels = grad::func::constant(w, y);
    return -grad::mean(labels * grad::log(p) + (1.0 - labels) * grad::log(1.0 - p));
  };
  grad::Tensor<double> w({d, 1});
  for (int step = 0; step < 8; ++step) {
    const auto g = grad::func::value_and_grad(nll, w);
    norms.push_back(
        std::sqrt(std::inner_product(g.grad.data().begin(), g.grad.data().end(), g.grad.data().begin(), 0.0)));
    if (norms.back() < 1e-14) break;
    const grad::Tensor<double> h = grad::func::hessian(nll, w);  // X^T diag(p (1 - p)) X / N
    const std::vector<double> delta = solve(h, g.grad);
    for (std::size_t k = 0; k < d; ++k) w[k] -= delta[k];
  }
  CAPTURE(norms.size());
  REQUIRE(norms.size() <= 6);  // from 0.1 to below 1e-14 in five steps
  CHECK(norms.back() < 1e-14);
  // Quadratic: once close (|g| < 0.05), each step squares the error up to a constant.
  int quadratic_steps = 0;
  for (std::size_t k = 0; k + 1 < norms.size(); ++k) {
    CAPTURE(k);
    CAPTURE(norms[k]);
    CAPTURE(norms[k + 1]);
    if (norms[k] < 0.05 && norms[k + 1] > 1e-15) {
      CHECK(norms[k + 1] <= 10 * norms[k] * norms[k]);
      ++quadratic_steps;
    }
  }
  CHECK(quadratic_steps >= 2);
}

TEST_CASE("bad input: clear errors naming the function, the shapes and the element") {
  const Tensor<double> x({2, 2}, {1, 2, 3, 4});
  auto f = [](auto v) { return sum(tanh(v)); };
  auto message = [](auto&& call) {
    try {
      call();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(message([&] {
          func::jvp(f, x, Tensor<double>({3}, {1, 2, 3}));
        }) == "jvp: the tangent v has shape [3] but x has shape [2, 2]; expected the same shape");
  CHECK(message([&] {
          func::hvp(f, x, Tensor<double>({4}, {1, 2, 3, 4}));
        }) == "hvp: the tangent v has shape [4] but x has shape [2, 2]; expected the same shape");
  CHECK(message([&] {
          func::hvp(f, x, Tensor<double>({2, 2}, {1, NAN, 3, 4}));
        }) == "hvp: element 1 of the tangent v is nan; expected finite numbers");
  CHECK(message([&] {
          func::jvp(f, x, Tensor<double>({2, 2}, {1, 2, INFINITY, 4}));
        }) == "jvp: element 2 of the tangent v is inf; expected finite numbers");
  CHECK(message([&] { func::hvp([](auto v) { return decltype(v){}; }, x, x); }) ==
        "hvp: f recorded nothing: it returned a default-constructed Var, not a node of x's tape");
  CHECK(message([&] { func::hvp([](auto v) { return tanh(v); }, x, x); }) ==
        "hvp: f's output has shape [2, 2]; expected a single element (reduce it with sum or mean)");
  CHECK(message([&] {
          func::vjp([](auto v) { return tanh(v); }, x, Tensor<double>({4}, {1, 1, 1, 1}));
        }) == "vjp: the cotangent u has shape [4] but f(x) has shape [2, 2]; expected the same shape");
  CHECK(message([&] { func::hessian(f, Tensor<double>()); }) ==
        "hessian: x has shape [] with no elements; expected at least one");
  // An op without a tangent rule yet is refused by name when recorded.
  const std::string refused = message([&] { func::hvp([](auto v) { return sum(pow(v, v)); }, x, x); });
  CHECK(refused.rfind("grad: pow: cannot be recorded on a tape of dual numbers", 0) == 0);
  CHECK(refused.find("the ops that do: add, sub, mul, div, neg") != std::string::npos);
  CHECK(message([&] {
          func::jvp([](auto v) { return dropout(v, 0.5, 7); }, x, x);
        }).rfind("grad: dropout: cannot be recorded on a tape of dual numbers", 0) == 0);
  // The value-returning Tape<Dual> API poisons instead of throwing.
  Tape<D> tp;
  auto p = tp.param(Tensor<D>({2}, {D(1, 0), D(2, 1)}));
  CHECK_FALSE(pow(p, p).valid());
  CHECK(tp.error().rfind("grad: pow: cannot be recorded on a tape of dual numbers", 0) == 0);
  // A scalar operand is a constant: one with a tangent is refused (pow's
  // integral exponents would drop it).
  Tape<D> scaled;
  auto q = scaled.param(Tensor<D>({2}, {D(1, 0), D(2, 1)}));
  CHECK_FALSE(pow(q, D(2, 1)).valid());
  CHECK(scaled.error() ==
        "grad: pow_scalar: the scalar operand carries a tangent; on a tape of dual numbers a scalar operand is a "
        "constant (record a varying one as a tensor)");
  Tape<D> watched;
  watched.detect_anomalies(true);
  CHECK_FALSE(watched.param(Tensor<D>({1}, {D(1, 0)})).valid());
  CHECK(watched.error() == "grad: param: anomaly detection and profiling are not available on a tape of dual numbers");
  Tape<D> held;
  CHECK_FALSE(held.constant(Tensor<D>({2}, {D(1), D(2)}), Storage::bf16).valid());
  CHECK(held.error() == "grad: const: a tape of dual numbers holds its leaves native, not as bf16");
}

namespace {
// FNV-1a over the bytes of every element: one number that changes if any bit does.
template <class T>
std::uint64_t bits_hash(std::uint64_t h, const Tensor<T>& t) {
  for (const T& v : t.data()) {
    unsigned char bytes[sizeof(T)];
    std::memcpy(bytes, &v, sizeof(T));
    for (unsigned char b : bytes) h = (h ^ b) * 0x100000001b3ull;
  }
  return h;
}

// An HVP (the weights carry tangents, the input none: the first product is
// one gemm of twice the columns) and a jvp along the input (the weights
// carry none: one gemm of twice the rows) through products, packs of dual
// numbers with ragged tails and broadcasting; both widths' shuffles.
template <class T>
std::uint64_t second_order_bits() {
  Rng rng(97);
  // [256, 300] activations: elementwise loops long enough for 3 threads to split them.
  const Tensor<T> x = random_tensor<T>({256, 29}, rng), w = random_tensor<T>({29, 300}, rng),
                  bias = random_tensor<T>({300}, rng), c = random_tensor<T>({256, 300}, rng),
                  v = random_tensor<T>({29, 300}, rng), u = random_tensor<T>({256, 29}, rng);
  auto net = [&](auto input, auto weights) {
    const auto y = tanh(matmul(input, weights) + func::constant(weights, bias));
    const auto z = matmul_nt(sigmoid(y), weights);
    return mean(gelu(z) * z) + sum(softmax(y, 1) * func::constant(weights, c));
  };
  const func::HvpResult<T> h = func::hvp([&](auto weights) { return net(func::constant(weights, x), weights); }, w, v);
  const func::JvpResult<T> j = func::jvp([&](auto input) { return net(input, func::constant(input, w)); }, x, u);
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (const Tensor<T>* t : {&h.grad, &h.hvp, &j.value, &j.tangent}) hash = bits_hash(hash, *t);
  return hash;
}
}  // namespace

TEST_CASE("an HVP's and a jvp's bits are the same on every instruction set and thread count") {
  // The constants are what this code gives; the suite's baseline and AVX2
  // runs (meson test second_order_baseline, _avx2) must give them too (the
  // same operations per lane, the gemm's fixed order), on 1 and 3 threads
  // (which split the [256, 300] elementwise loops).
  // A change that moves a bit on purpose updates them.
  for (const std::size_t threads : {1, 3}) {
    CAPTURE(threads);
    set_num_threads(threads);
    CHECK(second_order_bits<double>() == 2756782183336607276ull);
    CHECK(second_order_bits<float>() == 17625423832718712912ull);
  }
  set_num_threads(1);
}
