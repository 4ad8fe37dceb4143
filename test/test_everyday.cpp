// The everyday pieces around a training loop: Batches (shuffling, the short
// last batch, no allocation after the first epoch), inference mode and
// predict, exception mode, the loud poisoned step, printing, the threading
// report and CSV reading, with the bad input each must refuse.
#include <doctest/doctest.h>

#include <unistd.h>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <grad/csv.hpp>
#include <grad/data.hpp>
#include <grad/grad.hpp>
#include <grad/modules.hpp>
#include <grad/print.hpp>
#include <grad/threading.hpp>
#include <new>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "counting_allocator.hpp"
#include "support.hpp"

using grad::testing::allocations;

using grad::Tensor;
namespace nn = grad::nn;

namespace {
// rows x 2 inputs (row r holds r, -r) and labels r % 3.
struct Data {
  Tensor<double> x;
  std::vector<std::int32_t> y;
  explicit Data(std::size_t rows) : x({rows, 2}), y(rows) {
    for (std::size_t r = 0; r < rows; ++r) {
      x[2 * r] = static_cast<double>(r);
      x[2 * r + 1] = -static_cast<double>(r);
      y[r] = static_cast<std::int32_t>(r % 3);
    }
  }
};
}  // namespace

TEST_CASE("Batches: every row once per epoch, inputs and labels together, reshuffled by seed") {
  Data d(10);
  grad::Batches<double> batches(d.x, d.y, {.batch = 4, .last = grad::LastBatch::keep, .seed = 7});
  CHECK(batches.size() == 3);
  std::vector<std::vector<double>> orders;
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<double> seen;
    std::vector<std::size_t> sizes;
    for (const auto& b : batches.epoch()) {
      sizes.push_back(b.rows);
      CHECK(b.inputs.shape() == grad::Shape{b.rows, 2});
      for (std::size_t i = 0; i < b.rows; ++i) {
        const double r = b.inputs[2 * i];
        CHECK(b.inputs[2 * i + 1] == -r);                        // the row stays whole
        CHECK(b.labels[i] == static_cast<std::int32_t>(r) % 3);  // with its label
        seen.push_back(r);
      }
    }
    CHECK(sizes == std::vector<std::size_t>{4, 4, 2});
    orders.push_back(seen);
    std::set<double> unique(seen.begin(), seen.end());
    CHECK(unique.size() == 10);
  }
  CHECK(orders[0] != orders[1]);  // a new permutation each epoch
  grad::Batches<double> again(d.x, d.y, {.batch = 4, .seed = 7});
  std::vector<double> first;
  for (const auto& b : again.epoch())
    for (std::size_t i = 0; i < b.rows; ++i) first.push_back(b.inputs[2 * i]);
  CHECK(first == orders[0]);  // the same seed, the same order
  grad::Batches<double> in_order(d.x, d.y, {.batch = 4, .last = grad::LastBatch::drop, .shuffle = false});
  CHECK(in_order.size() == 2);
  std::vector<double> plain;
  for (const auto& b : in_order.epoch())
    for (std::size_t i = 0; i < b.rows; ++i) plain.push_back(b.inputs[2 * i]);
  CHECK(plain == std::vector<double>{0, 1, 2, 3, 4, 5, 6, 7});
}

TEST_CASE("Batches: targets data sets, EpochMean weighs the short batch by its rows") {
  Data d(5);
  grad::Batches<double> batches(d.x, d.x, {.batch = 2, .shuffle = false});
  grad::EpochMean mean;
  for (const auto& b : batches.epoch()) {
    CHECK(b.targets.shape() == b.inputs.shape());
    double s = 0;
    for (std::size_t i = 0; i < b.rows; ++i) s += b.targets[2 * i];
    mean.add(s / static_cast<double>(b.rows), b.rows);  // a per-batch mean, as mse or cross_entropy give
  }
  CHECK(mean.value() == doctest::Approx(2.0));  // mean of 0..4, not the mean of the batch means (1.5+... )
}

