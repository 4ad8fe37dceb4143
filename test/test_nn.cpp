// nn layers: central differences for each layer, then a Qwen2-style block
// with LoRA adapters (finite differences, the PEFT initialisation identity,
// a PyTorch float64 oracle, frozen-base memory, Adam training), and one test
// per kind of bad input.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include <grad/nn.hpp>
#include <grad/opt.hpp>

#include "golden.hpp"
#include "support.hpp"

using namespace grad;
using namespace grad::testing;

namespace {

using V = const std::vector<Var<double>>&;
using Tp = Tape<double>&;

Tensor<double> onehot_rows(const std::vector<std::size_t>& tokens, std::size_t vocab) {
  Tensor<double> t({tokens.size(), vocab});
  for (std::size_t r = 0; r < tokens.size(); ++r) t[r * vocab + tokens[r]] = 1;
  return t;
}

void check_fd(const std::vector<Tensor<double>>& params, const Builder<double>& build) {
  const FdResult r = check_gradients<double>(params, build, 1e-6);
  CAPTURE(r.where);
  CAPTURE(r.error);
  CHECK(r.worst <= 1e-6);
}

}  // namespace

// ---------------------------------------------------------------- layers --

TEST_CASE("linear and linear_bias match central differences") {
  Rng rng(1);
  check_fd({random_tensor<double>({3, 4}, rng), random_tensor<double>({4, 5}, rng)},
           [](Tp, V v) { return weighted_sum(nn::linear(v[0], v[1])); });
  check_fd({random_tensor<double>({3, 4}, rng), random_tensor<double>({4, 5}, rng), random_tensor<double>({5}, rng)},
           [](Tp, V v) { return weighted_sum(nn::linear_bias(v[0], v[1], v[2])); });
}

TEST_CASE("lora_linear matches central differences in x, w0, A and B") {
  Rng rng(2);
  check_fd({random_tensor<double>({3, 6}, rng), random_tensor<double>({6, 5}, rng), random_tensor<double>({6, 2}, rng),
            random_tensor<double>({2, 5}, rng)},
           [](Tp, V v) { return weighted_sum(nn::lora_linear(v[0], v[1], v[2], v[3], 1.5)); });
}

TEST_CASE("lora_linear is x.w0 + scale * (x.A).B") {
  Tape<double> tp;
  auto x = tp.constant(Tensor<double>({1, 2}, {1, 2}));
  auto w0 = tp.constant(Tensor<double>({2, 1}, {3, 4}));      // x.w0 = 11
  auto a = tp.constant(Tensor<double>({2, 1}, {0.5, 0.25}));  // x.A = 1
  auto b = tp.constant(Tensor<double>({1, 1}, {8}));          // (x.A).B = 8
  CHECK(tp.scalar(nn::lora_linear(x, w0, a, b, 0.5)) == 15);  // 11 + 0.5 * 8
}

TEST_CASE("rmsnorm and layernorm match central differences") {
  Rng rng(3);
  check_fd({random_tensor<double>({3, 5}, rng), random_tensor<double>({5}, rng, 0.5, 1.5)},
           [](Tp, V v) { return weighted_sum(nn::rmsnorm(v[0], v[1], 1e-6)); });
  check_fd(
      {random_tensor<double>({3, 5}, rng), random_tensor<double>({5}, rng, 0.5, 1.5), random_tensor<double>({5}, rng)},
      [](Tp, V v) { return weighted_sum(nn::layernorm(v[0], v[1], v[2], 1e-5)); });
}

TEST_CASE("rmsnorm rows have unit root mean square and layernorm rows zero mean, unit variance") {
  Rng rng(4);
  Tape<double> tp;
  auto x = tp.constant(random_tensor<double>({3, 8}, rng, -2, 3));
  auto ones = tp.constant(Tensor<double>::ones({8})), zeros = tp.constant(Tensor<double>::zeros({8}));
  const View<double> r = tp.value(nn::rmsnorm(x, ones, 0.0));
  const View<double> l = tp.value(nn::layernorm(x, ones, zeros, 0.0));
  for (std::size_t row = 0; row < 3; ++row) {
    double square = 0, mean = 0, var = 0;
    for (std::size_t j = 0; j < 8; ++j) {
      square += r[row * 8 + j] * r[row * 8 + j];
      mean += l[row * 8 + j] / 8;
    }
    for (std::size_t j = 0; j < 8; ++j) var += (l[row * 8 + j] - mean) * (l[row * 8 + j] - mean) / 8;
    CHECK(square / 8 == doctest::Approx(1).epsilon(1e-14));
    CHECK(std::abs(mean) < 1e-15);
    CHECK(var == doctest::Approx(1).epsilon(1e-14));
  }
}

// ---------------------------------------- fused nodes against their composites --

namespace {

// One loss through `op` on a fresh tape: the output's value and the two operands' gradients.
template <class T>
struct Bits {
  std::vector<T> value, grad_a, grad_b;
};
template <class T, class Op>
Bits<T> bits_of(const Tensor<T>& a, const Tensor<T>& b, Op op) {
  Tape<T> tp;
  Var<T> va = tp.param(a), vb = tp.param(b);
  Var<T> y = op(va, vb);
  REQUIRE(tp.backward(weighted_sum(y)));
  auto copy = [](View<T> v) { return std::vector<T>(v.begin(), v.end()); };
  return {copy(tp.value(y)), copy(tp.grad(va)), copy(tp.grad(vb))};
}
template <class T>
void check_same_bits(const Bits<T>& got, const Bits<T>& want) {
  CHECK(bitwise_equal<T>(got.value, want.value));
  CHECK(bitwise_equal<T>(got.grad_a, want.grad_a));
  CHECK(bitwise_equal<T>(got.grad_b, want.grad_b));
}

// Shapes {m, k, n}: one element, one row, lengths off every vector width, then random ones.
std::vector<std::array<std::size_t, 3>> product_shapes(Rng& rng) {
  std::vector<std::array<std::size_t, 3>> s = {{1, 1, 1}, {1, 7, 3}, {1, 33, 17}, {5, 17, 9}, {19, 70, 33}};
  for (int i = 0; i < 6; ++i) s.push_back({1 + rng.next() % 40, 1 + rng.next() % 90, 1 + rng.next() % 50});
  return s;
}

template <class T>
void check_matmul_nt_bits() {
  Rng rng(31);
  for (std::size_t threads : {1, 3}) {
    set_num_threads(threads);
    for (const auto& [m, k, n] : product_shapes(rng)) {
      CAPTURE(m);
      CAPTURE(k);
      CAPTURE(n);
      CAPTURE(threads);
      const Tensor<T> a = random_tensor<T>({m, k}, rng), b = random_tensor<T>({n, k}, rng);
      check_same_bits(bits_of(a, b, [](Var<T> x, Var<T> w) { return matmul_nt(x, w); }),
                      bits_of(a, b, [](Var<T> x, Var<T> w) { return matmul(x, transpose(w)); }));
    }
  }
  set_num_threads(1);
  // A batched a is matmul over its rows.
  const Tensor<T> a = random_tensor<T>({2, 3, 5}, rng), b = random_tensor<T>({4, 5}, rng);
  check_same_bits(bits_of(a, b, [](Var<T> x, Var<T> w) { return matmul_nt(x, w); }),
                  bits_of(a, b, [](Var<T> x, Var<T> w) {
                    return reshape(matmul(reshape(x, {6, 5}), transpose(w)), {2, 3, 4});
                  }));
}

// nn::rmsnorm as it was: seven nodes.
template <class T>
Var<T> rmsnorm_composite(Var<T> x, Var<T> w, T eps) {
  const T cols = static_cast<T>(x.tape()->dims(x).back());
  Var<T> mean_square = row_sum(x * x) / cols;
  return x / grad::sqrt(mean_square + eps) * w;
}

template <class T>
void check_rms_norm_bits() {
  Rng rng(32);
  for (std::size_t threads : {1, 3}) {
    set_num_threads(threads);
    for (const auto& [rows, cols, unused] : product_shapes(rng)) {
      for (const T eps : {T(1e-6), T(0.25)}) {
        CAPTURE(rows);
        CAPTURE(cols);
        CAPTURE(threads);
        const Tensor<T> x = random_tensor<T>({rows, cols}, rng, -2, 2), w = random_tensor<T>({cols}, rng, 0.5, 1.5);
        check_same_bits(bits_of(x, w, [eps](Var<T> a, Var<T> b) { return nn::rmsnorm(a, b, eps); }),
                        bits_of(x, w, [eps](Var<T> a, Var<T> b) { return rmsnorm_composite(a, b, eps); }));
      }
    }
  }
  // Rows many and long enough for the threaded host loops (and a row past
  // one 4096-element chunk of the fixed-order sum).
  for (const Shape& s : {Shape{300, 131}, Shape{3, 5000}}) {
    set_num_threads(3);
    const Tensor<T> x = random_tensor<T>(s, rng, -2, 2), w = random_tensor<T>({s[1]}, rng, 0.5, 1.5);
    check_same_bits(bits_of(x, w, [](Var<T> a, Var<T> b) { return nn::rmsnorm(a, b, T(1e-6)); }),
                    bits_of(x, w, [](Var<T> a, Var<T> b) { return rmsnorm_composite(a, b, T(1e-6)); }));
  }
  set_num_threads(1);
}

// nn::layernorm as it was: eleven nodes.
template <class T>
Var<T> layernorm_composite(Var<T> x, Var<T> w, Var<T> b, T eps) {
  const T cols = static_cast<T>(x.tape()->dims(x).back());
  Var<T> centered = x - row_sum(x) / cols;
  Var<T> variance = row_sum(centered * centered) / cols;
  return centered / grad::sqrt(variance + eps) * w + b;
}

template <class T>
void check_layer_norm_bits() {
  Rng rng(34);
  auto check = [&](std::size_t rows, std::size_t cols, T eps) {
    CAPTURE(rows);
    CAPTURE(cols);
    const Tensor<T> x = random_tensor<T>({rows, cols}, rng, -2, 3), w = random_tensor<T>({cols}, rng, 0.5, 1.5);
    const Tensor<T> bias = random_tensor<T>({cols}, rng);
    auto run = [&](bool fused) {
      Tape<T> tp;
      Var<T> vx = tp.param(x), vw = tp.param(w), vb = tp.param(bias);
      Var<T> y = fused ? nn::layernorm(vx, vw, vb, eps) : layernorm_composite(vx, vw, vb, eps);
      REQUIRE(tp.backward(weighted_sum(y)));
      std::vector<T> out;
      for (Var<T> v : {y, vx, vw, vb})
        for (T e : v.index() == y.index() ? tp.value(v) : tp.grad(v)) out.push_back(e);
      return out;
    };
    CHECK(bitwise_equal<T>(run(true), run(false)));
  };
  for (std::size_t threads : {1, 3}) {
    set_num_threads(threads);
    for (const auto& [rows, cols, unused] : product_shapes(rng))
      for (const T eps : {T(1e-5), T(0.25)}) check(rows, cols, eps);
  }
  set_num_threads(3);
  check(300, 131, T(1e-5));
  check(3, 5000, T(1e-5));
  set_num_threads(1);
}

}  // namespace

