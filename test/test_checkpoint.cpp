// Checkpoints: a resumed run is bitwise the uninterrupted run; every kind of
// bad file is refused with a message naming the problem, changing nothing.
#include <doctest/doctest.h>

#include <unistd.h>
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <grad/grad.hpp>
#include <iterator>
#include <string>
#include <vector>

#include "support.hpp"

using grad::Tensor;
using grad::testing::bitwise_equal;
namespace fs = std::filesystem;

namespace {

using grad::testing::read_bytes;
using grad::testing::write_bytes;
const grad::testing::ScratchDir scratch("checkpoint");

// x [16, 3] -> tanh(x w1 + b1) [16, hidden] -> w2 [hidden, 2]; L2 on w1, clipping on.
template <class T, template <class> class Opt>
struct Run {
  grad::Tape<T> tp;
  grad::Var<T> x, target, w1, b1, w2;
  Opt<T> opt;
  typename grad::Tape<T>::Mark mark;

  explicit Run(T lr, std::size_t hidden = 5, std::uint64_t init_seed = 1) : opt(lr) {
    grad::testing::Rng data(99), init(init_seed);
    x = tp.constant(grad::testing::random_tensor<T>({16, 3}, data));
    target = tp.constant(grad::testing::random_tensor<T>({16, 2}, data, -0.5, 0.5));
    w1 = tp.param(grad::testing::random_tensor<T>({3, hidden}, init));
    b1 = tp.param(grad::testing::random_tensor<T>({hidden}, init, -0.1, 0.1));
    w2 = tp.param(grad::testing::random_tensor<T>({hidden, 2}, init));
    REQUIRE(opt.add(w1, T(0.01)));
    REQUIRE(opt.add(b1));
    REQUIRE(opt.add(w2));
    opt.set_clip(T(0.5));
    mark = tp.mark();
  }
  void train(int steps) {
    for (int i = 0; i < steps; ++i) {
      tp.reset_to(mark);
      REQUIRE(tp.backward(grad::mse(grad::matmul(grad::tanh(grad::matmul(x, w1) + b1), w2), target)));
      REQUIRE(opt.step());
    }
  }
  // Everything a load could change, for "changes nothing" checks.
  std::vector<T> state() const {
    std::vector<T> s;
    for (auto v : {w1, b1, w2}) s.insert(s.end(), tp.value(v).begin(), tp.value(v).end());
    for (const auto& e : opt.params()) s.push_back(e.l2);
    s.push_back(opt.lr());
    s.push_back(opt.clip());
    s.push_back(static_cast<T>(opt.steps()));
    if constexpr (requires { opt.first_moments(); }) {
      s.insert(s.end(), opt.first_moments().begin(), opt.first_moments().end());
      s.insert(s.end(), opt.second_moments().begin(), opt.second_moments().end());
      s.push_back(opt.beta1_power());
      s.push_back(opt.beta2_power());
    }
    return s;
  }
};

template <class T, template <class> class Opt>
void resume_is_bitwise(const std::string& path) {
  Run<T, Opt> straight(T(0.05));
  straight.train(20);

  Run<T, Opt> first(T(0.05));
  first.train(10);
  REQUIRE(grad::save_checkpoint(path, first.tp, first.opt).ok());
  CHECK_FALSE(fs::exists(path + ".tmp"));  // renamed into place

  // A fresh tape with different initial weights and an optimizer built with
  // a different rate and no clipping: the checkpoint restores all of it.
  Run<T, Opt> resumed(T(0.5), 5, 12345);
  resumed.opt.set_clip(T(0));
  const auto r = grad::load_checkpoint(path, resumed.tp, resumed.opt);
  REQUIRE_MESSAGE(r.ok(), r.error);
  CHECK(bitwise_equal<T>(resumed.state(), first.state()));
  resumed.train(10);
  CHECK(resumed.opt.steps() == 20);
  CHECK(bitwise_equal<T>(resumed.state(), straight.state()));
}

}  // namespace

TEST_CASE("Adam: train 10, save, load into a fresh tape and optimizer, train 10 == 20 uninterrupted, bitwise") {
  resume_is_bitwise<double, grad::Adam>(scratch.file("adam64.ckpt"));
  resume_is_bitwise<float, grad::Adam>(scratch.file("adam32.ckpt"));
}

