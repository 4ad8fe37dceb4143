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
  INFO("worst relative error against torch: AdamW " << adamw << ", Adam (PyTorch form) " << adam
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
    INFO(name << ": worst error " << worst << " (relative to each rate: " << worst_relative_rate << ")");
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

// ---- mistakes a step refuses ----

namespace {

// Two parameters; the second's gradient is `bad` at element 3.
struct NonFiniteRun {
  grad::Tape<double> tp;
  grad::Var<double> a, b;
  grad::Tape<double>::Mark mark;
  NonFiniteRun() {
    a = tp.param(Tensor<double>({2}, {0.5, -0.5}));
    b = tp.param(Tensor<double>({2, 3}, {1, 2, 3, 4, 5, 6}));
    mark = tp.mark();
  }
  bool backward(double bad) {
    tp.reset_to(mark);
    const auto cb = tp.constant(Tensor<double>({2, 3}, {1, 1, 1, bad, 1, 1}));
    return tp.backward(grad::sum(a * a) + grad::sum(b * cb));
  }
  std::vector<double> values() const {
    std::vector<double> v(tp.value(a).begin(), tp.value(a).end());
    v.insert(v.end(), tp.value(b).begin(), tp.value(b).end());
    return v;
  }
};

template <class Opt>
void refuses_non_finite(Opt opt, const std::string& kind, double bad) {
  CAPTURE(kind);
  CAPTURE(bad);
  NonFiniteRun run;
  REQUIRE(opt.add(run.a));
  REQUIRE(opt.add(run.b));
  REQUIRE(run.backward(1.0));
  REQUIRE(opt.step());  // a healthy step first: moments and buffers are non-zero
  const std::vector<double> before = run.values();
  REQUIRE(run.backward(bad));
  CHECK_FALSE(opt.step());
  CHECK(bitwise_equal<double>(run.values(), before));
  CHECK(opt.steps() == 1);
  const std::string value = bad != bad ? "nan" : bad > 0 ? "inf" : "-inf";
  CHECK(run.tp.error() == "grad: " + kind + ".step: parameter 2 (node 1, shape [2, 3]) has a non-finite gradient " +
                              "(element 3 is " + value +
                              "); no parameter was updated (tp.detect_anomalies(true) names the first op that "
                              "makes a NaN or inf; opt.set_nonfinite(grad::NonFinite::skip) skips such steps "
                              "instead)");
}

}  // namespace

TEST_CASE("a NaN or infinite gradient: step() refuses, naming the parameter and its shape, and changes nothing") {
  for (const double bad : {NAN, INFINITY, -INFINITY}) {
    refuses_non_finite(grad::SGD<double>(0.1), "sgd", bad);
    refuses_non_finite(grad::SGD<double>(0.1, 0.9), "sgd", bad);
    refuses_non_finite(grad::Adam<double>(0.1), "adam", bad);
    refuses_non_finite(grad::AdamW<double>(0.1), "adamw", bad);
    // Before any step: the moments stay zero.
    NonFiniteRun run;
    grad::Adam<double> opt(0.1);
    REQUIRE(opt.add(run.a));
    REQUIRE(opt.add(run.b));
    REQUIRE(run.backward(bad));
    CHECK_FALSE(opt.step());
    CHECK(run.tp.error().find("has a non-finite gradient") != std::string::npos);
    CHECK(std::all_of(opt.first_moments().begin(), opt.first_moments().end(), [](double m) { return m == 0; }));
  }
}

TEST_CASE("NonFinite::skip: the step is skipped and counted, nothing changes, the next finite step runs") {
  NonFiniteRun run;
  grad::SGD<double> opt(0.1, 0.9, 0.5);
  opt.set_nonfinite(grad::NonFinite::skip);
  REQUIRE(opt.add(run.a));
  REQUIRE(opt.add(run.b));
  const std::vector<double> before = run.values();
  REQUIRE(run.backward(NAN));
  CHECK_FALSE(opt.step());
  CHECK(run.tp.ok());
  CHECK(opt.skipped_steps() == 1);
  CHECK(opt.steps() == 0);
  CHECK(bitwise_equal<double>(run.values(), before));
  // The skipped step did not start the momentum buffers: the next step is a
  // first step (buffer = gradient), as if the skipped one never happened.
  REQUIRE(run.backward(1.0));
  CHECK(opt.step());
  CHECK(opt.steps() == 1);
  CHECK(opt.momentum_buffers()[0] == 2 * 0.5);  // d(a*a)/da = 2a, unscaled by 1 - dampening
}

TEST_CASE("step() of an optimizer with no parameters throws, naming the optimizer") {
  grad::SGD<double> sgd(0.1);
  CHECK_THROWS_WITH_AS(sgd.step(),
                       "grad: sgd.step: the optimizer has no parameters; add them first (opt.add(param) or "
                       "grad::nn::add_parameters(opt, model))",
                       std::logic_error);
  grad::AdamW<float> adamw(0.1f);
  CHECK_THROWS_WITH_AS(adamw.step(),
                       "grad: adamw.step: the optimizer has no parameters; add them first (opt.add(param) or "
                       "grad::nn::add_parameters(opt, model))",
                       std::logic_error);
  CHECK(adamw.steps() == 0);
}

TEST_CASE("settings out of range are refused by name, changing nothing") {
  using grad::LrSchedule;
  CHECK_THROWS_WITH_AS(grad::SGD<double>(0.1, 0, 0, true),
                       "sgd: Nesterov momentum requires momentum > 0 and dampening 0, got momentum 0 and dampening 0",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(grad::SGD<double>(0.1, 0.9, 0.5, true),
                       "sgd: Nesterov momentum requires momentum > 0 and dampening 0, got momentum 0.90000000000000002 "
                       "and dampening 0.5",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(grad::SGD<double>(0.1, -1), "sgd: momentum -1 is out of range: expected a finite value >= 0",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(grad::SGD<double>(0.1, 0.9, 2), "sgd: dampening 2 is out of range: expected 0 <= dampening <= 1",
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(grad::AdamW<double>(0.1, 0.9, 0.999, 1e-8, -0.01),
                       "adamw: weight_decay -0.01 is out of range: expected a finite value >= 0", std::invalid_argument);
  CHECK_THROWS_WITH_AS(grad::Adam<double>(0.1, 0.9, 0.999, 1e-8, static_cast<grad::AdamForm>(7)),
                       "adam: form 7 is not an AdamForm", std::invalid_argument);

  grad::Tape<double> tp;
  auto w = tp.param(Tensor<double>({2}, {1, 2}));
  grad::AdamW<double> adamw(0.1);
  CHECK_FALSE(adamw.add(w, -1.0));
  CHECK(tp.error() == "grad: adamw.add: parameter 1: weight_decay -1 is out of range: expected a finite value >= 0");
  CHECK(adamw.params().empty());
  // Through the base class, too, AdamW's coefficient is its decoupled decay.
  grad::Tape<double> tp2;
  auto u = tp2.param(Tensor<double>({2}, {1, 2})), v = tp2.param(Tensor<double>({2}, {1, 2}));
  grad::AdamW<double> adamw2(0.1);
  grad::Optimizer<double>& base = adamw2;
  REQUIRE(base.add(u));
  REQUIRE(base.add(v, 0.5));
  CHECK(adamw2.params()[0].weight_decay == 0.01);
  CHECK(adamw2.params()[1].weight_decay == 0.5);
  CHECK(adamw2.params()[0].l2 == 0);
  CHECK(adamw2.params()[1].l2 == 0);

  grad::SGD<double> sgd(0.1);
  const std::pair<LrSchedule, const char*> bad[] = {
      {LrSchedule::step(0.1, 0), "sgd.set_schedule: step_size 0 is out of range: expected step_size >= 1"},
      {LrSchedule::step(0.1, 3, 0), "sgd.set_schedule: gamma 0 is out of range: expected 0 < gamma <= 1 (a decay factor)"},
      {LrSchedule::exponential(0.1, 1.5),
       "sgd.set_schedule: gamma 1.5 is out of range: expected 0 < gamma <= 1 (a decay factor)"},
      {LrSchedule::multi_step(0.1, {5, 5}),
       "sgd.set_schedule: milestones are out of order: 5 after 5; expected strictly ascending steps"},
      {LrSchedule::one_cycle(0.1, 10, 1.0), "sgd.set_schedule: pct_start 1 is out of range: expected 0 < pct_start < 1"},
      {LrSchedule::one_cycle(0.1, 3, 0.3),
       "sgd.set_schedule: pct_start * total is 0.900000: expected more than 1 step of warm-up"},
      {LrSchedule::one_cycle(0.1, 10, 0.3, 0.5),
       "sgd.set_schedule: div_factor 0.5 is out of range: expected a finite value >= 1"},
      {LrSchedule::plateau(0.1, 1.0), "sgd.set_schedule: factor 1 is out of range: expected 0 <= factor < 1"},
  };
  for (const auto& [schedule, message] : bad) {
    CHECK_THROWS_WITH_AS(sgd.set_schedule(schedule), message, std::invalid_argument);
    CHECK_FALSE(sgd.schedule().has_value());
  }

  // report_metric: only with a plateau schedule, only finite metrics.
  CHECK_THROWS_WITH_AS(sgd.report_metric(1.0),
                       "grad: sgd.report_metric: the optimizer has no reduce-on-plateau schedule (LrShape::plateau)",
                       std::logic_error);
  sgd.set_schedule(LrSchedule::plateau(0.1, 0.5, 0));
  sgd.report_metric(1.0);
  const grad::PlateauState state = sgd.plateau_state();
  CHECK_THROWS_WITH_AS(sgd.report_metric(NAN), "grad: sgd.report_metric: metric nan is out of range: expected a finite value",
                       std::invalid_argument);
  CHECK(sgd.plateau_state() == state);
  sgd.report_metric(2.0);  // worse, patience 0: halved
  CHECK(sgd.lr() == 0.05);
}

// grad::Adam opt(0.005) is Adam<double>; with a float model the mistake is
// a compile error that names it, at the user's line (compiled here with the
// compiler meson uses, when the test has it).
TEST_CASE("an optimizer of another precision than the model: a compile error that says what to write") {
  static_assert(std::is_same_v<decltype(grad::Adam(0.005f)), grad::Adam<float>>);
  static_assert(std::is_same_v<decltype(grad::AdamW(0.005f)), grad::AdamW<float>>);
  static_assert(std::is_same_v<decltype(grad::SGD(0.1f, 0.9f)), grad::SGD<float>>);
  static_assert(std::is_same_v<decltype(grad::Adam(0.005)), grad::Adam<double>>);
  const char* cxx = std::getenv("GRAD_EMIT_CXX");
  const char* include = std::getenv("GRAD_EMIT_INCLUDE");
  if (!cxx || !include) {
    MESSAGE("GRAD_EMIT_CXX / GRAD_EMIT_INCLUDE not set: the compile-error check is skipped");
    return;
  }
  const grad::testing::ScratchDir dir("optim_precision");
  const std::string source = dir.file("float_model.cpp"), log = dir.file("log.txt");
  for (const std::string& call : {std::string("grad::nn::add_parameters(opt, model);"),
                                  std::string("opt.add(model.parameters()[0].var);")}) {
    CAPTURE(call);
    {
      std::FILE* f = std::fopen(source.c_str(), "w");
      REQUIRE(f);
      std::fprintf(f,
                   "#include <grad/modules.hpp>\n#include <grad/opt.hpp>\nint main() {\n"
                   "  grad::Tape<float> tp;\n  grad::SplitMix64 gen(1);\n"
                   "  auto model = grad::nn::mlp<float>(tp, {4, 3}, gen);\n"
                   "  grad::Adam opt(0.005);\n  %s\n}\n",
                   call.c_str());
      std::fclose(f);
    }
    const std::string cmd = std::string(cxx) + " -std=c++20 -fsyntax-only -I'" + include + "' '" + source + "' > '" +
                            log + "' 2>&1";
    CHECK(std::system(cmd.c_str()) != 0);
    const std::vector<unsigned char> bytes = grad::testing::read_bytes(log);
    const std::string out(bytes.begin(), bytes.end());
    CHECK(out.find("declare grad::Adam<float> opt(0.005f)") != std::string::npos);
    CHECK(out.find("float_model.cpp:8") != std::string::npos);  // the user's line, in "required from here"
  }
}

TEST_CASE("momentum SGD, Nesterov, Adam's PyTorch form and AdamW: the same bits on one thread and on three") {
  // Large enough (> 2 * elementwise_grain elements) that the update loops are split over the pool.
  auto run = [](std::size_t threads) {
    grad::set_num_threads(threads);
    grad::testing::Rng rng(23);
    grad::Tape<double> tp;
    grad::Var<double> w[4];
    for (auto& v : w) v = tp.param(grad::testing::random_tensor<double>({300, 300}, rng));
    grad::SGD<double> momentum(0.05, 0.9, 0.1);
    grad::SGD<double> nesterov(0.05, 0.9, 0, true);
    grad::Adam<double> adam(0.01, 0.9, 0.999, 1e-8, grad::AdamForm::pytorch);
    grad::AdamW<double> adamw(0.01);
    REQUIRE(momentum.add(w[0], 1e-3));
    REQUIRE(nesterov.add(w[1], 1e-3));
    REQUIRE(adam.add(w[2], 1e-3));
    REQUIRE(adamw.add(w[3]));
    adamw.set_clip(10.0);
    const auto m = tp.mark();
    for (int step = 0; step < 3; ++step) {
      tp.reset_to(m);
      REQUIRE(tp.backward(grad::sum(grad::tanh(w[0]) * w[1]) + grad::sum(grad::tanh(w[2]) * w[3])));
      REQUIRE(momentum.step());
      REQUIRE(nesterov.step());
      REQUIRE(adam.step());
      REQUIRE(adamw.step());
    }
    std::vector<double> out;
    for (auto& v : w) out.insert(out.end(), tp.value(v).begin(), tp.value(v).end());
    grad::set_num_threads(1);
    return out;
  };
  CHECK(bitwise_equal<double>(run(1), run(3)));
}
