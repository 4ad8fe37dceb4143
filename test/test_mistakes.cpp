// The mistakes a PyTorch user makes on first contact (issue 28), each of
// which used to run silently: a loop without reset_to, gradients of two
// backward calls that PyTorch would sum, the mark taken before the model, a
// Var used after reset_to, int64 labels, the three cross-entropies. Each
// must now say so, or (accumulation) have a first-class, deterministic form.
#include <doctest/doctest.h>

#include <array>
#include <cstdint>
#include <grad/dist.hpp>
#include <grad/grad.hpp>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "support.hpp"

using grad::Tensor;
namespace nn = grad::nn;

namespace {

// Collects warnings for the test's lifetime instead of printing them.
struct Warnings {
  std::vector<std::string> said;
  grad::WarningHandler previous;
  Warnings() : previous(grad::set_warning_handler([this](std::string_view m) { said.emplace_back(m); })) {}
  ~Warnings() { grad::set_warning_handler(previous); }
  Warnings(const Warnings&) = delete;
  Warnings& operator=(const Warnings&) = delete;
};

bool contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

// Bit for bit, every parameter's gradient (or any lists of doubles).
bool same_bits(const std::vector<std::vector<double>>& a, const std::vector<std::vector<double>>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (!grad::testing::bitwise_equal<double>(a[i], b[i])) return false;
  return true;
}
bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return grad::testing::bitwise_equal<double>(a, b);
}

// A 3-4-2 tanh layer pair with a mean-square loss over micro-batch k's rows.
struct Net {
  grad::Tape<double>& tp;
  grad::Var<double> w1, b1, w2;
  explicit Net(grad::Tape<double>& t) : tp(t) {
    grad::testing::Rng rng(11);
    w1 = tp.param(grad::testing::random_tensor<double>({3, 4}, rng));
    b1 = tp.param(grad::testing::random_tensor<double>({4}, rng));
    w2 = tp.param(grad::testing::random_tensor<double>({4, 2}, rng));
  }
  grad::Var<double> loss(std::size_t k) const {
    grad::testing::Rng rng(100 + k);
    auto x = tp.constant(grad::testing::random_tensor<double>({5, 3}, rng));
    auto y = tp.constant(grad::testing::random_tensor<double>({5, 2}, rng));
    return grad::mse(grad::matmul(grad::tanh(grad::matmul(x, w1) + b1), w2), y);
  }
  std::vector<std::vector<double>> grads() const {
    std::vector<std::vector<double>> g;
    for (auto p : {w1, b1, w2}) g.emplace_back(tp.grad(p).begin(), tp.grad(p).end());
    return g;
  }
};

}  // namespace

TEST_CASE("a loop without reset_to warns once, naming the fix; a loop with it, or a few episodes, does not") {
  Warnings w;
  {
    grad::Tape<double> tp;
    Net net(tp);
    grad::SGD<double> opt(0.01);
    for (auto p : {net.w1, net.b1, net.w2}) opt.add(p);
    for (std::size_t step = 0; step < 30; ++step) {  // the forgotten reset_to
      REQUIRE(tp.backward(net.loss(step)));
      REQUIRE(opt.step());
    }
    REQUIRE(w.said.size() == 1);
    CAPTURE(w.said[0]);
    CHECK(contains(w.said[0], "with no reset_to"));
    CHECK(contains(w.said[0], "auto m = tp.mark()` after registering the parameters"));
    CHECK(contains(w.said[0], "tp.reset_to(m)"));
    CHECK(contains(w.said[0], "grad::set_warning_handler"));
  }
  w.said.clear();
  {
    grad::Tape<double> tp;
    Net net(tp);
    grad::SGD<double> opt(0.01);
    for (auto p : {net.w1, net.b1, net.w2}) opt.add(p);
    const auto m = tp.mark();
    for (std::size_t step = 0; step < 30; ++step) {
      tp.reset_to(m);
      REQUIRE(tp.backward(net.loss(step)));
      REQUIRE(opt.step());
    }
  }
  {
    grad::Tape<double> tp;  // a few episodes on purpose, not a training loop
    Net net(tp);
    for (std::size_t k = 0; k < grad::growth_warning_runs; ++k) REQUIRE(tp.backward(net.loss(k)));
  }
  CHECK(w.said.empty());
}

