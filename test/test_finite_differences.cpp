// Every op's backward against central differences, driven by one table.
// The table must touch every op in OpList: the coverage case checks the op
// codes actually recorded, so a new op without a case fails here.
#include <doctest/doctest.h>

#include <set>

#include "support.hpp"

using namespace grad;
using namespace grad::testing;

namespace {

template <class T>
struct FdCase {
  std::string name;
  std::vector<Tensor<T>> params;
  Builder<T> build;
};

template <class T>
std::vector<FdCase<T>> fd_table() {
  Rng rng(42);
  auto r = [&](Shape s) { return random_tensor<T>(std::move(s), rng); };
  auto nz = [&](Shape s) { return away_from_zero<T>(std::move(s), rng); };
  auto pos = [&](Shape s) { return random_tensor<T>(std::move(s), rng, 0.5, 2.0); };
  using V = const std::vector<Var<T>>&;
  using Tp = Tape<T>&;
  std::vector<FdCase<T>> t;
  auto add = [&](std::string name, std::vector<Tensor<T>> params, Builder<T> build) {
    t.push_back({std::move(name), std::move(params), std::move(build)});
  };
  // binary, same shapes and broadcast both ways
  add("add", {r({2, 3}), r({2, 3})}, [](Tp, V v) { return weighted_sum(v[0] + v[1]); });
  add("add row broadcast", {r({4, 3}), r({3})}, [](Tp, V v) { return weighted_sum(v[0] + v[1]); });
  add("add both broadcast", {r({2, 1}), r({1, 3})}, [](Tp, V v) { return weighted_sum(v[0] + v[1]); });
  add("sub rank-3 broadcast", {r({2, 1, 3}), r({4, 1})}, [](Tp, V v) { return weighted_sum(v[0] - v[1]); });
  add("mul column broadcast", {r({3, 4}), r({3, 1})}, [](Tp, V v) { return weighted_sum(v[0] * v[1]); });
  add("mul scalar-shaped", {r({3, 4}), r({1})}, [](Tp, V v) { return weighted_sum(v[1] * v[0]); });
  add("div broadcast", {r({2, 3}), nz({3})}, [](Tp, V v) { return weighted_sum(v[0] / v[1]); });
  add("div broadcast numerator", {r({3}), nz({2, 3})}, [](Tp, V v) { return weighted_sum(v[0] / v[1]); });
  add("neg", {r({5})}, [](Tp, V v) { return weighted_sum(-v[0]); });
  // scalar forms on both sides
  add("scalar add/sub", {r({2, 2})}, [](Tp, V v) { return weighted_sum((v[0] + T(0.5)) - T(2) + (T(1.5) + v[0])); });
  add("scalar sub from", {r({2, 2})}, [](Tp, V v) { return weighted_sum(T(3) - v[0]); });
  add("scalar mul", {r({2, 2})}, [](Tp, V v) { return weighted_sum(v[0] * T(1.7) + T(-0.3) * v[0]); });
  add("scalar div", {r({2, 2})}, [](Tp, V v) { return weighted_sum(v[0] / T(3)); });
  add("scalar div by", {nz({2, 2})}, [](Tp, V v) { return weighted_sum(T(2) / v[0]); });
  // pointwise
  add("relu", {nz({3, 3})}, [](Tp, V v) { return weighted_sum(relu(v[0])); });
  add("sigmoid", {r({3, 3})}, [](Tp, V v) { return weighted_sum(sigmoid(v[0])); });
  add("tanh", {r({3, 3})}, [](Tp, V v) { return weighted_sum(grad::tanh(v[0])); });
  add("exp", {r({3, 3})}, [](Tp, V v) { return weighted_sum(grad::exp(v[0])); });
  add("log", {pos({3, 3})}, [](Tp, V v) { return weighted_sum(grad::log(v[0])); });
  add("sqrt", {pos({3, 3})}, [](Tp, V v) { return weighted_sum(grad::sqrt(v[0])); });
  // reductions
  add("sum", {r({3, 4})}, [](Tp, V v) { return sum(v[0] * v[0]); });
  add("mean", {r({3, 4})}, [](Tp, V v) { return mean(grad::tanh(v[0])); });
  add("mse", {r({3, 4}), r({3, 4})}, [](Tp, V v) { return mse(v[0], v[1]); });
  add("row_sum", {r({3, 4})}, [](Tp, V v) { return weighted_sum(row_sum(v[0])); });
  add("row_sum rank 3", {r({2, 3, 4})}, [](Tp, V v) { return weighted_sum(row_sum(v[0] * v[0])); });
  // linear algebra
  add("matmul", {r({3, 4}), r({4, 5})}, [](Tp, V v) { return weighted_sum(matmul(v[0], v[1])); });
  add("bmm", {r({2, 3, 4}), r({2, 4, 2})}, [](Tp, V v) { return weighted_sum(bmm(v[0], v[1])); });
  add("transpose", {r({3, 4})}, [](Tp, V v) { return weighted_sum(transpose(v[0])); });
  add("transpose rank 3", {r({2, 3, 4})}, [](Tp, V v) { return weighted_sum(transpose(v[0])); });
  // layout
  add("reshape", {r({2, 6})}, [](Tp, V v) { return weighted_sum(reshape(v[0], {3, 2, 2})); });
  add("slice", {r({4, 5})}, [](Tp, V v) { return weighted_sum(slice(v[0], {1, 0}, {3, 4})); });
  add("slice rank 3", {r({3, 4, 5})}, [](Tp, V v) { return weighted_sum(slice(v[0], {1, 1, 2}, {3, 4, 5})); });
  add("concat axis 0", {r({2, 3}), r({1, 3})}, [](Tp, V v) { return weighted_sum(concat(v[0], v[1], 0)); });
  add("concat axis -1", {r({2, 3}), r({2, 2})}, [](Tp, V v) { return weighted_sum(concat(v[0], v[1], -1)); });
  add("concat middle axis", {r({2, 1, 3}), r({2, 2, 3})}, [](Tp, V v) { return weighted_sum(concat(v[0], v[1], 1)); });
  add("softmax last axis", {r({3, 4})}, [](Tp, V v) { return weighted_sum(softmax(v[0], -1)); });
  add("softmax axis 0", {r({3, 4})}, [](Tp, V v) { return weighted_sum(softmax(v[0], 0)); });
  add("softmax middle axis", {r({2, 3, 4})}, [](Tp, V v) { return weighted_sum(softmax(v[0], 1)); });
  // fan-out: one value used several times sums its gradients
  add("fan-out x*x", {r({2, 3})}, [](Tp, V v) { return weighted_sum(v[0] * v[0]); });
  add("fan-out x+x", {r({2, 3})}, [](Tp, V v) { return weighted_sum(v[0] + v[0]); });
  add("fan-out branches", {r({3, 3}), r({3, 3})}, [](Tp, V v) {
    Var<T> h = grad::tanh(matmul(v[0], v[1]));
    return weighted_sum(h * sigmoid(h) + matmul(h, v[0]) - v[0]);
  });
  add("fan-out through broadcast", {r({3}), r({2, 3})},
      [](Tp, V v) { return weighted_sum(v[0] * v[1] + v[0] + sum(v[0]) * v[1]); });
  add("constant operand gets no gradient", {r({2, 2})}, [](Tp tp, V v) {
    Rng k(7);
    Var<T> c = tp.constant(random_tensor<T>({2, 2}, k));
    return weighted_sum(matmul(c, v[0]) * c);
  });
  return t;
}

template <class T>
void run_table(double h, double tolerance) {
  for (const FdCase<T>& c : fd_table<T>()) {
    CAPTURE(c.name);
    const FdResult res = check_gradients<T>(c.params, c.build, h);
    CAPTURE(res.where);
    CAPTURE(res.error);
    CHECK(res.worst <= tolerance);
  }
}

}  // namespace

TEST_CASE("every op's backward matches central differences at f64 (worst relative error <= 1e-6)") {
  run_table<double>(1e-6, 1e-6);
}

TEST_CASE("f32 tapes pass the same table within f32 precision") { run_table<float>(1e-2, 3e-2); }

TEST_CASE("the table touches every op in OpList") {
  std::set<std::uint8_t> seen;
  for (const FdCase<double>& c : fd_table<double>()) {
    Tape<double> tp;
    std::vector<Var<double>> vars;
    for (const auto& p : c.params) vars.push_back(tp.param(p));
    c.build(tp, vars);
    REQUIRE(tp.ok());
    for (const Node<double>& n : tp.nodes()) seen.insert(n.op);
  }
  boost::mp11::mp_for_each<OpList>([&](auto op) {
    CAPTURE(decltype(op)::name);
    CHECK(seen.count(op_code<decltype(op)>) == 1);
  });
}