TEST_CASE("layernorm's one layer_norm node (then * w + b) gives the bits of the composite: value and every gradient") {
  check_layer_norm_bits<double>();
  check_layer_norm_bits<float>();
}

TEST_CASE("matmul_nt gives the bits of matmul(a, transpose(b)): value and both gradients, f64 and f32") {
  check_matmul_nt_bits<double>();
  check_matmul_nt_bits<float>();
}

TEST_CASE("rmsnorm's one rms_norm node gives the bits of the seven-op composite: value, dx and dw, f64 and f32") {
  check_rms_norm_bits<double>();
  check_rms_norm_bits<float>();
}

TEST_CASE("rms_norm with a later consumer of x: the same gradient terms, x's three added once instead of one by one") {
  // The residual stream's case: x feeds the norm and a later add. The tape
  // sums x's contributions in descending consumer order; the composite adds
  // its three (div, then x*x's two operands) one by one after the add's, the
  // node adds their sum once. So dx = add's + (the node's dx alone), exactly.
  Rng rng(33);
  const Tensor<double> x = random_tensor<double>({7, 45}, rng, -2, 2), w = random_tensor<double>({45}, rng, 0.5, 1.5);
  const Bits<double> alone = bits_of(x, w, [](Var<double> a, Var<double> b) { return nn::rmsnorm(a, b, 1e-6); });
  const Bits<double> residual =
      bits_of(x, w, [](Var<double> a, Var<double> b) { return nn::rmsnorm(a, b, 1e-6) + a; });
  const Bits<double> composite =
      bits_of(x, w, [](Var<double> a, Var<double> b) { return rmsnorm_composite(a, b, 1e-6) + a; });
  // The add's contribution to x is weighted_sum's weights (the add passes them on).
  Tape<double> tp;
  Var<double> ones = tp.param(Tensor<double>::zeros({7, 45}));
  REQUIRE(tp.backward(weighted_sum(ones)));
  const View<double> add = tp.grad(ones);
  std::size_t differ = 0;
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    CHECK(residual.grad_a[i] == add[i] + alone.grad_a[i]);
    differ += residual.grad_a[i] != composite.grad_a[i];
    worst = std::max(worst, std::abs(residual.grad_a[i] - composite.grad_a[i]) / std::abs(composite.grad_a[i]));
  }
  MESSAGE("x with a later consumer: " << differ << " of " << x.size() << " gradient elements differ from the "
                                      << "composite's, worst relative difference " << worst);
  CHECK(worst <= 4 * std::numeric_limits<double>::epsilon());
  CHECK(bitwise_equal<double>(residual.value, composite.value));
  CHECK(bitwise_equal<double>(residual.grad_b, composite.grad_b));
}

TEST_CASE("silu, swiglu and softmax match central differences") {
  Rng rng(5);
  check_fd({random_tensor<double>({3, 4}, rng, -3, 3)}, [](Tp, V v) { return weighted_sum(nn::silu(v[0])); });
  check_fd({random_tensor<double>({3, 4}, rng, -3, 3), random_tensor<double>({3, 4}, rng)},
           [](Tp, V v) { return weighted_sum(nn::swiglu(v[0], v[1])); });
  check_fd({random_tensor<double>({3, 4}, rng)}, [](Tp, V v) { return weighted_sum(nn::softmax(v[0], -1)); });
}

TEST_CASE("rope_tables follow the NEOX half split with theta_j = base^(-2j/head_dim)") {
  const auto tables = nn::rope_tables<double>(5, 6, 100.0);
  REQUIRE(tables.cos.shape() == Shape{5, 6});
  for (std::size_t p = 0; p < 5; ++p)
    for (std::size_t j = 0; j < 3; ++j) {
      const double angle = static_cast<double>(p) * std::pow(100.0, -2.0 * static_cast<double>(j) / 6.0);
      CHECK(tables.cos[p * 6 + j] == doctest::Approx(std::cos(angle)).epsilon(1e-15));
      CHECK(tables.sin[p * 6 + j] == doctest::Approx(std::sin(angle)).epsilon(1e-15));
      CHECK(tables.cos[p * 6 + j + 3] == tables.cos[p * 6 + j]);
      CHECK(tables.sin[p * 6 + j + 3] == tables.sin[p * 6 + j]);
    }
}

TEST_CASE("rope rotates each pair (j, j + head_dim/2) by its angle and matches central differences") {
  const auto tables = nn::rope_tables<double>(4, 6, 10000.0);
  Tape<double> tp;
  Rng rng(6);
  const Tensor<double> h = random_tensor<double>({4, 6}, rng);
  const View<double> y = tp.value(nn::rope(tp.constant(h), tp.constant(tables.cos), tp.constant(tables.sin)));
  for (std::size_t p = 0; p < 4; ++p)
    for (std::size_t j = 0; j < 3; ++j) {
      const double c = tables.cos[p * 6 + j], s = tables.sin[p * 6 + j];
      const double x1 = h[p * 6 + j], x2 = h[p * 6 + j + 3];
      CHECK(y[p * 6 + j] == doctest::Approx(x1 * c - x2 * s).epsilon(1e-15));
      CHECK(y[p * 6 + j + 3] == doctest::Approx(x2 * c + x1 * s).epsilon(1e-15));
    }
  check_fd({h},
           [&](Tp t, V v) { return weighted_sum(nn::rope(v[0], t.constant(tables.cos), t.constant(tables.sin))); });
}

TEST_CASE("head takes one head's columns and matches central differences") {
  Tape<double> tp;
  auto q = tp.constant(Tensor<double>({2, 6}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}));
  const View<double> h = tp.value(nn::head(q, 2, 2));
  CHECK(std::vector<double>(h.begin(), h.end()) == std::vector<double>{4, 5, 10, 11});
  Rng rng(7);
  check_fd({random_tensor<double>({3, 8}, rng)}, [](Tp, V v) { return weighted_sum(nn::head(v[0], 1, 4)); });
}

TEST_CASE("causal_mask is 0 on and below the diagonal and -1e9 above") {
  const Tensor<double> m = nn::causal_mask<double>(3);
  CHECK(std::vector<double>(m.data().begin(), m.data().end()) ==
        std::vector<double>{0, -1e9, -1e9, 0, 0, -1e9, 0, 0, 0});
}

TEST_CASE("gqa_attention matches central differences in q, k and v") {
  const std::size_t t = 4, hd = 4;
  const auto tables = nn::rope_tables<double>(t, hd, 10000.0);
  Rng rng(8);
  check_fd({random_tensor<double>({t, 4 * hd}, rng), random_tensor<double>({t, 2 * hd}, rng),
            random_tensor<double>({t, 2 * hd}, rng)},
           [&](Tp tp, V v) {
             return weighted_sum(nn::gqa_attention(v[0], v[1], v[2], tp.constant(tables.cos), tp.constant(tables.sin),
                                                   tp.constant(nn::causal_mask<double>(t)), 4, 2, hd));
           });
}