TEST_CASE("SGD: the same promise") { resume_is_bitwise<double, grad::SGD>(scratch.file("sgd64.ckpt")); }

TEST_CASE("saving over an existing checkpoint replaces it whole") {
  const std::string path = scratch.file("replace.ckpt");
  Run<double, grad::Adam> a(0.05);
  a.train(3);
  REQUIRE(grad::save_checkpoint(path, a.tp, a.opt).ok());
  const auto first = read_bytes(path);
  a.train(3);
  REQUIRE(grad::save_checkpoint(path, a.tp, a.opt).ok());
  CHECK(read_bytes(path).size() == first.size());
  CHECK(read_bytes(path) != first);
}

TEST_CASE("saving into a directory that does not exist fails with a message") {
  Run<double, grad::Adam> a(0.05);
  const std::string path = scratch.file("no/such/dir/x.ckpt");
  const auto r = grad::save_checkpoint(path, a.tp, a.opt);
  CHECK_FALSE(r.ok());
  CHECK(r.error.find("cannot create a temporary file '" + path + ".tmp.") != std::string::npos);
}

// ---- bad files: a clear message, and nothing changes ----

namespace {

// A valid 5-step Adam checkpoint's bytes.
std::vector<unsigned char> good_file() {
  const std::string path = scratch.file("good.ckpt");
  Run<double, grad::Adam> a(0.05);
  a.train(5);
  REQUIRE(grad::save_checkpoint(path, a.tp, a.opt).ok());
  return read_bytes(path);
}

// Loads `path` into a run trained 2 steps and checks the message and that
// nothing changed.
template <class T = double, template <class> class Opt = grad::Adam>
void refused(const std::string& path, const std::string& expected_message, std::size_t hidden = 5) {
  Run<T, Opt> target(T(0.05), hidden, 77);
  target.train(2);
  const auto before = target.state();
  const auto r = grad::load_checkpoint(path, target.tp, target.opt);
  CHECK_FALSE(r.ok());
  CHECK_MESSAGE(r.error.find(expected_message) != std::string::npos, r.error);
  CHECK(r.error.find("grad: checkpoint '" + path + "': ") == 0);
  CHECK(bitwise_equal<T>(target.state(), before));
}

}  // namespace

TEST_CASE("a missing file is refused") {
  refused(scratch.file("missing.ckpt"), "cannot open: No such file or directory");
}

TEST_CASE("a truncated file is refused") {
  const auto bytes = good_file();
  const std::string path = scratch.file("truncated.ckpt");
  write_bytes(path, {bytes.begin(), bytes.end() - 9});
  refused(path, "truncated: " + std::to_string(bytes.size() - 9) + " bytes, the header promises " +
                    std::to_string(bytes.size()));
  write_bytes(path, {bytes.begin(), bytes.begin() + 20});
  refused(path, "truncated: 20 bytes, shorter than the 32-byte header");
  write_bytes(path, {});
  refused(path, "truncated: 0 bytes");
}

TEST_CASE("a corrupted file fails its checksum") {
  auto bytes = good_file();
  const std::string path = scratch.file("corrupt.ckpt");
  bytes[bytes.size() / 2] ^= 0x10;  // one bit in the middle of the values
  write_bytes(path, bytes);
  refused(path, "checksum mismatch: the file is corrupted");
}

TEST_CASE("trailing bytes after the checksum are refused") {
  auto bytes = good_file();
  bytes.push_back(0);
  const std::string path = scratch.file("trailing.ckpt");
  write_bytes(path, bytes);
  refused(path, "corrupted: 1 unexpected bytes after the checksum");
}

TEST_CASE("a file that is not a checkpoint is refused") {
  auto bytes = good_file();
  std::memcpy(bytes.data(), "NOTACKPT", 8);
  const std::string path = scratch.file("magic.ckpt");
  write_bytes(path, bytes);
  refused(path, "not a grad checkpoint (bad magic bytes)");
}

TEST_CASE("an unknown format version is refused") {
  auto bytes = good_file();
  const std::uint32_t version = 4;
  std::memcpy(bytes.data() + 8, &version, 4);
  const std::string path = scratch.file("version.ckpt");
  write_bytes(path, bytes);
  refused(path, "unsupported format version 4; this build reads version 1 to 3");
}