TEST_CASE("backward(loss, grad::accumulate) sums micro-batches: the fold of their gradients, bit for bit") {
  constexpr std::size_t k = 3;
  grad::Tape<double> tp;
  Net net(tp);
  grad::Adam<double> opt(0.01);
  for (auto p : {net.w1, net.b1, net.w2}) opt.add(p);
  const auto m = tp.mark();

  // Each micro-batch's own gradient, folded acc = acc + g in order.
  std::vector<std::vector<double>> fold;
  for (std::size_t i = 0; i < k; ++i) {
    tp.reset_to(m, grad::drop_gradients);  // each micro-batch alone, on purpose
    REQUIRE(tp.backward(net.loss(i)));
    const auto g = net.grads();
    if (i == 0) fold = g;
    for (std::size_t p = 0; i > 0 && p < g.size(); ++p)
      for (std::size_t e = 0; e < g[p].size(); ++e) fold[p][e] = fold[p][e] + g[p][e];
  }
  // The gradient of the summed loss, for the rounding-level comparison.
  tp.reset_to(m, grad::drop_gradients);
  REQUIRE(tp.backward(net.loss(0) + net.loss(1) + net.loss(2)));
  const auto of_sum = net.grads();

  tp.reset_to(m, grad::drop_gradients);
  for (std::size_t i = 0; i < k; ++i) {
    REQUIRE(tp.backward(net.loss(i), grad::accumulate));
    tp.reset_to(m, grad::keep_gradients);  // the micro-batch's nodes go, the sums stay
  }
  const auto accumulated = net.grads();
  CHECK(same_bits(accumulated, fold));
  for (std::size_t p = 0; p < of_sum.size(); ++p)
    for (std::size_t e = 0; e < of_sum[p].size(); ++e)
      CHECK(accumulated[p][e] == doctest::Approx(of_sum[p][e]).epsilon(1e-13));

  // dist::LocalShards with Combine::sum runs the same fold: the same bits.
  grad::dist::LocalShards<grad::Adam<double>> shards(opt, {.shards = k, .combine = grad::dist::Combine::sum});
  shards.backward([&](std::size_t s) { return net.loss(s); });
  CHECK(same_bits(net.grads(), fold));

  // A step uses the sum; the next accumulate starts a new one.
  REQUIRE(opt.step());
  tp.reset_to(m, grad::keep_gradients);
  REQUIRE(tp.backward(net.loss(0), grad::accumulate));
  std::vector<std::vector<double>> alone;
  {
    grad::Tape<double> fresh;
    Net again(fresh);
    for (auto [to, from] : {std::pair{again.w1, net.w1}, std::pair{again.b1, net.b1}, std::pair{again.w2, net.w2}})
      std::ranges::copy(tp.value(from), fresh.leaf_value(to).begin());
    REQUIRE(fresh.backward(again.loss(0)));
    alone = again.grads();
  }
  CHECK(same_bits(net.grads(), alone));
}

TEST_CASE("a micro-batch that does not reach a parameter keeps its sum") {
  grad::Tape<double> tp;
  auto a = tp.param(Tensor<double>({2}, {1, 2}));
  auto b = tp.param(Tensor<double>({2}, {3, 4}));
  const auto m = tp.mark();
  REQUIRE(tp.backward(grad::sum(a * b), grad::accumulate));  // da = b, db = a
  tp.reset_to(m, grad::keep_gradients);
  REQUIRE(tp.backward(grad::sum(a * a), grad::accumulate));  // da += 2a; b not reached
  CHECK(std::vector<double>(tp.grad(a).begin(), tp.grad(a).end()) == std::vector<double>{5, 8});
  CHECK(std::vector<double>(tp.grad(b).begin(), tp.grad(b).end()) == std::vector<double>{1, 2});
  tp.reset_to(m);  // a plain reset clears the sums
  CHECK(!tp.has_grad(a));
}