TEST_CASE("gqa_attention: the first position attends only to itself, so its context is its value row") {
  const std::size_t t = 3, hd = 2;
  const auto tables = nn::rope_tables<double>(t, hd, 10000.0);
  Rng rng(9);
  Tape<double> tp;
  auto v = tp.constant(random_tensor<double>({t, hd}, rng));
  auto ctx = nn::gqa_attention(tp.constant(random_tensor<double>({t, 2 * hd}, rng)),
                               tp.constant(random_tensor<double>({t, hd}, rng)), v, tp.constant(tables.cos),
                               tp.constant(tables.sin), tp.constant(nn::causal_mask<double>(t)), 2, 1, hd);
  REQUIRE(tp.ok());
  const View<double> c = tp.value(ctx), vv = tp.value(v);
  for (std::size_t h = 0; h < 2; ++h)  // both query heads share the one key/value head
    for (std::size_t j = 0; j < hd; ++j) CHECK(c[h * hd + j] == vv[j]);
}

// The layouts nn::attention recorded before its layout tags (heads.hpp):
// [B*t, n*hd] -> [B*n, t, hd] and back by reshapes and transposes, RoPE as
// seven nodes (slice, neg, slice, concat, two muls, an add).
template <class T>
Var<T> heads_major_composite(Var<T> m, std::size_t B, std::size_t t, std::size_t n, std::size_t hd) {
  Var<T> x = transpose(reshape(m, {B, t, n * hd}));  // [B, n*hd, t]
  return transpose(reshape(x, {B * n, hd, t}));      // [B*n, t, hd]
}
template <class T>
Var<T> rows_major_composite(Var<T> c, std::size_t B, std::size_t t, std::size_t n, std::size_t hd) {
  Var<T> x = transpose(reshape(transpose(c), {B, n * hd, t}));  // [B, t, n*hd]
  return reshape(x, {B * t, n * hd});
}
template <class T>
Var<T> rope_heads_composite(Var<T> h, Var<T> cos, Var<T> sin, std::size_t N, std::size_t t, std::size_t hd) {
  const std::size_t half = hd / 2;
  Var<T> rotated = concat(-slice(h, {0, 0, half}, {N, t, hd}), slice(h, {0, 0, 0}, {N, t, half}), -1);
  return h * cos + rotated * sin;
}

// nn::detail::causal_attention as it was recorded before the layout tags:
// the fused attention ops between the composite layouts.
template <class T>
Var<T> composite_layout_attention(Var<T> q, Var<T> k, Var<T> v, std::size_t B, std::size_t t, std::size_t H,
                                  std::size_t KV, std::size_t hd, Var<T> cos, Var<T> sin) {
  const std::size_t group = H / KV, N = B * KV;
  Var<T> q3 = heads_major_composite(q, B, t, H, hd);
  if (cos.valid()) q3 = rope_heads_composite(q3, cos, sin, B * H, t, hd);
  Var<T> k3 = heads_major_composite(k, B, t, KV, hd);
  if (cos.valid()) k3 = rope_heads_composite(k3, cos, sin, N, t, hd);
  Var<T> v3 = heads_major_composite(v, B, t, KV, hd);
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  Var<T> probs = causal_attention_probs(reshape(q3, {N, group * t, hd}), k3, scale);
  Var<T> context = reshape(attention_context(probs, v3), {B * H, t, hd});
  return rows_major_composite(context, B, t, H, hd);
}

// The recording nn::attention replaced (nn::Lm's before the fused ops): k
// and v repeated once per query head of their group by concat, the scores
// plus nn::causal_mask, softmax, bmm.
template <class T>
Var<T> unfused_attention(Var<T> q, Var<T> k, Var<T> v, std::size_t B, std::size_t H, std::size_t KV, Var<T> cos,
                         Var<T> sin) {
  Tape<T>& tp = *q.tape();
  const std::size_t hd = tp.dims(q)[1] / H, t = tp.dims(q)[0] / B, group = H / KV;
  Var<T> q3 = heads_major_composite(q, B, t, H, hd);
  if (cos.valid()) q3 = rope_heads_composite(q3, cos, sin, B * H, t, hd);
  Var<T> k3 = heads_major_composite(k, B, t, KV, hd);
  if (cos.valid()) k3 = rope_heads_composite(k3, cos, sin, B * KV, t, hd);
  Var<T> v3 = heads_major_composite(v, B, t, KV, hd);
  if (group > 1) {
    auto repeat = [&](Var<T> m) {
      Var<T> one = reshape(m, {B * KV, 1, t * hd}), all = one;
      for (std::size_t g = 1; g < group; ++g) all = concat(all, one, 1);
      return reshape(all, {B * H, t, hd});
    };
    k3 = repeat(k3);
    v3 = repeat(v3);
  }
  const T scale = T(1) / std::sqrt(static_cast<T>(hd));
  Var<T> scores = bmm(q3, transpose(k3)) * scale + tp.constant(nn::causal_mask<T>(t));
  return rows_major_composite(bmm(softmax(scores, -1), v3), B, t, H, hd);
}

// Records nn::attention (fused) or the unfused path on the same inputs and
// returns the context and the gradients of q, k and v.
template <class T>
std::vector<std::vector<T>> attention_run(bool fused, const std::vector<Tensor<T>>& inputs, std::size_t B,
                                          std::size_t H, std::size_t KV, const nn::RopeTables<T>* rope) {
  Tape<T> tp;
  auto q = tp.param(inputs[0]), k = tp.param(inputs[1]), v = tp.param(inputs[2]);
  Var<T> cos, sin;
  if (rope) {
    cos = tp.constant(rope->cos);
    sin = tp.constant(rope->sin);
  }
  Var<T> ctx = fused ? nn::attention(q, k, v, B, H, KV, cos, sin) : unfused_attention(q, k, v, B, H, KV, cos, sin);
  REQUIRE(tp.ok());
  tp.backward(weighted_sum(ctx));
  auto copy = [](View<T> view) { return std::vector<T>(view.begin(), view.end()); };
  return {copy(tp.value(ctx)), copy(tp.grad(q)), copy(tp.grad(k)), copy(tp.grad(v))};
}

template <class T>
void check_attention_bits(std::size_t B, std::size_t H, std::size_t KV, std::size_t t, bool rotary) {
  const std::size_t hd = 6;
  CAPTURE(B);
  CAPTURE(H);
  CAPTURE(KV);
  CAPTURE(t);
  CAPTURE(rotary);
  Rng rng(1000 * B + 100 * H + 10 * KV + t);
  const std::vector<Tensor<T>> inputs{random_tensor<T>({B * t, H * hd}, rng, -2, 2),
                                      random_tensor<T>({B * t, KV * hd}, rng, -2, 2),
                                      random_tensor<T>({B * t, KV * hd}, rng, -2, 2)};
  const auto tables = nn::rope_tables<T>(t, hd, T(10000));
  const auto fused = attention_run<T>(true, inputs, B, H, KV, rotary ? &tables : nullptr);
  const auto unfused = attention_run<T>(false, inputs, B, H, KV, rotary ? &tables : nullptr);
  const char* what[] = {"context", "dq", "dk", "dv"};
  for (std::size_t i = 0; i < fused.size(); ++i) {
    CAPTURE(what[i]);
    CHECK(bitwise_equal<T>(fused[i], unfused[i]));
  }
}

TEST_CASE("attention (fused causal probabilities, no mask, no repeated k/v) gives the unfused path's bits, gradients "
          "included") {
  struct Heads {
    std::size_t H, KV;
  };
  for (const Heads h : {Heads{2, 2}, Heads{4, 2}, Heads{7, 1}})  // MHA, GQA with groups of 2 and 7
    for (const std::size_t t : {1, 5, 33})
      for (const std::size_t B : {1, 2}) {
        check_attention_bits<double>(B, h.H, h.KV, t, true);
        check_attention_bits<float>(B, h.H, h.KV, t, true);
      }
  check_attention_bits<double>(2, 4, 2, 5, false);  // without RoPE
  check_attention_bits<float>(2, 7, 1, 33, false);
  // past two of causal_attention_probs' blocks of 32 positions (the last one partial), on 1 and 3 threads
  for (const std::size_t threads : {1, 3}) {
    set_num_threads(threads);
    check_attention_bits<float>(2, 4, 2, 70, true);
    check_attention_bits<double>(1, 3, 1, 70, true);
  }
  set_num_threads(1);
}