TEST_CASE("a float32 checkpoint does not load into a float64 tape") {
  const std::string path = scratch.file("f32.ckpt");
  Run<float, grad::Adam> f(0.05f);
  f.train(2);
  REQUIRE(grad::save_checkpoint(path, f.tp, f.opt).ok());
  refused(path, "dtype mismatch: the file holds float32 values, the tape is float64");
}

TEST_CASE("SGD state does not load into Adam") {
  const std::string path = scratch.file("sgd.ckpt");
  Run<double, grad::SGD> s(0.05);
  REQUIRE(grad::save_checkpoint(path, s.tp, s.opt).ok());
  refused(path, "optimizer mismatch: the file holds sgd state, loading into adam");
}

TEST_CASE("mismatched shapes are refused, naming the parameter and both shapes") {
  write_bytes(scratch.file("shapes.ckpt"), good_file());
  refused(scratch.file("shapes.ckpt"), "shape mismatch: parameter 1 is [3, 5] in the file but [3, 4] in the optimizer",
          4);
}

TEST_CASE("a different parameter count is refused") {
  write_bytes(scratch.file("count.ckpt"), good_file());
  Run<double, grad::Adam> target(0.05);
  auto extra = target.tp.param(Tensor<double>({2}, {1, 2}));
  // A fourth parameter: the optimizer's list no longer matches the file's three.
  REQUIRE(target.opt.add(extra));
  const auto before = target.state();
  const auto r = grad::load_checkpoint(scratch.file("count.ckpt"), target.tp, target.opt);
  CHECK(r.error.find("parameter count mismatch: the file holds 3 parameters, the optimizer has 4") !=
        std::string::npos);
  CHECK(bitwise_equal<double>(target.state(), before));
}

// The schedule is in the file (format version 3): a fresh optimizer continues
// it from the restored step count whether or not the same one is attached
// again (before loading: the file's replaces it; after: it restarts nothing,
// a warm-up/cosine schedule being a function of the step count).
TEST_CASE("a resumed run continues its learning-rate schedule at the restored step, bitwise, without re-attaching") {
  const grad::LrSchedule schedule{.base_lr = 0.08, .min_lr = 0.004, .warmup = 4, .total = 16};
  auto check = [&](auto tag, const std::string& path) {
    using T = decltype(tag);
    // 20 steps: through the warm-up, the decay and 4 steps of the constant tail.
    Run<T, grad::Adam> straight(T(0.05));
    straight.opt.set_schedule(schedule);
    straight.train(20);

    Run<T, grad::Adam> first(T(0.05));
    first.opt.set_schedule(schedule);
    first.train(10);
    CHECK(first.opt.lr() == static_cast<T>(schedule.at(11)));
    REQUIRE(grad::save_checkpoint(path, first.tp, first.opt).ok());

    for (bool attach_before : {true, false}) {
      CAPTURE(attach_before);
      Run<T, grad::Adam> resumed(T(0.5), 5, 12345);
      if (attach_before) resumed.opt.set_schedule(schedule);
      const auto r = grad::load_checkpoint(path, resumed.tp, resumed.opt);
      REQUIRE_MESSAGE(r.ok(), r.error);
      if (!attach_before) resumed.opt.set_schedule(schedule);
      CHECK(resumed.opt.steps() == 10);
      CHECK(resumed.opt.lr() == static_cast<T>(schedule.at(11)));
      resumed.train(10);
      CHECK(bitwise_equal<T>(resumed.state(), straight.state()));
    }
    // Without the schedule re-attached, the file's schedule continues.
    Run<T, grad::Adam> plain(T(0.5), 5, 12345);
    REQUIRE(grad::load_checkpoint(path, plain.tp, plain.opt).ok());
    REQUIRE(plain.opt.schedule().has_value());
    CHECK(*plain.opt.schedule() == schedule);
    CHECK(plain.opt.lr() == static_cast<T>(schedule.at(11)));
    plain.train(10);
    CHECK(bitwise_equal<T>(plain.state(), straight.state()));
  };
  check(double{}, scratch.file("schedule64.ckpt"));
  check(float{}, scratch.file("schedule32.ckpt"));
}

