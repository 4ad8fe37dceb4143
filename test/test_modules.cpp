// Modules (initialisers, named parameters, add_parameters), classification
// (cross_entropy, argmax, accuracy) and named model files, each with the bad
// input it must refuse by name.
#include <doctest/doctest.h>

#include <unistd.h>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <grad/classify.hpp>
#include <grad/model_file.hpp>
#include <grad/modules.hpp>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "support.hpp"

using grad::Tensor;
namespace nn = grad::nn;
namespace fs = std::filesystem;

namespace {

const grad::testing::ScratchDir scratch("modules");

// encoder: 4 -> 8 -> 3 with tanh, head: LayerNorm(3) then Linear 3 -> 2.
template <class T>
struct Net : nn::Module<T> {
  nn::Sequential<T> encoder;
  nn::LayerNorm<T> norm;
  nn::Linear<T> head;
  Net(grad::Tape<T>& tp, grad::SplitMix64& gen)
      : nn::Module<T>(tp),
        encoder(nn::mlp<T>(tp, {4, 8, 3}, gen, nn::tanh_layer<T>)),
        norm(tp, 3),
        head(tp, 3, 2, gen) {
    this->register_module("encoder", encoder);
    this->register_module("norm", norm);
    this->register_module("head", head);
  }
  grad::Var<T> operator()(grad::Var<T> x) const { return head(norm(encoder(x))); }
};

template <class T>
bool same_bits(const Tensor<T>& a, const Tensor<T>& b) {
  return a.shape() == b.shape() &&
         grad::testing::bitwise_equal(std::span<const T>(a.data()), std::span<const T>(b.data()));
}

std::vector<std::string> names_of(const nn::Module<double>& m) {
  std::vector<std::string> n;
  for (const auto& p : m.parameters()) n.push_back(p.name);
  return n;
}

}  // namespace

TEST_CASE("Linear: PyTorch's default bounds, drawn from the seed, [in, out] weight") {
  grad::Tape<double> tp;
  grad::SplitMix64 gen(3);
  nn::Linear<double> fc(tp, 16, 5, gen);
  const auto w = tp.value(fc.weight), b = tp.value(fc.bias);
  CHECK(w.shape[0] == 16);
  CHECK(w.shape[1] == 5);
  CHECK(b.size() == 5);
  const double bound = 1.0 / std::sqrt(16.0);
  double lo = 1, hi = -1;
  for (double v : w) lo = std::min(lo, v), hi = std::max(hi, v);
  CHECK(lo >= -bound);
  CHECK(hi < bound);
  CHECK(hi - lo > bound);  // spread over the range, not a constant
  for (double v : b) CHECK(std::fabs(v) <= bound);
  // The same seed gives the same values: weight first, then bias.
  grad::SplitMix64 again(3);
  Tensor<double> expect({16, 5});
  nn::init::kaiming_uniform(expect, 16, again);
  CHECK(std::equal(expect.data().begin(), expect.data().end(), w.begin()));
  CHECK(names_of(fc) == std::vector<std::string>{"weight", "bias"});
}

TEST_CASE("initialisers: xavier bound, normal moments, zeros/ones; bad fans are refused") {
  grad::SplitMix64 gen(11);
  Tensor<double> x({200, 300});
  nn::init::xavier_uniform(x, 200, 300, gen);
  const double bound = std::sqrt(6.0 / 500.0);
  double largest = 0;
  for (double v : x.data()) largest = std::max(largest, std::fabs(v));
  CHECK(largest <= bound);
  CHECK(largest > 0.99 * bound);  // the whole range is used
  nn::init::normal(x, 1.0, 0.5, gen);
  double mean = 0, sq = 0;
  for (double v : x.data()) mean += v, sq += v * v;
  mean /= static_cast<double>(x.size());
  const double stddev = std::sqrt(sq / static_cast<double>(x.size()) - mean * mean);
  CHECK(mean == doctest::Approx(1.0).epsilon(0.01));
  CHECK(stddev == doctest::Approx(0.5).epsilon(0.01));
  nn::init::ones(x);
  CHECK(x[123] == 1.0);
  nn::init::zeros(x);
  CHECK(x[123] == 0.0);
  CHECK_THROWS_WITH_AS(nn::init::kaiming_uniform(x, 0, gen), "nn::init::kaiming_uniform: fan_in must be > 0",
                       std::invalid_argument);
  CHECK_THROWS_AS(nn::init::normal(x, 0.0, -1.0, gen), std::invalid_argument);
}