namespace {

// nn::detail::causal_attention (the layout tags) against the composite
// layouts on the same inputs: the context and the gradients of q, k, v and
// of upstream parameters x (q, k, v are x's products, so every gradient
// reaching x passes the layouts). The loss weights hold +0 and -0 as well,
// and position 0's query gradient is exactly zero: a +-0 that RoPE's
// backward must turn into the composite's +0.
template <class T>
void check_layout_bits(std::size_t B, std::size_t H, std::size_t KV, std::size_t t, std::size_t hd, bool rotary) {
  CAPTURE(B);
  CAPTURE(H);
  CAPTURE(KV);
  CAPTURE(t);
  CAPTURE(hd);
  CAPTURE(rotary);
  Rng rng(10000 * B + 1000 * H + 100 * KV + 10 * t + hd);
  const std::size_t d = 5;
  const Tensor<T> x = random_tensor<T>({B * t, d}, rng, -2, 2), wq = random_tensor<T>({d, H * hd}, rng, -1, 1),
                  wk = random_tensor<T>({d, KV * hd}, rng, -1, 1), wv = random_tensor<T>({d, KV * hd}, rng, -1, 1);
  Tensor<T> weights = random_tensor<T>({B * t, H * hd}, rng, -1, 1);
  for (std::size_t i = 0; i < weights.size(); i += 3) weights[i] = i % 2 ? T(-0.0) : T(0);
  const auto tables = nn::rope_tables<T>(t, hd, T(10000));
  auto run = [&](bool tags) {
    Tape<T> tp;
    Var<T> vx = tp.param(x), vq = tp.param(wq), vk = tp.param(wk), vv = tp.param(wv);
    Var<T> q = matmul(vx, vq), k = matmul(vx, vk), v = matmul(vx, vv), cos, sin;
    if (rotary) {
      cos = tp.constant(tables.cos);
      sin = tp.constant(tables.sin);
    }
    Var<T> ctx = tags ? nn::detail::causal_attention(q, k, v, B, t, H, KV, hd, cos, sin)
                      : composite_layout_attention(q, k, v, B, t, H, KV, hd, cos, sin);
    REQUIRE(tp.backward(grad::sum(ctx * tp.constant(weights))));
    std::vector<std::vector<T>> out;
    auto copy = [&](View<T> view) { out.emplace_back(view.begin(), view.end()); };
    copy(tp.value(ctx));
    for (Var<T> p : {q, k, v, vx, vq, vk, vv}) copy(tp.grad(p));
    return out;
  };
  const auto tags = run(true), composite = run(false);
  const std::string what[] = {"context", "dq", "dk", "dv", "dx", "dwq", "dwk", "dwv"};
  for (std::size_t i = 0; i < tags.size(); ++i) {
    CAPTURE(what[i]);
    CHECK(bitwise_equal<T>(tags[i], composite[i]));
  }
}

// rope_heads_major alone against heads_major_composite + rope_heads_composite
// (and rows_major(heads_major(m)) against the composite round trip), with
// loss weights of which about half are +0 or -0: pairs (c, c + hd/2) of
// zero gradients whose products are -0, where the composite's walk turns
// the sum into +0.
template <class T>
void check_rope_bits(std::size_t B, std::size_t n, std::size_t t, std::size_t hd) {
  CAPTURE(B);
  CAPTURE(n);
  CAPTURE(t);
  CAPTURE(hd);
  Rng rng(1000 * B + 100 * n + 10 * t + hd);
  const Tensor<T> m = random_tensor<T>({B * t, n * hd}, rng, -2, 2);
  Tensor<T> weights = random_tensor<T>({B * n, t, hd}, rng, -1, 1);
  for (T& w : weights.data())
    if (rng.next() % 2) w = rng.next() % 2 ? T(-0.0) : T(0);
  const auto tables = nn::rope_tables<T>(t, hd, T(10000));
  // Each on its own tape: the gradient of m is the one op's alone.
  auto run = [&](bool tags, bool round_trip) {
    Tape<T> tp;
    Var<T> vm = tp.param(m), cos = tp.constant(tables.cos), sin = tp.constant(tables.sin);
    Var<T> table = concat(reshape(cos, {1, t, hd}), reshape(sin, {1, t, hd}), 0);
    Var<T> heads = tags ? heads_major(vm, B, n) : heads_major_composite(vm, B, t, n, hd);
    Var<T> y = !round_trip ? tags ? rope_heads_major(vm, table) : rope_heads_composite(heads, cos, sin, B * n, t, hd)
               : tags      ? rows_major(heads, B)
                           : rows_major_composite(heads, B, t, n, hd);
    REQUIRE(tp.backward(grad::sum(y * tp.constant(round_trip ? m : weights))));
    return std::vector<std::vector<T>>{{tp.value(y).begin(), tp.value(y).end()},
                                       {tp.grad(vm).begin(), tp.grad(vm).end()}};
  };
  const auto rope_tags = run(true, false), rope_composite = run(false, false);
  const auto trip_tags = run(true, true), trip_composite = run(false, true);
  const std::vector<std::vector<T>> tags{rope_tags[0], trip_tags[0], rope_tags[1], trip_tags[1]},
      composite{rope_composite[0], trip_composite[0], rope_composite[1], trip_composite[1]};
  const std::string what[] = {"rotated", "round trip", "dm (rope)", "dm (round trip)"};
  for (std::size_t i = 0; i < tags.size(); ++i) {
    CAPTURE(what[i]);
    CHECK(bitwise_equal<T>(tags[i], composite[i]));
  }
}

// silu_mul and add_scaled (tags/gated.hpp) against the composites they
// replace, each on its own tape: values and both operands' gradients bit for
// bit. The loss weights hold +0 and -0 and the gate values large magnitudes
// (sigmoid saturating to 0 and 1); `later` gives the first operand a later
// consumer recorded after the op, whose gradient the walk sums first.
template <class T>
void check_gated_bits(const Shape& sa, const Shape& sb, T scale, bool later) {
  CAPTURE(shape_string(Dims::of(sa)));
  CAPTURE(shape_string(Dims::of(sb)));
  Rng rng(sa.back() * 31 + sb.size());
  Tensor<T> a = random_tensor<T>(sa, rng, -3, 3), b = random_tensor<T>(sb, rng, -2, 2);
  for (std::size_t i = 0; i < a.size(); i += 7) a.data()[i] *= T(12);
  Dims out;
  REQUIRE(broadcast_dims(Dims::of(sa), Dims::of(sb), out));
  Tensor<T> weights = random_tensor<T>(out.shape(), rng, -1, 1);
  for (T& w : weights.data())
    if (rng.next() % 4 == 0) w = rng.next() % 2 ? T(-0.0) : T(0);
  for (const bool silu : {true, false}) {
    CAPTURE(silu);
    auto run = [&](bool fused) {
      Tape<T> tp;
      Var<T> va = tp.param(a), vb = tp.param(b);
      Var<T> y = silu ? (fused ? silu_mul(va, vb) : nn::silu(va) * vb)
                      : (fused ? add_scaled(va, vb, scale) : va + vb * scale);
      Var<T> loss = grad::sum(y * tp.constant(weights));
      if (later) loss = loss + grad::sum(va * va);
      REQUIRE(tp.backward(loss));
      return std::vector<std::vector<T>>{{tp.value(y).begin(), tp.value(y).end()},
                                         {tp.grad(va).begin(), tp.grad(va).end()},
                                         {tp.grad(vb).begin(), tp.grad(vb).end()}};
    };
    const auto fused = run(true), composite = run(false);
    CHECK(bitwise_equal<T>(fused[0], composite[0]));
    // A later consumer of the gate: the composite adds silu's two terms to
    // its gradient one by one, the node their sum; a broadcast gate: the
    // composite sums d silu over the rows first (both documented).
    if (!(silu && (later || !(Dims::of(sa) == out)))) CHECK(bitwise_equal<T>(fused[1], composite[1]));
    // A broadcast b of add_scaled: the composite sums g over the rows, then
    // scales; the node sums g * s (documented).
    if (silu || Dims::of(sb) == out) CHECK(bitwise_equal<T>(fused[2], composite[2]));
  }
}

}  // namespace

TEST_CASE("silu_mul and add_scaled give the bits of silu(a) * b and a + b * s: values and both gradients, "
          "every length of pack and tail, broadcasting, 1 and 3 threads") {
  for (const std::size_t threads : {1, 3}) {
    set_num_threads(threads);
    for (const std::size_t n : {1, 7, 16, 33, 100})
      for (const bool later : {false, true}) {
        check_gated_bits<float>({3, n}, {3, n}, 2.0f, later);
        check_gated_bits<double>({3, n}, {3, n}, -0.3, later);
        check_gated_bits<float>({4, n}, {n}, 0.7f, later);  // b broadcast over rows
        check_gated_bits<double>({n}, {5, n}, 1.5, later);  // a broadcast
      }
    check_gated_bits<float>({300, 257}, {300, 257}, 2.0f, false);  // past the elementwise grain: split over threads
  }
  set_num_threads(1);
}