TEST_CASE("the PyTorch habit, backward(a); backward(b); step(), warns once that b replaced a") {
  Warnings w;
  grad::Tape<double> tp;
  Net net(tp);
  REQUIRE(tp.backward(net.loss(0)));
  REQUIRE(tp.backward(net.loss(1)));  // no optimizer yet: several backward calls are a normal thing to do
  CHECK(w.said.empty());
  grad::SGD<double> opt(0.01);
  for (auto p : {net.w1, net.b1, net.w2}) opt.add(p);
  const auto m = tp.mark();
  tp.reset_to(m, grad::drop_gradients);  // drops the unused gradients on purpose
  REQUIRE(tp.backward(net.loss(0)));
  REQUIRE(opt.step());
  tp.reset_to(m);
  REQUIRE(tp.backward(net.loss(1)));  // after a step: fine
  CHECK(w.said.empty());
  REQUIRE(tp.backward(net.loss(2)));  // replaces loss(1)'s unused gradients
  REQUIRE(w.said.size() == 1);
  CHECK(contains(w.said[0], "replaces them"));
  CHECK(contains(w.said[0], "tp.backward(loss, grad::accumulate)"));
  REQUIRE(tp.backward(net.loss(3)));
  CHECK(w.said.size() == 1);  // once per tape
}

TEST_CASE("accumulation with a plain reset_to at the top of each micro-batch warns once, naming keep_gradients") {
  // The loop a PyTorch user writes (reset_to taken for "free the graph"):
  // each plain reset_to empties the gradients, so the step would see the
  // last micro-batch alone. Either backward form says so, once per tape.
  for (const bool accumulate : {true, false}) {
    CAPTURE(accumulate);
    Warnings w;
    grad::Tape<double> tp;
    Net net(tp);
    grad::SGD<double> opt(0.1);
    for (auto p : {net.w1, net.b1, net.w2}) REQUIRE(opt.add(p));
    const auto m = tp.mark();
    for (std::size_t round = 0; round < 2; ++round) {
      for (std::size_t k = 0; k < 3; ++k) {
        tp.reset_to(m);
        REQUIRE((accumulate ? tp.backward(net.loss(k), grad::accumulate) : tp.backward(net.loss(k))));
        if (round == 0 && k == 0) CHECK(w.said.empty());  // nothing was dropped yet
      }
      REQUIRE(opt.step());
    }
    REQUIRE(w.said.size() == 1);
    CHECK(contains(w.said[0], "dropped gradients that no optimizer step used"));
    CHECK(contains(w.said[0], "tp.reset_to(m, grad::keep_gradients)"));
    CHECK(contains(w.said[0], "tp.backward(loss, grad::accumulate)"));
    CHECK(contains(w.said[0], "tp.reset_to(m, grad::drop_gradients)"));
  }
}

TEST_CASE("the README's accumulation loop steps on the sum, silently; drop_gradients and skipped steps are silent") {
  Warnings w;
  constexpr std::size_t k = 3;
  // The sum's step: the micro-batches accumulated without any reset.
  grad::Tape<double> ref_tp;
  Net ref(ref_tp);
  grad::SGD<double> ref_opt(0.1);
  for (auto p : {ref.w1, ref.b1, ref.w2}) REQUIRE(ref_opt.add(p));
  for (std::size_t i = 0; i < k; ++i) REQUIRE(ref_tp.backward(ref.loss(i), grad::accumulate));
  REQUIRE(ref_opt.step());
  std::vector<std::vector<double>> want;
  for (auto p : {ref.w1, ref.b1, ref.w2}) want.emplace_back(ref_tp.value(p).begin(), ref_tp.value(p).end());

  grad::Tape<double> tp;
  Net net(tp);
  grad::SGD<double> opt(0.1);
  for (auto p : {net.w1, net.b1, net.w2}) REQUIRE(opt.add(p));
  const auto m = tp.mark();
  for (std::size_t i = 0; i < k; ++i) {
    tp.reset_to(m, grad::keep_gradients);  // README.md's form: the nodes go, the sums stay
    REQUIRE(tp.backward(net.loss(i), grad::accumulate));
  }
  REQUIRE(opt.step());
  std::vector<std::vector<double>> got;
  for (auto p : {net.w1, net.b1, net.w2}) got.emplace_back(tp.value(p).begin(), tp.value(p).end());
  CHECK(same_bits(got, want));

  // Dropping unused gradients on purpose, and a step that skips a NaN
  // gradient (NonFinite::skip), say nothing either.
  REQUIRE(tp.backward(net.loss(0)));
  tp.reset_to(m, grad::drop_gradients);
  REQUIRE(tp.backward(net.loss(1)));
  REQUIRE(opt.step());
  opt.set_nonfinite(grad::NonFinite::skip);
  tp.reset_to(m);
  REQUIRE(tp.backward(grad::sum(net.w1) * std::numeric_limits<double>::quiet_NaN()));
  CHECK_FALSE(opt.step());
  CHECK(opt.skipped_steps() == 1);
  tp.reset_to(m);
  REQUIRE(tp.backward(net.loss(2)));
  REQUIRE(opt.step());
  CHECK(w.said.empty());
}

