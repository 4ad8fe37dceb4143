// Bad input never reaches undefined behaviour: each case poisons the tape (or
// throws, for Tensor construction) with a message naming the op, the shapes
// and what was expected, and later ops return at once.
#include <doctest/doctest.h>

#include <initializer_list>

#include "support.hpp"

using namespace grad;
using T = double;

namespace {

// The tape is poisoned and its message mentions every fragment.
void expect_poisoned(const Tape<T>& tp, std::initializer_list<const char*> fragments) {
  REQUIRE_FALSE(tp.ok());
  CAPTURE(tp.error());
  CHECK(tp.error().rfind("grad: ", 0) == 0);
  for (const char* f : fragments) CHECK(tp.error().find(f) != std::string::npos);
}

Var<T> filled(Tape<T>& tp, Shape s) { return tp.param(Tensor<T>::full(std::move(s), 0.5)); }

}  // namespace

TEST_CASE("Tensor construction with a wrong number of values throws, naming both counts") {
  try {
    Tensor<T>({2, 3}, std::vector<T>(5));
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("[2, 3]") != std::string::npos);
    CHECK(std::string(e.what()).find("6 elements") != std::string::npos);
    CHECK(std::string(e.what()).find("5 values") != std::string::npos);
  }
}

TEST_CASE("binary op on shapes that do not broadcast") {
  Tape<T> tp;
  auto y = filled(tp, {2, 3}) + filled(tp, {4});
  CHECK_FALSE(y.valid());
  expect_poisoned(tp, {"add", "[2, 3]", "[4]", "broadcast"});
}

TEST_CASE("matmul with mismatched inner dimensions") {
  Tape<T> tp;
  matmul(filled(tp, {2, 3}), filled(tp, {4, 5}));
  expect_poisoned(tp, {"matmul", "[m, k] x [k, n]", "[2, 3] x [4, 5]"});
}

TEST_CASE("matmul on a rank-3 operand") {
  Tape<T> tp;
  matmul(filled(tp, {2, 2, 3}), filled(tp, {3, 5}));
  expect_poisoned(tp, {"matmul", "[2, 2, 3] x [3, 5]"});
}

TEST_CASE("bmm with different batch sizes") {
  Tape<T> tp;
  bmm(filled(tp, {2, 3, 4}), filled(tp, {3, 4, 5}));
  expect_poisoned(tp, {"bmm", "[B, m, k] x [B, k, n]", "[2, 3, 4] x [3, 4, 5]"});
}

TEST_CASE("transpose of a rank-1 tensor") {
  Tape<T> tp;
  transpose(filled(tp, {4}));
  expect_poisoned(tp, {"transpose", "rank >= 2", "[4]"});
}

TEST_CASE("mse of differently shaped prediction and target") {
  Tape<T> tp;
  mse(filled(tp, {2, 3}), filled(tp, {3, 2}));
  expect_poisoned(tp, {"mse", "[2, 3]", "[3, 2]", "same shape"});
}

TEST_CASE("softmax over an out-of-range axis") {
  Tape<T> tp;
  softmax(filled(tp, {2, 3}), 2);
  expect_poisoned(tp, {"softmax", "axis 2", "[2, 3]", "rank 2"});
}

TEST_CASE("softmax over an out-of-range negative axis") {
  Tape<T> tp;
  softmax(filled(tp, {2, 3}), -3);
  expect_poisoned(tp, {"softmax", "axis -3", "[2, 3]"});
}

TEST_CASE("concat over an out-of-range axis") {
  Tape<T> tp;
  concat(filled(tp, {2, 3}), filled(tp, {2, 3}), 5);
  expect_poisoned(tp, {"concat", "axis 5", "[2, 3]"});
}

TEST_CASE("concat of shapes that differ off the axis") {
  Tape<T> tp;
  concat(filled(tp, {2, 3}), filled(tp, {3, 4}), 0);
  expect_poisoned(tp, {"concat", "[2, 3]", "[3, 4]", "every axis but axis 0"});
}

TEST_CASE("slice beyond the end of an axis") {
  Tape<T> tp;
  slice(filled(tp, {4, 5}), {0, 2}, {4, 6});
  expect_poisoned(tp, {"slice", "[2, 6)", "axis 1", "[4, 5]", "start < stop <= 5"});
}