TEST_CASE("composition: state_dict-style names, add_parameters decays weights only") {
  grad::Tape<double> tp;
  grad::SplitMix64 gen(1);
  Net<double> net(tp, gen);
  CHECK(names_of(net) == std::vector<std::string>{"encoder.0.weight", "encoder.0.bias", "encoder.2.weight",
                                                  "encoder.2.bias", "norm.weight", "norm.bias", "head.weight",
                                                  "head.bias"});
  CHECK(net.parameter_count() == 4 * 8 + 8 + 8 * 3 + 3 + 3 + 3 + 3 * 2 + 2);
  CHECK(net.parameter("head.weight").index() == net.head.weight.index());
  CHECK_FALSE(net.parameter("head.wieght").valid());

  grad::Adam<double> opt(0.05);
  REQUIRE(nn::add_parameters(opt, net, {.weights = 1e-3, .others = 0}));
  REQUIRE(opt.params().size() == 8);
  CHECK(opt.params()[0].l2 == 1e-3);  // encoder.0.weight
  CHECK(opt.params()[1].l2 == 0.0);   // encoder.0.bias
  CHECK(opt.params()[4].l2 == 0.0);   // norm.weight: a gain, not decayed
  // The model trains: the loss falls over a few steps on a fixed batch.
  grad::testing::Rng rng(5);
  const auto x = tp.constant(grad::testing::random_tensor<double>({6, 4}, rng));
  const std::vector<int> labels = {0, 1, 1, 0, 1, 0};
  const auto m = tp.mark();
  double first = 0, last = 0;
  for (int step = 0; step < 60; ++step) {
    tp.reset_to(m);
    const auto loss = grad::cross_entropy(net(x), labels);
    REQUIRE(tp.backward(loss));
    REQUIRE(opt.step());
    (step == 0 ? first : last) = tp.scalar(loss);
  }
  CHECK(last < 0.5 * first);
}

TEST_CASE("module errors: duplicate names, foreign tape, bad sizes") {
  grad::Tape<double> tp, other;
  grad::SplitMix64 gen(1);
  CHECK_THROWS_WITH_AS(nn::Linear<double>(tp, 0, 3, gen), "nn::Linear: in and out must be > 0, got 0 and 3",
                       std::invalid_argument);
  struct Twice : nn::Module<double> {
    Twice(grad::Tape<double>& tp, nn::Module<double>& child) : nn::Module<double>(tp) {
      register_module("a", child);
      register_module("a", child);
    }
  };
  nn::Linear<double> fc(tp, 2, 2, gen), foreign(other, 2, 2, gen);
  CHECK_THROWS_WITH_AS(Twice(tp, fc), "nn::Module: parameter name 'a.weight' is used twice", std::invalid_argument);
  CHECK_THROWS_WITH_AS(Twice(tp, foreign), "nn::Module: child 'a' records on a different tape", std::invalid_argument);
}

TEST_CASE("LoRALinear starts as x.w0 and exposes only the adapters") {
  grad::Tape<double> tp;
  grad::SplitMix64 gen(2);
  grad::testing::Rng rng(9);
  const Tensor<double> w0 = grad::testing::random_tensor<double>({4, 3}, rng);
  nn::LoRALinear<double> lora(tp, w0, 2, 4.0, gen);
  CHECK(names_of(lora) == std::vector<std::string>{"lora_A", "lora_B"});
  const auto x = tp.constant(grad::testing::random_tensor<double>({5, 4}, rng));
  const auto y = lora(x), plain = grad::matmul(x, tp.constant(w0));
  CHECK(same_bits(tp.value(y).tensor(), tp.value(plain).tensor()));
  nn::RMSNorm<double> rms(tp, 3);
  CHECK(tp.value(rms.weight)[2] == 1.0);
}