TEST_CASE("predict between backward and step keeps the gradients the step uses") {
  grad::Tape<double> tp;
  grad::SplitMix64 gen(5);
  grad::nn::Linear<double> model(tp, 3, 2, gen);
  grad::SGD<double> opt(0.1);
  REQUIRE(nn::add_parameters(opt, model));
  const auto m = tp.mark();
  const Tensor<double> x({2, 3}, {1, 2, 3, -1, 0.5, 2});
  REQUIRE(tp.backward(grad::sum(model(tp.constant(x)))));
  const std::vector<double> g(tp.grad(model.weight).begin(), tp.grad(model.weight).end());
  (void)grad::predict(tp, model, x);
  CHECK(tp.has_grad(model.weight));
  CHECK(std::vector<double>(tp.grad(model.weight).begin(), tp.grad(model.weight).end()) == g);
  tp.reset_to(m);
}

TEST_CASE("a module's parameters are named in the optimizer's messages as the module names them") {
  grad::Tape<double> tp;
  grad::SplitMix64 gen(6);
  nn::Sequential<double> model = nn::mlp<double>(tp, {3, 4, 2}, gen);
  grad::Adam<double> opt(0.01);
  REQUIRE(nn::add_parameters(opt, model));
  CHECK(opt.parameter_name(2) == "parameter 3 '2.weight'");
  // A NaN input reaches every gradient: the first one the step checks is named.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  REQUIRE(tp.backward(grad::sum(model(tp.constant(Tensor<double>({1, 3}, {1, nan, 2}))))));
  CHECK_FALSE(opt.step());
  CHECK(contains(tp.error(), "adam.step: parameter 1 '0.weight' (node 0, shape [3, 4]) has a non-finite gradient"));
  // Added by hand with a name, the same; without one, as before.
  grad::Tape<double> t2;
  grad::SGD<double> sgd(0.1);
  const auto a = t2.param(Tensor<double>({2}, {1, 2}));
  REQUIRE(sgd.add(a, "encoder.bias"));
  CHECK_FALSE(sgd.add(a, 0.0, "again"));
  CHECK(t2.error() == "grad: sgd.add: parameter 2 'again' (node 0) was already added");
}

TEST_CASE("a model built after the mark: the error says to take the mark after registering parameters") {
  SUBCASE("the next forward") {
    grad::Tape<float> tp;
    const auto m = tp.mark();  // too early
    grad::SplitMix64 gen(1);
    nn::Linear<float> layer(tp, 3, 2, gen);
    tp.reset_to(m);
    (void)layer(tp.constant(Tensor<float>({1, 3})));
    CAPTURE(tp.error());
    CHECK(contains(tp.error(), "(node 0, a param [3, 2]) was dropped by reset_to"));
    CHECK(contains(tp.error(), "take the mark after registering parameters"));
  }
  SUBCASE("the optimizer's step") {
    grad::Tape<float> tp;
    const auto m = tp.mark();
    auto w = tp.param(Tensor<float>({2, 2}));
    grad::Adam<float> opt(1e-3f);
    opt.add(w);
    tp.reset_to(m);
    CHECK(!opt.step());
    CAPTURE(tp.error());
    CHECK(contains(tp.error(), "adam.step: parameter 1 (node 0, a param [2, 2]) was dropped by reset_to"));
    CHECK(contains(tp.error(), "take the mark after registering parameters"));
  }
}

