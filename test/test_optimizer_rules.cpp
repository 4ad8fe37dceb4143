// The PyTorch-shaped optimizers and schedules against torch.optim in float64
// (test/oracle/optim_rules_oracle.py): AdamW, Adam's PyTorch form, SGD with
// momentum, dampening and Nesterov, every LrSchedule shape; and the
// mistakes a step refuses (non-finite gradients, no parameters, a model of
// another precision).
#include <doctest/doctest.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <grad/grad.hpp>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "golden.hpp"
#include "support.hpp"

using grad::Tensor;
using grad::testing::bitwise_equal;
using Golden = std::map<std::string, Tensor<double>>;

namespace {

// |a - b| / max(|a|, |b|), 0 for two zeros.
double relative(double a, double b) {
  const double scale = std::max(std::abs(a), std::abs(b));
  return scale == 0 ? 0 : std::abs(a - b) / scale;
}

double worst_relative(std::span<const double> got, const Tensor<double>& want) {
  double worst = got.size() == want.size() ? 0 : INFINITY;
  for (std::size_t i = 0; i < want.size() && i < got.size(); ++i) worst = std::max(worst, relative(got[i], want[i]));
  return worst;
}

// The oracle's parameters, their weight_decay (L2 for SGD and Adam,
// decoupled for AdamW, as torch's weight_decay is in each) and the step of
// their first gradient ("late": 4 for SGD, whose momentum buffer starts
// then; "unused": never).
const char* const names[] = {"w1", "b1", "w2", "late", "unused"};
const double decays[] = {0.1, 0.0, 0.05, 0.02, 0.5};
constexpr std::size_t steps = 20;

// 20 steps with the oracle's fixed gradients: loss = sum over the reached
// parameters of sum(p * G_t), whose gradient is exactly G_t. Returns the
// worst relative error of the parameters (lr sequence checked on the way).
template <class Opt>
double run_case(const Golden& g, const std::string& name, Opt opt, const grad::LrSchedule& schedule) {
  CAPTURE(name);
  const std::size_t late_first = name.starts_with("sgd") ? 4 : 1;
  grad::Tape<double> tp;
  grad::Var<double> p[5];
  for (int k = 0; k < 5; ++k) {
    p[k] = tp.param(g.at(names[k]));
    REQUIRE(opt.add(p[k], decays[k]));
  }
  opt.set_schedule(schedule);
  const Tensor<double>& lrs = g.at(name + ".lr");
  const Tensor<double>& metrics = g.at("metrics");
  const auto mark = tp.mark();
  for (std::size_t t = 1; t <= steps; ++t) {
    tp.reset_to(mark);
    grad::Var<double> loss;
    for (int k = 0; k < 4; ++k) {
      if (k == 3 && t < late_first) continue;
      const Tensor<double>& all = g.at(std::string("grad.") + names[k]);
      const std::size_t n = all.size() / steps;
      const grad::Shape shape(all.shape().begin() + 1, all.shape().end());
      std::vector<double> row(all.data().begin() + (t - 1) * n, all.data().begin() + t * n);
      auto term = grad::sum(p[k] * tp.constant(Tensor<double>(shape, row)));
      loss = k == 0 ? term : loss + term;
    }
    REQUIRE(tp.backward(loss));
    CAPTURE(t);
    CHECK(relative(opt.lr(), lrs[t - 1]) <= 1e-15);
    REQUIRE(opt.step());
    if (schedule.shape == grad::LrShape::plateau) opt.report_metric(metrics[t - 1]);
  }
  double worst = 0;
  for (int k = 0; k < 4; ++k) worst = std::max(worst, worst_relative(tp.value(p[k]).data, g.at(name + "." + names[k])));
  CHECK(bitwise_equal(tp.value(p[4]).data, g.at("unused").data()));  // never reached: untouched
  return worst;
}

void compare_rules(const Golden& g) {
  using grad::LrSchedule;
  LrSchedule plateau = LrSchedule::plateau(0.003, 0.5, 2);
  plateau.cooldown = 1;
  const double adamw = run_case(g, "adamw", grad::AdamW<double>(0.01, 0.9, 0.999, 1e-8, 0.0),
                                LrSchedule::exponential(0.01, 0.95));
  const double adam = run_case(g, "adam_pytorch", grad::Adam<double>(0.01, 0.8, 0.99, 1e-3, grad::AdamForm::pytorch),
                               LrSchedule::multi_step(0.01, {5, 12}, 0.5));
  const double sgd = run_case(g, "sgd_momentum", grad::SGD<double>(0.003, 0.9, 0.25), LrSchedule::step(0.003, 6, 0.5));
  const double nesterov = run_case(g, "sgd_nesterov", grad::SGD<double>(0.003, 0.8, 0, true), plateau);
  MESSAGE("worst relative error against torch: AdamW " << adamw << ", Adam (PyTorch form) " << adam
                                                        << ", SGD momentum " << sgd << ", Nesterov " << nesterov);
  CHECK(adamw <= 1e-15);
  CHECK(adam <= 1e-15);
  CHECK(sgd <= 1e-15);
  CHECK(nesterov <= 1e-15);
}

// The rate each of 40 steps uses, against torch's scheduler. The shapes made
// of products (step, multi-step, exponential, plateau) agree to 1e-15
// relative; those with a cosine (one-cycle, warm-up + cosine) to 1e-15 of the
// peak rate: grad's cos (detail::cos_pi, + - * / only, the same bits
// everywhere) and libm's differ by an ulp or two, and the cosine's tail,
// 1 + cos near -1, turns that into a larger relative error of a small rate.
void compare_schedules(const Golden& g) {
  using grad::LrSchedule;
  LrSchedule min_rel = LrSchedule::plateau(0.1, 0.5, 1);
  min_rel.threshold = 0.05;
  min_rel.cooldown = 2;
  min_rel.min_lr = 0.01;
  LrSchedule max_abs = LrSchedule::plateau(0.1, 0.3, 0);
  max_abs.mode = grad::PlateauMode::max;
  max_abs.threshold = 0.02;
  max_abs.threshold_mode = grad::ThresholdMode::abs;
  const std::pair<const char*, LrSchedule> cases[] = {
      {"step", LrSchedule::step(0.1, 7, 0.3)},
      {"multi_step", LrSchedule::multi_step(0.1, {3, 10, 25}, 0.2)},
      {"exponential", LrSchedule::exponential(0.1, 0.9)},
      {"one_cycle", LrSchedule::one_cycle(0.1, 40, 0.25, 20, 100)},
      {"plateau_min_rel", min_rel},
      {"plateau_max_abs", max_abs},
      {"warmup_cosine", {.base_lr = 0.1, .min_lr = 0.002, .warmup = 5, .total = 30}},
  };
  const Tensor<double>& metrics = g.at("metrics");
  for (const auto& [label, schedule] : cases) {
    const std::string name = label;
    CAPTURE(name);
    const Tensor<double>& want = g.at(std::string("schedule.") + name);
    const bool cosine = schedule.shape == grad::LrShape::one_cycle || schedule.shape == grad::LrShape::warmup_cosine;
    grad::Tape<double> tp;
    auto w = tp.param(Tensor<double>({1}, {1.0}));
    grad::SGD<double> opt(0.1);
    REQUIRE(opt.add(w));
    opt.set_schedule(schedule);
    const auto mark = tp.mark();
    double worst = 0, worst_relative_rate = 0;
    for (std::size_t t = 1; t <= want.size(); ++t) {
      worst_relative_rate = std::max(worst_relative_rate, relative(opt.lr(), want[t - 1]));
      worst = std::max(worst, cosine ? std::abs(opt.lr() - want[t - 1]) / schedule.base_lr
                                     : relative(opt.lr(), want[t - 1]));
      tp.reset_to(mark);
      REQUIRE(tp.backward(grad::sum(w)));
      REQUIRE(opt.step());
      if (schedule.shape == grad::LrShape::plateau) opt.report_metric(metrics[(t - 1) % metrics.size()]);
    }
    MESSAGE(name << ": worst error " << worst << " (relative to each rate: " << worst_relative_rate << ")");
    CHECK(worst <= 1e-15);
    // The rates really move (a check that a constant rate would fail).
    CHECK(*std::min_element(want.data().begin(), want.data().end()) < 0.5 * want[0] + 0.05);
  }
}

void compare_all(const std::string& path) {
  const Golden g = grad::testing::load_golden(path);
  compare_rules(g);
  compare_schedules(g);
}

}  // namespace

TEST_CASE("AdamW, Adam's PyTorch form, SGD momentum/Nesterov and every schedule shape match torch within 1e-15") {
  compare_all(grad::testing::oracle_dir() + "/optim_rules_golden.txt");
}

TEST_CASE("the rules oracle, run live, still agrees" * doctest::skip(!grad::testing::torch_available())) {
  char path[] = "/tmp/grad_optim_rules_XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  const std::string cmd =
      grad::testing::python() + " '" + grad::testing::oracle_dir() + "/optim_rules_oracle.py' " + path;
  REQUIRE(std::system(cmd.c_str()) == 0);
  compare_all(path);
  std::remove(path);
}