TEST_CASE("cross_entropy matches log-softmax by hand; its gradient is softmax - onehot over rows") {
  grad::Tape<double> tp;
  const Tensor<double> z({2, 3}, {1.0, 2.0, 0.5, -1.0, 0.0, 3.0});
  const auto logits = tp.param(z);
  const std::vector<int> labels = {1, 0};
  const auto loss = grad::cross_entropy(logits, labels);
  REQUIRE(tp.ok());
  double expect = 0;
  std::vector<double> p(6);
  for (int r = 0; r < 2; ++r) {
    double s = 0;
    for (int c = 0; c < 3; ++c) s += std::exp(z[r * 3 + c]);
    for (int c = 0; c < 3; ++c) p[r * 3 + c] = std::exp(z[r * 3 + c]) / s;
    expect += -std::log(p[r * 3 + labels[r]]) / 2;
  }
  CHECK(tp.scalar(loss) == doctest::Approx(expect).epsilon(1e-14));
  REQUIRE(tp.backward(loss));
  for (int i = 0; i < 6; ++i)
    CHECK(tp.grad(logits)[i] == doctest::Approx((p[i] - (i % 3 == labels[i / 3] ? 1.0 : 0.0)) / 2).epsilon(1e-12));
  // Large logits do not overflow (the row max is subtracted first).
  grad::Tape<float> big;
  const auto l = grad::cross_entropy(big.param(Tensor<float>({1, 2}, {1000.f, 0.f})), std::vector<int>{0});
  CHECK(big.scalar(l) == 0.0f);
}

TEST_CASE("cross_entropy refuses a label out of range, naming row and id, and a wrong count") {
  grad::Tape<double> tp;
  const auto logits = tp.param(Tensor<double>({3, 4}));
  const auto bad = grad::cross_entropy(logits, std::vector<int>{0, 3, 4});
  CHECK_FALSE(bad.valid());
  CHECK(tp.error() ==
        "grad: cross_entropy: label 4 in row 2 is out of range: expected a class id in [0, 4) (the logits [3, 4] have "
        "4 classes)");
  grad::Tape<double> t2;
  (void)grad::cross_entropy(t2.param(Tensor<double>({3, 4})), std::vector<int>{0, -1, 1});
  CHECK(t2.error() ==
        "grad: cross_entropy: label -1 in row 1 is out of range: expected a class id in [0, 4) (the logits [3, 4] have "
        "4 classes)");
  grad::Tape<double> t3;
  (void)grad::cross_entropy(t3.param(Tensor<double>({3, 4})), std::vector<int>{0, 1});
  CHECK(t3.error() == "grad: cross_entropy: logits [3, 4] have 3 rows but 2 labels were given");
  grad::Tape<double> t4;
  (void)grad::cross_entropy(t4.param(Tensor<double>({12})), std::vector<int>{0});
  CHECK(t4.error() == "grad: cross_entropy: logits [12]: expected [rows, classes]");
}

