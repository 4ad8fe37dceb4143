// Tensor math outside the tape (grad/tensor_math.hpp): reductions over an
// axis, standardization with the training data's statistics, broadcasting
// arithmetic, row slices and concatenation, each with the bad input it must
// refuse by name.
#include <doctest/doctest.h>

#include <cmath>
#include <grad/tensor_math.hpp>
#include <string>
#include <vector>

using grad::Tensor;

namespace {

std::vector<double> values(const Tensor<double>& t) { return {t.data().begin(), t.data().end()}; }

// Throws std::invalid_argument whose message contains every one of `words`.
template <class F>
void refuses(F&& f, std::initializer_list<const char*> words) {
  try {
    f();
    FAIL("expected std::invalid_argument");
  } catch (const std::invalid_argument& e) {
    const std::string m = e.what();
    for (const char* w : words) CHECK_MESSAGE(m.find(w) != std::string::npos, m, " lacks: ", w);
  }
}

const Tensor<double> x({3, 2}, {1, 2, 3, 4, 5, 9});

}  // namespace

TEST_CASE("mean and stddev over an axis: torch's values, the axis removed, unbiased by default") {
  CHECK(grad::mean(x, 0).shape() == grad::Shape{2});
  CHECK(values(grad::mean(x, 0)) == std::vector<double>{3, 5});
  CHECK(values(grad::mean(x, -1)) == std::vector<double>{1.5, 3.5, 7});
  // torch.tensor([[1., 2], [3, 4], [5, 9]]).std(0) = [2, sqrt(13)]; unbiased=False: [sqrt(8/3), sqrt(26/3)]
  CHECK(values(grad::stddev(x, 0)) == std::vector<double>{2, std::sqrt(13.0)});
  CHECK(values(grad::stddev(x, 0, false)) == std::vector<double>{std::sqrt(8.0 / 3), std::sqrt(26.0 / 3)});
  const Tensor<double> cube({2, 3, 2}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11});
  CHECK(grad::mean(cube, 1).shape() == grad::Shape{2, 2});
  CHECK(values(grad::mean(cube, 1)) == std::vector<double>{2, 3, 8, 9});

  refuses([] { (void)grad::mean(x, 2); }, {"grad::mean", "axis 2", "[3, 2]", "rank 2"});
  refuses([] { (void)grad::stddev(Tensor<double>({1, 4}), 0); }, {"grad::stddev", "[1, 4]", "at least 2"});
  refuses([] { (void)grad::mean(Tensor<double>({0, 4}), 0); }, {"grad::mean", "empty"});
}

TEST_CASE("standardize: columns to mean 0 and std 1, the same statistics applied to other data") {
  auto [z, scaler] = grad::standardize(x);
  CHECK(values(scaler.mean) == std::vector<double>{3, 5});
  CHECK(values(scaler.std) == std::vector<double>{std::sqrt(8.0 / 3), std::sqrt(26.0 / 3)});  // population, as sklearn
  const Tensor<double> m = grad::mean(z, 0), s = grad::stddev(z, 0, false);
  for (std::size_t c = 0; c < 2; ++c) {
    CHECK(std::abs(m[c]) < 1e-15);
    CHECK(std::abs(s[c] - 1) < 1e-15);
  }
  // Validation data uses the training statistics, not its own.
  const Tensor<double> val({1, 2}, {5, 5});
  CHECK(values(scaler(val)) == std::vector<double>{2 / std::sqrt(8.0 / 3), 0});
  // A constant column is divided by 1, not by 0.
  auto [c, constant] = grad::standardize(Tensor<double>({2, 2}, {7, 1, 7, 3}));
  CHECK(values(constant.std) == std::vector<double>{1, 1});
  CHECK(values(c) == std::vector<double>{0, -1, 0, 1});

  refuses([&] { (void)scaler(Tensor<double>({2, 3})); }, {"Standardizer", "[2, 3]", "expected [rows, 2]"});
  refuses([] { (void)grad::standardize(Tensor<double>({4})); }, {"grad::standardize", "[4]", "[rows, columns...]"});
}

TEST_CASE("arithmetic: same shapes, numpy broadcasting and scalars on either side; a bad pair is named") {
  const Tensor<double> row({2}, {10, 20}), col({3, 1}, {1, 2, 3});
  CHECK(values(x + x) == std::vector<double>{2, 4, 6, 8, 10, 18});
  CHECK(values(x - row) == std::vector<double>{-9, -18, -7, -16, -5, -11});
  CHECK(values(x * col) == std::vector<double>{1, 2, 6, 8, 15, 27});
  CHECK(values(x / row) == std::vector<double>{0.1, 0.1, 0.3, 0.2, 0.5, 0.45});
  CHECK((row + col).shape() == grad::Shape{3, 2});
  CHECK(values(row + col) == std::vector<double>{11, 21, 12, 22, 13, 23});
  CHECK(values(x * 2.0) == std::vector<double>{2, 4, 6, 8, 10, 18});
  CHECK(values(1.0 - row) == std::vector<double>{-9, -19});
  CHECK(values(row / 4.0) == std::vector<double>{2.5, 5});
  CHECK(values(40.0 / row) == std::vector<double>{4, 2});
  CHECK(values(-row + 1.0) == std::vector<double>{-9, -19});
  const Tensor<float> f({2}, {1.5f, 2.5f});
  CHECK((f * 2.0f)[1] == 5.0f);

  refuses([&] { (void)(x + Tensor<double>({3})); }, {"Tensor +", "[3, 2] and [3]", "do not broadcast"});
  refuses([&] { (void)(x * Tensor<double>()); }, {"Tensor *", "must both hold elements"});
}

TEST_CASE("slice_rows and concat copy rows and blocks; out-of-range rows and mismatched axes are refused") {
  CHECK(values(grad::slice_rows(x, 1, 3)) == std::vector<double>{3, 4, 5, 9});
  CHECK(grad::slice_rows(x, 1, 3).shape() == grad::Shape{2, 2});
  CHECK(values(grad::concat(x, grad::slice_rows(x, 0, 1), 0)) == std::vector<double>{1, 2, 3, 4, 5, 9, 1, 2});
  const Tensor<double> extra({3, 1}, {7, 8, 9});
  CHECK(values(grad::concat(x, extra, -1)) == std::vector<double>{1, 2, 7, 3, 4, 8, 5, 9, 9});
  CHECK(grad::argmax(grad::concat(x, extra, 1), -1) == std::vector<std::int32_t>{2, 2, 1});

  refuses([] { (void)grad::slice_rows(x, 2, 2); }, {"grad::slice_rows", "[2, 2)", "[3, 2]", "first < last <= 3"});
  refuses([] { (void)grad::slice_rows(x, 0, 4); }, {"grad::slice_rows", "first < last <= 3"});
  refuses([&] { (void)grad::concat(x, extra, 0); }, {"grad::concat", "[3, 2] and [3, 1]", "every axis but axis 0"});
  refuses([] { (void)grad::concat(x, x, 3); }, {"grad::concat", "axis 3"});
}
