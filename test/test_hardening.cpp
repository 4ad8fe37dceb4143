// Regression tests for the defects an outside fuzzing campaign found (shape
// overflow, stale marks, a runaway layer loop, an out-of-bounds read after
// reset_to, two concurrent savers, special files as checkpoints) and for the
// checks it found missing (optimizer settings, dropped parameters, messages,
// relu of NaN, allocation failure).
#include <doctest/doctest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <grad/device/device.hpp>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "support.hpp"

using namespace grad;
using namespace grad::testing;
namespace fs = std::filesystem;
using T = double;

namespace {

constexpr std::size_t huge = (std::size_t{1} << 63) + 3;  // 2 * huge wraps around to 6

void expect_poisoned(const Tape<T>& tp, std::initializer_list<std::string> fragments) {
  REQUIRE_FALSE(tp.ok());
  CAPTURE(tp.error());
  for (const std::string& f : fragments) CHECK(tp.error().find(f) != std::string::npos);
}

template <class F>
std::string thrown(F f) {
  try {
    f();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "no exception";
}

const ScratchDir scratch("hardening");

// A small model with an optimizer, for the checkpoint cases.
struct Model {
  Tape<T> tp;
  Var<T> w, b;
  Adam<T> opt{T(0.01)};
  explicit Model(T fill = 0.5) {
    w = tp.param(Tensor<T>::full({3, 2}, fill));
    b = tp.param(Tensor<T>::full({2}, fill));
    REQUIRE(opt.add(w, T(0.01)));
    REQUIRE(opt.add(b));
  }
  std::vector<T> state() const {
    std::vector<T> s(tp.value(w).begin(), tp.value(w).end());
    s.insert(s.end(), tp.value(b).begin(), tp.value(b).end());
    return s;
  }
};

// A good checkpoint's bytes, with a field rewritten and the checksum fixed up.
template <class V>
std::vector<unsigned char> with_field(std::size_t offset, V value) {
  Model m;
  const std::string path = scratch.file("field.ckpt");
  REQUIRE(save_checkpoint(path, m.tp, m.opt));
  auto bytes = read_bytes(path);
  std::memcpy(bytes.data() + offset, &value, sizeof value);
  const std::uint64_t hash = grad::detail::fnv1a(std::span(bytes).first(bytes.size() - 8));
  std::memcpy(bytes.data() + bytes.size() - 8, &hash, 8);
  return bytes;
}

void refused(const std::string& path, const std::string& fragment) {
  Model m(0.25);
  const auto before = m.state();
  const CheckpointResult r = load_checkpoint(path, m.tp, m.opt);
  REQUIRE_FALSE(r.ok());
  CHECK_MESSAGE(r.error.find(fragment) != std::string::npos, r.error);
  CHECK(r.error.find(path) != std::string::npos);
  CHECK(m.state() == before);
  CHECK(m.tp.ok());
}

// Header 32 bytes; payload: u64 count, u64 steps, then lr, clip, beta1, beta2, eps, b1^t, b2^t.
constexpr std::size_t payload_at = 32, lr_at = payload_at + 16, beta1_at = lr_at + 2 * sizeof(T);
// First parameter: u32 rank 2, u64 dims[2], then its l2.
constexpr std::size_t first_l2_at = payload_at + 16 + 7 * sizeof(T) + 4 + 16;

}  // namespace

// ---- 1. shape sizes that overflow ----

TEST_CASE("a shape whose element count overflows is refused before anything is allocated") {
  CHECK(checked_element_count(Shape{2, huge}) == std::nullopt);
  CHECK(checked_element_count(Shape{std::size_t{1} << 32, std::size_t{1} << 32}) == std::nullopt);  // wraps to 0
  CHECK(checked_element_count(Shape{std::size_t{1} << 32, std::size_t{1} << 32, 0}) == 0u);         // really 0
  CHECK(checked_element_count(Shape{}) == 1u);
  CHECK(checked_element_count(Shape{3, 4}) == 12u);
  CHECK(checked_element_count(Shape{max_elements}) == max_elements);
  CHECK(checked_element_count(Shape{max_elements + 1}) == std::nullopt);

  const std::string e = thrown([] { Tensor<T>({2, huge}, std::vector<T>(6, T(1))); });
  CHECK(e.find("[2, 9223372036854775811]") != std::string::npos);
  CHECK(e.find("more elements than can be stored") != std::string::npos);
  CHECK(thrown([] {
          Tensor<T> t({std::size_t{1} << 32, std::size_t{1} << 32});
        }).find("more elements") != std::string::npos);
}

TEST_CASE("reshape to a shape whose element count wraps around to the input's is refused") {
  Tape<T> tp;
  const Var<T> x = tp.param(Tensor<T>::ones({2, 3}));
  const Var<T> y = reshape(x, {2, huge});
  CHECK_FALSE(y.valid());
  expect_poisoned(tp, {"reshape", "[2, 3]", "[2, 9223372036854775811]", "overflows"});
  CHECK(tp.size() == 1);
}

TEST_CASE("any op's output shape is checked where the node is recorded, whatever the op") {
  Tape<T> tp;
  const Var<T> x = tp.param(Tensor<T>::ones({6}));
  Dims out;
  out.rank = 2;
  out.d[0] = 2;
  out.d[1] = huge;
  CHECK_FALSE(tp.record<RowSum>(x, Var<T>{}, out).valid());
  expect_poisoned(tp, {"row_sum", "output shape [2, 9223372036854775811]", "more elements"});
}

// ---- 2. stale marks ----

TEST_CASE("a stale mark poisons the tape instead of handing live memory out again") {
  Tape<T> tp;
  const Var<T> x = tp.param(Tensor<T>::ones({4}));
  const auto m1 = tp.mark();
  (void)(x * T(2));
  const auto m2 = tp.mark();
  tp.reset_to(m1);
  const Var<T> big = tp.constant(Tensor<T>::full({4096}, T(7)));
  (void)tp.constant(Tensor<T>::full({16}, T(1)));
  tp.reset_to(m2);  // m2 names a state that no longer exists
  expect_poisoned(tp, {"reset_to", "stale mark", "taken at 2 nodes"});
  (void)tp.constant(Tensor<T>::full({1024}, T(-1)));
  const View<T> v = tp.value(big);
  REQUIRE(v.size() == 4096);
  CHECK(std::all_of(v.begin(), v.end(), [](T e) { return e == T(7); }));
}

TEST_CASE("a mark stays good through resets to itself and to later marks") {
  Tape<T> tp;
  const Var<T> x = tp.param(Tensor<T>::ones({4}));
  const auto m = tp.mark();
  for (int episode = 0; episode < 3; ++episode) {
    (void)(x * T(2));
    const auto inner = tp.mark();
    (void)(x + T(1));
    tp.reset_to(inner);
    tp.reset_to(m);
    REQUIRE(tp.ok());
  }
  Tape<T> empty;
  const auto at_start = empty.mark();
  (void)empty.param(Tensor<T>::ones({2}));
  empty.reset_to(at_start);
  CHECK(empty.ok());
  CHECK(empty.size() == 0);
}

// ---- 3. gqa_attention with a head count whose width overflows ----

TEST_CASE("gqa_attention: a head count whose total width overflows is refused at once") {
  Tape<T> tp;
  const Var<T> q = tp.param(Tensor<T>::ones({2, 4})), k = tp.param(Tensor<T>::ones({2, 4}));
  const auto rope = nn::rope_tables<T>(2, 2, T(10000));
  const Var<T> cos = tp.constant(rope.cos), sin = tp.constant(rope.sin);
  const Var<T> mask = tp.constant(nn::causal_mask<T>(2));
  // n_heads * 2 wraps around to 4 = q's width: without the check the loop would run 2^63 times.
  const std::size_t heads = (std::size_t{1} << 63) + 2;
  const auto start = std::chrono::steady_clock::now();
  const Var<T> out = nn::gqa_attention(q, k, k, cos, sin, mask, heads, 1, 2);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  CHECK_FALSE(out.valid());
  expect_poisoned(tp, {"nn::gqa_attention", "overflows"});
}

// ---- 4. sync_params_to after reset_to ----

TEST_CASE("sync_params_to after a reset_to before the loss: parameters sync, dropped ones are refused") {
  Tape<T> tp;
  const Var<T> w = tp.param(Tensor<T>::full({2, 2}, T(0.5)));
  const auto after_params = tp.mark();
  const Var<T> loss = sum(matmul(w, w));
  REQUIRE(tp.backward(loss));
  auto prog = device::capture(tp, loss);
  device::SGD<T> opt(prog, T(0.1));
  opt.add(w);
  prog.forward();
  prog.backward();
  opt.step();
  const Tensor<T> trained = prog.value(w);

  tp.reset_to(after_params);  // the loss is gone, the parameter is not
  prog.sync_params_to(tp);
  CHECK(bitwise_equal<T>(tp.value(w).data, trained.data()));

  Tape<T> fresh;
  const auto at_start = fresh.mark();
  const Var<T> w2 = fresh.param(Tensor<T>::full({2, 2}, T(0.5)));
  const Var<T> loss2 = sum(w2 * w2);
  REQUIRE(fresh.backward(loss2));
  auto prog2 = device::capture(fresh, loss2);
  fresh.reset_to(at_start);  // the parameter itself is gone now
  REQUIRE(fresh.ok());
  const std::string e = thrown([&] { prog2.sync_params_to(fresh); });
  CHECK(e.find("sync_params_to") != std::string::npos);
  CHECK(e.find("capture again") != std::string::npos);
}

// ---- 5. two processes saving to one path ----

TEST_CASE("two processes saving to one path: every load finds a whole checkpoint") {
  const std::string path = scratch.file("shared.ckpt");
  {
    Model m;
    REQUIRE(save_checkpoint(path, m.tp, m.opt));
  }
  auto writer = [&](T fill) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      Model m(fill);
      int bad = 0;
      for (int i = 0; i < 150; ++i) bad += !save_checkpoint(path, m.tp, m.opt).ok();
      ::_exit(bad == 0 ? 0 : 1);
    }
    return pid;
  };
  const pid_t a = writer(T(1)), b = writer(T(2));
  REQUIRE(a > 0);
  REQUIRE(b > 0);
  int loads = 0, failures = 0;
  std::string first_failure;
  auto running = [](pid_t p) { return ::waitpid(p, nullptr, WNOHANG) == 0; };
  bool a_running = true, b_running = true;
  int status_a = 0, status_b = 0;
  while (a_running || b_running) {
    Model m;
    const CheckpointResult r = load_checkpoint(path, m.tp, m.opt);
    ++loads;
    if (!r.ok()) {
      ++failures;
      if (first_failure.empty()) first_failure = r.error;
    }
    if (a_running && ::waitpid(a, &status_a, WNOHANG) == a) a_running = false;
    if (b_running && ::waitpid(b, &status_b, WNOHANG) == b) b_running = false;
  }
  (void)running;
  CHECK(WIFEXITED(status_a));
  CHECK(WEXITSTATUS(status_a) == 0);
  CHECK(WIFEXITED(status_b));
  CHECK(WEXITSTATUS(status_b) == 0);
  CAPTURE(loads);
  CHECK_MESSAGE(failures == 0, first_failure);
  for (const auto& entry : fs::directory_iterator(scratch.dir))  // no temporary file left behind
    CHECK_MESSAGE(entry.path().string().find(".tmp") == std::string::npos, entry.path().string());
}