TEST_CASE("argmax per row and per column, first wins ties, NaN never wins; accuracy; confusion matrix") {
  const double nan = std::nan("");
  const Tensor<double> v({3, 3}, {1, 5, 5, nan, 2, 1, -1, -2, -3});
  CHECK(grad::argmax(v) == std::vector<std::int32_t>{1, 1, 0});
  CHECK(grad::argmax(v, 0) == std::vector<std::int32_t>{0, 0, 0});
  CHECK_THROWS_AS(grad::argmax(v, 2), std::invalid_argument);
  CHECK(grad::accuracy(std::vector<int>{1, 1, 0, 2}, std::vector<int>{1, 0, 0, 2}) == 0.75);
  CHECK_THROWS_WITH_AS(grad::accuracy(std::vector<int>{1}, std::vector<int>{1, 0}),
                       "accuracy: 1 predictions and 2 labels: expected the same, non-zero count",
                       std::invalid_argument);
  const auto m = grad::confusion_matrix(std::vector<int>{1, 1, 0}, std::vector<int>{1, 0, 0}, 2);
  CHECK(m == std::vector<std::size_t>{1, 1, 0, 1});
  CHECK_THROWS_AS(grad::confusion_matrix(std::vector<int>{2}, std::vector<int>{0}, 2), std::invalid_argument);
}

TEST_CASE("model files: save and load by name, without an optimizer") {
  grad::Tape<double> a, b;
  grad::SplitMix64 g1(1), g2(2);
  Net<double> saved(a, g1), fresh(b, g2);
  const std::string path = scratch.file("net.model");
  REQUIRE(grad::save_model(path, saved));
  CHECK_FALSE(std::equal(a.value(saved.head.weight).begin(), a.value(saved.head.weight).end(),
                         b.value(fresh.head.weight).begin()));
  REQUIRE(grad::load_model(path, fresh));
  for (std::size_t i = 0; i < saved.parameters().size(); ++i)
    CHECK(same_bits(a.value(saved.parameters()[i].var).tensor(), b.value(fresh.parameters()[i].var).tensor()));
  // No temporary file is left behind.
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& e : fs::directory_iterator(scratch.dir)) ++files;
  CHECK(files == 1);
}

namespace {
// Loading must fail with `message` and leave every parameter of `into` as it was.
template <class T>
void refused(const std::string& path, nn::Module<T>& into, const std::string& message,
             grad::ModelLoadOptions options = {}) {
  std::vector<Tensor<T>> before;
  for (const auto& p : into.parameters()) before.push_back(into.tape().value(p.var).tensor());
  const auto r = grad::load_model(path, into, options);
  CHECK_FALSE(r.ok());
  CHECK(r.error == "grad: model file '" + path + "': " + message);
  for (std::size_t i = 0; i < before.size(); ++i)
    CHECK(same_bits(before[i], into.tape().value(into.parameters()[i].var).tensor()));
}
}  // namespace

TEST_CASE("model files: a renamed, missing, extra or reshaped parameter is named; nothing changes") {
  grad::SplitMix64 gen(1);
  grad::Tape<double> tp;
  nn::Sequential<double> model = nn::mlp<double>(tp, {4, 8, 2}, gen);
  const std::string path = scratch.file("mlp.model");
  REQUIRE(grad::save_model(path, model));

  // Renamed: the same tensors under other names.
  std::vector<nn::NamedParameter<double>> renamed(model.parameters().begin(), model.parameters().end());
  renamed[2].name = "2.wieght";
  const std::string renamed_path = scratch.file("renamed.model");
  REQUIRE(grad::save_model(renamed_path, tp, std::span<const nn::NamedParameter<double>>(renamed)));
  refused(renamed_path, model,
          "name mismatch: the model's parameter '2.weight' is not in the file (the file has "
          "'2.wieght' instead)");

  // Extra: the file has a parameter the model lacks.
  grad::Tape<double> t2;
  nn::Sequential<double> smaller(t2);
  smaller.add(nn::Linear<double>(t2, 4, 8, gen));
  refused(path, smaller, "name mismatch: the file's parameter '2.weight' is not in the model");

  // Reshaped: same names, different widths.
  grad::Tape<double> t3;
  nn::Sequential<double> wider = nn::mlp<double>(t3, {4, 9, 2}, gen);
  refused(path, wider, "shape mismatch: parameter '0.weight' is [4, 8] in the file but [4, 9] in the model");
}