TEST_CASE("Batches: bad sizes are refused by name") {
  Data d(10);
  CHECK_THROWS_WITH_AS(grad::Batches<double>(d.x, d.y, {.batch = 11}),
                       "Batches: batch size 11 is larger than the data set (10 rows); use a batch of at most 10",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(grad::Batches<double>(d.x, d.y, {.batch = 0}), "Batches: batch size 0; expected at least 1 row",
                       std::invalid_argument);
  const std::vector<std::int32_t> short_labels(9, 0);
  CHECK_THROWS_WITH_AS(grad::Batches<double>(d.x, short_labels, {.batch = 2}),
                       "Batches: the inputs have 10 rows but there are 9 labels", std::invalid_argument);
  std::vector<std::int32_t> negative(10, 0);
  negative[4] = -2;
  CHECK_THROWS_WITH_AS(grad::Batches<double>(d.x, negative, {.batch = 2}),
                       "Batches: label -2 in row 4 is negative; expected class ids >= 0", std::invalid_argument);
  grad::Tape<double> tp;
  grad::Batches<double> b(d.x, d.y, {.batch = 4});
  const auto x = tp.constant(Tensor<double>({3, 2}));
  CHECK_FALSE((*b.epoch().begin()).feed(tp, x));
  CHECK(tp.error() == "grad: Batch::feed: the batch is [4, 2] but the input node is [3, 2]");
}

TEST_CASE("a training loop over Batches makes no heap allocation after the first epoch") {
  Data d(50);
  grad::Tape<double> tp;
  grad::SplitMix64 gen(1);
  auto model = nn::mlp<double>(tp, {2, 8, 3}, gen);
  grad::Adam<double> opt(0.01);
  REQUIRE(nn::add_parameters(opt, model));
  grad::Batches<double> batches(d.x, d.y, {.batch = 16, .last = grad::LastBatch::keep, .seed = 3});
  const auto m = tp.mark();
  long after_first = 0;
  bool ok = true;
  for (int epoch = 0; epoch < 3; ++epoch) {
    if (epoch == 1) after_first = allocations.load();
    for (const auto& b : batches.epoch()) {  // no doctest macro in here: they may allocate
      tp.reset_to(m);
      const auto loss = grad::cross_entropy(model(tp.constant(b.inputs)), b.labels);
      ok = ok && tp.backward(loss) && opt.step();
    }
  }
  const long later = allocations.load() - after_first;
  CHECK(ok);
  CHECK(later == 0);
}

TEST_CASE("inference mode: values without gradient buffers; backward is refused; predict does not grow the tape") {
  grad::Tape<double> tp;
  grad::SplitMix64 gen(2);
  auto model = nn::mlp<double>(tp, {2, 4, 3}, gen);
  grad::testing::Rng rng(1);
  const auto x = tp.constant(grad::testing::random_tensor<double>({5, 2}, rng));
  const auto trained = model(x);
  const std::size_t grad_bytes = tp.grad_bytes();
  grad::Var<double> inferred;
  {
    grad::InferenceGuard<double> guard(tp);
    CHECK(tp.inference_mode());
    inferred = model(x);
    CHECK(tp.grad_bytes() == grad_bytes);  // no gradient buffers were added
    CHECK_FALSE(tp.requires_grad(inferred));
    CHECK_FALSE(tp.backward(grad::mean(inferred)));
    CHECK(tp.error() ==
          "grad: backward: the tape is in inference mode (an InferenceGuard is open); close the guard and record the "
          "loss again to train");
  }
  CHECK_FALSE(tp.inference_mode());
  CHECK(std::equal(tp.value(trained).begin(), tp.value(trained).end(), tp.value(inferred).begin()));

  grad::Tape<double> t2;
  const auto w = t2.param(Tensor<double>({2, 2}, {1, 2, 3, 4}));
  grad::Var<double> loss;
  {
    grad::InferenceGuard<double> guard(t2);
    loss = grad::sum(w * w);
  }
  CHECK_FALSE(t2.backward(loss));
  CHECK(t2.error() ==
        "grad: backward: the loss (node 2) was computed in inference mode (under an InferenceGuard), so "
        "no gradient reaches a parameter; record it again outside the guard");

  // A loss computed outside the guard from inference-mode values only is refused too...
  grad::Tape<double> t4;
  const auto v = t4.param(Tensor<double>({2}, {1, 2}));
  grad::Var<double> frozen;
  {
    grad::InferenceGuard<double> guard(t4);
    frozen = v * v;
  }
  CHECK_FALSE(t4.backward(grad::sum(frozen)));
  CHECK(t4.error().find("grad: backward: the loss (node 2) was computed in inference mode") == 0);
  // ...but one that also reaches a parameter outside it trains (a frozen teacher's targets).
  grad::Tape<double> t5;
  const auto u = t5.param(Tensor<double>({2}, {1, 2}));
  grad::Var<double> target;
  {
    grad::InferenceGuard<double> guard(t5);
    target = u * 3.0;
  }
  REQUIRE(t5.backward(grad::mse(u, target)));
  CHECK(t5.grad(u)[1] == doctest::Approx(-4.0));  // 2 (u - t) / 2 with u = 2 and the target t = 6 fixed

  Data d(9);
  grad::Tape<double> t3;
  auto classifier = nn::mlp<double>(t3, {2, 4, 3}, gen);
  const std::size_t nodes = t3.size();
  const auto predicted = grad::predict(t3, classifier, d.x, 4);
  CHECK(predicted.size() == 9);
  CHECK(t3.size() == nodes);
  CHECK_FALSE(t3.inference_mode());
  for (auto p : predicted) CHECK((p >= 0 && p < 3));
}

TEST_CASE("exception mode throws the tape's message; the default mode keeps poisoning") {
  grad::Tape<double> tp;
  tp.throw_on_error(true);
  const auto a = tp.param(Tensor<double>({2, 3}));
  const auto b = tp.param(Tensor<double>({4, 5}));
  CHECK_THROWS_WITH_AS(grad::matmul(a, b), "grad: matmul: expected [m, k] x [k, n], got [2, 3] x [4, 5]",
                       grad::TapeError);
  CHECK_FALSE(tp.ok());  // poisoned as in the default mode
  grad::Tape<double> quiet;
  const auto c = quiet.param(Tensor<double>({2, 3}));
  CHECK_NOTHROW(grad::matmul(c, c));
  CHECK_FALSE(quiet.ok());
}

TEST_CASE("step() on a poisoned tape returns false and says so on stderr, once") {
  grad::Tape<double> tp;
  const auto w = tp.param(Tensor<double>({2}, {1, 2}));
  grad::SGD<double> opt(0.1);
  REQUIRE(opt.add(w));
  REQUIRE(tp.backward(grad::sum(w * w)));
  (void)grad::matmul(w, w);  // poisons: rank 1
  // Capture stderr through a temporary file.
  std::fflush(stderr);
  char path[] = "/tmp/grad_stderr_XXXXXX";
  const int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  const int saved = ::dup(2);
  ::dup2(fd, 2);
  const bool first = opt.step(), second = opt.step();
  std::fflush(stderr);
  ::dup2(saved, 2);
  ::close(saved);
  ::close(fd);
  std::ifstream in(path);
  const std::string said((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(path);
  CHECK_FALSE(first);
  CHECK_FALSE(second);
  CHECK(said ==
        "grad: sgd.step: the tape is poisoned, no parameter was updated: grad: matmul: expected [m, k] x "
        "[k, n], got [2] x [2]\n");
  CHECK(tp.value(w)[1] == 2.0);  // unchanged
}

TEST_CASE("printing tensors and views like torch") {
  std::ostringstream s;
  s << Tensor<double>({2, 3}, {0.1, -0.2, 0.3, 0.4, -0.5, 0.6});
  CHECK(s.str() ==
        "tensor([[ 0.1000, -0.2000,  0.3000],\n        [ 0.4000, -0.5000,  0.6000]], shape=[2, 3], dtype=float64)");
  grad::Tape<float> tp;
  const auto v = tp.constant(Tensor<float>({3}, {1e-5f, 2.f, 3.f}));
  std::ostringstream f;
  f << tp.value(v);
  CHECK(f.str() == "tensor([1.0000e-05, 2.0000e+00, 3.0000e+00], shape=[3], dtype=float32)");
  std::ostringstream big;
  big << Tensor<double>({2000});
  CHECK(big.str() == "tensor([0.0000, 0.0000, 0.0000, ..., 0.0000, 0.0000, 0.0000], shape=[2000], dtype=float64)");
  std::ostringstream none;
  none << tp.value(grad::Var<float>{});
  CHECK(none.str() == "tensor([], shape=[], dtype=float32)");
}

TEST_CASE("threading report: thresholds and why a small model is not split") {
  const auto t = grad::threading_thresholds();
  CHECK(t.matmul_multiply_adds == std::size_t{1} << 20);
  CHECK(t.elementwise_elements == std::size_t{1} << 16);
  grad::Tape<double> tp;
  grad::SplitMix64 gen(1);
  auto model = nn::mlp<double>(tp, {64, 128, 64, 10}, gen);
  (void)grad::mean(model(tp.constant(Tensor<double>({64, 64}))));
  const std::string r = grad::threading_report(tp);
  CHECK(r.find("0 of 3 matrix products large enough to split (largest 524288 multiply-adds)") != std::string::npos);
  CHECK(r.find("more threads cannot help at this size") != std::string::npos);
}

TEST_CASE("read_csv / split_labels: numbers, a header line, bad fields named") {
  const std::string path = "/tmp/grad_csv_" + std::to_string(::getpid()) + ".csv";
  std::ofstream(path) << "a,b,label\n1, 2.5,0\n3,4,2\n";
  const auto d = grad::read_labeled_csv<double>(path);
  CHECK(d.inputs.shape() == grad::Shape{2, 2});
  CHECK(d.inputs[1] == 2.5);
  CHECK(d.labels == std::vector<std::int32_t>{0, 2});
  std::ofstream(path) << "1,2,0\n3,x,1\n";
  CHECK_THROWS_WITH_AS(grad::read_csv<double>(path),
                       ("read_csv: '" + path + "': line 2, field 2 is not a number").c_str(), std::runtime_error);
  std::ofstream(path) << "1,2,0.5\n";
  CHECK_THROWS_WITH_AS(
      grad::read_labeled_csv<double>(path),
      ("read_labeled_csv: '" + path + "': line 1: label 0.5 is not a class id (a whole number in 0 .. 2147483647)")
          .c_str(),
      std::invalid_argument);
  std::remove(path.c_str());
  CHECK_THROWS_AS(grad::read_csv<double>("/nonexistent/digits.csv.gz"), std::runtime_error);
}

namespace {
// Writes `bytes` (NULs included) to a scratch CSV file; its path.
std::string csv_file(const std::string& bytes) {
  const std::string path = "/tmp/grad_csv_bytes_" + std::to_string(::getpid()) + ".csv";
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return path;
}
}  // namespace

TEST_CASE("read_csv refuses a NUL byte, naming its line and column, wherever it is") {
  using namespace std::string_literals;
  const std::pair<std::string, std::string> cases[] = {
      {"\0,9\n1,2\n"s, "line 1, column 1: a NUL byte (a CSV file is text)"},
      {"1,2\n\0,9\n3,4"s, "line 2, column 1: a NUL byte (a CSV file is text)"},
      {"1,2\n30,4\0junk\n0\n"s, "line 2, column 5: a NUL byte (a CSV file is text)"},
      {"1,2\n3,4\n\0"s, "line 3, column 1: a NUL byte (a CSV file is text)"},
  };
  for (const auto& [bytes, message] : cases) {
    const std::string path = csv_file(bytes);
    CHECK_THROWS_WITH_AS(grad::read_csv<double>(path), ("read_csv: '" + path + "': " + message).c_str(),
                         std::runtime_error);
    std::remove(path.c_str());
  }
  // Without NULs: every row, a last line without a newline, CRLF line ends.
  const std::string path = csv_file("1,2\r\n3,4\n\n5,6");
  const auto t = grad::read_csv<double>(path);
  CHECK(t.shape() == grad::Shape{3, 2});
  CHECK(t[5] == 6);
  std::remove(path.c_str());
}

TEST_CASE("read_csv refuses what is not a regular file (/dev/zero would never end) and values the type cannot hold") {
  CHECK_THROWS_WITH_AS(grad::read_csv<double>("/dev/zero"),
                       "read_csv: '/dev/zero' is not a regular file (a directory, FIFO or device is refused)",
                       std::runtime_error);
  CHECK_THROWS_WITH_AS(grad::read_csv<double>("/tmp"),
                       "read_csv: '/tmp' is not a regular file (a directory, FIFO or device is refused)",
                       std::runtime_error);
  CHECK(grad::max_csv_bytes == std::uint64_t{1} << 32);
  const std::string path = csv_file("1,2\n3,1e300\n");
  CHECK(grad::read_csv<double>(path)[3] == 1e300);
  CHECK_THROWS_WITH_AS(
      grad::read_csv<float>(path),
      ("read_csv: '" + path + "': line 2, field 2: 1.0000000000000001e+300 is out of range for float").c_str(),
      std::runtime_error);
  std::remove(path.c_str());
}

TEST_CASE("labels out of int range or not whole are refused, naming the line (no undefined conversion)") {
  const std::string path = csv_file("x,label\n1,0\n2,1e20\n");
  CHECK_THROWS_WITH_AS(
      grad::read_labeled_csv<double>(path),
      ("read_labeled_csv: '" + path + "': line 3: label 1e+20 is not a class id (a whole number in 0 .. 2147483647)")
          .c_str(),
      std::invalid_argument);
  for (const char* label : {"2147483648", "-1", "nan", "inf", "0.5"}) {
    const std::string p = csv_file(std::string("1,") + label + "\n");
    CAPTURE(std::string(label));
    CHECK_THROWS_WITH_AS(grad::read_labeled_csv<float>(p), doctest::Contains("': line 1: label "),
                         std::invalid_argument);
  }
  const std::string top = csv_file("1,2147483647\n2,0\n");
  CHECK(grad::read_labeled_csv<double>(top).labels == std::vector<std::int32_t>{2147483647, 0});
  grad::Tensor<double> table({2, 2}, std::vector<double>{1, 0, 2, -1e20});
  CHECK_THROWS_WITH_AS(grad::split_labels(table),
                       "split_labels: row 1: label -1e+20 is not a class id (a whole number in 0 .. 2147483647)",
                       std::invalid_argument);
  std::remove(path.c_str());
}

TEST_CASE("select_rows splits a labelled set; confusion_string lays the matrix out") {
  grad::LabeledData<double> d{Tensor<double>({4, 2}, {0, 1, 2, 3, 4, 5, 6, 7}), {0, 1, 2, 3}};
  const auto odd = grad::select_rows(d, [](std::size_t r) { return r % 2 == 1; });
  CHECK(odd.inputs.shape() == grad::Shape{2, 2});
  CHECK(odd.inputs[2] == 6.0);
  CHECK(odd.labels == std::vector<std::int32_t>{1, 3});
  CHECK_THROWS_WITH_AS(grad::select_rows(d, [](std::size_t) { return false; }), "select_rows: no row was selected",
                       std::invalid_argument);
  CHECK(grad::confusion_string({3, 1, 0, 12}, 2) ==
        "true\\predicted    0    1\n              0    3    1\n"
        "              1    0   12\n");
}

TEST_CASE("predict refuses a poisoned tape and a model whose output is not [rows, classes]") {
  Data d(4);
  grad::Tape<double> tp;
  (void)grad::matmul(tp.param(Tensor<double>({2})), tp.param(Tensor<double>({2})));
  auto identity = [](grad::Var<double> x) { return x; };
  CHECK_THROWS_WITH_AS(grad::predict(tp, identity, d.x),
                       "predict: the tape is poisoned: grad: matmul: expected [m, k] x [k, n], got [2] x [2]",
                       grad::TapeError);
  grad::Tape<double> t2;
  auto flat = [](grad::Var<double> x) { return grad::reshape(x, {8}); };
  CHECK_THROWS_AS(grad::predict(t2, flat, d.x, 4), std::invalid_argument);
}
