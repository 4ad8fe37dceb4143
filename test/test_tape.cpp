// Tape semantics: copying in, borrowed views, requires-grad propagation,
// mark/reset, repeated backward.
#include <doctest/doctest.h>

#include "support.hpp"

using namespace grad;
using namespace grad::testing;
using T = double;

TEST_CASE("param and constant copy their tensor in") {
  Tensor<T> t({2}, {1, 2});
  Tape<T> tp;
  auto p = tp.param(t);
  t[0] = 99;
  CHECK(tp.value(p)[0] == 1);
  CHECK(tp.requires_grad(p));
  CHECK_FALSE(tp.requires_grad(tp.constant(t)));
}

TEST_CASE("a node with no parameter upstream has no gradient buffer, does no backward work and reads zeros") {
  Tape<T> tp;
  auto w = tp.param(Tensor<T>::full({3, 3}, 0.5));
  auto c = tp.constant(Tensor<T>::full({3, 3}, 2.0));
  const std::size_t param_only = tp.grad_bytes();
  CHECK(param_only == 9 * sizeof(T));
  auto frozen = grad::exp(matmul(c, c));  // constants only: no gradient buffers
  CHECK(tp.grad_bytes() == param_only);
  CHECK_FALSE(tp.requires_grad(frozen));
  auto loss = sum(matmul(frozen, w));
  CHECK(tp.grad_bytes() == param_only + 9 * sizeof(T) + sizeof(T));
  REQUIRE(tp.backward(loss));
  CHECK_FALSE(tp.has_grad(frozen));
  for (T g : tp.grad(frozen)) CHECK(g == 0);
  for (T g : tp.grad(c)) CHECK(g == 0);
  CHECK(tp.grad(frozen).size() == 9);
  CHECK(tp.has_grad(w));
}

TEST_CASE("a parameter the loss does not depend on is not reached by backward") {
  Tape<T> tp;
  auto used = tp.param(Tensor<T>::ones({2})), unused = tp.param(Tensor<T>::ones({2}));
  relu(unused);  // recorded, but not upstream of the loss
  REQUIRE(tp.backward(sum(used * used)));
  CHECK(tp.has_grad(used));
  CHECK_FALSE(tp.has_grad(unused));
  for (T g : tp.grad(unused)) CHECK(g == 0);
}

TEST_CASE("backward twice gives the same gradients, not their sum") {
  Tape<T> tp;
  auto x = tp.param(Tensor<T>({3}, {1, 2, 3}));
  auto loss = sum(x * x);
  REQUIRE(tp.backward(loss));
  REQUIRE(tp.backward(loss));
  CHECK(tp.grad(x)[2] == 6);
}

TEST_CASE("a loss that depends on no parameter has all-zero gradients") {
  Tape<T> tp;
  auto c = tp.constant(Tensor<T>::ones({2}));
  CHECK(tp.backward(sum(c)));
  for (T g : tp.grad(c)) CHECK(g == 0);
}

TEST_CASE("borrowed views stay valid while more nodes are recorded") {
  Tape<T> tp;
  auto x = tp.param(Tensor<T>({2}, {1, 2}));
  const View<T> v = tp.value(x);
  const T* before = v.data.data();
  for (int i = 0; i < 50; ++i) tp.constant(Tensor<T>({1000}));  // forces new arena chunks
  CHECK(tp.value(x).data.data() == before);
  CHECK(v[1] == 2);
}

TEST_CASE("reset_to drops later nodes, keeps earlier ones and their values") {
  Tape<T> tp;
  auto x = tp.param(Tensor<T>({2}, {1, 2}));
  const auto m = tp.mark();
  auto y = x * x;
  REQUIRE(tp.backward(sum(y)));
  tp.reset_to(m);
  CHECK(tp.size() == 1);
  CHECK(tp.value(x)[1] == 2);
  CHECK(tp.value(y).empty());  // y's node is gone
  CHECK_FALSE(tp.has_grad(x));
  CHECK(tp.ok());
}

TEST_CASE("leaf_value writes parameters and constants, not computed nodes") {
  Tape<T> tp;
  auto x = tp.param(Tensor<T>({2}, {1, 2}));
  tp.leaf_value(x)[0] = 5;
  CHECK(tp.value(x)[0] == 5);
  CHECK(tp.leaf_value(x * x).empty());
}

TEST_CASE("a rank-0 tensor is recorded as shape [1]") {
  Tape<T> tp;
  auto s = tp.param(Tensor<T>(Shape{}, {3}));
  CHECK(tp.value(s).shape.size() == 1);
  REQUIRE(tp.backward(s * s));
  CHECK(tp.grad(s)[0] == 6);
}

TEST_CASE("a view copies out into an owning Tensor with the same shape and values") {
  Tape<T> tp;
  auto x = tp.param(Tensor<T>({2, 2}, {1, 2, 3, 4}));
  const Tensor<T> copy = tp.value(x * x).tensor();
  CHECK(copy.shape() == Shape{2, 2});
  CHECK(copy[3] == 16);
}

// A scalar operand of -0.0 keeps its sign on the vector path as in plain C++
// (x / -0 is -inf for x > 0, x * -0 is -0): the packs' broadcast must not
// turn it into +0. 37 elements: whole packs at every width, and a tail.
template <class U>
void scalar_ops_match_plain_cpp() {
  Tape<U> tp;
  Tensor<U> x({37});
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<U>(i % 3 == 0 ? 1.5 + double(i) : -0.25 - double(i));
  x[5] = U(0);
  x[6] = -U(0);
  const Var<U> a = tp.constant(x);
  const U z = -U(0);
  const std::vector<std::pair<const char*, Var<U>>> ops = {{"a / -0", a / z}, {"a * -0", a * z}, {"a + -0", a + z},
                                                           {"a - -0", a - z}, {"-0 - a", z - a}, {"-0 + a", z + a},
                                                           {"-0 * a", z * a}, {"-0 / a", z / a}};
  const std::vector<U (*)(U, U)> plain = {[](U v, U s) { return v / s; }, [](U v, U s) { return v * s; },
                                          [](U v, U s) { return v + s; }, [](U v, U s) { return v - s; },
                                          [](U v, U s) { return s - v; }, [](U v, U s) { return s + v; },
                                          [](U v, U s) { return s * v; }, [](U v, U s) { return s / v; }};
  using Bits = std::conditional_t<sizeof(U) == 8, std::uint64_t, std::uint32_t>;
  auto bits = [](U v) { return std::bit_cast<Bits>(v); };
  REQUIRE(tp.ok());
  for (std::size_t k = 0; k < ops.size(); ++k) {
    const View<U> y = tp.value(ops[k].second);
    for (std::size_t i = 0; i < x.size(); ++i) {
      const U want = plain[k](x[i], z);
      INFO(std::string(ops[k].first), " at ", i, ": x = ", x[i], ", got ", y[i], ", want ", want);
      CHECK(bits(y[i]) == bits(want));
    }
  }
}

TEST_CASE("a scalar of -0.0 keeps its sign on the tape's vector path, as in plain C++ (float and double)") {
  scalar_ops_match_plain_cpp<double>();
  scalar_ops_match_plain_cpp<float>();
}