TEST_CASE("a Var used after reset_to: the message names its op and shape, and the fix") {
  grad::Tape<double> tp;
  auto w = tp.param(Tensor<double>({3, 2}));
  const auto m = tp.mark();
  auto x = tp.constant(Tensor<double>({4, 3}));
  auto h = grad::matmul(x, w);
  tp.reset_to(m);
  SUBCASE("a constant") {
    (void)grad::matmul(x, w);
    CAPTURE(tp.error());
    CHECK(contains(tp.error(), "matmul: operand 1 (node 1, a constant [4, 3]) was dropped by reset_to"));
    CHECK(contains(tp.error(), "record again after the reset"));
  }
  SUBCASE("an op's output") {
    (void)grad::tanh(h);
    CAPTURE(tp.error());
    CHECK(contains(tp.error(), "tanh: operand 1 (node 2, the output of matmul [4, 2]) was dropped by reset_to"));
  }
}

TEST_CASE(
    "cross_entropy_labels takes any integral labels: int64 as int32, bit for bit; range errors name the class count") {
  auto run = [](auto labels) {
    grad::Tape<double> tp;
    auto logits = tp.param(Tensor<double>({3, 4}, {0.5, -1, 2, 0, 1, 1, -2, 0.25, 3, 0, 0, -1}));
    auto loss = grad::cross_entropy_labels(logits, labels);
    REQUIRE(tp.backward(loss));
    std::vector<double> out{tp.scalar(loss)};
    out.insert(out.end(), tp.grad(logits).begin(), tp.grad(logits).end());
    return out;
  };
  const auto i32 = run(std::vector<std::int32_t>{2, 0, 3});
  CHECK(same_bits(run(std::vector<std::int64_t>{2, 0, 3}), i32));
  CHECK(same_bits(run(std::vector<std::uint8_t>{2, 0, 3}), i32));
  CHECK(same_bits(run(std::array<long, 3>{2, 0, 3}), i32));
  const std::vector<std::int64_t> held{2, 0, 3};
  CHECK(same_bits(run(std::span<const std::int64_t>(held)), i32));
  // The older name is the same function.
  {
    grad::Tape<double> tp;
    auto logits = tp.param(Tensor<double>({3, 4}, {0.5, -1, 2, 0, 1, 1, -2, 0.25, 3, 0, 0, -1}));
    CHECK(tp.scalar(grad::cross_entropy(logits, held)) == i32[0]);
  }

  grad::Tape<float> tp;
  auto logits = tp.param(Tensor<float>({2, 10}));
  CHECK(!grad::cross_entropy_labels(logits, std::vector<std::int64_t>{1, 1'000'000'000'000}).valid());
  CHECK(tp.error() ==
        "grad: cross_entropy_labels: label 1000000000000 in row 1 is out of range: expected a class id in [0, 10) "
        "(the logits [2, 10] have 10 classes)");
  grad::Tape<float> t2;
  (void)grad::cross_entropy_labels(t2.param(Tensor<float>({2, 10})), std::vector<std::int64_t>{-3, 1});
  CHECK(contains(t2.error(), "label -3 in row 0 is out of range"));
  grad::Tape<float> t3;
  (void)grad::cross_entropy_labels(t3.param(Tensor<float>({2, 10})), std::vector<std::uint64_t>{1, ~0ull});
  CHECK(contains(t3.error(), "label 18446744073709551615 in row 1 is out of range"));
}