TEST_CASE("notes: saved with the state (format version 2 only then), checked on load before anything is written") {
  Run<double, grad::Adam> a(0.05);
  a.train(5);
  const std::string plain = scratch.file("plain.ckpt"), noted = scratch.file("noted.ckpt");
  REQUIRE(grad::save_checkpoint(plain, a.tp, a.opt).ok());
  const grad::CheckpointNote notes[] = {{"grad.dist.shards", 6}, {"grad.dist.combine", 2}};
  REQUIRE(grad::save_checkpoint(noted, a.tp, a.opt, notes).ok());
  std::uint32_t version = 0;
  std::memcpy(&version, read_bytes(plain).data() + 8, 4);
  CHECK(version == 1);  // an ordinary checkpoint keeps the format older builds read
  std::memcpy(&version, read_bytes(noted).data() + 8, 4);
  CHECK(version == 2);

  const grad::CheckpointNote same[] = {{"grad.dist.shards", 6}};
  const grad::CheckpointNote other[] = {{"grad.dist.shards", 8}};
  const grad::CheckpointNote absent[] = {{"not.in.the.file", 3}};
  {
    Run<double, grad::Adam> b(0.05, 5, 77);
    const auto before = b.state();
    const auto r = grad::load_checkpoint(noted, b.tp, b.opt, other);
    CHECK(r.error ==
          "grad: checkpoint '" + noted + "': the file was written with grad.dist.shards = 6; this run has 8");
    CHECK(bitwise_equal<double>(b.state(), before));
  }
  for (const std::string& path : {noted, plain})
    for (std::span<const grad::CheckpointNote> expect :
         {std::span<const grad::CheckpointNote>(same), std::span<const grad::CheckpointNote>(absent)}) {
      Run<double, grad::Adam> c(0.05, 5, 77);
      const auto r = grad::load_checkpoint(path, c.tp, c.opt, expect);
      REQUIRE_MESSAGE(r.ok(), r.error);
      CHECK(bitwise_equal<double>(c.state(), a.state()));
    }
}

// ---- format version 3: momentum SGD, Adam's PyTorch form, AdamW, every schedule shape ----

namespace {

// A small run with any optimizer configuration; the loss is reported to a
// plateau schedule after every step, so its counters move.
template <class Opt>
struct AnyRun {
  grad::Tape<double> tp;
  grad::Var<double> x, target, w1, b1, w2;
  Opt opt;
  grad::Tape<double>::Mark mark;

  AnyRun(Opt o, const grad::LrSchedule& schedule, std::uint64_t init_seed = 1) : opt(std::move(o)) {
    grad::testing::Rng data(99), init(init_seed);
    x = tp.constant(grad::testing::random_tensor<double>({16, 3}, data));
    target = tp.constant(grad::testing::random_tensor<double>({16, 2}, data, -0.5, 0.5));
    w1 = tp.param(grad::testing::random_tensor<double>({3, 5}, init));
    b1 = tp.param(grad::testing::random_tensor<double>({5}, init, -0.1, 0.1));
    w2 = tp.param(grad::testing::random_tensor<double>({5, 2}, init));
    REQUIRE(opt.add(w1, 0.01));
    REQUIRE(opt.add(b1, 0.0));
    REQUIRE(opt.add(w2, 0.02));
    opt.set_schedule(schedule);
    mark = tp.mark();
  }
  void train(int steps) {
    for (int i = 0; i < steps; ++i) {
      tp.reset_to(mark);
      auto loss = grad::mse(grad::matmul(grad::tanh(grad::matmul(x, w1) + b1), w2), target);
      REQUIRE(tp.backward(loss));
      REQUIRE(opt.step());
      if (opt.schedule()->shape == grad::LrShape::plateau) opt.report_metric(tp.scalar(loss) > 0.3 ? 1.0 : 2.0);
    }
  }
  std::vector<double> state() const {
    std::vector<double> s;
    for (auto v : {w1, b1, w2}) s.insert(s.end(), tp.value(v).begin(), tp.value(v).end());
    s.push_back(opt.lr());
    return s;
  }
};

template <class Opt>
void resume_matches_straight(const Opt& config, const grad::LrSchedule& schedule, const std::string& path) {
  AnyRun<Opt> straight(config, schedule);
  straight.train(16);
  AnyRun<Opt> first(config, schedule);
  first.train(7);
  REQUIRE(grad::save_checkpoint(path, first.tp, first.opt).ok());
  std::uint32_t version = 0;
  std::memcpy(&version, read_bytes(path).data() + 8, 4);
  CHECK(version == 3);
  // A fresh optimizer with no schedule, other weights: the file brings it all.
  Opt fresh = config;
  AnyRun<Opt> resumed(fresh, grad::LrSchedule{.base_lr = 0.5, .min_lr = 0, .warmup = 0, .total = 3}, 777);
  const auto r = grad::load_checkpoint(path, resumed.tp, resumed.opt);
  REQUIRE_MESSAGE(r.ok(), r.error);
  CHECK(*resumed.opt.schedule() == schedule);
  CHECK(resumed.opt.plateau_state() == first.opt.plateau_state());
  resumed.train(9);
  CHECK(bitwise_equal<double>(resumed.state(), straight.state()));
  CHECK(resumed.opt.plateau_state() == straight.opt.plateau_state());
}

}  // namespace