TEST_CASE("the attention layout tags (heads_major, rope_heads_major, rows_major) give the composite layouts' bits: "
          "context and every gradient") {
  struct Heads {
    std::size_t H, KV;
  };
  for (const std::size_t threads : {1, 3}) {
    set_num_threads(threads);
    for (const Heads h : {Heads{2, 2}, Heads{4, 2}, Heads{3, 1}})  // MHA, GQA with groups of 2 and 3
      for (const std::size_t t : {1, 5, 33})
        for (const std::size_t B : {1, 2})
          for (const std::size_t hd : {2, 6, 16, 24}) {  // 16, 24: the host loops' packs and their tails
            check_layout_bits<double>(B, h.H, h.KV, t, hd, true);
            check_layout_bits<float>(B, h.H, h.KV, t, hd, true);
          }
    check_layout_bits<double>(2, 4, 2, 5, 16, false);  // without RoPE
    check_layout_bits<float>(2, 3, 1, 33, 6, false);
  }
  for (const std::size_t hd : {2, 6, 16, 24})
    for (const std::size_t t : {1, 5, 33}) {
      check_rope_bits<double>(2, 3, t, hd);
      check_rope_bits<float>(2, 3, t, hd);
      check_rope_bits<float>(1, 1, t, hd);
    }
  // Still on 3 threads: heads of t * hd past the elementwise grain, which
  // the layout copies and the rotation split over the pool (8 heads, 4 parts).
  check_rope_bits<float>(2, 4, 64, 256);
  check_rope_bits<double>(2, 4, 64, 256);
  // And reshape's copies, split the same way: the value is the input's bits,
  // the gradient the upstream gradient's.
  Rng rng(3);
  const Tensor<float> m = random_tensor<float>({300, 257}, rng), w = random_tensor<float>({257, 300}, rng);
  Tape<float> tp;
  Var<float> vm = tp.param(m), y = reshape(vm, {257, 300});
  REQUIRE(tp.backward(grad::sum(y * tp.constant(w))));
  CHECK(bitwise_equal<float>({tp.value(y).begin(), tp.value(y).end()}, m.data()));
  CHECK(bitwise_equal<float>({tp.grad(vm).begin(), tp.grad(vm).end()}, w.data()));
  set_num_threads(1);
}

TEST_CASE("causal_attention_probs: rows sum to 1, keys after the query's position get exactly 0") {
  const std::size_t N = 2, G = 3, t = 4, hd = 2;
  Rng rng(12);
  Tape<double> tp;
  auto p = causal_attention_probs(tp.constant(random_tensor<double>({N, G * t, hd}, rng)),
                                  tp.constant(random_tensor<double>({N, t, hd}, rng)), 0.5);
  REQUIRE(tp.ok());
  const View<double> pv = tp.value(p);
  for (std::size_t r = 0; r < N * G * t; ++r) {
    double total = 0;
    for (std::size_t j = 0; j < t; ++j) {
      const double x = pv[r * t + j];
      if (j > r % t) CHECK(x == 0.0);
      total += x;
    }
    CHECK(total == doctest::Approx(1.0).epsilon(1e-15));
  }
}

// attention_context on causal_attention_probs' output skips the masked terms
// of its products (axis 1); on any other p (here the same values as a
// parameter) it computes them whole. Same context and v gradient either way,
// and p's gradient stays g . v^T at every position, masked ones included.
template <class T>
void check_causal_context(std::size_t N, std::size_t G, std::size_t t, std::size_t threads) {
  CAPTURE(N);
  CAPTURE(G);
  CAPTURE(t);
  CAPTURE(threads);
  set_num_threads(threads);
  const std::size_t hd = 5;
  Rng rng(100 * G + t);
  const Tensor<T> q = random_tensor<T>({N, G * t, hd}, rng, -2, 2), k = random_tensor<T>({N, t, hd}, rng, -2, 2),
                  v = random_tensor<T>({N, t, hd}, rng, -2, 2);
  Tape<T> causal;
  Var<T> probs = causal_attention_probs(causal.param(q), causal.param(k), T(0.4)), cv = causal.param(v);
  Var<T> ctx = attention_context(probs, cv);
  REQUIRE(causal.backward(weighted_sum(ctx)));
  Tape<T> whole;
  Var<T> given = whole.param(causal.value(probs).tensor());
  Var<T> wv = whole.param(v), wctx = attention_context(given, wv);
  REQUIRE(whole.backward(weighted_sum(wctx)));
  CHECK(bitwise_equal<T>(causal.value(ctx).data, whole.value(wctx).data));
  CHECK(bitwise_equal<T>(causal.grad(cv).data, whole.grad(wv).data));
  CHECK(bitwise_equal<T>(causal.grad(probs).data, whole.grad(given).data));
  bool masked_nonzero = false;  // the masked positions' gradient is really there
  const View<T> dp = causal.grad(probs);
  for (std::size_t r = 0; r < N * G * t; ++r)
    for (std::size_t j = r % t + 1; j < t; ++j) masked_nonzero = masked_nonzero || dp[r * t + j] != T(0);
  CHECK(masked_nonzero == (t > 1));
  set_num_threads(1);
}

TEST_CASE("attention_context on causal probabilities skips their masked zeros: the whole products' bits") {
  for (const std::size_t t : {1, 5, 32, 33, 70})
    for (const std::size_t G : {1, 3})
      for (const std::size_t threads : {1, 3}) {
        check_causal_context<double>(2, G, t, threads);
        check_causal_context<float>(2, G, t, threads);
      }
}

TEST_CASE("attention matches central differences in q, k and v (MHA and GQA, with and without RoPE)") {
  const std::size_t B = 2, t = 3, hd = 4;
  const auto tables = nn::rope_tables<double>(t, hd, 10000.0);
  for (const bool rotary : {true, false})
    for (const std::size_t KV : {std::size_t{1}, std::size_t{2}}) {
      Rng rng(20 + KV);
      check_fd({random_tensor<double>({B * t, 2 * hd}, rng), random_tensor<double>({B * t, KV * hd}, rng),
                random_tensor<double>({B * t, KV * hd}, rng)},
               [&](Tp tp, V v) {
                 Var<double> cos, sin;
                 if (rotary) {
                   cos = tp.constant(tables.cos);
                   sin = tp.constant(tables.sin);
                 }
                 return weighted_sum(nn::attention(v[0], v[1], v[2], B, 2, KV, cos, sin));
               });
    }
}

TEST_CASE("cross_entropy and cross_entropy_rows match central differences and -log softmax at the target") {
  Rng rng(10);
  const Tensor<double> targets = onehot_rows({2, 0, 3}, 4);
  check_fd({random_tensor<double>({3, 4}, rng, -2, 2)},
           [&](Tp tp, V v) { return nn::cross_entropy(v[0], tp.constant(targets)); });
  check_fd({random_tensor<double>({4, 4}, rng, -2, 2)},
           [&](Tp tp, V v) { return nn::cross_entropy_rows(v[0], tp.constant(targets), 2); });

  Tape<double> tp;
  const Tensor<double> logits({2, 3}, {1, 2, 3, 1000, 0, -1000});  // large logits must not overflow
  const double loss = tp.scalar(nn::cross_entropy(tp.constant(logits), tp.constant(onehot_rows({0, 0}, 3))));
  const double row0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 1;
  CHECK(loss == doctest::Approx(row0 / 2).epsilon(1e-15));
}

namespace {
// A small attention + MLP stack recorded at precision T from the same double inputs.
template <class T>
double small_stack_loss(std::uint64_t seed) {
  Rng rng(seed);
  auto cast = [](const Tensor<double>& d) {
    Tensor<T> t(d.shape());
    for (std::size_t i = 0; i < d.size(); ++i) t[i] = static_cast<T>(d[i]);
    return t;
  };
  auto c = [&](Tape<T>& tp, Shape shape) { return tp.constant(cast(random_tensor<double>(std::move(shape), rng))); };
  Tape<T> tp;
  const auto tables = nn::rope_tables<T>(4, 2, T(10000));
  Var<T> x = c(tp, {4, 8});
  Var<T> h = nn::layernorm(nn::rmsnorm(x, c(tp, {8}), T(1e-6)), c(tp, {8}), c(tp, {8}), T(1e-5));
  Var<T> q = nn::lora_linear(h, c(tp, {8, 4}), c(tp, {8, 2}), c(tp, {2, 4}), T(0.5));
  Var<T> kv = nn::linear_bias(h, c(tp, {8, 2}), c(tp, {2}));
  Var<T> ctx = nn::gqa_attention(q, kv, kv, tp.constant(tables.cos), tp.constant(tables.sin),
                                 tp.constant(nn::causal_mask<T>(4)), 2, 1, 2);
  Var<T> logits = nn::linear(nn::swiglu(ctx, nn::silu(ctx)), c(tp, {4, 5}));
  const Var<T> loss = nn::cross_entropy_rows(logits, tp.constant(cast(onehot_rows({1, 4, 0}, 5))), 3);
  REQUIRE(tp.ok());
  return static_cast<double>(tp.scalar(loss));
}
}  // namespace

TEST_CASE("the layers record on f32 tapes and agree with f64 to f32 precision") {
  const double f64 = small_stack_loss<double>(15), f32 = small_stack_loss<float>(15);
  CHECK(f32 == doctest::Approx(f64).epsilon(1e-5));
  CHECK(f32 != f64);  // really computed in float
}

// ----------------------------------------------------- the Qwen2 block --

namespace {

const std::vector<std::string> modules = {"q", "k", "v", "o", "gate", "up", "down"};

// Everything a block needs, by the names qwen_block.py writes.
struct BlockSpec {
  std::size_t t, d, n_heads, n_kv, hd, ffn, vocab, rank;
  double eps, scale, base;
  std::map<std::string, Tensor<double>> tensors;
  std::vector<std::size_t> tokens;