// ---- 6. special files ----

TEST_CASE("loading a directory, a FIFO or a device is refused by name, at once") {
  refused(scratch.dir.string(), "is a directory");
  const std::string fifo = scratch.file("pipe");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const auto start = std::chrono::steady_clock::now();
  refused(fifo, "is a FIFO");
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  ::unlink(fifo.c_str());
  if (fs::exists("/dev/zero")) refused("/dev/zero", "is a device");
}

TEST_CASE("a header that promises a payload near 2^64 bytes is reported as such, without reading it") {
  const std::string path = scratch.file("huge_payload.ckpt");
  auto bytes = read_bytes([] {
    Model m;
    const std::string p = scratch.file("good_for_header.ckpt");
    REQUIRE(save_checkpoint(p, m.tp, m.opt));
    return p;
  }());
  const std::uint64_t promised = std::numeric_limits<std::uint64_t>::max() - 30;
  std::memcpy(bytes.data() + 24, &promised, sizeof promised);
  write_bytes(path, bytes);
  refused(path, "the header promises more than 2^64");
}

// ---- missing checks: optimizer settings ----

TEST_CASE("optimizer settings out of range are refused with the setting, the value and the range") {
  CHECK(thrown([] { (void)Adam<T>(T(0.01), T(1)); }) == "adam: beta1 1 is out of range: expected 0 <= beta1 < 1");
  CHECK(thrown([] { (void)Adam<T>(T(0.01), T(0.9), T(1.5)); }).find("beta2 1.5") != std::string::npos);
  CHECK(thrown([] { (void)Adam<T>(T(0.01), T(0.9), T(0.999), T(-1)); }).find("eps -1") != std::string::npos);
  CHECK(thrown([] { (void)SGD<T>(std::nan("")); }) == "sgd: lr nan is out of range: expected a finite value >= 0");
  CHECK(thrown([] { (void)SGD<T>(-0.1); }).find("lr -0.1") != std::string::npos);
  CHECK(thrown([] { (void)SGD<float>(INFINITY); }).find("lr inf") != std::string::npos);
  SGD<T> sgd(0.1);
  CHECK(thrown([&] { sgd.set_lr(std::nan("")); }).find("sgd: lr nan") != std::string::npos);
  CHECK(thrown([&] { sgd.set_clip(-1); }).find("sgd: clip -1") != std::string::npos);
  CHECK(sgd.lr() == 0.1);
  CHECK(sgd.clip() == 0);
  CHECK(thrown([] { (void)Adam<T>(T(0.01), T(0), T(0), T(0)); }) == "no exception");  // the edges are allowed
  Tape<T> tp;
  CHECK_FALSE(sgd.add(tp.param(Tensor<T>::ones({2})), T(INFINITY)));
  expect_poisoned(tp, {"sgd.add", "l2 inf is out of range"});

  Tape<T> dt;  // the device optimizers check the same ranges
  const Var<T> w = dt.param(Tensor<T>::ones({2}));
  const Var<T> loss = sum(w * w);
  REQUIRE(dt.backward(loss));
  auto prog = device::capture(dt, loss);
  CHECK(thrown([&] { (void)device::Adam<T>(prog, T(0.1), T(1)); }) ==
        "grad::device::adam: beta1 1 is out of range: expected 0 <= beta1 < 1");
  device::SGD<T> dsgd(prog, T(0.1));
  CHECK(thrown([&] { dsgd.set_lr(std::nan("")); }).find("grad::device::sgd.set_lr: lr nan") != std::string::npos);
  CHECK(thrown([&] { dsgd.set_clip(-2); }).find("grad::device::sgd.set_clip: clip -2") != std::string::npos);
  CHECK(thrown([&] { dsgd.add(w, T(-5)); }).find("grad::device::sgd.add: l2 -5") != std::string::npos);
}