TEST_CASE("slice with an empty range") {
  Tape<T> tp;
  slice(filled(tp, {4, 5}), {2, 0}, {2, 5});
  expect_poisoned(tp, {"slice", "[2, 2)", "axis 0", "empty"});
}

TEST_CASE("slice with the wrong number of bounds") {
  Tape<T> tp;
  slice(filled(tp, {4, 5}), {0}, {2});
  expect_poisoned(tp, {"slice", "[4, 5]", "needs 2 starts and stops", "got 1 and 1"});
}

TEST_CASE("reshape to a different element count") {
  Tape<T> tp;
  reshape(filled(tp, {2, 3}), {4, 2});
  expect_poisoned(tp, {"reshape", "[2, 3] (6 elements)", "[4, 2] (8 elements)"});
}

TEST_CASE("reshape beyond the largest supported rank") {
  Tape<T> tp;
  reshape(filled(tp, {2}), {1, 1, 1, 1, 1, 1, 2});
  expect_poisoned(tp, {"reshape", "rank 1 to 6"});
}

TEST_CASE("a leaf of too high a rank or with no elements") {
  Tape<T> tp;
  tp.param(Tensor<T>(Shape{1, 1, 1, 1, 1, 1, 1}));
  expect_poisoned(tp, {"param", "rank 7", "at most 6"});
  Tape<T> tp2;
  tp2.constant(Tensor<T>(Shape{0, 3}));
  expect_poisoned(tp2, {"const", "[0, 3]", "no elements"});
}

TEST_CASE("a Var from another tape") {
  Tape<T> tp, other;
  auto x = filled(tp, {3});
  auto y = filled(other, {3});
  x* y;
  expect_poisoned(tp, {"mul", "operand 2", "different tape"});
  CHECK(other.ok());
}

TEST_CASE("a Var dropped by reset_to") {
  Tape<T> tp;
  auto x = filled(tp, {3});
  auto m = tp.mark();
  auto dropped = relu(x);
  tp.reset_to(m);
  auto reused = grad::exp(x);  // records a new node at the dropped index
  CHECK(reused.index() == dropped.index());
  dropped + x;
  expect_poisoned(tp, {"add", "operand 1", "dropped by reset_to"});
}

TEST_CASE("a default-constructed Var throws: it has no tape to poison") {
  Tape<T> tp;
  CHECK_THROWS_WITH_AS(Var<T>{} + filled(tp, {2}), doctest::Contains("add: operand 1 is a default-constructed Var"),
                       std::invalid_argument);
}

TEST_CASE("backward on a non-scalar loss") {
  Tape<T> tp;
  auto y = relu(filled(tp, {2, 3}));
  CHECK_FALSE(tp.backward(y));
  expect_poisoned(tp, {"backward", "[2, 3]", "single element"});
}

TEST_CASE("backward on a poisoned loss") {
  Tape<T> tp;
  auto loss = sum(filled(tp, {2}) + filled(tp, {3}));
  CHECK_FALSE(loss.valid());
  CHECK_FALSE(tp.backward(loss));
  expect_poisoned(tp, {"add", "[2]", "[3]"});  // the first error is kept
}

TEST_CASE("backward on a loss from another tape") {
  Tape<T> tp, other;
  auto loss = sum(filled(other, {2}));
  CHECK_FALSE(tp.backward(loss));
  expect_poisoned(tp, {"backward", "different tape"});
}

TEST_CASE("reset_to a mark from another tape, or one ahead of the tape") {
  Tape<T> tp, other;
  filled(tp, {2});
  tp.reset_to(other.mark());
  expect_poisoned(tp, {"reset_to", "different tape"});

  Tape<T> tp2;
  filled(tp2, {2});
  auto early = tp2.mark();
  auto late = (filled(tp2, {2}), tp2.mark());
  tp2.reset_to(early);
  tp2.reset_to(late);
  expect_poisoned(tp2, {"reset_to", "stale mark", "taken at 2 nodes", "now has 1"});
}