  // a_q, b_q, a_k, b_k, ...: the 14 adapter tensors in a fixed order.
  std::vector<Tensor<double>> adapters() const {
    std::vector<Tensor<double>> out;
    for (const auto& m : modules)
      for (const char* s : {"a_", "b_"}) out.push_back(tensors.at(s + m));
    return out;
  }
};

BlockSpec spec_from(const std::map<std::string, Tensor<double>>& g) {
  BlockSpec s;
  const auto& z = g.at("sizes");
  s.t = static_cast<std::size_t>(z[0]);
  s.d = static_cast<std::size_t>(z[1]);
  s.n_heads = static_cast<std::size_t>(z[2]);
  s.n_kv = static_cast<std::size_t>(z[3]);
  s.hd = static_cast<std::size_t>(z[4]);
  s.ffn = static_cast<std::size_t>(z[5]);
  s.vocab = static_cast<std::size_t>(z[6]);
  s.rank = static_cast<std::size_t>(z[7]);
  s.eps = g.at("scalars")[0];
  s.scale = g.at("scalars")[1];
  s.base = g.at("scalars")[2];
  s.tensors = g;
  for (double tok : g.at("tokens").data()) s.tokens.push_back(static_cast<std::size_t>(tok));
  return s;
}

// A block at the oracle's sizes from our own generator (for the tests that
// need no oracle): small-scale weights keep the initial loss near ln(vocab).
BlockSpec random_spec(std::uint64_t seed, bool peft_init) {
  BlockSpec s{6, 16, 4, 2, 4, 24, 11, 2, 1e-6, 2.0, 10000.0, {}, {}};
  Rng rng(seed);
  auto uniform = [&](Shape shape, double scale) { return random_tensor<double>(std::move(shape), rng, -scale, scale); };
  const std::map<std::string, std::pair<std::size_t, std::size_t>> dims = {
      {"q", {s.d, s.n_heads * s.hd}}, {"k", {s.d, s.n_kv * s.hd}}, {"v", {s.d, s.n_kv * s.hd}},
      {"o", {s.n_heads * s.hd, s.d}}, {"gate", {s.d, s.ffn}},      {"up", {s.d, s.ffn}},
      {"down", {s.ffn, s.d}}};
  for (std::size_t i = 0; i < s.t; ++i) s.tokens.push_back(rng.next() % s.vocab);
  s.tensors["x"] = uniform({s.t, s.d}, 1.0);
  for (const char* n : {"norm_in", "norm_post"}) s.tensors[n] = random_tensor<double>({s.d}, rng, 0.9, 1.1);
  for (const auto& [m, io] : dims) {
    const double fan = 1.7 / std::sqrt(static_cast<double>(io.first));
    s.tensors["w_" + m] = uniform({io.first, io.second}, fan);
    s.tensors["a_" + m] = uniform({io.first, s.rank}, fan);
    s.tensors["b_" + m] = peft_init ? Tensor<double>({s.rank, io.second}) : uniform({s.rank, io.second}, 0.2);
  }
  for (const char* m : {"q", "k", "v"}) s.tensors[std::string("bias_") + m] = uniform({dims.at(m).second}, 0.1);
  s.tensors["w_vocab"] = uniform({s.d, s.vocab}, 0.3 / std::sqrt(static_cast<double>(s.d)));
  return s;
}

// Records the block on tp. `adapters` holds the 14 adapter Vars in
// BlockSpec::adapters() order; with no adapters the block is the base model
// (plain linear layers). With base_as_params every base tensor is a
// parameter too (for comparing gradient memory).
Var<double> record_block(Tape<double>& tp, const BlockSpec& s, const std::vector<Var<double>>& adapters,
                         bool base_as_params = false) {
  auto in = [&](const std::string& name) {
    return base_as_params ? tp.param(s.tensors.at(name)) : tp.constant(s.tensors.at(name));
  };
  auto proj = [&](Var<double> x, const std::string& m) {
    const Var<double> w = in("w_" + m);
    if (adapters.empty()) return nn::linear(x, w);
    const std::size_t k = 2 * static_cast<std::size_t>(std::find(modules.begin(), modules.end(), m) - modules.begin());
    return nn::lora_linear(x, w, adapters[k], adapters[k + 1], s.scale);
  };
  const auto tables = nn::rope_tables(s.t, s.hd, s.base);
  Var<double> x = in("x");
  Var<double> h = nn::rmsnorm(x, in("norm_in"), s.eps);
  Var<double> q = proj(h, "q") + in("bias_q"), k = proj(h, "k") + in("bias_k"), v = proj(h, "v") + in("bias_v");
  Var<double> ctx = nn::gqa_attention(q, k, v, tp.constant(tables.cos), tp.constant(tables.sin),
                                      tp.constant(nn::causal_mask<double>(s.t)), s.n_heads, s.n_kv, s.hd);
  Var<double> x2 = x + proj(ctx, "o");
  Var<double> h2 = nn::rmsnorm(x2, in("norm_post"), s.eps);
  Var<double> x3 = x2 + proj(nn::swiglu(proj(h2, "gate"), proj(h2, "up")), "down");
  Var<double> logits = nn::linear(x3, in("w_vocab"));
  const std::vector<std::size_t> next(s.tokens.begin() + 1, s.tokens.end());
  return nn::cross_entropy_rows(logits, tp.constant(onehot_rows(next, s.vocab)), s.t - 1);
}

std::vector<Var<double>> params_of(Tape<double>& tp, const std::vector<Tensor<double>>& tensors) {
  std::vector<Var<double>> out;
  for (const auto& t : tensors) out.push_back(tp.param(t));
  return out;
}

// max |a - b| / max |b| over one tensor.
double normwise_error(View<double> a, const Tensor<double>& b) {
  double diff = 0, scale = 0;
  for (std::size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

void check_against_oracle(const std::map<std::string, Tensor<double>>& golden) {
  const BlockSpec s = spec_from(golden);
  const auto tables = nn::rope_tables(s.t, s.hd, s.base);
  for (std::size_t i = 0; i < tables.cos.size(); ++i) {
    CHECK(std::abs(tables.cos[i] - golden.at("rope_cos")[i]) <= 1e-15);
    CHECK(std::abs(tables.sin[i] - golden.at("rope_sin")[i]) <= 1e-15);
  }
  Tape<double> tp;
  const auto adapters = params_of(tp, s.adapters());
  const Var<double> loss = record_block(tp, s, adapters);
  REQUIRE(tp.backward(loss));
  const double expected = golden.at("loss")[0];
  CHECK(std::abs(tp.scalar(loss) - expected) / expected <= 1e-14);
  std::size_t k = 0;
  for (const auto& m : modules)
    for (const char* side : {"a_", "b_"}) {
      CAPTURE(side + m);
      CHECK(normwise_error(tp.grad(adapters[k++]), golden.at("grad_" + (side + m))) <= 1e-11);
    }
}

}  // namespace

TEST_CASE("the block: central differences through all 14 LoRA adapters (worst relative error <= 1e-6)") {
  const BlockSpec s = random_spec(11, false);
  const FdResult r = check_gradients<double>(
      s.adapters(), [&](Tp tp, V v) { return record_block(tp, s, v); }, 1e-6);
  CAPTURE(r.where);
  CAPTURE(r.error);
  CHECK(r.worst <= 1e-6);
}

TEST_CASE("the block: PEFT initialisation (B = 0) is the base model bitwise, dL/dA exactly zero, dL/dB not") {
  const BlockSpec s = random_spec(12, true);
  Tape<double> tp;
  const auto adapters = params_of(tp, s.adapters());
  const Var<double> loss = record_block(tp, s, adapters);
  REQUIRE(tp.backward(loss));
  Tape<double> base;
  CHECK(tp.scalar(loss) == base.scalar(record_block(base, s, {})));
  for (std::size_t k = 0; k < adapters.size(); k += 2) {
    CAPTURE(modules[k / 2]);
    const View<double> ga = tp.grad(adapters[k]), gb = tp.grad(adapters[k + 1]);
    const std::vector<double> zeros(ga.size(), 0.0);
    CHECK(tp.has_grad(adapters[k]));
    CHECK(bitwise_equal(ga.data, std::span<const double>(zeros)));
    CHECK(std::any_of(gb.begin(), gb.end(), [](double g) { return std::abs(g) > 1e-8; }));
  }
}

TEST_CASE("the block matches PyTorch float64 (checked-in golden): loss <= 1e-14, adapter gradients <= 1e-11 relative") {
  check_against_oracle(load_golden(oracle_dir() + "/qwen_block_golden.txt"));
}


TEST_CASE("the block matches PyTorch float64 run live now" * doctest::skip(!torch_available())) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("grad_nn_oracle_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string fresh = (dir / "qwen_block_golden.txt").string();
  const std::string command = python() + " -B '" + oracle_dir() + "/qwen_block.py' '" + fresh + "'";
  REQUIRE(std::system(command.c_str()) == 0);
  const auto live = load_golden(fresh);
  std::filesystem::remove_all(dir);
  check_against_oracle(live);  // from the live run's own inputs, whatever its torch RNG drew
}

TEST_CASE("the block: the frozen base holds no gradient buffers") {
  const BlockSpec s = random_spec(13, false);
  Tape<double> frozen;
  const auto adapters = params_of(frozen, s.adapters());
  REQUIRE(frozen.backward(record_block(frozen, s, adapters)));

  // Independently of the tape's flag: a node needs a gradient exactly when it
  // is an adapter or one of its inputs needs one.
  const auto nodes = frozen.nodes();
  std::vector<bool> needs(nodes.size(), false);
  std::size_t expected = 0, all_values = 0;
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    const Node<double>& n = nodes[i];
    bool is_adapter = false;
    for (const auto& a : adapters) is_adapter = is_adapter || a.index() == i;
    needs[i] = is_adapter || (n.a != no_node && needs[n.a]) || (n.b != no_node && needs[n.b]);
    if (needs[i]) expected += n.dims.size() * sizeof(double);
    all_values += n.dims.size() * sizeof(double);
    if (n.op == op_code<Const>) CHECK(n.grad == nullptr);
  }
  CHECK(frozen.grad_bytes() == expected);
  CHECK(frozen.grad_bytes() < all_values);

  // The same block with every base tensor a parameter: gradients everywhere,
  // and the adapters' gradients unchanged bit for bit.
  Tape<double> full;
  const auto adapters_full = params_of(full, s.adapters());
  REQUIRE(full.backward(record_block(full, s, adapters_full, true)));
  std::size_t base_bytes = 0;
  for (const char* n : {"x", "norm_in", "norm_post", "w_q", "w_k", "w_v", "w_o", "w_gate", "w_up", "w_down", "bias_q",
                        "bias_k", "bias_v", "w_vocab"})
    base_bytes += s.tensors.at(n).size() * sizeof(double);
  CHECK(full.grad_bytes() >= frozen.grad_bytes() + base_bytes);
  for (std::size_t k = 0; k < adapters.size(); ++k)
    CHECK(bitwise_equal(frozen.grad(adapters[k]).data, full.grad(adapters_full[k]).data));
}

TEST_CASE("the block: 60 Adam steps on the adapters drive next-token cross-entropy from about ln V to well below 1") {
  const BlockSpec s = random_spec(14, true);
  Tape<double> tp;
  const auto adapters = params_of(tp, s.adapters());
  Adam opt(0.02);
  for (const auto& a : adapters) opt.add(a);
  const auto episode = tp.mark();
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    const Var<double> loss = record_block(tp, s, adapters);
    REQUIRE(tp.backward(loss));
    (step == 0 ? first : last) = tp.scalar(loss);
    opt.step();
    tp.reset_to(episode);
  }
  CHECK(std::abs(first - std::log(static_cast<double>(s.vocab))) < 0.3);
  CHECK(last < 0.1);
  CHECK(tp.ok());
}