TEST_CASE("a checkpoint whose settings are out of range is refused, naming the setting") {
  const std::string path = scratch.file("settings.ckpt");
  write_bytes(path, with_field<T>(lr_at, std::nan("")));
  refused(path, "invalid setting in the file: lr nan");
  write_bytes(path, with_field<T>(beta1_at, T(1)));
  refused(path, "invalid setting in the file: beta1 1 is out of range");
  write_bytes(path, with_field<T>(first_l2_at, T(-5)));
  refused(path, "invalid setting in the file: parameter 1: l2 -5 is out of range");
}

TEST_CASE("step() refuses a parameter that reset_to dropped, for SGD and Adam, changing nothing") {
  for (int adam = 0; adam < 2; ++adam) {
    Tape<T> tp;
    const auto start = tp.mark();
    const Var<T> w = tp.param(Tensor<T>::ones({2}));
    const Var<T> kept = tp.param(Tensor<T>::ones({2}));
    (void)w;
    SGD<T> sgd(0.1);
    Adam<T> am(0.1);
    Optimizer<T>& opt = adam ? static_cast<Optimizer<T>&>(am) : sgd;
    REQUIRE(opt.add(w));
    tp.reset_to(start);  // drops both parameters
    const Var<T> other = tp.param(Tensor<T>::ones({2}));
    REQUIRE(tp.backward(sum(other * other)));
    const bool stepped = adam ? am.step() : sgd.step();
    CHECK_FALSE(stepped);
    expect_poisoned(tp, {adam ? "adam.step" : "sgd.step", "parameter 1", "dropped by reset_to"});
    CHECK(am.steps() == 0);
    CHECK(sgd.steps() == 0);
    (void)kept;
  }
}