TEST_CASE("save after k steps and resume == the straight run, bitwise: momentum SGD, PyTorch-form Adam, AdamW, "
          "every schedule shape") {
  grad::LrSchedule plateau = grad::LrSchedule::plateau(0.05, 0.5, 1);
  plateau.cooldown = 1;
  const grad::LrSchedule schedules[] = {
      {.base_lr = 0.05, .min_lr = 0.001, .warmup = 3, .total = 12},
      grad::LrSchedule::step(0.05, 4, 0.5),
      grad::LrSchedule::multi_step(0.05, {3, 9, 11}, 0.3),
      grad::LrSchedule::exponential(0.05, 0.9),
      grad::LrSchedule::one_cycle(0.05, 14),
      plateau,
  };
  for (const grad::LrSchedule& s : schedules) {
    CAPTURE(static_cast<int>(s.shape));
    resume_matches_straight(grad::SGD<double>(0.05, 0.9, 0.1), s, scratch.file("v3_sgd.ckpt"));
    resume_matches_straight(grad::SGD<double>(0.05, 0.9, 0, true), s, scratch.file("v3_nesterov.ckpt"));
    resume_matches_straight(grad::Adam<double>(0.05, 0.9, 0.999, 1e-3, grad::AdamForm::pytorch), s,
                            scratch.file("v3_adam.ckpt"));
    resume_matches_straight(grad::AdamW<double>(0.05, 0.9, 0.999, 1e-3, 0.1), s, scratch.file("v3_adamw.ckpt"));
  }
  // The plateau case really reduced its rate before the save and after.
  AnyRun<grad::SGD<double>> run(grad::SGD<double>(0.05, 0.9), plateau);
  run.train(16);
  CHECK(run.opt.plateau_state().lr < 0.05 * 0.5);
}

TEST_CASE("a version 3 file with a schedule out of range, or of another optimizer kind, is refused, changing nothing") {
  const grad::LrSchedule s = grad::LrSchedule::exponential(0.05, 0.9);
  AnyRun<grad::AdamW<double>> saved(grad::AdamW<double>(0.05), s);
  saved.train(3);
  const std::string path = scratch.file("v3_bad.ckpt");
  REQUIRE(grad::save_checkpoint(path, saved.tp, saved.opt).ok());

  AnyRun<grad::Adam<double>> adam(grad::Adam<double>(0.05), s, 5);
  const auto before = adam.state();
  const auto kind = grad::load_checkpoint(path, adam.tp, adam.opt);
  CHECK(kind.error.find("optimizer mismatch: the file holds adamw state, loading into adam") != std::string::npos);
  CHECK(bitwise_equal<double>(adam.state(), before));

  // gamma 2 in the schedule record (the file's last 0.9: beta1 comes
  // earlier), checksum recomputed: refused by the range check, not the hash.
  std::vector<unsigned char> bytes = read_bytes(path);
  const double gamma = 0.9, bad = 2.0;
  const auto at = std::find_end(bytes.begin(), bytes.end(), reinterpret_cast<const unsigned char*>(&gamma),
                              reinterpret_cast<const unsigned char*>(&gamma) + 8);
  REQUIRE(at != bytes.end());
  std::memcpy(&*at, &bad, 8);
  const std::uint64_t hash = grad::detail::fnv1a(std::span(bytes).first(bytes.size() - 8));
  std::memcpy(bytes.data() + bytes.size() - 8, &hash, 8);
  write_bytes(path, bytes);
  AnyRun<grad::AdamW<double>> target(grad::AdamW<double>(0.05), s, 5);
  const auto before_w = target.state();
  const auto r = grad::load_checkpoint(path, target.tp, target.opt);
  CHECK(r.error.find("invalid setting in the file: schedule: gamma 2 is out of range: expected 0 < gamma <= 1") !=
        std::string::npos);
  CHECK(bitwise_equal<double>(target.state(), before_w));
}