TEST_CASE("model files: an f64 file into an f32 model only when asked; corrupt and non-files refused") {
  grad::SplitMix64 gen(4);
  grad::Tape<double> t64;
  nn::Sequential<double> m64 = nn::mlp<double>(t64, {3, 5, 2}, gen);
  const std::string path = scratch.file("f64.model");
  REQUIRE(grad::save_model(path, m64));
  grad::SplitMix64 gen32(5);
  grad::Tape<float> t32;
  nn::Sequential<float> m32 = nn::mlp<float>(t32, {3, 5, 2}, gen32);
  refused(path, m32,
          "dtype mismatch: the file holds float64 values, the model is float32; pass {.convert_dtype = true} to "
          "convert them");
  REQUIRE(grad::load_model(path, m32, {.convert_dtype = true}));
  const auto w64 = t64.value(m64.parameter("2.weight"));
  const auto w32 = t32.value(m32.parameter("2.weight"));
  for (std::size_t i = 0; i < w64.size(); ++i) CHECK(w32[i] == static_cast<float>(w64[i]));

  // A flipped byte fails the checksum; a checkpoint is not a model file; a directory is refused.
  std::ifstream in(path, std::ios::binary);
  std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  bytes[bytes.size() / 2] ^= 1;
  const std::string bad = scratch.file("flipped.model");
  std::ofstream(bad, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  refused(bad, m64, "checksum mismatch: the file is corrupted");
  grad::Adam<double> opt(0.1);
  REQUIRE(nn::add_parameters(opt, m64));
  const std::string ckpt = scratch.file("run.ckpt");
  REQUIRE(grad::save_checkpoint(ckpt, t64, opt));
  refused(ckpt, m64, "not a grad model (bad magic bytes)");
  refused(scratch.dir.string(), m64, "is a directory, not a model file");
}

namespace {
// A model file from a hand-written payload and header fields, checksummed as save_model would.
std::string hand_written_model(const std::string& name, std::uint32_t dtype, std::uint32_t kind,
                               const std::vector<unsigned char>& payload) {
  const std::string path = scratch.file(name);
  const auto file = grad::detail::frame(grad::detail::model_magic, grad::model_file_version, dtype, kind, payload);
  REQUIRE(grad::detail::write_atomically(path, file, "model") == "");
  return path;
}
}  // namespace

TEST_CASE("save_model refuses, before writing anything, the names load_model would refuse") {
  grad::Tape<double> tp;
  const auto w = tp.param(Tensor<double>({2, 2})), b = tp.param(Tensor<double>({2}));
  const std::string path = scratch.file("names.model");
  auto save = [&](std::vector<nn::NamedParameter<double>> list) {
    std::remove(path.c_str());
    const auto r = grad::save_model(path, tp, std::span<const nn::NamedParameter<double>>(list));
    CHECK_FALSE(fs::exists(path));  // nothing written
    return r.error;
  };
  const std::string head = "grad: model file '" + path + "': ";
  CHECK(save({{"w", w, nn::ParamKind::weight}, {"", b, nn::ParamKind::weight}}) ==
        head + "parameter 2 '' has a name of 0 bytes (expected 1 .. 4096); nothing written");
  CHECK(save({{std::string(5000, 'x'), w, nn::ParamKind::weight}}) ==
        head + "parameter 1 (a name of 5000 bytes) has a name of 5000 bytes (expected 1 .. 4096); nothing written");
  CHECK(save({{"w", w, nn::ParamKind::weight}, {"b", b, nn::ParamKind::weight}, {"w", b, nn::ParamKind::weight}}) ==
        head + "parameter 3 'w' has the name of parameter 1 (names must be unique); nothing written");
  // The longest name load_model reads is saved and read back.
  const std::vector<nn::NamedParameter<double>> longest = {{std::string(4096, 'n'), w, nn::ParamKind::weight}};
  REQUIRE(grad::save_model(path, tp, std::span<const nn::NamedParameter<double>>(longest)));
  CHECK(grad::load_model(path, tp, std::span<const nn::NamedParameter<double>>(longest)));
}

TEST_CASE("load_model names the parameter whose name or rank is bad, and checks the header's kind") {
  grad::Tape<double> tp;
  const auto w = tp.param(Tensor<double>({2}));
  const std::vector<nn::NamedParameter<double>> list = {{"w", w, nn::ParamKind::weight}};
  const std::span<const nn::NamedParameter<double>> params(list);
  auto payload = [](std::uint32_t name_length, const std::string& name, std::uint32_t rank) {
    grad::detail::ByteWriter p;
    p.put(std::uint64_t{1});
    p.put(name_length);
    p.put_all(std::span<const char>(name));
    p.put(rank);
    for (std::uint32_t k = 0; k < rank; ++k) p.put(std::uint64_t{2});
    p.put(1.0);
    p.put(2.0);
    return p.bytes;
  };
  auto error = [&](const std::string& path) { return grad::load_model(path, tp, params).error; };
  std::string path = hand_written_model("rank.model", 1, 0, payload(1, "w", 7));
  CHECK(error(path) == "grad: model file '" + path + "': corrupted: parameter 1 of 1 'w' has rank 7 (expected 1 .. 6)");
  path = hand_written_model("empty.model", 1, 0, payload(0, "", 1));
  CHECK(error(path) ==
        "grad: model file '" + path + "': corrupted: parameter 1 of 1 has a name of 0 bytes (expected 1 .. 4096)");
  path = hand_written_model("kind.model", 1, 2, payload(1, "w", 1));
  CHECK(error(path) == "grad: model file '" + path + "': corrupted: kind 2 in the header (a model file's kind is 0)");
  path = hand_written_model("fine.model", 1, 0, payload(1, "w", 1));
  CHECK(error(path) == "");
  CHECK(tp.value(w)[1] == 2.0);
}

TEST_CASE("convert_dtype refuses a float64 value beyond float32's range, naming the tensor; nothing loaded") {
  grad::Tape<double> t64;
  const auto big = t64.param(Tensor<double>({3}, std::vector<double>{1, -1e300, 1e300}));
  const auto fine = t64.param(Tensor<double>({1}, std::vector<double>{std::numeric_limits<double>::infinity()}));
  const std::vector<nn::NamedParameter<double>> saved = {{"fine", fine, nn::ParamKind::weight},
                                                         {"big", big, nn::ParamKind::weight}};
  const std::string path = scratch.file("big.model");
  REQUIRE(grad::save_model(path, t64, std::span<const nn::NamedParameter<double>>(saved)));
  grad::Tape<float> t32;
  const auto big32 = t32.param(Tensor<float>({3})), fine32 = t32.param(Tensor<float>({1}));
  const std::vector<nn::NamedParameter<float>> into = {{"big", big32, nn::ParamKind::weight},
                                                       {"fine", fine32, nn::ParamKind::weight}};
  const auto r = grad::load_model(path, t32, std::span<const nn::NamedParameter<float>>(into), {.convert_dtype = true});
  CHECK(r.error == "grad: model file '" + path +
                       "': convert_dtype: parameter 'big' element 1 is -1.0000000000000001e+300, beyond float32's "
                       "range (it would become infinite); nothing loaded");
  CHECK(t32.value(big32)[0] == 0.0f);
  CHECK(t32.value(fine32)[0] == 0.0f);
  // An infinity stays one: only a finite value turning infinite is refused.
  t64.leaf_value(big)[1] = -3e38;
  t64.leaf_value(big)[2] = 3e38;
  REQUIRE(grad::save_model(path, t64, std::span<const nn::NamedParameter<double>>(saved)));
  REQUIRE(grad::load_model(path, t32, std::span<const nn::NamedParameter<float>>(into), {.convert_dtype = true}));
  CHECK(std::isinf(t32.value(fine32)[0]));
  CHECK(t32.value(big32)[2] == 3e38f);
}