// ------------------------------------------------------------ bad input --

namespace {
// The tape is poisoned by `layer`, the message names the shapes, and later
// ops return at once.
void check_poisoned(Tape<double>& tp, const std::string& layer, std::initializer_list<std::string> mentions) {
  CAPTURE(tp.error());
  CHECK(!tp.ok());
  CHECK(tp.error().rfind("grad: " + layer + ":", 0) == 0);
  for (const auto& m : mentions) CHECK(tp.error().find(m) != std::string::npos);
  const std::size_t before = tp.size();
  auto c = tp.constant(Tensor<double>::ones({2, 2}));
  CHECK(!nn::silu(c + c).valid());
  CHECK(tp.size() == before);
}
}  // namespace

TEST_CASE("bad input: gqa_attention with heads that do not divide") {
  Tape<double> tp;
  auto q = tp.constant(Tensor<double>({4, 12})), kv = tp.constant(Tensor<double>({4, 6}));
  const auto tables = nn::rope_tables<double>(4, 2, 10000.0);
  nn::gqa_attention(q, kv, kv, tp.constant(tables.cos), tp.constant(tables.sin),
                    tp.constant(nn::causal_mask<double>(4)), 6, 4, 2);
  check_poisoned(tp, "nn::gqa_attention", {"n_heads 6", "n_kv_heads 4", "dividing"});
}

TEST_CASE("bad input: gqa_attention with projections of the wrong width") {
  Tape<double> tp;
  auto q = tp.constant(Tensor<double>({4, 8})), kv = tp.constant(Tensor<double>({4, 6}));
  const auto tables = nn::rope_tables<double>(4, 2, 10000.0);
  nn::gqa_attention(q, kv, kv, tp.constant(tables.cos), tp.constant(tables.sin),
                    tp.constant(nn::causal_mask<double>(4)), 4, 2, 2);
  check_poisoned(tp, "nn::gqa_attention", {"q [4, 8]", "k [4, 6]", "expected q [t, 8], k and v [t, 4]"});
}

TEST_CASE("bad input: causal_attention_probs and attention_context with operands that do not fit") {
  auto poisoned = [](const char* op, std::initializer_list<std::string> mentions, auto record) {
    Tape<double> tp;
    record(tp);
    check_poisoned(tp, op, mentions);
  };
  auto c = [](Tape<double>& tp, Shape s) { return tp.constant(Tensor<double>(std::move(s))); };
  poisoned("causal_attention_probs", {"rank-3", "q [6, 4]", "k [1, 3, 4]"},
           [&](Tape<double>& tp) { causal_attention_probs(c(tp, {6, 4}), c(tp, {1, 3, 4}), 1.0); });
  poisoned("causal_attention_probs", {"head width", "q [1, 6, 4]", "k [1, 3, 2]"},
           [&](Tape<double>& tp) { causal_attention_probs(c(tp, {1, 6, 4}), c(tp, {1, 3, 2}), 1.0); });
  poisoned("causal_attention_probs", {"whole number G", "q [1, 7, 4]", "k [1, 3, 4]"},
           [&](Tape<double>& tp) { causal_attention_probs(c(tp, {1, 7, 4}), c(tp, {1, 3, 4}), 1.0); });
  poisoned("causal_attention_probs", {"leading size N", "q [2, 6, 4]", "k [1, 3, 4]"},
           [&](Tape<double>& tp) { causal_attention_probs(c(tp, {2, 6, 4}), c(tp, {1, 3, 4}), 1.0); });
  poisoned("attention_context", {"p [N, G*t, t]", "p [1, 6, 2]", "v [1, 3, 4]"},
           [&](Tape<double>& tp) { attention_context(c(tp, {1, 6, 2}), c(tp, {1, 3, 4})); });
  poisoned("attention_context", {"whole number G", "p [1, 5, 3]", "v [1, 3, 4]"},
           [&](Tape<double>& tp) { attention_context(c(tp, {1, 5, 3}), c(tp, {1, 3, 4})); });
}

TEST_CASE("bad input: heads_major, rows_major and rope_heads_major with shapes that do not fit") {
  auto poisoned = [](const char* op, std::initializer_list<std::string> mentions, auto record) {
    Tape<double> tp;
    record(tp);
    check_poisoned(tp, op, mentions);
  };
  auto c = [](Tape<double>& tp, Shape s) { return tp.constant(Tensor<double>(std::move(s))); };
  poisoned("heads_major", {"rows [6, 4]", "batch 4", "3 heads", "expected [batch*t, heads*head_dim]"},
           [&](Tape<double>& tp) { heads_major(c(tp, {6, 4}), 4, 3); });
  poisoned("heads_major", {"rows [2, 3, 4]", "batch 1", "expected [batch*t, heads*head_dim]"},
           [&](Tape<double>& tp) { heads_major(c(tp, {2, 3, 4}), 1, 1); });
  poisoned("heads_major", {"rows [6, 4]", "batch 0"}, [&](Tape<double>& tp) { heads_major(c(tp, {6, 4}), 0, 1); });
  poisoned("rows_major", {"heads-major [5, 3, 4]", "batch 2", "expected [batch*heads, t, head_dim]"},
           [&](Tape<double>& tp) { rows_major(c(tp, {5, 3, 4}), 2); });
  poisoned("rows_major", {"heads-major [6, 4]", "batch 1"}, [&](Tape<double>& tp) { rows_major(c(tp, {6, 4}), 1); });
  poisoned("rope_heads_major", {"rows [6, 12]", "table [3, 3, 6]", "expected a table [2, t, head_dim]"},
           [&](Tape<double>& tp) { rope_heads_major(c(tp, {6, 12}), c(tp, {3, 3, 6})); });
  poisoned("rope_heads_major", {"rows [6, 10]", "table [2, 3, 5]", "even head_dim"},
           [&](Tape<double>& tp) { rope_heads_major(c(tp, {6, 10}), c(tp, {2, 3, 5})); });
  poisoned("rope_heads_major", {"rows [5, 12]", "table [2, 3, 6]", "expected rows [batch*3, heads*6]"},
           [&](Tape<double>& tp) { rope_heads_major(c(tp, {5, 12}), c(tp, {2, 3, 6})); });
  poisoned("rope_heads_major", {"rows [6, 8]", "table [2, 3, 6]", "expected rows [batch*3, heads*6]"},
           [&](Tape<double>& tp) { rope_heads_major(c(tp, {6, 8}), c(tp, {2, 3, 6})); });
}