TEST_CASE("the three cross-entropies by their names agree; the older names still work") {
  grad::Tape<double> tp;
  auto logits = tp.param(Tensor<double>({2, 3}, {0.1, 0.7, -0.4, 1.5, 0.2, 0.3}));
  const double by_labels = tp.scalar(grad::cross_entropy_labels(logits, std::vector<std::int64_t>{1, 0}));
  const double by_ids = tp.scalar(grad::cross_entropy_ids(logits, tp.constant(Tensor<double>({2}, {1, 0}))));
  const double by_onehot =
      tp.scalar(nn::cross_entropy_onehot(logits, tp.constant(Tensor<double>({2, 3}, {0, 1, 0, 1, 0, 0}))));
  CHECK(by_ids == doctest::Approx(by_labels).epsilon(1e-14));
  CHECK(by_onehot == doctest::Approx(by_labels).epsilon(1e-14));
  // cross_entropy_ids leaves out torch's default ignore_index, -100, as torch does.
  const double ignoring = tp.scalar(grad::cross_entropy_ids(logits, tp.constant(Tensor<double>({2}, {1, -100}))));
  CHECK(ignoring ==
        doctest::Approx(tp.scalar(grad::cross_entropy_labels(grad::slice(logits, {0, 0}, {1, 3}), std::vector<int>{1})))
            .epsilon(1e-14));
  CHECK(tp.scalar(grad::cross_entropy(logits, tp.constant(Tensor<double>({2}, {1, 0})), -1.0)) == by_ids);
  CHECK(tp.scalar(nn::cross_entropy(logits, tp.constant(Tensor<double>({2, 3}, {0, 1, 0, 1, 0, 0})))) == by_onehot);
  CHECK(tp.ok());
}

TEST_CASE("Batches takes int64 labels (copied once into class ids); one that does not fit is refused by row") {
  Tensor<double> x({6, 1}, {0, 1, 2, 3, 4, 5});
  const std::vector<std::int32_t> i32{0, 1, 2, 0, 1, 2};
  const std::vector<std::int64_t> i64(i32.begin(), i32.end());
  grad::Batches<double> a(x, i32, {.batch = 4, .seed = 3});
  grad::Batches<double> b(x, i64, {.batch = 4, .seed = 3});
  auto ea = a.epoch(), eb = b.epoch();
  for (auto ia = ea.begin(), ib = eb.begin(); ia != ea.end(); ++ia, ++ib) {
    const std::vector<std::int32_t> la = ia->labels;  // a batch stays valid until the next is read
    CHECK(la == ib->labels);
  }
  CHECK_THROWS_WITH_AS(
      grad::Batches<double>(x, std::vector<std::int64_t>{0, 1, 2, 0, 1, std::int64_t{1} << 40}, {.batch = 2}),
      "Batches: label 1099511627776 in row 5 does not fit a class id: expected 0 <= id <= 2147483647",
      std::invalid_argument);
  CHECK_THROWS_WITH_AS(grad::Batches<double>(x, std::vector<std::int64_t>{0, 1, -2, 0, 1, 2}, {.batch = 2}),
                       "Batches: label -2 in row 2 is negative; expected class ids >= 0", std::invalid_argument);
}

TEST_CASE("grad/grad.hpp is everything header-only: modules, classify, data, csv, model files, lm, print, inspect") {
  // Each line names something from a header grad.hpp did not include before.
  CHECK(sizeof(grad::nn::Linear<float>) > 0);                                     // modules.hpp
  CHECK(sizeof(grad::Batches<float>) > 0);                                        // data.hpp
  CHECK(sizeof(grad::LabeledData<float>) > 0);                                    // csv.hpp
  CHECK(sizeof(grad::EpochMean) > 0);                                             // data.hpp
  CHECK(sizeof(grad::nn::LmConfig) > 0);                                             // lm.hpp
  CHECK(grad::accuracy(std::vector<int>{1, 2}, std::vector<long>{1, 3}) == 0.5);  // classify.hpp
  grad::ModelFileResult (*save)(const std::string&, const grad::nn::Module<float>&) = &grad::save_model<float>;
  CHECK(static_cast<bool>(save));  // model_file.hpp
}