// ---- missing checks: messages ----

TEST_CASE("a default-constructed Var as the second operand is named as such") {
  Tape<T> tp;
  (void)(tp.param(Tensor<T>::ones({2})) + Var<T>{});
  expect_poisoned(tp, {"add: operand 2 is a default-constructed Var"});
}

TEST_CASE("reshape rank errors name the input shape; concat axis errors name both shapes") {
  Tape<T> tp;
  (void)reshape(tp.param(Tensor<T>::ones({2, 3})), {1, 1, 1, 1, 1, 1, 1, 1, 6});
  expect_poisoned(tp, {"reshape", "[2, 3]", "[1, 1, 1, 1, 1, 1, 1, 1, 6]", "rank 1 to"});
  Tape<T> tp2;
  (void)concat(tp2.param(Tensor<T>::ones({2, 3})), tp2.param(Tensor<T>::ones({2, 5})), 2);
  expect_poisoned(tp2, {"concat", "axis 2", "[2, 3]", "[2, 5]"});
}

// ---- missing checks: relu(NaN) ----

TEST_CASE("relu propagates NaN forward and backward; relu(-0) is +0 with gradient 0") {
  const T nan = std::numeric_limits<T>::quiet_NaN();
  CHECK(std::isnan(Relu::forward(nan, T(0))));
  CHECK(std::isnan(Relu::backward(nan, T(0), T(1), T(0))));
  CHECK_FALSE(std::signbit(Relu::forward(T(-0.0), T(0))));
  CHECK(Relu::backward(T(-0.0), T(0), T(1), T(0)) == 0);
  CHECK(Relu::backward(T(0), T(0), T(1), T(0)) == 0);
  CHECK(Relu::forward(T(-2), T(0)) == 0);
  CHECK(Relu::backward(T(2), T(0), T(3), T(0)) == 3);

  Tape<T> tp;  // through the vectorised loops too, every position of a 37-element row
  std::vector<T> xs(37, T(-1));
  for (std::size_t i = 0; i < xs.size(); i += 5) xs[i] = nan;
  const Var<T> x = tp.param(Tensor<T>({37}, xs));
  const Var<T> y = relu(x);
  REQUIRE(tp.backward(sum(y)));
  for (std::size_t i = 0; i < xs.size(); ++i) {
    CAPTURE(i);
    CHECK(std::isnan(tp.value(y)[i]) == (i % 5 == 0));
    CHECK(std::isnan(tp.grad(x)[i]) == (i % 5 == 0));
  }
}

// ---- missing checks: allocation failure ----

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)  // sanitizer allocators abort instead
TEST_CASE("an output too large to allocate poisons the tape with its size; the tape's memory is untouched") {
  Tape<float> tp;
  const std::size_t n = std::size_t{1} << 23;
  const Var<float> col = tp.param(Tensor<float>::ones({n, 1})), row = tp.param(Tensor<float>::ones({1, n}));
  const Var<float> live = tp.constant(Tensor<float>::full({8}, 3.0f));
  const Var<float> outer = col * row;  // 2^46 elements, 256 TiB: more than any address space holds
  CHECK_FALSE(outer.valid());
  REQUIRE_FALSE(tp.ok());
  CAPTURE(tp.error());
  CHECK(tp.error().find("mul: out of memory") != std::string::npos);
  CHECK(tp.error().find("[8388608, 8388608]") != std::string::npos);
  CHECK(tp.size() == 3);
  const View<float> v = tp.value(live);
  CHECK(std::all_of(v.begin(), v.end(), [](float e) { return e == 3.0f; }));
}
#endif