TEST_CASE("bad input: attention with heads that do not divide, rows that are not whole sequences, or bad RoPE") {
  Tape<double> tp;
  auto q = tp.constant(Tensor<double>({4, 12})), kv = tp.constant(Tensor<double>({4, 6}));
  nn::attention(q, kv, kv, 1, 6, 4);
  check_poisoned(tp, "nn::attention", {"heads 6", "kv_heads 4", "dividing"});
  Tape<double> rows;
  auto q2 = rows.constant(Tensor<double>({5, 8})), kv2 = rows.constant(Tensor<double>({5, 4}));
  nn::attention(q2, kv2, kv2, 2, 4, 2);
  check_poisoned(rows, "nn::attention", {"q [5, 8]", "batch 2", "expected q [batch*t, heads*head_dim]"});
  Tape<double> width;
  auto q3 = width.constant(Tensor<double>({4, 8})), k3 = width.constant(Tensor<double>({4, 6}));
  nn::attention(q3, k3, k3, 1, 4, 2);
  check_poisoned(width, "nn::attention", {"k [4, 6]", "k and v [batch*t, kv_heads*head_dim]"});
  Tape<double> rope;
  const auto tables = nn::rope_tables<double>(3, 2, 10000.0);
  auto q4 = rope.constant(Tensor<double>({4, 8})), kv4 = rope.constant(Tensor<double>({4, 4}));
  nn::attention(q4, kv4, kv4, 1, 4, 2, rope.constant(tables.cos), rope.constant(tables.sin));
  check_poisoned(rope, "nn::attention", {"cos [3, 2]", "expected an even head_dim and cos and sin [4, 2]"});
}

TEST_CASE("bad input: rope on an odd head dimension") {
  Tape<double> tp;
  auto h = tp.constant(Tensor<double>({4, 3}));
  nn::rope(h, h, h);
  check_poisoned(tp, "nn::rope", {"head [4, 3]", "even head_dim"});
}

TEST_CASE("bad input: rope_tables for an odd head dimension throws") {
  CHECK_THROWS_WITH_AS(nn::rope_tables<double>(4, 5, 10000.0),
                       doctest::Contains("nn::rope_tables: t 4, head_dim 5: expected t >= 1 and an even head_dim"),
                       std::invalid_argument);
}

TEST_CASE("bad input: gqa_attention with an odd head dimension") {
  Tape<double> tp;
  auto x = tp.constant(Tensor<double>({4, 6}));
  nn::gqa_attention(x, x, x, x, x, x, 2, 2, 3);
  check_poisoned(tp, "nn::gqa_attention", {"head_dim 3", "even"});
}

TEST_CASE("bad input: lora_linear with mismatched adapter ranks") {
  Tape<double> tp;
  auto x = tp.constant(Tensor<double>({2, 4}));
  nn::lora_linear(x, tp.constant(Tensor<double>({4, 5})), tp.constant(Tensor<double>({4, 2})),
                  tp.constant(Tensor<double>({3, 5})), 1.0);
  check_poisoned(tp, "nn::lora_linear", {"A [4, 2]", "B [3, 5]", "mismatched adapter ranks"});
}

TEST_CASE("bad input: lora_linear with adapters that do not fit w0") {
  Tape<double> tp;
  auto x = tp.constant(Tensor<double>({2, 4}));
  nn::lora_linear(x, tp.constant(Tensor<double>({4, 5})), tp.constant(Tensor<double>({4, 2})),
                  tp.constant(Tensor<double>({2, 6})), 1.0);
  check_poisoned(tp, "nn::lora_linear", {"w0 [4, 5]", "B [2, 6]", "expected A [4, r] and B [r, 5]"});
}

TEST_CASE("bad input: cross_entropy with a one-hot of the wrong width") {
  Tape<double> tp;
  nn::cross_entropy(tp.constant(Tensor<double>({3, 5})), tp.constant(onehot_rows({0, 1, 2}, 4)));
  check_poisoned(tp, "nn::cross_entropy_onehot", {"logits [3, 5]", "targets [3, 4]"});
}

TEST_CASE("bad input: cross_entropy_rows with a one-hot of the wrong width") {
  Tape<double> tp;
  nn::cross_entropy_rows(tp.constant(Tensor<double>({3, 5})), tp.constant(onehot_rows({0, 1}, 4)), 2);
  check_poisoned(tp, "nn::cross_entropy_rows", {"logits [3, 5]", "targets [2, 4]", "same width"});
}

TEST_CASE("bad input: cross_entropy with targets that are not one-hot") {
  Tape<double> tp;
  Tensor<double> soft = onehot_rows({0, 1}, 3);
  soft[3] = 0.5;  // row 1: 0.5 1 0
  nn::cross_entropy(tp.constant(Tensor<double>({2, 3})), tp.constant(soft));
  check_poisoned(tp, "nn::cross_entropy_onehot", {"row 1", "not one-hot"});
}

TEST_CASE("bad input: cross_entropy_rows keeping more rows than there are") {
  Tape<double> tp;
  nn::cross_entropy_rows(tp.constant(Tensor<double>({3, 4})), tp.constant(onehot_rows({0, 1, 2}, 4)), 4);
  check_poisoned(tp, "nn::cross_entropy_rows", {"keep 4", "logits [3, 4]", "1 <= keep <= the rows"});
}

TEST_CASE("bad input: linear and linear_bias with inner sizes that differ") {
  Tape<double> tp;
  nn::linear(tp.constant(Tensor<double>({2, 3})), tp.constant(Tensor<double>({4, 5})));
  check_poisoned(tp, "nn::linear", {"x [2, 3]", "weight [4, 5]"});
  Tape<double> tb;
  nn::linear_bias(tb.constant(Tensor<double>({2, 3})), tb.constant(Tensor<double>({3, 5})),
                  tb.constant(Tensor<double>({4})));
  check_poisoned(tb, "nn::linear_bias", {"bias [4]", "bias [out]"});
}

TEST_CASE("bad input: rmsnorm and layernorm with a weight of the wrong size") {
  Tape<double> tp;
  nn::rmsnorm(tp.constant(Tensor<double>({2, 3})), tp.constant(Tensor<double>({4})), 1e-6);
  check_poisoned(tp, "nn::rmsnorm", {"x [2, 3]", "weight [4]", "weight [cols]"});
  Tape<double> tl;
  nn::layernorm(tl.constant(Tensor<double>({2, 3})), tl.constant(Tensor<double>({3})), tl.constant(Tensor<double>({2})),
                1e-5);
  check_poisoned(tl, "nn::layernorm", {"bias [2]", "bias [cols]"});
}

TEST_CASE("bad input: matmul_nt and rms_norm name the op, the shapes and what they expect") {
  Tape<double> tp;
  matmul_nt(tp.constant(Tensor<double>({2, 3})), tp.constant(Tensor<double>({4, 2})));
  check_poisoned(tp, "matmul_nt", {"[2, 3] x [4, 2]", "expected [..., m, k] x [n, k]"});
  Tape<double> tv;
  matmul_nt(tv.constant(Tensor<double>({3})), tv.constant(Tensor<double>({4, 3})));
  check_poisoned(tv, "matmul_nt", {"[3] x [4, 3]"});
  Tape<double> tb;
  matmul_nt(tb.constant(Tensor<double>({2, 3})), tb.constant(Tensor<double>({1, 4, 3})));
  check_poisoned(tb, "matmul_nt", {"[2, 3] x [1, 4, 3]"});
  Tape<double> tr;
  rms_norm(tr.constant(Tensor<double>({2, 3})), tr.constant(Tensor<double>({2})), 1e-6);
  check_poisoned(tr, "rms_norm", {"x [2, 3]", "weight [2]", "weight [cols]"});
  Tape<double> tw;
  rms_norm(tw.constant(Tensor<double>({2, 3})), tw.constant(Tensor<double>({1, 3})), 1e-6);
  check_poisoned(tw, "rms_norm", {"weight [1, 3]"});
}

TEST_CASE("bad input: swiglu with gate and up of different shapes") {
  Tape<double> tp;
  nn::swiglu(tp.constant(Tensor<double>({2, 3})), tp.constant(Tensor<double>({2, 4})));
  check_poisoned(tp, "nn::swiglu", {"gate [2, 3]", "up [2, 4]"});
}

TEST_CASE("bad input: head index past the last head") {
  Tape<double> tp;
  nn::head(tp.constant(Tensor<double>({2, 8})), 2, 4);
  check_poisoned(tp, "nn::head", {"head 2", "[2, 8]", "index < n"});
}

TEST_CASE("bad input: causal_mask of no positions throws") {
  CHECK_THROWS_AS(nn::causal_mask<double>(0), std::invalid_argument);
}