TEST_CASE("ops on a poisoned tape return at once without recording or touching memory") {
  Tape<T> tp;
  auto x = filled(tp, {2, 3});
  x + filled(tp, {4});
  REQUIRE_FALSE(tp.ok());
  const std::string first = tp.error();
  const std::size_t nodes = tp.size();
  auto y = matmul(tanh(x), transpose(x));
  auto z = softmax(reshape(slice(y, {0, 0}, {1, 1}), {1}), 0);
  CHECK_FALSE(y.valid());
  CHECK_FALSE(z.valid());
  CHECK(tp.size() == nodes);
  CHECK(tp.error() == first);
  CHECK(tp.value(z).empty());
  CHECK(std::isnan(tp.scalar(z)));
  CHECK_FALSE(tp.param(Tensor<T>::ones({2})).valid());
}

// ---- the ops of issue 28 ----

TEST_CASE("max and min over an out-of-range axis") {
  Tape<T> tp;
  grad::max(filled(tp, {2, 3}), 2);
  expect_poisoned(tp, {"max", "axis 2", "[2, 3]", "rank 2"});
  Tape<T> tp2;
  grad::min(filled(tp2, {2, 3}), -3, false);
  expect_poisoned(tp2, {"min", "axis -3", "[2, 3]"});
}

TEST_CASE("log_softmax over an out-of-range axis") {
  Tape<T> tp;
  log_softmax(filled(tp, {4}), 1);
  expect_poisoned(tp, {"log_softmax", "axis 1", "[4]", "rank 1"});
}

TEST_CASE("maximum, minimum and pow on shapes that do not broadcast") {
  Tape<T> tp;
  maximum(filled(tp, {2, 3}), filled(tp, {2}));
  expect_poisoned(tp, {"maximum", "[2, 3]", "[2]", "broadcast"});
  Tape<T> tp2;
  minimum(filled(tp2, {3, 1}), filled(tp2, {2, 4}));
  expect_poisoned(tp2, {"minimum", "[3, 1]", "[2, 4]", "broadcast"});
  Tape<T> tp3;
  grad::pow(filled(tp3, {5}), filled(tp3, {4}));
  expect_poisoned(tp3, {"pow", "[5]", "[4]", "broadcast"});
}

TEST_CASE("clamp with lo > hi or a NaN bound") {
  Tape<T> tp;
  auto x = filled(tp, {2});
  CHECK_FALSE(clamp(x, 1.0, 0.5).valid());
  expect_poisoned(tp, {"clamp", "lo <= hi", "lo = 1", "hi = 0.5"});
  Tape<T> tp2;
  clamp(filled(tp2, {2}), std::nan(""), 1.0);
  expect_poisoned(tp2, {"clamp", "lower bound is NaN"});
  Tape<T> tp3;
  clamp_max(filled(tp3, {2}), std::nan(""));
  expect_poisoned(tp3, {"clamp_max", "upper bound is NaN"});
  Tape<T> tp4;
  clamp_min(filled(tp4, {2}), std::nan(""));
  expect_poisoned(tp4, {"clamp_min", "lower bound is NaN"});
  Tape<T> tp5;  // infinite bounds are a clamp on one side only
  auto y = clamp(filled(tp5, {2}), -INFINITY, 0.25);
  REQUIRE(tp5.ok());
  CHECK(tp5.value(y)[0] == 0.25);
}

TEST_CASE("where with shapes that do not broadcast, or a mask that needs a gradient") {
  Tape<T> tp;
  where(tp.constant(Tensor<T>::ones({3})), filled(tp, {2, 3}), filled(tp, {2, 2}));
  expect_poisoned(tp, {"where", "cond [3]", "a [2, 3]", "b [2, 2]", "broadcast"});
  Tape<T> tp2;
  where(filled(tp2, {3}), filled(tp2, {3}), filled(tp2, {3}));
  expect_poisoned(tp2, {"where", "mask requires a gradient", "constant"});
  Tape<T> tp3;
  Tape<T> other;
  where(tp3.constant(Tensor<T>::ones({3})), filled(tp3, {3}), filled(other, {3}));
  expect_poisoned(tp3, {"where", "operand 3", "different tape"});
}