TEST_CASE("a resealed float checkpoint whose schedule is not finite as float, or whose steps would wrap, is refused") {
  // A cosine without warm-up: at(steps + 1) with steps = 2^64 - 1 is at(0), 0 / 0.
  const grad::LrSchedule schedule{.base_lr = 0.08, .min_lr = 0.004, .warmup = 0, .total = 16};
  Run<float, grad::Adam> saved(0.05f);
  saved.opt.set_schedule(schedule);
  saved.train(3);
  const std::string path = scratch.file("reseal32.ckpt");
  REQUIRE(grad::save_checkpoint(path, saved.tp, saved.opt).ok());
  const std::vector<unsigned char> good = read_bytes(path);
  auto reseal = [&](std::vector<unsigned char> bytes) {
    const std::uint64_t hash = grad::detail::fnv1a(std::span(bytes).first(bytes.size() - 8));
    std::memcpy(bytes.data() + bytes.size() - 8, &hash, 8);
    write_bytes(path, bytes);
  };
  auto refused = [&](const std::string& message) {
    Run<float, grad::Adam> target(0.05f, 5, 7);
    target.opt.set_schedule(schedule);
    const auto before = target.state();
    const auto r = grad::load_checkpoint(path, target.tp, target.opt);
    CAPTURE(r.error);
    CHECK(r.error.find("invalid setting in the file: " + message) != std::string::npos);
    CHECK(bitwise_equal<float>(target.state(), before));
    CHECK(std::isfinite(target.opt.lr()));
  };
  // base_lr (the schedule record's f64; the float file's other rates are f32)
  // finite as a double, infinite as the float optimizer's rate.
  for (const double bad : {1e300, 3.5e38}) {
    CAPTURE(bad);
    std::vector<unsigned char> bytes = good;
    const double base = 0.08;
    const auto at = std::search(bytes.begin(), bytes.end(), reinterpret_cast<const unsigned char*>(&base),
                                reinterpret_cast<const unsigned char*>(&base) + 8);
    REQUIRE(at != bytes.end());
    std::memcpy(&*at, &bad, 8);
    reseal(bytes);
    char number[32];
    std::snprintf(number, sizeof number, "%.17g", bad);
    refused(std::string("schedule: base_lr ") + number +
            " is inf as float32, out of range: expected a finite value >= 0");
  }
  // steps 2^64 - 1: the next step's rate would be at(0) and the count would wrap.
  std::vector<unsigned char> bytes = good;
  std::uint64_t steps = 0;
  std::memcpy(&steps, bytes.data() + grad::detail::checkpoint_header_bytes + 8, 8);
  REQUIRE(steps == 3);
  steps = ~std::uint64_t(0);
  std::memcpy(bytes.data() + grad::detail::checkpoint_header_bytes + 8, &steps, 8);
  reseal(bytes);
  refused("steps 18446744073709551615 is out of range: expected steps < 2^53 (9007199254740992)");
  // The good file still loads.
  write_bytes(path, good);
  Run<float, grad::Adam> fine(0.05f, 5, 7);
  REQUIRE(grad::load_checkpoint(path, fine.tp, fine.opt).ok());
  CHECK(fine.opt.lr() == static_cast<float>(schedule.at(4)));
}
